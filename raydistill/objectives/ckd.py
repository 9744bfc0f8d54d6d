"""CKD: contrastive knowledge distillation, stage 1 of DistilCSE.

Paper: Chaochen Gao, Xing Wu, Peng Wang, Jue Wang, Liangjun Zang, Zhongyuan Wang, Songlin Hu. "DistilCSE:
Effective Knowledge Distillation For Contrastive Sentence Embeddings", arXiv:2112.05638 (v1 titled "DisCo";
ConGen and SCT cite it as "CKD (Wu et al., 2021)"). Code: github.com/caskcsg/sentemb, folder DistilCSE
(``ckd_contrastive.py``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from raydistill.objectives.base import LossOutput, check_dim, check_same_rows, frozen, take, validate_temperature
from raydistill.objectives.functional import MASKED_LOGIT, same_group_in_batch, soft_cross_entropy
from raydistill.objectives.queue import InstanceQueue

__all__ = ["CKDLoss", "LearnableScale"]


class LearnableScale(nn.Module):
    """The logit scale s = 1/τ of an InfoNCE, fixed or learned as ``log s`` (as CLIP and DistilCSE do).

    Learned, it is clamped to ``[min_scale, max_scale]`` in the forward pass (default [1, 100], i.e. τ ∈ [0.01, 1];
    100 is CLIP's cap): DistilCSE's unbounded scale keeps growing, turning the softmax into an argmax and the loss
    into a spike (docs/methods.md, DistilCSE); beyond a bound the clamp's gradient is zero, so the parameter stops.
    Hence a learned scale must START strictly inside the bounds, or it never moves (a ``temperature: 1.0`` meant as
    "log-scale 1" started CKD at s = 1, the floor: a near-uniform softmax for the whole run). Such a start is refused.
    """

    def __init__(self, temperature: float, learnable: bool, min_scale: float = 1.0, max_scale: float = 100.0):
        super().__init__()
        temperature = validate_temperature("LearnableScale", "temperature", temperature)
        scale = 1.0 / temperature
        if not 0 < min_scale <= scale <= max_scale:
            raise ValueError(f"LearnableScale: 1/temperature = {scale:.4g} must lie in "
                             f"[min_scale, max_scale] = [{min_scale}, {max_scale}]")
        if learnable and not min_scale < scale < max_scale:
            raise ValueError(
                f"LearnableScale: a learned scale cannot start at its clamp bound (1/temperature = {scale:.4g}, "
                f"bounds [{min_scale}, {max_scale}]): the clamp's gradient is zero there, so it would never move. "
                f"temperature is τ, not log(1/τ): DistilCSE's start, scale e, is temperature {math.exp(-1.0):.6f}")
        self.learnable = bool(learnable)
        self.min_log, self.max_log = math.log(min_scale), math.log(max_scale)
        log_scale = torch.tensor(math.log(1.0 / temperature))
        if self.learnable:
            self.log_scale = nn.Parameter(log_scale)
        else:
            self.register_buffer("log_scale", log_scale)

    def forward(self) -> Tensor:
        return self.log_scale.clamp(self.min_log, self.max_log).exp()  # 0-d

    def extra_repr(self) -> str:
        return f"learnable={self.learnable}, scale={float(self().detach()):.4g}"


class CKDLoss(nn.Module):
    r"""CKD / DistilCSE stage 1 (Gao, Wu et al., arXiv:2112.05638): InfoNCE of student vectors against teacher
    vectors, the student's own sentence's teacher vector being the positive.

        q      = norm(student(x))                           [B, D]  with grad (projected to D by the student)
        k      = norm(teacher(x))                           [B, D]  constant
        keys   = k ++ queue     (current batch FIRST, then past teacher vectors)      [B+K, D]
        L      = CE(s · q·keysᵀ, labels = 0..B−1)  (+ mse_weight · MSE(student(x), teacher(x)))
        queue ← newest K of (k ++ queue), after the logits, before backward

    s = 1/τ is fixed or learned (``LearnableScale``, log-parametrised, clamped to [min_scale, max_scale]).

    features:
        ``"student"``  [B, D]  student(x), with grad (un-normalised; the optional MSE uses it raw)
        ``"teacher"``  [B, D]  teacher(x), detached here
        ``"group"``    [B]     optional group ids: with ``mask_same_group`` a row's same-group keys other than its
                               own teacher vector are not negatives (a sibling caption, or its own queued copy)
    labels: unused (the positive of row i is key i).
    parts: ``infonce``, ``scale`` (s), ``mse`` when ``mse_weight > 0``, ``queue_fill``.

    The student must output D: a narrower encoder gets ``projection_dim=D`` (the authors' plain trainable
    ``Linear(768 → 1024)``, which they do not save; the runtime's student keeps it as a Dense module).

    Deliberate deviations from the authors' code (docs/methods.md, DistilCSE, says why):
    - ``temperature`` is τ (logits = cos/τ); the authors learn ``log s`` from ``--temp 1 --temp_exp 1``, s = e at
      start, which the default ``temperature=math.exp(-1)`` matches. A learned scale is clamped (theirs: unbounded).
    - The queue is an in-place ring buffer in state_dict (theirs: rebuilt on the CPU and copied to the GPU every
      step; not checkpointed), starting empty as theirs, and one queue for all learners (theirs: one per GPU).
    - The teacher side is a constant (theirs runs with dropout on, because of a ``require_grad`` typo).
    - Same-group keys are not negatives (``mask_same_group``): on captions, another caption of the same image or
      the sentence's own teacher vector from an earlier epoch would be a negative to push away from the positive.

    Args:
        queue_size: K (script 65536; code default 50000). 0 = no queue (in-batch negatives only).
        temperature: initial τ. learnable_temperature: learn s (authors) or keep τ fixed. min_scale, max_scale:
            clamp of a learned s. mse_weight: weight of the optional MSE term (authors' ``--mse 1``; off in their
            script). dim: D, the teacher dim. queue: an existing InstanceQueue (e.g. a shared-queue client).
    """

    def __init__(self, queue_size: int = 65536, temperature: float = math.exp(-1.0), learnable_temperature: bool = True,
                 mse_weight: float = 0.0, dim: int = 768, min_scale: float = 1.0, max_scale: float = 100.0,
                 queue: InstanceQueue | None = None, queue_init: str = "empty", queue_seed: int = 0,
                 mask_same_group: bool = True):
        super().__init__()
        self.mask_same_group = bool(mask_same_group)
        self.scale = LearnableScale(temperature, learnable_temperature, min_scale, max_scale)
        if mse_weight < 0:
            raise ValueError(f"CKDLoss: mse_weight must be ≥ 0, got {mse_weight}")
        self.mse_weight = float(mse_weight)
        self.dim = int(dim) if queue is None else queue.dim
        if queue is None and int(queue_size) > 0:
            queue = InstanceQueue(queue_size, self.dim, init=queue_init, seed=queue_seed)
        self.queue = queue

    def forward(self, features: dict[str, Tensor], labels: Tensor | None = None) -> LossOutput:
        student = take(features, "student", "CKDLoss")
        teacher = frozen(take(features, "teacher", "CKDLoss"))
        batch = check_same_rows("CKDLoss", student=student, teacher=teacher)
        check_dim("CKDLoss", self.dim, " (the teacher dim; give the student projection_dim=teacher dim)",
                  student=student, teacher=teacher)

        keys = F.normalize(teacher.float(), dim=1)  # [B, D]
        scale = self.scale()
        queries = F.normalize(student, dim=1) * scale.to(student.dtype)  # [B, D]; s applied before the matmul
        row_groups = features.get("group")  # [B] or None
        groups = row_groups if self.mask_same_group else None
        logits = [queries.to(keys.dtype) @ keys.T]  # [B, B], the positives on the diagonal
        targets: list[Tensor | None] = [torch.eye(batch, dtype=keys.dtype, device=keys.device)]
        if self.queue is not None and len(self.queue) > 0:
            logits.append(self.queue.scores(queries))  # [B, K_filled], negatives only
            targets.append(None)
        if groups is not None:  # [B, C] bool per block: key j shares row i's group
            masks = [same_group_in_batch(groups)] + ([self.queue.same_group(groups)] if len(logits) > 1 else [])
            # Out of place: these logits carry the graph to the student (and the learned scale).
            logits = [z.masked_fill(m.to(z.device), MASKED_LOGIT) if bool(m.any()) else z
                      for z, m in zip(logits, masks)]
        infonce = soft_cross_entropy(logits, targets).mean()
        loss = infonce
        parts = {"infonce": float(infonce.detach()), "scale": float(scale.detach())}
        if self.mse_weight > 0:
            mse = F.mse_loss(student.float(), teacher.float())
            loss = loss + self.mse_weight * mse
            parts["mse"] = float(mse.detach())
        if self.queue is not None:
            parts["queue_fill"] = min(self.queue.size, len(self.queue) + batch) / self.queue.size
            self.queue.enqueue(keys, row_groups)  # after the logits, before backward; no queue read after this
        return LossOutput(loss, parts)
