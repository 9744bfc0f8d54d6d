"""ConGen + CKD: ConGen's views, teacher and queue, trained on a weighted mix of the ConGen and CKD losses.

    L = w · CKD(s(x), t(x); queue) + (1 − w) · ConGen(s(x), s(x'), t(x); queue)       w = loss.ckd_weight

A recipe lever to screen, not a method of either paper (ConGen: Limkonchotiwat et al., Findings EMNLP 2022; CKD:
DistilCSE stage 1, arXiv:2112.05638). It reads what ConGen reads (``congen.yaml`` runs it with
``--set method=congen-ckd``), and both terms score one queue of teacher vectors, shared across learners and started
from teacher vectors by one ``TeacherQueues`` hook (``raydistill.objectives.congen_ckd`` says why one queue serves
both). Defaults: ConGen's for ConGen's keys (K 16384, τ_T 0.05, τ_S 0.07, α 0.5, the queue from teacher vectors, the
Linear + tanh head, its optimiser), CKD's for its logit scale under ``ckd_`` keys (τ = e^-1 learned, clamped to
[1, 100]); w 0.5. CKD's own K 65536 and empty start do not apply: the queue is ConGen's.
"""

import math

from pydantic import Field, StrictBool

from raydistill.config.job import JobConfig
from raydistill.config.schema import section
from raydistill.methods.base import (Fraction, LossSettings, MaskSameGroup, MethodSpec, PositiveNumber, QueueInit,
                                     QueueSeed, QueueSize, Temperature, check_learnable_temperature)
from raydistill.methods.congen import SPEC as CONGEN, congen_features
from raydistill.objectives import ConGenCKDLoss


@section
class ConGenCKDLossSettings(LossSettings):
    """``loss:`` of ConGen + CKD (raydistill.objectives.ConGenCKDLoss): ConGen's keys, CKD's under ``ckd_``."""

    ckd_weight: Fraction = Field(0.5, description="w: weight of the CKD term, 1 - w the ConGen term's (0: ConGen "
                                                  "alone, 1: CKD alone, on the same queue)")
    queue_size: QueueSize = Field(16384, description="K, teacher vectors of earlier batches in the ONE queue both "
                                                     "terms score against")
    tau_teacher: Temperature = Field(0.05, description="ConGen term: temperature of the teacher's similarity "
                                                       "distribution")
    tau_student: Temperature = Field(0.07, description="ConGen term: temperature of the student's similarity "
                                                       "distribution")
    queue_init: QueueInit = Field("teacher", description="how the queue starts: teacher (vectors of sampled training "
                                                         "sentences, ConGen's authors'), random or empty")
    alpha: Fraction | None = Field(None, description="ConGen term: weight of its control part, 1 - alpha its "
                                                     "generalisation part's (null: 0.5)")
    ckd_temperature: Temperature = Field(round(math.exp(-1.0), 6), description="CKD term: τ of its logit scale 1/τ "
                                                                               "(not log(1/τ)): e^-1 is DistilCSE's "
                                                                               "scale e")
    ckd_learnable_temperature: StrictBool = Field(True, description="CKD term: learn its scale with the student "
                                                                    "(clamped to [ckd_min_scale, ckd_max_scale])")
    ckd_min_scale: PositiveNumber | None = Field(None, description="CKD term: lower clamp of the learned scale "
                                                                   "(null: 1)")
    ckd_max_scale: PositiveNumber | None = Field(None, description="CKD term: upper clamp of the learned scale "
                                                                   "(null: 100)")
    queue_seed: QueueSeed = None
    mask_same_group: MaskSameGroup = None


def check_ckd_scale(cfg: JobConfig) -> None:
    """The CKD term's learned scale must start strictly inside its clamp (``LearnableScale`` says why)."""
    check_learnable_temperature(cfg, SPEC.loss_kwargs(cfg), prefix="ckd_")


SPEC = MethodSpec(
    name="congen-ckd",
    summary="ConGen + CKD: w · CKD + (1 - w) · ConGen over one teacher queue (a recipe lever, not a paper's method)",
    views=dict(CONGEN.views),
    teacher_views=CONGEN.teacher_views,
    needs_teacher=True,
    loss_settings=ConGenCKDLossSettings,
    loss_class=ConGenCKDLoss,
    loss_dim="teacher",
    batch_to_features=congen_features,
    project_to_teacher=True,
    student_sentences_per_row=2,
    shared_queues=1,  # the loss's ``queue``, read by both terms
    check=check_ckd_scale,
)
