"""``ArrayData``: a few thousand labelled rows held as numpy columns, batched in a seeded order per epoch.

The supervised stages (DistilCSE's NLI triplets, DvBERT's pairs with soft labels, STS-B train) need no Ray Data
pipeline: their rows fit in memory many times over. ``iter_batches`` has the same contract as the corpus pipeline's
(``raydistill.runtime.teachers.pipeline.TrainingData``): the order of epoch ``e`` is a permutation drawn from ``(seed, e)``,
so a run resumed at batch ``k`` sees exactly the batches it would have."""

from __future__ import annotations

import math
from typing import Any, Iterator

import numpy as np

__all__ = ["ArrayData", "LengthBucketedArrayData", "seeded_subset"]


def seeded_subset(num_rows: int, max_rows: int | None, seed: int) -> np.ndarray:
    """Row indices in order: all of them, or ``max_rows`` drawn without replacement by ``default_rng(seed)``."""
    if max_rows is None or max_rows >= num_rows:
        return np.arange(num_rows)
    return np.sort(np.random.default_rng(seed).choice(num_rows, size=max_rows, replace=False))


class ArrayData:
    def __init__(self, columns: dict[str, np.ndarray], seed: int = 0, shuffle: bool = True,
                 cache_stats: dict[str, Any] | None = None):
        lengths = {name: len(col) for name, col in columns.items()}
        if len(set(lengths.values())) != 1:
            raise ValueError(f"ArrayData: columns differ in length: {lengths}")
        self._columns = columns
        self.num_rows = next(iter(lengths.values()))
        self.seed, self.shuffle = int(seed), shuffle
        self.cache_stats = cache_stats or {}

    def rows(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """The rows ``indices`` as a batch."""
        return {name: col[indices] for name, col in self._columns.items()}

    def num_batches(self, batch_size: int, drop_last: bool = True) -> int:
        return self.num_rows // batch_size if drop_last else math.ceil(self.num_rows / batch_size)

    def iter_batches(self, epoch: int, batch_size: int, skip_batches: int = 0, drop_last: bool = True,
                     ) -> Iterator[dict[str, np.ndarray]]:
        order = np.arange(self.num_rows)
        if self.shuffle:
            order = np.random.default_rng([self.seed, int(epoch)]).permutation(self.num_rows)
        for b in range(skip_batches, self.num_batches(batch_size, drop_last)):
            yield self.rows(order[b * batch_size:(b + 1) * batch_size])


class LengthBucketedArrayData(ArrayData):
    """``ArrayData`` whose epochs come as batches of similar length (DvBERT's teacher folds: NLI pairs run from ~10
    to ~90 tokens, and a batch pads to its longest pair).

    Epoch ``e``: a permutation drawn from ``(seed, e)``; each run of ``batches_per_bucket`` batches of it sorted by
    ``lengths`` and cut into batches; the full batches shuffled (the ragged ones dropped). Every batch stays a
    random draw from a random window, and the order is a function of ``(seed, e)``, so a resume at batch ``k``
    sees exactly the batches it would have. An epoch has ``num_rows // batch_size`` full batches, as the engine
    counts them."""

    def __init__(self, columns: dict[str, np.ndarray], lengths: np.ndarray, seed: int = 0,
                 batches_per_bucket: int = 50, cache_stats: dict[str, Any] | None = None):
        super().__init__(columns, seed=seed, shuffle=True, cache_stats=cache_stats)
        self.lengths = np.asarray(lengths)
        if len(self.lengths) != self.num_rows:
            raise ValueError(f"LengthBucketedArrayData: {len(self.lengths)} lengths for {self.num_rows} rows")
        self.batches_per_bucket = int(batches_per_bucket)

    def epoch_batches(self, epoch: int, batch_size: int) -> list[np.ndarray]:
        rng = np.random.default_rng([self.seed, int(epoch)])
        shuffled = rng.permutation(self.num_rows)
        span = batch_size * self.batches_per_bucket
        batches = []
        for start in range(0, len(shuffled), span):
            window = shuffled[start:start + span]
            window = window[np.argsort(-self.lengths[window], kind="stable")]
            batches.extend(window[i:i + batch_size] for i in range(0, len(window), batch_size))
        batches = [b for b in batches if len(b) == batch_size]
        return [batches[i] for i in rng.permutation(len(batches))]

    def iter_batches(self, epoch: int, batch_size: int, skip_batches: int = 0, drop_last: bool = True,
                     ) -> Iterator[dict[str, np.ndarray]]:
        if not drop_last:
            raise ValueError("LengthBucketedArrayData keeps full batches only")
        for rows in self.epoch_batches(epoch, batch_size)[skip_batches:]:
            yield self.rows(rows)
