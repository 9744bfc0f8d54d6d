"""Which batches a Train worker trains on, and from where a resume continues: the seeded order cut per rank.

One optimiser step takes one batch per worker: batch b of an epoch goes to rank b mod world, and the epoch's
leftover batches are dropped (``steps_per_epoch``). Both sources yield ``(epoch, step in epoch, this rank's batch)``
from a resume position ``(epoch, first_step)`` on, so a resumed run neither skips nor repeats a batch.

A corpus (``TrainingData``) streams from Ray Data: the job passes ``TrainingData.epoch_stream`` as
``datasets={"train": ...}`` unsplit (every worker reads the whole ordered stream and keeps its own batches; texts
are cheap to read twice, and the teacher vectors are read only for the worker's own batches), so the order does not
depend on how Ray schedules blocks, and a resume skips the consumed batches exactly; Train's local mode reads the
same stream in the driver. A labelled set (``ArrayData``: a few thousand rows) travels in the loop config, and so
does a Tune trial's corpus (``iter_batches``: the same batches; teacher vectors from the cache).
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

__all__ = ["array_steps", "steps_per_epoch", "stream_steps"]


def steps_per_epoch(num_rows: int, batch_size: int, world_size: int) -> int:
    """Optimiser steps of one epoch: one step takes one batch per worker; the epoch's leftover batches are dropped."""
    return (num_rows // batch_size) // max(1, world_size)


def array_steps(data, batch_size: int, world: int, rank: int, per_epoch: int, epoch: int, first_step: int,
                 epochs: int) -> Iterator[tuple[int, int, dict[str, np.ndarray]]]:
    """``(epoch, step in epoch, this rank's batch)`` of an in-memory labelled set, from ``(epoch, first_step)``."""
    for ep in range(epoch, epochs):
        skip = first_step * world if ep == epoch else 0
        for b, batch in enumerate(data.iter_batches(ep, batch_size, skip_batches=skip), start=skip):
            if b >= per_epoch * world:
                break
            if b % world == rank:
                yield ep, b // world, batch


def stream_steps(shard, teacher: dict[str, Any], batch_size: int, world: int, rank: int, epoch: int,
                  first_step: int) -> Iterator[tuple[int, int, dict[str, np.ndarray]]]:
    """``(epoch, step in epoch, this rank's batch)`` of the Ray Data stream (``TrainingData.epoch_stream``), from
    ``(epoch, first_step)`` on: earlier batches are read and dropped, other ranks' batches are dropped unread by
    the teacher cache."""
    first = True
    for batch in shard.iter_batches(batch_size=batch_size, batch_format="numpy", drop_last=True):
        ep = int(batch["epoch"][0])
        b = int(batch["position"][0]) // batch_size
        if first and (ep, b) > (epoch, first_step * world):
            raise RuntimeError(f"the data stream starts at epoch {ep} batch {b}, after the resume position (epoch "
                               f"{epoch}, batch {first_step * world}): batches would be skipped")
        first = False
        if (ep, b // world) < (epoch, first_step) or b % world != rank:
            continue
        rows = {name: (np.asarray(column, dtype=object) if name.startswith("text_") else np.asarray(column))
                for name, column in batch.items() if name not in ("epoch", "position")}
        for view, vectors in teacher.items():
            rows[f"teacher_{view}"] = vectors(rows[f"text_{view}"])  # [B, D] from the memory-mapped cache
        yield ep, b // world, rows
