"""``EvalReportsToTune``: the Ray Train callback that brings a Tune trial's dev evaluations to Tune.

A trial (``runtime.tune.trial.distill_trial``) runs its training as a ``TorchTrainer`` with Train workers; rank 0's
``ray.train.report`` of a step with a dev evaluation carries ``TUNE_METRIC`` (``train_loop.TuneReporting``). Ray's
``TuneReportCallback`` forwards every report of rank 0 to the trial; this one forwards only those, because Tune
requires the metric in every result it gets, and a report per optimiser step would be thousands of results per
trial. Checkpoints stay where Train persisted them (the trial's storage under the sweep's Tune directory); their path
rides along as ``checkpoint_path``.
"""

from __future__ import annotations

from typing import Any

from ray.tune.integration.ray_train import TuneReportCallback

from raydistill.runtime.engine.train_loop import TUNE_METRIC

__all__ = ["EvalReportsToTune"]


class EvalReportsToTune(TuneReportCallback):
    """Forward rank 0's reports that carry a dev evaluation (``TUNE_METRIC``) to the Ray Tune trial."""

    def after_report(self, run_context, metrics: list[dict[str, Any]], checkpoint) -> None:
        if metrics and TUNE_METRIC in metrics[0]:
            super().after_report(run_context, metrics, checkpoint)
