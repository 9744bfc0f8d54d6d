"""One Tune trial (``distill_trial``): ``run_distillation`` of the plan's base config with the sampled values, on Ray
Train workers, and what the trial knows about itself in ``trial.json`` (``TrialState``).

Metrics reach Tune through the reporter the trial hands the training loop for each stage (``reporting.TrialReports``
says how, with Train workers and in local mode); the trial's very last evaluation is reported here instead, after the
job has written its model and record, so a stop decision made on it cannot cut them.

Checkpoints: the trial's Train runs persist theirs in the sweep's Tune storage (``SweepPlan.train_storage``), and a
trial that Tune restarts resumes each from its newest checkpoint there; in local mode Tune hands the restarted trial
the checkpoint it reported. Under PBT that checkpoint may be another trial's: the trial then continues that trial's
run with its own perturbed values (``_take_over_donor_run``). Torch, Ray and the training runtime are imported inside
``distill_trial``: it runs in a Tune worker, not where the plan is made.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raydistill.config.sweep import METRIC
from raydistill.runtime.engine.tracking import Tracker
from raydistill.runtime.tune.plan import SweepPlan, write_json

__all__ = ["METRIC", "TrialNotRetried", "TrialState", "distill_trial", "lost_a_process", "plain_value"]

TRIAL_STATE = "trial.json"


class TrialNotRetried(RuntimeError):
    """A retry of a trial whose earlier attempt failed with its own error, refused before it trains."""


def lost_a_process(exc: BaseException) -> bool:
    """Whether ``exc`` comes from a Ray process the trial needed that died (a Train worker killed by the OOM killer,
    a lost node, a preempted instance), as opposed to an error of the training itself (a bad combination, a NaN
    loss). Ray wraps the first in task, actor and Train errors: the whole chain of causes is searched."""
    import ray.exceptions as rex

    lost = (rex.RayActorError, rex.WorkerCrashedError, rex.NodeDiedError, rex.OutOfMemoryError, rex.ObjectLostError)
    pending, seen = [exc], set()
    while pending:
        error = pending.pop()
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        if isinstance(error, lost):
            return True
        causes = [error.__cause__, error.__context__, getattr(error, "cause", None)]
        failures = getattr(error, "worker_failures", None) or ()  # Ray Train's worker group error: rank -> error
        causes += list(failures.values() if isinstance(failures, dict) else failures)
        pending.extend(c for c in causes if isinstance(c, BaseException))
    return False


@dataclass
class TrialState:
    """``<trial dir>/trial.json``: what the trial itself knows (the driver adds Tune's view)."""

    trial_id: str
    params: dict[str, Any] = field(default_factory=dict)
    attempts: int = 0
    # running | finished | stopped | failed (its own error: not run again) | lost (a process it needed died: retried)
    # | interrupted (KeyboardInterrupt and the like: runs again on --resume)
    # "running" in a trial Tune reports failed: the trial's own process died (SIGKILL, OOM) before it could say so
    status: str = "pending"
    mlflow_run_id: str | None = None
    best_stsb_dev: float | None = None
    best_step: int | None = None
    last_step: int = 0
    total_steps: int | None = None
    reports: int = 0
    teacher_forward_sentences: int = 0
    teacher_cache_hits: int = 0
    teacher_cache_misses: int = 0
    resumed_from: int | None = None  # the checkpoint step (over all stages) a restarted attempt continued from
    # PBT: each time this trial went on from another trial's checkpoint: {attempt, from_trial, step, params}
    continued: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    pid: int | None = None  # the process of the newest attempt (what an operator, or a fault test, would kill)

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
    """The ``run_distillation`` progress hook of a trial: keeps ``trial.json`` up to date. The evaluations reach Tune
    from the training loop; ``finish`` reports the last one."""

    def __init__(self, state: TrialState, run_dir: Path, num_stages: int):
        self.state, self.run_dir, self.num_stages = state, run_dir, num_stages
        self.final_step: int | None = None
        self.stage = 1
        self.last_dev: float | None = None
        self.started = False

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
        elif event == "start":
            if info.get("resumed_from") is not None and not self.started and step > 0:
                state.resumed_from = int(step)  # steps over all stages, as Tune sees them
            self.started = True
            state.save(self.run_dir)
        elif event == "step":
            state.last_step = step
        elif event == "eval":
            best = info.get("best_stsb_dev")
            if best is not None and math.isfinite(best) and (state.best_stsb_dev is None or best > state.best_stsb_dev):
                state.best_stsb_dev, state.best_step = float(best), step
            self.last_dev = float(info["stsb_dev"])
            state.last_step = step
            state.reports += 1  # dev evaluations of the trial (each goes to Tune, the last one from ``finish``)
            state.save(self.run_dir)

    def finish(self, record: dict[str, Any]) -> None:
        """Report the trial's final evaluation (its best over the whole run) to Tune."""
        from ray import tune

        best = record.get("training", {}).get("best_stsb_dev", self.state.best_stsb_dev)
        if best is None:
            return
        step = int(self.state.last_step)  # steps over all stages, as the workers reported them
        tune.report({"stsb_dev": float(self.last_dev if self.last_dev is not None else best), METRIC: float(best),
                     "step": step, "stage": self.stage,
                     "total_steps": int(self.final_step or step),
                     "teacher_forward_sentences": self.state.teacher_forward_sentences,
                     "teacher_cache_hits": self.state.teacher_cache_hits, "attempt": self.state.attempts})


def distill_trial(config: dict[str, Any], plan: dict[str, Any]) -> None:
    """The Tune trainable: one ``run_distillation`` of the base config with the sampled ``config`` values."""
    import torch
    from ray import tune

    from raydistill.methods import stage_plan
    from raydistill.runtime.jobs.distill import run_distillation

    sweep = SweepPlan.from_dict(plan)
    trial_id = tune.get_context().get_trial_id()
    params = {key: plain_value(value) for key, value in config.items()}
    run_dir = sweep.trial_dir(trial_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    state = TrialState.load(run_dir, trial_id)
    if state.status == "failed":
        # Tune retries every failure (FailureConfig.max_failures) and --resume resumes errored trials; an error the
        # trial's own code raised would come back the same way, so only a lost process is worth another attempt.
        raise TrialNotRetried(f"trial {trial_id} is not run again: its attempt {state.attempts} failed with its own "
                              f"error ({state.error}); only a trial whose process was lost is retried")
    state.params, state.attempts, state.status, state.error = params, state.attempts + 1, "running", None
    state.pid = os.getpid()
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
        continued = _take_over_donor_run(tune.get_checkpoint(), state, cfg, sweep)
        if continued is not None or state.attempts == 1:
            # The values over the trial's steps (PBT changes them): a metric per searched number, from where it applies.
            tracker.log_metrics({f"tune.{key}": value for key, value in params.items()},
                                step=continued["step"] if continued else 0)
        if continued is not None:
            tracker.set_tags({"raydistill.continued_from": continued["from_trial"]})
        reporter = _TrialReporter(state, run_dir, num_stages=len(stage_plan(cfg)))
        print(f"[tune] trial {trial_id} (attempt {state.attempts}): {params}", flush=True)
        from raydistill.runtime.tune.reporting import TrialReports

        record = run_distillation(cfg, evaluate=False, tracker=tracker, progress=reporter,
                                  stage_reporter=TrialReports.for_stage,
                                  command=f"raydistill tune (sweep {sweep.name}, trial {trial_id})")
    except SystemExit:  # Tune stopped this trial (ASHA or the time budget)
        state.status = "stopped"
        state.save(run_dir)
        tracker.set_tags({"raydistill.trial_status": "stopped_early"})
        tracker.end("KILLED")
        raise
    except BaseException as exc:
        # failed: an error of the training itself, which a retry would repeat (distill_trial refuses it)
        state.status = ("lost" if lost_a_process(exc) else "failed" if isinstance(exc, Exception) else "interrupted")
        state.error = f"{type(exc).__name__}: {exc}"[:2000]
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


def _take_over_donor_run(checkpoint, state: TrialState, cfg, sweep: SweepPlan) -> dict[str, Any] | None:
    """PBT restarts a weaker trial from a stronger trial's checkpoint (the donor's) with perturbed values. The trial
    then continues the donor's run: its own checkpoints belong to the run it leaves, so they go, and the donor's
    best model so far becomes its own (the learner keeps it unless an evaluation beats it). Returns the entry added
    to ``state.continued``, or None when the checkpoint is the trial's own (or there is none)."""
    import shutil

    from raydistill.runtime.engine import checkpoint as ckpt

    if checkpoint is None:
        return None
    try:
        with checkpoint.as_directory() as directory:
            manifest = ckpt.verify_checkpoint(directory)
    except (FileNotFoundError, ckpt.CheckpointError) as exc:
        raise ckpt.CheckpointError(
            f"the checkpoint Tune restarted trial {state.trial_id} from is gone or incomplete ({exc}); under PBT it "
            "is another trial's, deleted once that trial wrote resources_per_trial.keep_checkpoints newer ones "
            "before this trial could load it: keep more") from exc
    donor = (manifest.get("extra") or {}).get("trial_id")
    if donor in (None, state.trial_id):
        return None
    from raydistill.fileio import UnsafeNameError, child_path

    try:  # the manifest is a file on disk: its trial id becomes a path only once it is a plain name
        donor_dir = child_path(Path(sweep.sweep_dir) / "trials", donor)
    except UnsafeNameError as exc:
        raise ckpt.CheckpointError(f"the checkpoint Tune restarted trial {state.trial_id} from names its trial "
                                   f"{donor!r} in manifest.json (extra.trial_id): {exc}") from None
    run_dir = cfg.resolved_run_dir()
    shutil.rmtree(ckpt.checkpoint_root(run_dir), ignore_errors=True)
    best = _adopt_best_model(donor_dir / "best", run_dir, cfg.config_hash())
    entry = {"attempt": state.attempts, "from_trial": donor, "step": int(manifest["step"]),
             "params": dict(state.params)}
    state.continued.append(entry)
    state.best_stsb_dev, state.best_step = (best["stsb_dev"], best["step"]) if best else (None, None)
    print(f"[tune] trial {state.trial_id} continues trial {donor}'s run from its step {manifest['step']} with "
          f"{state.params}", flush=True)
    return entry


def _adopt_best_model(donor_best: Path, run_dir: Path, config_hash: str) -> dict[str, Any] | None:
    """Copy the donor trial's best model into ``run_dir/best``, marked as this trial's (its ``config_hash``), so the
    learner counts it as the best so far; returns its info, or None when the donor has none yet. The donor may swap
    in a newer best while it is copied: then the copy is taken again."""
    import shutil

    from raydistill.fileio import atomic_write_json, replace_directory
    from raydistill.runtime.engine.learner_state import BEST_INFO

    target, staging = run_dir / "best", run_dir / ".best.adopted"
    for _ in range(3):
        shutil.rmtree(staging, ignore_errors=True)
        try:
            shutil.copytree(donor_best, staging)
            info = json.loads((staging / BEST_INFO).read_text(encoding="utf-8"))
            break
        except FileNotFoundError:
            continue
    else:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(target, ignore_errors=True)
        return None
    info["config_hash"] = config_hash
    atomic_write_json(staging / BEST_INFO, info)
    replace_directory(staging, target)
    return info


def plain_value(value: Any) -> Any:
    """A sampled value as plain Python (Tune may hand out numpy scalars), for JSON and MLflow."""
    return value.item() if hasattr(value, "item") else value
