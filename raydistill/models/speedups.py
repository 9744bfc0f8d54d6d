"""Two changes to a model being trained on CPU that keep what it computes and remove work the CPU pays for.

**Dropout masks from a quarter of the random draws** (``use_fast_dropout``). ``nn.Dropout`` on CPU draws one
Bernoulli sample per element from torch's Mersenne-Twister generator, one element at a time; in a bf16 training
step of a 3-layer student that was 20-30 % of the forward (the matrix products run 2-3x faster in bf16, the
generator does not; sentence-transformers' own bf16 step spends 20 % of its time in ``bernoulli_``). Here one
64-bit draw (``random_`` over the full int64 range, the same generator, so ``torch.manual_seed`` still fixes every
mask) gives four 16-bit uniform integers, and an element is kept when its integer is at or above
``round(p · 65536)``: the drop probability is p to within 2⁻¹⁷ (0.1 → 0.1000061), and kept elements are scaled by
1 / (1 − p_eff) as in ``nn.Dropout``, so the layer's expectation is exact. Forward + backward is 2.9x faster than
``F.dropout`` on a [128, 24, 384] bf16 tensor (2 threads; results/bench-step_costs.json). Hugging Face attention passes its dropout
probability to the attention function instead of a module; that dropout is not touched.

**The word-embedding gradient in one reused buffer** (``use_reused_embedding_grad``). A dense embedding gradient
is a new vocabulary-sized tensor every backward (30522 × 384 floats, 45 MiB, for a BERT student), zero-filled and
then written in a few thousand rows. On CPU the zero-fill of new memory is page faults: a new zero-filled
gradient takes 13.5x as long as zeroing a reused one (results/bench-step_costs.json), for a gradient that
touches at most 4,096 of the 30,522 rows. The embedding is switched to sparse gradients (the rows a batch used), and a hook on the weight scatters them into
one dense buffer kept by the model (zeroed in place, warm memory) as soon as they are accumulated. The optimiser,
gradient clipping and the all-reduce of data-parallel learners see the same dense gradient as before, with the
same values.

Both apply to a model in place and keep its ``state_dict`` (the checkpoint and ``save`` format do not change)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["FastDropout", "fast_dropout", "use_fast_dropout", "use_reused_embedding_grad"]

_LEVELS = 1 << 16


def fast_dropout(x: Tensor, p: float) -> Tensor:
    """Zero each element of ``x`` with probability p (to 2⁻¹⁷), scale the rest by 1 / (1 − p); differentiable."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    dropped_levels = round(p * _LEVELS)
    if dropped_levels == 0 or x.numel() == 0:
        return x
    n = x.numel()
    draws = torch.empty((n + 3) // 4, dtype=torch.int64, device=x.device).random_(-(2**63), None)
    levels = draws.view(torch.int16)[:n].view(x.shape)  # four uniform 16-bit integers per draw
    keep_scale = (levels >= dropped_levels - _LEVELS // 2).to(x.dtype).mul_(_LEVELS / (_LEVELS - dropped_levels))
    return x * keep_scale


class FastDropout(nn.Dropout):
    """``nn.Dropout`` (same p, same train/eval behaviour) with ``fast_dropout``'s masks."""

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        if self.inplace:
            return x.copy_(fast_dropout(x, self.p))
        return fast_dropout(x, self.p)


def use_fast_dropout(model: nn.Module) -> int:
    """Replace every ``nn.Dropout`` submodule of ``model`` by a ``FastDropout`` of the same p, in place; returns
    how many were replaced."""
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Dropout:
                setattr(parent, name, FastDropout(child.p, inplace=child.inplace))
                replaced += 1
    return replaced


def use_reused_embedding_grad(embedding: nn.Embedding) -> nn.Embedding:
    """Give ``embedding`` sparse gradients that are scattered into one reused dense buffer (module docstring).

    After every backward that reaches the weight, ``weight.grad`` is that buffer holding the full dense
    gradient (rows the batch did not use are 0), exactly what a dense embedding would have produced. A second
    backward before ``zero_grad`` adds into it, as dense gradients accumulate."""
    if not isinstance(embedding, nn.Embedding):
        raise TypeError(f"use_reused_embedding_grad needs an nn.Embedding, got {type(embedding).__name__}")
    if embedding.max_norm is not None:  # renormalising rows in the forward writes the weight; keep the plain path
        return embedding
    if getattr(embedding, "_reused_grad_hook", None) is not None:
        return embedding
    weight = embedding.weight
    buffer: list[Tensor] = []  # the dense gradient buffer, created at the first backward (on the weight's device)

    @torch.no_grad()
    def scatter_into_buffer(param: Tensor) -> None:
        grad = param.grad
        if grad is None or not grad.is_sparse:
            return  # already dense: this backward's sparse gradient was added into the buffer
        if not buffer or buffer[0].shape != param.shape or buffer[0].device != param.device:
            buffer[:] = [torch.empty_like(param, memory_format=torch.contiguous_format)]
        dense = buffer[0].zero_()
        dense.index_add_(0, grad._indices()[0], grad._values().to(dense.dtype))
        param.grad = dense

    embedding.sparse = True
    embedding._reused_grad_hook = weight.register_post_accumulate_grad_hook(scatter_into_buffer)
    return embedding


# ----------------------------------------------------------------------------------------------------------------
# Attention dropout

ATTENTION_NAME = "raydistill_sdpa"


def _train_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                     dropout: float = 0.0, scaling: float | None = None, **kwargs) -> tuple[Tensor, None]:
    """Hugging Face's ``sdpa`` attention, except in training with dropout: there ``scaled_dot_product_attention``
    leaves its fused CPU kernel for a math path that draws per-element Bernoulli masks and casts the [B, H, L, L]
    probabilities to fp32 and back; this computes the same attention in the inputs' dtype with ``fast_dropout``.

        weights = dropout(softmax(q·kᵀ · scale + mask))        [B, H, L_q, L_k]
        output  = weights · v                                   [B, H, L_q, d] → [B, L_q, H, d]
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if not (module.training and dropout > 0.0) or kwargs.get("position_bias") is not None or \
            kwargs.get("softcap") is not None or getattr(module, "num_key_value_groups", 1) > 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    scores = torch.matmul(query, key.transpose(2, 3)).mul_(scaling)  # [B, H, L_q, L_k]
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:  # sdpa's mask: True = attend
            scores = scores.masked_fill(~attention_mask, float("-inf"))
        else:
            scores = scores + attention_mask
    weights = fast_dropout(torch.softmax(scores, dim=-1), dropout)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), None


def use_fast_attention_dropout(model: nn.Module) -> bool:
    """Switch a Hugging Face model that runs ``sdpa`` attention to ``_train_attention`` (same attention and masks;
    its dropout from ``fast_dropout``); True when switched. Models with their own attention code (MPNet) apply
    dropout through an ``nn.Dropout`` module, which ``use_fast_dropout`` already replaces."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    ALL_ATTENTION_FUNCTIONS.register(ATTENTION_NAME, _train_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION_NAME, sdpa_mask)
    model.set_attn_implementation(ATTENTION_NAME)
    return True
