"""DvBERT: dual-view distilled BERT — siamese student, cross-encoder (interaction view) teachers, teacher annealing.

Paper: Xingyi Cheng. "Dual-View Distilled BERT for Sentence Embedding", SIGIR 2021, arXiv:2104.08675 (no public
code). What it specifies, and what this module computes:

* Siamese view (the student): mean-pooled BERT embeddings u, v; ``[u; v; |u − v|]`` → one fully connected layer →
  3-way softmax p (SBERT's classifier, Reimers & Gurevych, EMNLP 2019).
* Interaction view (the teachers, ``raydistill.methods.dvbert_teachers``): K cross-encoders fine-tuned on the
  labelled NLI pairs, whose class distributions q_k on the training pairs are then held fixed.
* Loss with teacher annealing (Clark et al., ACL 2019, arXiv:1907.04829): ``L = Σ_k KL(λ·y + (1 − λ)·q_k ‖ p)``,
  λ rising linearly from 0 to 1 over training. Since KL(t ‖ p) = CE(t, p) − H(t), H(t) does not depend on the
  student, and CE is linear in its target t, ``Σ_k CE(λ·y + (1 − λ)·q_k, p) = K · CE(λ·y + (1 − λ)·mean_k q_k, p)``:
  the CE against the mixed mean target computed here has the paper's gradients up to the constant factor K.
* Schedule: NLI 1 epoch, batch 16, dropout 0.1, Adam lr 2e-5, 10 % warm-up; then STS-B, cos(u, v) regressed on the
  gold score with MSE for 4 epochs (``CosineMSELoss``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from raydistill.objectives.base import LossOutput, check_same_rows, frozen, take

__all__ = ["DvBERTLoss", "SoftmaxClassifierLoss", "TeacherAnnealing", "annealed_target"]


class TeacherAnnealing:
    """λ(step) of teacher annealing (BAM!): rises linearly from 0 at step 0 to 1 at ``total_steps`` (clamped), so the
    student imitates the teachers early on and the gold labels at the end; advanced once per optimiser step."""

    def __init__(self, total_steps: int):
        if int(total_steps) <= 0:
            raise ValueError(f"TeacherAnnealing: total_steps must be positive, got {total_steps}")
        self.total_steps = int(total_steps)

    def __call__(self, step: int) -> float:
        return min(1.0, max(0.0, float(step) / self.total_steps))


def annealed_target(gold: Tensor, teacher: Tensor, lam: float) -> Tensor:
    """``λ·onehot(gold) + (1 − λ)·mean_k softmax(teacher_k)`` → [B, C].

    ``gold``: [B] class indices. ``teacher``: [B, T, C] logits of T teachers (averaged after their softmax) or
    [B, C] probabilities already averaged. The mean is exact (CE is linear in its target: module docstring).
    Detached: the target carries no gradient.
    """
    teacher = frozen(teacher)
    probs = F.softmax(teacher.float(), dim=-1).mean(dim=1) if teacher.dim() == 3 else teacher.float()  # [B, C]
    if gold.dim() != 1 or gold.shape[0] != probs.shape[0]:
        raise ValueError(f"annealed_target: gold must be [B] class indices with B = {probs.shape[0]}, "
                         f"got {tuple(gold.shape)}")
    onehot = F.one_hot(gold.long(), num_classes=probs.shape[1]).to(probs.dtype)  # [B, C]
    return lam * onehot + (1.0 - lam) * probs


class SoftmaxClassifierLoss(nn.Module):
    r"""SBERT's softmax loss, with hard or soft labels: a classifier over ``[u; v; |u − v|]``.

        logits = W [u; v; |u−v|] + b        W: Linear(3d → C)   (inside this module, trained, not saved)
        L      = mean_i CE(y_i, softmax(logits_i)) = −mean_i Σ_c y_ic log softmax(logits_i)_c

    With a soft target y, CE(y, q) = KL(y ‖ q) + H(y): the same gradients as the KL, shifted by the target's
    entropy, which does not depend on the student.

    features: ``"u"``, ``"v"`` [B, d] the two sentences' embeddings, with grad.
    labels: [B] class indices (gold), or [B, C] target distributions (e.g. ``annealed_target``).
    parts: ``ce``, ``accuracy`` (argmax of the logits vs the gold class, or the argmax of soft labels).
    """

    def __init__(self, dim: int, num_labels: int = 3):
        super().__init__()
        self.dim, self.num_labels = int(dim), int(num_labels)
        self.classifier = nn.Linear(3 * self.dim, self.num_labels)

    def logits(self, u: Tensor, v: Tensor) -> Tensor:
        return self.classifier(torch.cat([u, v, (u - v).abs()], dim=1))  # [B, C]

    def _loss(self, features: dict[str, Tensor], target: Tensor, owner: str,
              gold: Tensor | None = None) -> tuple[Tensor, dict[str, float]]:
        u, v = take(features, "u", owner), take(features, "v", owner)
        check_same_rows(owner, u=u, v=v, labels=target)
        log_probs = F.log_softmax(self.logits(u, v).float(), dim=1)  # [B, C]
        if target.dim() == 1:
            loss = F.nll_loss(log_probs, target.long())
            gold = target.long() if gold is None else gold
        else:
            if target.shape[1] != self.num_labels:
                raise ValueError(f"{owner}: soft labels must be [B, {self.num_labels}], got {tuple(target.shape)}")
            loss = -(frozen(target).to(log_probs.dtype) * log_probs).sum(dim=1).mean()
            gold = target.argmax(dim=1) if gold is None else gold
        accuracy = (log_probs.argmax(dim=1) == gold).float().mean()
        return loss, {"ce": float(loss.detach()), "accuracy": float(accuracy)}

    def forward(self, features: dict[str, Tensor], labels: Tensor | None = None) -> LossOutput:
        if labels is None:
            raise ValueError("SoftmaxClassifierLoss: labels ([B] classes or [B, C] distributions) are required")
        loss, parts = self._loss(features, labels, "SoftmaxClassifierLoss")
        return LossOutput(loss, parts)


class DvBERTLoss(SoftmaxClassifierLoss):
    r"""DvBERT's NLI stage (Cheng, SIGIR 2021, arXiv:2104.08675): the siamese view learns from the interaction
    view's teachers with teacher annealing.

        y_i = λ(step) · onehot(gold_i) + (1 − λ(step)) · mean_k softmax(teacher_k(a_i, b_i))
        L   = mean_i CE(y_i, softmax(W [u_i; v_i; |u_i − v_i|]))

    λ is ``TeacherAnnealing(total_steps)`` at the number of training-mode forward passes so far, kept in the buffer
    ``steps_done`` (checkpointed with the loss, so a resumed run continues the schedule). The paper's loss,
    Σ_k KL(λ·y + (1 − λ)·q_k ‖ p), has the same gradients times K (module docstring).

    features: ``"u"``, ``"v"`` [B, d] with grad; ``"teacher_logits"`` [B, T, C] (T cross-encoder teachers) or
        ``"teacher_probs"`` [B, C] (already averaged probabilities). Teacher inputs are detached here.
    labels: [B] gold class indices.
    parts: ``ce``, ``accuracy``, ``lambda``.
    """

    def __init__(self, dim: int, total_steps: int, num_labels: int = 3):
        super().__init__(dim, num_labels)
        self.annealing = TeacherAnnealing(total_steps)
        self.register_buffer("steps_done", torch.zeros((), dtype=torch.long))

    def forward(self, features: dict[str, Tensor], labels: Tensor | None = None) -> LossOutput:
        if labels is None or labels.dim() != 1:
            raise ValueError("DvBERTLoss: labels must be the [B] gold class indices")
        teacher = (take(features, "teacher_logits", "DvBERTLoss", ndim=3) if "teacher_logits" in features
                   else take(features, "teacher_probs", "DvBERTLoss"))
        lam = self.annealing(int(self.steps_done))
        target = annealed_target(labels, teacher, lam)  # [B, C]
        loss, parts = self._loss(features, target, "DvBERTLoss", gold=labels.long())
        if self.training:
            self.steps_done += 1
        parts["lambda"] = lam
        return LossOutput(loss, parts)
