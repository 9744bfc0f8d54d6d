"""The loop every Ray Train worker runs: one ``DistillLearner`` trained on its share of the seeded batch stream.

``LearnerGroup.fit`` (learner_group.py) starts it through a ``TorchTrainer``; ``train_worker(config)`` is the
``train_loop_per_worker`` and ``config`` the ``train_loop_config`` (``LoopConfig.as_dict``). On each worker:

    rank, world = the Train context's world rank and size (1 in Train's local mode, ``num_learners: 0``)
    learner = DistillLearner(..., rank, world)            # with the method's shared actors, kept by the relay
    resume: the newest checkpoint among Train's (``ray.train.get_checkpoint``) and the newest that verifies in
            ``run_dir``; a fresh start runs the method's hooks (``MethodSpec.hooks``) on the driver's samples
    learner.enable_ddp()                                   # several workers: DDP averages the gradients
    for each step: this worker's batch (batch b of an epoch goes to rank b mod world, ``batches``), one optimiser
            step (with the step's one control collective: ``DistillLearner.train_step``), dev evaluation on rank 0
            (every ``train.eval_every`` steps and at each epoch end), and at a progress step a report of the metrics
            (with a checkpoint every ``train.checkpoint_every`` steps)

Reports and checkpoints leave the loop through the loop config's ``reporter`` (``reporting.Reporter``; default
``TrainReports``) at each progress step (every ``runtime.log_every`` steps, 30 s after the previous report, a dev
evaluation, a checkpoint, a stop, the last step: every worker reports at the same steps, as Train requires), and
once more after the last step with the final checkpoint, marked finished. A Ray Tune trial hands the loop its own
reporter (``runtime.tune.reporting``); the loop does not know it is in one.

The driver hears of the progress steps through rank 0's reports (``events``), and of each (re)start from rank 0
itself. Rank 0 reads the driver's stop flag at its progress steps without waiting and passes it to every worker in
the next step's control collective; every worker finishes that step, rank 0 writes the checkpoint of that step
boundary, and all leave. Besides DDP's gradient all-reduce a step sends one collective (the learner's), and an
evaluation one more only when ``train.patience`` asks for an early-stop decision.

A run trained to a budget (``train.budget``, budget.py) plans ``LoopConfig.total_steps`` over ``LoopConfig.epochs``.
A time budget's total is fixed by rank 0's ``RateMeter``: at the step it decides, rank 0 raises the ``budget``
signal, which reaches every worker in that step's control collective, and the total follows in a single broadcast
at that step. The wall seconds used (over every restart) ride in the learner's checkpoint.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from raydistill.runtime.engine import checkpoint as ckpt
from raydistill.config.job import JobConfig
from raydistill.cputime import cpu_seconds
from raydistill.runtime.engine.batches import array_steps, steps_per_epoch, stream_steps
from raydistill.runtime.engine.budget import MIN_MEASURED_STEPS
from raydistill.runtime.engine.events import (
    EVAL_PREFIX,
    EVENT_TIMEOUT_S,
    PROGRESS_STEP,
    LocalEvents,
    StopFlag,
    progress_events,
    push_event,
)
from raydistill.runtime.engine.reporting import PROGRESS_INTERVAL_S, StepReport, TrainReports, progress_every

__all__ = ["LoopConfig", "train_worker", "STREAM"]

# The name of the Ray Data stream in ``datasets``.
STREAM = "train"


@dataclass
class LoopConfig:
    """What the driver hands every worker (``train_loop_config``); picklable."""

    cfg: JobConfig
    spec: Any  # MethodSpec
    run_dir: str
    total_steps: int
    num_rows: int
    teacher_dim: int | None
    init_model: str | None
    name: str
    events: Any  # EventRelay actor handle, or a LocalEvents in local mode
    checkpoints_in_run_dir: bool = True  # Train's storage is the run dir (not a remote runtime.storage_path)
    array_data: Any = None  # ArrayData / TrainingData cut here (labelled sets; local mode), or None: the Ray stream
    teacher: dict[str, Any] = field(default_factory=dict)  # view -> TeacherVectors (memory-mapped cache)
    fresh_start: dict[str, Any] = field(default_factory=dict)  # hook name -> its fresh_start_sample (a fresh start)
    local_mode: bool = False
    reporter: Any = None  # reporting.Reporter: where reports and checkpoints go (None: TrainReports)
    epochs: int | None = None  # epochs the data runs for (None: train.epochs; a budget repeats it as it needs)

    def as_dict(self) -> dict[str, Any]:
        return {"loop": self}


# ----------------------------------------------------------------------------------------------------------------
# The loop


def train_worker(config: dict[str, Any]) -> dict[str, Any]:
    """Ray Train's ``train_loop_per_worker``: train to the end (or a stop) and return rank 0's summary."""
    _quiet_report_logs()
    return _Worker(config["loop"]).run()


def _quiet_report_logs() -> None:
    """Silence Train's INFO "Reporting training result N" line per report (on a Tune trial's console). Its logger is
    named after a file in Ray's private package: the name is built from ``ray.train``'s location (nothing private is
    imported); a Ray laid out otherwise keeps its lines."""
    import logging

    import ray.train

    logging.getLogger(os.path.join(os.path.dirname(ray.train.__file__), "v2", "_internal", "execution",
                                   "context.py")).setLevel(logging.WARNING)


class _Worker:
    def __init__(self, loop: LoopConfig):
        import ray.train

        from raydistill.runtime.engine.learner import DistillLearner

        self.loop, self.cfg = loop, loop.cfg
        if loop.local_mode:  # one process, where ray.train's context calls may refuse to run (a Tune trial's)
            self.rank, self.world = 0, 1
        else:
            context = ray.train.get_context()
            self.rank, self.world = int(context.get_world_rank()), int(context.get_world_size())
        self.events = loop.events
        self.reporter = loop.reporter if loop.reporter is not None else TrainReports()
        self.shared = _get(self.events.shared_actors.remote()) if self._remote_events else {}
        device = None
        if not loop.local_mode and self.cfg.resources.learner.num_gpus > 0:
            import ray.train.torch

            device = str(ray.train.torch.get_device())
        self.learner = DistillLearner(
            self.cfg, loop.spec, total_steps=loop.total_steps, teacher_dim=loop.teacher_dim, run_dir=loop.run_dir,
            init_model=loop.init_model, rank=self.rank, world_size=self.world, shared_actors=self.shared,
            threads=None if loop.local_mode else self.cfg.resources.learner.threads, device=device)
        self.evaluated_at = -1
        self.announced_eval = -1  # the newest evaluation a report has carried
        self.best_cache: dict[str, float] = {}
        self.last_dev: float | None = None
        self.restarts = 0  # of the worker group, as the relay counted them (recorded in the checkpoints)
        self.flags: StopFlag | None = None  # rank 0's view of the driver's stop / abort flags
        self.loss_since_report: list[float] = []
        self.epochs = int(loop.epochs or self.cfg.train.epochs)
        self.budget = self.cfg.train.budget_limit()
        self.meter = None  # rank 0's measurement of a time budget's step rate (created where training starts)

    @property
    def _remote_events(self) -> bool:
        return not isinstance(self.events, LocalEvents)

    def _print(self, message: str) -> None:
        if self.rank == 0:
            print(f"[{self.loop.name}] {message}", flush=True)

    # ------------------------------------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        started_cpu = cpu_seconds()
        position, resumed_from = self._resume()
        if resumed_from is None:
            for hook in self.loop.spec.hooks:
                line = hook.at_fresh_start(self.learner, self.loop.fresh_start.get(hook.name))
                if line:
                    self._print(line)
        self.learner.enable_ddp()
        reply = {"stop": False, "abort": False}
        if self.rank == 0:
            reply = push_event(self.events, "start", self._start_info(resumed_from), position[0])
            self.restarts = reply["restarts"]
            self.flags = StopFlag(self.events, reply)
        abort, stop = self._agree(reply["abort"], reply["stop"])
        if abort:
            return {"step": self.learner.step, "aborted": True}
        outcome = self._train_from(position, stop_requested=stop)
        if outcome.get("diverged"):
            return {"step": self.learner.step, **outcome}
        cpu = self.learner.all_reduce_mean({"cpu_s": cpu_seconds() - started_cpu})["cpu_s"] * self.world
        return {"step": self.learner.step, "total_steps": self.learner.total_steps,
                "history": self.learner.get_history(), "best": self.learner.best_info(),
                "resumed_from": resumed_from, "cpu_s": cpu, "weights_crc_by_rank": self._weights_crc_by_rank(),
                **outcome}

    def _weights_crc_by_rank(self) -> list[int]:
        """crc32 of every worker's student weights (gathered to all): equal when DDP kept the workers in step."""
        import zlib

        import torch

        crc = 0
        for tensor in self.learner.student.state_dict().values():
            crc = zlib.crc32(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes(), crc)
        crcs = torch.zeros(self.world, dtype=torch.int64)
        crcs[self.rank] = crc
        if self.learner._ddp is not None:
            import torch.distributed as dist

            dist.all_reduce(crcs)
        return [int(c) for c in crcs]

    def _start_info(self, resumed_from: int | None) -> dict[str, Any]:
        """What the driver learns at each (re)start: the checkpoint resumed, rank 0's pid and, with Train workers,
        its actor and the method's shared actors (what an operator, or a fault test, would kill)."""
        info: dict[str, Any] = {"resumed_from": resumed_from, "pid": os.getpid(), "world_size": self.world}
        if self._remote_events:
            import ray

            info["actor"] = ray.get_runtime_context().current_actor
            info["shared_actors"] = [actor for actors in self.shared.values() for actor in actors]
        return info

    def _resume(self) -> tuple[tuple[int, int, int], int | None]:
        """(step, epoch, batch_in_epoch) to continue from, and the checkpoint step loaded (None: fresh start)."""
        # The runner's registered checkpoint (Train's newest, or the one a Tune trial was restored with), then the run
        # dir's newest good one if that is newer: a worker killed right after a report leaves a persisted checkpoint
        # that the controller had not registered yet, and local mode registers none. A damaged newer checkpoint is
        # skipped, and the log says so.
        in_run_dir = None
        if self.loop.checkpoints_in_run_dir:
            in_run_dir, _ = ckpt.latest_good_checkpoint(self.loop.run_dir, report=self._print)
        registered = self.reporter.registered_checkpoint(self.loop.local_mode)
        manifest: dict[str, Any] | None = None
        for source, where in (("train", registered), ("run_dir", in_run_dir)):
            if where is not None:
                manifest = self._load_if_newer(source, where, manifest["step"] if manifest else -1) or manifest
        if manifest is None:
            return (0, 0, 0), None
        self.evaluated_at = int(manifest.get("extra", {}).get("evaluated_at", -1))
        # The checkpoint's own evaluation rode in the report that persisted it; a run stopped before that report
        # reached the driver never logged it, so the first report carries it again (MLflow may get it twice).
        scored = [row for row in self.learner.get_history() if row.get("step") == self.evaluated_at == manifest["step"]
                  and "stsb_dev" in row]
        if self.rank == 0 and scored:
            self.last_dev, self.best_cache = float(scored[-1]["stsb_dev"]), self.learner.best_info()
        self._print(f"resuming from {manifest['_path']} (step {manifest['step']}, epoch {manifest['epoch']}, "
                    f"batch {manifest['batch_in_epoch']})")
        return (manifest["step"], manifest["epoch"], manifest["batch_in_epoch"]), manifest["step"]

    def _load_if_newer(self, source: str, where, newer_than: int) -> dict[str, Any] | None:
        """Load ``where`` (a Train Checkpoint or a path) if it verifies and is newer than step ``newer_than``."""
        if source == "run_dir":
            manifest = ckpt.verify_checkpoint(where)
            if manifest["step"] <= newer_than:
                return None
            return {**self.learner.load_checkpoint(where), "_path": str(where)}
        with where.as_directory() as directory:
            try:
                manifest = ckpt.verify_checkpoint(directory)
            except ckpt.CheckpointError as exc:
                self._print(f"checkpoint damaged: {exc}; falling back to the run dir's newest good checkpoint")
                return None
            if manifest["step"] <= newer_than or not self.reporter.accepts(manifest):
                return None
            return {**self.learner.load_checkpoint(directory, may_differ=self.reporter.may_differ),
                    "_path": where.path}

    # ------------------------------------------------------------------------------------------------------------

    def _steps(self, epoch: int, first_step: int) -> Iterator[tuple[int, int, dict[str, np.ndarray]]]:
        train = self.cfg.train
        per_epoch = steps_per_epoch(self.loop.num_rows, train.batch_size, self.world)
        if self.loop.array_data is not None:
            return array_steps(self.loop.array_data, train.batch_size, self.world, self.rank, per_epoch, epoch,
                                first_step, self.epochs)
        import ray.train

        shard = ray.train.get_dataset_shard(STREAM)
        return stream_steps(shard, self.loop.teacher, train.batch_size, self.world, self.rank, epoch, first_step)

    def _train_from(self, position: tuple[int, int, int], stop_requested: bool) -> dict[str, Any]:
        train, learner = self.cfg.train, self.learner
        per_epoch = steps_per_epoch(self.loop.num_rows, train.batch_size, self.world)
        step, epoch, batch_in_epoch = position
        trained = early_stopped = False
        evaluated_before = self.evaluated_at
        if batch_in_epoch >= per_epoch * self.world and epoch < self.epochs:
            # The checkpoint closed its epoch: the epoch-end evaluation may still be owed.
            epoch, batch_in_epoch = epoch + 1, 0
            early_stopped = self._epoch_end(step)
        preempted = stop_requested
        last_report = started = time.perf_counter()
        seconds_before = learner.seconds_used  # the budget's accounting goes on from the checkpoint's
        if self.rank == 0 and learner.total_pending:
            from raydistill.runtime.engine.budget import RateMeter

            self.meter = RateMeter(self.budget.seconds, learner.total_steps,
                                   pauses=(train.eval_every, train.checkpoint_every))
        if step < learner.total_steps and epoch < self.epochs and not early_stopped and not preempted:
            for ep, step_in_epoch, batch in self._steps(epoch, batch_in_epoch // self.world):
                epoch = ep
                # Rank 0's flags; the other workers learn them in the step's control collective.
                signals = {"stop": False, "abort": False, "report": False}
                pending = learner.total_pending  # the same on every worker: they fix the total at the same step
                if pending:
                    signals["budget"] = False
                fixed_total = None
                if self.rank == 0:
                    signals.update(self.flags.read() if self.loop.local_mode else self.flags.state)
                    signals["report"] = time.perf_counter() - last_report > PROGRESS_INTERVAL_S
                    if pending:
                        # Decided on the steps done so far: this step's signal carries the decision to every worker.
                        fixed_total = self.meter.observe(step, seconds_before + time.perf_counter() - started)
                        signals["budget"] = fixed_total is not None
                try:
                    metrics = learner.train_step(batch, signals)
                except FloatingPointError as exc:
                    # Raised on every worker at once (the learner agrees on it). A diverged run diverges again from
                    # its last checkpoint: end it (the driver raises the error) instead of letting Train's
                    # FailureConfig restart it.
                    return {"diverged": str(exc)}
                agreed = learner.signals
                if agreed["abort"]:
                    return {"aborted": True}
                step, trained = learner.step, True
                learner.seconds_used = seconds_before + time.perf_counter() - started
                if agreed.get("budget"):
                    self._fix_total(fixed_total)
                total = learner.total_steps
                batch_in_epoch = (step_in_epoch + 1) * self.world
                metrics["learner_sentences_per_s"] = metrics.get("sentences_per_s", 0.0) * self.world
                metrics["epoch"] = epoch + batch_in_epoch / max(1, self.loop.num_rows // train.batch_size)
                self.loss_since_report.append(metrics["loss"])
                preempted = agreed["stop"]
                epoch_ends = step_in_epoch + 1 == per_epoch
                # A stop leaves the epoch-end evaluation to the resumed run (the checkpoint says it is owed).
                if step % train.eval_every == 0 or (epoch_ends and not preempted):
                    self._evaluate(step)
                    early_stopped = self._early_stop()
                # The last step's checkpoint is the final one below (marked finished): not reported twice.
                due = step % train.checkpoint_every == 0 and step < total and not early_stopped
                # A time budget still measuring has no total to space the reports by: every MIN_MEASURED_STEPS.
                every = (self.cfg.runtime.log_every or MIN_MEASURED_STEPS) if learner.total_pending else \
                    progress_every(self.cfg.runtime.log_every, total)
                progress = (agreed["report"] or step % every == 0 or due or preempted or early_stopped
                            or step >= total or self.evaluated_at == step)
                evaluated = False
                if progress:
                    metrics, evaluated = self._progress(metrics, step)
                if self.loop.local_mode and not preempted:
                    # The flag itself, read after the driver's callbacks ran: a stop they caused ends this step.
                    preempted = self.flags.read()["stop"]
                if progress or preempted:
                    self._report(metrics, step, epoch, batch_in_epoch, extra={"preempted": True} if preempted
                                 else None, checkpoint=due or preempted, evaluated=evaluated)
                    last_report = time.perf_counter()
                    if self.rank == 0 and not self.loop.local_mode:
                        self.flags.read()  # its answer is there by the next progress step
                if preempted:
                    break
                if epoch_ends:
                    epoch, batch_in_epoch = epoch + 1, 0
                if step >= total or early_stopped:
                    break
        if preempted:
            return {"preempted": True, "early_stopped": False, "epoch": epoch, "batch_in_epoch": batch_in_epoch}
        if self.evaluated_at != step:
            self._evaluate(step)
        if trained or self.evaluated_at != evaluated_before:  # the same on every worker, as Train's reports must be
            # The final checkpoint lets a re-run of the finished job skip training (it resumes at the end); the
            # report also carries an evaluation no report carried yet.
            self._report({"step": step}, step, epoch, batch_in_epoch,
                         extra={"finished": True, "early_stopped": early_stopped}, checkpoint=trained, final=True)
        if early_stopped:
            self._print(f"early stop at step {step}: {train.stop_patience()} evaluations without a new best")
        return {"preempted": False, "early_stopped": early_stopped, "epoch": epoch, "batch_in_epoch": batch_in_epoch}

    def _epoch_end(self, step: int) -> bool:
        """The authors also evaluate at every epoch end; returns the early-stop decision."""
        if self.evaluated_at == step:
            return False
        self._evaluate(step)
        return self._early_stop()

    def _evaluate(self, step: int) -> None:
        """STS-B dev on rank 0 (a new best is saved to ``run_dir/best``); the others wait at the next collective.
        The scores reach the driver with the next report."""
        self.evaluated_at = step
        if self.rank != 0:
            return
        self.last_dev = float(self.learner.evaluate_dev())
        self.best_cache = self.learner.best_info()

    def _fix_total(self, measured: int | None) -> None:
        """A time budget's total, rank 0's ``measured`` on every worker (one broadcast, at this step only)."""
        total = int(measured or 0)
        if self.world > 1 and self.learner._ddp is not None:
            import torch
            import torch.distributed as dist

            value = torch.tensor([total], dtype=torch.int64)
            dist.broadcast(value, src=0)
            total = int(value.item())
        self.learner.fix_total(total)
        self._print(f"budget {self.budget.describe()}: {self.learner.step} steps in "
                    f"{self.learner.seconds_used:.1f} s; the run's total is {total} steps")

    def _early_stop(self) -> bool:
        if not self.cfg.train.stop_patience():  # no decision to agree on
            return False
        return self._agree(self.rank == 0 and self.learner.should_stop_now())[0]

    def _agree(self, *flags: bool) -> list[bool]:
        """Rank 0's decisions (abort and stop at a start, early stop) on every worker, in one broadcast, so all leave
        the loop at the same step."""
        if self.world <= 1 or self.learner._ddp is None:
            return [bool(flag) for flag in flags]
        import torch
        import torch.distributed as dist

        decisions = torch.tensor([1 if flag else 0 for flag in flags], dtype=torch.int64)
        dist.broadcast(decisions, src=0)
        return [bool(decision) for decision in decisions.tolist()]

    def _progress(self, metrics: dict[str, Any], step: int) -> tuple[dict[str, Any], bool]:
        """Rank 0's report metrics of a progress step: the step's metrics with the mean loss since the previous
        report, the marker the driver's callback reads, and the scores of an evaluation no report carried yet;
        and whether this step's own evaluation is among them."""
        if self.rank != 0:
            return metrics, False
        metrics = {**metrics, PROGRESS_STEP: int(step)}
        if self.budget is not None:
            # What the progress lines say is left of the budget (time for a time budget: its seconds used so far).
            metrics["total_steps"] = -1 if self.learner.total_pending else int(self.learner.total_steps)
            if not self.learner.total_pending:  # the epochs the fixed total takes (the plan's are its capacity's)
                per_epoch = max(1, steps_per_epoch(self.loop.num_rows, self.cfg.train.batch_size, self.world))
                metrics["epochs"] = -(-int(self.learner.total_steps) // per_epoch)
            if self.budget.seconds is not None:
                metrics["budget_left_s"] = max(0.0, self.budget.seconds - self.learner.seconds_used)
            else:
                metrics["budget_left_steps"] = max(0, self.learner.total_steps - int(step))
        if "loss" in metrics and self.loss_since_report:
            metrics["loss_mean"] = float(np.mean(self.loss_since_report))
        self.loss_since_report = []
        fresh_eval = self.announced_eval < self.evaluated_at and self.last_dev is not None and self.best_cache
        if fresh_eval:
            scores = {"stsb_dev": self.last_dev, "best_stsb_dev": float(self.best_cache["best_stsb_dev"]),
                      "best_step": int(self.best_cache["best_step"]), "step": int(self.evaluated_at)}
            metrics.update({EVAL_PREFIX + key: value for key, value in scores.items()})
            self.announced_eval = self.evaluated_at
        if self.loop.local_mode:  # no Train callback runs here: the events go to the driver's callbacks at once
            self.events.push(progress_events(metrics))
        return metrics, bool(fresh_eval) and self.evaluated_at == step

    def _report(self, metrics: dict[str, float], step: int, epoch: int, batch_in_epoch: int,
                extra: dict[str, Any] | None, checkpoint: bool, final: bool = False,
                evaluated: bool | None = None) -> None:
        """Hand this step's metrics to the reporter, with the checkpoint of this step boundary if ``checkpoint``
        (``final``: the report after the last step; ``evaluated``: ``metrics`` are ``_progress``'s already, with
        this step's evaluation or not)."""
        if evaluated is None:
            metrics, evaluated = self._progress(metrics, step)
        report = StepReport(
            metrics=metrics, step=int(step), checkpoint=checkpoint, final=final,
            last_step=final or step >= self.learner.total_steps, rank=self.rank, local_mode=self.loop.local_mode,
            extra={"world_size": self.world, "restarts": self.restarts, "evaluated_at": self.evaluated_at,
                   **(extra or {})},
            dev=self.last_dev if evaluated else None,
            best=float(self.best_cache["best_stsb_dev"]) if evaluated else None)

        def save(run_dir, extra: dict[str, Any]):
            return self.learner.save_checkpoint(epoch, batch_in_epoch, extra, run_dir=run_dir)

        self.reporter.report(report, save)


def _get(ref, timeout: float = EVENT_TIMEOUT_S):
    import ray

    return ray.get(ref, timeout=timeout)
