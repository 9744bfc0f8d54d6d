"""DvBERT (Cheng, "Dual-View Distilled BERT for Sentence Embedding", SIGIR 2021, arXiv:2104.08675): a siamese
student learns NLI from K cross-encoder teachers' soft labels with teacher annealing, then STS-B
(``sts_cosine.py``).

    target = λ·y + (1 − λ)·mean_k q_k(a, b)              # λ: 0 → 1 over training
    L      = CE(target, softmax(W [u; v; |u − v|]))

Rows: the ``nli_teacher_labels`` set: the labelled NLI pairs with the teachers' mean out-of-fold class
distribution. DvBERT has teachers of its own: ``build_rows`` below trains them (``dvbert_teachers``, each fold a
stage of the engine through the ``StageServices`` the runtime lends) from ``extra.teachers`` and
``extra.teacher_training`` (``TeacherTraining``), refuses a weak one, and labels the pairs.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated

import torch
from pydantic import AfterValidator, BeforeValidator, Field

from raydistill.config.job import JobConfig
from raydistill.config.schema import Int, section
from raydistill.data.arrays import ArrayData, seeded_subset
from raydistill.methods.base import Features, LossSettings, StagedExtraSettings, StageServices, StepContext
from raydistill.methods.nli_teacher import TeacherTraining
from raydistill.methods.sts_cosine import rows_method
from raydistill.objectives import DvBERTLoss

__all__ = ["SPEC", "TeacherTraining", "DvBERTLossSettings", "DvBERTExtraSettings", "DVBERT_TEACHERS"]

DVBERT_TEACHERS = ("minilm-l6", "bert-small")
@section
class DvBERTLossSettings(LossSettings):
    """``loss:`` of DvBERT (raydistill.objectives.DvBERTLoss)."""

    num_labels: Int | None = Field(None, ge=2, description="NLI classes of the classifier (null: 3)")


def _distinct_teachers(teachers: list[str]) -> list[str]:
    if not teachers:
        raise ValueError("a non-empty list of cross-encoder teacher models, e.g. [minilm-l6, bert-small]")
    if len(set(teachers)) != len(teachers):
        raise ValueError(f"lists a teacher twice ({teachers}): identical teachers share one cache entry and add no "
                         "second view")
    return teachers


@section
class DvBERTExtraSettings(StagedExtraSettings):
    """``extra:`` of DvBERT: the teachers and how they are fine-tuned."""

    teachers: Annotated[list[str], BeforeValidator(lambda v: list(DVBERT_TEACHERS) if v is None else v),
                        AfterValidator(_distinct_teachers)] = Field(
        default_factory=lambda: list(DVBERT_TEACHERS), description="the NLI cross-encoder teachers (presets or model directories) fine-tuned before the "
                          "student (null: minilm-l6, bert-small)")
    teacher_training: TeacherTraining | None = Field(None, description="how the NLI cross-encoder teachers are "
                                                                       "fine-tuned (epochs, lr, head, folds, ...)")


def named_teachers(cfg: JobConfig) -> dict[str, str]:
    """``{config field: model}`` of the teachers (``MethodSpec.own_teachers``)."""
    return {f"extra.teachers[{i}]": teacher for i, teacher in enumerate(cfg.extra.teachers)}


def teacher_labelled_pairs(cfg: JobConfig, services: StageServices) -> ArrayData:
    """Fine-tune (or reuse) the K NLI cross-encoder teachers in folds, refuse any below
    ``extra.teacher_training.min_accuracy``, and return the student's pairs with the teachers' mean out-of-fold
    class distribution. The teachers use every labelled pair shipped (or ``teacher_training.max_pairs``); the
    student a seeded subset of ``data.max_sentences`` of them when set (each has its out-of-fold labels anyway)."""
    from raydistill.methods import dvbert_teachers as dv

    training = cfg.extra.teacher_training or TeacherTraining()
    if "seed" not in (cfg.extra.get("teacher_training") or {}):  # a teacher seed the config leaves to the job's
        training = dataclasses.replace(training, seed=cfg.seed)
    columns = dv.nli_pairs(training.max_pairs, training.seed)
    infos = dv.ensure_nli_teachers(list(cfg.extra.teachers), columns, training, services, cfg.resources.teacher)
    dv.check_teacher_accuracy(infos, training.min_accuracy)  # before the student spends a step on them
    soft, stats = dv.out_of_fold_soft_labels(infos, columns["label"])
    columns["teacher_probs"] = soft
    num_pairs = len(columns["label"])
    keep = seeded_subset(num_pairs, cfg.data.max_sentences, cfg.seed)
    columns = {name: values[keep] for name, values in columns.items()}
    cache_stats = {"own_teachers": [{k: info.get(k) for k in ("model", "dir", "heldout_accuracy", "fold_accuracy",
                                                               "cached", "seconds")} for info in infos],
                   "teacher_pairs": num_pairs, **stats}
    return ArrayData(columns, seed=cfg.seed, shuffle=cfg.data.shuffle, cache_stats=cache_stats)


def dvbert_features(ctx: StepContext, batch) -> Features:
    """u, v of the pair and the teachers' mean class distribution; labels = gold classes. The loss mixes them with
    the annealing weight λ (0 → 1 over training; its step count is checkpointed with it)."""
    u, v = ctx.encode_views(batch["text_a"], batch["text_b"])
    return ({"u": u, "v": v, "teacher_probs": ctx.tensor(batch["teacher_probs"])},
            ctx.tensor(batch["label"], dtype=torch.long))


SPEC = rows_method(
    name="dvbert",
    summary="DvBERT (Cheng, SIGIR 2021): K NLI cross-encoder teachers, teacher annealing, then STS-B",
    loss_settings=DvBERTLossSettings,
    extra_settings=DvBERTExtraSettings,
    loss_class=DvBERTLoss,
    loss_dim="student",
    batch_to_features=dvbert_features,
    student_sentences_per_row=2,
    dataset="nli_teacher_labels",
    build_rows=teacher_labelled_pairs,
    own_teachers=named_teachers,
    reads=("snli_dev", "mnli_dev"),
    stages=("sts-cosine",),
    stage_defaults=({"train": {"lr": 2e-5, "epochs": 4, "batch_size": 16, "warmup_ratio": 0.1},
                     "data": {"max_sentences": None}},),
)
