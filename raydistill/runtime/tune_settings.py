"""A sweep's settings (``SweepSettings``: search budget and algorithm, the scheduler (ASHA or PBT), resources per
trial), checked field by field, and the duration and number parsing they share with space files."""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["ALGORITHMS", "SCHEDULERS", "SweepSettings", "parse_duration", "pbt_mutable", "yaml_number"]

ALGORITHMS = ("auto", "random", "optuna")
# asha: stop the weaker trials at each rung; pbt: the weaker trials continue a stronger one's checkpoint with
# perturbed values (Population Based Training)
SCHEDULERS = ("asha", "pbt")


def pbt_mutable(key: str) -> bool:
    """Whether PBT may change ``key`` in a running trial: a value the checkpoint it continues from does not hold.

    The learning rate is put back into the optimiser and its schedule after a checkpoint loads, and the loss reads
    its temperatures at every step. Any other searched key (the queue size: the checkpoint holds the queue) is drawn
    once per trial and, when a trial continues another trial's checkpoint, taken over from that trial with it.
    """
    return key == "train.lr" or (key.startswith("loss.") and key.rsplit(".", 1)[-1].startswith(("tau", "temperature")))


def parse_duration(value: Any) -> float:
    """Seconds from ``3600``, ``"90m"``, ``"3h"``, ``"1h30m"``, ``"45s"``; raises ValueError otherwise."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        text = str(value).strip().lower()
        match = re.fullmatch(r"(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?", text)
        if not text or not match or not any(match.groups()):
            raise ValueError(f"expected a duration such as 3600, 90m, 3h or 1h30m, got {value!r}")
        hours, minutes, secs = (float(g) if g else 0.0 for g in match.groups())
        seconds = hours * 3600 + minutes * 60 + secs
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"a duration must be > 0, got {value!r}")
    return seconds


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


@dataclass
class SweepSettings:
    """How much to search and with what: defaults < the space file's sections < command-line options."""

    num_samples: int = 12
    time_budget_s: float | None = None
    algorithm: str = "auto"
    seed: int = 0
    max_concurrent_trials: int | None = None
    scheduler: str = "asha"
    grace_evals: int = 2  # ASHA
    reduction_factor: float = 2.0  # ASHA
    perturbation_evals: int = 2  # PBT: dev evaluations between two exploit/explore decisions of a trial
    quantile_fraction: float = 0.25  # PBT: the bottom fraction continues from the top fraction's checkpoints
    # Checkpoints Tune keeps per local-mode trial (one per evaluation). PBT hands a weaker trial a stronger trial's
    # newest one, which must outlive the stronger trial's next keep_checkpoints - 1 evaluations, until it is loaded.
    keep_checkpoints: int = 4
    num_cpus: float = 1.0  # per Train worker of a trial
    num_gpus: float = 0.0  # per Train worker of a trial
    threads: int | None = None
    # Train workers per trial (data parallel; rank 0 reports to Tune); 0: Train's local mode, the trial trains in its
    # own process (no worker group to start: for short trials)
    num_learners: int = 1
    # Times Tune restarts a trial whose process was lost (OOM kill, node loss, preemption) from its newest
    # checkpoint. A trial whose own code raised (a bad combination, a NaN loss) would fail the same way: not retried.
    max_trial_failures: int = 2

    @staticmethod
    def check_field(name: str, value: Any) -> Any:
        """``value`` checked and converted for field ``name``; ValueError says what is expected."""
        if value is None and name in ("time_budget_s", "max_concurrent_trials", "threads"):
            return None
        if name == "time_budget_s":
            return parse_duration(value)
        if name == "algorithm":
            if value not in ALGORITHMS:
                raise ValueError(f"expected one of {', '.join(ALGORITHMS)}, got {value!r}")
            return value
        if name == "scheduler":
            if value not in SCHEDULERS:
                raise ValueError(f"expected one of {', '.join(SCHEDULERS)}, got {value!r}")
            return value
        if name == "quantile_fraction":
            value = yaml_number(value)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 0.5:
                raise ValueError(f"expected a number in (0, 0.5], got {value!r}")
            return float(value)
        if name == "max_trial_failures":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"expected an integer >= 0 (0: a lost trial stays failed), got {value!r}")
            return value
        if name == "num_learners":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"expected an integer >= 0 (0: the trial trains in its own process), got {value!r}")
            return value
        if name in ("num_samples", "max_concurrent_trials", "grace_evals", "perturbation_evals", "keep_checkpoints",
                    "threads"):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"expected an integer >= 1, got {value!r}")
            return value
        if name == "seed":
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"expected an integer, got {value!r}")
            return value
        if name == "reduction_factor":
            value = yaml_number(value)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 1:
                raise ValueError(f"expected a number > 1, got {value!r}")
            return float(value)
        if name in ("num_cpus", "num_gpus"):
            value = yaml_number(value)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (
                    name == "num_cpus" and value == 0):
                raise ValueError(f"expected a number {'> 0' if name == 'num_cpus' else '>= 0'}, got {value!r}")
            return float(value)
        raise ValueError(f"unknown setting {name!r}")

    def updated(self, values: dict[str, Any]) -> "SweepSettings":
        checked = {k: self.check_field(k, v) for k, v in values.items() if v is not None}
        return dataclasses.replace(self, **checked)

    def trial_cpus(self) -> float:
        """CPUs one trial's Train workers hold (local mode: the trial process itself)."""
        return self.num_cpus * max(1, self.num_learners)

    def trial_threads(self) -> int:
        """Torch threads of a trial's learner: ``threads``, else the trial's whole CPUs (at least 1)."""
        return int(self.threads or max(1, math.floor(self.num_cpus)))
