"""ConGen (Limkonchotiwat et al., "ConGen: Unsupervised Control and Generalization Distillation For Sentence
Representation", Findings of EMNLP 2022): the student matches the frozen teacher's similarity distribution over a
queue of teacher vectors, for the control view and for another (generalisation) view of the same sentence.

    p_t = softmax(cos(t(x), [Q; t(B)]) / τ_t)            # teacher, control view x
    L   = ½ CE(p_t, softmax(cos(s(x), ·) / τ_s)) + ½ CE(p_t, softmax(cos(s(x'), ·) / τ_s))

Defaults: K 16384, τ_t 0.05, τ_s 0.07 (the MiniLM-L3 row of the paper's Table 7); the queue starts from teacher
vectors of sampled training sentences, as the authors' code does (the paper finds a random start worse).
"""

from pydantic import Field

from raydistill.config.schema import section
from raydistill.methods.base import (Features, Fraction, LossSettings, MaskSameGroup, MethodSpec, QueueInit, QueueSeed,
                                     QueueSize, StepContext, Temperature, teacher_vectors, with_groups)
from raydistill.objectives import ConGenLoss


@section
class ConGenLossSettings(LossSettings):
    """``loss:`` of ConGen (raydistill.objectives.ConGenLoss)."""

    queue_size: QueueSize = Field(16384, description="K, instance-queue entries the loss scores against (teacher "
                                                     "vectors of earlier batches)")
    tau_teacher: Temperature = Field(0.05, description="temperature of the teacher's similarity distribution")
    tau_student: Temperature = Field(0.07, description="temperature of the student's similarity distribution")
    queue_init: QueueInit = Field("teacher", description="how the queue starts: teacher (vectors of sampled training "
                                                         "sentences, the authors'), random or empty")
    alpha: Fraction | None = Field(None, description="weight of the control term, 1 - alpha the generalisation "
                                                     "term's (null: 0.5)")
    queue_seed: QueueSeed = None
    mask_same_group: MaskSameGroup = None


def congen_features(ctx: StepContext, batch) -> Features:
    """The teacher saw only the control view; the student embeds both views (docs/methods.md, ConGen)."""
    control, generalize = ctx.encode_views(batch["text_control"], batch["text_generalize"])  # [B, D_t] each
    return with_groups(ctx, batch, {
        "teacher": teacher_vectors(ctx, batch, "control"),  # [B, D_t], L2-normalised, frozen
        "student_control": control,
        "student_generalize": generalize,
    }), None


SPEC = MethodSpec(
    name="congen",
    summary="ConGen (Limkonchotiwat et al., Findings EMNLP 2022): control + generalisation distillation",
    views={"control": "none", "generalize": "caption"},
    teacher_views=("control",),
    needs_teacher=True,
    loss_settings=ConGenLossSettings,
    loss_class=ConGenLoss,
    loss_dim="teacher",
    batch_to_features=congen_features,
    project_to_teacher=True,
    student_sentences_per_row=2,
    shared_queues=1,
)
