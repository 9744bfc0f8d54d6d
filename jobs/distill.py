"""Any method of raydistill.methods, from its config: the job a newly added method runs with.

    python jobs/distill.py --config FILE|NAME [--set train.lr=1e-4 ...] [--run-dir DIR]

The config's ``method`` picks what trains (e.g. --config cosine, the shipped example of docs/adding-a-method.md).
Standalone it starts a local Ray; under `ray job submit` it joins the cluster (RAY_ADDRESS).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout, or the working dir `ray job submit` uploaded

from raydistill.runtime.entry import distill_job_main  # noqa: E402

if __name__ == "__main__":
    distill_job_main("distill", __doc__)
