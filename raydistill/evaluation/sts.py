"""7-STS and paraphrase-AUC evaluation of a bi-encoder (cosine of embeddings) or a cross-encoder (pair score).

The protocol is the one of SimCSE / ConGen / SCT / DistilCSE / Trans-Encoder tables ("SentEval, all setting"):
for each of STS12-16, STS-B test and SICK-R test, Spearman's rho x 100 between the model's similarity and the gold
score over the WHOLE set (all subsets concatenated, not the mean of per-subset correlations), then the mean of the
seven. STS-B dev is evaluated the same way and used for model selection only.

Any object with ``encode(texts, batch_size=...) -> [N, D]`` is a bi-encoder and any object with
``score(pairs, batch_size=...) -> [N]`` is a cross-encoder (duck typing: raydistill's BiEncoder / CrossEncoder,
sentence-transformers' SentenceTransformer, or a test's hand-made object). Keyword options the model's method does
not accept (``progress``, ``activation``) are simply not passed.

Each distinct sentence (bi) or ordered pair (cross) is run through the model once, however many of the requested
sets contain it (STS-B reuses STS12-16 sentences): about a fifth of the encoder time of a full evaluation."""

from __future__ import annotations

import inspect
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from raydistill.config.schema import suggest
from raydistill.data import DATASETS, Pair, load_dataset
from raydistill.evaluation.metrics import roc_auc, spearman

__all__ = [
    "STS7", "DEV_SET", "STS_SETS", "detect_encoder", "evaluate_sts", "evaluate_pair_auc", "sts_predictions",
    "pair_similarities",
]

STS7 = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr")
DEV_SET = "stsb_dev"

# Evaluation name -> data set of the registry. Other scored-pair sets of the registry (e.g. "sick_train") are
# accepted under their own names.
STS_SETS: dict[str, str] = {"sts12": "sts12", "sts13": "sts13", "sts14": "sts14", "sts15": "sts15", "sts16": "sts16",
                             "stsb": "stsb_test", "sickr": "sick_test", "stsb_dev": "stsb_dev"}
ENCODER_KINDS = ("bi", "cross")


def detect_encoder(model: Any, encoder: str | None = None) -> str:
    """``"bi"`` or ``"cross"``: `encoder` when given (checked against the model's methods), else by which exists."""
    if encoder is not None:
        if encoder not in ENCODER_KINDS:
            raise ValueError(f"encoder must be one of {ENCODER_KINDS} or None, got {encoder!r}")
        method = "encode" if encoder == "bi" else "score"
        if not callable(getattr(model, method, None)):
            raise TypeError(f"encoder={encoder!r} needs a model with a .{method}() method; "
                            f"{type(model).__name__} has none")
        return encoder
    has_encode = callable(getattr(model, "encode", None))
    has_score = callable(getattr(model, "score", None))
    if has_encode != has_score:
        return "bi" if has_encode else "cross"
    if has_encode and has_score:
        raise TypeError(f"{type(model).__name__} has both .encode() and .score(); pass encoder='bi' or 'cross'")
    raise TypeError(f"{type(model).__name__} has neither .encode() (bi-encoder) nor .score() (cross-encoder)")


def _accepted_options(method, **options) -> dict[str, Any]:
    """The subset of `options` that `method` names as parameters.

    A catch-all ``**kwargs`` does not count: sentence-transformers forwards it to the tokenizer or model, where an
    option meant for another library would fail or, worse, be silently misread."""
    try:
        parameters = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return {}
    named = {name for name, p in parameters.items()
             if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
    return {name: value for name, value in options.items() if name in named}


def _to_numpy(values) -> np.ndarray:
    if hasattr(values, "detach"):  # a torch tensor from a duck-typed model
        values = values.detach().float().cpu().numpy()
    return np.asarray(values, dtype=np.float64)


def _encode(model, texts: list[str], batch_size: int, progress: bool) -> np.ndarray:
    options = _accepted_options(model.encode, batch_size=batch_size, progress=progress, show_progress_bar=progress)
    embeddings = _to_numpy(model.encode(texts, **options))  # [N, D]
    if embeddings.ndim != 2 or embeddings.shape[0] != len(texts):
        raise ValueError(f"{type(model).__name__}.encode returned shape {embeddings.shape} for {len(texts)} texts; "
                         "expected [N, D]")
    return embeddings


def _score(model, pairs: list[tuple[str, str]], batch_size: int, progress: bool) -> np.ndarray:
    # Raw logits: a sigmoid cannot change a ranking but can saturate distinct logits into float32 ties.
    options = _accepted_options(model.score, batch_size=batch_size, activation=None, progress=progress)
    scores = _to_numpy(model.score(pairs, **options))
    if scores.ndim == 2 and scores.shape[1] == 1:
        scores = scores[:, 0]
    if scores.ndim != 1 or scores.shape[0] != len(pairs):
        raise ValueError(f"{type(model).__name__}.score returned shape {scores.shape} for {len(pairs)} pairs; "
                         "STS needs one score per pair (a num_labels=1 cross-encoder)")
    return scores


def _row_cosines(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """cos(a_i, b_i) for each row i; a zero vector has cosine 0 with everything (not NaN)."""
    dots = np.einsum("nd,nd->n", first, second)  # [N]
    norms = np.linalg.norm(first, axis=1) * np.linalg.norm(second, axis=1)  # [N]
    return np.divide(dots, norms, out=np.zeros_like(dots), where=norms != 0)  # NaN stays NaN


def _log(message: str, progress: bool) -> None:
    if progress:
        print(f"[raydistill.eval] {message}", file=sys.stderr, flush=True)


def pair_similarities(model: Any, pairs_by_set: dict[str, Sequence[Pair]], *, encoder: str | None = None,
                      batch_size: int = 128, progress: bool = False) -> dict[str, np.ndarray]:
    """The model's similarity for every pair of every set: cosine (bi-encoder) or pair score (cross-encoder), all
    sets in one model pass (module docstring)."""
    kind = detect_encoder(model, encoder)
    total_pairs = sum(len(pairs) for pairs in pairs_by_set.values())
    started = time.perf_counter()
    if kind == "bi":
        # dict keeps first-seen order, so the encoder sees the same list (and batches) on every run.
        texts = list(dict.fromkeys(text for pairs in pairs_by_set.values() for p in pairs
                                   for text in (p.sentence1, p.sentence2)))
        index = {text: i for i, text in enumerate(texts)}
        _log(f"encoding {len(texts):,} distinct sentences of {total_pairs:,} pairs "
             f"({', '.join(pairs_by_set)}), batch size {batch_size}", progress)
        embeddings = _encode(model, texts, batch_size, progress)  # [U, D]
        similarities = {name: _row_cosines(embeddings[[index[p.sentence1] for p in pairs]],  # [n, D] each
                                           embeddings[[index[p.sentence2] for p in pairs]])  # [n]
                        for name, pairs in pairs_by_set.items()}
        unit = f"{len(texts) / max(time.perf_counter() - started, 1e-9):.0f} sentences/s"
    else:
        distinct = list(dict.fromkeys((p.sentence1, p.sentence2) for pairs in pairs_by_set.values() for p in pairs))
        index = {pair: i for i, pair in enumerate(distinct)}
        _log(f"scoring {len(distinct):,} distinct pairs of {total_pairs:,} ({', '.join(pairs_by_set)}), "
             f"batch size {batch_size}", progress)
        scores = _score(model, distinct, batch_size, progress)  # [U]
        similarities = {name: scores[[index[(p.sentence1, p.sentence2)] for p in pairs]]
                        for name, pairs in pairs_by_set.items()}
        unit = f"{len(distinct) / max(time.perf_counter() - started, 1e-9):.0f} pairs/s"
    _log(f"model pass done in {time.perf_counter() - started:.1f} s ({unit})", progress)
    return similarities


def _dataset_of(set_name: str) -> str:
    if set_name in STS_SETS:
        return STS_SETS[set_name]
    spec = DATASETS.get(set_name)
    if spec is not None and spec.kind == "scored_pairs":
        return set_name
    known = list(STS_SETS) + [name for name, s in DATASETS.items() if s.kind == "scored_pairs" and name not in STS_SETS]
    raise ValueError(f"unknown STS set {set_name!r}{suggest(set_name, known)}; known: {', '.join(known)}")


def sts_predictions(model: Any, set_name: str, *, encoder: str | None = None, batch_size: int = 128,
                    progress: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(predicted similarity [N], gold score [N]) of one STS set, e.g. for a gold-vs-predicted scatter plot."""
    pairs = load_dataset(_dataset_of(set_name))
    predicted = pair_similarities(model, {set_name: pairs}, encoder=encoder, batch_size=batch_size,
                                  progress=progress)[set_name]
    return predicted, np.array([p.score for p in pairs], dtype=np.float64)


def evaluate_sts(model: Any, *, sets: Iterable[str] = STS7 + (DEV_SET,), batch_size: int = 128,
                 encoder: str | None = None, progress: bool = True) -> dict[str, float]:
    """Spearman x 100 between the model's similarity and the gold score over each whole set, plus ``"avg"``.

    Args:
        model: a bi-encoder (``encode``) or cross-encoder (``score``); see `detect_encoder`.
        sets: evaluation names (`STS7`, ``"stsb_dev"``) or other scored-pair data sets of the registry.
        encoder: ``"bi"`` / ``"cross"`` to force the path; None decides by the model's methods.
        progress: print what is being evaluated, the model-pass speed and each score to stderr.

    Returns:
        ``{set name: spearman x 100}`` in the order of `sets`, and ``"avg"``, the mean of the seven `STS7` scores,
        only when all seven were evaluated (a partial mean is not comparable with any published number).
    """
    names = list(dict.fromkeys(sets))
    if not names:
        raise ValueError("sets is empty: nothing to evaluate")
    pairs_by_set = {name: load_dataset(_dataset_of(name)) for name in names}
    predicted = pair_similarities(model, pairs_by_set, encoder=encoder, batch_size=batch_size, progress=progress)
    scores: dict[str, float] = {}
    for name in names:
        gold = np.array([p.score for p in pairs_by_set[name]], dtype=np.float64)
        scores[name] = spearman(predicted[name], gold)
        _log(f"{name}: {len(gold):,} pairs, Spearman x 100 = {scores[name]:.2f}", progress)
    if all(name in scores for name in STS7):
        scores["avg"] = float(np.mean([scores[name] for name in STS7]))
        _log(f"7-STS avg = {scores['avg']:.2f}", progress)
    return scores


def evaluate_pair_auc(model: Any, set_name: str = "mrpc_val", *, batch_size: int = 128, encoder: str | None = None,
                      progress: bool = False) -> float:
    """ROC AUC x 100 of the model's pair similarity against a 0/1 label set (MRPC, QQP: Trans-Encoder's metric).

    Reported x 100 (0-100, 50 = chance) so that it reads in the same unit as the STS Spearman scores."""
    spec = DATASETS.get(set_name)
    if spec is None or spec.kind != "labelled_pairs" or spec.label_set != frozenset({0, 1}):
        known = [name for name, s in DATASETS.items() if s.kind == "labelled_pairs" and s.label_set == {0, 1}]
        raise ValueError(f"{set_name!r} is not a binary paraphrase set; known: {', '.join(known)}")
    pairs = load_dataset(set_name)
    predicted = pair_similarities(model, {set_name: pairs}, encoder=encoder, batch_size=batch_size,
                                  progress=progress)[set_name]
    auc = roc_auc(predicted, np.array([p.label for p in pairs])) * 100.0
    _log(f"{set_name}: {len(pairs):,} pairs, ROC AUC x 100 = {auc:.2f}", progress)
    return auc
