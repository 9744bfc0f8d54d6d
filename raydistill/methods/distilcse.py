"""DistilCSE (Xu et al., arXiv:2112.05638): CKD on unlabeled text (``ckd.py``), then supervised SimCSE on NLI
triplets (``simcse_sup.py``), starting from the first stage's best model. The second stage's defaults are the
paper's fine-tuning schedule (lr 5e-5, 1 epoch, batch 64, τ 0.05); ``extra.stage2`` overrides them.
"""

import dataclasses

from raydistill.methods.base import StagedExtraSettings
from raydistill.methods.ckd import SPEC as CKD

SPEC = dataclasses.replace(
    CKD, name="distilcse",
    summary="DistilCSE (Xu et al., 2023): CKD on unlabeled text, then supervised SimCSE on NLI triplets",
    stages=("simcse-sup",),
    stage_defaults=({"train": {"lr": 5e-5, "epochs": 1, "batch_size": 64, "warmup_ratio": 0.1},
                     "loss": {"tau": 0.05}, "data": {"max_sentences": None}},),
    extra_settings=StagedExtraSettings,
)
