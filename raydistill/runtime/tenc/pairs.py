"""The unlabeled sentence pairs that Trans-Encoder labels and learns from.

Trans-Encoder (Liu et al., ICLR 2022) never reads a gold score for training: it alternately pseudo-labels a set of
unlabeled *pairs* with a bi-encoder and a cross-encoder. Which pairs is a choice with consequences:

* ``transductive`` (the paper, ``src/data.py`` task ``sts_sickr``): every pair of STS12-16, STS-B train/dev/test and
  SICK train/trial/test, without their scores. The pairs the models are tested on are seen during training (never
  their gold labels). Scores from such a run are transductive and every result file says so.
* ``inductive``: pairs of sets nothing is scored on (STS-B train, SICK train, MRPC train, and the premise /
  hypothesis pairs of SNLI and MultiNLI dev, their labels dropped), less every pair either of whose sentences is an
  evaluation sentence (``raydistill.data.evaluation_text``): neither test and dev pairs nor their sentences are seen.
  32,779 distinct pairs, NLI pairs for the most part (STS-B and SICK train alone leave 734: docs/data.md).
* ``file:<path>``: a JSON Lines file of ``sentence1``/``sentence2`` rows (scores, if present, are ignored).
* ``qqp`` / ``mrpc`` (the paper's pair-classification tasks): the pairs of QQP dev, or of MRPC train + validation,
  without their 0/1 paraphrase labels. Transductive by design: the models learn on exactly the pairs they are then
  scored on, and the labels come back only in `gold_pair_labels`, for the job's ROC AUC, never for training.
  With ``held_out`` set, the same sources are inductive instead (`split_held_out`): the pool is split in two halves
  (seeded); the job learns from the pairs of one half less every pair that shares a sentence with the other, and
  the AUC is measured on ``held_out`` pairs of the other half, which no model sees and nothing chooses on.

Pairs are deduplicated as unordered pairs: the authors dedupe by the concatenation ``s1 + s2`` (order-sensitive),
but every label here is symmetric (the bi-encoder's cosine is, and the cross-encoder's is averaged over both
orders), so ``(a, b)`` and ``(b, a)`` would be one example counted twice. ``pair_id`` is the position in the
deduplicated pool *before* subsampling, so the same pair keeps its id whatever ``max_pairs`` is.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["PAIR_CLASSIFICATION_SOURCES", "PAIR_SOURCES", "PairSet", "build_pair_set", "gold_pair_labels",
           "pair_sets_of", "split_held_out"]

# source name -> data sets of raydistill.data's registry whose pairs (never scores) form the pool.
PAIR_SOURCES: dict[str, tuple[str, ...]] = {
    "transductive": (
        "sts12", "sts13", "sts14", "sts15", "sts16",
        "stsb_train", "stsb_dev", "stsb_test",
        "sick_train", "sick_trial", "sick_test",
    ),
    "inductive": ("stsb_train", "sick_train", "mrpc_train", "snli_dev", "mnli_dev"),
    "qqp": ("qqp_dev",),
    "mrpc": ("mrpc_train", "mrpc_val"),
}
# Sources whose pairs carry a gold 0/1 paraphrase label: trained on like any other source (the label is dropped in
# `build_pair_set`), evaluated by the ROC AUC of each model's pair scores against it (`gold_pair_labels`).
PAIR_CLASSIFICATION_SOURCES = ("qqp", "mrpc")


@dataclass(frozen=True)
class PairSet:
    """An ordered, deduplicated set of unlabeled pairs; row i is ``(pair_id[i], sentence1[i], sentence2[i])``."""

    pair_id: np.ndarray  # [N] int64, increasing
    sentence1: tuple[str, ...]
    sentence2: tuple[str, ...]
    source: str
    pool_size: int  # pairs in the deduplicated pool before subsampling
    fingerprint: str = field(default="")
    held_out: bool = False  # the learned-from half of a held-out split: no evaluation pair or sentence in it

    def __post_init__(self):
        if not (len(self.pair_id) == len(self.sentence1) == len(self.sentence2)):
            raise ValueError(f"PairSet columns differ in length: {len(self.pair_id)} ids, {len(self.sentence1)} "
                             f"first and {len(self.sentence2)} second sentences")
        if not self.fingerprint:
            object.__setattr__(self, "fingerprint", _fingerprint(self.pair_id, self.sentence1, self.sentence2))

    def __len__(self) -> int:
        return len(self.pair_id)

    @property
    def transductive(self) -> bool:
        """True when evaluation pairs or sentences may be in the pool: STS12-16, STS-B dev/test, SICK trial/test
        (``transductive``, and any ``file:``, which may hold anything), or the very pairs the AUC is measured on
        (``qqp``, ``mrpc``), unless those are split with a held-out half."""
        return self.source != "inductive" and not self.held_out

    def pairs(self) -> list[tuple[str, str]]:
        return list(zip(self.sentence1, self.sentence2))

    def columns(self) -> dict[str, np.ndarray]:
        """The three identity columns of every label table, as numpy arrays (strings as object arrays)."""
        return {
            "pair_id": np.asarray(self.pair_id, dtype=np.int64),
            "sentence1": np.asarray(self.sentence1, dtype=object),
            "sentence2": np.asarray(self.sentence2, dtype=object),
        }


def pair_sets_of(source: str) -> tuple[str, ...]:
    """Registry data sets behind a source name (``file:`` sources have none)."""
    if source.startswith("file:"):
        return ()
    if source not in PAIR_SOURCES:
        raise ValueError(f"unknown pair source {source!r}; use one of {', '.join(PAIR_SOURCES)} or file:<path>")
    return PAIR_SOURCES[source]


def build_pair_set(source: str = "transductive", max_pairs: int | None = None, seed: int = 1000) -> PairSet:
    """The deduplicated pool of ``source``, subsampled to ``max_pairs`` (seeded, without replacement). Gold scores
    and labels are dropped here, at the only place pairs enter the job, so no later stage can train on them."""
    from raydistill.data.arrays import seeded_subset

    first, second = _pool(source)
    if max_pairs is not None and max_pairs <= 0:
        raise ValueError(f"max_pairs must be > 0, got {max_pairs}")
    pair_id = seeded_subset(len(first), max_pairs, seed).astype(np.int64)
    return PairSet(pair_id=pair_id, sentence1=tuple(first[i] for i in pair_id),
                   sentence2=tuple(second[i] for i in pair_id), source=source, pool_size=len(first))


def split_held_out(source: str, held_out: int, max_pairs: int | None = None, seed: int = 1000
                   ) -> tuple[PairSet, PairSet]:
    """``(learned, evaluated)`` of a pair-classification source split in two halves (a seeded shuffle of the pool):
    ``learned``, the first half's pairs less every pair that shares a sentence with the second half, subsampled
    to ``max_pairs``; ``evaluated``, the first ``held_out`` pairs of the second half. No sentence is in both.
    ``pair_id`` is the position in the pool, in both."""
    from raydistill.data.arrays import seeded_subset

    if source not in PAIR_CLASSIFICATION_SOURCES:
        raise ValueError(f"a held-out split needs gold labels to score it; pair source {source!r} has none (use "
                         f"{' or '.join(PAIR_CLASSIFICATION_SOURCES)})")
    first, second = _pool(source)
    order = np.random.default_rng(seed).permutation(len(first))  # [P] pool positions
    half_a, half_b = np.sort(order[:len(order) // 2]), order[len(order) // 2:]
    if held_out > len(half_b):
        raise ValueError(f"held_out asks for {held_out:,} pairs; half of the {len(first):,} {source} pairs is "
                         f"{len(half_b):,}")
    evaluated_id = np.sort(half_b[:held_out]).astype(np.int64)
    in_b = {text for i in half_b for text in (first[i], second[i])}
    clean_a = np.array([i for i in half_a if first[i] not in in_b and second[i] not in in_b], dtype=np.int64)
    learned_id = clean_a[seeded_subset(len(clean_a), max_pairs, seed)]

    def pair_set(ids: np.ndarray, held: bool) -> PairSet:
        return PairSet(pair_id=ids, sentence1=tuple(first[i] for i in ids), sentence2=tuple(second[i] for i in ids),
                       source=source, pool_size=len(first), held_out=held)

    return pair_set(learned_id, True), pair_set(evaluated_id, False)


def _pool(source: str) -> tuple[list[str], list[str]]:
    """The first and second sentences of every distinct (unordered) pair of ``source``, in reading order."""
    from raydistill.data import load_dataset, read_pairs

    if source.startswith("file:"):
        records = [read_pairs(Path(source[len("file:"):]).expanduser())]
    elif source == "inductive":
        from raydistill.data.corpus import training_pairs

        records = [training_pairs((name,))[0] for name in pair_sets_of(source)]
    else:
        records = [load_dataset(name) for name in pair_sets_of(source)]

    seen: set[tuple[str, str]] = set()
    first: list[str] = []
    second: list[str] = []
    for pairs in records:
        for pair in pairs:
            key = _unordered(pair.sentence1, pair.sentence2)
            if key not in seen:
                seen.add(key)
                first.append(pair.sentence1)
                second.append(pair.sentence2)
    if not first:
        raise ValueError(f"pair source {source!r} holds no pairs")
    return first, second


def gold_pair_labels(pair_set: PairSet) -> np.ndarray:
    """The gold 0/1 paraphrase label of every pair of a ``qqp`` / ``mrpc`` pair set, [N] int64 in pair-set order, for
    the driver's evaluation only. A pair listed twice (in either order) keeps its first listing's label, the listing
    whose sentence order `build_pair_set` kept."""
    from raydistill.data import load_dataset

    if pair_set.source not in PAIR_CLASSIFICATION_SOURCES:
        raise ValueError(f"pair source {pair_set.source!r} has no gold pair labels; only "
                         f"{', '.join(PAIR_CLASSIFICATION_SOURCES)} do")
    label_of: dict[tuple[str, str], int] = {}
    for name in pair_sets_of(pair_set.source):
        for pair in load_dataset(name):
            label_of.setdefault(_unordered(pair.sentence1, pair.sentence2), int(pair.label))
    return np.array([label_of[_unordered(a, b)] for a, b in zip(pair_set.sentence1, pair_set.sentence2)],
                    dtype=np.int64)


def _unordered(first: str, second: str) -> tuple[str, str]:
    """The key under which ``(a, b)`` and ``(b, a)`` are one pair."""
    return (first, second) if first <= second else (second, first)


def _fingerprint(pair_id: np.ndarray, sentence1, sentence2) -> str:
    digest = hashlib.sha256()
    for i, a, b in zip(pair_id.tolist(), sentence1, sentence2):
        digest.update(f"{i}\x1f{a}\x1f{b}\x1e".encode())
    return digest.hexdigest()[:16]
