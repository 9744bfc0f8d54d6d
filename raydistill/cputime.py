"""CPU time of this process: what a job's result records as ``cpu_s`` and the training loop sums over its workers.

Contract: ``cpu_seconds()`` is user + system CPU seconds of the calling process since it started (all its threads);
with ``children=True`` it adds those of its child processes that have ended and been waited for, never of those
still running. The difference of two readings is the CPU a piece of work cost, which on a shared machine says more
than its wall time."""

from __future__ import annotations

import resource

__all__ = ["cpu_seconds"]


def cpu_seconds(*, children: bool = False) -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    total = usage.ru_utime + usage.ru_stime
    if children:
        ended = resource.getrusage(resource.RUSAGE_CHILDREN)
        total += ended.ru_utime + ended.ru_stime
    return total
