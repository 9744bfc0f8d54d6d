"""sentence-transformers' own distillation recipe (MSELoss to the teacher's vectors), on a distillation job's data.

    python jobs/st_mse.py [--config FILE|NAME] [--set loss.reduction=dense ...] [--run-dir DIR]

The baseline a user would pick instead of raydistill: same student, teacher, sentences and schedule as the
distillation configs, trained by sentence-transformers' SentenceTransformerTrainer + losses.MSELoss on the teacher
vectors the distillation jobs cached. Needs sentence-transformers with its training extras
(pip install 'raydistill[st-mse]').
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout, or the working dir `ray job submit` uploaded

from raydistill.runtime.entry import st_mse_job_main  # noqa: E402

if __name__ == "__main__":
    st_mse_job_main(__doc__)
