"""``ArrayData``: a few thousand labelled rows held as numpy columns, batched in a seeded order per epoch.

The supervised stages (DistilCSE's NLI triplets, DvBERT's pairs with soft labels, STS-B train) need no Ray Data
pipeline: their rows fit in memory many times over. ``iter_batches`` has the same contract as the corpus pipeline's
(``raydistill.runtime.teachers.pipeline.TrainingData``): the order of epoch ``e`` is a permutation drawn from ``(seed, e)``,
so a run resumed at batch ``k`` sees exactly the batches it would have.
"""

from __future__ import annotations

import math
from typing import Any, Iterator

import numpy as np

__all__ = ["ArrayData"]


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
