"""One Tune trial (``distill_trial``): ``run_distillation`` of the plan's base config with the sampled values, STS-B
dev reported to Tune at every evaluation, and what the trial knows about itself in ``trial.json`` (``TrialState``).

Each report carries the trial's newest step checkpoint to Tune as a ``tune.Checkpoint`` (``snapshot_run_dir``), so
Tune keeps it in the sweep's storage (``RunConfig.storage_path``: a local path or any pyarrow filesystem URI). A
trial restarted where its run dir is missing (another node, a lost disk) rebuilds the run dir from it
(``restore_run_dir``) and the learner resumes there.

Torch, Ray and the training runtime are imported inside ``distill_trial``: it runs in a Tune worker, not where the
plan is made.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raydistill.runtime.tracking import Tracker
from raydistill.runtime.tune_plan import SweepPlan, write_json

__all__ = ["METRIC", "TrialState", "distill_trial", "plain_value"]

METRIC = "best_stsb_dev"  # what trials report and ASHA ranks them by: the best STS-B dev so far
TRIAL_STATE = "trial.json"
SNAPSHOT_DIR = ".tune-snapshot"  # inside the trial's run dir: hard links need the same filesystem


@dataclass
class TrialState:
    """``<trial dir>/trial.json``: what the trial itself knows (the driver adds Tune's view)."""

    trial_id: str
    params: dict[str, Any] = field(default_factory=dict)
    attempts: int = 0
    status: str = "pending"  # running | finished | stopped | failed
    mlflow_run_id: str | None = None
    best_stsb_dev: float | None = None
    best_step: int | None = None
    last_step: int = 0
    total_steps: int | None = None
    reports: int = 0
    teacher_forward_sentences: int = 0
    teacher_cache_hits: int = 0
    teacher_cache_misses: int = 0
    resumed_from: int | None = None  # the checkpoint step a restarted attempt continued from
    restored_from_tune: int | None = None  # the checkpoint step rebuilt from Tune's storage (run dir was missing)
    error: str | None = None

    @classmethod
    def load(cls, run_dir: Path, trial_id: str) -> "TrialState":
        path = run_dir / TRIAL_STATE
        if path.is_file():
            data = json.loads(path.read_text(encoding="utf-8"))
            names = {f.name for f in dataclasses.fields(cls)}
            return cls(**{k: v for k, v in data.items() if k in names})
        return cls(trial_id=trial_id)

    def save(self, run_dir: Path) -> None:
        write_json(run_dir / TRIAL_STATE, dataclasses.asdict(self))


class _TrialReporter:
    """The ``run_distillation`` progress hook: STS-B dev to Tune at every evaluation, the mean loss in between."""

    def __init__(self, state: TrialState, run_dir: Path, num_stages: int):
        self.state, self.run_dir, self.num_stages = state, run_dir, num_stages
        self.final_step: int | None = None
        self.loss_sum, self.loss_count, self.lr = 0.0, 0, None
        self.stage = 1
        self.pending: dict[str, Any] | None = None
        self.reported = 0
        self.snapshot_step = -1  # the newest checkpoint step already handed to Tune

    def __call__(self, event: str, info: dict[str, Any], step: int) -> None:
        state = self.state
        if event == "stage":
            self.stage = int(info["stage"])
            state.teacher_forward_sentences += int(info.get("teacher_forward_sentences", 0))
            state.teacher_cache_hits += int(info.get("hits", 0))
            state.teacher_cache_misses += int(info.get("misses", 0))
            if self.stage == self.num_stages:
                self.final_step = int(info["step_offset"]) + int(info["total_steps"])
            state.total_steps = self.final_step or state.total_steps
            state.save(self.run_dir)
        elif event == "step":
            if math.isfinite(info.get("loss", math.nan)):
                self.loss_sum += float(info["loss"])
                self.loss_count += 1
            self.lr = info.get("lr", self.lr)
            state.last_step = step
        elif event == "eval":
            best = info.get("best_stsb_dev")
            if best is not None and math.isfinite(best) and (state.best_stsb_dev is None or best > state.best_stsb_dev):
                state.best_stsb_dev, state.best_step = float(best), step
            state.last_step = step
            metrics = self._metrics(info, step)
            state.save(self.run_dir)
            if self.final_step is not None and step >= self.final_step:
                # The last evaluation goes to Tune after run_distillation returns: a stop decision made on it
                # (ASHA, a time budget) must not cut the trial's final checkpoint, plots and artifacts.
                self.pending = metrics
            else:
                self._report(metrics)

    def _metrics(self, info: dict[str, Any], step: int) -> dict[str, Any]:
        metrics = {
            "stsb_dev": float(info["stsb_dev"]),
            METRIC: float(self.state.best_stsb_dev if self.state.best_stsb_dev is not None else info["stsb_dev"]),
            "step": int(step), "stage": self.stage, "total_steps": int(self.final_step or 0),
            "teacher_forward_sentences": self.state.teacher_forward_sentences,
            "teacher_cache_hits": self.state.teacher_cache_hits, "attempt": self.state.attempts,
        }
        if self.loss_count:
            metrics["loss"] = self.loss_sum / self.loss_count
        if self.lr is not None:
            metrics["lr"] = float(self.lr)
        self.loss_sum, self.loss_count = 0.0, 0
        return metrics

    def _report(self, metrics: dict[str, Any]) -> None:
        from ray import tune

        self.state.reports += 1
        self.reported += 1
        self.state.save(self.run_dir)
        staging = self.run_dir / SNAPSHOT_DIR
        try:
            step = snapshot_run_dir(self.run_dir, staging, newer_than=self.snapshot_step)
            checkpoint = tune.Checkpoint.from_directory(str(staging)) if step is not None else None
            # Tune copies the checkpoint into its storage before report returns; it may stop the trial here (ASHA,
            # the time budget): it raises SystemExit in this thread.
            tune.report(metrics, checkpoint=checkpoint)
            if step is not None:
                self.snapshot_step = step
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def finish(self, record: dict[str, Any]) -> None:
        """Report the held-back final evaluation (or, when this attempt evaluated nothing, the run's best)."""
        if self.pending is not None:
            metrics, self.pending = self.pending, None
        elif self.reported == 0:
            training = record.get("training", {})
            best = training.get("best_stsb_dev")
            if best is None:
                return
            metrics = {"stsb_dev": float(best), METRIC: float(best), "step": int(training.get("steps", 0)),
                       "stage": self.stage, "total_steps": int(self.final_step or training.get("steps", 0)),
                       "teacher_forward_sentences": self.state.teacher_forward_sentences,
                       "teacher_cache_hits": self.state.teacher_cache_hits, "attempt": self.state.attempts}
        else:
            return
        self._report(metrics)


def distill_trial(config: dict[str, Any], plan: dict[str, Any]) -> None:
    """The Tune trainable: one ``run_distillation`` of the base config with the sampled ``config`` values."""
    import torch
    from ray import tune

    from raydistill.methods import stage_plan
    from raydistill.runtime import checkpoint as ckpt
    from raydistill.runtime.distill import run_distillation

    sweep = SweepPlan.from_dict(plan)
    trial_id = tune.get_context().get_trial_id()
    params = {key: plain_value(value) for key, value in config.items()}
    run_dir = sweep.trial_dir(trial_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    restored = restore_run_dir(tune.get_checkpoint(), run_dir)  # before trial.json is read: it comes back too
    state = TrialState.load(run_dir, trial_id)
    if restored is not None:
        state.restored_from_tune = restored
        print(f"[tune] trial {trial_id}: run dir rebuilt from Tune's checkpoint (step {restored})", flush=True)
    state.params, state.attempts, state.status, state.error = params, state.attempts + 1, "running", None
    latest = ckpt.latest_checkpoint(run_dir)  # what the learner will continue from (a restarted attempt)
    state.resumed_from = int(ckpt.read_manifest(latest)["step"]) if latest is not None else None
    threads = sweep.sweep_settings.trial_threads()
    torch.set_num_threads(threads)
    tracker = Tracker(sweep.tracking(f"trial-{trial_id}"), parent_run_id=sweep.parent_run_id,
                      run_id=state.mlflow_run_id,
                      tags={"raydistill.sweep": sweep.name, "raydistill.trial_id": trial_id,
                            "raydistill.attempt": state.attempts, "method": sweep.method, "student": sweep.student,
                            "teacher": sweep.teacher or "none"})
    state.mlflow_run_id = tracker.run_id or state.mlflow_run_id
    state.save(run_dir)
    tracker.log_params({f"tune.{key}": value for key, value in params.items()}
                       | {"tune.trial_id": trial_id, "tune.threads": threads})
    try:
        cfg = sweep.trial_config(params, run_dir, trial_id)
        reporter = _TrialReporter(state, run_dir, num_stages=len(stage_plan(cfg)))
        print(f"[tune] trial {trial_id} (attempt {state.attempts}): {params}", flush=True)
        record = run_distillation(cfg, evaluate=False, tracker=tracker, progress=reporter,
                                  command=f"raydistill tune (sweep {sweep.name}, trial {trial_id})")
    except SystemExit:  # Tune stopped this trial inside tune.report (ASHA or the time budget)
        state.status = "stopped"
        state.save(run_dir)
        tracker.set_tags({"raydistill.trial_status": "stopped_early"})
        tracker.end("KILLED")
        raise
    except BaseException as exc:
        state.status, state.error = "failed", f"{type(exc).__name__}: {exc}"[:2000]
        state.save(run_dir)
        tracker.set_tags({"raydistill.trial_status": "failed", "raydistill.error": state.error[:500]})
        tracker.end("FAILED")
        raise
    training = record.get("training", {})
    if training.get("best_stsb_dev") is not None:
        state.best_stsb_dev, state.best_step = float(training["best_stsb_dev"]), training.get("best_step")
    state.status, state.last_step = "finished", int(training.get("steps", state.last_step))
    state.save(run_dir)
    tracker.set_tags({"raydistill.trial_status": "finished"})
    tracker.end("FINISHED")
    reporter.finish(record)


def _checkpoint_roots(run_dir: Path) -> list[Path]:
    """The run dirs under a trial's run dir that hold step checkpoints: the trial's own and each stage's."""
    return [root.parent for root in sorted(run_dir.rglob("checkpoints")) if root.is_dir()
            and SNAPSHOT_DIR not in root.relative_to(run_dir).parts]


def snapshot_run_dir(run_dir: Path, staging: Path, newer_than: int = -1) -> int | None:
    """Fill ``staging`` with what a restarted trial needs of ``run_dir``: every stage's newest verified step
    checkpoint (hard links: a written checkpoint never changes) and copies of every other file (``best/`` models,
    ``trial.json``, configs), except plots and the run-dir lock. Returns the newest checkpoint step, or None (and
    ``staging`` stays empty) when there is no checkpoint newer than ``newer_than``."""
    from raydistill.runtime import checkpoint as ckpt

    roots = _checkpoint_roots(run_dir)
    # Manifests first (cheap): a report with no newer checkpoint hashes nothing.
    listed = [ckpt.latest_checkpoint(root) for root in roots]
    if max((int(ckpt.read_manifest(path)["step"]) for path in listed if path is not None), default=-1) <= newer_than:
        return None
    newest, latest = -1, {}
    for root in roots:
        path, manifest = ckpt.latest_good_checkpoint(root, report=lambda message: None)
        if path is not None:
            latest[root] = path
            newest = max(newest, int(manifest["step"]))
    if newest <= newer_than:
        return None
    shutil.rmtree(staging, ignore_errors=True)
    for directory, subdirs, files in os.walk(run_dir):
        here = Path(directory)
        relative = here.relative_to(run_dir)
        if relative.parts[:1] in ((SNAPSHOT_DIR,), ("plots",)):
            subdirs[:] = []
            continue
        if here.name == "checkpoints" and here.parent in roots:
            subdirs[:] = []
            if here.parent not in latest:
                continue
            target = staging / relative / latest[here.parent].name
            target.mkdir(parents=True)
            for file in latest[here.parent].iterdir():
                os.link(file, target / file.name)
            continue
        for name in files:
            if name != ckpt.LOCK_FILE:
                (staging / relative).mkdir(parents=True, exist_ok=True)
                shutil.copy2(here / name, staging / relative / name)
    return newest


def restore_run_dir(checkpoint, run_dir: Path) -> int | None:
    """Rebuild ``run_dir`` from Tune's ``checkpoint`` when the run dir has no step checkpoint of its own (a trial
    restored on another node); returns the restored step, or None when nothing was restored. A run dir that still
    has checkpoints is left alone: the learner continues from its newest good one."""
    from raydistill.runtime import checkpoint as ckpt

    if checkpoint is None or any(ckpt.list_checkpoints(root) for root in _checkpoint_roots(run_dir)):
        return None
    with checkpoint.as_directory() as directory:
        source = Path(directory)
        steps = [int(ckpt.verify_checkpoint(path)["step"]) for root in _checkpoint_roots(source)
                 for path in ckpt.list_checkpoints(root)]
        if not steps:
            return None
        shutil.copytree(source, run_dir, dirs_exist_ok=True)
    return max(steps)


def plain_value(value: Any) -> Any:
    """A sampled value as plain Python (Tune may hand out numpy scalars), for JSON and MLflow."""
    return value.item() if hasattr(value, "item") else value
