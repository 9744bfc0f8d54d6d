"""What every method is made of: ``MethodSpec`` (data, student, loss, checks) and the ``StepContext`` a step sees.

A method turns a batch of training rows into its loss's inputs:

    features, labels = spec.batch_to_features(ctx, batch)   # student forward passes (+ frozen teacher vectors)
    output = loss_module(features, labels)                  # LossOutput(loss, parts)

Batches are dicts of numpy columns: ``text_<view>`` (object arrays of str), ``teacher_<view>`` (float32 [B, D],
the frozen teacher's cached vectors), ``group`` (int64 [B], a caption group id), ``idx`` and, for the labelled
sets, their label columns. ``MethodSpec.dataset`` declares which rows a method trains on and the runtime builds
them, so a method never starts an actor or reads a cache itself.

A method with teachers of its own (DvBERT's NLI cross-encoders, AugSBERT's cross-encoder) builds its rows itself:
``MethodSpec.build_rows(cfg, services)`` returns them and ``MethodSpec.own_teachers(cfg)`` names the models
(checked before Ray starts, recorded with the run). The runtime lends it ``StageServices``: ``fit`` trains a model
as a stage of the engine (the same loop, resume, NaN refusal, progress lines and checkpoints as every student),
``run_parallel`` runs independent work as Ray tasks, ``model_identity`` fingerprints a model's files for a cache
key. A method file therefore never imports the Ray layer.

A method declares the schema of its ``loss:`` (``loss_settings``, a ``LossSettings``) and ``extra:``
(``extra_settings``, an ``ExtraSettings``) sections: ``MethodSettings`` of ``raydistill.config.schema``, so an
unknown key is refused with "did you mean", a wrong type or range names the field, and ``--help`` lists them; a
config naming the method holds them as ``cfg.loss`` and ``cfg.extra``. A loss setting whose default is ``None`` is
passed to the loss only when the config sets it (else the objective's own default applies); the others are the
method's defaults, written into the run's config (``with_method_defaults``) so the run records what it used.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, Protocol

import numpy as np
import torch
from pydantic import AfterValidator, Field, StrictBool
from torch import Tensor, nn

from raydistill.config.job import JobConfig
from raydistill.config.schema import Int, MethodSettings, Number, section, states

__all__ = ["MethodSpec", "StepContext", "Features", "StageServices", "FittedStage", "CORPUS",
           "teacher_vectors", "with_groups",
           "LossSettings", "ExtraSettings", "StagedExtraSettings", "Temperature", "QueueSize", "QueueInit",
           "QueueSeed", "MaskSameGroup", "Positive", "PositiveNumber", "NonNegative", "Fraction", "settings_defaults"]

# The unlabeled text of ``data.corpus`` with its views and the teacher's cached vectors of ``data.teacher_views``;
# every other ``MethodSpec.dataset`` names a labelled set that the runtime builds for that method.
CORPUS = "corpus"


# ----------------------------------------------------------------------------------------------------------------
# The schema of ``loss:`` and ``extra:``


def _bounded(constraint: str, refused: Callable[[float | int], bool], message: str):
    """An ``AfterValidator`` that refuses what ``refused`` says, with ``message`` (``{value!r}`` filled in)."""
    @states(constraint)
    def check(value: float | int) -> float | int:
        if refused(value):
            raise ValueError(message.format(value=value))
        return value
    return AfterValidator(check)


#: A softmax temperature τ: a number > 0 (kept as written, int or float, so the config hash keeps its spelling).
Temperature = Annotated[Number, _bounded("> 0", lambda v: v <= 0, "temperature must be a number > 0, got {value!r}")]
NonNegative = Annotated[Number, _bounded(">= 0", lambda v: v < 0, "{value!r} must be >= 0")]
#: K, entries of an instance queue (0: no queue).
QueueSize = Annotated[Int, Field(ge=0)]
#: How a queue starts (raydistill.objectives.queue.QUEUE_INITS).
QueueInit = Literal["empty", "random", "teacher"]
#: A count of at least one (blocks, expansion factors).
Positive = Annotated[Int, Field(ge=1)]
#: A number > 0 that is not a temperature (a scale bound).
PositiveNumber = Annotated[Number, _bounded("> 0", lambda v: v <= 0, "must be > 0, got {value!r}")]
#: A weight in [0, 1].
Fraction = Annotated[Number, _bounded("in [0, 1]", lambda v: not 0 <= v <= 1, "{value!r} must be in [0, 1]")]
#: ``queue_seed`` of every queue loss.
QueueSeed = Annotated[Int | None, Field(description="seed of a random queue start (null: 0; queue i of a loss with "
                                                    "several queues uses seed + i)")]
#: ``mask_same_group`` of every queue loss.
MaskSameGroup = Annotated[StrictBool | None, Field(description="rows of one caption group (one image) are not each "
                                                               "other's negatives (null: true)")]


@section
class LossSettings(MethodSettings):
    """``loss:`` of a method whose loss takes no settings; every method's ``loss_settings`` derives from it."""


@section
class ExtraSettings(MethodSettings):
    """``extra:`` keys every method accepts (read by the runtime, not the method)."""

    teacher_encoder: Literal["bi", "cross"] = Field("bi", description="bi (the teacher embeds sentences) or cross "
                                                                      "(the teacher scores pairs)")
    bucket_tokens: Int | None = Field(None, ge=0, description="padded tokens per length-sorted sub-batch of the "
                                                              "student's forward (0: the batch in one call; null: "
                                                              "the learner's default)")


@section
class StagedExtraSettings(ExtraSettings):
    """``extra:`` of a method with a second stage."""

    stage2: dict[str, Any] | None = Field(None, description="overrides of the second stage's train, loss, data and "
                                                            "resources sections")


def settings_defaults(schema: type) -> dict[str, Any]:
    """The defaults of a settings schema that are not ``None`` (the ones a method writes into its config)."""
    return {name: value for name, info in schema.__pydantic_fields__.items()
            if not info.is_required() and (value := info.get_default(call_default_factory=True)) is not None}


# A least-squares projection starts from PyTorch's init; the runtime fits it to the teacher once the data exists.
_CONSTRUCTED_INIT = {"least_squares": "default"}


@dataclass
class StepContext:
    """What ``batch_to_features`` may use: the student (in train mode), the loss module, device, progress."""

    student: nn.Module
    loss: nn.Module
    device: torch.device
    step: int  # optimiser steps done before this one
    total_steps: int
    cfg: JobConfig
    # Padded tokens per length-sorted sub-batch of the student's forward (models.batching.bucketed_forward);
    # None = the batch in one call.
    bucket_tokens: int | None = None

    def encode(self, texts) -> Tensor:
        """Student embeddings [B, D] of ``texts`` with gradients (dropout active: the student is in train mode)."""
        from raydistill.models.batching import bucketed_forward

        features = self.student.tokenize([str(t) for t in texts])
        features = {name: value.to(self.device) for name, value in features.items()}
        return bucketed_forward(self.student, features, self.bucket_tokens)

    def encode_views(self, *views) -> tuple[Tensor, ...]:
        """``encode`` of several lists of texts in ONE student forward, split back: [B_i, D] per list. One call sorts
        all the sentences by length together (tighter sub-batches) and runs fewer, fuller matrix products
        (bench/train_step.py); rows do not interact in the encoder, so each view gets what ``encode`` would give it."""
        sizes = [len(texts) for texts in views]
        return tuple(self.encode([text for texts in views for text in texts]).split(sizes))

    def tensor(self, array, dtype=torch.float32) -> Tensor:
        # A copy: batches arriving through Ray are read-only views of the object store.
        return torch.tensor(np.asarray(array), dtype=dtype, device=self.device)


Features = tuple[dict[str, Tensor], "Tensor | None"]


def teacher_vectors(ctx: StepContext, batch, view: str) -> Tensor:
    """The frozen teacher's vectors of ``view`` [B, D_t] (rows may arrive as an object array of [D_t] arrays)."""
    column = batch[f"teacher_{view}"]
    return ctx.tensor(np.stack(column) if column.dtype == object else column)


def with_groups(ctx: StepContext, batch, features: dict[str, Tensor]) -> dict[str, Tensor]:
    """Adds the rows' group ids [B] (``group`` column of the training data, e.g. a caption's image) for the queue
    losses' same-group mask."""
    if "group" in batch:
        features["group"] = ctx.tensor(batch["group"], dtype=torch.long)
    return features


@dataclass
class FittedStage:
    """What ``StageServices.fit`` returns."""

    model: nn.Module  # the stage's student after its LAST step, read from the final checkpoint (CPU, eval mode)
    steps: int  # optimiser steps of the stage
    history: list[dict[str, Any]]  # the engine's metric rows (loss, dev, ...) in step order
    run_dir: Path  # the stage's engine folder: checkpoints, ``best/`` (the best model by the method's dev score)


class StageServices(Protocol):
    """What the runtime lends ``MethodSpec.build_rows``; picklable, so a Ray task the method starts can use it too."""

    def fit(self, cfg: JobConfig, data: Any, *, init_model: str | None = None, name: str | None = None) -> FittedStage:
        """Train ``cfg`` (a config of an engine method; ``cfg.run_dir`` is the stage's folder) on ``data`` (an
        ``ArrayData``) as one stage of the engine, in this process (Train's local mode). A folder holding a checkpoint
        of these very settings continues from it; one holding another stage's is cleared first, with a line."""

    def run_parallel(self, fn: Callable[..., Any], calls: list[tuple], resources: Any) -> list[Any]:
        """``[fn(*args) for args in calls]``, as Ray tasks of ``resources`` (a ``RoleResources``) when Ray runs and
        there is more than one call, else in this process."""

    def model_identity(self, model: str, *, encoder: str = "bi", max_length: int = 128) -> str:
        """A fingerprint of everything in ``model``'s files that changes its outputs (a cache key's part)."""


@dataclass(frozen=True)
class MethodSpec:
    """One method: its rows, views, loss, how a batch becomes the loss's features, checks, later stages.

    ``dataset``: ``CORPUS`` (unlabeled text + cached teacher vectors), a labelled set the runtime builds
    (``nli_triplets``, ``stsb_train``), or, with ``build_rows``, the name of the rows the method builds itself.
    ``build_rows(cfg, services)``: a method with teachers of its own returns its rows (an ``ArrayData``; its
    ``cache_stats`` go to the result file, and of ``cache_stats["own_teachers"]``, a list of dicts, the keys
    ``model``, ``heldout_accuracy`` and ``cached`` to MLflow as ``<method>.teacher<i>.<key>``);
    ``own_teachers(cfg)``: the models it names, by config field (``{"extra.teachers[0]": "minilm-l6"}``), checked
    before Ray starts; ``reads``: the registry data sets it reads (their files are checked too).
    ``loss_settings`` / ``extra_settings``: the schema of ``loss:`` and ``extra:``; ``default_loss`` is what
    ``loss_settings`` declares.
    ``stages``: methods run after this one in the same job, each from the previous stage's best model (DistilCSE:
    CKD then supervised SimCSE on NLI; DvBERT: NLI with teacher annealing, then STS-B).
    ``check(cfg)``: the method's own config checks beyond the common ones (raise ``cfg._error(path, message)``).
    """

    name: str
    summary: str
    views: dict[str, str]
    teacher_views: tuple[str, ...]
    needs_teacher: bool
    loss_class: type  # an nn.Module of raydistill.objectives: loss(features, labels) -> LossOutput
    batch_to_features: Callable[[StepContext, dict[str, np.ndarray]], Features]
    loss_settings: type = LossSettings
    extra_settings: type = ExtraSettings
    dataset: str = CORPUS
    loss_dim: str | None = None  # "teacher" | "student": what the loss's ``dim`` argument is
    project_to_teacher: bool = False
    # Activation after the student's Linear(d_s → d_t): tanh as ConGen's and SCT's Dense; CKD's is a plain Linear.
    projection_activation: str = "tanh"
    student_sentences_per_row: int = 1
    optimizer: dict[str, Any] = field(default_factory=lambda: {"eps": 1e-6})
    # Queues of *teacher* vectors the loss keeps (1: ``queue``, 2: ``queue=(queue_a, queue_b)``) and how they start;
    # N > 1 learners share them through one queue actor each. Queues of a learner's own vectors (SCT) stay local.
    shared_queues: int = 0
    queue_init: str = "random"
    stages: tuple[str, ...] = ()
    stage_defaults: tuple[dict[str, Any], ...] = ()
    check: Callable[[JobConfig], None] | None = None
    internal: bool = False  # a later stage of another method (still runnable on its own)
    # What the refusal of a NaN/inf loss tells the user to change (after "loss is nan at step N").
    nonfinite_hint: str = "lower train.lr or check the temperatures in loss.*"
    build_rows: Callable[[JobConfig, StageServices], Any] | None = None
    own_teachers: Callable[[JobConfig], dict[str, str]] | None = None
    reads: tuple[str, ...] = ()

    # ------------------------------------------------------------------------------------------------------------

    @property
    def reads_corpus(self) -> bool:
        return self.dataset == CORPUS

    @property
    def default_loss(self) -> dict[str, Any]:
        """The loss settings the method fills in where the config leaves them unset (``loss_settings``'s)."""
        return settings_defaults(self.loss_settings)

    def loss_kwargs(self, cfg: JobConfig) -> dict[str, Any]:
        """What the loss is built with: the settings the config sets and the method's defaults."""
        return cfg.loss.in_use()

    def teacher_views_of(self, cfg: JobConfig) -> list[str]:
        return list(cfg.data.teacher_views) if cfg.data.teacher_views else list(self.teacher_views)

    def optimizer_kwargs(self, cfg: JobConfig) -> dict[str, Any]:
        return dict(self.optimizer)

    def build_student(self, cfg: JobConfig, *, teacher_dim: int | None = None, init_model: str | None = None):
        """The student BiEncoder; with a projecting method and a teacher of another width, + Linear→d_t, tanh."""
        from raydistill.models import BiEncoder, resolve_model

        if init_model is not None:  # a later stage: the saved model already carries its pooling/projection
            return BiEncoder.from_pretrained(str(init_model), max_length=cfg.data.max_length)
        # teacher: what a static student ("static:256") is initialised from; other names ignore it
        source = str(resolve_model(cfg.student, teacher=cfg.teacher))
        student = BiEncoder.from_pretrained(source, pooling=cfg.student_pooling, max_length=cfg.data.max_length)
        if self.project_to_teacher and teacher_dim is not None and student.dim != teacher_dim:
            # A static student's projection is linear so that saving folds it into the token table (a mean of
            # rows commutes with a linear map, not with tanh); the saved static model is then d_t wide.
            activation = "identity" if student.is_static else self.projection_activation
            student = BiEncoder.from_pretrained(source, pooling=cfg.student_pooling, max_length=cfg.data.max_length,
                                                projection_dim=int(teacher_dim),
                                                projection_activation=activation,
                                                projection_init=_CONSTRUCTED_INIT.get(cfg.student_projection_init,
                                                                                      cfg.student_projection_init))
        return student

    def dev_score(self, cfg: JobConfig, student) -> float:
        """The learner's model-selection score of ``student``: STS-B dev Spearman x 100 of its cosine. A method
        whose student is no bi-encoder, or that selects on another set, says so here."""
        from raydistill.evaluation import evaluate_sts

        return float(evaluate_sts(student, sets=("stsb_dev",), progress=False)["stsb_dev"])

    def build_loss(self, cfg: JobConfig, *, student_dim: int | None, teacher_dim: int | None,
                   total_steps: int | None = None, queues: list | None = None) -> nn.Module:
        """The loss module with ``loss_kwargs(cfg)``; ``dim``/``total_steps`` filled in when the class takes them.

        ``queues``: queue objects (one per teacher queue, e.g. mirrors of a queue shared by several learners) to
        use instead of the loss's private queues.
        """
        accepted = inspect.signature(self.loss_class).parameters
        kwargs = self.loss_kwargs(cfg)
        dim = {"teacher": teacher_dim, "student": student_dim}.get(self.loss_dim or "")
        context: dict[str, Any] = {"dim": dim, "total_steps": total_steps, "precision": cfg.train.precision}
        if queues:
            context["queue"] = queues[0] if len(queues) == 1 else tuple(queues)
        for name, value in context.items():
            if name in accepted and value is not None:
                kwargs[name] = value
        return self.loss_class(**kwargs)

    @property
    def hooks(self) -> tuple:
        """What the method needs beyond its loss (hooks.py): the projection's least-squares start, shared queues."""
        from raydistill.methods.hooks import LeastSquaresProjection, TeacherQueues

        return (LeastSquaresProjection(),) + ((TeacherQueues(self.shared_queues),) if self.shared_queues else ())

    def allowed_loss_keys(self) -> set[str]:
        return {name for name in self.loss_settings.__pydantic_fields__ if not name.startswith("_")}

    # ------------------------------------------------------------------------------------------------------------
    # Checks of a config naming this method (pure: no file, model or cluster is touched)

    def validate(self, cfg: JobConfig, effective_views: dict[str, str], effective_teacher_views: list[str]) -> None:
        """Raise ``ConfigError`` naming the field when ``cfg`` cannot train this method."""
        if self.needs_teacher and not cfg.teacher:
            raise cfg._error("teacher", f"method {self.name!r} distils a teacher: set teacher (e.g. mpnet-base)")
        if not self.needs_teacher and cfg.teacher and not self.teacher_views and self.reads_corpus:
            raise cfg._error("teacher", f"method {self.name!r} trains without a teacher; remove teacher "
                                        f"(got {cfg.teacher!r})")
        if self.reads_corpus:
            missing = [v for v in self.views if v not in effective_views]
            if missing:
                raise cfg._error("data.views", f"method {self.name!r} reads the view(s) {missing}; give data.views "
                                               f"{{{', '.join(f'{k}: {v}' for k, v in self.views.items())}}} "
                                               f"(augmentations of raydistill.augment), or leave data.views unset")
            if any(v not in effective_teacher_views for v in self.teacher_views):
                raise cfg._error("data.teacher_views", f"method {self.name!r} needs teacher vectors of "
                                                       f"{list(self.teacher_views)}")
        effective = self.loss_kwargs(cfg)
        queue_size = effective.get("queue_size")
        if queue_size and queue_size < cfg.train.batch_size:
            raise cfg._error("loss.queue_size", f"K={queue_size} (the {self.name} default when unset) is smaller "
                                                f"than train.batch_size={cfg.train.batch_size}: the FIFO queue must "
                                                "hold at least one batch")
        if effective.get("queue_init") is not None:
            if effective["queue_init"] == "teacher" and not self.shared_queues:
                raise cfg._error("loss.queue_init", f"'teacher' fills queues of teacher vectors; the {self.name} "
                                                    "loss keeps none (use random or empty)")
        if self.check is not None:
            self.check(cfg)


def check_learnable_temperature(cfg: JobConfig, effective: dict[str, Any], prefix: str = "") -> None:
    """A learnable logit scale (``<prefix>temperature`` ...) must start strictly inside its clamp bounds (else it can
    never move)."""
    from raydistill.objectives import LearnableScale

    bounds = {k: effective[prefix + k] for k in ("min_scale", "max_scale") if prefix + k in effective}
    try:
        LearnableScale(float(effective[f"{prefix}temperature"]), bool(effective[f"{prefix}learnable_temperature"]),
                       **bounds)
    except ValueError as exc:
        raise cfg._error(f"loss.{prefix}temperature", str(exc)) from None
