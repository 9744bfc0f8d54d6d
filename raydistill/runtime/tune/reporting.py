"""How a Ray Tune trial hears its training loop: ``TrialReports`` (the loop's reporter) and ``EvalReportsToTune``.

A trial hands ``run_distillation`` one ``Reporter`` (``engine.reporting``) per stage (``TrialReports.for_stage``).
What it changes from the plain job's ``TrainReports``:

- rank 0's report of a step with a dev evaluation also carries ``best_stsb_dev`` (``METRIC``, what ASHA ranks trials
  by: the trial's best so far, its earlier stages' included), ``stsb_dev``, ``stage`` and the step counted over the
  trial's stages (ASHA's time axis must not go back when stage 2 starts). The trial's very last evaluation is held
  back (``hold_back_final``): the trial reports it once the job has written its outputs, so a stop cannot cut them.
- with Train workers ``EvalReportsToTune``, a Train callback of the trial's ``TorchTrainer``, forwards those reports,
  and only them, to the trial (Tune requires the metric in every result; a report per step would be thousands).
- in Train's local mode the loop runs in the trial's own process, where ``ray.train.report`` refuses to run: an
  evaluation goes to Tune directly (``ray.tune.report``), with the step's checkpoint when one is due, which Tune hands
  back to a restarted trial. Under PBT that checkpoint may be another trial's, written with another learning rate or
  temperature: those keys may differ (``pbt_mutable``). Only the stage that wrote a checkpoint resumes from it.
- rows reach the workers as the memory-mapped arrays, never as a Ray Data stream: a Ray Data task started inside a
  trial is captured into the trial's placement group, where it never runs (measured: "cannot fit into any bundles").
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

from ray.tune.integration.ray_train import TuneReportCallback

from raydistill.config.sweep import METRIC, pbt_mutable
from raydistill.runtime.engine.reporting import SaveCheckpoint, StepReport, TrainReports

__all__ = ["EvalReportsToTune", "TrialReports"]


@dataclass
class TrialReports(TrainReports):
    """The reporter of one stage of a Tune trial (see the module docstring)."""

    step_offset: int = 0
    stage: int = 1
    best_before: float | None = None
    hold_back_final: bool = False

    may_differ = staticmethod(pbt_mutable)
    streams_rows = False

    @classmethod
    def for_stage(cls, index: int, num_stages: int, step_offset: int, best_before: float | None) -> TrialReports:
        """``run_distillation``'s ``stage_reporter``: stage ``index`` of ``num_stages``, after ``step_offset`` steps
        of the earlier stages, whose best dev was ``best_before``."""
        return cls(step_offset=step_offset, stage=index, best_before=best_before,
                   hold_back_final=index == num_stages)

    def registered_checkpoint(self, local_mode: bool):
        if not local_mode:
            return super().registered_checkpoint(local_mode)
        from ray import tune

        return tune.get_checkpoint()  # the trial's process: the checkpoint Tune restored it with

    def accepts(self, manifest: dict[str, Any]) -> bool:
        written_in = (manifest.get("extra") or {}).get("stage")
        return written_in is None or written_in == self.stage  # steps count per stage

    def trainer_callbacks(self, local_mode: bool) -> list | None:
        return None if local_mode else [EvalReportsToTune()]  # local mode reports to Tune itself

    def report(self, report: StepReport, save: SaveCheckpoint) -> None:
        to_tune = self._metrics(report)
        if not report.local_mode:
            super().report(report.with_metrics(to_tune), save)
            return
        # The run's final checkpoint stays in the run dir, where a trial restarted in a later stage finds this
        # stage done; the checkpoint of an evaluation goes to Tune, with no second copy in the run dir.
        checkpoint_to_tune = bool(to_tune) and report.checkpoint and not report.final
        if report.checkpoint and not checkpoint_to_tune:
            save(None, report.extra)
        if to_tune:
            self._report_to_tune(to_tune, report, save, checkpoint_to_tune)

    def _metrics(self, report: StepReport) -> dict[str, Any]:
        """What Tune gets of this report: nothing unless it is rank 0's at a dev evaluation (and not the held-back
        last one)."""
        if report.rank != 0 or report.dev is None or report.best is None:
            return {}
        if report.last_step and self.hold_back_final:
            return {}
        best = float(report.best) if self.best_before is None else max(float(report.best), float(self.best_before))
        return {"step": self.step_offset + int(report.step), "stage": self.stage, "stsb_dev": float(report.dev),
                METRIC: best}

    def _report_to_tune(self, metrics: dict[str, Any], report: StepReport, save: SaveCheckpoint,
                        checkpoint: bool) -> None:
        """``ray.tune.report`` from the trial's process; Tune may stop the trial here (SystemExit)."""
        from ray import tune

        if not checkpoint:
            tune.report(metrics)
            return
        staging = tempfile.mkdtemp(prefix="raydistill-ckpt-")
        try:
            # Which trial and stage wrote it: a trial that PBT restarts from another trial's checkpoint takes over
            # that trial's run, and only the stage that wrote a checkpoint resumes from it.
            path = save(staging, {**report.extra, "trial_id": tune.get_context().get_trial_id(), "stage": self.stage})
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(path))
        finally:
            shutil.rmtree(staging, ignore_errors=True)


class EvalReportsToTune(TuneReportCallback):
    """Forward rank 0's reports that carry a dev evaluation (``METRIC``) to the Ray Tune trial."""

    def after_report(self, run_context, metrics: list[dict[str, Any]], checkpoint) -> None:
        if metrics and METRIC in metrics[0]:
            super().after_report(run_context, metrics, checkpoint)
