"""DistilCSE: CKD on unlabeled text, then supervised SimCSE on NLI triplets, in one job.

    python jobs/distilcse.py [--config configs/distilcse.yaml] [--set train.lr=1e-4 ...] [--run-dir DIR]
    ray job submit --working-dir . -- python jobs/distilcse.py --config configs/distilcse-gpu.yaml

Standalone it starts a local Ray; under `ray job submit` it joins the cluster (RAY_ADDRESS).
"""

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # a checkout, or the working dir `ray job submit` uploaded

from raydistill.runtime.config import ConfigError, JobConfig  # noqa: E402
from raydistill.runtime.distill import run_distillation  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--config", default=str(ROOT / "configs" / "distilcse.yaml"))
parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
parser.add_argument("--run-dir", help="checkpoints and best model (a re-run with the same dir resumes)")
parser.add_argument("--results-dir", default="results", help="where <method>-<student>-<teacher>.json goes")
args = parser.parse_args()
try:
    cfg = JobConfig.from_yaml(args.config, args.overrides + ([f"run_dir={args.run_dir}"] if args.run_dir else []))
    record = run_distillation(cfg, results_dir=args.results_dir)
except ConfigError as exc:
    sys.exit(f"config error: {exc}")
print(record["result_path"])
