"""Training to a budget (``train.budget``): how many optimiser steps a run takes, and its learning rate per step.

Contract:

    run_length(cfg, num_rows, world) -> RunLength   total steps and epochs the loop plans (``LearnerGroup.fit``)
    BudgetFactor                                     the LR factor of a time budget, before and after its total
    RateMeter                                        rank 0's measurement that fixes a time budget's total

No budget: ``train.epochs`` passes over the data, cut at ``train.max_steps``. A step budget is the run's total: the
data repeats for as many epochs as the steps need, and the LR schedule (linear warm-up over ``train.warmup_ratio``
of the total, then linear decay) ends at it.

A time budget is turned into a step budget once, by rank 0, from the step rate of this run: the first ``SKIP_STEPS``
steps of a process are not timed (first-call allocations, the data stream starting), then the rate is measured until
at least ``MIN_MEASURED_STEPS`` steps and either ``MEASURE_SHARE`` of the budget's time or ``MAX_MEASURED_STEPS``
steps have passed (or, with very slow steps, ``LATE_SHARE`` of the budget); when a dev evaluation or a checkpoint
falls every ``MAX_MEASURED_STEPS`` steps or more often, the window also spans one of each, so their time is in the
rate. (Without that, a 60 s budget on two workers with an evaluation and a checkpoint every 20 steps trained for
about twice its budget.) The total is then the steps done plus the steps the measured rate fits into the time left.
It reaches every worker as a signal of the step's control collective and one broadcast at that step. The learner
keeps the fixed total, its step and the wall seconds used in its checkpoint: a resumed run never measures again.

Until the total is fixed the loop plans ``capacity`` steps (``MAX_STEPS_PER_S`` per second of budget), and the LR
warms up on a fixed line, ``step / PENDING_WARMUP_STEPS``, the same on every worker. From the fixed step on, the
factor goes linearly to 1 at the warm-up's end (``warmup_ratio`` of the fixed total), then decays linearly to 0 at
the total: continuous, and the end of the schedule is the budget's.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

__all__ = ["BudgetFactor", "RateMeter", "RunLength", "run_length", "MAX_STEPS_PER_S"]

SKIP_STEPS = 3  # steps of a (re)started process before the rate is timed
MIN_MEASURED_STEPS = 20  # a rate from fewer steps is noise on shared cores
MAX_MEASURED_STEPS = 200  # enough for a steady rate, however long the budget
MEASURE_SHARE = 0.05  # of the budget's time: a rate over a few percent of the run sees its load, not an instant
LATE_SHARE = 0.25  # steps so slow that MIN_MEASURED_STEPS do not fit in this share: decide on what was measured
MAX_STEPS_PER_S = 100  # a time budget's upper bound on steps (a step of a tiny student on a GPU takes ~10 ms or more)
# The warm-up line before a time budget's total is known. A total is fixed by step SKIP_STEPS + MAX_MEASURED_STEPS
# at the latest, where this line stands at about a half: the rest of the warm-up follows once the total is known.
PENDING_WARMUP_STEPS = 2 * (SKIP_STEPS + MAX_MEASURED_STEPS)


@dataclass(frozen=True)
class RunLength:
    """What the loop plans: ``total`` steps over at most ``epochs`` epochs; ``pending``: a time budget whose total
    is not fixed yet (``total`` is then its capacity, an upper bound)."""

    total: int
    epochs: int
    pending: bool = False


def run_length(train, num_rows: int, world: int, name: str = "train") -> RunLength:
    """The run's length for the ``train`` section of a config (``TrainConfig``), ``num_rows`` rows and ``world``
    learners; ValueError when the rows give no whole step."""
    from raydistill.runtime.engine.batches import steps_per_epoch

    per_epoch = steps_per_epoch(num_rows, train.batch_size, world)
    if per_epoch == 0:
        raise ValueError(f"{name}: {num_rows} training rows give no full step of {world} x {train.batch_size} rows; "
                         "lower train.batch_size or raise data.max_sentences")
    budget = train.budget_limit()
    if budget is None:
        total = per_epoch * train.epochs
        return RunLength(min(total, train.max_steps) if train.max_steps else total, train.epochs)
    if budget.steps is not None:
        return RunLength(budget.steps, math.ceil(budget.steps / per_epoch))
    capacity = max(1, int(budget.seconds * MAX_STEPS_PER_S))
    return RunLength(capacity, math.ceil(capacity / per_epoch), pending=True)


class BudgetFactor:
    """``LambdaLR``'s factor of a time budget (module docstring). Plain numbers only: ``LambdaLR.state_dict`` saves
    them, and a checkpoint is read with ``weights_only``."""

    def __init__(self, warmup_ratio: float):
        self.warmup_ratio = float(warmup_ratio)
        self.total: int | None = None  # fixed total steps
        self.fixed_at = 0  # the step it was fixed at
        self.start = 0.0  # the factor at that step

    def pending(self, step: int) -> float:
        if self.warmup_ratio <= 0:
            return 1.0
        return min(1.0, step / PENDING_WARMUP_STEPS)

    def fix(self, total: int, at_step: int) -> None:
        self.total, self.fixed_at = int(total), int(at_step)
        self.start = self.pending(at_step)

    @property
    def warmup_steps(self) -> int:
        return int(self.warmup_ratio * self.total) if self.total is not None else 0

    def __call__(self, step: int) -> float:
        if self.total is None or step < self.fixed_at:
            return self.pending(step)
        warmup, total = self.warmup_steps, self.total
        if step < warmup and self.start < 1.0:
            return self.start + (1.0 - self.start) * (step - self.fixed_at) / max(1, warmup - self.fixed_at)
        return max(0.0, float(total - step) / float(max(1, total - max(warmup, self.fixed_at))))


class RateMeter:
    """Rank 0's measurement of a time budget's step rate (module docstring): ``observe`` after every step returns
    the total to fix, once, and None before."""

    def __init__(self, budget_s: float, capacity: int, clock=time.perf_counter, pauses: tuple[int, ...] = ()):
        self.budget_s, self.capacity, self.clock = float(budget_s), int(capacity), clock
        # Intervals of the loop's pauses (train.eval_every, checkpoint_every): a window that spans one of each that
        # fits in MAX_MEASURED_STEPS times them with the steps, as the rest of the run will.
        self.pauses = tuple(int(every) for every in pauses if 0 < int(every) <= MAX_MEASURED_STEPS)
        self.steps_here = 0
        self.first: tuple[int, float] | None = None  # (step, time) where the timing starts

    def observe(self, step: int, seconds_used: float) -> int | None:
        now = self.clock()
        self.steps_here += 1
        if self.first is None:
            if self.steps_here >= SKIP_STEPS:
                self.first = (step, now)
            return None
        measured, elapsed = step - self.first[0], now - self.first[1]
        paused = all(step // every > self.first[0] // every for every in self.pauses)  # each pause timed once
        enough = measured >= MIN_MEASURED_STEPS and (paused and seconds_used >= MEASURE_SHARE * self.budget_s
                                                      or measured >= MAX_MEASURED_STEPS)
        late = measured >= 1 and seconds_used >= LATE_SHARE * self.budget_s
        if not (enough or late) or elapsed <= 0:
            return None
        left = max(0.0, self.budget_s - seconds_used)
        return max(step + 1, min(self.capacity, step + int(measured / elapsed * left)))
