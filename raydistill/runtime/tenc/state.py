"""A Trans-Encoder run directory: where each file lives, and ``state.json``, the record of what is done.

Stages are the unit of resume: a stage is recorded the moment its models are saved, so a restarted job with the same
config skips every completed stage and reuses its files (a label set missing for the next stage is made again). A
stage stopped mid-way (SIGTERM, SIGINT) continues from the engine's checkpoint in its ``training_dir`` (``learners``).

A damaged state.json (not JSON, or not a run state) is moved aside and rebuilt from the ``stage.json`` (summary,
config hash, pair fingerprint) in each finished stage's model directory; what it lacks is made again when needed.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raydistill.fileio import atomic_write_json
from raydistill.config.job import ConfigError
from raydistill.runtime.tenc.config import STAGE_TRAINS, STAGES, TencConfig, stage_key

__all__ = ["STAGE_RECORD", "RunLayout", "RunState", "json_default", "now"]

# Inside each stage's model directory: the stage's summary, which lets a damaged state.json be rebuilt from the disk.
STAGE_RECORD = "stage.json"


@dataclass(frozen=True)
class RunLayout:
    """The files of a run directory (``tenc/__init__.py`` lists them with what each holds)."""

    root: Path

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def summary_file(self) -> Path:
        return self.root / "summary.json"

    @property
    def plots_dir(self) -> Path:
        return self.root / "plots"

    def labels_dir(self, cycle: int, stage: str) -> Path:
        # Hive-style names: ray.data.read_parquet(<run_dir>/labels) reads every stage with cycle and stage columns.
        return self.root / "labels" / f"cycle={cycle}" / f"stage={stage}"

    def model_dir(self, cycle: int, kind: str, family: str) -> Path:
        return self.root / "models" / f"cycle={cycle}" / kind / family

    def training_dir(self, cycle: int, kind: str, family: str) -> Path:
        # The stage's engine run dir (checkpoints/, best/): outside models/, whose directories are swapped in whole.
        return self.root / "training" / f"cycle={cycle}" / kind / family

    def best_dir(self, family: str, kind: str) -> Path:
        return self.root / "best" / family / kind

    def teacher_labels_file(self) -> Path:
        # Outside labels/, which Ray Data reads whole as the stages' label sets.
        return self.root / "teacher" / "pair-labels.npy"

    def eval_file(self, cycle: int, kind: str, family: str) -> Path:
        return self.root / "eval" / f"cycle={cycle}" / kind / f"{family}.npz"

    def pair_scores_file(self, cycle: int, kind: str, family: str) -> Path:
        return self.root / "eval" / f"cycle={cycle}" / kind / f"{family}-pairs.npy"


class RunState:
    """``<run_dir>/state.json``: what is done. Written atomically after every stage, label set and evaluation.

    ``invocations`` records each time a job worked on the run (started, cycles asked for, wall seconds up to its
    last save), so a run extended by a later job (``--cycles 3`` after 2) still knows what the whole of it cost.
    """

    def __init__(self, path: Path, data: dict[str, Any]):
        self.path = path
        self.data = data
        self.started: float | None = None  # time.perf_counter() when this invocation began; None = not counted

    @classmethod
    def open(cls, run_dir: Path, cfg: TencConfig, pair_fingerprint: str, pair_count: int,
             started: float | None = None) -> RunState:
        """Open (or create) the run's state; ``started`` (``time.perf_counter()`` at job start) counts this
        invocation's wall time into ``invocations``."""
        state = cls._open(run_dir, cfg, pair_fingerprint, pair_count)
        if started is not None:
            state.started = started
            invocations = state.data.setdefault("invocations", _earlier_invocations(RunLayout(run_dir)))
            invocations.append({"started": now(), "cycles": cfg.cycles, "wall_s": 0.0})
            state.save()
        return state

    @property
    def wall_s_total(self) -> float:
        """Wall seconds of every invocation of the run so far (this one up to now)."""
        self._count_invocation()
        return round(sum(float(i.get("wall_s", 0.0)) for i in self.data.get("invocations", [])), 1)

    def _count_invocation(self) -> None:
        if self.started is not None and self.data.get("invocations"):
            self.data["invocations"][-1]["wall_s"] = round(time.perf_counter() - self.started, 1)

    @classmethod
    def _open(cls, run_dir: Path, cfg: TencConfig, pair_fingerprint: str, pair_count: int) -> RunState:
        path = RunLayout(run_dir).state_file
        if path.is_file():
            data, damage = _read_state(path)
            if damage is not None:
                return cls._rebuilt(run_dir, cfg, pair_fingerprint, pair_count, damage)
            if data.get("config_hash") != cfg.config_hash():
                differing = cfg.diff_keys(data.get("config", {}))
                raise ConfigError(
                    f"{path}: this run directory was written by another config (hash {data.get('config_hash')} vs "
                    f"{cfg.config_hash()}; differing: {', '.join(differing) or '?'}). Resuming would mix two "
                    "trainings: use another --run-dir, or delete this one to start over")
            if data.get("pairs", {}).get("fingerprint") != pair_fingerprint:
                raise ConfigError(f"{path}: the unlabeled pair set changed since this run started (fingerprint "
                                  f"{data.get('pairs', {}).get('fingerprint')} vs {pair_fingerprint}); the data "
                                  "files differ. Use another --run-dir")
            data["config"] = cfg.to_dict()  # the excluded fields (cycles, eval, resources) may have changed
            return cls(path, data)
        state = cls(path, _new_state(cfg, pair_fingerprint, pair_count))
        state.save()
        return state

    @classmethod
    def _rebuilt(cls, run_dir: Path, cfg: TencConfig, pair_fingerprint: str, pair_count: int,
                 damage: str) -> RunState:
        """A new state holding every stage of this config and pair set finished on disk (see the module docstring);
        the damaged file is kept aside for inspection."""
        layout = RunLayout(run_dir)
        aside = layout.state_file.with_name(f"{layout.state_file.name}.damaged-{int(time.time())}")
        os.replace(layout.state_file, aside)
        data = _new_state(cfg, pair_fingerprint, pair_count)
        data["stages"] = _finished_stages_on_disk(layout, cfg, pair_fingerprint)
        data["rebuilt"] = {"from": "the stage.json of each stage's model directories", "damaged_file": str(aside),
                           "damage": damage, "at": now()}
        state = cls(layout.state_file, data)
        state.save()
        done = list(data["stages"])
        print(f"[tenc] {layout.state_file} was damaged ({damage}); moved it to {aside} and rebuilt it from the "
              f"finished stages saved under {layout.root / 'models'}: {len(done)} finished stage(s) kept"
              + (f" ({', '.join(done)})" if done else "") + "; label sets and evaluations it lacks are made again",
              flush=True)
        return state

    def save(self) -> None:
        self._count_invocation()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.path, self.data, default=json_default)

    @property
    def labels(self) -> dict[str, Any]:
        return self.data["labels"]

    @property
    def stages(self) -> dict[str, Any]:
        return self.data["stages"]

    @property
    def evaluations(self) -> dict[str, Any]:
        return self.data["evaluations"]

    def dev_curves(self, families: list[str], cycles: int) -> dict[tuple[str, str], list[tuple[int, float]]]:
        """(family, bi|cross) -> [(cycle, dev score)] so far: the starting bi-encoder at cycle 0, then the best-dev
        model of each completed stage (a cross-encoder first exists at cycle 1)."""
        curves: dict[tuple[str, str], list[tuple[int, float]]] = {}
        start_dev = self.data.get("start_dev", {})
        for f in families:
            if f in start_dev:
                curves[(f, "bi")] = [(0, float(start_dev[f]))]
        for cycle in range(1, cycles + 1):
            for stage in STAGES:
                completed = self.stages.get(stage_key(cycle, stage))
                if completed is None:
                    continue
                for f in families:
                    curves.setdefault((f, STAGE_TRAINS[stage]), []).append(
                        (cycle, float(completed["families"][f]["best_dev"])))
        return curves


def _new_state(cfg: TencConfig, pair_fingerprint: str, pair_count: int) -> dict[str, Any]:
    return {"version": 1, "config_hash": cfg.config_hash(), "config": cfg.to_dict(),
            "pairs": {"fingerprint": pair_fingerprint, "count": pair_count},
            "labels": {}, "stages": {}, "evaluations": {}, "created": now()}


def _read_state(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """``(state, None)``, or ``(None, what is wrong)`` for a file that is not a run state."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        where = f"line {exc.lineno}: " if isinstance(exc, json.JSONDecodeError) else ""
        return None, f"not valid JSON: {where}{getattr(exc, 'msg', exc)}"
    missing = [key for key in ("config_hash", "pairs", "labels", "stages", "evaluations")
               if not isinstance(data, dict) or key not in data]
    if missing:
        return None, f"not a run state: no {', '.join(missing)}"
    return data, None


def _finished_stages_on_disk(layout: RunLayout, cfg: TencConfig, pair_fingerprint: str) -> dict[str, Any]:
    """Every stage, in run order, whose model directories all hold a ``stage.json`` of this config and pair set;
    up to the first stage that is not finished (a later one would have learned from labels nobody can vouch for)."""
    stages: dict[str, Any] = {}
    cycle = 1
    while (layout.root / "models" / f"cycle={cycle}").is_dir():
        for stage in STAGES:
            records = {}
            for family in cfg.families:
                record_file = layout.model_dir(cycle, STAGE_TRAINS[stage], family.name) / STAGE_RECORD
                try:
                    record = json.loads(record_file.read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    return stages
                if (record.get("config_hash"), record.get("pairs_fingerprint"), record.get("cycle"),
                        record.get("stage")) != (cfg.config_hash(), pair_fingerprint, cycle, stage):
                    return stages
                records[family.name] = record
            stages[stage_key(cycle, stage)] = {
                "completed": max(r.get("completed", "") for r in records.values()),
                "wall_s": max(float(r.get("wall_s", 0.0)) for r in records.values()),
                "families": records, "rebuilt": True}
        cycle += 1
    return stages


def _earlier_invocations(layout: RunLayout) -> list[dict[str, Any]]:
    """A state written before invocations were recorded: its finished job's wall time is in its summary.json."""
    try:
        summary = json.loads(layout.summary_file.read_text(encoding="utf-8")) if layout.summary_file.is_file() else {}
    except json.JSONDecodeError:
        return []
    if "wall_s" not in summary:
        return []
    return [{"finished": summary.get("date"), "cycles": summary.get("cycles"), "wall_s": float(summary["wall_s"]),
             "recorded_from": "summary.json"}]


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def json_default(value: Any):
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
