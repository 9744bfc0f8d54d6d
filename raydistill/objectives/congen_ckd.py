"""ConGen + CKD: a weighted mix of the two queue distillation losses over ONE queue of teacher vectors,
``L = w · CKD + (1 − w) · ConGen`` (``ConGenCKDLoss`` gives the terms).

A recipe lever of this package, not a method of any paper: the student learns ConGen's target (match the teacher's
similarity distribution over the queue, for the control and the generalisation view) and CKD's (pick its own
sentence's teacher vector out of the same candidates by InfoNCE) at once.

Papers: ConGen, Limkonchotiwat et al., "ConGen: Unsupervised Control and Generalization Distillation For Sentence
Representation", Findings of EMNLP 2022 (``congen.py``); CKD, stage 1 of Gao, Wu et al., "DistilCSE: Effective
Knowledge Distillation For Contrastive Sentence Embeddings", arXiv:2112.05638 (``ckd.py``). The two terms are
``ConGenLoss`` and ``CKDLoss`` themselves, not a re-derivation.
"""

from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor, nn

from raydistill.objectives.base import LossOutput, frozen, take
from raydistill.objectives.ckd import CKDLoss
from raydistill.objectives.congen import ConGenLoss
from raydistill.objectives.queue import InstanceQueue

__all__ = ["ConGenCKDLoss"]


class _ScoredQueue:
    """A queue as one term of ``ConGenCKDLoss`` sees it: every read goes to the queue, ``enqueue`` does nothing.

    Two parent losses enqueueing on one queue would enqueue the batch twice, and the second term would score a
    queue already holding the current batch (its positives as negatives: the first write happens at the next read).
    ``ConGenCKDLoss`` enqueues once, after both terms' logits.
    """

    def __init__(self, queue: InstanceQueue):
        self._queue = queue

    def __getattr__(self, name: str):
        if name.startswith("__") or name == "_queue":  # copy/pickle probes before __init__ ran: not the queue's
            raise AttributeError(name)
        return getattr(self._queue, name)

    def __len__(self) -> int:
        return len(self._queue)

    def enqueue(self, batch: Tensor, groups: Tensor | None = None) -> None:
        """Left to ``ConGenCKDLoss.forward``, once per step."""


class ConGenCKDLoss(nn.Module):
    r"""``L = w · CKD + (1 − w) · ConGen``, both over the same queue of teacher vectors.

    The teacher embeds the control view x₁; the student embeds x₁ (control) and x₂ (generalisation). With Q the
    queue's K rows and t the current teacher batch:

        t   = norm(teacher(x₁))                             [B, D]     constant
        c   = norm(student(x₁)),  g = norm(student(x₂))     [B, D]     with grad
        P_T = softmax(t·[Q; t]ᵀ / τ_T)                      [B, K+B]
        ConGen = α · CE(P_T, softmax(c·[Q; t]ᵀ / τ_S)) + (1 − α) · CE(P_T, softmax(g·[Q; t]ᵀ / τ_S))
        CKD    = CE(s · c·[t; Q]ᵀ, labels = 0..B−1)        s = e^{log s}, learnable, clamped
        L      = w · CKD + (1 − w) · ConGen                 w = ``ckd_weight``
        queue ← newest K of (Q ++ t), after both terms' logits, before backward

    Both terms score the current teacher batch plus the same earlier teacher vectors, and both parents advance
    their queue by the same normalised teacher batch, so one queue serves both (two private queues of equal K and
    start would hold the same rows at every step). The terms are a ``ConGenLoss`` (``self.congen``) and a
    ``CKDLoss`` (``self.ckd``, holding the learnable scale) reading that queue; this module enqueues the batch once.
    The CKD term sees the control view only, as CKD's student does. At ``ckd_weight`` 0 the loss is
    ``ConGenLoss``'s, at 1 ``CKDLoss``'s on the same queue; both terms are computed at every weight.

    features:
        ``"student_control"``    [B, D]  student(x₁), with grad
        ``"student_generalize"`` [B, D]  student(x₂), with grad
        ``"teacher"``            [B, D]  teacher(x₁) (alias ``teacher_control``); detached here
        ``"group"``              [B]     optional group ids; with ``mask_same_group`` both terms drop a row's
                                         same-group candidates other than its positive
    labels: unused.
    parts: ``ckd``, ``congen`` (the two terms), ``con``, ``gen`` (ConGen's), ``scale`` (CKD's s), ``queue_fill``.

    Args: ``queue_size``, ``tau_teacher``, ``tau_student``, ``alpha``, ``precision`` are ConGen's (``precision``:
    the ConGen term's products against the queue; CKD's are fp32); ``ckd_temperature`` (τ, the start of s = 1/τ;
    default e^-1, DistilCSE's), ``ckd_learnable_temperature``, ``ckd_min_scale``, ``ckd_max_scale`` are CKD's;
    ``ckd_weight`` is w in [0, 1]; ``dim`` D; ``queue`` an existing InstanceQueue (e.g. a shared-queue client), else
    one is created from ``queue_size``, ``queue_init``, ``queue_seed``; ``mask_same_group`` applies to both terms.
    """

    def __init__(self, queue_size: int = 16384, tau_teacher: float = 0.05, tau_student: float = 0.07,
                 dim: int = 768, alpha: float = 0.5, ckd_weight: float = 0.5,
                 ckd_temperature: float = math.exp(-1.0), ckd_learnable_temperature: bool = True,
                 ckd_min_scale: float = 1.0, ckd_max_scale: float = 100.0, queue: InstanceQueue | None = None,
                 queue_init: str = "random", queue_seed: int = 0, precision: str = "fp32",
                 mask_same_group: bool = True):
        super().__init__()
        if not 0.0 <= float(ckd_weight) <= 1.0:
            raise ValueError(f"ConGenCKDLoss: ckd_weight must be in [0, 1], got {ckd_weight}")
        self.ckd_weight = float(ckd_weight)
        self.queue = queue if queue is not None else InstanceQueue(queue_size, dim, init=queue_init, seed=queue_seed)
        scored = _ScoredQueue(self.queue)
        self.congen = ConGenLoss(tau_teacher=tau_teacher, tau_student=tau_student, alpha=alpha, queue=scored,
                                 precision=precision, mask_same_group=mask_same_group)
        self.ckd = CKDLoss(temperature=ckd_temperature, learnable_temperature=ckd_learnable_temperature,
                           min_scale=ckd_min_scale, max_scale=ckd_max_scale, queue=scored,
                           mask_same_group=mask_same_group)
        self.dim = self.queue.dim

    def forward(self, features: dict[str, Tensor], labels: Tensor | None = None) -> LossOutput:
        control = take(features, "student_control", "ConGenCKDLoss")                         # [B, D], grad
        generalize = take(features, "student_generalize", "ConGenCKDLoss")                   # [B, D], grad
        teacher = frozen(take(features, "teacher", "ConGenCKDLoss", aliases=("teacher_control",)))  # [B, D]
        row_groups = features.get("group")  # [B] int64 or None
        grouped = {} if row_groups is None else {"group": row_groups}

        # Both terms read the queue as it stands before this batch; neither writes it (_ScoredQueue).
        congen = self.congen({"student_control": control, "student_generalize": generalize, "teacher": teacher,
                              **grouped})
        ckd = self.ckd({"student": control, "teacher": teacher, **grouped})
        loss = self.ckd_weight * ckd.loss + (1.0 - self.ckd_weight) * congen.loss

        # The batch was checked by the terms (same rows, dim D). After the logits, before backward, as both parents.
        self.queue.enqueue(F.normalize(teacher.float(), dim=1), row_groups)
        return LossOutput(loss, {"ckd": float(ckd.loss.detach()), "congen": float(congen.loss.detach()),
                                 "con": congen.parts["con"], "gen": congen.parts["gen"],
                                 "scale": ckd.parts["scale"], "queue_fill": congen.parts["queue_fill"]})
