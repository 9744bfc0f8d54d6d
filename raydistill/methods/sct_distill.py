"""SCT distillation (Limkonchotiwat et al., TACL 2023, arXiv:2311.03228): the references of the cross-view loss
are the frozen teacher's cached vectors of both views.

    p_t(v) = softmax(cos(t(v), [Q_v; t(B_v)]) / τ_t)
    L_CD   = KL(p_t(a) ‖ softmax(cos(s(b), ·) / τ_s)) + KL(p_t(b) ‖ softmax(cos(s(a), ·) / τ_s))
    L      = L_CD (+ L_SCT, the self-supervised loss with its own τ 0.02 / 0.03, for objective "joint")

Defaults: K 65536, τ_t 0.04, τ_s 0.05, objective "joint" (the paper's; the authors' script trains L_CD only:
"cd_only"); both queues start from teacher vectors.
"""

import torch

from raydistill.methods.base import Features, MethodSpec, StepContext, teacher_vectors, with_groups
from raydistill.objectives import SCTDistillLoss


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
    default_loss={"queue_size": 65536, "tau_teacher": 0.04, "tau_student": 0.05, "objective": "joint",
                  "queue_init": "teacher"},
    loss_class=SCTDistillLoss,
    loss_dim="teacher",
    batch_to_features=sct_distill_features,
    project_to_teacher=True,
    student_sentences_per_row=2,
    shared_queues=2,
)
