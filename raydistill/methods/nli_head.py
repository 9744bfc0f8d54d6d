"""DvBERT's teacher with a frozen transformer as a method of the engine: only the NLI head trains, on cached features.

    rows      (pooled, label, idx): the frozen transformer's ``pool_pair`` features [D] of the pairs of one
              teacher fold's training part (encoded once per teacher, shared by its folds), and their gold class
    student   ``build_head`` from ``init_model``: the fold's start head (drawn from the fold's seed, its
              standardisation fitted to the training rows' mean and spread), written there by the job
    loss      L = mean_i CE(y_i, softmax(head(x_i)))                 (objectives.LogitCrossEntropyLoss)
    dev       accuracy x 100 on the fold's held-out rows (``extra.heldout``); reported, not used for selection

``methods.nli_teacher`` is the fine-tuned variant and says why the job keeps the last step's model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from raydistill.config.job import JobConfig
from raydistill.methods.base import Features, MethodSpec, StepContext
from raydistill.methods.nli_teacher import NLITeacherStageSettings, _heldout, build_head
from raydistill.methods.sts_cosine import rows_method
from raydistill.objectives import LogitCrossEntropyLoss

__all__ = ["SPEC", "NLIHeadStageSpec", "START_HEAD"]

# The start head in ``init_model`` (a state dict: weights and standardisation).
START_HEAD = "nli_head.pt"


def pooled_class_features(ctx: StepContext, batch) -> Features:
    """The head's class logits [B, 3] of the rows' cached features and the gold classes."""
    return {"logits": ctx.student(ctx.tensor(batch["pooled"]))}, ctx.tensor(batch["label"], dtype=torch.long)


@dataclass(frozen=True)
class NLIHeadStageSpec(MethodSpec):
    def build_student(self, cfg: JobConfig, *, teacher_dim: int | None = None, init_model: str | None = None):
        if init_model is None:
            raise ValueError(f"{self.name}: a head fold starts from the head the job wrote (init_model)")
        # weights_only: a start head is data, and a pickled object in it must not run code when loaded
        state = torch.load(Path(init_model) / START_HEAD, map_location="cpu", weights_only=True)
        training = cfg.extra.teacher_training
        head = build_head(int(state["shift"].numel()), training.head_hidden, training.dropout)
        head.load_state_dict(state)
        return head

    def heldout_probs(self, cfg: JobConfig, student) -> np.ndarray:
        from raydistill.models.batching import inference

        with inference(student):
            logits = student(torch.as_tensor(_heldout(cfg)["pooled"], device=next(student.parameters()).device))
            return torch.softmax(logits.float(), dim=-1).cpu().numpy().astype(np.float32)

    def dev_score(self, cfg: JobConfig, student) -> float:
        probs = self.heldout_probs(cfg, student)
        return 100.0 * float((probs.argmax(axis=1) == _heldout(cfg)["label"]).mean())


SPEC = rows_method(
    NLIHeadStageSpec,
    name="nli-head",
    summary="DvBERT teacher fold, frozen transformer: an NLI head trained with cross-entropy on cached features "
            "(run by the dvbert job)",
    loss_class=LogitCrossEntropyLoss,
    batch_to_features=pooled_class_features,
    extra_settings=NLITeacherStageSettings,
    # AdamW's default eps: the engine's 1e-6 would damp the head's small second moments.
    optimizer={"eps": 1e-8},
    student_sentences_per_row=2,
    dataset="nli_teacher_folds",
    internal=True,
)
