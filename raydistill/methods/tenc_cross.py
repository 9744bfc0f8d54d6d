"""Trans-Encoder's bi -> cross stage as a method of the engine: a cross-encoder learns the bi-encoders' labels.

    rows      (text_a, text_b, score): every pair of the stage's label set in both orders with the same target
              t(y) = cosine_to_target(y, label_scaling) (the authors' bi -> cross stage trains both orders too)
    student   a ``CrossEncoder`` from ``init_model`` with one logit and the configured head (``extra.head``, not a
              saved one: a sequential stage starts from the previous model's weights); a new head is drawn from
              the torch RNG the learner seeded with ``seed`` (the stage's seed)
    loss      L = mean_i BCEWithLogits(cross(a_i, b_i), t_i)                (objectives.SoftBCELoss)
    dev       ``extra.dev_set`` Spearman x 100 of the symmetrised score (sigmoid(cross(a, b)) + sigmoid(cross(b,
              a))) / 2 (``SymmetricCrossScorer``): the score this cross-encoder hands the bi-encoders as labels

``tenc_bi`` holds what the two stages share (``TransEncoderStageSpec``, the ``extra:`` schema).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from raydistill.config.job import JobConfig
from raydistill.methods.base import Features, StepContext
from raydistill.methods.sts_cosine import rows_method
from raydistill.methods.tenc_bi import TransEncoderStageSettings, TransEncoderStageSpec
from raydistill.objectives import SoftBCELoss

__all__ = ["SPEC", "SymmetricCrossScorer", "new_cross_encoder"]


class SymmetricCrossScorer:
    """A cross-encoder seen as an order-free pair scorer: the mean of sigmoid(cross(a, b)) and sigmoid(cross(b, a)).
    ``raydistill.evaluation`` treats it as a cross-encoder (it has ``score(pairs, batch_size)``), so the evaluation
    scores what the cross-encoder hands the bi-encoders as labels."""

    def __init__(self, cross_encoder):
        self.cross_encoder = cross_encoder

    def score(self, pairs: list[tuple[str, str]], batch_size: int = 64) -> np.ndarray:
        pairs = [(a, b) for a, b in pairs]
        forward = self.cross_encoder.score(pairs, batch_size=batch_size, activation="sigmoid")  # [N]
        backward = self.cross_encoder.score([(b, a) for a, b in pairs], batch_size=batch_size,
                                            activation="sigmoid")  # [N]
        return ((forward.astype(np.float64) + backward.astype(np.float64)) / 2.0).astype(np.float32)


def pair_logit_features(ctx: StepContext, batch) -> Features:
    """Both sentences of a row in one sequence: the student's logit [B] and the row's target."""
    pairs = [(str(a), str(b)) for a, b in zip(batch["text_a"], batch["text_b"])]
    features = {name: value.to(ctx.device) for name, value in ctx.student.tokenize(pairs).items()}
    return {"logits": ctx.student(features)}, ctx.tensor(batch["score"])


@dataclass(frozen=True)
class _CrossStageSpec(TransEncoderStageSpec):
    def training_columns(self, sentence1: list[str], sentence2: list[str], labels: np.ndarray,
                         label_scaling: str) -> dict[str, np.ndarray]:
        from raydistill.objectives.trans_encoder import cosine_to_target

        targets = np.asarray(cosine_to_target(np.asarray(labels, dtype=np.float32), label_scaling),
                             dtype=np.float32)  # [N]
        return {"text_a": np.asarray(list(sentence1) + list(sentence2), dtype=object),
                "text_b": np.asarray(list(sentence2) + list(sentence1), dtype=object),
                "score": np.concatenate([targets, targets])}

    def build_student(self, cfg: JobConfig, *, teacher_dim: int | None = None, init_model: str | None = None):
        if init_model is None:
            raise ValueError(f"{self.name}: a Trans-Encoder stage starts from a checkpoint (init_model)")
        return new_cross_encoder(init_model, cfg.data.max_length, cfg.extra.head)

    def scorer(self, student):
        return SymmetricCrossScorer(student)


def new_cross_encoder(checkpoint: str, max_length: int, head: str | None):
    """A stage's cross-encoder from ``checkpoint`` with one logit and ``head`` (None: classifier)."""
    from raydistill.models import CrossEncoder

    return CrossEncoder.from_pretrained(str(checkpoint), num_labels=1, max_length=int(max_length),
                                        head=head or "classifier")


SPEC = rows_method(
    _CrossStageSpec,
    name="tenc-cross",
    summary="Trans-Encoder bi -> cross stage: soft BCE on both orders to the bi-encoders' labels (run by the tenc "
            "job)",
    loss_class=SoftBCELoss,
    batch_to_features=pair_logit_features,
    extra_settings=TransEncoderStageSettings,
    student_sentences_per_row=2,
    dataset="tenc_labels",
    internal=True,
    nonfinite_hint="lower the job's cross.lr, or set cross.precision: fp32",
    encoder="cross",
)
