"""CKD, DistilCSE's first stage (Xu et al., "DistilCSE: Effective Knowledge Distillation For Contrastive Sentence
Embeddings", arXiv:2112.05638): InfoNCE of the student's vector against the teacher's vector of the same sentence,
with the teacher vectors of earlier batches as extra negatives, and a learnable logit scale.

    logits = e^{scale} · cos(s(x_i), [t(B); Q])         # [B, B + K]
    L      = CE(logits, i)                              # the i-th teacher vector is x_i's positive

Defaults: K 65536, scale e (τ = e^-1, the authors' --temp 1 --temp_exp 1), learned; the queue starts empty; a
plain Linear projection to the teacher's width (no activation), as the authors' code.
"""

import math

from raydistill.methods.base import (
    Features,
    MethodSpec,
    StepContext,
    check_learnable_temperature,
    teacher_vectors,
    with_groups,
)
from raydistill.objectives import CKDLoss
from raydistill.runtime.config import JobConfig


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
    default_loss={"queue_size": 65536, "temperature": round(math.exp(-1.0), 6), "learnable_temperature": True,
                  "mse_weight": 0.0},
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
