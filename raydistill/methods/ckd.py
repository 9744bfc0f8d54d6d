"""CKD, DistilCSE's first stage (Xu et al., "DistilCSE: Effective Knowledge Distillation For Contrastive Sentence
Embeddings", arXiv:2112.05638): InfoNCE of the student's vector against the teacher's vector of the same sentence,
with the teacher vectors of earlier batches as extra negatives, and a learnable logit scale.

    logits = e^{scale} · cos(s(x_i), [t(B); Q])         # [B, B + K]
    L      = CE(logits, i)                              # the i-th teacher vector is x_i's positive

Defaults: K 65536, scale e (τ = e^-1, the authors' --temp 1 --temp_exp 1), learned; the queue starts empty; a
plain Linear projection to the teacher's width (no activation), as the authors' code.
"""

import math

from pydantic import Field, StrictBool

from raydistill.config.job import JobConfig
from raydistill.config.schema import section
from raydistill.methods.base import (Features, LossSettings, MaskSameGroup, MethodSpec, NonNegative, PositiveNumber,
                                     QueueInit, QueueSeed, QueueSize, StepContext, Temperature,
                                     check_learnable_temperature, teacher_vectors, with_groups)
from raydistill.objectives import CKDLoss


@section
class CKDLossSettings(LossSettings):
    """``loss:`` of CKD (raydistill.objectives.CKDLoss)."""

    queue_size: QueueSize = Field(65536, description="K, teacher vectors of earlier batches as extra negatives")
    temperature: Temperature = Field(round(math.exp(-1.0), 6), description="τ of the logit scale 1/τ (not "
                                                                           "log(1/τ)): e^-1 is the authors' scale e")
    learnable_temperature: StrictBool = Field(True, description="learn the scale with the student (clamped to "
                                                                "[min_scale, max_scale])")
    mse_weight: NonNegative = Field(0.0, description="weight of an MSE term to the teacher vector (0: none)")
    min_scale: PositiveNumber | None = Field(None, description="lower clamp of the learned scale (null: 1)")
    max_scale: PositiveNumber | None = Field(None, description="upper clamp of the learned scale (null: 100)")
    queue_init: QueueInit | None = Field(None, description="how the queue starts: empty, random or teacher (null: "
                                                           "empty, as the authors')")
    queue_seed: QueueSeed = None
    mask_same_group: MaskSameGroup = None


def single_view_features(ctx: StepContext, batch) -> Features:
    """The same sentence for teacher and student (docs/methods.md, DistilCSE)."""
    return with_groups(ctx, batch, {"student": ctx.encode(batch["text_a"]),
                                    "teacher": teacher_vectors(ctx, batch, "a")}), None


def check_ckd(cfg: JobConfig) -> None:
    effective = SPEC.loss_kwargs(cfg)
    if "learnable_temperature" in effective and "temperature" in effective:
        check_learnable_temperature(cfg, effective)


SPEC = MethodSpec(
    name="ckd",
    summary="CKD / DistilCSE stage 1 (Xu et al., 2023): InfoNCE of student vs teacher vectors + queue",
    views={"a": "none"},
    teacher_views=("a",),
    needs_teacher=True,
    loss_settings=CKDLossSettings,
    loss_class=CKDLoss,
    loss_dim="teacher",
    batch_to_features=single_view_features,
    project_to_teacher=True,
    optimizer={"eps": 1e-8, "betas": (0.9, 0.98)},
    shared_queues=1,
    queue_init="empty",
    projection_activation="identity",
    check=check_ckd,
)
