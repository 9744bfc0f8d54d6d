"""Plain cross-entropy on class logits: what DvBERT's NLI teachers (``methods.nli_teacher``, ``methods.nli_head``)
train with before they label anything.

    L = mean_i CE(y_i, softmax(logits_i))          y_i: the gold class

features: ``"logits"`` [B, C] (computed in fp32: the learner casts a bf16 forward's outputs back).
labels: [B] class indices. parts: ``accuracy`` of the batch's argmax.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from raydistill.objectives.base import LossOutput, check_same_rows, take

__all__ = ["LogitCrossEntropyLoss"]


class LogitCrossEntropyLoss(nn.Module):
    def forward(self, features: dict[str, Tensor], labels: Tensor | None = None) -> LossOutput:
        owner = type(self).__name__
        if labels is None:
            raise ValueError(f"{owner}: needs the gold classes as labels")
        logits = take(features, "logits", owner).float()  # [B, C]
        check_same_rows(owner, logits=logits, labels=labels)
        loss = F.cross_entropy(logits, labels.long())
        accuracy = float((logits.detach().argmax(dim=1) == labels).float().mean())
        return LossOutput(loss, {"accuracy": accuracy})
