"""How the training loop's reports leave it: a ``Reporter`` is the loop's one exit for metrics and checkpoints.

The loop (``train_loop``) knows nothing of who listens. On every worker it asks its reporter

    registered_checkpoint(local_mode)   at a (re)start: the checkpoint the runner registered for it, or None
    accepts(manifest)                   whether that checkpoint belongs to this run (False: the loop ignores it)
    may_differ                          which config keys a registered checkpoint may differ in (None: none)
    report(StepReport, save)            at every progress step (every ``runtime.log_every`` steps, 30 s after the
                                        previous report, a dev evaluation, a checkpoint, a stop, the last step),
                                        and once after the last step

and ``LearnerGroup`` asks it for the ``TorchTrainer``'s ``trainer_callbacks(local_mode)`` and whether the rows may
come as a Ray Data stream (``streams_rows``). ``save(run_dir, extra)`` writes the step's checkpoint (rank 0 only)
into ``run_dir`` (None: the run's own directory) and returns where.

``TrainReports`` is the plain job's reporter: ``ray.train.report`` of every report, with the checkpoint of a step
that has one (Train persists it under ``RunConfig(storage_path)``). In Train's local mode a reported checkpoint would
stay in memory only, so there it goes into the run directory itself. A Ray Tune trial plugs in its own reporter.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, replace
from typing import Any, Callable

__all__ = ["PROGRESS_INTERVAL_S", "Reporter", "StepReport", "TrainReports", "SaveCheckpoint", "progress_every"]

# The longest the driver goes without a progress line (and a report) while steps finish.
PROGRESS_INTERVAL_S = 30.0

# save(run_dir, extra) -> the checkpoint directory written (rank 0), None elsewhere
SaveCheckpoint = Callable[[Any, dict[str, Any]], Any]


def progress_every(log_every: int | None, total_steps: int) -> int:
    """Steps between progress lines and reports: ``runtime.log_every``, or about 50 a run."""
    return int(log_every) if log_every else max(1, total_steps // 50)


@dataclass(frozen=True)
class StepReport:
    """One report of the loop: this step's metrics and where the worker stands. ``checkpoint``: one of this step
    boundary is due; ``final``: the report after the last step (checkpoint marked finished); ``last_step``: ``final``
    or the last optimiser step; ``dev``/``best``: on rank 0 at an evaluated step, else None."""

    metrics: dict[str, Any]
    step: int
    extra: dict[str, Any]
    checkpoint: bool
    final: bool
    last_step: bool
    rank: int
    local_mode: bool
    dev: float | None = None
    best: float | None = None

    def with_metrics(self, more: dict[str, Any]) -> StepReport:
        return replace(self, metrics={**self.metrics, **more})


class Reporter:
    """What the loop calls; ``TrainReports`` is the default. Picklable: it rides in the loop config."""

    may_differ: Callable[[str], bool] | None = None
    streams_rows = True

    def registered_checkpoint(self, local_mode: bool):
        raise NotImplementedError

    def accepts(self, manifest: dict[str, Any]) -> bool:
        return True

    def report(self, report: StepReport, save: SaveCheckpoint) -> None:
        raise NotImplementedError

    def trainer_callbacks(self, local_mode: bool) -> list | None:
        return None


class TrainReports(Reporter):
    """Every report to Ray Train; checkpoints persisted by Train (workers) or into the run directory (local mode)."""

    def registered_checkpoint(self, local_mode: bool):
        if local_mode:  # local mode registers none; the run directory has them
            return None
        import ray.train

        return ray.train.get_checkpoint()

    def report(self, report: StepReport, save: SaveCheckpoint) -> None:
        import ray.train

        if report.local_mode:
            if report.checkpoint:
                save(None, report.extra)
            ray.train.report(report.metrics)
            return
        if not report.checkpoint:
            ray.train.report(report.metrics)
            return
        # Rank 0 writes the checkpoint into a local temporary directory and hands it over; Train persists it as
        # step-XXXXXXX and keeps train.keep_last of them.
        staging = tempfile.mkdtemp(prefix="raydistill-ckpt-") if report.rank == 0 else None
        try:
            reported = None
            if staging is not None:
                reported = ray.train.Checkpoint.from_directory(save(staging, report.extra))
            ray.train.report(report.metrics, checkpoint=reported, checkpoint_dir_name=f"step-{int(report.step):07d}")
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
