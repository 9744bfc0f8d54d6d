"""Cosine distillation: the student's vector points where the teacher's does.

The plainest student-teacher objective, and the worked example of docs/adding-a-method.md:

    L = mean_i (1 − cos(s(x_i), t(x_i)))

Unlike MSE (``l2.py``) it ignores the vectors' norms, which sentence similarity ignores too.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from raydistill.objectives.base import LossOutput, check_dim, check_same_rows, frozen, take

__all__ = ["CosineDistillLoss"]


class CosineDistillLoss(nn.Module):
    r"""``L = mean_i (1 − cos(s_i, t_i))``.

    features:
        ``"student"``  [B, D]  student(x) with grad (projected to D when its width differs from the teacher's)
        ``"teacher"``  [B, D]  teacher(x), detached here
    labels: unused.
    parts: ``cosine`` (the mean student–teacher cosine).
    """

    def forward(self, features: dict[str, Tensor], labels: Tensor | None = None) -> LossOutput:
        student = take(features, "student", "CosineDistillLoss")               # [B, D]
        teacher = frozen(take(features, "teacher", "CosineDistillLoss"))       # [B, D]
        check_same_rows("CosineDistillLoss", student=student, teacher=teacher)
        check_dim("CosineDistillLoss", teacher.shape[1], " (give the student projection_dim=teacher dim)",
                  student=student)
        cosine = F.cosine_similarity(student, teacher.to(student.dtype), dim=1)  # [B]
        loss = (1.0 - cosine).mean()
        return LossOutput(loss, {"cosine": float(cosine.detach().mean())})
