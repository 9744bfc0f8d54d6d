"""Sentence-pair regression on the cosine: SBERT's CosineSimilarityLoss.

Reimers & Gurevych, "Sentence-BERT", EMNLP 2019, arXiv:1908.10084: ``MSE(cos(u, v), y)``. Used by DvBERT's STS
stage (gold scores / 5) and by Trans-Encoder's cross → bi step (cross-encoder probabilities as targets).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from raydistill.objectives.base import LossOutput, check_same_rows, frozen, take

__all__ = ["CosineMSELoss"]


class CosineMSELoss(nn.Module):
    r"""``L = mean_i (cos(u_i, v_i) − y_i)²`` (sentence-transformers' CosineSimilarityLoss, MSE form).

    features: ``"u"``, ``"v"`` [B, d], the two sentences' embeddings, with grad (aliases ``"embeddings_a"``,
        ``"embeddings_b"``, the names Trans-Encoder's learner uses).
    labels: [B] float targets (detached here), e.g. STS-B gold / 5 in [0, 1], or sigmoid scores in (0, 1).
    parts: ``mse``.
    """

    def forward(self, features: dict[str, Tensor], labels: Tensor | None = None) -> LossOutput:
        u = take(features, "u", "CosineMSELoss", aliases=("embeddings_a",))
        v = take(features, "v", "CosineMSELoss", aliases=("embeddings_b",))
        if labels is None:
            raise ValueError("CosineMSELoss: labels (the target score of each pair, [B]) are required")
        labels = frozen(labels).reshape(-1)
        check_same_rows("CosineMSELoss", u=u, v=v, labels=labels)
        cosines = F.cosine_similarity(u, v, dim=1)  # [B]
        loss = F.mse_loss(cosines, labels.to(cosines.dtype))
        return LossOutput(loss, {"mse": float(loss.detach())})
