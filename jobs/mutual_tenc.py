"""Trans-Encoder self- or mutual distillation (bi- and cross-encoder actors per family, labels exchanged as Parquet).

    python jobs/mutual_tenc.py                                    # shipped mutual_tenc.yaml: 2 families, CPU scale
    python jobs/mutual_tenc.py --pairs 500 --cycles 1 --run-dir runs/tenc-quick
    python jobs/mutual_tenc.py --config self_tenc --mode self
    python jobs/mutual_tenc.py --config mutual_tenc-qqp           # unlabeled QQP pairs; ROC AUC on the same pairs
    ray job submit --working-dir . -- python jobs/mutual_tenc.py --config mutual_tenc-gpu

It ends with, per family and encoder, the start, the best model by STS-B dev (the start is a candidate) and whether
training improved on the start; <run dir>/summary.json holds the same. Standalone it starts a local Ray; under
`ray job submit` it joins the cluster (RAY_ADDRESS). A re-run with the same --run-dir skips every completed stage
and continues a stage stopped by SIGTERM or Ctrl-C from its saved step. Under `ray job submit`, relative output paths
resolve against $RAYDISTILL_OUTPUT_ROOT (pass it with
--runtime-env-json '{"env_vars": {"RAYDISTILL_OUTPUT_ROOT": "'$PWD'"}}'), because the job runs in a temporary copy
of the working directory.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout, or the working dir `ray job submit` uploaded

from raydistill.runtime.entry import tenc_job_main  # noqa: E402

if __name__ == "__main__":
    tenc_job_main(__doc__)
