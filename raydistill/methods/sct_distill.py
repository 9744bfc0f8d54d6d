"""SCT distillation (Limkonchotiwat et al., TACL 2023, arXiv:2311.03228): the references of the cross-view loss
are the frozen teacher's cached vectors of both views.

    p_t(v) = softmax(cos(t(v), [Q_v; t(B_v)]) / τ_t)
    L_CD   = KL(p_t(a) ‖ softmax(cos(s(b), ·) / τ_s)) + KL(p_t(b) ‖ softmax(cos(s(a), ·) / τ_s))
    L      = L_CD (+ L_SCT, the self-supervised loss with its own τ 0.02 / 0.03, for objective "joint")

Defaults: K 65536, τ_t 0.04, τ_s 0.05, objective "joint" (the paper's; the authors' script trains L_CD only:
"cd_only"); both queues start from teacher vectors.
"""

from typing import Literal

import torch
from pydantic import Field, StrictBool

from raydistill.config.schema import section
from raydistill.methods.base import (Features, LossSettings, MaskSameGroup, MethodSpec, Positive, QueueInit, QueueSeed,
                                     QueueSize, StepContext, Temperature, teacher_vectors, with_groups)
from raydistill.objectives import SCTDistillLoss


@section
class SCTDistillLossSettings(LossSettings):
    """``loss:`` of SCT distillation (raydistill.objectives.SCTDistillLoss)."""

    queue_size: QueueSize = Field(65536, description="K, instance-queue entries of teacher vectors, one queue per view")
    tau_teacher: Temperature = Field(0.04, description="temperature of the teacher's similarity distribution")
    tau_student: Temperature = Field(0.05, description="temperature of the student's similarity distribution")
    objective: Literal["joint", "cd_only"] = Field("joint", description="joint (L_CD + L_SCT, the paper's) or cd_only "
                                                                        "(L_CD, the authors' script)")
    queue_init: QueueInit = Field("teacher", description="how the queues start: teacher (vectors of sampled training "
                                                         "sentences), random or empty")
    faithful: StrictBool | None = Field(None, description="the authors' projector in L_SCT (null: false)")
    sct_tau_teacher: Temperature | None = Field(None, description="L_SCT's reference temperature (null: 0.02)")
    sct_tau_student: Temperature | None = Field(None, description="L_SCT's online temperature (null: 0.03)")
    sct_queue_size: QueueSize | None = Field(None, description="L_SCT's queue size (null: queue_size)")
    projector_expansion: Positive | None = Field(None, description="width factor of the faithful projector (null: 10)")
    projector_blocks: Positive | None = Field(None, description="blocks of the faithful projector (null: 3)")
    queue_seed: QueueSeed = None
    mask_same_group: MaskSameGroup = None


def sct_distill_features(ctx: StepContext, batch) -> Features:
    """Precomputed teacher vectors of both views are the references. With the joint objective the student's own
    no-grad, dropout-on reference passes are added for L_SCT."""
    student_a, student_b = ctx.encode_views(batch["text_a"], batch["text_b"])
    features = {"student_a": student_a, "student_b": student_b,
                "teacher_a": teacher_vectors(ctx, batch, "a"), "teacher_b": teacher_vectors(ctx, batch, "b")}
    if getattr(ctx.loss, "self_supervised", None) is not None:
        with torch.no_grad():
            features["reference_a"], features["reference_b"] = ctx.encode_views(batch["text_a"], batch["text_b"])
    return with_groups(ctx, batch, features), None


SPEC = MethodSpec(
    name="sct-distill",
    summary="SCT distillation (TACL 2023): cross-view KL to cached teacher vectors of both views",
    views={"a": "none", "b": "caption"},
    teacher_views=("a", "b"),
    needs_teacher=True,
    loss_settings=SCTDistillLossSettings,
    loss_class=SCTDistillLoss,
    loss_dim="teacher",
    batch_to_features=sct_distill_features,
    project_to_teacher=True,
    student_sentences_per_row=2,
    shared_queues=2,
)
