"""The unlabeled sentence pairs that Trans-Encoder labels and learns from.

Trans-Encoder (Liu et al., ICLR 2022) never reads a gold score for training: it alternately pseudo-labels a set of
unlabeled *pairs* with a bi-encoder and a cross-encoder. Which pairs is a choice with consequences:

* ``transductive`` (the paper, ``src/data.py`` task ``sts_sickr``): every pair of STS12-16, STS-B train/dev/test and
  SICK train/trial/test, without their scores. The pairs the models are tested on are seen during training (never
  their gold labels). Scores from such a run are transductive and every result file says so.
* ``inductive``: the training splits only (STS-B train + SICK train); test and dev pairs are never seen.
* ``file:<path>``: a JSON Lines file of ``sentence1``/``sentence2`` rows (scores, if present, are ignored).

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

__all__ = [
    "PAIR_SOURCES",
    "PairSet",
    "build_pair_set",
    "pair_sets_of",
]

# source name -> data sets of raydistill.data's registry whose pairs (never scores) form the pool.
PAIR_SOURCES: dict[str, tuple[str, ...]] = {
    "transductive": (
        "sts12", "sts13", "sts14", "sts15", "sts16",
        "stsb_train", "stsb_dev", "stsb_test",
        "sick_train", "sick_trial", "sick_test",
    ),
    "inductive": ("stsb_train", "sick_train"),
}


@dataclass(frozen=True)
class PairSet:
    """An ordered, deduplicated set of unlabeled pairs; row i is ``(pair_id[i], sentence1[i], sentence2[i])``."""

    pair_id: np.ndarray  # [N] int64, increasing
    sentence1: tuple[str, ...]
    sentence2: tuple[str, ...]
    source: str
    pool_size: int  # pairs in the deduplicated pool before subsampling
    fingerprint: str = field(default="")

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
        """True when evaluation pairs (STS12-16, STS-B dev/test, SICK trial/test) may be in the pool."""
        return self.source != "inductive"

    def pairs(self) -> list[tuple[str, str]]:
        return list(zip(self.sentence1, self.sentence2))

    def swapped_pairs(self) -> list[tuple[str, str]]:
        return list(zip(self.sentence2, self.sentence1))

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
    """The deduplicated pool of ``source``, subsampled to ``max_pairs`` (seeded, without replacement).

    Gold scores are dropped here, at the only place pairs enter the job, so no later stage can train on them.
    """
    from raydistill.data import load_dataset, read_pairs

    if source.startswith("file:"):
        path = Path(source[len("file:"):]).expanduser()
        records = [read_pairs(path)]
    else:
        records = [load_dataset(name) for name in pair_sets_of(source)]

    seen: set[tuple[str, str]] = set()
    first: list[str] = []
    second: list[str] = []
    for pairs in records:
        for pair in pairs:
            key = (pair.sentence1, pair.sentence2) if pair.sentence1 <= pair.sentence2 else (
                pair.sentence2, pair.sentence1)
            if key in seen:
                continue
            seen.add(key)
            first.append(pair.sentence1)
            second.append(pair.sentence2)
    pool_size = len(first)
    if pool_size == 0:
        raise ValueError(f"pair source {source!r} holds no pairs")

    pair_id = np.arange(pool_size, dtype=np.int64)
    if max_pairs is not None:
        if max_pairs <= 0:
            raise ValueError(f"max_pairs must be > 0, got {max_pairs}")
        if max_pairs < pool_size:
            rng = np.random.default_rng(seed)
            pair_id = np.sort(rng.choice(pool_size, size=max_pairs, replace=False)).astype(np.int64)
    return PairSet(
        pair_id=pair_id,
        sentence1=tuple(first[i] for i in pair_id),
        sentence2=tuple(second[i] for i in pair_id),
        source=source,
        pool_size=pool_size,
    )


def _fingerprint(pair_id: np.ndarray, sentence1, sentence2) -> str:
    digest = hashlib.sha256()
    for i, a, b in zip(pair_id.tolist(), sentence1, sentence2):
        digest.update(f"{i}\x1f{a}\x1f{b}\x1e".encode())
    return digest.hexdigest()[:16]
