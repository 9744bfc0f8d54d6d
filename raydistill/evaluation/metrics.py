"""Rank metrics of the evaluation: Spearman's rho (STS) and ROC AUC (paraphrase pairs), both tie-aware.

Units: `spearman` returns rho x 100 (in [-100, 100]), the unit of every STS table; `roc_auc` returns the plain
AUC in [0, 1], its textbook unit. The evaluators (`evaluate_sts`, `evaluate_pair_auc`) report both x 100.

`pair_metric` / `score_pairs` pick between them for a user's scored pairs: gold scores that are all 0 or 1 are
labels (same / different), scored with ROC AUC x 100; any other scores are graded, scored with Spearman x 100.

Both are computed from average ranks (ties share the mean of the ranks they span), the convention of
`scipy.stats.spearmanr` / `rankdata(method="average")` and of SentEval, so a score here is comparable with the
papers' tables.

Degenerate inputs, decided once here:
- NaN or infinite predictions raise ValueError: they mean a broken model and must not become a number.
- Constant gold scores / a single class raise ValueError: the data set is wrong, not the model.
- Constant predictions (a collapsed encoder: every cosine equal) give 0.0 with a RuntimeWarning rather than NaN.
  A collapsed student during training is a legitimate, if bad, outcome: the correlation of a constant with
  anything is undefined, and 0 (no information) keeps model selection and early stopping working where NaN would
  compare false with everything.
"""

from __future__ import annotations

import warnings

import numpy as np
from scipy.stats import rankdata, spearmanr

__all__ = ["spearman", "roc_auc", "pair_metric", "score_pairs", "PAIR_METRIC_NAMES"]


def _as_vector(values, name: str) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {array.shape}")
    return array


def _check_finite(values: np.ndarray, name: str) -> None:
    bad = ~np.isfinite(values)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name} has {int(bad.sum())} non-finite value(s) (first at index {first}: {values[first]})")


def spearman(predicted, gold) -> float:
    """Spearman's rank correlation x 100 between `predicted` and `gold`, ties given average ranks.

    rho = Pearson(rank(predicted), rank(gold)); in [-100, 100]. Constant `predicted` returns 0.0 with a
    RuntimeWarning (see the module docstring); constant `gold`, NaNs or mismatched lengths raise ValueError."""
    predicted = _as_vector(predicted, "predicted")
    gold = _as_vector(gold, "gold")
    if predicted.shape != gold.shape:
        raise ValueError(f"predicted has {predicted.size} values but gold has {gold.size}")
    if predicted.size < 2:
        raise ValueError(f"Spearman needs at least 2 pairs, got {predicted.size}")
    _check_finite(predicted, "predicted")
    _check_finite(gold, "gold")
    if np.all(gold == gold[0]):
        raise ValueError("gold scores are all equal: Spearman's rho is undefined on this set")
    if np.all(predicted == predicted[0]):
        warnings.warn(f"all {predicted.size} predictions are equal ({predicted[0]:.6g}), e.g. a collapsed encoder; "
                      "Spearman reported as 0.0", RuntimeWarning, stacklevel=2)
        return 0.0
    return float(spearmanr(predicted, gold).statistic) * 100.0


def roc_auc(scores, labels) -> float:
    """Area under the ROC curve, in [0, 1], for binary `labels` (0/1) ranked by `scores`; ties count one half.

    AUC = P(score of a random positive > score of a random negative) + 0.5 P(equal), computed exactly as the
    Mann-Whitney U statistic from average ranks: (sum of positive ranks - n_pos (n_pos + 1) / 2) / (n_pos n_neg).
    Perfect ranking gives 1, inverted 0, all scores equal 0.5."""
    scores = _as_vector(scores, "scores")
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.shape != scores.shape:
        raise ValueError(f"labels must be one label per score: {labels.shape} vs {scores.shape}")
    _check_finite(scores, "scores")
    positive = labels == 1
    negative = labels == 0
    if not np.all(positive | negative):
        odd = labels[~(positive | negative)][0]
        raise ValueError(f"labels must be 0 or 1, found {odd!r}")
    n_pos, n_neg = int(positive.sum()), int(negative.sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError(f"AUC needs both classes, got {n_pos} positive and {n_neg} negative labels")
    ranks = rankdata(scores, method="average")  # [N], 1-based, ties averaged
    u_statistic = ranks[positive].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u_statistic / (n_pos * n_neg))


# How a table or a card names each metric of `pair_metric`.
PAIR_METRIC_NAMES = {"roc_auc": "ROC AUC x 100", "spearman": "Spearman x 100"}


def pair_metric(gold) -> str:
    """``"roc_auc"`` when every gold score is 0 or 1, else ``"spearman"``: with binary labels a rank correlation
    says less than the AUC, which is what the labels ask (are the same-meaning pairs ranked above the others?)."""
    gold = _as_vector(gold, "gold")
    return "roc_auc" if gold.size and bool(np.all((gold == 0) | (gold == 1))) else "spearman"


def score_pairs(predicted, gold) -> float:
    """The user's pairs scored x 100 with `pair_metric`'s metric: ROC AUC x 100 of 0/1 labels, else Spearman."""
    if pair_metric(gold) == "roc_auc":
        return roc_auc(predicted, np.asarray(gold, dtype=np.float64).astype(np.int64)) * 100.0
    return spearman(predicted, gold)
