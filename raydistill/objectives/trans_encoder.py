"""Trans-Encoder: a bi-encoder and a cross-encoder teaching each other with pseudo-labels, both directions.

Paper: Fangyu Liu, Yunlong Jiao, Jordan Massiah, Emine Yilmaz, Serhii Havrylov. "Trans-Encoder: Unsupervised
sentence-pair modelling through self- and mutual-distillations", ICLR 2022, arXiv:2109.13059.
Code: github.com/amzn/trans-encoder (``src/self_distill.py``, ``src/mutual_distill_parallel.py``).

One cycle over unlabeled pairs (s1, s2):

    bi → cross:  y = cos(bi(s1), bi(s2)) ∈ [−1, 1];  cross learns BCEWithLogits(cross(s1, s2), t(y)) and
                 BCEWithLogits(cross(s2, s1), t(y))  (both orders: ``SoftBCELoss``; the caller builds the orders)
    cross → bi:  y = sigmoid(cross(s1, s2)) ∈ (0, 1); bi learns MSE(cos(bi(s1), bi(s2)), y)  (``CosineMSELoss``)

Mutual distillation averages the two models' pseudo-labels before each step (``average_pseudo_labels``).

t is the label scaling (``cosine_to_target``). The authors use the raw cosine (t = identity), a BCE target
outside [0, 1] whenever a cosine is negative; see docs/objectives.md for the decision and its reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import numpy as np
import torch.nn.functional as F
from torch import Tensor, nn

from raydistill.objectives.base import LossOutput, check_same_rows, frozen, take

__all__ = ["DEFAULT_LABEL_SCALING", "LABEL_SCALINGS", "LABEL_WEIGHTINGS", "SoftBCELoss", "average_pseudo_labels",
           "cosine_to_target", "dev_weights"]

LABEL_SCALINGS = ("clip", "affine", "raw")
DEFAULT_LABEL_SCALING = "clip"
# How mutual distillation combines the families' labels: "mean" (the authors'), or "dev" (dev_weights).
LABEL_WEIGHTINGS = ("mean", "dev")

ArrayLike = TypeVar("ArrayLike", np.ndarray, Tensor, float)


def cosine_to_target(cosines: ArrayLike, mode: str = DEFAULT_LABEL_SCALING) -> ArrayLike:
    """Bi-encoder cosines → BCE targets of the cross-encoder.

    ``"clip"``   clamp to [0, 1]: identical to the authors wherever the cosine is ≥ 0 (the usual case), and a
                 proper probability (target 0) where it is negative. Default.
    ``"affine"`` (c + 1) / 2: order-preserving everywhere, but squeezes the typical 0.3–0.9 cosines into
                 0.65–0.95, which the cross-encoder then learns as its score scale.
    ``"raw"``    the cosine itself (the authors' code): for c < 0, BCEWithLogits(x, c) = softplus(x) − c·x has no
                 minimum (it decreases without bound as x → −∞), so such pairs push their logit down forever.

    Works on numpy arrays, torch tensors and floats; returns the same kind.
    """
    if mode not in LABEL_SCALINGS:
        raise ValueError(f"cosine_to_target: mode must be one of {LABEL_SCALINGS}, got {mode!r}")
    if mode == "raw":
        return cosines
    if mode == "affine":
        return (cosines + 1.0) / 2.0
    if isinstance(cosines, Tensor):
        return cosines.clamp(0.0, 1.0)
    if isinstance(cosines, np.ndarray):
        return np.clip(cosines, 0.0, 1.0)
    return min(1.0, max(0.0, float(cosines)))


def average_pseudo_labels(labels: Sequence[np.ndarray | Sequence[float]],
                          weights: Sequence[float] | None = None) -> np.ndarray:
    """Mutual distillation: the mean of several models' pseudo-labels for the same pairs. ``labels``: one array [N]
    per model, same N and pair order. Without ``weights`` the plain mean, as the authors do (the two bi-encoders'
    cosines, then the two cross-encoders' probabilities; no per-model normalisation); with them, the mean weighted
    by ``weights`` (non-negative, one per model, normalised here; ``dev_weights`` makes them)."""
    if len(labels) == 0:
        raise ValueError("average_pseudo_labels: no label arrays given")
    arrays = [np.asarray(a, dtype=np.float64) for a in labels]
    shapes = {a.shape for a in arrays}
    if len(shapes) != 1:
        raise ValueError(f"average_pseudo_labels: label arrays must have one shape, got {sorted(shapes)}")
    if weights is None:
        return np.mean(np.stack(arrays), axis=0)
    w = np.asarray(weights, dtype=np.float64)  # [M]
    if w.shape != (len(arrays),) or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise ValueError(f"average_pseudo_labels: need {len(arrays)} finite non-negative weights with a positive "
                         f"sum, got {list(w)}")
    return np.tensordot(w / w.sum(), np.stack(arrays), axes=1)  # [N]


def dev_weights(dev_scores: Sequence[float], temperature: float) -> np.ndarray:
    r"""Label weights from each labelling model's dev score (Spearman x 100 on a labelled dev set):
    :math:`w_m = \mathrm{softmax}_m(\mathrm{dev}_m / T)`. ``temperature`` T is in dev points: at T = 2 a family
    4 points better on dev gets e² ≈ 7.4 times the weight; a large T tends to the plain mean."""
    if temperature <= 0:
        raise ValueError(f"dev_weights: temperature must be > 0, got {temperature}")
    z = np.asarray(dev_scores, dtype=np.float64) / temperature  # [M]
    z = np.exp(z - z.max())
    return z / z.sum()


class SoftBCELoss(nn.Module):
    r"""bi → cross: ``mean_i BCEWithLogits(x_i, t_i) = mean_i [softplus(x_i) − t_i·x_i]`` with soft targets.

    features: ``"logits"`` [B] (or [B, 1]) cross-encoder logits, with grad.
    labels: [B] targets, usually ``cosine_to_target(bi cosines, mode)``; detached here. Targets outside [0, 1]
        are accepted (``label_scaling="raw"`` reproduces the authors) and counted in ``parts``.
    parts: ``bce``, ``targets_outside_01`` (fraction of the batch).
    """

    def forward(self, features: dict[str, Tensor], labels: Tensor | None = None) -> LossOutput:
        logits = features.get("logits")
        if logits is not None and logits.dim() == 2 and logits.shape[1] == 1:
            logits = logits[:, 0]
        logits = take({"logits": logits} if logits is not None else features, "logits", "SoftBCELoss", ndim=1)
        if labels is None:
            raise ValueError("SoftBCELoss: labels (the soft target of each pair, [B]) are required")
        targets = frozen(labels).reshape(-1).to(logits.dtype)
        check_same_rows("SoftBCELoss", logits=logits, labels=targets)
        loss = F.binary_cross_entropy_with_logits(logits, targets)
        outside = ((targets < 0) | (targets > 1)).float().mean()
        return LossOutput(loss, {"bce": float(loss.detach()), "targets_outside_01": float(outside)})

