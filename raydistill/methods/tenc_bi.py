"""Trans-Encoder's cross -> bi stage as a method of the engine: a bi-encoder learns the cross-encoders' labels.

    rows      (text_a, text_b, score): every pair of the stage's label set once, its label as the target (the
              cosine is symmetric: one order is all there is to learn)
    student   a ``BiEncoder`` from ``init_model`` (the start checkpoint, or the family's previous model) with the
              family's pooling (``extra.pooling``: a saved cross-encoder carries none)
    loss      L = mean_i (cos(bi(s1_i), bi(s2_i)) − y_i)²          (objectives.CosineMSELoss; y in (0, 1))
    dev       ``extra.dev_set`` Spearman x 100 of the cosine, under bf16 autocast when ``train.precision`` is bf16

The Trans-Encoder job (``runtime.tenc``) builds the rows from a label set and runs the stage through
``LearnerGroup.fit``; ``tenc_cross`` is the other stage. The stage's identity (labels, start, cycle) rides in
``extra.stage``, which the config hash covers, so only the same stage resumes its checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from raydistill.config.job import JobConfig
from raydistill.config.schema import Int, section
from raydistill.methods.base import ExtraSettings, MethodSpec
from raydistill.methods.sts_cosine import pair_score_features, rows_method
from raydistill.objectives import CosineMSELoss

__all__ = ["SPEC", "TransEncoderStageSettings", "TransEncoderStageSpec", "new_bi_encoder", "stage_dev_score"]


@section
class TransEncoderStageSettings(ExtraSettings):
    """``extra:`` of a Trans-Encoder stage (set by the Trans-Encoder job from its config, not by hand)."""

    pooling: str | None = Field(None, description="bi-encoder pooling (null: the start checkpoint's own)")
    head: Literal["classifier", "segment_cosine"] | None = Field(None, description="cross-encoder head (null: "
                                                                                   "classifier)")
    dev_set: str = Field("stsb_dev", description="model selection set of the stage")
    eval_batch_size: Int = Field(128, gt=0, description="pairs per forward pass of the dev evaluation")
    stage: dict[str, Any] | None = Field(None, description="what the stage trains on (cycle, labels digest, start "
                                                           "checkpoint): hashed, so only the same stage resumes "
                                                           "its checkpoints")


@dataclass(frozen=True)
class TransEncoderStageSpec(MethodSpec):
    """A Trans-Encoder stage: ``encoder`` ("bi" or "cross") is the kind of student it trains and evaluates."""

    encoder: str = "bi"

    def training_columns(self, sentence1: list[str], sentence2: list[str], labels: np.ndarray,
                         label_scaling: str) -> dict[str, np.ndarray]:
        """The stage's rows (``text_a``, ``text_b``, ``score``) from a label set's pairs and labels."""
        return {"text_a": np.asarray(sentence1, dtype=object), "text_b": np.asarray(sentence2, dtype=object),
                "score": np.asarray(labels, dtype=np.float32)}

    def build_student(self, cfg: JobConfig, *, teacher_dim: int | None = None, init_model: str | None = None):
        if init_model is None:
            raise ValueError(f"{self.name}: a Trans-Encoder stage starts from a checkpoint (init_model)")
        return new_bi_encoder(init_model, cfg.extra.pooling, cfg.data.max_length)

    def scorer(self, student):
        """What ``raydistill.evaluation`` evaluates: the bi-encoder itself."""
        return student

    def dev_score(self, cfg: JobConfig, student) -> float:
        return stage_dev_score(self, student, cfg.extra.dev_set, cfg.extra.eval_batch_size,
                               bf16=cfg.train.precision == "bf16")


def stage_dev_score(spec: TransEncoderStageSpec, student, dev_set: str, batch_size: int, *, bf16: bool) -> float:
    """``dev_set`` Spearman x 100 of a stage's student as ``spec`` scores it (the bi-encoder's cosine, or the
    symmetrised cross-encoder), under bf16 autocast when ``bf16``: the engine's model selection inside a stage and
    the job's measurement of a held model are this one computation."""
    from raydistill.evaluation import evaluate_sts

    device = next(student.parameters()).device.type
    with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=bf16):
        scores = evaluate_sts(spec.scorer(student), sets=(dev_set,), encoder=spec.encoder, batch_size=batch_size,
                              progress=False)
    return float(scores[dev_set])


def new_bi_encoder(checkpoint: str, pooling: str | None, max_length: int):
    """A stage's bi-encoder from ``checkpoint`` (a bi- or a cross-encoder directory, or a preset)."""
    from raydistill.models import BiEncoder

    return BiEncoder.from_pretrained(str(checkpoint), pooling=pooling, max_length=int(max_length))


SPEC = rows_method(
    TransEncoderStageSpec,
    name="tenc-bi",
    summary="Trans-Encoder cross -> bi stage: cosine MSE to the cross-encoders' labels (run by the tenc job)",
    loss_class=CosineMSELoss,
    batch_to_features=pair_score_features,
    extra_settings=TransEncoderStageSettings,
    student_sentences_per_row=2,
    dataset="tenc_labels",
    internal=True,
    nonfinite_hint="lower the job's bi.lr, or set bi.precision: fp32",
    encoder="bi",
)
