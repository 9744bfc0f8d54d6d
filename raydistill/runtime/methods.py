"""The distillation methods: what each one reads from a batch, runs through the student, and hands to its loss.

A ``MethodSpec`` is the glue between the data pipeline (``TrainingData.iter_batches`` yields numpy columns
``text_<view>`` and ``teacher_<view>``), the pure-torch losses of ``raydistill.objectives`` and the learner:

    features, labels = spec.batch_to_features(ctx, batch)   # student forward passes (+ frozen teacher vectors)
    output = loss_module(features, labels)                  # LossOutput(loss, parts)

Defaults follow the authors' code (docs/methods.md says where and why they differ); every one can be overridden in
``loss:``.

| method | student sees | teacher sees | loss | default loss |
|---|---|---|---|---|
| congen | control + generalize view | control view (cached) | soft CE over queue+batch, ½ con + ½ gen | K 16384, τ_t .05, τ_s .07 (MiniLM-L3 row of Table 7), queue from teacher vectors |
| sct | views a, b (+ a no-grad reference pass, dropout on) | — | cross-view KL over queue+batch | K 65536, τ_t .02, τ_s .03 (Small row) |
| sct-distill | views a, b | views a, b (cached) | cross-view KL (+ L_SCT, own τ .02/.03) | K 65536, τ_t .04, τ_s .05, queues from teacher vectors |
| ckd | view a | view a (cached) | InfoNCE vs teacher vectors + queue, learnable scale | K 65536, scale e (τ = e^-1), empty queue |
| distilcse | ckd, then supervised SimCSE on NLI triplets | | | stage 2: τ .05, lr 5e-5 |
| dvbert | NLI pairs (siamese), then STS-B train | K fine-tuned NLI cross-encoders | teacher-annealed CE, then cosine MSE | |
| l2 | view a | view a (cached) | MSE to the teacher vector | |
| simcse | view a twice (two dropout masks) | — | InfoNCE, τ .05 | |

Projection (ConGen, SCT-distill, CKD, L2): when the student's width differs from the teacher's, the student gets
``Linear(d_s → d_t)`` as a sentence-transformers Dense module, saved with the model: with tanh as ConGen's and
SCT's authors' Dense, without an activation for CKD (the authors' plain Linear).

Queue losses read the training data's ``group`` column: rows of one caption group (one image) are not each other's
negatives (a sibling caption can be the other view), and a row's own queued copy is not its negative either.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor, nn

from raydistill.runtime.config import ConfigError, JobConfig, register_validator

__all__ = ["MethodSpec", "StepContext", "METHODS", "get_method", "with_method_defaults", "Stage", "stage_plan",
           "job_methods"]


# A least-squares projection starts from PyTorch's init; LearnerGroup fits it to the teacher once the data exists.
_CONSTRUCTED_INIT = {"least_squares": "default"}


# ----------------------------------------------------------------------------------------------------------------
# Step context and helpers used by batch_to_features


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
        """``encode`` of several lists of texts in ONE student forward, split back: [B_i, D] per list.

        One call sorts all the views' sentences by length together (tighter sub-batches than per view) and runs
        fewer, fuller matrix products (bench/train_step.py). Rows do not interact in the encoder, so each view gets
        what ``encode`` would give it (other dropout masks).
        """
        sizes = [len(texts) for texts in views]
        return tuple(self.encode([text for texts in views for text in texts]).split(sizes))

    def tensor(self, array, dtype=torch.float32) -> Tensor:
        # A copy: batches arriving through Ray are read-only views of the object store.
        return torch.tensor(np.asarray(array), dtype=dtype, device=self.device)


Features = tuple[dict[str, Tensor], "Tensor | None"]


@dataclass(frozen=True)
class MethodSpec:
    """One method: default views, loss, how a batch becomes the loss's features, validation, optional next stages.

    ``stages``: methods run after this one in the same job, each starting from the previous stage's best model
    (DistilCSE: CKD then supervised SimCSE on NLI; DvBERT: NLI with teacher annealing, then STS-B).
    ``data_builder(cfg, run_dir)``: builds the stage's in-memory data (``ArrayData``) instead of the Ray Data
    pipeline (labelled NLI / STS-B pairs need no teacher pass).
    """

    name: str
    summary: str
    views: dict[str, str]
    teacher_views: tuple[str, ...]
    needs_teacher: bool
    default_loss: dict[str, Any]
    loss_class: str  # a class of raydistill.objectives
    batch_to_features: Callable[[StepContext, dict[str, np.ndarray]], Features]
    loss_dim: str | None = None  # "teacher" | "student": what the loss's ``dim`` argument is
    validator: Callable[[JobConfig], Any] | None = None  # filled in below; registered with config.register_validator
    project_to_teacher: bool = False
    # Activation after the student's Linear(d_s → d_t): tanh as ConGen's and SCT's Dense; CKD's is a plain Linear.
    projection_activation: str = "tanh"
    student_sentences_per_row: int = 1
    optimizer: dict[str, Any] = field(default_factory=lambda: {"eps": 1e-6})
    # Queues of *teacher* vectors the loss keeps (1: ``queue``, 2: ``queue=(queue_a, queue_b)``) and how they start;
    # N > 1 learners share them through SharedQueueActors. Queues of a learner's own vectors (SCT) stay local.
    shared_queues: int = 0
    queue_init: str = "random"
    stages: tuple[str, ...] = ()
    stage_defaults: tuple[dict[str, Any], ...] = ()
    data_builder: Callable[[JobConfig, Path], Any] | None = None
    extra_keys: tuple[str, ...] = ()
    internal: bool = False  # a later stage of another method (still runnable on its own)

    # ------------------------------------------------------------------------------------------------------------

    def loss_kwargs(self, cfg: JobConfig) -> dict[str, Any]:
        return {**self.default_loss, **cfg.loss}

    def teacher_views_of(self, cfg: JobConfig) -> list[str]:
        return list(cfg.data.teacher_views) if cfg.data.teacher_views else list(self.teacher_views)

    def optimizer_kwargs(self, cfg: JobConfig) -> dict[str, Any]:
        return dict(self.optimizer)

    def build_student(self, cfg: JobConfig, *, teacher_dim: int | None = None, init_model: str | None = None):
        """The student BiEncoder; with a projecting method and a teacher of another width, + Linear→d_t, tanh."""
        from raydistill.models import BiEncoder, resolve_model

        if init_model is not None:  # a later stage: the saved model already carries its pooling/projection
            return BiEncoder.from_pretrained(str(init_model), max_length=cfg.data.max_length)
        source = str(resolve_model(cfg.student))
        student = BiEncoder.from_pretrained(source, pooling=cfg.student_pooling, max_length=cfg.data.max_length)
        if self.project_to_teacher and teacher_dim is not None and student.dim != teacher_dim:
            student = BiEncoder.from_pretrained(source, pooling=cfg.student_pooling, max_length=cfg.data.max_length,
                                                projection_dim=int(teacher_dim),
                                                projection_activation=self.projection_activation,
                                                projection_init=_CONSTRUCTED_INIT.get(cfg.student_projection_init,
                                                                                      cfg.student_projection_init))
        return student

    def loss_type(self) -> type:
        import raydistill.objectives as objectives

        return getattr(objectives, self.loss_class)

    def build_loss(self, cfg: JobConfig, *, student_dim: int, teacher_dim: int | None, total_steps: int | None = None,
                   queue_actors: list | None = None) -> nn.Module:
        """The loss module with ``loss_kwargs(cfg)``; ``dim``/``total_steps`` filled in when the class takes them.

        ``queue_actors``: SharedQueueActors (one per teacher queue) to read and write through ``QueueClient``s
        instead of private queues.
        """
        import inspect

        cls = self.loss_type()
        accepted = inspect.signature(cls).parameters
        kwargs = self.loss_kwargs(cfg)
        dim = {"teacher": teacher_dim, "student": student_dim}.get(self.loss_dim or "")
        context: dict[str, Any] = {"dim": dim, "total_steps": total_steps, "precision": cfg.train.precision}
        if queue_actors:
            from raydistill.runtime.queue_actor import QueueClient

            size = int(kwargs["queue_size"])
            clients = [QueueClient(actor, size, int(teacher_dim), **self.queue_kwargs(cfg, i))
                       for i, actor in enumerate(queue_actors)]
            context["queue"] = clients[0] if len(clients) == 1 else tuple(clients)
        for name, value in context.items():
            if name in accepted and value is not None:
                kwargs[name] = value
        return cls(**kwargs)

    def queue_kwargs(self, cfg: JobConfig, index: int = 0) -> dict[str, Any]:
        """Init of teacher queue ``index``: the loss's own rule (seed + index, as the losses seed their queues)."""
        kwargs = self.loss_kwargs(cfg)
        return {"init": kwargs.get("queue_init", self.queue_init), "seed": int(kwargs.get("queue_seed", 0)) + index}

    def shares_queue(self, cfg: JobConfig) -> bool:
        return self.shared_queues > 0 and int(self.loss_kwargs(cfg).get("queue_size") or 0) > 0

    def make_shared_queues(self, cfg: JobConfig, teacher_dim: int | None) -> list:
        """SharedQueueActors (``resources.queue``), one per teacher queue, sized ``loss.queue_size`` x teacher dim."""
        from raydistill.runtime.queue_actor import create_shared_queue

        size = int(self.loss_kwargs(cfg)["queue_size"])
        return [create_shared_queue(cfg, size=size, dim=int(teacher_dim), **self.queue_kwargs(cfg, i))
                for i in range(self.shared_queues)]

    def allowed_loss_keys(self) -> set[str]:
        import inspect

        try:
            params = inspect.signature(self.loss_type()).parameters
        except (ImportError, AttributeError):
            return set(self.default_loss)
        return (set(params) - {"dim", "queue", "total_steps", "self"}) | set(self.default_loss)


# ----------------------------------------------------------------------------------------------------------------
# batch -> features


def _teacher(ctx: StepContext, batch, view: str) -> Tensor:
    return ctx.tensor(np.stack(batch[f"teacher_{view}"]) if batch[f"teacher_{view}"].dtype == object
                      else batch[f"teacher_{view}"])


def _with_groups(ctx: StepContext, batch, features: dict[str, Tensor]) -> dict[str, Tensor]:
    """Adds the rows' group ids [B] (``group`` column of the training data, e.g. a caption's image) for the queue
    losses' same-group mask."""
    if "group" in batch:
        features["group"] = ctx.tensor(batch["group"], dtype=torch.long)
    return features


def congen_features(ctx: StepContext, batch) -> Features:
    """ConGen: the teacher saw only the control view; the student embeds both views (docs/methods.md, ConGen)."""
    control, generalize = ctx.encode_views(batch["text_control"], batch["text_generalize"])  # [B, D_t] each
    return _with_groups(ctx, batch, {
        "teacher": _teacher(ctx, batch, "control"),  # [B, D_t], L2-normalised, frozen
        "student_control": control,
        "student_generalize": generalize,
    }), None


def sct_features(ctx: StepContext, batch) -> Features:
    """SCT self-supervised: online passes with grad; the reference is the *same* model again under no_grad,
    still in train mode, so it draws a fresh dropout mask (docs/methods.md, SCT; eval mode would change the method)."""
    online_a, online_b = ctx.encode_views(batch["text_a"], batch["text_b"])  # [B, d] each
    with torch.no_grad():
        reference_a, reference_b = ctx.encode_views(batch["text_a"], batch["text_b"])  # other dropout masks
    return _with_groups(ctx, batch, {"online_a": online_a, "online_b": online_b, "reference_a": reference_a,
                                     "reference_b": reference_b}), None


def sct_distill_features(ctx: StepContext, batch) -> Features:
    """SCT distillation: precomputed teacher vectors of both views are the references. With the paper's joint
    objective (L_SCT + L_CD) the student's own no-grad, dropout-on reference passes are added for L_SCT."""
    student_a, student_b = ctx.encode_views(batch["text_a"], batch["text_b"])
    features = {"student_a": student_a, "student_b": student_b,
                "teacher_a": _teacher(ctx, batch, "a"), "teacher_b": _teacher(ctx, batch, "b")}
    if getattr(ctx.loss, "self_supervised", None) is not None:
        with torch.no_grad():
            features["reference_a"], features["reference_b"] = ctx.encode_views(batch["text_a"], batch["text_b"])
    return _with_groups(ctx, batch, features), None


def single_view_features(ctx: StepContext, batch) -> Features:
    """CKD / L2: the same sentence for teacher and student (docs/methods.md, DistilCSE)."""
    return _with_groups(ctx, batch, {"student": ctx.encode(batch["text_a"]), "teacher": _teacher(ctx, batch, "a")}), None


def simcse_features(ctx: StepContext, batch) -> Features:
    """Unsupervised SimCSE: one sentence encoded twice (in one forward, as the authors' duplicated batch); the two
    dropout masks make the positive pair."""
    first, second = ctx.encode_views(batch["text_a"], batch["text_a"])
    return {"first": first, "second": second}, None


def triplet_features(ctx: StepContext, batch) -> Features:
    """Supervised SimCSE on NLI: anchor, entailed hypothesis (positive), contradicted hypothesis (hard negative)."""
    anchor, positive, negative = ctx.encode_views(batch["text_anchor"], batch["text_positive"],
                                                  batch["text_negative"])
    return {"anchor": anchor, "positive": positive, "negative": negative}, None


def dvbert_features(ctx: StepContext, batch) -> Features:
    """DvBERT siamese view: u, v of the pair, the teachers' mean class distribution; labels = gold classes. The
    loss mixes them with the annealing weight λ (0 → 1 over training; its step count is checkpointed with it)."""
    u, v = ctx.encode_views(batch["text_a"], batch["text_b"])
    return ({"u": u, "v": v, "teacher_probs": ctx.tensor(batch["teacher_probs"])},
            ctx.tensor(batch["label"], dtype=torch.long))


def pair_score_features(ctx: StepContext, batch) -> Features:
    """STS-B train: cos(u, v) regressed on the gold score / 5 (SBERT's CosineSimilarityLoss)."""
    u, v = ctx.encode_views(batch["text_a"], batch["text_b"])
    return {"u": u, "v": v}, ctx.tensor(batch["score"])


# ----------------------------------------------------------------------------------------------------------------
# Data builders of the supervised stages


def nli_triplets(max_rows: int | None, seed: int) -> dict[str, np.ndarray]:
    """(premise, entailed, contradicted) triplets of SNLI dev + MultiNLI dev (``objectives.load_nli_triplets``: the
    SimCSE recipe on the only labelled NLI data offline); a seeded subset of ``max_rows`` when given."""
    from raydistill.objectives import load_nli_triplets

    triplets = load_nli_triplets()
    rows = np.arange(len(triplets))
    if max_rows is not None and max_rows < len(rows):
        rows = np.sort(np.random.default_rng(seed).choice(len(rows), size=max_rows, replace=False))
    columns = np.array(triplets, dtype=object)[rows]  # [N, 3]
    return {"text_anchor": columns[:, 0], "text_positive": columns[:, 1], "text_negative": columns[:, 2]}


def _triplet_data(cfg: JobConfig, run_dir: Path):
    from raydistill.runtime.learner_group import ArrayData

    return ArrayData(nli_triplets(cfg.data.max_sentences, cfg.seed), seed=cfg.seed, shuffle=cfg.data.shuffle)


def _stsb_train_data(cfg: JobConfig, run_dir: Path):
    from raydistill.data import load_dataset
    from raydistill.runtime.learner_group import ArrayData

    pairs = list(load_dataset("stsb_train"))
    if cfg.data.max_sentences is not None and cfg.data.max_sentences < len(pairs):
        keep = np.sort(np.random.default_rng(cfg.seed).choice(len(pairs), cfg.data.max_sentences, replace=False))
        pairs = [pairs[i] for i in keep]
    return ArrayData({"text_a": np.array([p.sentence1 for p in pairs], dtype=object),
                      "text_b": np.array([p.sentence2 for p in pairs], dtype=object),
                      "score": np.array([p.score / 5.0 for p in pairs], dtype=np.float32)},
                     seed=cfg.seed, shuffle=cfg.data.shuffle)


def _dvbert_data(cfg: JobConfig, run_dir: Path):
    """Fine-tune (or reuse) the K NLI cross-encoder teachers in folds, refuse any below
    ``extra.teacher_training.min_accuracy``, and return the student's pairs with the teachers' mean out-of-fold
    class distribution (every pair labelled only by fold models that never trained on it).

    The teachers use every labelled pair shipped (or ``teacher_training.max_pairs``); the student a seeded subset
    of ``data.max_sentences`` of those pairs when set, as each pair has its out-of-fold labels either way."""
    from raydistill.runtime import dvbert_teachers as dv
    from raydistill.runtime.learner_group import ArrayData

    training = dv.TeacherTraining.from_dict({"seed": cfg.seed, **(cfg.extra.get("teacher_training") or {})})
    columns = dv.nli_pairs(training.max_pairs, training.seed)
    teachers = list(cfg.extra.get("teachers") or DVBERT_TEACHERS)
    infos = dv.ensure_nli_teachers(teachers, columns, training, cfg.resources.teacher)
    dv.check_teacher_accuracy(infos, training.min_accuracy)  # before the student spends a step on them
    soft, stats = dv.out_of_fold_soft_labels(infos, columns["label"])
    columns["teacher_probs"] = soft
    num_pairs = len(columns["label"])
    if cfg.data.max_sentences is not None and cfg.data.max_sentences < num_pairs:
        keep = np.sort(np.random.default_rng(cfg.seed).choice(num_pairs, size=cfg.data.max_sentences, replace=False))
        columns = {name: values[keep] for name, values in columns.items()}
    cache_stats = {"dvbert_teachers": [{k: info.get(k) for k in ("model", "dir", "heldout_accuracy", "fold_accuracy",
                                                                  "cached", "seconds")} for info in infos],
                   "teacher_pairs": num_pairs, **stats}
    return ArrayData(columns, seed=cfg.seed, shuffle=cfg.data.shuffle, cache_stats=cache_stats)


DVBERT_TEACHERS = ("minilm-l6", "bert-small")


# ----------------------------------------------------------------------------------------------------------------
# Validators (registered with config.register_validator; run by JobConfig.validate before anything starts)


def _require_views(cfg: JobConfig, spec: "MethodSpec") -> None:
    views = with_method_defaults(cfg).data
    missing = [v for v in spec.views if v not in views.views]
    if missing:
        raise cfg._error("data.views", f"method {cfg.method!r} reads the view(s) {missing}; give data.views "
                                       f"{{{', '.join(f'{k}: {v}' for k, v in spec.views.items())}}} "
                                       f"(augmentations of raydistill.augment), or leave data.views unset")
    needed = [v for v in spec.teacher_views if v not in spec.teacher_views_of(with_method_defaults(cfg))]
    if needed:
        raise cfg._error("data.teacher_views", f"method {cfg.method!r} needs teacher vectors of {list(spec.teacher_views)}")


def _check_extra(cfg: JobConfig, spec: "MethodSpec") -> None:
    allowed = set(COMMON_EXTRA) | set(spec.extra_keys)
    for key in cfg.extra:
        if key not in allowed:
            close = difflib.get_close_matches(key, sorted(allowed), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise cfg._error(f"extra.{key}", f"unknown field for method {cfg.method!r}{hint}; allowed: "
                                             f"{', '.join(sorted(allowed))}")
    bucket_tokens = cfg.extra.get("bucket_tokens")
    if bucket_tokens is not None and (isinstance(bucket_tokens, bool) or not isinstance(bucket_tokens, int)
                                      or bucket_tokens < 0):
        raise cfg._error("extra.bucket_tokens", f"expected an integer >= 0 (padded tokens per length-sorted "
                                                f"sub-batch; 0 = the batch in one call), got {bucket_tokens!r}")


def _check_loss_keys(cfg: JobConfig, spec: "MethodSpec") -> None:
    allowed = spec.allowed_loss_keys()
    for key in cfg.loss:
        if key not in allowed:
            close = difflib.get_close_matches(key, sorted(allowed), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise cfg._error(f"loss.{key}", f"not a parameter of the {cfg.method} loss{hint}; allowed: "
                                            f"{', '.join(sorted(allowed)) or '(none)'}")


def _make_validator(name: str):
    def validate(cfg: JobConfig):
        spec = METHODS[name]
        if spec.needs_teacher and not cfg.teacher:
            raise cfg._error("teacher", f"method {name!r} distils a teacher: set teacher (e.g. mpnet-base)")
        if not spec.needs_teacher and cfg.teacher and spec.teacher_views == () and spec.data_builder is None:
            raise cfg._error("teacher", f"method {name!r} trains without a teacher; remove teacher "
                                        f"(got {cfg.teacher!r})")
        _check_loss_keys(cfg, spec)
        _check_extra(cfg, spec)
        if spec.data_builder is None:
            _require_views(cfg, spec)
        effective = spec.loss_kwargs(cfg)
        queue_size = effective.get("queue_size")
        if queue_size and queue_size < cfg.train.batch_size:
            raise cfg._error("loss.queue_size", f"K={queue_size} (the {name} default when unset) is smaller than "
                                                f"train.batch_size={cfg.train.batch_size}: the FIFO queue must hold "
                                                "at least one batch")
        for key, value in effective.items():
            if (key.startswith("tau") or key.startswith("temperature")) and not (
                    isinstance(value, (int, float)) and value > 0):
                raise cfg._error(f"loss.{key}", f"must be a number > 0, got {value!r}")
        if "learnable_temperature" in effective and "temperature" in effective:
            from raydistill.objectives import LearnableScale

            bounds = {k: effective[k] for k in ("min_scale", "max_scale") if k in effective}
            try:
                LearnableScale(float(effective["temperature"]), bool(effective["learnable_temperature"]), **bounds)
            except ValueError as exc:
                raise cfg._error("loss.temperature", str(exc)) from None
        if effective.get("queue_init") is not None:
            from raydistill.objectives.queue import QUEUE_INITS

            if effective["queue_init"] not in QUEUE_INITS:
                raise cfg._error("loss.queue_init", f"{effective['queue_init']!r}; allowed: {', '.join(QUEUE_INITS)}")
            if effective["queue_init"] == "teacher" and not spec.shared_queues:
                raise cfg._error("loss.queue_init", f"'teacher' fills queues of teacher vectors; the {name} loss keeps "
                                                    "none (use random or empty)")
        if name == "dvbert":
            teachers = cfg.extra.get("teachers", list(DVBERT_TEACHERS))
            if not isinstance(teachers, list) or not teachers:
                raise cfg._error("extra.teachers", "a non-empty list of cross-encoder teacher models, e.g. "
                                                   "[minilm-l6, bert-small]")
            for i, teacher in enumerate(teachers):
                cfg._check_model(f"extra.teachers[{i}]", teacher)
            if len(set(teachers)) != len(teachers):
                raise cfg._error("extra.teachers", f"lists a teacher twice ({teachers}): identical teachers share "
                                                   "one cache entry and add no second view")
            try:
                from raydistill.runtime.dvbert_teachers import TeacherTraining

                TeacherTraining.from_dict(cfg.extra.get("teacher_training"))
            except (TypeError, ValueError) as exc:
                raise cfg._error("extra.teacher_training", str(exc)) from None
        for i, stage in enumerate(spec.stages):
            overrides = cfg.extra.get(f"stage{i + 2}")
            if overrides is not None and not isinstance(overrides, dict):
                raise cfg._error(f"extra.stage{i + 2}", "a mapping of train/loss/data overrides for stage "
                                                        f"{i + 2} ({stage})")
        return None

    return validate


COMMON_EXTRA = ("max_restarts", "log_every", "learner_timeout_s", "teacher_encoder", "bucket_tokens")


# ----------------------------------------------------------------------------------------------------------------
# The registry

_CONGEN = MethodSpec(
    name="congen",
    summary="ConGen (Limkonchotiwat et al., Findings EMNLP 2022): control + generalisation distillation",
    views={"control": "none", "generalize": "caption"},
    teacher_views=("control",),
    needs_teacher=True,
    # queue_init teacher: the authors' init (teacher vectors of sampled training sentences; paper: random is worse).
    default_loss={"queue_size": 16384, "tau_teacher": 0.05, "tau_student": 0.07, "queue_init": "teacher"},
    loss_class="ConGenLoss",
    loss_dim="teacher",
    batch_to_features=congen_features,
    project_to_teacher=True,
    student_sentences_per_row=2,
    shared_queues=1,
)

_SCT = MethodSpec(
    name="sct",
    summary="SCT (Limkonchotiwat et al., TACL 2023), self-supervised: cross-view KL to a dropout-noised reference",
    views={"a": "none", "b": "caption"},
    teacher_views=(),
    needs_teacher=False,
    default_loss={"queue_size": 65536, "tau_teacher": 0.02, "tau_student": 0.03},
    loss_class="SCTLoss",
    loss_dim="student",
    batch_to_features=sct_features,
    student_sentences_per_row=2,
)

_SCT_DISTILL = MethodSpec(
    name="sct-distill",
    summary="SCT distillation (TACL 2023): cross-view KL to cached teacher vectors of both views",
    views={"a": "none", "b": "caption"},
    teacher_views=("a", "b"),
    needs_teacher=True,
    # objective "joint" = the paper's L_SCT + L_CD (the authors' script trains L_CD only: objective "cd_only").
    default_loss={"queue_size": 65536, "tau_teacher": 0.04, "tau_student": 0.05, "objective": "joint",
                  "queue_init": "teacher"},
    loss_class="SCTDistillLoss",
    loss_dim="teacher",
    batch_to_features=sct_distill_features,
    project_to_teacher=True,
    student_sentences_per_row=2,
    shared_queues=2,
)

_CKD = MethodSpec(
    name="ckd",
    summary="CKD / DistilCSE stage 1 (Xu et al., 2023): InfoNCE of student vs teacher vectors + queue",
    views={"a": "none"},
    teacher_views=("a",),
    needs_teacher=True,
    # The authors' --temp 1 --temp_exp 1: logit scale e^1, i.e. tau = e^-1, learned.
    default_loss={"queue_size": 65536, "temperature": round(math.exp(-1.0), 6), "learnable_temperature": True,
                  "mse_weight": 0.0},
    loss_class="CKDLoss",
    loss_dim="teacher",
    batch_to_features=single_view_features,
    project_to_teacher=True,
    optimizer={"eps": 1e-8, "betas": (0.9, 0.98)},
    shared_queues=1,
    queue_init="empty",
    projection_activation="identity",  # the authors' Linear(768 → 1024), no activation
)

_SIMCSE_SUP = MethodSpec(
    name="simcse-sup",
    summary="supervised SimCSE on NLI triplets (DistilCSE stage 2; Gao et al., 2021)",
    views={},
    teacher_views=(),
    needs_teacher=False,
    default_loss={"tau": 0.05},
    loss_class="SupervisedSimCSELoss",
    batch_to_features=triplet_features,
    student_sentences_per_row=3,
    data_builder=_triplet_data,
    internal=True,
)

_STS_COSINE = MethodSpec(
    name="sts-cosine",
    summary="cosine-similarity regression on STS-B train (SBERT; DvBERT's last stage)",
    views={},
    teacher_views=(),
    needs_teacher=False,
    default_loss={},
    loss_class="CosineMSELoss",
    batch_to_features=pair_score_features,
    student_sentences_per_row=2,
    data_builder=_stsb_train_data,
    internal=True,
)

METHODS: dict[str, MethodSpec] = {spec.name: spec for spec in (
    _CONGEN,
    _SCT,
    _SCT_DISTILL,
    _CKD,
    dataclasses.replace(
        _CKD, name="distilcse",
        summary="DistilCSE (Xu et al., 2023): CKD on unlabeled text, then supervised SimCSE on NLI triplets",
        stages=("simcse-sup",),
        stage_defaults=({"train": {"lr": 5e-5, "epochs": 1, "batch_size": 64, "warmup_ratio": 0.1},
                         "loss": {"tau": 0.05}, "data": {"max_sentences": None}},),
        extra_keys=("stage2",)),
    MethodSpec(
        name="dvbert",
        summary="DvBERT (Cheng, SIGIR 2021): K NLI cross-encoder teachers, teacher annealing, then STS-B",
        views={},
        teacher_views=(),
        needs_teacher=False,
        default_loss={},
        loss_class="DvBERTLoss",
        loss_dim="student",
        batch_to_features=dvbert_features,
        student_sentences_per_row=2,
        data_builder=_dvbert_data,
        stages=("sts-cosine",),
        stage_defaults=({"train": {"lr": 2e-5, "epochs": 4, "batch_size": 16, "warmup_ratio": 0.1},
                         "data": {"max_sentences": None}},),
        extra_keys=("teachers", "teacher_training", "stage2")),
    MethodSpec(
        name="l2",
        summary="L2 baseline: regress the teacher vector (MSE)",
        views={"a": "none"},
        teacher_views=("a",),
        needs_teacher=True,
        default_loss={},
        loss_class="L2DistillLoss",
        batch_to_features=single_view_features,
        project_to_teacher=True),
    MethodSpec(
        name="simcse",
        summary="unsupervised SimCSE baseline (Gao et al., 2021): dropout views, InfoNCE",
        views={"a": "none"},
        teacher_views=(),
        needs_teacher=False,
        default_loss={"tau": 0.05},
        loss_class="SimCSELoss",
        batch_to_features=simcse_features,
        student_sentences_per_row=2),
    _SIMCSE_SUP,
    _STS_COSINE,
)}

METHODS = {name: dataclasses.replace(spec, validator=_make_validator(name)) for name, spec in METHODS.items()}
for _name, _spec in METHODS.items():
    register_validator(_name, _spec.validator)


def get_method(name: str) -> MethodSpec:
    if name not in METHODS:
        close = difflib.get_close_matches(name, list(METHODS), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise KeyError(f"unknown method {name!r}{hint}; known: {', '.join(job_methods())}")
    return METHODS[name]


def job_methods() -> list[str]:
    """Methods a job config may name (internal stages excluded)."""
    return [name for name, spec in METHODS.items() if not spec.internal]


# ----------------------------------------------------------------------------------------------------------------
# Method defaults and stages


_DEFAULT_VIEWS = {"a": "none"}


def with_method_defaults(cfg: JobConfig) -> JobConfig:
    """The config with the method's defaults filled in where the user left the field unset.

    ``data.views`` (when still the DataConfig default ``{a: none}``) and ``data.teacher_views`` (when empty) come
    from the method; ``loss`` is the method's defaults updated by the user's keys. The result is what is hashed,
    logged and checkpointed, so a run records the values it actually used.
    """
    spec = METHODS.get(cfg.method)
    if spec is None:
        return cfg
    data = cfg.to_dict()
    if spec.views and data["data"]["views"] == _DEFAULT_VIEWS:
        data["data"]["views"] = dict(spec.views)
    if spec.teacher_views and not data["data"]["teacher_views"]:
        data["data"]["teacher_views"] = list(spec.teacher_views)
    data["loss"] = spec.loss_kwargs(cfg)
    if data == cfg.to_dict():
        return cfg
    return JobConfig.from_dict(data, source=cfg._source, lines=cfg._lines)


@dataclass
class Stage:
    """One training stage of a job: its config, method, and directory (``best/``, ``checkpoints/``)."""

    index: int
    name: str
    cfg: JobConfig
    spec: MethodSpec
    run_dir: Path


def _deep_merge(base: dict, overrides: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def stage_config(cfg: JobConfig, index: int) -> JobConfig:
    """Config of stage ``index`` (≥ 1): the job's student/seed/resources/tracking, the stage method's data and loss,
    the job's ``train`` updated by the method's stage defaults and then by the user's ``extra.stage<index+1>``."""
    spec = METHODS[cfg.method]
    stage_method = spec.stages[index - 1]
    stage_spec = METHODS[stage_method]
    base = cfg.to_dict()
    plain = {
        "method": stage_method, "student": cfg.student, "teacher": None, "seed": cfg.seed, "run_dir": None,
        "cache_dir": cfg.cache_dir, "student_pooling": cfg.student_pooling, "teacher_pooling": None,
        "data": {**base["data"], "views": dict(stage_spec.views) or _DEFAULT_VIEWS, "teacher_views": []},
        "train": base["train"], "loss": {}, "resources": base["resources"], "tracking": base["tracking"],
        "extra": {k: v for k, v in cfg.extra.items() if k in COMMON_EXTRA},
    }
    defaults = spec.stage_defaults[index - 1] if index - 1 < len(spec.stage_defaults) else {}
    plain = _deep_merge(plain, defaults)
    user = cfg.extra.get(f"stage{index + 1}") or {}
    unknown = set(user) - {"train", "loss", "data", "resources"}
    if unknown:
        raise cfg._error(f"extra.stage{index + 1}", f"unknown section(s) {sorted(unknown)}; allowed: train, loss, "
                                                    "data, resources")
    plain = _deep_merge(plain, user)
    try:
        stage_cfg = JobConfig.from_dict(plain, source=f"{cfg._source or 'config'} (extra.stage{index + 1})")
        return with_method_defaults(stage_cfg).validate()
    except ConfigError as exc:
        raise ConfigError(f"stage {index + 1} ({stage_method}) of method {cfg.method!r}: {exc}") from None


def stage_plan(cfg: JobConfig) -> list[Stage]:
    """The stages of ``cfg``'s method. One stage: it lives in the run dir itself; several: ``stage<i>-<method>/``."""
    spec = METHODS[cfg.method]
    run_dir = cfg.resolved_run_dir()
    if not spec.stages:
        return [Stage(1, cfg.method, cfg, spec, run_dir)]
    stages = [Stage(1, cfg.method, cfg, spec, run_dir / f"stage1-{cfg.method}")]
    for i, name in enumerate(spec.stages, start=1):
        stages.append(Stage(i + 1, name, stage_config(cfg, i), METHODS[name], run_dir / f"stage{i + 1}-{name}"))
    return stages
