"""DvBERT (Cheng, "Dual-View Distilled BERT for Sentence Embedding", SIGIR 2021, arXiv:2104.08675): a siamese
student learns NLI from K cross-encoder teachers' soft labels with teacher annealing, then STS-B
(``sts_cosine.py``).

    target = λ·y + (1 − λ)·mean_k q_k(a, b)              # λ: 0 → 1 over training
    L      = CE(target, softmax(W [u; v; |u − v|]))

Rows: the ``nli_teacher_labels`` set: the labelled NLI pairs with the teachers' mean out-of-fold class
distribution, built by the runtime (raydistill.runtime.jobs.dvbert_teachers) from ``extra.teachers`` and
``extra.teacher_training`` (``TeacherTraining`` below).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any, Literal

import torch
from pydantic import AfterValidator, Field, StrictBool

from raydistill.config.job import JobConfig
from raydistill.config.schema import Int, Number, build, section
from raydistill.methods.base import Features, LossSettings, MethodSpec, StagedExtraSettings, StepContext
from raydistill.objectives import DvBERTLoss

__all__ = ["SPEC", "TeacherTraining", "DvBERTLossSettings", "DvBERTExtraSettings", "DVBERT_TEACHERS", "HEADS",
           "PRECISIONS"]

DVBERT_TEACHERS = ("minilm-l6", "bert-small")
HEADS = ("cls", "mean", "segments", "aligned")
PRECISIONS = ("fp32", "bf16")

# Fields that judge the teachers rather than shape them: not part of the cache key, so changing the bar never
# retrains anything.
_JUDGING_FIELDS = ("min_accuracy",)


@section
class TeacherTraining:
    """How each cross-encoder teacher is fine-tuned and judged (``extra.teacher_training`` of a DvBERT config).

    The defaults are the paper's schedule (1 epoch, Adam lr 2e-5, 10 % warm-up, dropout 0.1) on its [CLS] head;
    raydistill/configs/dvbert.yaml sets what trains on a CPU (see its comments and raydistill.runtime.jobs.dvbert_teachers).
    Numbers keep the kind they were written in (int or float): the shaping settings name the teachers' cache entry.
    """

    epochs: Int = Field(1, ge=1, description="passes over the teacher's folds")
    lr: Number = Field(2e-5, gt=0, description="peak learning rate (Adam)")
    batch_size: Int = Field(32, ge=1, description="pairs per step")
    max_length: Int = Field(64, ge=1, description="tokens per pair")
    warmup_ratio: Number = Field(0.1, ge=0, lt=1, description="share of the steps spent warming up")
    weight_decay: Number = Field(0.01, ge=0, description="weight decay")
    dropout: Number = Field(0.1, ge=0, lt=1, description="dropout in the head (the transformer keeps its own "
                                                         "config's)")
    finetune: StrictBool = Field(True, description="false: the transformer stays frozen, encodes each pair once, "
                                                   "only the head trains")
    head: Literal["cls", "mean", "segments", "aligned"] = Field(
        "cls", description="what the head reads (pool_pair): cls (the paper's), mean, segments, aligned")
    head_hidden: Int = Field(0, ge=0, description="0: one FC layer (the paper's); n: FC(n) -> GELU -> FC")
    folds: Int = Field(2, ge=2, description="each teacher trains this many models; model f labels only fold f (a "
                                            "pair is labelled by a model that did not train on it)")
    max_pairs: Int | None = Field(None, description="labelled NLI pairs (null: every pair shipped, SNLI dev + "
                                                    "MultiNLI dev); at least 2 x folds")
    precision: Literal["fp32", "bf16"] = Field("fp32", description="bf16: forward and backward under "
                                                                   "torch.autocast(bfloat16); weights stay fp32")
    min_accuracy: Number = Field(0.6, ge=0, le=1, description="refuse a teacher whose held-out accuracy is below "
                                                              "this")
    seed: Int = Field(1000, description="seed of the folds and the teachers' initialisation")

    def __post_init__(self) -> None:
        if self.max_pairs is not None and self.max_pairs < 2 * self.folds:
            raise ValueError(f"max_pairs must be null (all pairs) or an integer >= 2 x folds, got {self.max_pairs!r}")

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> TeacherTraining:
        """Checked settings; a problem raises ConfigError (a ValueError) naming ``extra.teacher_training.<key>``."""
        return build(cls, dict(d or {}), prefix="extra.teacher_training.")

    def shaping(self) -> dict[str, Any]:
        """The settings that determine the trained models (the cache key's part)."""
        return {k: v for k, v in asdict(self).items() if k not in _JUDGING_FIELDS}


@section
class DvBERTLossSettings(LossSettings):
    """``loss:`` of DvBERT (raydistill.objectives.DvBERTLoss)."""

    num_labels: Int | None = Field(None, ge=2, description="NLI classes of the classifier (null: 3)")


def _distinct_teachers(teachers: list[str] | None) -> list[str] | None:
    if teachers is not None and not teachers:
        raise ValueError("a non-empty list of cross-encoder teacher models, e.g. [minilm-l6, bert-small]")
    if teachers is not None and len(set(teachers)) != len(teachers):
        raise ValueError(f"lists a teacher twice ({teachers}): identical teachers share one cache entry and add no "
                         "second view")
    return teachers


@section
class DvBERTExtraSettings(StagedExtraSettings):
    """``extra:`` of DvBERT: the teachers and how they are fine-tuned."""

    teachers: Annotated[list[str] | None, AfterValidator(_distinct_teachers)] = Field(
        None, description="the NLI cross-encoder teachers (presets or model directories) fine-tuned before the "
                          "student (null: minilm-l6, bert-small)")
    teacher_training: TeacherTraining | None = Field(None, description="how the NLI cross-encoder teachers are "
                                                                       "fine-tuned (epochs, lr, head, folds, ...)")


def teachers_of(cfg: JobConfig) -> list:
    """The cross-encoder teachers a DvBERT config names (``extra.teachers``, default ``DVBERT_TEACHERS``)."""
    return list(cfg.extra.get("teachers") or DVBERT_TEACHERS)


def dvbert_features(ctx: StepContext, batch) -> Features:
    """u, v of the pair and the teachers' mean class distribution; labels = gold classes. The loss mixes them with
    the annealing weight λ (0 → 1 over training; its step count is checkpointed with it)."""
    u, v = ctx.encode_views(batch["text_a"], batch["text_b"])
    return ({"u": u, "v": v, "teacher_probs": ctx.tensor(batch["teacher_probs"])},
            ctx.tensor(batch["label"], dtype=torch.long))


SPEC = MethodSpec(
    name="dvbert",
    summary="DvBERT (Cheng, SIGIR 2021): K NLI cross-encoder teachers, teacher annealing, then STS-B",
    views={},
    teacher_views=(),
    needs_teacher=False,
    loss_settings=DvBERTLossSettings,
    extra_settings=DvBERTExtraSettings,
    loss_class=DvBERTLoss,
    loss_dim="student",
    batch_to_features=dvbert_features,
    student_sentences_per_row=2,
    dataset="nli_teacher_labels",
    stages=("sts-cosine",),
    stage_defaults=({"train": {"lr": 2e-5, "epochs": 4, "batch_size": 16, "warmup_ratio": 0.1},
                     "data": {"max_sentences": None}},),
)
