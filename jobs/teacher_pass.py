"""Only the teacher pass of a job config: its corpus's views through the teacher into the embedding cache.

    python jobs/teacher_pass.py --config FILE|NAME [--set resources.teacher.num_actors=4 ...]

Pays the slow part once (for instance on a GPU node); every later job with the same teacher, teacher max length and
texts starts on cache hits. Stopped part-way, it keeps what it encoded and the next run encodes only the rest.
Standalone it starts a local Ray; under `ray job submit` it joins the cluster (RAY_ADDRESS).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout, or the working dir `ray job submit` uploaded

from raydistill.runtime.entry import teacher_pass_job_main  # noqa: E402

if __name__ == "__main__":
    teacher_pass_job_main(__doc__)
