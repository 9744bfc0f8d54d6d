"""Trans-Encoder self- or mutual distillation (bi- and cross-encoder actors per family, labels exchanged as Parquet).

    python jobs/mutual_tenc.py                                    # configs/mutual_tenc.yaml: 2 families, CPU scale
    python jobs/mutual_tenc.py --pairs 500 --cycles 1 --run-dir runs/tenc-quick
    python jobs/mutual_tenc.py --config configs/self_tenc.yaml --mode self
    ray job submit --working-dir . -- python jobs/mutual_tenc.py --config configs/mutual_tenc-gpu.yaml

Standalone it starts a local Ray; under `ray job submit` it joins the cluster (RAY_ADDRESS). A re-run with the same
--run-dir resumes after the last completed stage. Under `ray job submit`, relative output paths resolve against
$RAYDISTILL_OUTPUT_ROOT (pass it with --runtime-env-json '{"env_vars": {"RAYDISTILL_OUTPUT_ROOT": "'$PWD'"}}'),
because the job runs in a temporary copy of the working directory.
"""

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # a checkout, or the working dir `ray job submit` uploaded

from raydistill.runtime.entry import USER_ERRORS, exit_with_user_error  # noqa: E402
from raydistill.runtime.tenc import TencConfig, run_trans_encoder  # noqa: E402


def max_length_overrides(text: str) -> list[str]:
    """``32`` -> bi 32, cross 64 (a pair is two sentences); ``32,80`` -> bi 32, cross 80."""
    parts = [p for p in text.split(",") if p.strip()]
    try:
        lengths = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--max-length: expected N or BI,CROSS, got {text!r}") from None
    if len(lengths) not in (1, 2) or min(lengths) <= 0:
        raise argparse.ArgumentTypeError(f"--max-length: expected N or BI,CROSS (positive), got {text!r}")
    bi, cross = (lengths[0], 2 * lengths[0]) if len(lengths) == 1 else lengths
    return [f"bi.max_length={bi}", f"cross.max_length={cross}"]


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--config", default=str(ROOT / "configs" / "mutual_tenc.yaml"))
parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="any config field, e.g. --set cross.lr=3e-5 (repeatable)")
parser.add_argument("--mode", choices=("mutual", "self"), help="average the families' labels, or each its own")
parser.add_argument("--pairs", type=int, metavar="N", help="seeded subsample of N unlabeled pairs")
parser.add_argument("--cycles", type=int, metavar="N", help="bi->cross->bi cycles")
parser.add_argument("--max-length", type=max_length_overrides, metavar="N|BI,CROSS",
                    help="token limit of the bi-encoder (cross-encoder: twice that, or give both)")
parser.add_argument("--init", choices=("refresh", "sequential"), help="start each stage from the original "
                    "checkpoint (refresh) or from the previous stage's weights (sequential)")
parser.add_argument("--run-dir", help="labels, models and state (a re-run with the same dir resumes)")
args = parser.parse_args()

overrides = list(args.overrides)
for key, value in (("mode", args.mode), ("pairs.max_pairs", args.pairs), ("cycles", args.cycles),
                   ("init", args.init), ("run_dir", args.run_dir)):
    if value is not None:
        overrides.append(f"{key}={value}")
overrides += args.max_length or []
try:
    summary = run_trans_encoder(TencConfig.from_yaml(args.config, overrides))
except USER_ERRORS as exc:
    exit_with_user_error(exc)
print(summary.get("results_dir") or summary["run_dir"])
