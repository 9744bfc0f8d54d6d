"""Cosine distillation: the student regresses the direction of the teacher's vector of the same sentence.

    L = mean_i (1 − cos(s(x_i), t(x_i)))

The worked example of docs/adding-a-method.md: one view of the corpus, the teacher's cached vectors of it, a
student projected to the teacher's width when narrower.
"""

from raydistill.methods.base import Features, MethodSpec, StepContext, teacher_vectors
from raydistill.objectives.cosine import CosineDistillLoss


def cosine_features(ctx: StepContext, batch) -> Features:
    student = ctx.encode(batch["text_a"])              # [B, D_t], with gradients
    teacher = teacher_vectors(ctx, batch, "a")         # [B, D_t], the cached teacher vectors
    return {"student": student, "teacher": teacher}, None


SPEC = MethodSpec(
    name="cosine",
    summary="cosine distillation: the student's vector points where the teacher's does",
    views={"a": "none"},              # the sentence itself
    teacher_views=("a",),             # the teacher's vectors of view a come from the embedding cache
    needs_teacher=True,
    loss_class=CosineDistillLoss,
    batch_to_features=cosine_features,
    project_to_teacher=True,          # a narrower student gets Linear(d_s -> d_t), saved with the model
)
