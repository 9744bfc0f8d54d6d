"""One FIFO instance queue shared by several learners: an authoritative actor and a local mirror per learner.

Queue-based distillation (ConGen, SCT-distillation, CKD) compares each batch with the K most recent teacher vectors;
with N data-parallel learners each should see the teacher vectors of *every* learner's batches, as one learner with
an N-times larger batch would. Pulling the whole queue from an actor every step costs a K x d copy (201 ms for
32768 x 768, docs/runtime.md, Ray behaviour); sending only what changed costs 8 ms. So:

- ``SharedInstanceQueue`` holds the authoritative ``objectives.InstanceQueue``, a ``version`` (pushes so far) and a
  log of the recent pushes, enough to replay the newest K rows (a client further behind gets a full snapshot).
- ``SharedQueueActor`` is it behind Ray, with concurrency groups: ``since``/``snapshot`` (group "read") never wait
  behind a ``push`` (group "write", one thread); a lock keeps each read consistent.
- ``QueueClient`` is an ``InstanceQueue`` on the learner side: ``enqueue`` sends the rows to the actor and asks, in
  the same call, for every push since the client's version; the answer is collected, pipelined, at the next read of
  the queue. The mirror replays all learners' pushes in the actor's order, so it holds exactly the authoritative
  content, in FIFO order, for any enqueue rule of ``InstanceQueue``. With no actor (one learner) it is a plain
  local queue.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

import numpy as np
import ray
import torch

from raydistill.objectives.queue import InstanceQueue

__all__ = ["SharedInstanceQueue", "SharedQueueActor", "QueueClient", "create_shared_queue", "queue_client_class"]


def _to_numpy_state(state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    # numpy crosses Ray process boundaries cheaper than torch (no torch pickling) and is zero-copy on ray.get.
    return {k: (v.detach().cpu().numpy().copy() if isinstance(v, torch.Tensor) else v) for k, v in state.items()}


def _to_torch_state(state: dict[str, Any]) -> dict[str, Any]:
    return {k: (torch.tensor(v) if isinstance(v, np.ndarray) else v) for k, v in state.items()}


class SharedInstanceQueue:
    """The authoritative queue: ``push`` appends a block of rows; ``since(v)`` tells a mirror what it missed.

    ``since`` returns ``{"version": V, "pushes": [rows, ...]}`` (the blocks pushed after version ``v``, oldest
    first) or, when the log no longer reaches back to ``v``, ``{"version": V, "state": <state_dict as numpy>}``.
    """

    def __init__(self, size: int, dim: int, queue_cls: type | None = None, **queue_kwargs):
        self.size, self.dim = int(size), int(dim)
        self.queue = (queue_cls or InstanceQueue)(self.size, self.dim, **queue_kwargs)
        self.version = 0
        self._log: deque[tuple[int, np.ndarray, np.ndarray | None]] = deque()  # (version after the push, rows, groups)
        self._log_rows = 0
        self._lock = threading.Lock()

    def push(self, rows: np.ndarray, since: int | None = None, groups: np.ndarray | None = None
             ) -> dict[str, Any] | int:
        """Enqueue ``rows`` [B, dim] with their group ids ``groups`` [B] (optional); returns the new version, or
        ``since(since)`` when ``since`` is given."""
        rows = np.array(rows, dtype=np.float32, copy=True)  # owned and never written again: safe to hand out
        if rows.ndim != 2 or rows.shape[1] != self.dim:
            raise ValueError(f"push: expected rows of shape [B, {self.dim}], got {rows.shape}")
        rows.setflags(write=False)
        if groups is not None:
            groups = np.array(groups, dtype=np.int64, copy=True)
            groups.setflags(write=False)
        with self._lock:
            with torch.no_grad():
                self.queue.enqueue(torch.from_numpy(rows.copy()),
                                   None if groups is None else torch.from_numpy(groups.copy()))
            self.version += 1
            self._log.append((self.version, rows, groups))
            self._log_rows += len(rows)
            # Pushes older than the newest `size` rows can no longer change the content: drop them.
            while len(self._log) > 1 and self._log_rows - len(self._log[0][1]) >= self.size:
                self._log_rows -= len(self._log.popleft()[1])
            if since is None:
                return self.version
            return self._since_locked(since)

    def since(self, version: int) -> dict[str, Any]:
        with self._lock:
            return self._since_locked(version)

    def _since_locked(self, version: int) -> dict[str, Any]:
        if version == self.version:
            return {"version": self.version, "pushes": []}
        oldest = self._log[0][0] if self._log else self.version + 1
        if 0 <= version < self.version and version >= oldest - 1:
            return {"version": self.version, "pushes": [(rows, groups) for v, rows, groups in self._log if v > version]}
        return self._snapshot_locked()

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return self._snapshot_locked()

    def _snapshot_locked(self) -> dict[str, Any]:
        return {"version": self.version, "state": _to_numpy_state(self.queue.state_dict())}

    def load_state(self, state: dict[str, Any]) -> int:
        """Replace the content (resume from a checkpoint); every mirror gets a snapshot at its next sync."""
        with self._lock:
            self.queue.load_state_dict(_to_torch_state(state))
            self.version += 1
            self._log.clear()
            self._log_rows = 0
            return self.version

    def ping(self) -> int:
        return self.version


@ray.remote(concurrency_groups={"read": 2, "write": 1})
class SharedQueueActor(SharedInstanceQueue):
    """SharedInstanceQueue as a Ray actor. Create it with ``.options(num_cpus=..)`` or ``create_shared_queue``.

    Reads ("read" group, 2 threads) run beside a push ("write" group, 1 thread: pushes apply one at a time, in
    arrival order); the plain class's lock makes each read see a whole push or none of it.
    """

    @ray.method(concurrency_group="write")
    def push(self, rows, since=None, groups=None):
        return SharedInstanceQueue.push(self, rows, since, groups)

    @ray.method(concurrency_group="write")
    def load_state(self, state):
        return SharedInstanceQueue.load_state(self, state)

    @ray.method(concurrency_group="read")
    def since(self, version):
        return SharedInstanceQueue.since(self, version)

    @ray.method(concurrency_group="read")
    def snapshot(self):
        return SharedInstanceQueue.snapshot(self)

    @ray.method(concurrency_group="read")
    def ping(self):
        return SharedInstanceQueue.ping(self)


def create_shared_queue(cfg, size: int, dim: int, name: str | None = None, **queue_kwargs):
    """A SharedQueueActor with ``cfg.resources.queue``'s resources (default 0 CPU: it is memory-bound)."""
    resources = cfg.resources.queue
    options: dict[str, Any] = {"num_cpus": resources.num_cpus, "num_gpus": resources.num_gpus}
    if name:
        options["name"] = name
    return SharedQueueActor.options(**options).remote(size, dim, **queue_kwargs)


class _QueueClientMixin:
    """A learner's view of a shared queue: an InstanceQueue whose ``enqueue`` goes through the actor.

    ``enqueue(rows)`` sends ``rows`` with the client's version and keeps the reply pending. Any read of the queue's
    tensors (every buffer access goes through ``nn.Module.__getattr__``, so whichever accessor the loss uses) first
    applies the pending reply: reads see every push up to and including this learner's last one, in the actor's
    order. ``sync()`` also fetches what other learners pushed since. With ``actor=None`` it is a plain local queue.
    """

    def __init__(self, actor, size: int, dim: int, timeout_s: float | None = 60.0, **queue_kwargs):
        super().__init__(size, dim, **queue_kwargs)
        self.actor = actor
        self.timeout_s = timeout_s
        self.version = -1
        self._pending = None
        self._applying_snapshot = False
        if actor is not None:
            self._apply(self._get(actor.snapshot.remote()))

    # --------------------------------------------------------------------------------------------- Ray traffic

    def __getattr__(self, name: str):
        # Only reached for what is not a plain attribute: buffers, parameters, submodules.
        if self.__dict__.get("_pending") is not None:
            self._drain()
        return super().__getattr__(name)

    def _get(self, ref):
        return ray.get(ref, timeout=self.timeout_s)

    def _apply(self, delta: dict[str, Any]) -> None:
        if "state" in delta:
            self._applying_snapshot = True  # not a checkpoint restore: do not send it back to the actor
            try:
                super().load_state_dict(_to_torch_state(delta["state"]))
            finally:
                self._applying_snapshot = False
        else:
            device = self._device()
            with torch.no_grad():
                for rows, groups in delta["pushes"]:  # arrive read-only (zero-copy from the object store): copy
                    super().enqueue(torch.tensor(np.asarray(rows), device=device),
                                    None if groups is None else torch.tensor(np.asarray(groups), device=device))
        self.version = int(delta["version"])

    def _device(self) -> torch.device:
        return next((tensor.device for tensor in [*self.buffers(), *self.parameters()]), torch.device("cpu"))

    def _drain(self) -> None:
        pending = self.__dict__.get("_pending")
        if pending is not None:
            self._pending = None
            self._apply(self._get(pending))

    def sync(self) -> int:
        """Block until the mirror equals the authoritative queue as of now; returns the version."""
        if self.actor is None:
            return self.version
        self._drain()
        self._apply(self._get(self.actor.since.remote(self.version)))
        return self.version

    # --------------------------------------------------------------------------------------------- InstanceQueue

    def enqueue(self, rows: torch.Tensor, groups: torch.Tensor | None = None) -> None:
        if self.actor is None:
            super().enqueue(rows, groups)
            return
        self._drain()  # at most one push in flight, so this learner's pushes keep their order
        self._pending = self.actor.push.remote(rows.detach().float().cpu().numpy(), self.version,
                                               None if groups is None else groups.detach().cpu().numpy())

    def state_dict(self, *args, **kwargs):
        self._drain()
        return super().state_dict(*args, **kwargs)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # Called for this module by load_state_dict, also when it is a submodule of a loss being restored.
        self._drain()
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        if self.actor is not None and not self.__dict__.get("_applying_snapshot"):
            # a restored checkpoint becomes the shared content for every learner
            own = _to_numpy_state(super().state_dict())
            self.version = self._get(self.actor.load_state.remote(own))

    def __getstate__(self):
        raise TypeError("QueueClient holds a pending Ray call and is not picklable; pass the actor handle and build "
                        "a QueueClient in the learner process")


class QueueClient(_QueueClientMixin, InstanceQueue):
    __doc__ = _QueueClientMixin.__doc__ + """
    A subclass of ``objectives.InstanceQueue``: loss modules use it exactly like their own queue, and checkpoints
    have the same keys (``embeddings``, ``pointer``, ``filled``). ``queue_kwargs`` (``init``, ``seed``, ``dtype``)
    as for InstanceQueue; the content itself comes from the actor.
    """


_CLIENT_CLASSES: dict[type, type] = {InstanceQueue: QueueClient}


def queue_client_class(queue_cls: type | None = None) -> type:
    """The client class over another InstanceQueue-like ``queue_cls`` (``(size, dim, **kw)``, ``enqueue``, buffers)."""
    base = queue_cls or InstanceQueue
    if base not in _CLIENT_CLASSES:
        _CLIENT_CLASSES[base] = type("QueueClient", (_QueueClientMixin, base),
                                     {"__module__": __name__, "__doc__": _QueueClientMixin.__doc__})
    return _CLIENT_CLASSES[base]
