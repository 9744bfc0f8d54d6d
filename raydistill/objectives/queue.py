"""InstanceQueue: a FIFO of the K most recent L2-normalised vectors, kept in place as a ring buffer.

Queue-based distillation compares each batch with many more candidates than one batch holds (He et al., MoCo,
CVPR 2020; used by CKD, ConGen and SCT with K up to 131072). The authors' code rebuilds the queue every step
(``queue = concat(queue, batch)[B:]``, or a CPU → GPU copy of the whole queue in DistilCSE): at K = 131072,
d = 1024 a 512 MiB copy per step. Here the rows live in one registered buffer that is written in place:

    embeddings  [K, d]   buffer, checkpointed by state_dict; never reallocated (its data_ptr stays fixed)
    pointer     []       next row to overwrite = the oldest row once the queue is full
    filled      []       rows written so far (≤ K); before the queue is full they are rows [0, filled)
    groups      [K]      int64 group id of each row's sentence (a caption's image; -1 = none), for ``same_group``

``scores(x)`` is ONE matmul against the filled rows in ring order: a softmax / CE / KL over the candidates does not
depend on their order as long as teacher and student use the same one, so "current batch appended last" (ConGen,
SCT) and "first" (CKD) are the same loss, and ``ordered()`` (FIFO order) is for tests. The ring buffer keeps the
newest K rows for any K and B, as both authors' update rules do when they keep the newest K (docs/objectives.md;
tests/test_queue.py checks it against both rules step by step).

The losses call ``enqueue`` after their logits and before ``backward`` (as the authors do). The write is deferred
to the next read of the queue (``scores``, ``len``, ``state_dict``, ...): the step's graph still holds the buffer
for its backward (the gradient of ``x·rowsᵀ`` with respect to ``x`` is ``G·rows``), and an in-place write before
``backward`` would make autograd refuse or, worse, use the new rows. Nothing reads the queue in between, so every
observer sees the authors' FIFO content. One batch at most is pending. Consequence: with a queue loss, call
``backward`` before the next forward (no gradient accumulation over several forwards; autograd raises).

``rows(dtype)`` / ``scores(x, dtype)`` read the queue in another dtype (bfloat16 products on CPUs with AVX512-BF16)
from a copy that ``flush`` keeps in step, so a step casts B×d, not K×d (the cast of a 65536×768 queue took 50 ms of
a 0.9 s ConGen step). The copy is not state: it is rebuilt when the buffer changed by any other path (tracked by
the buffer's in-place version counter).

State is read through the buffers (``self.embeddings``, ``self.pointer``, ``self.filled``) in every method, so a
subclass can apply pending remote updates on attribute access (``methods.shared_queue.QueueClient``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["QUEUE_INITS", "NO_GROUP", "InstanceQueue"]

QUEUE_INITS = ("empty", "random", "teacher")
NO_GROUP = -1


class InstanceQueue(nn.Module):
    """FIFO ring buffer of K L2-normalised d-dim vectors.

    Args:
        size: K, the number of rows kept. dim: d.
        init: ``"empty"`` (CKD's: no rows, grows), ``"random"`` (K random unit vectors, SCT's normalised
            ``randn(K, d)``) or ``"teacher"`` (empty until ``init_from`` fills it with teacher vectors: ConGen's).
        seed: seed of the ``"random"`` init, so every copy of a queue (e.g. each learner's mirror) starts identical.
        dtype: storage dtype. Under CUDA autocast use torch.float16/bfloat16: ``scores`` runs outside autocast
            in the storage dtype, so the K×d buffer is never cast (= copied) per step.
    """

    def __init__(self, size: int, dim: int, init: str = "empty", seed: int = 0, dtype: torch.dtype = torch.float32):
        super().__init__()
        if int(size) <= 0 or int(dim) <= 0:
            raise ValueError(f"InstanceQueue: size and dim must be positive, got size={size}, dim={dim}")
        if init not in QUEUE_INITS:
            raise ValueError(f"InstanceQueue: init must be one of {QUEUE_INITS}, got {init!r}")
        self.size, self.dim = int(size), int(dim)
        self.register_buffer("embeddings", torch.zeros(self.size, self.dim, dtype=dtype))
        self.register_buffer("pointer", torch.zeros((), dtype=torch.long))
        self.register_buffer("filled", torch.zeros((), dtype=torch.long))
        self.register_buffer("groups", torch.full((self.size,), NO_GROUP, dtype=torch.long))
        self._pending_rows: Tensor | None = None
        self._pending_groups: Tensor | None = None  # normalised rows of the last enqueue, written at the next read
        # dtype -> (copy of the buffer in that dtype, the buffer's _version the copy matches); see rows(dtype)
        self._copies: dict[torch.dtype, tuple[Tensor, int]] = {}
        if init == "random":
            self.init_random(torch.Generator().manual_seed(int(seed)))

    def extra_repr(self) -> str:
        return f"size={self.size}, dim={self.dim}, dtype={self.embeddings.dtype}"

    # ------------------------------------------------------------------------------------------------ state

    def __len__(self) -> int:
        """Rows filled so far (K once full)."""
        self.flush()
        return int(self.filled)

    def rows(self, dtype: torch.dtype | None = None) -> Tensor:
        """The filled rows in buffer order, [filled, d]: a view of the buffer, or with ``dtype`` (other than the
        storage dtype) a view of the copy in that dtype, kept in step with the buffer (module docstring)."""
        buffer = self.flush()
        if dtype is not None and dtype != buffer.dtype:
            buffer = self._copy_in(buffer, dtype)
        filled = int(self.filled)
        return buffer if filled == self.size else buffer[:filled]

    @torch.no_grad()
    def _copy_in(self, buffer: Tensor, dtype: torch.dtype) -> Tensor:
        copy, version = self._copies.get(dtype, (None, -1))
        if copy is None or version != buffer._version or copy.device != buffer.device:
            copy = buffer.to(dtype)  # first use, or the buffer changed by another path than flush: whole cast
            self._copies[dtype] = (copy, buffer._version)
        return copy

    def ordered(self) -> Tensor:
        """The filled rows oldest → newest, [filled, d] (a copy once the ring has wrapped; for tests)."""
        buffer = self.flush()
        filled, pointer = int(self.filled), int(self.pointer)
        if filled < self.size:
            return buffer[:filled]
        return torch.cat([buffer[pointer:], buffer[:pointer]])

    # ------------------------------------------------------------------------------------------------ writes

    @torch.no_grad()
    def init_random(self, generator: torch.Generator | None = None) -> InstanceQueue:
        """Fill all K rows with random unit vectors (normal, then L2-normalised), in place."""
        buffer = self.flush()
        noise = torch.randn(self.size, self.dim, generator=generator, dtype=torch.float32)
        buffer.copy_(F.normalize(noise, dim=1))
        self.groups.fill_(NO_GROUP)
        self.pointer.zero_()
        self.filled.fill_(self.size)
        return self

    @torch.no_grad()
    def init_from(self, embeddings: Tensor, groups: Tensor | None = None) -> InstanceQueue:
        """Start from real vectors (e.g. teacher embeddings of K sampled training sentences), oldest first, with
        their group ids ``groups`` [n]. Fewer than K rows leave the queue partly filled; more keep the last K."""
        self.reset()
        self.enqueue(embeddings, groups)
        return self

    @torch.no_grad()
    def reset(self) -> InstanceQueue:
        """Empty the queue (the buffer keeps its storage)."""
        self.flush()
        self._pending_rows = self._pending_groups = None
        self.embeddings.zero_()
        self.groups.fill_(NO_GROUP)
        self.pointer.zero_()
        self.filled.zero_()
        return self

    @torch.no_grad()
    def enqueue(self, batch: Tensor, groups: Tensor | None = None) -> None:
        """Append ``batch`` [B, d] (L2-normalised here) as the newest rows, overwriting the oldest, with ``groups``
        [B] (None: no group, -1). Takes effect at the next read (module docstring), in place (at most two slice
        writes); a batch larger than K keeps its last K rows. Never builds a graph: the queue holds constants."""
        if batch.dim() != 2 or batch.shape[1] != self.dim:
            raise ValueError(f"InstanceQueue.enqueue: expected [B, {self.dim}], got {tuple(batch.shape)}")
        if groups is not None and tuple(groups.shape) != (batch.shape[0],):
            raise ValueError(f"InstanceQueue.enqueue: groups must be [{batch.shape[0]}], got {tuple(groups.shape)}")
        self.flush()
        buffer = self.embeddings
        rows = F.normalize(batch.detach().to(device=buffer.device, dtype=torch.float32), dim=1).to(buffer.dtype)
        if rows.shape[0] == 0:
            self._pending_rows = self._pending_groups = None
            return
        self._pending_rows = rows
        self._pending_groups = (torch.full((rows.shape[0],), NO_GROUP, dtype=torch.long, device=buffer.device)
                                if groups is None else groups.detach().to(device=buffer.device, dtype=torch.long))

    @torch.no_grad()
    def flush(self) -> Tensor:
        """Write the pending batch, if any; returns the buffer. Every read calls it first."""
        buffer = self.embeddings  # first: a subclass may turn remote updates into a pending batch here
        rows, self._pending_rows = self._pending_rows, None
        groups, self._pending_groups = self._pending_groups, None
        if rows is None:
            return buffer
        n = rows.shape[0]
        if n >= self.size:
            buffer.copy_(rows[n - self.size:])
            self.groups.copy_(groups[n - self.size:])
            self.pointer.zero_()
            self.filled.fill_(self.size)
            return buffer  # the copies are now stale (version check): rebuilt on their next use
        start = int(self.pointer)
        in_step = {dtype: copy for dtype, (copy, version) in self._copies.items() if version == buffer._version}
        for target in (buffer, *in_step.values()):
            self._write_ring(target, start, rows)
        self._write_ring(self.groups, start, groups)
        for dtype, copy in in_step.items():  # the same rows written: still a copy of the buffer
            self._copies[dtype] = (copy, buffer._version)
        self.pointer.fill_((start + n) % self.size)
        self.filled.fill_(min(self.size, int(self.filled) + n))
        return buffer

    def _write_ring(self, target: Tensor, start: int, rows: Tensor) -> None:
        """``rows`` into ``target`` from row ``start`` on, wrapping past the end (at most two slice writes)."""
        n, end = rows.shape[0], start + rows.shape[0]
        if end <= self.size:
            target[start:end].copy_(rows)
        else:
            head = self.size - start
            target[start:].copy_(rows[:head])
            target[: n - head].copy_(rows[head:])

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        self.flush()
        super()._save_to_state_dict(destination, prefix, keep_vars)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        self._pending_rows = self._pending_groups = None  # the loaded state replaces whatever was about to be written
        if prefix + "groups" not in state_dict and prefix + "embeddings" in state_dict:
            # a checkpoint from before rows carried groups: its rows have none
            state_dict[prefix + "groups"] = torch.full((self.size,), NO_GROUP, dtype=torch.long)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    # ------------------------------------------------------------------------------------------------ reads

    def row_groups(self) -> Tensor:
        """Group ids of the filled rows in buffer order (the order of ``rows`` and ``scores``), [filled]."""
        self.flush()
        filled = int(self.filled)
        groups = self.groups
        return groups if filled == self.size else groups[:filled]

    def same_group(self, query_groups: Tensor) -> Tensor:
        """[B, filled] bool: queue row j holds a sentence of the same group as query row i (ids ≥ 0 only)."""
        query_groups = query_groups.to(device=self.groups.device, dtype=torch.long)
        return (query_groups[:, None] == self.row_groups()[None, :]) & (query_groups[:, None] >= 0)

    def scores(self, x: Tensor, dtype: torch.dtype | None = None, out: Tensor | None = None) -> Tensor:
        """``x · rowsᵀ`` in ONE matmul against the buffer: [B, d] → [B, filled] (buffer order), in the storage
        dtype, or in ``dtype`` against the queue's copy in that dtype (``rows(dtype)``; the result is in ``dtype``).

        ``x`` should be L2-normalised (cosines) and may carry a temperature (``x / τ``: cheaper than scaling the
        [B, K] result). Gradients flow to ``x`` only. Runs outside autocast so the buffer is never cast. ``out``: a
        [B, filled] tensor of the product's dtype to write into (e.g. a ``functional.Workspace`` buffer; no grad).
        """
        rows = self.rows(dtype)
        if x.shape[-1] != self.dim:
            raise ValueError(f"InstanceQueue.scores: expected [B, {self.dim}], got {tuple(x.shape)}")
        if x.is_cuda or rows.is_cuda:
            with torch.autocast(device_type=rows.device.type, enabled=False):
                return torch.matmul(x.to(rows.dtype), rows.T, out=out)
        return torch.matmul(x.to(rows.dtype), rows.T, out=out)
