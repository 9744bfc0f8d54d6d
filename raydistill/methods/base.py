"""What every method is made of: ``MethodSpec`` (data, student, loss, checks) and the ``StepContext`` a step sees.

A method turns a batch of training rows into its loss's inputs:

    features, labels = spec.batch_to_features(ctx, batch)   # student forward passes (+ frozen teacher vectors)
    output = loss_module(features, labels)                  # LossOutput(loss, parts)

Batches are dicts of numpy columns: ``text_<view>`` (object arrays of str), ``teacher_<view>`` (float32 [B, D],
the frozen teacher's cached vectors), ``group`` (int64 [B], a caption group id), ``idx`` and, for the labelled
sets, their label columns. Which rows a method trains on is declared by ``MethodSpec.dataset``; the runtime builds
them, so a method never starts an actor or reads a cache itself.
"""

from __future__ import annotations

import difflib
import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor, nn

from raydistill.runtime.config import JobConfig

__all__ = ["MethodSpec", "StepContext", "Features", "COMMON_EXTRA", "CORPUS", "teacher_vectors", "with_groups"]

# The unlabeled text of ``data.corpus`` with its views and the teacher's cached vectors of ``data.teacher_views``;
# every other ``MethodSpec.dataset`` names a labelled set that the runtime builds for that method.
CORPUS = "corpus"

# ``extra`` keys every method accepts (read by the runtime, not the method).
COMMON_EXTRA = ("max_restarts", "log_every", "learner_timeout_s", "teacher_encoder", "bucket_tokens", "storage_path")

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


@dataclass(frozen=True)
class MethodSpec:
    """One method: its rows, views, loss, how a batch becomes the loss's features, checks, later stages.

    ``dataset``: the rows it trains on: ``CORPUS`` (unlabeled text + cached teacher vectors), or the name of a
    labelled set the runtime builds (``nli_triplets``, ``stsb_train``, ``nli_teacher_labels``).
    ``stages``: methods run after this one in the same job, each starting from the previous stage's best model
    (DistilCSE: CKD then supervised SimCSE on NLI; DvBERT: NLI with teacher annealing, then STS-B).
    ``check(cfg)``: the method's own config checks beyond the common ones (raise ``cfg._error(path, message)``).
    """

    name: str
    summary: str
    views: dict[str, str]
    teacher_views: tuple[str, ...]
    needs_teacher: bool
    default_loss: dict[str, Any]
    loss_class: type  # an nn.Module of raydistill.objectives: loss(features, labels) -> LossOutput
    batch_to_features: Callable[[StepContext, dict[str, np.ndarray]], Features]
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
    extra_keys: tuple[str, ...] = ()
    internal: bool = False  # a later stage of another method (still runnable on its own)

    # ------------------------------------------------------------------------------------------------------------

    @property
    def reads_corpus(self) -> bool:
        return self.dataset == CORPUS

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

    def build_loss(self, cfg: JobConfig, *, student_dim: int, teacher_dim: int | None, total_steps: int | None = None,
                   queues: list | None = None) -> nn.Module:
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

    def queue_kwargs(self, cfg: JobConfig, index: int = 0) -> dict[str, Any]:
        """Init of teacher queue ``index``: the loss's own rule (seed + index, as the losses seed their queues)."""
        kwargs = self.loss_kwargs(cfg)
        return {"init": kwargs.get("queue_init", self.queue_init), "seed": int(kwargs.get("queue_seed", 0)) + index}

    def shares_queue(self, cfg: JobConfig) -> bool:
        return self.shared_queues > 0 and int(self.loss_kwargs(cfg).get("queue_size") or 0) > 0

    def allowed_loss_keys(self) -> set[str]:
        params = inspect.signature(self.loss_class).parameters
        return (set(params) - {"dim", "queue", "total_steps", "self"}) | set(self.default_loss)

    # ------------------------------------------------------------------------------------------------------------
    # Checks of a config naming this method (pure: no file, model or cluster is touched)

    def validate(self, cfg: JobConfig, effective_views: dict[str, str], effective_teacher_views: list[str]) -> None:
        """Raise ``ConfigError`` naming the field when ``cfg`` cannot train this method."""
        if self.needs_teacher and not cfg.teacher:
            raise cfg._error("teacher", f"method {self.name!r} distils a teacher: set teacher (e.g. mpnet-base)")
        if not self.needs_teacher and cfg.teacher and not self.teacher_views and self.reads_corpus:
            raise cfg._error("teacher", f"method {self.name!r} trains without a teacher; remove teacher "
                                        f"(got {cfg.teacher!r})")
        self._check_loss_keys(cfg)
        self._check_extra(cfg)
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
        for key, value in effective.items():
            if (key.startswith("tau") or key.startswith("temperature")) and not (
                    isinstance(value, (int, float)) and value > 0):
                raise cfg._error(f"loss.{key}", f"must be a number > 0, got {value!r}")
        if effective.get("queue_init") is not None:
            from raydistill.objectives.queue import QUEUE_INITS

            if effective["queue_init"] not in QUEUE_INITS:
                raise cfg._error("loss.queue_init", f"{effective['queue_init']!r}; allowed: {', '.join(QUEUE_INITS)}")
            if effective["queue_init"] == "teacher" and not self.shared_queues:
                raise cfg._error("loss.queue_init", f"'teacher' fills queues of teacher vectors; the {self.name} "
                                                    "loss keeps none (use random or empty)")
        for i, stage in enumerate(self.stages):
            overrides = cfg.extra.get(f"stage{i + 2}")
            if overrides is not None and not isinstance(overrides, dict):
                raise cfg._error(f"extra.stage{i + 2}", "a mapping of train/loss/data overrides for stage "
                                                        f"{i + 2} ({stage})")
        if self.check is not None:
            self.check(cfg)

    def _check_loss_keys(self, cfg: JobConfig) -> None:
        allowed = self.allowed_loss_keys()
        for key in cfg.loss:
            if key not in allowed:
                raise cfg._error(f"loss.{key}", f"not a parameter of the {cfg.method} loss{_did_you_mean(key, allowed)}; "
                                                f"allowed: {', '.join(sorted(allowed)) or '(none)'}")

    def _check_extra(self, cfg: JobConfig) -> None:
        allowed = set(COMMON_EXTRA) | set(self.extra_keys)
        for key in cfg.extra:
            if key not in allowed:
                raise cfg._error(f"extra.{key}", f"unknown field for method {cfg.method!r}"
                                                 f"{_did_you_mean(key, allowed)}; allowed: {', '.join(sorted(allowed))}")
        for key, (accepts, expected) in _COMMON_EXTRA_TYPES.items():
            value = cfg.extra.get(key)
            if value is not None and not accepts(value):
                raise cfg._error(f"extra.{key}", f"expected {expected}, got {value!r}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_positive_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


# The runtime's ``extra`` settings: (check, what is expected). Checked with the config, before Ray starts, because the
# runtime reads them only once the learners start (after the teacher pass).
_COMMON_EXTRA_TYPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "max_restarts": (lambda v: _is_int(v) and v >= 0, "an integer >= 0 (worker-group failures retried)"),
    "learner_timeout_s": (_is_positive_number, "a number of seconds > 0 (how long the learners may send nothing)"),
    "log_every": (lambda v: _is_int(v) and v >= 1, "an integer >= 1 (steps between progress lines)"),
    "storage_path": (lambda v: isinstance(v, str) and bool(v.strip()),
                     "a non-empty path or pyarrow filesystem URI (where Ray Train persists the checkpoints)"),
    "teacher_encoder": (lambda v: v in ("bi", "cross"), "'bi' (sentence embeddings) or 'cross' (pair scores)"),
    "bucket_tokens": (lambda v: _is_int(v) and v >= 0, "an integer >= 0 (padded tokens per length-sorted "
                                                       "sub-batch; 0 = the batch in one call)"),
}


def _did_you_mean(key: str, allowed) -> str:
    close = difflib.get_close_matches(key, sorted(allowed), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def check_learnable_temperature(cfg: JobConfig, effective: dict[str, Any]) -> None:
    """A learnable logit scale must start strictly inside its clamp bounds (else it can never move)."""
    from raydistill.objectives import LearnableScale

    bounds = {k: effective[k] for k in ("min_scale", "max_scale") if k in effective}
    try:
        LearnableScale(float(effective["temperature"]), bool(effective["learnable_temperature"]), **bounds)
    except ValueError as exc:
        raise cfg._error("loss.temperature", str(exc)) from None

