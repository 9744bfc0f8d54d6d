"""A sweep's settings (``SweepSettings``: search budget and algorithm, the scheduler (ASHA or PBT), resources per
trial), a schema of ``raydistill.config.schema`` checked field by field, and the duration and number parsing they
share with space files."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field

from raydistill.config.schema import ConfigError, Float, Int, build, section, suggest
from raydistill.durations import parse_duration  # re-exported: the sweep's time_budget_s reads it

__all__ = ["ALGORITHMS", "METRIC", "SCHEDULERS", "SweepSettings", "parse_duration", "pbt_mutable", "yaml_number"]

ALGORITHMS = ("auto", "random", "optuna")
# What trials report and ASHA, PBT and the searchers rank them by: the trial's best STS-B dev so far.
METRIC = "best_stsb_dev"
SCHEDULERS = ("asha", "pbt")


def pbt_mutable(key: str) -> bool:
    """Whether PBT may change ``key`` in a running trial: a value the checkpoint it continues from does not hold
    (the learning rate is put back after a checkpoint loads, the loss reads its temperatures every step). Any other
    searched key (the queue size: the checkpoint holds the queue) is drawn once per trial and taken over with a
    checkpoint another trial continues."""
    return key == "train.lr" or (key.startswith("loss.") and key.rsplit(".", 1)[-1].startswith(("tau", "temperature")))


def yaml_number(value: Any) -> Any:
    """A numeric string as its number, anything else unchanged: YAML 1.1 reads 1e-4 (no dot) as a string, and a space
    file means the number."""
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return value
        return int(number) if number.is_integer() and re.fullmatch(r"[+-]?\d+", value.strip()) else number
    return value


def _duration(value: Any) -> Any:
    return None if value is None else parse_duration(value)


def _is_quantile(value: float) -> float:
    if not 0 < value <= 0.5:
        raise ValueError(f"expected a number in (0, 0.5], got {value!r}")
    return value


@section
class SweepSettings:
    """How much to search and with what: defaults < the space file's sections < command-line options. A pydantic
    dataclass of ``raydistill.config.schema``, like the job config: each field's type, range and meaning."""

    num_samples: Int = Field(12, ge=1, description="trials to run (each grid point counts once per sample)")
    time_budget_s: Annotated[Float | None, BeforeValidator(_duration)] = Field(
        None, description="stop starting trials after this long: 3600, 90m, 3h, 1h30m (null: no limit)")
    algorithm: Literal["auto", "random", "optuna"] = Field(
        "auto", description="auto (Optuna's TPE when installed and nothing is a grid, else random), random or optuna")
    seed: Int = Field(0, description="seed of the search algorithm")
    max_concurrent_trials: Int | None = Field(None, ge=1, description="trials at once (null: what the cluster's "
                                                                      "CPUs fit)")
    scheduler: Literal["asha", "pbt"] = Field(
        "asha", description="asha: stop the weaker trials at each rung; pbt: the weaker trials continue a stronger "
                            "one's checkpoint with perturbed values (Population Based Training)")
    grace_evals: Int = Field(2, ge=1, description="ASHA: dev evaluations before a trial may be stopped")
    reduction_factor: Float = Field(2.0, gt=1, description="ASHA: 1 / the share of trials kept at each rung")
    perturbation_evals: Int = Field(2, ge=1, description="PBT: dev evaluations between two exploit/explore "
                                                         "decisions of a trial")
    synchronous: bool = Field(False, description="PBT: a trial that reaches a decision point waits (paused) until "
                                                 "every running trial has reached it, so the population is compared "
                                                 "at one step whatever the trials' speeds (Tune's synch); off, each "
                                                 "trial decides against what the others last reported")
    quantile_fraction: Annotated[Float, AfterValidator(_is_quantile)] = Field(
        0.25, description="PBT: the bottom fraction continues from the top fraction's checkpoints, in (0, 0.5]")
    # PBT hands a weaker trial a stronger trial's newest checkpoint, which must outlive the stronger trial's next
    # keep_checkpoints - 1 evaluations, until it is loaded.
    keep_checkpoints: Int = Field(4, ge=1, description="checkpoints Tune keeps per local-mode trial (one per "
                                                       "evaluation)")
    num_cpus: Float = Field(1.0, gt=0, description="CPUs per Train worker of a trial")
    num_gpus: Float = Field(0.0, ge=0, description="GPUs per Train worker of a trial")
    threads: Int | None = Field(None, ge=1, description="torch threads of a trial's learner (null: the trial's "
                                                        "whole CPUs)")
    num_learners: Int = Field(1, ge=0, description="Train workers per trial (data parallel; rank 0 reports to Tune); "
                                                   "0: Train's local mode, the trial trains in its own process")
    # A trial whose own code raised (a bad combination, a NaN loss) would fail the same way: not retried.
    max_trial_failures: Int = Field(2, ge=0, description="times Tune restarts a trial whose process was lost (OOM "
                                                         "kill, node loss, preemption) from its newest checkpoint")

    @staticmethod
    def check_field(name: str, value: Any) -> Any:
        """``value`` checked and converted for field ``name``; ValueError says what is expected."""
        if name not in SweepSettings.__pydantic_fields__:
            raise ValueError(f"unknown setting {name!r}{suggest(name, SweepSettings.__pydantic_fields__)}")
        try:
            return getattr(build(SweepSettings, {name: value}), name)
        except ConfigError as exc:
            raise ValueError(str(exc).split(": ", 1)[1] if str(exc).startswith("field ") else str(exc)) from None

    def updated(self, values: dict[str, Any]) -> "SweepSettings":
        checked = {k: self.check_field(k, v) for k, v in values.items() if v is not None}
        return dataclasses.replace(self, **checked)

    def trial_cpus(self) -> float:
        """CPUs one trial's Train workers hold (local mode: the trial process itself)."""
        return self.num_cpus * max(1, self.num_learners)

    def trial_threads(self) -> int:
        """Torch threads of a trial's learner: ``threads``, else the trial's whole CPUs (at least 1)."""
        return int(self.threads or max(1, math.floor(self.num_cpus)))
