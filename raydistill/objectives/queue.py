"""InstanceQueue: a FIFO of the K most recent L2-normalised vectors, kept in place as a ring buffer.

Queue-based distillation compares each batch with many more candidates than one batch holds (He et al., MoCo,
CVPR 2020; used by CKD, ConGen and SCT with K up to 131072). The authors' code rebuilds the queue every step
(``queue = concat(queue, batch)[B:]``, or a CPU → GPU copy of the whole queue in DistilCSE); at K = 131072,
d = 1024 that is a 512 MiB copy per step. Here the rows live in one registered buffer that is written in place:

    embeddings  [K, d]   buffer, checkpointed by state_dict; never reallocated (its data_ptr stays fixed)
    pointer     []       next row to overwrite = the oldest row once the queue is full
    filled      []       rows written so far (≤ K); before the queue is full they are rows [0, filled)

``scores(x)`` is ONE matmul of ``x`` against the filled rows, in buffer (ring) order. That order is not the FIFO
order, and it does not need to be: a softmax, a cross-entropy or a KL over the candidates is invariant to a
permutation of the candidates, as long as teacher and student logits use the same one (they do: both come from
``scores`` of the same buffer). ``ordered()`` gives the FIFO view (oldest → newest) for tests and inspection.

Where the current batch sits among the candidates — appended last (ConGen, SCT: ``concat(queue, batch)``) or
first (CKD: ``concat(batch, queue)``) — likewise changes nothing but the index of the positive. The losses
therefore score the queue and the current batch as two column blocks (``functional.soft_cross_entropy``) and
never build the concatenation. What the order DOES fix is which rows survive the update. Both of the authors'
rules keep the newest rows: ``concat(batch, queue)[:K]`` (CKD: newest first, truncate) keeps the newest K for any
K and B; ``concat(queue, batch)[B:]`` (ConGen, SCT: append last, drop the oldest B) keeps the queue's length, so
it keeps the newest K only when the queue starts with exactly K rows (a random init, or ConGen's teacher init when
its sample has no duplicate sentence: the authors' queue can then start longer than K and stays that long). The
ring buffer keeps the newest K rows for any K and B, multiple of each other or not; tests/test_queue.py checks it
against both rules step by step. ``enqueue`` is that update.

Groups (``groups``, [K] int64, -1 = none): each row may carry the id of the group its sentence belongs to (the
image of a Flickr30k caption, or the sentence itself). ``same_group(row_groups)`` tells, per query row, which
queue rows share its group, so a loss can drop a sibling caption's teacher vector from the negatives of a row
whose other view is that sibling (``functional.mask_same_group_``).

The losses call ``enqueue`` after their logits are computed and before ``backward`` (as the authors do), so the
current batch is never a candidate twice. The write itself is deferred to the next read of the queue (the next
step's ``scores``, ``len``, ``state_dict``, ...): the step's graph still holds the buffer for its backward (the
gradient of ``x·rowsᵀ`` with respect to ``x`` is ``G·rows``), and writing it in place before ``backward`` would make
autograd refuse ("modified by an inplace operation") or, worse, use the new rows. Nothing reads the queue
between the enqueue and the backward, so every observer sees exactly the authors' FIFO content. One batch at
most is pending: a second ``enqueue`` first writes the previous one. Consequence: with a queue loss, call
``backward`` before the next forward (no gradient accumulation over several forwards; autograd raises if one
tries).

``rows(dtype)`` / ``scores(x, dtype)`` read the queue in another dtype (bfloat16 products on CPUs with AVX512-BF16)
from a copy kept in step with the buffer: ``flush`` writes the new rows into it too, so a step costs a B×d cast, not
a K×d one (the cast of a 65536×768 queue took 50 ms of a 0.9 s ConGen step). The copy is not state (checkpoints
hold the fp32 buffer); it is rebuilt whenever the buffer changed by any other path (tracked by the buffer's
in-place version counter: ``init_random``, ``load_state_dict``, a write from outside).

State is read through the buffers (``self.embeddings``, ``self.pointer``, ``self.filled``) in every method; a
subclass can therefore apply pending remote updates on attribute access (``methods.shared_queue.QueueClient``),
which arrive through ``enqueue`` and are written by the same deferred path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["QUEUE_INITS", "NO_GROUP", "InstanceQueue"]

# "teacher": starts empty; the runtime fills it with teacher vectors of sampled training sentences (``init_from``)
# before the first step, as ConGen's authors initialise their queue.
QUEUE_INITS = ("empty", "random", "teacher")
NO_GROUP = -1


class InstanceQueue(nn.Module):
    """FIFO ring buffer of K L2-normalised d-dim vectors.

    Args:
        size: K, the number of rows kept.
        dim: d.
        init: ``"empty"`` (no rows; CKD's queue starts empty and grows), ``"random"`` (K random unit vectors,
            as SCT's ``randn(K, d)`` normalised; full from the first step) or ``"teacher"`` (empty here, to be
            filled by ``init_from`` with teacher vectors of sampled training sentences: ConGen's init).
        seed: seed of the ``"random"`` init, so that every copy of a queue (e.g. each learner's mirror of a
            shared queue) starts identical.
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
        """Start from real vectors (e.g. teacher embeddings of K sampled training sentences), oldest first.

        Fewer than K rows leave the queue partly filled (it grows from there); more keep the last K. ``groups``
        [n]: their group ids (see ``enqueue``).
        """
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
        """Append ``batch`` [B, d] (L2-normalised here) as the newest rows, overwriting the oldest.

        ``groups`` [B] int: the group id of each row's sentence (None: no group, -1). Takes effect at the next read
        (module docstring); the write is in place, at most two slice writes (when the batch wraps past the end of
        the buffer); a batch larger than K keeps its last K rows. Never builds a graph: the queue holds constants.
        """
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

        ``x`` should be L2-normalised (then the scores are cosines) and may carry a temperature already
        (``x / τ``): scaling the [B, d] query is cheaper than scaling the [B, K] result. Gradients flow to
        ``x`` only. Runs outside autocast so the buffer is never cast. ``out``: write the scores there (a
        [B, filled] tensor of the product's dtype, e.g. a ``functional.Workspace`` buffer; no gradient then).
        """
        rows = self.rows(dtype)
        if x.shape[-1] != self.dim:
            raise ValueError(f"InstanceQueue.scores: expected [B, {self.dim}], got {tuple(x.shape)}")
        if x.is_cuda or rows.is_cuda:
            with torch.autocast(device_type=rows.device.type, enabled=False):
                return torch.matmul(x.to(rows.dtype), rows.T, out=out)
        return torch.matmul(x.to(rows.dtype), rows.T, out=out)
