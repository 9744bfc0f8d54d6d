"""DistilCSE: CKD on unlabeled text, then supervised SimCSE on NLI triplets, in one job.

    python jobs/distilcse.py [--config FILE|NAME] [--set train.lr=1e-4 ...] [--run-dir DIR]
    ray job submit --working-dir . -- python jobs/distilcse.py --config distilcse-gpu

Standalone it starts a local Ray; under `ray job submit` it joins the cluster (RAY_ADDRESS).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout, or the working dir `ray job submit` uploaded

from raydistill.runtime.entry import distill_job_main  # noqa: E402

if __name__ == "__main__":
    distill_job_main("distilcse", __doc__)
