"""Supervised SimCSE on NLI triplets (Gao et al., "SimCSE", EMNLP 2021, arXiv:2104.08821), DistilCSE's second
stage: the entailed hypothesis is the positive, the contradicted one a hard negative, the batch the rest.

    logits = cos(a_i, [p; n]) / τ                        # [B, 2B]
    L      = CE(logits, i)

Rows: the ``nli_triplets`` set (premise, entailed, contradicted) of the labelled NLI data shipped. τ 0.05.
"""

from pydantic import Field, StrictBool

from raydistill.config.schema import section
from raydistill.methods.base import Features, LossSettings, PositiveNumber, StepContext, Temperature
from raydistill.methods.sts_cosine import rows_method
from raydistill.objectives import SupervisedSimCSELoss


@section
class SupervisedSimCSELossSettings(LossSettings):
    """``loss:`` of supervised SimCSE (raydistill.objectives.SupervisedSimCSELoss)."""

    tau: Temperature = Field(0.05, description="temperature of the contrastive loss")
    learnable_temperature: StrictBool | None = Field(None, description="learn the temperature with the student (null: "
                                                                       "false)")
    max_scale: PositiveNumber | None = Field(None, description="upper clamp of a learned scale 1/τ (null: 100)")


def triplet_features(ctx: StepContext, batch) -> Features:
    """Anchor, entailed hypothesis (positive), contradicted hypothesis (hard negative)."""
    anchor, positive, negative = ctx.encode_views(batch["text_anchor"], batch["text_positive"], batch["text_negative"])
    return {"anchor": anchor, "positive": positive, "negative": negative}, None


SPEC = rows_method(
    name="simcse-sup",
    summary="supervised SimCSE on NLI triplets (DistilCSE stage 2; Gao et al., 2021)",
    loss_settings=SupervisedSimCSELossSettings,
    loss_class=SupervisedSimCSELoss,
    batch_to_features=triplet_features,
    student_sentences_per_row=3,
    dataset="nli_triplets",
    internal=True,
)
