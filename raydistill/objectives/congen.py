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

    The teacher embeds the control view x₁ of each sentence; the student embeds both views x₁ (control) and x₂
    (generalisation, another augmentation of the same sentence). Over the candidates Q = queue ++ current
    teacher batch (the batch appended LAST), the student's similarity distributions must match the teacher's:

        t   = norm(teacher(x₁))                      [B, D]   constant
        c   = norm(student(x₁)),  g = norm(student(x₂))       [B, D]   with grad
        P_T = softmax(t·Qᵀ / τ_T)                    [B, K+B]
        L   = α · CE(P_T, softmax(c·Qᵀ / τ_S)) + (1 − α) · CE(P_T, softmax(g·Qᵀ / τ_S))

    CE is summed over the K+B candidates and averaged over the batch. After the logits, the teacher batch is
    enqueued (FIFO, the oldest B rows drop out), before ``backward``.

    features:
        ``"student_control"``    [B, D]  student(x₁), with grad (not necessarily normalised)
        ``"student_generalize"`` [B, D]  student(x₂), with grad
        ``"teacher"``            [B, D]  teacher(x₁); detached here whatever the caller passed
        ``"group"``              [B]     optional int64 group ids of the sentences (the image of a caption);
                                         with ``mask_same_group``, candidates of a row's own group other than its
                                         positive are dropped from its softmax, for the teacher and both views
    labels: unused.
    parts: ``con``, ``gen`` (the two CE terms), ``queue_fill`` (rows in the queue, as a fraction of K).

    Dimensions: the student must output the teacher's dim D. When its encoder is narrower, the projection
    ``Linear(d_s → D) + tanh`` belongs to the student model (``BiEncoder.from_pretrained(path,
    projection_dim=D)``, saved with it, as the authors' ``Dense`` module), not to this loss; the runtime builds
    the student that way (``MethodSpec.build_student``). A mismatch raises an error that says so.

    Deliberate deviations from the authors' code (docs/methods.md, ConGen):
    - α is a parameter (default 0.5 = the paper's best and the code's hard-coded value).
    - Same-group candidates are masked (``mask_same_group``, on by default). The authors' generalisation view is a
      back-translation, which is never a training row itself. Here it can be another caption of the same image,
      c_j, which IS a training row; when t(c_j) sits among row i's candidates, the generalisation term asks
      student(c_j) to rank t(c_i) far above t(c_j), against c_j's own control term. The queue rows carry their
      sentence's group id, and a row's same-group candidates (its own earlier copy included) leave its softmax.
      Rows without a group (id < 0) are never masked, so the authors' loss is unchanged for them.
    - The queue is a ring buffer written in place, scored as [queue | batch] column blocks; no (K+B)×d concat
      per step. Identical values (candidate order does not change a softmax). The teacher's and both student
      views' logits come from one stacked GEMM, and the student gradient from ``query_soft_cross_entropy``
      (bench/objectives.py: the loss is GEMM-bound, three B×K×D products per step).
    - ``precision="bf16"`` computes the products against the queue in bfloat16 (see Args).
    - Queue init: the runtime's default ``queue_init="teacher"`` is the authors' (teacher vectors of sampled
      training sentences, put in by ``queue.init_from`` before step 1; here an empty queue until then); "random"
      unit vectors otherwise. The authors also drop the sampled sentences from the training set; here they stay
      (with a corpus smaller than K that would drop all of it), and the group mask keeps a row's own queued copy
      out of its candidates instead.
    - The queue is a registered buffer: checkpointed and resumable (the authors' is a plain attribute).

    Args:
        queue_size: K (paper Table 7: 1024–65536; authors' default 16534 is a typo for 16384).
        tau_teacher, tau_student: τ_T, τ_S (paper: 0.05/0.07 for most students, 0.05/0.05 for the tiniest).
        dim: D, the teacher dim (= queue dim).
        alpha: weight of the control term.
        queue: an existing InstanceQueue (e.g. a shared-queue client); else one is created.
        queue_init, queue_seed: init of the queue created here (see InstanceQueue).
        mask_same_group: drop same-group candidates when the features carry ``"group"`` (see above).
        precision: "fp32", or "bf16": the [3B, K] logits of the teacher and both student views against the queue
            (and the student's gradient through them) come from bfloat16 products against a bf16 copy of the queue
            that ``InstanceQueue`` keeps in step (no K×D cast per step); the products accumulate in fp32 and round
            their output to bf16, and every softmax, P_T included, is computed in fp32 from them. The runtime passes
            ``train.precision``. At K = 65536 those products are a third of an fp32 ConGen step on this CPU and
            bf16 runs them ~4x faster on AVX512-BF16 (bench/train_step.py). What rounding does to the targets
            (bench/precision.py, mpnet-base vectors of the job's captions, τ_T = 0.05): logits move by 0.003 on
            average (0.036 at most), KL(P_T fp32 ‖ P_T bf16) = 1.1e-4 nats per row against an entropy of 3.7.
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
