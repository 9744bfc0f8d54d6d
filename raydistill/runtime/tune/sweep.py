"""Running a sweep (``run_sweep``, ``resume_sweep``): how many trials fit the cluster, the teacher pass shared by
every trial, the Tuner (ASHA or PBT on STS-B dev, seeded random search or Optuna), then the report.

Ray, and the modules that import torch, are imported inside the functions that use them.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any

from raydistill.runtime.engine.cluster import init_ray
from raydistill.runtime.engine.tracking import Tracker
from raydistill.runtime.tune.plan import SweepPlan, write_json
from raydistill.runtime.tune.report import (
    evaluate_best_and_default,
    export_best,
    finish_trial_runs,
    log_summary,
    prune_checkpoints,
    summarize,
)
from raydistill.config.sweep import SweepSettings
from raydistill.runtime.tune.space import SpaceError
from raydistill.runtime.tune.trial import METRIC, TrialState, distill_trial

__all__ = ["SweepLock", "SweepLockedError", "run_sweep", "resume_sweep", "trial_concurrency", "trial_data_cpus",
           "trial_dirname"]

SWEEP_LOCK = ".sweep.lock"


class SweepLockedError(SpaceError):
    """Another driver runs this sweep (a sweep or a ``--resume`` on the same sweep directory)."""


class SweepLock:
    """One driver per sweep directory: an exclusive ``flock`` on ``<sweep_dir>/.sweep.lock``, which names its holder.
    The kernel drops it when its process dies (a killed driver's lock is free for ``--resume``). Opened without
    following a symlink, never removed: removing it would let a third driver lock a new file while a second holds
    the old one."""

    def __init__(self, sweep_dir: str | os.PathLike):
        self.path = Path(sweep_dir) / SWEEP_LOCK
        self._fd: int | None = None

    def __enter__(self) -> "SweepLock":
        import fcntl
        import socket
        import sys

        from raydistill.fileio import open_lock_file

        try:
            fd = open_lock_file(self.path)
        except OSError as exc:
            raise SpaceError(f"{self.path}: cannot open the sweep's lock file ({exc}); it must be a plain file "
                             "(not a symlink) that this user can write: remove it and run the command again") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "an unnamed process"
            os.close(fd)
            raise SweepLockedError(f"{self.path.parent} is in use by another sweep driver ({holder}); wait for it to "
                                   "end or stop it, then run raydistill tune --resume again") from None
        holder = (f"host {socket.gethostname()}, pid {os.getpid()}, since {time.strftime('%Y-%m-%dT%H:%M:%S%z')}: "
                  f"{' '.join(sys.argv)[:300]}")
        os.ftruncate(fd, 0)
        os.pwrite(fd, holder.encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)  # released: nobody to name
            os.close(self._fd)  # closing drops the flock
            self._fd = None


def run_sweep(plan: SweepPlan, *, resume: bool = False, callbacks: list | None = None,
              verbose: int = 1) -> dict[str, Any]:
    """Run (or, with ``resume``, continue) ``plan``'s sweep; return the summary (also ``<sweep_dir>/summary.json``).
    ``callbacks``: extra ``ray.tune.Callback`` objects for the Tuner (saved with it, back on resume)."""
    started = time.time()
    sweep_dir = Path(plan.sweep_dir)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    with SweepLock(sweep_dir):
        return _run_locked(plan, resume=resume, callbacks=callbacks, verbose=verbose, started=started)


def _reopen_interrupted_trials(plan: SweepPlan) -> None:
    """Trials the last run's summary marks interrupted continue, even where the trial recorded an error of its own:
    Tune tore its process and workers down under it, and what that teardown raised is not the training's fault. Left
    as "failed", the trial would be refused on ``--resume`` as a trial whose own code fails."""
    summary_path = Path(plan.sweep_dir) / "summary.json"
    if not summary_path.is_file():
        return  # a driver killed outright writes no summary; its trials never recorded an error either
    for row in json.loads(summary_path.read_text(encoding="utf-8")).get("trials", []):
        run_dir = plan.trial_dir(row["trial_id"])
        state = TrialState.load(run_dir, row["trial_id"])
        if row["status"] == "interrupted" and state.status == "failed":
            print(f"[tune] trial {row['trial_id']} was interrupted; the error it raised while stopped "
                  f"({state.error}) is not its own: it continues", flush=True)
            state.status, state.error = "interrupted", None
            state.save(run_dir)


def _run_locked(plan: SweepPlan, *, resume: bool, callbacks: list | None, verbose: int,
                started: float) -> dict[str, Any]:
    import ray
    from ray import tune

    sweep_dir = Path(plan.sweep_dir)
    if not resume and (sweep_dir / "sweep.json").is_file():
        raise SpaceError(f"a sweep already exists in {sweep_dir}; continue it with --resume, or choose another "
                         "--sweep-dir")
    if resume and not tune.Tuner.can_restore(str(plan.tune_dir)):
        raise SpaceError(f"{plan.tune_dir}: no Ray Tune state to resume (the sweep never started its trials); "
                         f"remove {sweep_dir} and start again")
    if resume:
        _reopen_interrupted_trials(plan)
    base = plan.base()
    init_ray(base, dashboard=True)  # Train's cleanup of a stopped trial's workers reads the state API
    data_cpus = trial_data_cpus(plan)
    concurrency = trial_concurrency(plan.sweep_settings, float(ray.cluster_resources().get("CPU", 0)),
                                    data_cpus=data_cpus)

    parent = Tracker(plan.tracking(plan.name), run_id=plan.parent_run_id if resume else None,
                     tags={"raydistill.sweep": plan.name, "raydistill.kind": "tune", "method": plan.method,
                           "student": plan.student, "teacher": plan.teacher or "none"})
    if parent.run_id:
        plan.parent_run_id = parent.run_id
    plan.save()
    if not resume:
        settings = plan.sweep_settings
        # the parent run lists PBT's mutable keys in the space's order
        scheduler = {f"scheduler.{key}": ",".join(plan.pbt_mutations()) if key == "mutations" else value
                     for key, value in plan.scheduler_settings().items()}
        parent.log_params({"student": plan.student, "method": plan.method, "teacher": plan.teacher or "none",
                           "search.algorithm": plan.algorithm, "search.num_samples": settings.num_samples,
                           "search.seed": settings.seed, "search.time_budget_s": settings.time_budget_s,
                           "scheduler": settings.scheduler.upper(), "scheduler.metric": METRIC, **scheduler,
                           "resources_per_trial.num_cpus": settings.num_cpus,
                           "resources_per_trial.num_gpus": settings.num_gpus,
                           "resources_per_trial.threads": settings.trial_threads(),
                           "resources_per_trial.num_learners": settings.num_learners,
                           "resources_per_trial.max_failures": settings.max_trial_failures,
                           "space_file": plan.space_file, "config_hash": base.config_hash(),
                           "start_from": json.dumps(plan.start_from)}
                          | {f"space.{key}": param.describe() for key, param in plan.param_objects().items()})
    print(f"[tune] sweep {plan.name}: {plan.sweep_dir}; search {plan.algorithm}, "
          f"{plan.sweep_settings.num_samples} samples" + (f"; MLflow {parent.tracking_uri} run {parent.run_id}"
                                                          if parent.run_id else ""), flush=True)
    try:
        teacher_pass, max_t = _shared_teacher_pass(plan, parent)
        print(f"[tune] up to {concurrency} trial(s) at once ({plan.sweep_settings.num_cpus:g} CPU and "
              f"{plan.sweep_settings.trial_threads()} thread(s) each; {data_cpus:g} CPU left to Ray Data)", flush=True)
        tuner = _tuner(plan, max_t, resume=resume, callbacks=callbacks, verbose=verbose, concurrency=concurrency)
        tuner.fit()
        summary = summarize(plan, teacher_pass, started)
        prune_checkpoints(plan, summary)
        finish_trial_runs(plan, summary)
        export_best(plan, summary)
        evaluate_best_and_default(plan, summary)
        summary["wall_s"] = round(time.time() - started, 1)
        summary["concurrent_trials"] = concurrency
        write_json(sweep_dir / "summary.json", summary)
        log_summary(parent, plan, summary)
    except BaseException:
        parent.end("FAILED")
        raise
    parent.end("KILLED" if summary["ended_by"] == "interrupted" else "FINISHED")
    return summary


def resume_sweep(sweep_dir: str | os.PathLike, **kwargs) -> dict[str, Any]:
    """Continue the sweep saved in ``sweep_dir`` (``run_sweep(SweepPlan.load(sweep_dir), resume=True)``)."""
    return run_sweep(SweepPlan.load(sweep_dir), resume=True, **kwargs)


# Sampled keys that change which sentences the teacher must encode: a trial with one of them can miss the shared
# teacher pass's cache and then runs its own teacher pass through Ray Data.
_TEACHER_TEXT_KEYS = ("data.", "teacher", "seed", "cache_dir")


def trial_data_cpus(plan: SweepPlan) -> float:
    """CPUs left free for Ray Data tasks trials start outside their placement group: 0 when no sampled parameter
    changes the teacher's sentences (trials read the shared pass's cache), else 1 for a trial's own teacher pass,
    whose tasks would wait forever with every CPU held by trials (docs/runtime.md)."""
    return 1.0 if any(key.startswith(_TEACHER_TEXT_KEYS) for key in plan.params) else 0.0


def trial_concurrency(settings: SweepSettings, cluster_cpus: float, data_cpus: float = 1.0) -> int:
    """How many trials may run at once: their CPUs plus ``data_cpus`` left free for the Ray Data tasks trials
    start outside their placement group (``trial_data_cpus``)."""
    free = cluster_cpus - data_cpus
    per_trial = settings.trial_cpus()
    if per_trial > free + 1e-9:
        raise SpaceError(
            f"resources_per_trial: {max(1, settings.num_learners)} Train worker(s) x num_cpus {settings.num_cpus:g} "
            f"leave no CPU for Ray Data on a cluster of {cluster_cpus:g} CPUs (each trial's data tasks need "
            f"{data_cpus:g} CPU outside the trials): use --cpus-per-trial "
            f"{max(0.25, free / max(1, settings.num_learners)):g} or less")
    cap = max(1, int(math.floor(free / per_trial + 1e-9)))
    return min(cap, settings.max_concurrent_trials or cap)


def _shared_teacher_pass(plan: SweepPlan, parent) -> tuple[dict[str, Any], int]:
    """Build stage 1's training data once in the driver (the teacher pass through the embedding cache), so every
    trial only hits caches; return its counts and ASHA's ``max_t`` (the base config's steps)."""
    from raydistill.methods import stage_plan
    from raydistill.runtime.engine.learner_group import LearnerGroup
    from raydistill.runtime.jobs.stage_data import build_stage_data

    cfg = plan.trial_config({}, Path(plan.sweep_dir) / "trials" / "_shared", "shared")
    stage = stage_plan(cfg)[0]
    started = time.perf_counter()
    data = build_stage_data(stage.cfg, stage.spec)
    seconds = time.perf_counter() - started
    stats = dict(getattr(data, "cache_stats", {}) or {})
    counts = {"sentences": int(data.num_rows), "hits": int(stats.get("hits", 0)),
              "misses": int(stats.get("misses", 0)),
              "teacher_forward_sentences": int(stats.get("teacher_forward_sentences", 0)),
              "seconds": round(seconds, 2), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    max_t = LearnerGroup(stage.cfg, stage.spec, run_dir=stage.run_dir).total_steps(data)
    shutil.rmtree(Path(plan.sweep_dir) / "trials" / "_shared", ignore_errors=True)
    passes_path = Path(plan.sweep_dir) / "teacher_passes.json"
    passes = json.loads(passes_path.read_text()) if passes_path.is_file() else []
    passes.append(counts)
    write_json(passes_path, passes)
    print(f"[tune] teacher pass (once for all trials): {counts['sentences']} rows, {counts['hits']} cached, "
          f"{counts['teacher_forward_sentences']} sentences through the teacher ({seconds:.1f}s)", flush=True)
    parent.log_metrics({"teacher_forward_sentences": counts["teacher_forward_sentences"],
                        "teacher_cache_hits": counts["hits"], "teacher_cache_misses": counts["misses"],
                        "teacher_pass_s": seconds}, step=len(passes) - 1)
    return {"passes": passes}, max_t


def _tuner(plan: SweepPlan, max_t: int, *, resume: bool, callbacks: list | None, verbose: int, concurrency: int):
    """A new Tuner for the plan, or (``resume``) the saved one: finished, stopped and failed trials are kept, running
    ones restart from their own last checkpoint."""
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, PopulationBasedTraining

    settings = plan.sweep_settings
    in_process = settings.num_learners == 0
    # A trial only drives its Train run, whose workers hold the CPUs and GPUs; Tune refuses an empty bundle, so the
    # trial asks for one byte of memory. In local mode the trial process trains and holds them.
    resources = {"cpu": settings.num_cpus, "gpu": settings.num_gpus} if in_process else {"cpu": 0, "memory": 1}
    trainable = tune.with_resources(tune.with_parameters(distill_trial, plan=plan.to_dict()), resources)
    if resume:
        # Errored trials go on from their newest checkpoint too: one whose process was lost (its retries spent, or
        # the driver died first) continues; one whose own code raised refuses at once (distill_trial).
        return tune.Tuner.restore(str(plan.tune_dir), trainable=trainable, resume_unfinished=True,
                                  resume_errored=True, restart_errored=False)
    eval_every = int(plan.base_config.get("train", {}).get("eval_every") or 1)
    if settings.scheduler == "pbt":
        # Every evaluation a local-mode trial reports carries its checkpoint (SweepPlan.trial_config), so a donor PBT
        # picks has one. PBT draws donors and values with the random module: seeded, its decisions follow the seed.
        random.seed(settings.seed)
        scheduler = PopulationBasedTraining(time_attr="step", perturbation_interval=settings.perturbation_evals *
                                            eval_every, hyperparam_mutations=plan.pbt_mutations(),
                                            quantile_fraction=settings.quantile_fraction,
                                            synch=settings.synchronous)
    else:
        grace = max(1, min(settings.grace_evals * eval_every, max_t))
        scheduler = ASHAScheduler(time_attr="step", max_t=max(max_t, grace), grace_period=grace,
                                  reduction_factor=settings.reduction_factor, stop_last_trials=False)
    points = [dict(p) for p in plan.start_from]
    max_concurrent = concurrency
    if plan.algorithm == "optuna":
        from ray.tune.search.optuna import OptunaSearch

        search = OptunaSearch(points_to_evaluate=points or None, seed=settings.seed)
    else:
        from ray.tune.search.basic_variant import BasicVariantGenerator

        # Tune ignores TuneConfig.max_concurrent_trials for a BasicVariantGenerator passed in: it takes its own.
        search = BasicVariantGenerator(points_to_evaluate=points or None, random_state=settings.seed,
                                       max_concurrent=max_concurrent or 0)
        max_concurrent = None
    tune_config = tune.TuneConfig(metric=METRIC, mode="max", search_alg=search, scheduler=scheduler,
                                  num_samples=settings.num_samples, max_concurrent_trials=max_concurrent,
                                  time_budget_s=settings.time_budget_s, trial_dirname_creator=trial_dirname,
                                  # A reused process keeps a stopped trial's Train run, whose rank 0 then waits
                                  # forever on Tune's result queue; in local mode the stop ends the run (the trial's
                                  # own thread), so the next trial may reuse the process (no second torch import).
                                  reuse_actors=in_process)
    run_config = tune.RunConfig(name=plan.tune_dir.name, storage_path=str(plan.tune_dir.parent),
                                # A lost trial process (OOM kill, node loss, preemption) is restarted from
                                # the trial's newest checkpoint; distill_trial refuses a retry of its own error.
                                failure_config=tune.FailureConfig(max_failures=settings.max_trial_failures,
                                                                  fail_fast=False),
                                # Local-mode trials report a checkpoint with each evaluation; the newest few are
                                # what a restored trial or a PBT donor needs.
                                checkpoint_config=tune.CheckpointConfig(num_to_keep=settings.keep_checkpoints)
                                if in_process else None,
                                callbacks=callbacks, verbose=verbose)
    return tune.Tuner(trainable, param_space=plan.param_space(), tune_config=tune_config, run_config=run_config)


def trial_dirname(trial) -> str:
    """Each trial's directory under ``<sweep>/tune`` is named by its id, like its run dir under ``<sweep>/trials``
    (Tune saves this function in the experiment state by module and name; a resume loads it from there)."""
    return trial.trial_id
