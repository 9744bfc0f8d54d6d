"""SCT, self-supervised (Limkonchotiwat et al., "An Efficient Self-Supervised Cross-View Training For Sentence
Embedding", TACL 2023, arXiv:2311.03228): each view's similarity distribution over a queue of the model's own
reference vectors is pulled towards the other view's.

    p_ref(v) = softmax(cos(r(v), [Q; r(B)]) / τ_t)      # reference: the same model, no grad, another dropout mask
    L = KL(p_ref(a) ‖ softmax(cos(s(b), ·) / τ_s)) + KL(p_ref(b) ‖ softmax(cos(s(a), ·) / τ_s))

Defaults: K 65536, τ_t 0.02, τ_s 0.03 (the paper's Small row).
"""

import torch
from pydantic import Field, StrictBool

from raydistill.config.schema import section
from raydistill.methods.base import (Features, LossSettings, MaskSameGroup, MethodSpec, Positive, QueueInit, QueueSeed,
                                     QueueSize, StepContext, Temperature, with_groups)
from raydistill.objectives import SCTLoss


@section
class SCTLossSettings(LossSettings):
    """``loss:`` of SCT (raydistill.objectives.SCTLoss)."""

    queue_size: QueueSize = Field(65536, description="K, instance-queue entries of the model's own reference vectors")
    tau_teacher: Temperature = Field(0.02, description="temperature of the reference's similarity distribution")
    tau_student: Temperature = Field(0.03, description="temperature of the online view's similarity distribution")
    faithful: StrictBool | None = Field(None, description="the authors' projector on the online side (null: false)")
    projector_expansion: Positive | None = Field(None, description="width factor of the faithful projector (null: 10)")
    projector_blocks: Positive | None = Field(None, description="blocks of the faithful projector (null: 3)")
    queue_init: QueueInit | None = Field(None, description="how the queues start: random or empty (null: random)")
    queue_seed: QueueSeed = None
    mask_same_group: MaskSameGroup = None


def sct_features(ctx: StepContext, batch) -> Features:
    """Online passes with grad; the reference is the *same* model again under no_grad, still in train mode, so it
    draws a fresh dropout mask (docs/methods.md, SCT; eval mode would change the method)."""
    online_a, online_b = ctx.encode_views(batch["text_a"], batch["text_b"])  # [B, d] each
    with torch.no_grad():
        reference_a, reference_b = ctx.encode_views(batch["text_a"], batch["text_b"])  # other dropout masks
    return with_groups(ctx, batch, {"online_a": online_a, "online_b": online_b, "reference_a": reference_a,
                                    "reference_b": reference_b}), None


SPEC = MethodSpec(
    name="sct",
    summary="SCT (Limkonchotiwat et al., TACL 2023), self-supervised: cross-view KL to a dropout-noised reference",
    views={"a": "none", "b": "caption"},
    teacher_views=(),
    needs_teacher=False,
    loss_settings=SCTLossSettings,
    loss_class=SCTLoss,
    loss_dim="student",
    batch_to_features=sct_features,
    student_sentences_per_row=2,
)
