"""What a method needs beyond its loss, as hooks its spec declares and the engine calls without knowing the method.

A ``MethodHook`` has four entry points, each a no-op by default:

    shared_actors(spec, cfg, teacher_dim) -> list     driver, N > 1 learners: actors every learner shares, kept for
                                                      the whole fit (a restarted worker group gets the same ones;
                                                      new ones when any fails its ``ping``)
    loss_context(spec, cfg, actors, teacher_dim)      each worker: keyword arguments of ``spec.build_loss`` made from
                                                      this hook's actors ([] with one learner)
    fresh_start_sample(spec, cfg, data, init_model)   driver, a fresh start only: what every worker starts from
                                                      (picklable; drawn with the job seed, so every worker gets the same)
    at_fresh_start(learner, sample) -> str | None     each worker, a fresh start only: apply the sample; the line to log

State a hook changes lives in the student or the loss module, which every checkpoint saves: no hook runs on a resume.
``LeastSquaresProjection`` fits the projecting student's new Linear(d_s → d_t) to the teacher vectors of a seeded
sample of training rows (``student_projection_init: least_squares``); ``TeacherQueues`` shares the loss's queues of
teacher vectors (``spec.shared_queues``) across N learners through one ``SharedQueueActor`` each and, with
``loss.queue_init: teacher``, starts them from the cached teacher vectors of K training rows, as ConGen's authors do.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["MethodHook", "LeastSquaresProjection", "NothingToDo", "TeacherQueues", "make_shared_actors"]


@dataclass(frozen=True)
class NothingToDo:
    """A fresh-start sample that says, decided on the driver, why the hook does nothing: the line each worker logs."""

    why: str


class MethodHook:
    name = "hook"

    def shared_actors(self, spec, cfg, teacher_dim: int | None) -> list:
        return []

    def loss_context(self, spec, cfg, actors: list, teacher_dim: int | None) -> dict[str, Any]:
        return {}

    def fresh_start_sample(self, spec, cfg, data, init_model: str | None) -> Any:
        return None

    def at_fresh_start(self, learner, sample) -> str | None:
        return None


def make_shared_actors(spec, cfg, teacher_dim: int | None) -> dict[str, list]:
    """Every hook's shared actors, by hook name (hooks without any left out)."""
    shared = {hook.name: hook.shared_actors(spec, cfg, teacher_dim) for hook in spec.hooks}
    return {name: actors for name, actors in shared.items() if actors}


class LeastSquaresProjection(MethodHook):
    name = "projection"

    def __init__(self, max_rows: int = 4096):
        self.max_rows = max_rows

    def fresh_start_sample(self, spec, cfg, data, init_model):
        """Texts and teacher vectors [n, D] (first teacher view) of up to ``max_rows`` rows drawn with the job seed."""
        if cfg.student_projection_init != "least_squares" or init_model is not None:
            return None
        views = spec.teacher_views_of(cfg)
        if not views:
            return NothingToDo("student_projection_init least_squares: the method reads no teacher vectors; the "
                               "projection keeps its default init")
        rows = np.random.default_rng(cfg.seed).permutation(data.num_rows)[:self.max_rows]
        sample = data.rows(rows)
        texts = [str(text) for text in sample[f"text_{views[0]}"]]
        return texts, np.asarray(np.stack(sample[f"teacher_{views[0]}"]), dtype=np.float32), views[0]

    def at_fresh_start(self, learner, sample):
        if sample is None or isinstance(sample, NothingToDo):
            return sample and sample.why
        if learner.student.projection is None:
            return "student_projection_init least_squares: the student has no projection (same width as the " \
                   "teacher); nothing to fit"
        texts, targets, view = sample
        started = time.perf_counter()
        fit = learner.student.fit_projection(texts, targets)
        return (f"projection fitted to {len(texts)} teacher vectors ({view} view) by least squares: mean cosine "
                f"{fit:.3f} ({time.perf_counter() - started:.1f}s)")


class TeacherQueues(MethodHook):
    """The loss's ``count`` queues of teacher vectors: 1 is ``queue`` (ConGen, CKD), 2 are ``queue_a``, ``queue_b``
    (SCT-distillation, one per teacher view). Queues of a learner's own vectors (SCT) stay local to each learner."""

    name = "teacher_queues"

    def __init__(self, count: int):
        self.count = count

    def _settings(self, spec, cfg) -> tuple[int, list[dict[str, Any]]]:
        """K, and each queue's init by the loss's own rule (seed + index), from the loss settings' queue_size,
        queue_init and queue_seed (which every method with shared queues declares)."""
        loss = cfg.loss
        init = loss.queue_init if loss.queue_init is not None else spec.queue_init
        seed = loss.queue_seed or 0
        return int(loss.queue_size or 0), [{"init": init, "seed": seed + i} for i in range(self.count)]

    def shared_actors(self, spec, cfg, teacher_dim):
        from raydistill.methods.shared_queue import create_shared_queue

        size, inits = self._settings(spec, cfg)
        return [create_shared_queue(cfg, size=size, dim=int(teacher_dim), **init) for init in inits] if size else []

    def loss_context(self, spec, cfg, actors, teacher_dim):
        """Mirrors of the shared queues (``QueueClient``): the loss reads and writes the shared queue through them."""
        if not actors:
            return {}
        from raydistill.methods.shared_queue import QueueClient

        size, inits = self._settings(spec, cfg)
        return {"queues": [QueueClient(actor, size, int(teacher_dim), **init) for actor, init in zip(actors, inits)]}

    def fresh_start_sample(self, spec, cfg, data, init_model):
        """``loss.queue_init: teacher``: per queue, the cached teacher vectors [K', D] (no extra teacher pass) of
        K' = min(K, rows) training rows drawn with the job seed, with their group ids; queue i takes teacher view i."""
        size, inits = self._settings(spec, cfg)
        if inits[0]["init"] != "teacher":
            return None
        rows = np.sort(np.random.default_rng([cfg.seed, 16349]).permutation(data.num_rows)[:size])
        sample = data.rows(rows)
        groups = sample["group"] if "group" in sample else np.full(len(rows), -1, dtype=np.int64)
        views = spec.teacher_views_of(cfg)[:self.count]
        blocks = [(np.asarray(np.stack(sample[f"teacher_{view}"]), dtype=np.float32), np.asarray(groups))
                  for view in views]
        return blocks, views, size

    def queues(self, loss_module) -> list:
        names = ("queue",) if self.count == 1 else ("queue_a", "queue_b")
        return [getattr(loss_module, name) for name in names if getattr(loss_module, name, None) is not None]

    def at_fresh_start(self, learner, sample):
        """A shared queue is filled once (rank 0, through its actor), then every mirror is synced to it."""
        if sample is None:
            return None
        import torch

        blocks, views, size = sample
        queues = self.queues(learner.loss_module)
        shared = any(getattr(queue, "actor", None) is not None for queue in queues)
        line = None
        if not shared or learner.rank == 0:
            filled = []
            for queue, (vectors, groups) in zip(queues, blocks):
                queue.init_from(torch.tensor(vectors, device=learner.device),
                                torch.tensor(groups, dtype=torch.int64, device=learner.device))
                filled.append(len(queue))
            line = (f"queue_init teacher: {len(blocks)} queue(s) of K={size} start from the teacher vectors of "
                    f"{len(blocks[0][0])} training sentences ({', '.join(views)} view); rows filled {filled}")
        if shared:
            learner.barrier()
            for queue in queues:
                queue.sync()
        return line
