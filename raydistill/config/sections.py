"""The job config's sections other than ``loss``/``extra``: their fields, types, ranges, defaults and ``--help``
descriptions. Each is a ``@section`` (``raydistill.config.schema``): a wrong type, a value out of range or an unknown
key is refused while the config is built, naming the field. ``raydistill.config.job`` assembles them into
``JobConfig`` and re-exports them; import them from there.
"""

from __future__ import annotations

import dataclasses
import re

from typing import Annotated, Literal

from pydantic import AfterValidator, BeforeValidator, Field, StrictBool, model_validator

from raydistill.config.schema import Float, Int, none_is_default, section, states, str_is_list
from raydistill.data.evaluation_text import EVALUATION_DATASETS

_Section = Annotated  # a nested section field: ``_Section[TrainConfig, _DEFAULTS_IF_NULL]``
_DEFAULTS_IF_NULL = BeforeValidator(none_is_default)


@states(">= 0.5")
def data_headroom(value: float) -> float:
    """``data_max_cpus``: the CPUs a job must leave to Ray Data."""
    if value < 0.5:
        raise ValueError(f"{value} is below 0.5: Ray Data needs CPU headroom or the pipeline hangs "
                         "(ray-project/ray#44687)")
    return value


def _non_empty(what: str):
    def check(value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError(f"must be a non-empty {what}")
        return value
    return AfterValidator(check)


@states("no '/' or ':'")
def _registered_model_name(value: str | None) -> str | None:
    # MLflow addresses a version as models:/<name>/<version>: it refuses '/' and ':' in a name, and a blank one.
    if value is not None and (not value.strip() or any(c in value for c in "/:") or value.strip() in (".", "..")):
        raise ValueError(f"{value!r} is no MLflow registered model name: it must be non-empty, without '/' or ':'")
    return value


# Evaluations in a row without a new best dev score that end a run trained to a budget (unless train.patience says
# otherwise): ConGen's scripts stop after 7 epochs without a new best, and on the small corpora the engine evaluates
# at every epoch end, so 7 evaluations are 7 epochs; on a large corpus 7 x train.eval_every steps sit out a noisy
# evaluation or two.
BUDGET_PATIENCE = 7


@dataclasses.dataclass(frozen=True)
class Budget:
    """``train.budget`` read: a number of optimiser steps, or wall seconds of training (exactly one is set)."""

    steps: int | None = None
    seconds: float | None = None

    def describe(self) -> str:
        from raydistill.durations import exact_duration

        return f"{self.steps} steps" if self.steps is not None else exact_duration(self.seconds)


_STEPS = re.compile(r"(\d+)\s*steps?")


def parse_budget(value: object) -> Budget:
    """``1500``, ``"1500"``, ``"1500steps"``, ``"1500 steps"``: steps; ``"30m"``, ``"2h"``, ``"90s"``, ``"1h30m"``:
    wall time. ValueError (saying what is accepted) otherwise, or for a budget that is not > 0."""
    from raydistill.durations import parse_duration

    expected = "a number of steps (1500, \"1500 steps\") or a wall time (\"90s\", \"30m\", \"2h\", \"1h30m\")"
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"expected {expected}, got {value!r}")
    text = str(value).strip().lower()
    steps = re.fullmatch(r"[+-]?\d+", text) or _STEPS.fullmatch(text)
    if steps:
        count = int(steps.group(1) if steps.groups() else text)
        if count <= 0:
            raise ValueError(f"a step budget must be > 0 steps, got {value!r}")
        return Budget(steps=count)
    try:
        return Budget(seconds=parse_duration(text))
    except ValueError:
        raise ValueError(f"expected {expected}, got {value!r}") from None


@states("steps or wall time")
def _budget(value: object) -> str | None:
    # One spelling per budget ("30m" and "1800s" are the same run, and hash the same).
    return None if value is None else parse_budget(value).describe()


# ----------------------------------------------------------------------------------------------------------------
# Sections


@section
class RoleResources:
    """Resources of one actor role (teacher, queue). Applied with ``.options()``, never in decorators."""

    num_actors: Int = Field(1, gt=0, description="actors of this role")
    num_cpus: Float = Field(1, ge=0, description="CPUs Ray reserves for each actor of this role")
    num_gpus: Float = Field(0, ge=0, description="GPUs (fractions allowed) Ray reserves for each actor of this role")
    threads: Int = Field(1, gt=0, description="torch intra-op threads inside each actor of this role (Ray gives "
                                               "fractional-CPU actors 1 thread otherwise)")
    batch_size: Int = Field(128, gt=0, description="sentences per forward pass (teacher)")
    max_tokens: Int | None = Field(None, gt=0, description="teacher only: padded tokens per forward pass (null: "
                                                           "raydistill.runtime.teachers.teacher.DEFAULT_TEACHER_MAX_"
                                                           "TOKENS)")
    # raydistill.runtime.teachers.teacher.PRECISIONS
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto", description="teacher only: auto, fp32 or bf16 (auto: bf16 where the CPU or GPU multiplies bf16 "
                            "natively; bf16 vectors are cached apart from fp32 ones)")


@section
class LearnerResources:
    """Where and with what the learners run."""

    num_learners: Int = Field(0, ge=0, description="0 = the learner runs in the driver process (tests, laptops), "
                                                   "like RLlib's LearnerGroup; N = N Ray Train workers")
    num_cpus: Float = Field(1, ge=0, description="CPUs Ray reserves for each learner")
    num_gpus: Float = Field(0, ge=0, description="GPUs (fractions allowed) Ray reserves for each learner")
    threads: Int = Field(2, gt=0, description="torch intra-op threads of each learner")
    cpu_speedups: StrictBool = Field(
        True, description="on CPU, models/speedups.py: dropout masks from a quarter of the random draws (same p), "
                          "the word-embedding gradient in one reused buffer (same values); false: torch's own")


@dataclasses.dataclass(frozen=True)
class Reservation:
    """The CPUs and GPUs a job's long-lived actors hold for its whole run, and the words an error explains them with."""

    cpus: float
    gpus: float
    cpu_terms: str  # the sum behind ``cpus``: "learners 2 x 0.5 CPU + queue 0.5 CPU"
    holders: str  # who asks for the GPUs: "learners and queue"
    cpu_fix: str  # the fields that lower ``cpus``
    gpu_fix: str  # the fields that lower ``gpus``


@section
class ResourcesConfig:
    """What each actor role reserves (``RUNTIME_ONLY_FIELDS``: a run resumes across changes here)."""

    num_cpus: Float = Field(2, gt=0, description="CPUs of the local Ray that raydistill starts itself (unused on a "
                                                 "cluster)")
    teacher: _Section[RoleResources, _DEFAULTS_IF_NULL] = Field(default_factory=RoleResources,
                                                                description="the teacher-pass actors")
    learner: _Section[LearnerResources, _DEFAULTS_IF_NULL] = Field(default_factory=LearnerResources,
                                                                   description="the learners")
    queue: _Section[RoleResources, _DEFAULTS_IF_NULL] = Field(default_factory=lambda: RoleResources(num_cpus=0),
                                                              description="the shared queue actors")
    data_max_cpus: Annotated[Float, AfterValidator(data_headroom)] = Field(
        0.5, description="CPUs that actors must leave to Ray Data: with every CPU held by actors, Data's tasks "
                         "never get scheduled and the job hangs (ray-project/ray#44687); also written "
                         "resources.data.max_cpus")

    def actor_reservation(self) -> Reservation:
        """What the learners and the shared queue actors hold for the whole run."""
        learners = self.learner.num_learners
        return Reservation(
            cpus=learners * self.learner.num_cpus + self.queue.num_cpus,
            gpus=learners * self.learner.num_gpus + self.queue.num_gpus,
            cpu_terms=f"learners {learners} x {self.learner.num_cpus:g} CPU + queue {self.queue.num_cpus:g} CPU",
            holders="learners and queue",
            cpu_fix="lower resources.learner.num_cpus / num_learners (fractions like 0.5 are fine)",
            gpu_fix="set resources.learner.num_gpus: 0",
        )


@section
class DataConfig:
    """The training text and how each view of it is made."""

    corpus: str = Field("flickr", description="flickr | nli | flickr+nli | mixed | file:<path>[#column] (.txt, "
                                              "JSON Lines, CSV/TSV, Parquet, a datasets directory; docs/data.md)")
    max_sentences: Int | None = Field(20000, gt=0, description="training sentences read from the corpus (null: all)")
    evaluation_set_split: Literal[EVALUATION_DATASETS] | None = Field(
        None, description="the evaluation set a file: corpus is a training split of, tested on its other split with "
                          "no sentence shared (a domain benchmark): its sentences stay in the corpus, every other "
                          "evaluation set's are removed")
    views: dict[str, str] = Field(default_factory=lambda: {"a": "none"},
                                  description="view name -> augmentation spec of raydistill.augment (none = the "
                                              "sentence itself, caption = another caption of the same image, "
                                              "delete:0.1, ...); each view becomes a text_<view> column")
    teacher_views: Annotated[list[str], BeforeValidator(str_is_list)] = Field(
        default_factory=list, description="views whose teacher embeddings the method needs (empty: the method's)")
    max_length: Int = Field(32, gt=0, description="student tokens per sentence")
    teacher_max_length: Int = Field(128, gt=0, description="teacher tokens per sentence")
    shuffle: StrictBool = Field(True, description="shuffle the training rows every epoch")

    @model_validator(mode="after")
    def _split_of_a_file(self):
        if self.evaluation_set_split is not None and not self.corpus.startswith("file:"):
            raise ValueError(f"evaluation_set_split {self.evaluation_set_split!r} is for a file: corpus split from "
                             f"that set, not corpus {self.corpus!r}")
        return self


@section
class TrainConfig:
    """The optimisation."""

    batch_size: Int = Field(128, gt=0, description="rows per training step")
    lr: Float = Field(5e-4, gt=0, description="peak learning rate (AdamW, linear warm-up then linear decay)")
    epochs: Int = Field(1, gt=0, description="passes over the training data")
    max_steps: Int | None = Field(None, gt=0, description="stop after this many steps (null: run the epochs)")
    warmup_ratio: Float = Field(0.1, ge=0, lt=1, description="share of the steps spent warming the learning rate up")
    weight_decay: Float = Field(0.01, ge=0, description="AdamW weight decay")
    grad_clip: Float = Field(1.0, ge=0, description="clip the gradient norm to this (0: no clipping)")
    eval_every: Int = Field(100, gt=0, description="evaluate STS-B dev every N steps (and at each epoch end); the "
                                                   "best-dev model is kept")
    checkpoint_every: Int = Field(200, gt=0, description="write a resumable checkpoint every N steps")
    keep_last: Int = Field(2, gt=0, description="checkpoints kept on disk")
    patience: Int | None = Field(None, gt=0, description="stop after this many dev evaluations without a new best "
                                                         f"(null: never; {BUDGET_PATIENCE} with a budget)")
    budget: Annotated[str | None, BeforeValidator(_budget)] = Field(
        None, description="train to a budget instead of train.epochs: steps (1500, \"1500 steps\"; the data repeats "
                          "as often as they need) or wall time (\"90s\", \"30m\", \"2h\": the total steps are fixed "
                          "from the step rate measured early in the run); the LR schedule spans the budget (null: "
                          "train.epochs / max_steps)")
    dev_pairs: Annotated[str | None, _non_empty("path")] = Field(
        None, description="a file of scored pairs (sentence1, sentence2, score: TSV, CSV, JSON Lines, Parquet) that "
                          "the dev evaluations score instead of STS-B dev: they choose the best model and drive "
                          "early stopping (ROC AUC x 100 when every score is 0 or 1, else Spearman x 100)")
    # bf16 matrix products run 2-4x faster than fp32 with AVX512-BF16 (or AMX), tens of times slower where torch
    # emulates them (AVX2 only: the learner warns); bench/train_step.py, docs/benchmarks.md.
    precision: Literal["fp32", "bf16"] = Field(
        "fp32", description="fp32, or bf16: the student's forward and backward under torch.autocast(bfloat16) (and "
                            "ConGen's products against the queue); weights, optimiser state, queue and softmax stay "
                            "fp32")

    @model_validator(mode="after")
    def _one_length(self):
        if self.budget is not None and self.max_steps is not None:
            raise ValueError(f"budget {self.budget!r} and max_steps {self.max_steps} both set the length of the run; "
                             "set one of them")
        return self

    def budget_limit(self) -> Budget | None:
        """``budget`` read (None: no budget, the run is ``epochs`` / ``max_steps`` long)."""
        return None if self.budget is None else parse_budget(self.budget)

    def stop_patience(self) -> int | None:
        """Evaluations without a new best that stop the run: ``patience``, else ``BUDGET_PATIENCE`` with a budget."""
        if self.patience is not None:
            return self.patience
        return BUDGET_PATIENCE if self.budget is not None else None


@section
class TrackingConfig:
    """MLflow."""

    enabled: StrictBool = Field(True, description="record the run in MLflow")
    tracking_uri: str | None = Field(None, description="MLflow store (null: $MLFLOW_TRACKING_URI, else "
                                                       "sqlite:///<cwd>/mlflow.db)")
    experiment: Annotated[str, _non_empty("name")] = Field("raydistill", description="MLflow experiment name")
    run_name: str | None = Field(None, description="MLflow run name (null: generated)")
    register_model: Annotated[str | None, AfterValidator(_registered_model_name)] = Field(
        None, description="register the job's best student in the MLflow Model Registry under this name, a new "
                          "version each run (null: logged as an MLflow model, not registered); --register NAME")

    @model_validator(mode="after")
    def _registering_needs_tracking(self):
        if self.register_model is not None and not self.enabled:
            raise ValueError(f"register_model {self.register_model!r} needs enabled: true (the model is registered "
                             "from the job's MLflow run)")
        return self


@section
class RuntimeConfig:
    """How a run is kept alive, watched and stored: never what it trains (``RUNTIME_ONLY_FIELDS``)."""

    max_restarts: Int = Field(3, ge=0, description="worker-group failures Ray Train retries from the newest "
                                                   "checkpoint (a lost node or worker; 0: none)")
    learner_timeout_s: Float | None = Field(None, gt=0, description="seconds the learners may send nothing before "
                                                                    "the job stops saying how to resume (null: 600)")
    log_every: Int | None = Field(None, ge=1, description="steps between progress lines (null: about 50 per run, "
                                                          "or every 30 s)")
    storage_path: Annotated[str | None, _non_empty("path or pyarrow filesystem URI")] = Field(
        None, description="where Ray Train workers persist the checkpoints: <storage_path>/<run dir name>/ (a local "
                          "path or pyarrow filesystem URI; null: the run dir). Not to be changed mid-run")
