"""ConGen (Limkonchotiwat et al., "ConGen: Unsupervised Control and Generalization Distillation For Sentence
Representation", Findings of EMNLP 2022): the student matches the frozen teacher's similarity distribution over a
queue of teacher vectors, for the control view and for another (generalisation) view of the same sentence.

    p_t = softmax(cos(t(x), [Q; t(B)]) / τ_t)            # teacher, control view x
    L   = ½ CE(p_t, softmax(cos(s(x), ·) / τ_s)) + ½ CE(p_t, softmax(cos(s(x'), ·) / τ_s))

Defaults: K 16384, τ_t 0.05, τ_s 0.07 (the MiniLM-L3 row of the paper's Table 7); the queue starts from teacher
vectors of sampled training sentences, as the authors' code does (the paper finds a random start worse).
"""

from raydistill.methods.base import Features, MethodSpec, StepContext, teacher_vectors, with_groups
from raydistill.objectives import ConGenLoss


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
    default_loss={"queue_size": 16384, "tau_teacher": 0.05, "tau_student": 0.07, "queue_init": "teacher"},
    loss_class=ConGenLoss,
    loss_dim="teacher",
    batch_to_features=congen_features,
    project_to_teacher=True,
    student_sentences_per_row=2,
    shared_queues=1,
)
