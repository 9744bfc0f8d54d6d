"""Unsupervised SimCSE baseline: the same sentence encoded twice, dropout as the only augmentation.

Paper: Tianyu Gao, Xingcheng Yao, Danqi Chen. "SimCSE: Simple Contrastive Learning of Sentence Embeddings",
EMNLP 2021, arXiv:2104.08821 (§3, Eq. 1). Code: github.com/princeton-nlp/SimCSE.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from raydistill.objectives.base import LossOutput, check_same_rows, take, validate_temperature
from raydistill.objectives.functional import soft_cross_entropy

__all__ = ["SimCSELoss"]


class SimCSELoss(nn.Module):
    r"""In-batch InfoNCE between two dropout views h, h′ of the same B sentences (Gao et al., 2021, Eq. 1):

        L = −1/B Σ_i log( e^{cos(h_i, h′_i)/τ} / Σ_j e^{cos(h_i, h′_j)/τ} ),   τ = 0.05

    features: ``"first"``, ``"second"`` [B, d], two train-mode passes of the same batch (different dropout masks),
        both with grad.
    labels: unused (the positive of row i is row i).
    parts: ``infonce``, ``positive_cosine`` (mean cos(h_i, h′_i), for monitoring).
    """

    def __init__(self, tau: float = 0.05):
        super().__init__()
        self.tau = validate_temperature("SimCSELoss", "tau", tau)

    def forward(self, features: dict[str, Tensor], labels: Tensor | None = None) -> LossOutput:
        first, second = take(features, "first", "SimCSELoss"), take(features, "second", "SimCSELoss")
        batch = check_same_rows("SimCSELoss", first=first, second=second)
        first, second = F.normalize(first, dim=1), F.normalize(second, dim=1)
        logits = (first / self.tau) @ second.T  # [B, B]
        target = torch.eye(batch, dtype=logits.dtype, device=logits.device)
        loss = soft_cross_entropy([logits], [target]).mean()
        positive = (first.detach() * second.detach()).sum(dim=1).mean()
        return LossOutput(loss, {"infonce": float(loss.detach()), "positive_cosine": float(positive)})
