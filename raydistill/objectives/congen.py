"""ConGen: control + generalisation distillation over an instance queue of teacher embeddings.

Paper: Peerat Limkonchotiwat, Wuttikorn Ponwitayarat, Lalita Lowphansirikul, Can Udomcharoenchaikit, Ekapol
Chuangsuwanich, Sarana Nutanong. "ConGen: Unsupervised Control and Generalization Distillation For Sentence
Representation". Findings of EMNLP 2022 (ACL Anthology 2022.findings-emnlp.483; no arXiv version was found).
Code: github.com/KornWtp/ConGen.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from raydistill.objectives.base import LossOutput, check_dim, check_same_rows, frozen, take, validate_temperature
from raydistill.objectives.functional import Workspace, mask_same_group_, query_soft_cross_entropy, softmax_blocks_
from raydistill.objectives.queue import InstanceQueue

__all__ = ["ConGenLoss"]


class ConGenLoss(nn.Module):
    r"""ConGen (Limkonchotiwat et al., Findings of EMNLP 2022, ACL Anthology 2022.findings-emnlp.483).

    The teacher embeds the control view x₁ of each sentence; the student embeds x₁ (control) and x₂
    (generalisation, another augmentation of the same sentence). Over the candidates Q = queue ++ current teacher
    batch (appended LAST), the student's similarity distributions must match the teacher's:

        t   = norm(teacher(x₁))                      [B, D]   constant
        c   = norm(student(x₁)),  g = norm(student(x₂))       [B, D]   with grad
        P_T = softmax(t·Qᵀ / τ_T)                    [B, K+B]
        L   = α · CE(P_T, softmax(c·Qᵀ / τ_S)) + (1 − α) · CE(P_T, softmax(g·Qᵀ / τ_S))

    CE is summed over the K+B candidates and averaged over the batch. After the logits, before ``backward``, the
    teacher batch is enqueued (FIFO, the oldest B rows drop out).

    features:
        ``"student_control"``    [B, D]  student(x₁), with grad (not necessarily normalised)
        ``"student_generalize"`` [B, D]  student(x₂), with grad
        ``"teacher"``            [B, D]  teacher(x₁); detached here whatever the caller passed
        ``"group"``              [B]     optional int64 group ids (the image of a caption): with
                                         ``mask_same_group``, a row's own-group candidates other than its positive
                                         leave its softmax, for the teacher and both views
    labels: unused.
    parts: ``con``, ``gen`` (the two CE terms), ``queue_fill`` (rows in the queue, as a fraction of K).

    The student must output the teacher's dim D: a narrower encoder's ``Linear(d_s → D) + tanh`` belongs to the
    student model (``projection_dim=D``, saved with it, as the authors' ``Dense``; ``MethodSpec.build_student``).

    Deliberate deviations from the authors' code (docs/methods.md, ConGen, says why at length):
    - α is a parameter (default 0.5 = the paper's best and the code's hard-coded value).
    - Same-group candidates are masked (``mask_same_group``): the authors' generalisation view is a back-translation,
      never a training row; here it can be a sibling caption c_j, which IS one, and t(c_j) among row i's candidates
      would make the generalisation term fight c_j's own control term. Rows without a group (id < 0) are unmasked.
    - The queue is a registered ring buffer (checkpointed), written in place and scored as [queue | batch] blocks;
      the teacher's and both views' logits come from one stacked GEMM (bench/objectives.py: GEMM-bound).
    - Queue init: the runtime's default ``queue_init="teacher"`` is the authors' (teacher vectors of sampled
      training sentences, filled by ``queue.init_from`` before step 1). The authors also drop the sampled sentences
      from the training set; here they stay (a corpus smaller than K would lose all of it), and the group mask
      keeps a row's own queued copy out of its candidates instead.

    Args:
        queue_size: K (paper Table 7: 1024–65536; authors' default 16534 is a typo for 16384).
        tau_teacher, tau_student: τ_T, τ_S (paper: 0.05/0.07 for most students, 0.05/0.05 for the tiniest).
        dim: D, the teacher dim (= queue dim). alpha: weight of the control term.
        queue: an existing InstanceQueue (e.g. a shared-queue client), else one is created with ``queue_init``,
            ``queue_seed``. mask_same_group: drop same-group candidates when the features carry ``"group"``.
        precision: "fp32", or "bf16" (the runtime passes ``train.precision``): the [3B, K] logits against the queue
            (and the student's gradient through them) come from bf16 products against ``InstanceQueue``'s bf16 copy
            (fp32 accumulation, output rounded to bf16); every softmax is fp32. At K = 65536 those products are a
            third of an fp32 step, ~4x faster in bf16 on AVX512-BF16 (bench/train_step.py); rounding moves logits
            by 0.003 on average (bench/precision.py: KL(P_T fp32 ‖ P_T bf16) = 1.1e-4 nats per row, entropy 3.7).
    """

    def __init__(self, queue_size: int = 16384, tau_teacher: float = 0.05, tau_student: float = 0.07,
                 dim: int = 768, alpha: float = 0.5, queue: InstanceQueue | None = None,
                 queue_init: str = "random", queue_seed: int = 0, precision: str = "fp32",
                 mask_same_group: bool = True):
        super().__init__()
        if precision not in ("fp32", "bf16"):
            raise ValueError(f"ConGenLoss: precision must be 'fp32' or 'bf16', got {precision!r}")
        self.product_dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        self.tau_teacher = validate_temperature("ConGenLoss", "tau_teacher", tau_teacher)
        self.tau_student = validate_temperature("ConGenLoss", "tau_student", tau_student)
        if not 0.0 <= float(alpha) <= 1.0:
            raise ValueError(f"ConGenLoss: alpha must be in [0, 1], got {alpha}")
        self.alpha = float(alpha)
        self.mask_same_group = bool(mask_same_group)
        self.queue = queue if queue is not None else InstanceQueue(queue_size, dim, init=queue_init, seed=queue_seed)
        self.dim = self.queue.dim
        self.workspace = Workspace()  # the [3B, K] logits, reused step after step (functional.Workspace)

    def forward(self, features: dict[str, Tensor], labels: Tensor | None = None) -> LossOutput:
        control = take(features, "student_control", "ConGenLoss")
        generalize = take(features, "student_generalize", "ConGenLoss")
        teacher = frozen(take(features, "teacher", "ConGenLoss", aliases=("teacher_control",)))
        batch = check_same_rows("ConGenLoss", student_control=control, student_generalize=generalize, teacher=teacher)
        check_dim("ConGenLoss", self.dim, " (the teacher dim; give the student projection_dim=teacher dim)",
                  student_control=control, student_generalize=generalize, teacher=teacher)

        row_groups = features.get("group")  # [B] int64 or None; queued with the rows either way
        groups = row_groups if self.mask_same_group else None
        teacher = F.normalize(teacher.float(), dim=1)  # [B, D]
        # Both student views share the candidates and P_T: rows [0, B) control, [B, 2B) generalisation.
        student_queries = torch.cat([F.normalize(control.float(), dim=1),
                                     F.normalize(generalize.float(), dim=1)]) / self.tau_student  # [2B, D]
        with torch.no_grad():
            # No graph: query_soft_cross_entropy computes the student's gradient itself. The GEMMs against the
            # queue are ~90 % of the loss on CPU: the teacher's and both views' logits come from ONE of them.
            queries = torch.cat([teacher / self.tau_teacher, student_queries])  # [3B, D]
            batch_logits = queries @ teacher.T  # [3B, B]
            queue_keys = self.queue.rows(self.product_dtype)  # [K, D]; bf16: the queue's copy, kept in step
            shape = (queries.shape[0], queue_keys.shape[0])
            queue_logits = self.workspace.get("queue_logits", shape, torch.float32, queries.device)  # [3B, K]
            if self.product_dtype == torch.float32:
                self.queue.scores(queries, out=queue_logits)
            else:  # softmaxes in fp32, from the bf16 products
                queue_logits.copy_(self.queue.scores(queries, self.product_dtype, out=self.workspace.get(
                    "queue_logits_low", shape, self.product_dtype, queries.device)))
            if groups is not None:  # the same candidates leave the teacher's and both views' softmaxes
                mask_same_group_(queue_logits, batch_logits, self.queue.same_group(groups), groups)
            teacher_queue_logits, student_queue_logits = queue_logits[:batch], queue_logits[batch:]
            # P_T over [queue | current teacher batch], in place over the teacher rows.
            teacher_probs, _ = softmax_blocks_([teacher_queue_logits, batch_logits[:batch]])
        per_row = query_soft_cross_entropy(student_queries, [queue_keys, teacher],
                                           [student_queue_logits, batch_logits[batch:]], teacher_probs,
                                           workspace=self.workspace)  # [2B]
        con, gen = per_row[:batch].mean(), per_row[batch:].mean()
        loss = self.alpha * con + (1.0 - self.alpha) * gen

        fill = min(self.queue.size, len(self.queue) + batch) / self.queue.size
        self.queue.enqueue(teacher, row_groups)  # after the logits, before backward (authors' order); no queue read after this
        return LossOutput(loss, {"con": float(con.detach()), "gen": float(gen.detach()), "queue_fill": fill})
