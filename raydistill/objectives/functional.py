"""Softmax and cross-entropy over a candidate list given as column blocks, without concatenating anything.

The queue-based objectives compare every row of a batch with C = K + B candidates (an instance queue's K rows and
the current batch's B). Concatenating the keys costs a (K+B)×d copy per step, the two logit matrices a B×(K+B) one:
at K = 65536 either is as slow as the matmul it feeds. Here the logits stay blocks ``[z¹ | z²]`` (``z¹ = q·queueᵀ``
[N, K], ``z² = q·batchᵀ`` [N, B]) and the row-wise reductions are combined exactly:

    logsumexp_j [z¹ | z²]_j      = logaddexp(logsumexp z¹, logsumexp z²)
    CE(p, log_softmax z)         = logsumexp_j z_j − Σ_j p_j z_j          (Σ_j p_j = 1)
    ∂CE/∂z_j                     = softmax(z)_j − p_j

Temperatures scale the (small) query matrix before the matmul, ``(q / τ) · keysᵀ``: no pass over the N×C logits
is spent on scaling, and a learnable scale gets its gradient through that product.

``soft_cross_entropy``'s backward computes ``softmax − p`` in one buffer per block, where the composite
``log_softmax → mul → sum`` would allocate and traverse the N×C matrix several times. ``query_soft_cross_entropy``
goes further for the queue losses, whose cost is three GEMMs of the batch against the K×d queue (teacher logits,
student logits, student gradient: 90 % of the loss's time on CPU, bench/objectives.py): the caller computes the
teacher's and the student's logits in ONE stacked GEMM without a graph, and this function back-propagates to the
student queries itself, ``∂L/∂q = (softmax − p)·keys``, writing ``softmax − p`` over the saved logits in place.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["MASKED_LOGIT", "Workspace", "block_logsumexp", "mask_same_group_", "query_soft_cross_entropy",
           "row_chunks", "rowwise_dot", "same_group_in_batch", "soft_cross_entropy", "softmax_blocks_"]

# A candidate removed from a row's softmax. Finite on purpose: exp(MASKED_LOGIT − max) is exactly 0 in fp32 and
# bf16, so the target p is 0 there and the CE's Σ p·z adds 0·MASKED_LOGIT = 0 (with −inf it would add NaN).
MASKED_LOGIT = -1.0e4


def same_group_in_batch(row_groups: Tensor) -> Tensor:
    """[B, B] bool: row j of the batch shares row i's group (ids ≥ 0), j ≠ i (a row's own key is its positive)."""
    row_groups = row_groups.to(dtype=torch.long)
    same = (row_groups[:, None] == row_groups[None, :]) & (row_groups[:, None] >= 0)
    return same.fill_diagonal_(False)


def mask_same_group_(queue_logits: Tensor | None, batch_logits: Tensor | None, queue_same: Tensor | None,
                     row_groups: Tensor) -> None:
    """Drop, in place, the candidates of a row that come from its own group, except its own positive (the diagonal
    of the batch block). Why: with two captions of one image as two views, the sibling's own teacher vector among the
    negatives asks the student to push apart what that sibling's own row (also a training row) pulls together.

    ``queue_logits`` [V·B, K] and ``batch_logits`` [V·B, B] hold V stacked views of the same B rows (e.g. teacher and
    student logits); ``queue_same`` [B, K] is ``InstanceQueue.same_group(row_groups)``; ``row_groups`` [B] (< 0: none).
    """
    rows = row_groups.shape[0]
    if queue_logits is not None and queue_same is not None and queue_logits.shape[1] > 0 and bool(queue_same.any()):
        views = queue_logits.shape[0] // rows
        queue_logits.view(views, rows, -1).masked_fill_(queue_same.to(queue_logits.device)[None], MASKED_LOGIT)
    if batch_logits is not None:
        same = same_group_in_batch(row_groups)
        if bool(same.any()):
            views = batch_logits.shape[0] // rows
            batch_logits.view(views, rows, rows).masked_fill_(same.to(batch_logits.device)[None], MASKED_LOGIT)


class Workspace:
    """Large per-step tensors kept from one step to the next, by name.

    A queue loss needs the same [N, K] buffers every step (96 MiB of logits at N = 384, K = 65536). On CPU the page
    faults of a fresh allocation that size cost more than the arithmetic done in it (a bf16 → fp32 copy of those
    logits takes 6x as long into new memory as into a reused buffer: results/bench-step_costs.json); GPUs have a
    caching allocator. A buffer is handed out again at the next ``get`` of its name, so what was written in it must
    be consumed by then (the backward runs before the next forward); autograd's version check catches a saved buffer
    overwritten too early.
    """

    def __init__(self) -> None:
        self._tensors: dict[str, Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
        """An uninitialised [shape] tensor, the same memory as the last ``get`` of ``name`` when it fits."""
        tensor = self._tensors.get(name)
        if tensor is None or tensor.shape != torch.Size(shape) or tensor.dtype != dtype or tensor.device != device:
            self._tensors[name] = tensor = torch.empty(shape, dtype=dtype, device=device)
        return tensor


def rowwise_dot(a: Tensor, b: Tensor) -> Tensor:
    """Σ_j a_ij b_ij per row, [N, C] × [N, C] → [N], without an N×C temporary (``linalg.vecdot``; a batched GEMV
    through ``bmm`` is 3.1x slower on a [4, 65536] chunk here: results/bench-step_costs.json)."""
    return torch.linalg.vecdot(a, b, dim=1)


# On CPU the passes over the N×C logits (max, subtract, exp, sum) run over row chunks of about this many elements:
# a chunk stays in cache between the passes, and no N×C temporary is allocated (a fresh 64 MiB buffer costs its page
# faults every step; torch.logsumexp allocates two). Not smaller: each pass over a chunk is one op, and with the
# OpenMP workers sleeping between ops (OMP_WAIT_POLICY=PASSIVE, raydistill/__init__.py) every op pays their wake-up;
# 1 Mi elements (16 rows at K = 65536) made whole bf16 ConGen steps 8 % faster than 256 Ki (minilm-l3 0.553 → 0.506 s,
# bert-mini 0.478 → 0.448 s, measured alternating in one process). GPUs take the whole matrix in one kernel per op.
CHUNK_ELEMENTS = 1 << 20


def row_chunks(rows: int, cols: int, device: torch.device, period: int | None = None) -> list[tuple[int, int]]:
    """(start, stop) row ranges of about ``CHUNK_ELEMENTS`` elements (the whole matrix off the CPU). With
    ``period`` P, no range crosses a multiple of P, so rows ``[start, stop)`` of a stack of views use target rows
    ``[start % P, start % P + stop - start)``."""
    period = period or rows
    step = max(1, CHUNK_ELEMENTS // max(1, cols)) if device.type == "cpu" else max(1, rows)
    return [(start, min(start + step, base + period, rows))
            for base in range(0, rows, period) for start in range(base, min(rows, base + period), step)]


def _chunk_logsumexp(blocks: Sequence[Tensor], start: int, stop: int) -> Tensor:
    result = None
    for block in blocks:
        lse = torch.logsumexp(block[start:stop], dim=1)
        result = lse if result is None else torch.logaddexp(result, lse)
    return result


def block_logsumexp(blocks: Sequence[Tensor]) -> Tensor:
    """logsumexp over the concatenation of ``blocks`` along dim 1, [N, C_b] each → [N]. Empty blocks are skipped."""
    blocks = [block for block in blocks if block.shape[1] > 0]
    if not blocks:
        raise ValueError("block_logsumexp: every block is empty (no candidates)")
    rows = blocks[0].shape[0]
    chunks = row_chunks(rows, max(block.shape[1] for block in blocks), blocks[0].device)
    if len(chunks) == 1 or (torch.is_grad_enabled() and any(block.requires_grad for block in blocks)):
        return _chunk_logsumexp(blocks, 0, rows)
    result = torch.empty(rows, dtype=blocks[0].dtype, device=blocks[0].device)
    for start, stop in chunks:
        result[start:stop] = _chunk_logsumexp(blocks, start, stop)
    return result


def softmax_blocks_(blocks: list[Tensor], *, with_neg_entropy: bool = False) -> tuple[list[Tensor], Tensor | None]:
    """Softmax over the concatenated ``blocks`` (target / teacher side, no gradient), computed IN PLACE.

    Returns (probability blocks, Σ_j p_j log p_j per row or None). The blocks must be fresh tensors the caller
    owns (a matmul's output under ``no_grad``): they are overwritten with the probabilities. ``with_neg_entropy``
    accumulates Σ p log p on the way (to report a KL rather than a CE). One exp per element: per row chunk,
    ``e = exp(z − max)`` is written over the logits and divided by ``Σ e`` while the chunk is in cache.
    """
    if any(block.requires_grad for block in blocks):
        raise ValueError("softmax_blocks_ is for the target side: compute its logits under torch.no_grad()")
    nonempty = [block for block in blocks if block.shape[1] > 0]
    if not nonempty:
        raise ValueError("softmax_blocks_: every block is empty (no candidates)")
    rows = nonempty[0].shape[0]
    neg_entropy = torch.zeros(rows, dtype=nonempty[0].dtype, device=nonempty[0].device) if with_neg_entropy else None
    for start, stop in row_chunks(rows, max(block.shape[1] for block in nonempty), nonempty[0].device):
        chunks = [block[start:stop] for block in nonempty]
        _, exp_sum, shifted_dot = _exp_shifted_(chunks, with_dot=with_neg_entropy)
        for chunk in chunks:
            chunk.div_(exp_sum[:, None])
        if with_neg_entropy:  # Σ p log p = Σ (e / s)(z − m) − log s
            neg_entropy[start:stop] = shifted_dot / exp_sum - exp_sum.log()
    return list(blocks), neg_entropy


def _exp_shifted_(chunks: Sequence[Tensor], with_dot: bool = False) -> tuple[Tensor, Tensor, Tensor | None]:
    """``z ← exp(z − m)`` in place over the row chunks of every block, m the row max over all of them; returns
    (m [n], Σ_j exp(z_j − m) [n], and with ``with_dot`` Σ_j exp(z_j − m)·(z_j − m) [n], else None)."""
    row_max = chunks[0].amax(dim=1)
    for chunk in chunks[1:]:
        row_max = torch.maximum(row_max, chunk.amax(dim=1))
    row_max = row_max.masked_fill_(torch.isneginf(row_max), 0.0)  # a row of -inf only: no NaN from inf - inf
    exp_sum = torch.zeros_like(row_max)
    shifted_dot = torch.zeros_like(exp_sum) if with_dot else None
    for chunk in chunks:
        shifted = chunk.sub_(row_max[:, None])
        if with_dot:
            exps = torch.exp(shifted)
            shifted_dot += rowwise_dot(exps, torch.nan_to_num(shifted, neginf=0.0))  # 0·(-inf) counts as 0
            shifted.copy_(exps)
        else:
            shifted.exp_()
        exp_sum += chunk.sum(dim=1)
    return row_max, exp_sum, shifted_dot


class _BlockSoftCrossEntropy(torch.autograd.Function):
    """Row-wise CE(p, log_softmax([z¹ | z² | ...])) with targets p given per block (None = no mass there).

    A target block may have fewer rows than its logit block: logit rows ``r·P + i`` use target row ``i``
    (P = target rows), which lets two student views stacked as one [2B, C] matmul share one teacher
    distribution without repeating it.
    """

    @staticmethod
    def forward(ctx, num_blocks: int, *tensors):  # (z¹, ..., zⁿ, p¹, ..., pⁿ)
        logits, targets = tensors[:num_blocks], tensors[num_blocks:]
        lse = block_logsumexp(logits)  # [N]
        cross = torch.zeros_like(lse)  # Σ_j p_j z_j  [N]
        for z, p in zip(logits, targets):
            if p is None or z.shape[1] == 0:
                continue
            rows = p.shape[0]
            cross += torch.cat([rowwise_dot(z[r:r + rows], p) for r in range(0, z.shape[0], rows)])
        ctx.num_blocks = num_blocks
        ctx.has_target = [p is not None for p in targets]
        ctx.save_for_backward(lse, *logits, *[p for p in targets if p is not None])
        return lse - cross

    @staticmethod
    def backward(ctx, grad_rows: Tensor):
        lse, *saved = ctx.saved_tensors
        logits, targets = saved[: ctx.num_blocks], iter(saved[ctx.num_blocks:])
        grads = []
        for i, (z, has_target) in enumerate(zip(logits, ctx.has_target)):
            p = next(targets) if has_target else None
            if not ctx.needs_input_grad[1 + i]:
                grads.append(None)
                continue
            grad = torch.empty_like(z)  # softmax(z) − p restricted to this block, times the row weights  [N, C_b]
            for start, stop in row_chunks(z.shape[0], z.shape[1], z.device, p.shape[0] if p is not None else None):
                chunk = torch.sub(z[start:stop], lse[start:stop, None], out=grad[start:stop]).exp_()
                if p is not None:  # − p; stacked views share the target rows
                    chunk.sub_(p[start % p.shape[0]:start % p.shape[0] + stop - start])
                chunk.mul_(grad_rows[start:stop, None])
            grads.append(grad)
        return (None, *grads, *([None] * ctx.num_blocks))


def soft_cross_entropy(logits: Sequence[Tensor], targets: Sequence[Tensor | None]) -> Tensor:
    """Per-row cross-entropy ``−Σ_j p_j log softmax(z)_j`` over the concatenated column blocks → [N].

    ``logits``: blocks [N, C_b] (temperature already applied), with gradients. ``targets``: one per block, [N, C_b]
    or [R, C_b] with R dividing N (shared by the stacked views), or None for a block without target mass. Each row of
    the concatenated target must sum to 1 (a softmax, or a one-hot as an identity block): the caller's invariant,
    not checked per step (it would cost a pass over N×C).
    """
    if len(logits) != len(targets):
        raise ValueError(f"soft_cross_entropy: {len(logits)} logit blocks but {len(targets)} target blocks")
    rows = logits[0].shape[0]
    for z, p in zip(logits, targets):
        if z.dim() != 2 or z.shape[0] != rows:
            raise ValueError(f"soft_cross_entropy: logit blocks must be [N, C_b] with one N, got {tuple(z.shape)}")
        if p is not None:
            if p.requires_grad:
                raise ValueError("soft_cross_entropy: targets must not require grad (detach the teacher side)")
            if p.shape[1] != z.shape[1] or rows % p.shape[0]:
                raise ValueError(f"soft_cross_entropy: target block {tuple(p.shape)} does not fit logits "
                                 f"{tuple(z.shape)}")
    contiguous = [z if z.is_contiguous() else z.contiguous() for z in logits]
    return _BlockSoftCrossEntropy.apply(len(contiguous), *contiguous, *targets)


class _QuerySoftCrossEntropy(torch.autograd.Function):
    """Row-wise CE(p, log_softmax([q·k¹ᵀ | q·k²ᵀ | ...])) from precomputed logits, with the gradient to q.

    Inputs: the queries q [N, d] (with grad), then per block the keys kᵇ [C_b, d], the logits zᵇ = q·kᵇᵀ [N, C_b]
    computed by the caller without a graph (overwritten here) and the targets pᵇ (or None; fewer rows than N =
    shared by stacked views). The forward makes one pass over the logits, chunk by chunk while in cache: Σ p·z, then
    ``e = exp(z − m)`` written over z and ``s = Σ e`` (CE = m + log s − Σ p·z); the backward reuses those
    exponentials, ``softmax − p = e / s − p``: one exp per logit per step, not two.
    """

    @staticmethod
    def forward(ctx, queries: Tensor, workspace: Workspace | None, num_blocks: int, *tensors):
        kept = [i for i in range(num_blocks) if tensors[num_blocks + i].shape[1] > 0]  # blocks with candidates
        keys, logits, targets = ([tensors[part * num_blocks + i] for i in kept] for part in range(3))
        if not logits:
            raise ValueError("query_soft_cross_entropy: every block is empty (no candidates)")
        rows = logits[0].shape[0]
        period = next((p.shape[0] for p in targets if p is not None), rows)  # target rows shared by stacked views
        cross = torch.zeros(rows, dtype=logits[0].dtype, device=logits[0].device)  # Σ_j p_j z_j  [N]
        lse = torch.empty_like(cross)  # [N]
        exp_sum = torch.empty_like(cross)  # Σ_j exp(z_j − m)  [N]
        for start, stop in row_chunks(rows, max(z.shape[1] for z in logits), logits[0].device, period):
            chunks = [z[start:stop] for z in logits]
            for z, p in zip(chunks, targets):
                if p is not None:
                    cross[start:stop] += rowwise_dot(z, p[start % p.shape[0]:start % p.shape[0] + stop - start])
            row_max, exp_sum[start:stop], _ = _exp_shifted_(chunks)
            lse[start:stop] = row_max + exp_sum[start:stop].log()
        ctx.keys = keys
        ctx.workspace = workspace
        ctx.has_target = [p is not None for p in targets]
        ctx.save_for_backward(exp_sum, *logits, *[p for p in targets if p is not None])
        return lse - cross

    @staticmethod
    def backward(ctx, grad_rows: Tensor):
        exp_sum, *saved = ctx.saved_tensors
        num_blocks = len(ctx.keys)
        exps, targets = saved[:num_blocks], iter(saved[num_blocks:])
        inverse_sum = exp_sum.reciprocal()[:, None]  # [N, 1]
        grad_queries = None
        for block, (e, keys, has_target) in enumerate(zip(exps, ctx.keys, ctx.has_target)):
            p = next(targets) if has_target else None
            # softmax over this block − p = e / s − p, written over the exponentials (used once)
            for start, stop in row_chunks(e.shape[0], e.shape[1], e.device, p.shape[0] if p is not None else None):
                chunk = e[start:stop].mul_(inverse_sum[start:stop])
                if p is not None:
                    chunk.sub_(p[start % p.shape[0]:start % p.shape[0] + stop - start])
            if keys.dtype == e.dtype:
                contribution = e @ keys  # [N, d]
            else:  # low-precision keys (ConGen's bf16 products): the product in their dtype, not a K x d upcast
                low = e.to(keys.dtype) if ctx.workspace is None else \
                    ctx.workspace.get(f"query_grad_{block}", e.shape, keys.dtype, e.device).copy_(e)
                contribution = (low @ keys).to(e.dtype)
            grad_queries = contribution if grad_queries is None else grad_queries.add_(contribution)
        if grad_queries is not None:
            # diag(g)·(G·K) = (diag(g)·G)·K: the row weights scale the [N, d] result, not the [N, C] matrix.
            grad_queries.mul_(grad_rows[:, None])
        return (grad_queries, None, None, *([None] * (len(ctx.needs_input_grad) - 3)))


def query_soft_cross_entropy(queries: Tensor, keys: Sequence[Tensor], logits: Sequence[Tensor],
                             targets: Sequence[Tensor | None], workspace: Workspace | None = None) -> Tensor:
    """Per-row ``−Σ_j p_j log softmax(z)_j`` with z = [q·k¹ᵀ | q·k²ᵀ | ...] given precomputed → [N].

    ``queries`` [N, d] with grad (temperature applied); ``keys`` per block [C_b, d] (no grad: the queue rows, the
    teacher batch); ``logits`` per block [N, C_b] = queries·keysᵀ computed by the caller under ``no_grad`` and
    OWNED by this function from now on (overwritten by the forward and the backward); ``targets`` as in
    ``soft_cross_entropy``. Back-propagate once (the logits are consumed). ``workspace``: where the backward
    keeps its low-precision copy of ``softmax − p`` when the keys are bf16 (else a fresh tensor per step).
    """
    if not (len(keys) == len(logits) == len(targets)):
        raise ValueError("query_soft_cross_entropy: keys, logits and targets need one entry per block")
    for k, z, p in zip(keys, logits, targets):
        if z.requires_grad or k.requires_grad:
            raise ValueError("query_soft_cross_entropy: keys and logits must carry no graph (compute them under "
                             "torch.no_grad(); the gradient to the queries is computed here)")
        if z.shape != (queries.shape[0], k.shape[0]):
            raise ValueError(f"query_soft_cross_entropy: logits {tuple(z.shape)} do not match queries "
                             f"{tuple(queries.shape)} × keys {tuple(k.shape)}")
        if p is not None and (p.requires_grad or p.shape[1] != z.shape[1] or z.shape[0] % p.shape[0]):
            raise ValueError(f"query_soft_cross_entropy: target block {tuple(p.shape)} does not fit logits "
                             f"{tuple(z.shape)} (or requires grad)")
    logits = [z if z.is_contiguous() else z.contiguous() for z in logits]
    return _QuerySoftCrossEntropy.apply(queries, workspace, len(logits), *keys, *logits, *targets)
