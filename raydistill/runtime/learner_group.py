"""LearnerGroup: one in-process learner or N learner actors behind the same ``fit`` (RLlib's LearnerGroup pattern).

``num_learners: 0`` builds one ``DistillLearner`` in the driver (tests, laptops, no actor round trips).
``num_learners: N > 0`` starts N ``LearnerActor``s with ``cfg.resources.learner`` resources. They train one model
data-parallel: the driver hands each a disjoint shard of the batch stream (batch ``i`` goes to learner ``i mod N``),
each computes its gradients, and a gloo (CPU) / NCCL (GPU) all-reduce averages them before every optimiser step,
so one step consumes N batches and the weights stay identical on every learner. When the method keeps a queue of
teacher vectors and N > 1, the learners share one ``SharedQueueActor`` (raydistill.runtime.queue_actor) so each
sees the teacher vectors of every learner's batches, as a single learner with an N-times larger batch would.

Fault tolerance: the group checkpoints every ``train.checkpoint_every`` steps (atomic, see checkpoint.py). If a
learner actor dies (node lost, OOM, ``ray.kill``), the group starts new actors, loads the latest checkpoint and
continues from its data position; after ``extra.max_restarts`` (default 3) failures it gives up. A job that is
simply started again with the same ``run_dir`` resumes the same way, from the newest checkpoint that verifies (a
damaged newer one is skipped, and the log says so). Every call to a learner actor waits at most
``extra.learner_timeout_s`` (default ``LEARNER_TIMEOUT_S``): a worker that stops answering, or a cluster that is
gone, ends the job with ``LearnerUnresponsiveError`` saying how to resume, instead of blocking (starting the actors
may take up to ``LEARNER_START_TIMEOUT_S``, as they may wait for resources and load the student).

Preemption: ``request_stop()`` (the SIGTERM handler of ``run_distillation``) makes the group finish the step in
flight, checkpoint at that step boundary and raise ``PreemptedError``; the resumed job redoes no step.

Progress goes to stdout, one line per ``extra.log_every`` steps (default: about 50 lines per run) or 30 s:

    [congen] step 120/400 (30%) ep 1/2 loss 3.1234 dev 71.23 (best 72.10@100) 850 sent/s ETA 4m12s
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from raydistill.methods import get_method
from raydistill.runtime import checkpoint as ckpt
from raydistill.runtime.config import JobConfig

__all__ = ["LearnerGroup", "FitSummary", "PreemptedError", "LearnerUnresponsiveError",
           "request_stop", "LEARNER_TIMEOUT_S"]

log = logging.getLogger(__name__)

# How long the driver waits for any one learner call (a step, an evaluation, a checkpoint write) before it declares
# the worker or the cluster lost. Generous for a CPU step of a base-size model; far from the hour a hung call could
# block before.
LEARNER_TIMEOUT_S = 600.0
# Starting the actors may also wait for the cluster to free resources, then imports torch and loads the student, so
# it gets at least this long (still bounded: a cluster that never schedules them ends the job the same way).
LEARNER_START_TIMEOUT_S = 600.0

_STOP_REQUESTED = threading.Event()


def request_stop() -> None:
    """Ask the running group to checkpoint at the next step boundary and stop (safe to call from a signal handler)."""
    _STOP_REQUESTED.set()


def clear_stop_request() -> None:
    _STOP_REQUESTED.clear()


class PreemptedError(RuntimeError):
    """The job was asked to stop (SIGTERM) and stopped at a step boundary after writing a checkpoint."""

    def __init__(self, message: str, step: int, checkpoint: str | None):
        super().__init__(message)
        self.step, self.checkpoint = step, checkpoint


class LearnerUnresponsiveError(RuntimeError):
    """A learner actor did not answer within ``extra.learner_timeout_s``: a hung worker or a lost Ray cluster."""

MetricsCallback = Callable[[dict[str, float], int], None]


class FitSummary(dict):
    """What ``LearnerGroup.fit`` returns: steps, epochs, best step/score, restarts, wall time, history."""


class _LocalLearners:
    """The in-process learner behind the same calls as the actor set."""

    def __init__(self, learner):
        self.learners = [learner]
        self.world_size = 1

    def call_all(self, method: str, *args, **kwargs) -> list[Any]:
        return [getattr(self.learners[0], method)(*args, **kwargs)]

    def call_rank0(self, method: str, *args, **kwargs) -> Any:
        return getattr(self.learners[0], method)(*args, **kwargs)

    def train_step(self, batches: list[dict[str, np.ndarray]]) -> list[dict[str, float]]:
        return [self.learners[0].train_step(batches[0])]

    def shutdown(self) -> None:
        self.learners[0].close()


class _RemoteLearners:
    def __init__(self, actors: list, timeout_s: float | None):
        self.learners = actors
        self.world_size = len(actors)
        self.timeout_s = timeout_s

    def call_all(self, method: str, *args, **kwargs) -> list[Any]:
        return self.call_all_within(self.timeout_s, method, *args, **kwargs)

    def call_all_within(self, timeout_s: float | None, method: str, *args, **kwargs) -> list[Any]:
        import ray

        return ray.get([getattr(a, method).remote(*args, **kwargs) for a in self.learners], timeout=timeout_s)

    def call_rank0(self, method: str, *args, **kwargs) -> Any:
        import ray

        return ray.get(getattr(self.learners[0], method).remote(*args, **kwargs), timeout=self.timeout_s)

    def train_step(self, batches: list[dict[str, np.ndarray]]) -> list[dict[str, float]]:
        import ray

        # ray.put once per shard: each actor receives only its own batch (OpenRLHF's pre-sliced dispatch).
        refs = [a.train_step.remote(ray.put(batch)) for a, batch in zip(self.learners, batches)]
        return ray.get(refs, timeout=self.timeout_s)

    def shutdown(self) -> None:
        import ray

        for actor in self.learners:
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001 - already dead
                pass


class LearnerGroup:
    """Train ``cfg``'s method with 0 (in-process) or N learner actors; same API either way.

    Args:
        cfg: the job (or stage) config.
        spec: the method; default ``METHODS[cfg.method]``.
        run_dir: where this (stage of the) run keeps ``checkpoints/`` and ``best/``.
        init_model: start the student from this directory (a previous stage's ``best/``).
        teacher_dim: width of the teacher vectors in the batches (None: read from the data).
        name: label of the progress lines and of the actors (``raydistill-learner-<name>-<rank>``).
    """

    def __init__(self, cfg: JobConfig, spec=None, *, run_dir: str | os.PathLike | None = None,
                 init_model: str | None = None, teacher_dim: int | None = None, name: str | None = None):
        self.cfg = cfg
        self.spec = spec if spec is not None else get_method(cfg.method)
        self.run_dir = Path(run_dir) if run_dir is not None else cfg.resolved_run_dir()
        self.init_model = init_model
        self.teacher_dim = teacher_dim
        self.name = name or self.spec.name
        self.num_learners = int(cfg.resources.learner.num_learners)
        self.max_restarts = int(cfg.extra.get("max_restarts", 3))
        self.call_timeout_s = float(cfg.extra.get("learner_timeout_s") or LEARNER_TIMEOUT_S)
        self._learners: _LocalLearners | _RemoteLearners | None = None
        self._queue_actors: list = []
        self._best_cache: dict[str, float] = {}
        self.restarts = 0
        self.actor_cpu_s = 0.0
        self._evaluated_at = -1

    # ------------------------------------------------------------------------------------------------------------

    @property
    def world_size(self) -> int:
        return max(1, self.num_learners)

    def actor_name(self, rank: int) -> str:
        """Ray name of learner ``rank`` (unique per run dir, so two jobs on one cluster never collide)."""
        import hashlib

        tag = hashlib.sha1(str(self.run_dir.resolve()).encode()).hexdigest()[:8]
        return f"raydistill-learner-{self.name}-{tag}-{rank}"

    def _start(self, total_steps: int) -> None:
        from raydistill.runtime.learner import DistillLearner, LearnerActor

        kwargs = dict(total_steps=total_steps, teacher_dim=self.teacher_dim, run_dir=str(self.run_dir),
                      init_model=self.init_model)
        if self.num_learners == 0:
            self._learners = _LocalLearners(DistillLearner(self.cfg, self.spec, **kwargs))
            return
        queues = self._shared_queues()
        actors = [LearnerActor(self.cfg, name=self.actor_name(rank), rank=rank, world_size=self.num_learners,
                               queue_actors=queues, **kwargs) for rank in range(self.num_learners)]
        self._learners = _RemoteLearners(actors, self.call_timeout_s)
        start_timeout_s = max(self.call_timeout_s, LEARNER_START_TIMEOUT_S)
        if self.num_learners > 1:
            import ray

            addr, port = ray.get(actors[0].address.remote(), timeout=start_timeout_s)
            self._learners.call_all_within(start_timeout_s, "init_process_group", addr, port)
        else:
            # surface construction errors here, not at the first step
            self._learners.call_all_within(start_timeout_s, "ping")

    def _shared_queues(self) -> list | None:
        """SharedQueueActors for all learners when the method's queues hold teacher vectors and N > 1."""
        if self.num_learners <= 1 or not self.spec.shares_queue(self.cfg):
            return None
        if not self._queue_actors:
            self._queue_actors = make_shared_queues(self.spec, self.cfg, teacher_dim=self.teacher_dim)
        return self._queue_actors

    def shutdown(self) -> None:
        if self._learners is not None:
            self._learners.shutdown()
            self._learners = None
        if self._queue_actors:
            import ray

            for actor in self._queue_actors:
                try:
                    ray.kill(actor)
                except Exception:  # noqa: BLE001 - already gone
                    pass
            self._queue_actors = []

    # ------------------------------------------------------------------------------------------------------------

    def total_steps(self, data) -> int:
        train = self.cfg.train
        per_epoch = data.num_batches(train.batch_size, drop_last=True) // self.world_size
        if per_epoch == 0:
            raise ValueError(
                f"{self.name}: {data.num_rows} training rows give no full step of {self.world_size} x "
                f"{train.batch_size} rows; lower train.batch_size or raise data.max_sentences")
        total = per_epoch * train.epochs
        return min(total, train.max_steps) if train.max_steps else total

    def fit(self, data, on_metrics: MetricsCallback | None = None, on_eval: MetricsCallback | None = None,
            ) -> FitSummary:
        """Train to the end (resuming from ``run_dir``'s latest checkpoint) and return a summary.

        ``on_metrics(metrics, step)`` gets every step's metrics (for MLflow); ``on_eval({"stsb_dev": ...}, step)``
        every dev evaluation.
        """
        started = time.perf_counter()
        total = self.total_steps(data)
        if self.teacher_dim is None:
            self.teacher_dim = _teacher_dim_of(data, self.spec, self.cfg)
        # Refuse another config's checkpoint (or another learner count) here, before any actor starts.
        ckpt.check_resume(self.run_dir, self.cfg, self.world_size)
        try:
            position, resumed_from = self._start_and_resume(data, total)
            while True:
                try:
                    self._train_from(data, position, total, on_metrics, on_eval, started)
                    break
                except Exception as exc:  # noqa: BLE001 - only actor deaths are retried; see _is_actor_death
                    if not _is_actor_death(exc) or self.restarts >= self.max_restarts:
                        raise
                    self.restarts += 1
                    print(f"[{self.name}] learner actor died ({type(exc).__name__}); restart {self.restarts}/"
                          f"{self.max_restarts} from the latest checkpoint", flush=True)
                    self.shutdown()  # the dead actor's CPU time is lost; actor_cpu_s counts the survivors
                    position, resumed_from = self._start_and_resume(data, total)
            history = self._learners.call_rank0("get_history")
            best = self._learners.call_rank0("best_info")
            final_step = self._learners.call_rank0("ping")
            if isinstance(self._learners, _RemoteLearners):
                self.actor_cpu_s += sum(self._learners.call_all("cpu_seconds"))
        except Exception as exc:
            self.shutdown()
            if _is_timeout(exc):
                raise self._unresponsive(exc) from exc
            raise
        self.shutdown()
        return FitSummary(steps=final_step, total_steps=total, world_size=self.world_size,
                          best_step=best["best_step"], best_stsb_dev=best["best_stsb_dev"],
                          best_dir=str(self.run_dir / "best"), restarts=self.restarts, resumed_from=resumed_from,
                          seconds=round(time.perf_counter() - started, 2), history=history,
                          rows=data.num_rows, actor_cpu_s=round(self.actor_cpu_s, 1))

    def _start_and_resume(self, data, total: int) -> tuple[tuple[int, int, int], int | None]:
        """Start the learners, load the latest checkpoint if any; a fresh start fits the projection if asked."""
        self._start(total)
        position, resumed_from = self._resume()
        if resumed_from is None:
            self._fit_projection(data)
            self._fill_teacher_queues(data)
        return position, resumed_from

    def _fill_teacher_queues(self, data) -> None:
        """``loss.queue_init: teacher``: each teacher queue starts from the cached teacher vectors (no extra teacher
        pass) of min(K, rows) training sentences drawn with the job seed, with their group ids, as ConGen's authors
        start theirs. Queue i of the loss takes the i-th teacher view (SCT-distillation: views a, b)."""
        kwargs = self.spec.loss_kwargs(self.cfg)
        if kwargs.get("queue_init") != "teacher" or not self.spec.shared_queues:
            return
        views = self.spec.teacher_views_of(self.cfg)[:self.spec.shared_queues]
        size = int(kwargs["queue_size"])
        rows = np.sort(np.random.default_rng([self.cfg.seed, 16349]).permutation(data.num_rows)[:size])
        sample = data.rows(rows)
        groups = sample["group"] if "group" in sample else np.full(len(rows), -1, dtype=np.int64)
        blocks = [(np.asarray(np.stack(sample[f"teacher_{view}"]), dtype=np.float32), groups) for view in views]
        filled = self._learners.call_rank0("fill_teacher_queues", blocks)
        self._learners.call_all("sync_queues")
        print(f"[{self.name}] queue_init teacher: {len(views)} queue(s) of K={size} start from the teacher vectors of "
              f"{len(rows)} training sentences ({', '.join(views)} view); rows filled {filled}", flush=True)

    def _fit_projection(self, data, max_rows: int = 4096) -> None:
        """``student_projection_init: least_squares``: every learner fits its new projection to the same teacher
        vectors (up to ``max_rows`` rows of the first teacher view), so ranks stay identical."""
        if self.cfg.student_projection_init != "least_squares" or self.init_model is not None:
            return
        views = self.spec.teacher_views_of(self.cfg)
        if not views:
            print(f"[{self.name}] student_projection_init least_squares: the method reads no teacher vectors; "
                  "the projection keeps its default init", flush=True)
            return
        rows = np.random.default_rng(self.cfg.seed).permutation(data.num_rows)[:max_rows]
        sample = data.rows(rows)
        texts = [str(text) for text in sample[f"text_{views[0]}"]]
        targets = np.asarray(np.stack(sample[f"teacher_{views[0]}"]), dtype=np.float32)  # [n, D]
        started = time.perf_counter()
        fit = self._learners.call_all("fit_projection", texts, targets)[0]
        if fit is None:
            print(f"[{self.name}] student_projection_init least_squares: the student has no projection "
                  "(same width as the teacher); nothing to fit", flush=True)
        else:
            print(f"[{self.name}] projection fitted to {len(texts)} teacher vectors ({views[0]} view) by least "
                  f"squares: mean cosine {fit:.3f} ({time.perf_counter() - started:.1f}s)", flush=True)

    def _unresponsive(self, exc: BaseException) -> LearnerUnresponsiveError:
        latest = ckpt.latest_checkpoint(self.run_dir)
        where = f"checkpoint {latest.name}" if latest is not None else "the start (no checkpoint yet)"
        return LearnerUnresponsiveError(
            f"[{self.name}] a learner did not answer within {self.call_timeout_s:g} s (extra.learner_timeout_s): its "
            f"worker hangs or the Ray cluster is lost ({type(exc).__name__}). The job stopped; to resume from "
            f"{where}, run the same command again with run_dir {self.run_dir} once the cluster is healthy.")

    def _resume(self) -> tuple[tuple[int, int, int], int | None]:
        """(step, epoch, batch_in_epoch) to continue from, and the checkpoint step resumed (None: fresh start).

        The newest checkpoint that verifies (sizes and sha256 of its files); a damaged newer one is skipped with a
        line saying which, why, and what is used instead.
        """
        latest, _ = ckpt.latest_good_checkpoint(
            self.run_dir, report=lambda message: print(f"[{self.name}] {message}", flush=True))
        self._evaluated_at = -1
        if latest is None:
            return (0, 0, 0), None
        manifests = self._learners.call_all("load_checkpoint", str(latest))
        manifest = manifests[0]
        self._evaluated_at = int(manifest.get("extra", {}).get("evaluated_at", -1))
        print(f"[{self.name}] resuming from {latest} (step {manifest['step']}, epoch {manifest['epoch']}, "
              f"batch {manifest['batch_in_epoch']})", flush=True)
        return (manifest["step"], manifest["epoch"], manifest["batch_in_epoch"]), manifest["step"]

    def _train_from(self, data, position: tuple[int, int, int], total: int, on_metrics, on_eval,
                    started: float) -> None:
        train = self.cfg.train
        step, epoch, batch_in_epoch = position
        world = self.world_size
        progress = _Progress(self.name, total, train.epochs, self.cfg.extra.get("log_every"), first_step=step)
        trained = False
        stop = False
        while step < total and epoch < train.epochs and not stop:
            shard: list[dict[str, np.ndarray]] = []
            epoch_finished = True
            for batch in data.iter_batches(epoch, train.batch_size, skip_batches=batch_in_epoch, drop_last=True):
                shard.append(batch)
                if len(shard) < world:
                    continue
                step_started = time.perf_counter()
                per_learner = self._learners.train_step(shard)
                step += 1
                trained = True
                batch_in_epoch += world
                metrics = _merge_metrics(per_learner)
                rows = sum(len(next(iter(b.values()))) for b in shard)
                metrics["sentences_per_s"] = rows * self.spec.student_sentences_per_row / max(
                    time.perf_counter() - step_started, 1e-9)
                metrics["epoch"] = epoch + batch_in_epoch / max(1, data.num_batches(train.batch_size))
                shard = []
                if on_metrics:
                    on_metrics(metrics, step)
                dev = None
                if step % train.eval_every == 0:
                    dev = self._evaluate(step, on_eval)
                    stop = self._early_stop()
                checkpointed = step % train.checkpoint_every == 0
                if checkpointed:
                    self._checkpoint(epoch, batch_in_epoch)
                progress.update(step, epoch, metrics, dev, self._best_cache, force=dev is not None)
                if _STOP_REQUESTED.is_set():
                    self._stop_for_preemption(step, epoch, batch_in_epoch, checkpointed)
                if step >= total or stop:
                    epoch_finished = False
                    break
            if epoch_finished:
                epoch, batch_in_epoch = epoch + 1, 0
                if self._evaluated_at != step:  # the authors also evaluate at every epoch end
                    dev = self._evaluate(step, on_eval)
                    progress.update(step, epoch - 1, None, dev, self._best_cache, force=True)
                    stop = stop or self._early_stop()
        if self._evaluated_at != step:
            dev = self._evaluate(step, on_eval)
            progress.update(step, epoch, None, dev, self._best_cache, force=True)
        if trained:
            # The final checkpoint lets a re-run of the finished job skip training (it resumes at the end).
            self._checkpoint(epoch, batch_in_epoch, extra={"finished": True, "early_stopped": stop})
        if stop:
            print(f"[{self.name}] early stop at step {step}: {train.patience} evaluations without a new best",
                  flush=True)

    def _stop_for_preemption(self, step: int, epoch: int, batch_in_epoch: int, checkpointed: bool) -> None:
        if not checkpointed:
            self._checkpoint(epoch, batch_in_epoch, extra={"preempted": True})
        latest = ckpt.latest_checkpoint(self.run_dir)
        message = (f"[{self.name}] stop requested (SIGTERM): stopped after step {step} with checkpoint "
                   f"{latest.name if latest else '?'}; run the same command with run_dir {self.run_dir} to resume "
                   f"at step {step} (no step is redone)")
        print(message, flush=True)
        raise PreemptedError(message, step, str(latest) if latest else None)

    def _early_stop(self) -> bool:
        return bool(self.cfg.train.patience) and bool(self._learners.call_rank0("should_stop_now"))

    def _evaluate(self, step: int, on_eval) -> float:
        score = self._learners.call_rank0("evaluate_dev")
        self._evaluated_at = step
        best = self._learners.call_rank0("best_info")
        self._best_cache = best
        if on_eval:
            on_eval({"stsb_dev": score, "best_stsb_dev": best["best_stsb_dev"]}, step)
        return score

    def _checkpoint(self, epoch: int, batch_in_epoch: int, extra: dict[str, Any] | None = None) -> None:
        extra = {"world_size": self.world_size, "restarts": self.restarts, "evaluated_at": self._evaluated_at,
                 **(extra or {})}
        self._learners.call_rank0("save_checkpoint", epoch, batch_in_epoch, extra)


# ----------------------------------------------------------------------------------------------------------------


def make_shared_queues(spec, cfg: JobConfig, teacher_dim: int | None) -> list:
    """One SharedQueueActor (``resources.queue``) per teacher queue of ``spec``'s loss, ``loss.queue_size`` x
    teacher dim, initialised by the loss's own rule."""
    from raydistill.runtime.queue_actor import create_shared_queue

    size = int(spec.loss_kwargs(cfg)["queue_size"])
    return [create_shared_queue(cfg, size=size, dim=int(teacher_dim), **spec.queue_kwargs(cfg, i))
            for i in range(spec.shared_queues)]


def _merge_metrics(per_learner: list[dict[str, float]]) -> dict[str, float]:
    keys = per_learner[0].keys()
    merged = {k: float(np.mean([m[k] for m in per_learner if k in m])) for k in keys}
    merged["learner_sentences_per_s"] = float(sum(m.get("sentences_per_s", 0.0) for m in per_learner))
    return merged


def _is_timeout(exc: BaseException) -> bool:
    try:
        from ray.exceptions import GetTimeoutError
    except ImportError:
        return False
    return isinstance(exc, GetTimeoutError)


def _is_actor_death(exc: BaseException) -> bool:
    try:
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
    except ImportError:
        return False
    return isinstance(exc, (RayActorError, ActorDiedError, ActorUnavailableError))


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
    """Step/total, loss, dev, sentences/s and ETA to stdout; quiet between lines."""

    def __init__(self, name: str, total: int, epochs: int, every: int | None, first_step: int):
        self.name, self.total, self.epochs = name, total, epochs
        self.every = int(every) if every else max(1, total // 50)
        self.started, self.first_step = time.perf_counter(), first_step
        self.last_print = 0.0
        self.loss_window: list[float] = []

    def update(self, step: int, epoch: int, metrics: dict[str, float] | None, dev: float | None,
               best: dict[str, float], force: bool = False) -> None:
        if metrics is not None:
            self.loss_window.append(metrics["loss"])
            self.sentences_per_s = metrics.get("sentences_per_s", 0.0)
        now = time.perf_counter()
        if not (force or step % self.every == 0 or step == self.total or now - self.last_print > 30):
            return
        self.last_print = now
        done = step - self.first_step
        rate = done / max(now - self.started, 1e-9)
        eta = (self.total - step) / rate if rate > 0 else float("nan")
        parts = [f"[{self.name}] step {step}/{self.total} ({100 * step / max(1, self.total):.0f}%)",
                 f"ep {min(epoch + 1, self.epochs)}/{self.epochs}"]
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
        parts.append(f"ETA {_duration(eta)}")
        print(" ".join(parts), file=sys.stdout, flush=True)


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"
