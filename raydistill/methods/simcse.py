"""Unsupervised SimCSE baseline (Gao et al., "SimCSE", EMNLP 2021, arXiv:2104.08821): a sentence encoded twice
with two dropout masks is its own positive; the other sentences of the batch are the negatives.

    logits = cos(h_i, h'_j) / τ                          # [B, B]
    L      = CE(logits, i)                               # τ 0.05
"""

from pydantic import Field

from raydistill.config.schema import section
from raydistill.methods.base import Features, LossSettings, MethodSpec, StepContext, Temperature
from raydistill.objectives import SimCSELoss


@section
class SimCSELossSettings(LossSettings):
    """``loss:`` of SimCSE (raydistill.objectives.SimCSELoss)."""

    tau: Temperature = Field(0.05, description="temperature of the contrastive loss")


def simcse_features(ctx: StepContext, batch) -> Features:
    """One sentence encoded twice (in one forward, as the authors' duplicated batch)."""
    first, second = ctx.encode_views(batch["text_a"], batch["text_a"])
    return {"first": first, "second": second}, None


SPEC = MethodSpec(
    name="simcse",
    summary="unsupervised SimCSE baseline (Gao et al., 2021): dropout views, InfoNCE",
    views={"a": "none"},
    teacher_views=(),
    needs_teacher=False,
    loss_settings=SimCSELossSettings,
    loss_class=SimCSELoss,
    batch_to_features=simcse_features,
    student_sentences_per_row=2,
)
