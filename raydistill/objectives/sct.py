"""SCT: Self-supervised Cross-View Training, and its distillation variant.

Paper: Peerat Limkonchotiwat, Wuttikorn Ponwitayarat, Lalita Lowphansirikul, Can Udomcharoenchaikit, Ekapol
Chuangsuwanich, Sarana Nutanong. "An Efficient Self-Supervised Cross-View Training For Sentence Embedding".
TACL 2023, arXiv:2311.03228. Code: github.com/mrpeerat/SCT (``SCTLoss.py``, ``SCTLoss_distillation.py``).

The cross-view term shared by both losses: for two views A and B of each sentence, reference vectors r (a
second pass of the same model under no_grad with a fresh dropout mask, or a teacher's vectors) and online
vectors z (with grad), each view keeps a queue of its past reference vectors, and

    Q_A = queue_A ++ r_A (current batch appended LAST)          [K+B, d]
    p_A = softmax(r_A·Q_Aᵀ / τ_T)   (no grad)    q_A = log_softmax(z_B·Q_Aᵀ / τ_S)   # view B predicts view A
    p_B = softmax(r_B·Q_Bᵀ / τ_T)   (no grad)    q_B = log_softmax(z_A·Q_Bᵀ / τ_S)   # view A predicts view B
    L   = w·KL(p_A ‖ q_A) + w·KL(p_B ‖ q_B)      KL summed over candidates, averaged over the batch

then ``queue_A ← r_A``, ``queue_B ← r_B`` (FIFO), after the logits and before backward. Because r_A is among its
own candidates, p_A is sharply peaked on the sentence itself: the other view must put its mass there.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from raydistill.objectives.base import LossOutput, check_dim, check_same_rows, frozen, take, validate_temperature
from raydistill.objectives.functional import mask_same_group_, query_soft_cross_entropy, softmax_blocks_
from raydistill.objectives.queue import InstanceQueue

__all__ = ["SCT_OBJECTIVES", "SCTDistillLoss", "SCTLoss", "SCTProjector", "cross_view_kl"]

SCT_OBJECTIVES = ("joint", "cd_only")


class SCTProjector(nn.Sequential):
    """SCT's projector h: ``blocks`` MLPs applied in sequence, each ``Linear(d → w·d) → ReLU → Linear(w·d → d)``
    (authors: 3 blocks, w = 10, no normalisation layers, no final activation). Lives in the loss: used for
    training only, never saved with the encoder."""

    def __init__(self, dim: int, expansion: int = 10, blocks: int = 3):
        if blocks < 1 or expansion < 1:
            raise ValueError(f"SCTProjector: blocks and expansion must be ≥ 1, got {blocks}, {expansion}")
        super().__init__(*[nn.Sequential(nn.Linear(dim, expansion * dim), nn.ReLU(), nn.Linear(expansion * dim, dim))
                           for _ in range(blocks)])


def cross_view_kl(online_a: Tensor, online_b: Tensor, reference_a: Tensor, reference_b: Tensor,
                  queue_a: InstanceQueue, queue_b: InstanceQueue, tau_teacher: float, tau_student: float,
                  groups: Tensor | None = None, mask_same_group: bool = True) -> tuple[Tensor, Tensor]:
    """(KL(p_A ‖ q_A), KL(p_B ‖ q_B)), each averaged over the batch (``KLDivLoss(reduction="batchmean")``), then
    enqueues r_A, r_B. ``online_*`` [B, d] with grad; ``reference_*`` [B, d], detached here. Inputs need not be
    normalised. ``groups`` [B]: the rows' group ids, queued with them; with ``mask_same_group`` a row's same-group
    candidates other than its positive leave both softmaxes (``functional.mask_same_group_``: a sibling caption
    as the other view)."""
    terms = []
    for online, reference, queue in ((online_b, reference_a, queue_a), (online_a, reference_b, queue_b)):
        reference = F.normalize(frozen(reference).float(), dim=1)  # [B, d]
        batch = reference.shape[0]
        student_queries = F.normalize(online.float(), dim=1) / tau_student  # [B, d], with grad
        with torch.no_grad():
            # Reference and student logits in one GEMM per block; the student's gradient is computed by
            # query_soft_cross_entropy (see functional.py).
            queries = torch.cat([reference / tau_teacher, student_queries])  # [2B, d]
            queue_logits, batch_logits = queue.scores(queries), queries @ reference.T  # [2B, K], [2B, B]
            if groups is not None and mask_same_group:
                mask_same_group_(queue_logits, batch_logits, queue.same_group(groups), groups)
            target_probs, neg_entropy = softmax_blocks_([queue_logits[:batch], batch_logits[:batch]],
                                                        with_neg_entropy=True)
        cross_entropy = query_soft_cross_entropy(student_queries, [queue.rows(), reference],
                                                 [queue_logits[batch:], batch_logits[batch:]], target_probs)  # [B]
        terms.append((cross_entropy + neg_entropy).mean())  # KL = CE − H(p)
    queue_a.enqueue(reference_a.detach(), groups)
    queue_b.enqueue(reference_b.detach(), groups)
    return terms[0], terms[1]


def _two_queues(queue, size: int, dim: int, init: str, seed: int, owner: str) -> tuple[InstanceQueue, InstanceQueue]:
    if queue is None:
        # Different seeds: two random queues that were equal would make the views' candidates identical.
        return (InstanceQueue(size, dim, init=init, seed=seed), InstanceQueue(size, dim, init=init, seed=seed + 1))
    if isinstance(queue, InstanceQueue) or not isinstance(queue, Sequence) or len(queue) != 2:
        raise TypeError(f"{owner}: needs TWO queues, one per view (queue=(queue_a, queue_b)); got {type(queue).__name__}. "
                        "A single shared queue cannot hold both views' reference vectors.")
    return queue[0], queue[1]


class SCTLoss(nn.Module):
    r"""SCT self-supervised loss (Limkonchotiwat et al., TACL 2023, arXiv:2311.03228), see the module docstring.

    Online vectors z = norm(h(f(x))) pass through the projector h (``SCTProjector``, trained with this module and
    discarded after training); reference vectors r = norm(f(x)) are the same encoder run again by the caller under
    ``no_grad`` *in train mode* (another dropout mask).

    features:
        ``"online_a"``, ``"online_b"``        [B, d]  f(x_A), f(x_B) with grad (before the projector)
        ``"reference_a"``, ``"reference_b"``  [B, d]  f(x_A), f(x_B) under no_grad, dropout on (detached here)
        ``"group"``                          [B]     optional group ids (``mask_same_group``)
    labels: unused.
    parts: ``kl_a`` (view B predicts A), ``kl_b`` (view A predicts B).

    Deliberate deviations from the authors' code (docs/methods.md, SCT): same-group candidates are masked (a sibling
    caption as the other view is a false negative, as in ``ConGenLoss``); ½·KL + ½·KL (paper) unless
    ``faithful=True`` sums them as the code does (2× gradient scale); queues are checkpointed buffers.

    Args:
        queue_size: K per view (paper: 131072 Tiny/Mini, 65536 Small/Base, 16384 Large).
        tau_teacher, tau_student: τ_T (reference), τ_S (online); paper Table 1, e.g. Small 0.02 / 0.03.
        dim: d, the encoder's output dim. faithful: sum the two KL terms (code) instead of averaging them (paper).
        projector_expansion, projector_blocks: w and the number of MLP blocks (10 and 3).
        queue: optional (queue_a, queue_b); queue_init / queue_seed: init of queues created here ("random" =
            the authors' normalised randn).
    """

    def __init__(self, queue_size: int = 65536, tau_teacher: float = 0.02, tau_student: float = 0.03, dim: int = 768,
                 faithful: bool = False, projector_expansion: int = 10, projector_blocks: int = 3,
                 queue: Sequence[InstanceQueue] | None = None, queue_init: str = "random", queue_seed: int = 0,
                 mask_same_group: bool = True):
        super().__init__()
        self.mask_same_group = bool(mask_same_group)
        self.tau_teacher = validate_temperature("SCTLoss", "tau_teacher", tau_teacher)
        self.tau_student = validate_temperature("SCTLoss", "tau_student", tau_student)
        self.faithful = bool(faithful)
        self.dim = int(dim)
        self.projector = SCTProjector(self.dim, projector_expansion, projector_blocks)
        self.queue_a, self.queue_b = _two_queues(queue, queue_size, self.dim, queue_init, queue_seed, "SCTLoss")

    def forward(self, features: dict[str, Tensor], labels: Tensor | None = None) -> LossOutput:
        online_a, online_b = take(features, "online_a", "SCTLoss"), take(features, "online_b", "SCTLoss")
        reference_a = take(features, "reference_a", "SCTLoss")
        reference_b = take(features, "reference_b", "SCTLoss")
        check_same_rows("SCTLoss", online_a=online_a, online_b=online_b, reference_a=reference_a,
                        reference_b=reference_b)
        check_dim("SCTLoss", self.dim, "", online_a=online_a, online_b=online_b, reference_a=reference_a,
                  reference_b=reference_b)
        kl_a, kl_b = cross_view_kl(self.projector(online_a), self.projector(online_b), reference_a, reference_b,
                                   self.queue_a, self.queue_b, self.tau_teacher, self.tau_student,
                                   features.get("group"), self.mask_same_group)
        loss = (1.0 if self.faithful else 0.5) * (kl_a + kl_b)
        return LossOutput(loss, {"kl_a": float(kl_a.detach()), "kl_b": float(kl_b.detach())})


class SCTDistillLoss(nn.Module):
    r"""SCT distillation (TACL 2023, §3.3, Eq. 3): cross-view distillation L_CD from a teacher, optionally joint
    with the self-supervised L_SCT.

    L_CD is the module docstring's cross-view term with the TEACHER's vectors of the two views as references (queues
    of teacher vectors, dim D) and the student's outputs, without projector, as online vectors: student(x_B)
    predicts the teacher's distribution of x_A over queue_A ++ teacher(x_A), and vice versa.

        objective="joint"   (default, paper Eq. 3):  L = L_SCT + L_CD
        objective="cd_only" (authors' code):          L = L_CD   (their student starts from a finished SCT model)

    In "joint", L_SCT is ``SCTLoss`` on the student's own outputs (projector + its own two reference queues, dim =
    the student's output dim), which needs the student's no-grad reference passes too.

    features:
        ``"student_a"``, ``"student_b"``      [B, D]  student(x_A), student(x_B), with grad
        ``"teacher_a"``, ``"teacher_b"``      [B, D]  teacher vectors (detached here)
        ``"reference_a"``, ``"reference_b"``  [B, D]  only for "joint": the student again under no_grad, dropout on
        ``"group"``                          [B]     optional group ids (``mask_same_group``, both terms)
    labels: unused.
    parts: ``cd_a``, ``cd_b`` and, for "joint", ``sct_a``, ``sct_b``.

    The student must output the teacher's dim D (a narrower one gets ``Linear(d_s → D) + tanh``, saved with it).

    Deliberate deviations from the authors' code (docs/methods.md, SCT):
    - Default objective "joint" (paper), not "cd_only" (code). L_SCT has its own temperatures (``sct_tau_*``,
      default 0.02 / 0.03, the paper's self-supervised Small row): its distributions are over other vectors than
      L_CD's, and the paper tunes them separately.
    - With the runtime's ``queue_init="teacher"`` (its default here, as ConGen's authors; SCT's start random) the
      teacher queues start from teacher vectors of sampled training sentences; L_SCT's own queues start random.
    - Same-group candidates are masked; ½·KL + ½·KL per term unless ``faithful=True``; and no unused projector is
      built for "cd_only" (the code builds three MLPs it never uses and optimises them).

    Args:
        queue_size, tau_teacher, tau_student: K and τ of L_CD (README: Small 131072, 0.04 / 0.05). dim: D.
        objective: "joint" or "cd_only".
        sct_tau_teacher, sct_tau_student: L_SCT's τ (default 0.02 / 0.03). sct_queue_size: its K (default: K).
        queue: optional (teacher_queue_a, teacher_queue_b); queue_init: how queues created here start ("random",
            the authors'; "teacher": empty until the runtime fills them with teacher vectors).
        mask_same_group: drop same-group candidates when the features carry ``"group"``.
    """

    def __init__(self, queue_size: int = 65536, tau_teacher: float = 0.04, tau_student: float = 0.05, dim: int = 768,
                 objective: str = "joint", faithful: bool = False, sct_tau_teacher: float = 0.02,
                 sct_tau_student: float = 0.03, sct_queue_size: int | None = None,
                 projector_expansion: int = 10, projector_blocks: int = 3,
                 queue: Sequence[InstanceQueue] | None = None, queue_init: str = "random", queue_seed: int = 0,
                 mask_same_group: bool = True):
        super().__init__()
        self.mask_same_group = bool(mask_same_group)
        if objective not in SCT_OBJECTIVES:
            raise ValueError(f"SCTDistillLoss: objective must be one of {SCT_OBJECTIVES}, got {objective!r}")
        self.objective = objective
        self.tau_teacher = validate_temperature("SCTDistillLoss", "tau_teacher", tau_teacher)
        self.tau_student = validate_temperature("SCTDistillLoss", "tau_student", tau_student)
        self.faithful = bool(faithful)
        self.dim = int(dim)
        self.queue_a, self.queue_b = _two_queues(queue, queue_size, self.dim, queue_init, queue_seed, "SCTDistillLoss")
        self.self_supervised = None
        if objective == "joint":
            self.self_supervised = SCTLoss(
                queue_size=sct_queue_size or queue_size, dim=self.dim, faithful=faithful,
                tau_teacher=sct_tau_teacher, tau_student=sct_tau_student,
                projector_expansion=projector_expansion, projector_blocks=projector_blocks,
                # its queues hold the student's own vectors: a teacher init does not apply to them
                queue_init="random" if queue_init == "teacher" else queue_init, queue_seed=queue_seed + 2,
                mask_same_group=mask_same_group)

    def forward(self, features: dict[str, Tensor], labels: Tensor | None = None) -> LossOutput:
        owner = "SCTDistillLoss"
        student_a, student_b = take(features, "student_a", owner), take(features, "student_b", owner)
        teacher_a, teacher_b = take(features, "teacher_a", owner), take(features, "teacher_b", owner)
        check_same_rows(owner, student_a=student_a, student_b=student_b, teacher_a=teacher_a, teacher_b=teacher_b)
        check_dim(owner, self.dim, " (the teacher dim; give the student projection_dim=teacher dim)",
                  student_a=student_a, student_b=student_b, teacher_a=teacher_a, teacher_b=teacher_b)
        parts: dict[str, float] = {}
        loss = torch.zeros((), device=student_a.device)
        if self.self_supervised is not None:
            if "reference_a" not in features or "reference_b" not in features:
                raise KeyError(f"{owner}: objective='joint' needs 'reference_a' and 'reference_b' (the student run "
                               "again under no_grad with dropout on); pass them, or use objective='cd_only'")
            sct = self.self_supervised({"online_a": student_a, "online_b": student_b,
                                        "reference_a": features["reference_a"], "reference_b": features["reference_b"],
                                        **({"group": features["group"]} if "group" in features else {})})
            loss = loss + sct.loss
            parts.update({f"sct_{k[-1]}": v for k, v in sct.parts.items()})
        cd_a, cd_b = cross_view_kl(student_a, student_b, teacher_a, teacher_b, self.queue_a, self.queue_b,
                                   self.tau_teacher, self.tau_student, features.get("group"), self.mask_same_group)
        loss = loss + (1.0 if self.faithful else 0.5) * (cd_a + cd_b)
        parts.update({"cd_a": float(cd_a.detach()), "cd_b": float(cd_b.detach())})
        return LossOutput(loss, parts)
