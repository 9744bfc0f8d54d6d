"""LearnerGroup: a distillation stage trained by Ray Train, one in-process learner or N data-parallel workers.

``fit`` runs a ``TorchTrainer`` whose workers run ``train_loop.train_worker`` (one ``DistillLearner`` each):

    ScalingConfig   from ``resources.learner``: ``num_learners: 0`` is Train's local mode (the loop runs in this
                    process: tests, laptops, each Trans-Encoder stage inside its learner actor); N > 0 starts N
                    workers with ``num_cpus``/``num_gpus`` each. DDP averages the gradients (gloo on CPU, NCCL on
                    GPU): one step consumes N batches (batch ``b`` of an epoch goes to worker ``b mod N``)
    datasets        a corpus streams from Ray Data (``TrainingData.epoch_stream``, not split: every worker keeps its
                    own batches of the seeded order); a labelled set, and a corpus whose reporter takes no stream (a
                    Tune trial's), ride in the loop config
    reporter        where the loop's reports and checkpoints go (``reporting``): Train's by default
    FailureConfig   ``runtime.max_restarts`` worker-group failures are retried: new workers resume from the newest
                    reported checkpoint (weights, AdamW, schedule, loss state, RNG, data position)
    RunConfig       ``storage_path`` = ``resume.checkpoint_home`` (``<runtime.storage_path>/<run dir name>`` with
                    workers, else the run dir); checkpoints land in ``<home>/checkpoints/step-XXXXXXX``, and
                    ``train.keep_last`` of them are kept. A changed or shared storage is refused before anything
                    starts (``check_resume``)

On top of Train: the config-hash refusal, the resume from the newest checkpoint that verifies, exact mid-epoch resume,
the method's hooks (``MethodSpec.hooks``: shared actors kept by the ``EventRelay``, a fresh start from the driver's
seeded samples), and MLflow/progress from rank 0's reports (a tracking failure never stops training).

Rank 0's reports reach the driver through Train's callback (``events.ReportsToDriver``) and the ``EventRelay``; in
local mode the loop calls the driver's callbacks itself. With workers, ``fit`` runs in a thread of its own and the
main thread waits on the relay, one blocking call per batch of events. A worker group that sends nothing for
``runtime.learner_timeout_s`` (start-up: at least ``LEARNER_START_TIMEOUT_S``) ends that wait with
``LearnerUnresponsiveError`` saying how to resume; the relay then tells the workers to leave.

Preemption: ``stopping.request_stop()`` (the job's SIGTERM / SIGINT handler; ``fit`` runs inside
``stopping.step_boundaries()``) reaches rank 0 at its next progress step; every worker finishes the step in flight, a
checkpoint is written at that step boundary, and ``fit`` raises ``PreemptedError``; the resumed job redoes no step.

Progress goes to stdout, one line per ``runtime.log_every`` steps (default: about 50 lines per run) or 30 s:

    [congen] step 120/400 (30%) ep 1/2 loss 3.1234 dev 71.23 (best 72.10@100) 850 sent/s ETA 4m12s
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from raydistill.durations import format_duration
from raydistill.methods import get_method
from raydistill.methods.hooks import make_shared_actors
from raydistill.runtime.engine import checkpoint as ckpt
from raydistill.runtime.engine import resume
from raydistill.config.job import JobConfig
from raydistill.runtime.engine.reporting import TrainReports, progress_every
from raydistill.runtime.engine.stopping import (  # noqa: F401 - request_stop: re-exported
    JobStopped,
    on_stop_request,
    request_stop,
    signal_name,
    step_boundaries,
    stop_requested,
)

__all__ = ["LearnerGroup", "FitSummary", "PreemptedError", "LearnerUnresponsiveError",
           "request_stop", "LEARNER_TIMEOUT_S"]

log = logging.getLogger(__name__)

# How long the driver waits for the next event of the workers (a step, an evaluation) before it declares a worker
# or the cluster lost. Generous for a CPU step of a base-size model or a dev evaluation.
LEARNER_TIMEOUT_S = 600.0
# Starting the workers may also wait for the cluster to free resources, then imports torch and loads the student.
LEARNER_START_TIMEOUT_S = 600.0
# The name of the Train run under its storage path: its checkpoints are <storage>/checkpoints/step-XXXXXXX.
TRAIN_RUN_NAME = "checkpoints"

class PreemptedError(JobStopped):
    """The job was asked to stop (SIGTERM, SIGINT) and stopped at a step boundary after writing a checkpoint."""

    def __init__(self, message: str, step: int, checkpoint: str | None):
        super().__init__(message, step, checkpoint)


class LearnerUnresponsiveError(RuntimeError):
    """The workers sent no event within ``runtime.learner_timeout_s``: a hung worker or a lost Ray cluster."""


MetricsCallback = Callable[[dict[str, float], int], None]
EventCallback = Callable[[str, dict[str, Any], int], None]


class FitSummary(dict):
    """What ``LearnerGroup.fit`` returns: steps, epochs, best step/score, restarts, wall time, history."""


class LearnerGroup:
    """Train ``cfg``'s method with Ray Train: local mode (``num_learners: 0``) or N workers; same API either way.

    ``spec``: the method (default ``METHODS[cfg.method]``); ``run_dir``: where this (stage of the) run keeps
    ``checkpoints/`` and ``best/``; ``init_model``: the student's start (a previous stage's ``best/``);
    ``teacher_dim``: None reads it from the data; ``name``: the progress lines' label; ``reporter``: a
    ``reporting.Reporter`` (None: ``TrainReports``); ``resume_hint``: the stop line's advice (None: rerun with run_dir).
    """

    def __init__(self, cfg: JobConfig, spec=None, *, run_dir: str | os.PathLike | None = None,
                 init_model: str | None = None, teacher_dim: int | None = None, name: str | None = None,
                 reporter=None, resume_hint: str | None = None):
        self.cfg = cfg
        self.spec = spec if spec is not None else get_method(cfg.method)
        self.run_dir = Path(run_dir if run_dir is not None else cfg.resolved_run_dir()).absolute()
        self.init_model = init_model
        self.teacher_dim = teacher_dim
        self.name = name or self.spec.name
        self.num_learners = int(cfg.resources.learner.num_learners)
        self.max_restarts = cfg.runtime.max_restarts
        self.call_timeout_s = float(cfg.runtime.learner_timeout_s or LEARNER_TIMEOUT_S)
        self.reporter = reporter if reporter is not None else TrainReports()
        # How a stopped fit is resumed, for the stop line: a job that runs fits as its stages says it its own way.
        self.resume_hint = resume_hint or f"run the same command with run_dir {self.run_dir} to resume"

    @property
    def world_size(self) -> int:
        return max(1, self.num_learners)

    def total_steps(self, data) -> int:
        """The steps the run plans: ``train.epochs`` (cut at ``max_steps``), or a step budget; a time budget's
        upper bound until the run fixes its total (budget.py)."""
        return self.run_length(data).total

    def run_length(self, data):
        """``budget.RunLength``: total steps, epochs, and whether a time budget's total is still to be fixed."""
        from raydistill.runtime.engine.budget import run_length

        return run_length(self.cfg.train, data.num_rows, self.world_size, self.name)

    # ------------------------------------------------------------------------------------------------------------

    def fit(self, data, on_metrics: MetricsCallback | None = None, on_eval: MetricsCallback | None = None,
            on_event: EventCallback | None = None) -> FitSummary:
        """Train to the end (resuming from ``run_dir``'s newest good checkpoint) and return a summary. Callbacks:
        ``on_metrics(metrics, step)`` per progress step, ``on_eval({"stsb_dev": ...}, step)`` per dev evaluation,
        ``on_event(kind, info, step)`` per rank-0 event (``start`` with pid and resumed step, ``step``, ``eval``)."""
        from raydistill.runtime.engine.train_loop import LoopConfig

        started = time.perf_counter()
        length = self.run_length(data)
        total = length.total
        if self.teacher_dim is None:
            self.teacher_dim = _teacher_dim_of(data, self.spec, self.cfg)
        # Refuse another config's checkpoint (or another learner count) here, before any worker starts.
        resume.check_resume(self.run_dir, self.cfg, self.world_size)
        home = resume.claim_checkpoint_home(self.run_dir, self.cfg)
        # Where the data stream starts and whether the workers start fresh; they pick (and report) the checkpoint.
        latest, manifest = resume.resume_point(home)
        events = _Dispatcher(self, None if length.pending else total, length.epochs,
                             first_step=manifest["step"] if manifest else 0, on_metrics=on_metrics, on_eval=on_eval,
                             on_event=on_event)
        loop = LoopConfig(cfg=self.cfg, spec=self.spec, run_dir=str(self.run_dir), total_steps=total,
                          epochs=length.epochs, num_rows=data.num_rows, teacher_dim=self.teacher_dim,
                          init_model=self.init_model, name=self.name, events=None, local_mode=self.num_learners == 0,
                          checkpoints_in_run_dir=home == str(self.run_dir.resolve()), reporter=self.reporter)
        if latest is None:  # a fresh start: what the method's hooks start every worker from
            loop.fresh_start = {hook.name: hook.fresh_start_sample(self.spec, self.cfg, data, self.init_model)
                                for hook in self.spec.hooks}
        datasets = None
        if hasattr(data, "epoch_stream") and self.reporter.streams_rows:
            from raydistill.runtime.engine.batches import steps_per_epoch
            from raydistill.runtime.engine.train_loop import STREAM

            rows_per_epoch = steps_per_epoch(data.num_rows, self.cfg.train.batch_size, self.world_size) * \
                self.world_size * self.cfg.train.batch_size
            first_epoch = min(int(manifest["epoch"]) if manifest else 0, length.epochs - 1)
            datasets = {STREAM: data.epoch_stream(first_epoch, length.epochs, rows_per_epoch)}
            loop.teacher = dict(getattr(data, "teacher", {}) or {})
        else:
            # A labelled set rides in the loop config. So does a corpus whose reporter takes no stream (a Tune
            # trial's), as the locations of its memory-mapped rows file and teacher cache, which the workers read
            # batch by batch.
            loop.array_data = data
        with step_boundaries():  # a SIGTERM / SIGINT now stops the learners at their next step boundary
            if loop.local_mode:
                result = self._fit_local(loop, datasets, events)
            else:
                result = self._fit_workers(loop, datasets, events)
        out = result.return_value
        if out.get("diverged"):
            raise FloatingPointError(out["diverged"])
        if out.get("aborted"):
            raise self._unresponsive(self.call_timeout_s)
        if out.get("preempted"):
            self._raise_preempted(out["step"])
        # A time budget's total is the one the run fixed (the planned one if it ended before fixing it).
        return FitSummary(steps=out["step"], total_steps=int(out.get("total_steps", total)), world_size=self.world_size,
                          best_step=out["best"]["best_step"], best_stsb_dev=out["best"]["best_stsb_dev"],
                          best_dir=str(self.run_dir / "best"), restarts=max(0, events.starts - 1),
                          resumed_from=out["resumed_from"], seconds=round(time.perf_counter() - started, 2),
                          history=out["history"], rows=data.num_rows,
                          weights_crc_by_rank=out.get("weights_crc_by_rank"),
                          actor_cpu_s=0.0 if loop.local_mode else round(float(out.get("cpu_s", 0.0)), 1))

    def _trainer(self, loop, datasets, local: bool, callbacks: list | None = None):
        from ray.train import CheckpointConfig, DataConfig, FailureConfig, RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer

        from raydistill.runtime.engine.cluster import quiet_ray_internal_deprecation
        from raydistill.runtime.engine.train_loop import train_worker

        quiet_ray_internal_deprecation()  # a Tune trial's process never ran init_ray, which sets it
        resources = self.cfg.resources.learner
        scaling = ScalingConfig(num_workers=0) if local else ScalingConfig(
            num_workers=self.num_learners, use_gpu=resources.num_gpus > 0,
            resources_per_worker={"CPU": float(resources.num_cpus), **(
                {"GPU": float(resources.num_gpus)} if resources.num_gpus > 0 else {})})
        storage = resume.checkpoint_home(self.run_dir, self.cfg)
        callbacks = (callbacks or []) + (self.reporter.trainer_callbacks(local) or [])  # the driver's first
        run = RunConfig(name=TRAIN_RUN_NAME, storage_path=storage,
                        failure_config=FailureConfig(max_failures=self.max_restarts),
                        checkpoint_config=CheckpointConfig(num_to_keep=self.cfg.train.keep_last),
                        callbacks=callbacks or None)
        # Every worker reads the whole ordered stream and keeps its own batches (exact order, exact resume). Local
        # mode hands the loop the dataset itself, whose context epoch_stream set to preserve order.
        data_config = None
        if not local:
            ingest = DataConfig.default_ingest_options()
            ingest.preserve_order = True
            data_config = DataConfig(datasets_to_split=[], execution_options=ingest)
        # Workers keep the job's working directory: relative model and cache paths of the config stay valid.
        os.environ.setdefault("RAY_CHDIR_TO_TRIAL_DIR", "0")
        return TorchTrainer(train_worker, train_loop_config=loop.as_dict(), scaling_config=scaling, run_config=run,
                            datasets=datasets, dataset_config=data_config)

    def _fit_local(self, loop, datasets, events: "_Dispatcher"):
        """Train's local mode: the loop runs here, and its events call the dispatcher directly."""
        from raydistill.runtime.engine.cluster import drop_log_messages
        from raydistill.runtime.engine.events import LocalEvents

        loop.events = LocalEvents(events, stop_requested)
        # Train's local mode logs every report at INFO ("Reported metrics: {...}"), a line per step that the
        # driver's progress lines already summarise.
        logging.getLogger("ray.train.v2._internal.execution.train_fn_utils").setLevel(logging.WARNING)
        # and every local-mode ScalingConfig announces itself ("Running in local mode. ... please file a report"):
        # chosen here on purpose, once per Trans-Encoder stage or DvBERT fold, nothing for a user to act on.
        drop_log_messages("ray.train.v2.api.config", "Running in local mode")
        return self._trainer(loop, datasets, local=True).fit()

    def _fit_workers(self, loop, datasets, events: "_Dispatcher"):
        """N Train workers: ``fit`` runs in a thread while this one waits on the relay for rank 0's reports."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        from raydistill.runtime.engine.cluster import on_the_driver_node
        from raydistill.runtime.engine.events import EventRelay, ReportsToDriver

        factory = None
        if self.num_learners > 1:
            factory = functools.partial(make_shared_actors, self.spec, self.cfg, self.teacher_dim)
        # On the driver's node: a lost worker node must not take the driver's channel to the workers with it.
        # Threads: the driver's wait must not hold up a report, a worker's read of the stop flag or shared actors.
        relay = ray.remote(num_cpus=0, max_concurrency=32)(EventRelay).options(
            scheduling_strategy=on_the_driver_node()).remote(factory)
        loop.events = relay
        trainer = self._trainer(loop, datasets, local=False, callbacks=[ReportsToDriver(relay)])
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["result"] = trainer.fit()
            except BaseException as exc:  # noqa: BLE001 - handed to the driver thread below
                outcome["error"] = exc
            finally:
                with contextlib.suppress(Exception):  # the relay is gone with the cluster
                    relay.finish.remote()

        thread = threading.Thread(target=run, name=f"raydistill-train-{self.name}", daemon=True)
        with on_stop_request(lambda: relay.request_stop.remote()):
            thread.start()
            while True:
                limit = self.call_timeout_s if events.starts else max(self.call_timeout_s, LEARNER_START_TIMEOUT_S)
                try:
                    drained, finished = ray.get(relay.wait.remote(limit), timeout=limit + 60)
                except (GetTimeoutError, RayActorError):  # the relay, or the cluster, is gone
                    drained, finished = [], False
                for kind, info, step in drained:
                    events(kind, info, step)
                if finished:
                    break
                if not drained:
                    # The run goes on in the background until its hung worker returns or dies; then the relay
                    # (kept alive for this) tells the workers to leave without training. A CLI job simply exits.
                    with contextlib.suppress(Exception):  # the relay is gone with the cluster
                        relay.abort.remote()
                    raise self._unresponsive(limit)
        thread.join()
        with contextlib.suppress(Exception):  # the relay is gone with the cluster
            ray.get(relay.shutdown.remote(), timeout=30)
        ray.kill(relay)
        if "error" in outcome:
            raise outcome["error"]
        return outcome["result"]

    # ------------------------------------------------------------------------------------------------------------

    def _unresponsive(self, waited_s: float) -> LearnerUnresponsiveError:
        latest = ckpt.latest_checkpoint(self.run_dir)
        where = f"checkpoint {latest.name}" if latest is not None else "the start (no checkpoint yet)"
        return LearnerUnresponsiveError(
            f"[{self.name}] the learners sent nothing for {waited_s:g} s (runtime.learner_timeout_s): a worker hangs "
            f"or the Ray cluster is lost. The job stopped; to resume from {where}, run the same command again with "
            f"run_dir {self.run_dir} once the cluster is healthy.")

    def _raise_preempted(self, step: int) -> None:
        latest = ckpt.latest_checkpoint(self.run_dir)
        message = (f"[{self.name}] stop requested ({signal_name()}): stopped after step {step} with checkpoint "
                   f"{latest.name if latest else '?'}; {self.resume_hint} at step {step} (no step is redone)")
        print(message, flush=True)
        raise PreemptedError(message, step, str(latest) if latest else None)


class _Dispatcher:
    """Rank 0's events in the driver: callbacks (MLflow, Tune), progress lines, restart lines."""

    def __init__(self, group: LearnerGroup, total: int | None, epochs: int, first_step: int, on_metrics, on_eval,
                 on_event):
        self.group = group
        self.on_metrics, self.on_eval, self.on_event = on_metrics, on_eval, on_event
        cfg = group.cfg
        self.progress = _Progress(group.name, total, epochs, progress_every(cfg.runtime.log_every, total or 0),
                                  first_step)
        self.progress.log_every = cfg.runtime.log_every
        self.starts = 0
        self.epoch = 0
        self.best: dict[str, float] = {}

    def __call__(self, kind: str, info: dict[str, Any], step: int) -> None:
        if self.on_event is not None:
            self.on_event(kind, info, step)
        if kind == "start":
            self.starts += 1
            if self.starts > 1:
                print(f"[{self.group.name}] learner worker died; Train restarted the workers (restart "
                      f"{self.starts - 1}/{self.group.max_restarts}), resuming from checkpoint step "
                      f"{info.get('resumed_from')}", flush=True)
            self.progress.restart(step)
        elif kind == "step":
            self.epoch = max(0, math.ceil(float(info.get("epoch", self.epoch + 1))) - 1)  # epoch 1.0 ends epoch 0
            if self.on_metrics is not None:
                self.on_metrics(info, step)
            self.progress.update(step, self.epoch, info, None, self.best)
        elif kind == "eval":
            self.best = {"best_stsb_dev": info["best_stsb_dev"], "best_step": info.get("best_step", -1)}
            if self.on_eval is not None:
                self.on_eval({"stsb_dev": info["stsb_dev"], "best_stsb_dev": info["best_stsb_dev"]}, step)
            self.progress.update(step, self.epoch, None, info["stsb_dev"], self.best, force=True)


# ----------------------------------------------------------------------------------------------------------------


def _teacher_dim_of(data, spec, cfg) -> int | None:
    """Width of the teacher vectors the method reads, from the data object (None when it reads none)."""
    views = spec.teacher_views_of(cfg)
    if not views:
        return None
    dim = getattr(data, "teacher_dim", None)
    if dim:
        return int(dim)
    first = data.rows(np.arange(1))
    return int(np.asarray(first[f"teacher_{views[0]}"]).reshape(1, -1).shape[1])


class _Progress:
    """Step/total, loss, dev, sentences/s, the budget left and ETA to stdout; quiet between lines. ``total`` None: a
    time budget that has not fixed its total yet (the reports' ``total_steps`` bring it)."""

    def __init__(self, name: str, total: int | None, epochs: int, every: int, first_step: int):
        self.name, self.total, self.epochs = name, total, epochs
        self.budget_left = ""
        self.log_every: int | None = None  # runtime.log_every: spaces the lines once a time budget's total is known
        self.every = every
        self.started, self.first_step = time.perf_counter(), first_step
        self.last_print = 0.0
        self.loss_window: list[float] = []

    def restart(self, first_step: int) -> None:
        """The ETA counts from here: the workers (re)started at ``first_step``."""
        self.started, self.first_step = time.perf_counter(), first_step

    def update(self, step: int, epoch: int, metrics: dict[str, float] | None, dev: float | None,
               best: dict[str, float], force: bool = False) -> None:
        if metrics is not None:
            if "loss" in metrics:
                self.loss_window.append(metrics.get("loss_mean", metrics["loss"]))  # mean since the previous report
            self.sentences_per_s = metrics.get("sentences_per_s", 0.0)
            if metrics.get("total_steps", -1) > 0 and metrics["total_steps"] != self.total:
                self.total = int(metrics["total_steps"])  # a time budget's total, fixed by the run
                self.every = progress_every(self.log_every, self.total)
            if metrics.get("epochs", -1) > 0:
                self.epochs = int(metrics["epochs"])
            if "budget_left_s" in metrics:
                self.budget_left = f"budget {format_duration(float(metrics['budget_left_s']))} left"
            elif "budget_left_steps" in metrics:
                self.budget_left = f"budget {int(metrics['budget_left_steps'])} steps left"
        now = time.perf_counter()
        if not (force or step % self.every == 0 or step == self.total or now - self.last_print > 30):
            return
        self.last_print = now
        done = step - self.first_step
        rate = done / max(now - self.started, 1e-9)
        eta = (self.total - step) / rate if rate > 0 and self.total is not None else float("nan")
        of = f"{step}/{self.total} ({100 * step / max(1, self.total):.0f}%)" if self.total is not None else \
            f"{step}/? (measuring the step rate)"
        parts = [f"[{self.name}] step {of}", f"ep {min(epoch + 1, self.epochs)}/{self.epochs}"]
        if self.loss_window:
            parts.append(f"loss {np.mean(self.loss_window):.4f}")
            self.loss_window = []
        if dev is not None:
            best_text = ""
            if best and best.get("best_step", -1) >= 0:
                best_text = f" (best {best['best_stsb_dev']:.2f}@{best['best_step']})"
            parts.append(f"dev {dev:.2f}{best_text}")
        if getattr(self, "sentences_per_s", None):
            parts.append(f"{self.sentences_per_s:.0f} sent/s")
        if self.budget_left:
            parts.append(self.budget_left)
        parts.append(f"ETA {format_duration(eta)}")
        print(" ".join(parts), file=sys.stdout, flush=True)


