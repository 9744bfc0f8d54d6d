"""Job configuration: the schema of a job (``JobConfig`` and its sections), YAML loading, ``--set a.b=c`` overrides,
validation and the config hash.

A distillation job is described by one YAML file. Everything that changes *what is trained* lives in
``method``/``student``/``teacher``/``data``/``train``/``loss``/``extra``; everything that changes only *where and how
fast* it runs, or how it is watched and kept, lives in ``resources``, ``tracking`` and ``runtime``. That split is
what ``config_hash()`` relies on: a run checkpointed on a laptop resumes on a GPU cluster when only those sections
change. The shipped ``*-gpu.yaml`` configs also change scale knobs (data, epochs, batch), so they are other runs,
not the same one moved.

Every section is a pydantic dataclass (``raydistill.config.schema``): unknown keys, wrong types, values out of range
and NaN or infinity are refused while the config loads, with the file, the line, the field and the closest valid
name, because a silently ignored key would train with the default and waste a run. ``loss`` and ``extra`` are the
method's: their schema is declared by the method (``raydistill.methods``) and checked by ``validate_method``.
``validate()`` adds the checks across fields (views against teacher views, queue size against batch size, the
corpus and augmentation specs). It is pure: it reads no file, model or cluster. ``raydistill.runtime.engine.
preflight.preflight`` adds, explicitly, what touches the machine (models, data files, writable output directories)
before any Ray actor exists, so a bad config fails in a second instead of after the teacher pass.

``extra.max_restarts``, ``extra.learner_timeout_s``, ``extra.log_every`` and ``extra.storage_path`` are read from
``runtime:`` now; a config that still sets them under ``extra`` loads with one ``ConfigDeprecationWarning`` per key
naming the new field (old configs, run dirs and scripts keep working; the hash is the same either way, since both
spellings are runtime-only fields), and ``cfg.extra.get(<key>)`` still answers from ``runtime``.

    cfg = JobConfig.from_yaml("configs/congen.yaml", overrides=["train.lr=1e-4", "loss.queue_size=16384"])
    cfg.validate()             # across fields; preflight(cfg) checks the method, models, files and directories
    cfg.config_hash()          # stable across processes; ignores RUNTIME_ONLY_FIELDS (resources, tracking, ...)
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import os
import re
import warnings
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BeforeValidator, Field, StrictBool

from raydistill.nested import flatten
from raydistill.config.schema import (
    ConfigError,
    Float,
    Int,
    build,
    finite_everywhere,
    line_of,
    none_is_default,
    section,
    states,
    str_is_list,
    suggest,
    where,
)

__all__ = [
    "ConfigError",
    "ConfigDeprecationWarning",
    "RoleResources",
    "LearnerResources",
    "ResourcesConfig",
    "DataConfig",
    "TrainConfig",
    "TrackingConfig",
    "RuntimeConfig",
    "JobConfig",
    "MethodSettings",
    "raydistill_home",
    "DEFAULT_HASH_EXCLUDE",
    "RUNTIME_ONLY_FIELDS",
    "RUNTIME_KNOBS",
]


class ConfigDeprecationWarning(FutureWarning):
    """A config spelling that still loads but has moved (shown by default: it is meant for the person running)."""


_Section = Annotated  # a nested section field: ``_Section[TrainConfig, _DEFAULTS_IF_NULL]``
_DEFAULTS_IF_NULL = BeforeValidator(none_is_default)
_CORPORA = ("flickr", "nli", "flickr+nli", "mixed")  # raydistill.data.corpus.NAMED_CORPORA
_MISSING = object()


@states(">= 0.5")
def _data_headroom(value: float) -> float:
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
    data_max_cpus: Annotated[Float, AfterValidator(_data_headroom)] = Field(
        0.5, description="CPUs that actors must leave to Ray Data: with every CPU held by actors, Data's tasks "
                         "never get scheduled and the job hangs (ray-project/ray#44687); also written "
                         "resources.data.max_cpus")


@section
class DataConfig:
    """The training text and how each view of it is made."""

    corpus: str = Field("flickr", description="flickr | nli | flickr+nli | mixed | file:<path>[#column] (.txt, "
                                              "JSON Lines, CSV/TSV, Parquet, a datasets directory; docs/data.md)")
    max_sentences: Int | None = Field(20000, gt=0, description="training sentences read from the corpus (null: all)")
    views: dict[str, str] = Field(default_factory=lambda: {"a": "none"},
                                  description="view name -> augmentation spec of raydistill.augment (none = the "
                                              "sentence itself, caption = another caption of the same image, "
                                              "delete:0.1, ...); each view becomes a text_<view> column")
    teacher_views: Annotated[list[str], BeforeValidator(str_is_list)] = Field(
        default_factory=list, description="views whose teacher embeddings the method needs (empty: the method's)")
    max_length: Int = Field(32, gt=0, description="student tokens per sentence")
    teacher_max_length: Int = Field(128, gt=0, description="teacher tokens per sentence")
    shuffle: StrictBool = Field(True, description="shuffle the training rows every epoch")


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
                                                         "(null: never)")
    # On a CPU with AVX512-BF16 (or AMX) bf16 matrix products run 2-4x faster than fp32; on a CPU without them (AVX2
    # only) torch emulates bf16 products, tens of times slower than fp32, and the learner warns. bench/train_step.py
    # measures the speed; committed ConGen runs the 7-STS cost (docs/benchmarks.md).
    precision: Literal["fp32", "bf16"] = Field(
        "fp32", description="fp32, or bf16: the student's forward and backward under torch.autocast(bfloat16) (and "
                            "ConGen's products against the queue); weights, optimiser state, queue and softmax stay "
                            "fp32")


@section
class TrackingConfig:
    """MLflow."""

    enabled: StrictBool = Field(True, description="record the run in MLflow")
    tracking_uri: str | None = Field(None, description="MLflow store (null: $MLFLOW_TRACKING_URI, else "
                                                       "sqlite:///<cwd>/mlflow.db)")
    experiment: Annotated[str, _non_empty("name")] = Field("raydistill", description="MLflow experiment name")
    run_name: str | None = Field(None, description="MLflow run name (null: generated)")


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


#: Keys that used to live under ``extra`` and moved to ``runtime``.
RUNTIME_KNOBS = ("max_restarts", "learner_timeout_s", "log_every", "storage_path")

# Fields that change how a run is executed, watched or kept, never what it trains: they may change between the
# invocations of one run, and a checkpoint resumes across them. The config hash leaves out exactly these, and a
# "written by a different config" refusal names them as the settings that may change. (Where the checkpoints live,
# runtime.storage_path, is left out too but checked on its own: resume.check_resume refuses to move a started
# run.) train.checkpoint_every only places the next checkpoints: saving reads the state and draws no random number,
# and a resume continues from the manifest's step, epoch and batch, so the steps trained are the same at any
# interval. The extra.* paths are where configs stored before the runtime section existed keep the runtime knobs.
RUNTIME_ONLY_FIELDS = (
    "resources", "tracking", "runtime", "run_dir", "cache_dir",
    "train.eval_every", "train.checkpoint_every", "train.keep_last",
    "extra.learner_timeout_s", "extra.max_restarts", "extra.log_every", "extra.storage_path",
)
DEFAULT_HASH_EXCLUDE = RUNTIME_ONLY_FIELDS

_SECTION_ALIASES = {
    # runtime.md writes the Data cap as a nested block; both spellings load into data_max_cpus.
    ("resources", "data"): ("max_cpus", "data_max_cpus"),
}


# Fields (dotted paths) added after run directories existed, with the values that mean "as before": while a field
# holds one of them it stays out of the config hash, so old run directories keep theirs (see paths_at_default).
_HASHED_ONLY_WHEN_SET = {"student_projection_init": ("default",), "train.precision": ("fp32",)}


class MethodSettings(dict):
    """``extra``: the method's own settings, as a plain mapping (its schema is the method's ``extra_settings``).

    ``get``/``[]``/``in`` of a runtime knob (``max_restarts``, ...) answer from ``runtime``, for readers written
    when the knobs lived here; iterating, ``to_dict`` and the hash see only the method's settings."""

    def __init__(self, *args, runtime: "RuntimeConfig | None" = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._runtime = runtime

    def _knob(self, key: Any) -> Any:
        runtime = getattr(self, "_runtime", None)
        if runtime is not None and key in RUNTIME_KNOBS and not dict.__contains__(self, key):
            return getattr(runtime, key)
        return _MISSING

    def get(self, key: Any, default: Any = None) -> Any:
        value = self._knob(key)
        if value is _MISSING or value is None:
            return dict.get(self, key, default)
        return value

    def __getitem__(self, key: Any) -> Any:
        value = self._knob(key)
        if value is _MISSING or value is None:
            return dict.__getitem__(self, key)
        return value

    def __contains__(self, key: object) -> bool:
        value = self._knob(key)
        return dict.__contains__(self, key) if value is _MISSING or value is None else True

    def __bool__(self) -> bool:
        # ``(cfg.extra or {}).get("storage_path")`` must see a storage path set under runtime: true while a knob
        # differs from its default (at its default, ``{}`` answers the same).
        runtime = getattr(self, "_runtime", None)
        return dict.__len__(self) > 0 or (runtime is not None and any(
            getattr(runtime, key) != RuntimeConfig.__pydantic_fields__[key].get_default() for key in RUNTIME_KNOBS))

    def __reduce__(self):
        return (_method_settings, (dict(self), getattr(self, "_runtime", None)))


def _method_settings(items: dict, runtime: "RuntimeConfig | None") -> MethodSettings:
    return MethodSettings(items, runtime=runtime)


_FreeForm = Annotated[dict[str, Any], BeforeValidator(lambda v: {} if v is None else v),
                      AfterValidator(finite_everywhere)]


@section
class JobConfig:
    """A distillation job."""

    method: str = Field(description="distillation method")
    student: str = Field(description="student model: a preset of `raydistill models` or a local model directory")
    teacher: str | None = Field(None, description="teacher model: a preset or a local model directory (null: no "
                                                  "teacher)")
    seed: Int = Field(1000, description="seed of sampling, shuffling, augmentation and initialisation")
    run_dir: str | None = Field(None, description="checkpoints, best model, config.yaml (null: "
                                                  "runs/<method>-<student>-<teacher>)")
    cache_dir: str | None = Field(None, description="teacher embedding cache (null: $RAYDISTILL_HOME/embeddings)")
    student_pooling: Literal["mean", "cls"] = Field("mean", description="student pooling: mean or cls")
    # raydistill.models.bi_encoder.PROJECTION_INITS, + least_squares (fitted to the teacher's vectors before step 1)
    student_projection_init: Literal["default", "orthogonal", "least_squares"] = Field(
        "default", description="the projection to the teacher's width, when the method adds one: default (the "
                               "authors'), orthogonal (keeps the student's cosine geometry at the start) or "
                               "least_squares (fitted to map the student's vectors onto the teacher's before training)")
    teacher_pooling: Literal["mean", "cls"] | None = Field(
        None, description="teacher pooling (null: what the teacher checkpoint declares)")
    data: _Section[DataConfig, _DEFAULTS_IF_NULL] = Field(default_factory=DataConfig,
                                                          description="the training text and its views")
    train: _Section[TrainConfig, _DEFAULTS_IF_NULL] = Field(default_factory=TrainConfig,
                                                            description="the optimisation")
    loss: _FreeForm = Field(default_factory=dict, description="the method's loss settings (their schema: the "
                                                              "method's loss_settings); unset keys take the "
                                                              "method's defaults")
    resources: _Section[ResourcesConfig, _DEFAULTS_IF_NULL] = Field(default_factory=ResourcesConfig,
                                                                    description="what each actor role reserves")
    tracking: _Section[TrackingConfig, _DEFAULTS_IF_NULL] = Field(default_factory=TrackingConfig,
                                                                  description="MLflow")
    runtime: _Section[RuntimeConfig, _DEFAULTS_IF_NULL] = Field(default_factory=RuntimeConfig,
                                                                description="restarts, timeouts, progress lines, "
                                                                            "checkpoint storage")
    extra: _FreeForm = Field(default_factory=dict, description="the method's other settings (their schema: the "
                                                               "method's extra_settings), e.g. a later stage's")

    # Where the config came from, for error messages; not part of the config itself.
    _source: str | None = dataclasses.field(default=None, init=False, repr=False, compare=False)
    _lines: dict[str, int] = dataclasses.field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        moved = {key: self.extra[key] for key in RUNTIME_KNOBS if key in dict.keys(self.extra)}
        if moved:  # built directly (JobConfig(...)), not through from_dict, which moves them with the lines
            _warn_moved(moved, None, {})
            self.runtime = dataclasses.replace(self.runtime, **{k: v for k, v in moved.items() if v is not None})
        self.extra = MethodSettings({k: v for k, v in self.extra.items() if k not in moved}, runtime=self.runtime)

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if name == "runtime" and isinstance(getattr(self, "extra", None), MethodSettings):
            self.extra._runtime = value


    # ------------------------------------------------------------------------------------------------------------
    # Construction

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, source: str | None = None, lines: dict[str, int] | None = None) -> "JobConfig":
        """Build a config from plain data; unknown keys, wrong types and values out of range raise ConfigError
        naming the field (and the file and line, given ``source`` and ``lines``)."""
        lines = dict(lines or {})
        if not isinstance(d, dict):
            raise ConfigError(where(source, lines, "") + f"a config must be a mapping, got {type(d).__name__}")
        d = _move_runtime_knobs(d, source, lines)
        cfg = _build(cls, d, "", source, lines)
        cfg._source, cfg._lines = source, lines
        return cfg

    @classmethod
    def from_yaml(cls, path: str | os.PathLike, overrides: list[str] | None = None) -> "JobConfig":
        """Load ``path`` and apply ``key.path=value`` overrides (values parsed as YAML, e.g. ``train.lr=1e-4``)."""
        data, lines = load_yaml_with_overrides(path, overrides, nearby_hint=True)
        return cls.from_dict(data, source=str(path), lines=lines)

    def with_overrides(self, overrides: list[str]) -> "JobConfig":
        """A new config with ``key.path=value`` overrides applied (same rules as ``from_yaml``)."""
        data = self.to_dict()
        lines = dict(self._lines)
        apply_overrides(data, lines, overrides)
        return JobConfig.from_dict(data, source=self._source, lines=lines)

    def to_dict(self) -> dict[str, Any]:
        return _to_plain(self)

    def to_yaml(self, path: str | os.PathLike | None = None) -> str:
        text = yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=False)
        if path is not None:
            from raydistill.fileio import atomic_write_text

            atomic_write_text(path, text)
        return text

    # ------------------------------------------------------------------------------------------------------------
    # Identity

    def hashed_fields(self, exclude: tuple[str, ...] = DEFAULT_HASH_EXCLUDE) -> dict[str, Any]:
        """The config as ``config_hash`` sees it: minus ``exclude`` (dotted paths) and minus the fields added after
        run directories existed while they hold their default (so old run directories keep their hash)."""
        return hashed_fields_of(self.to_dict(), exclude)

    def config_hash(self, exclude: tuple[str, ...] = DEFAULT_HASH_EXCLUDE) -> str:
        """sha256 (16 hex chars) of the canonical JSON of ``hashed_fields(exclude)``."""
        canonical = json.dumps(self.hashed_fields(exclude), sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def diff_keys(self, other: "JobConfig | dict", exclude: tuple[str, ...] = DEFAULT_HASH_EXCLUDE) -> list[str]:
        """Dotted paths of hashed fields whose values differ (for "checkpoint was written by another config"
        messages); empty when ``other`` trains the same thing, even if an older version hashed it otherwise."""
        theirs_dict = other.to_dict() if isinstance(other, JobConfig) else other
        # An empty section trains what an absent one does (``extra: {}``), so neither is a difference.
        mine = {k: v for k, v in flatten(self.hashed_fields(exclude)).items() if v != {}}
        theirs = {k: v for k, v in flatten(hashed_fields_of(theirs_dict, exclude)).items() if v != {}}
        return sorted(k for k in mine.keys() | theirs.keys() if mine.get(k, _MISSING) != theirs.get(k, _MISSING))

    # ------------------------------------------------------------------------------------------------------------
    # Derived locations

    def resolved_run_dir(self) -> Path:
        if self.run_dir:
            return Path(self.run_dir).expanduser().resolve()
        parts = [self.method, _short_name(self.student)] + ([_short_name(self.teacher)] if self.teacher else [])
        return (Path("runs") / "-".join(parts)).resolve()

    def resolved_cache_dir(self) -> Path:
        if self.cache_dir:
            return Path(self.cache_dir).expanduser().resolve()
        return raydistill_home() / "embeddings"

    # ------------------------------------------------------------------------------------------------------------
    # Validation

    def validate(self) -> "JobConfig":
        """The checks across fields and of the specs the schema holds as strings (corpus, augmentations); raises
        ConfigError with the field path and the allowed values. Returns self. Pure: no file, model or cluster is
        touched. (Types and ranges were checked when the config was built.)"""
        err = self._error
        d = self.data
        if d.corpus.startswith("file:"):
            from raydistill.data.corpus import parse_corpus_spec

            try:  # the spec's form only; whether the file exists and parses is preflight's
                parse_corpus_spec(d.corpus)
            except ValueError as exc:
                raise err("data.corpus", str(exc)) from None
        elif d.corpus not in _CORPORA:
            raise err("data.corpus", f"{d.corpus!r}{suggest(d.corpus, _CORPORA)}; allowed: "
                                     f"{', '.join(_CORPORA)} or file:<path>")
        if not d.views:
            raise err("data.views", "needs at least one view, e.g. {a: none}")
        for name, spec in d.views.items():
            if not re.fullmatch(r"[a-z][a-z0-9_]*", str(name)):
                raise err(f"data.views.{name}", "view names must be lower-case identifiers (they become column names)")
            if not spec:
                raise err(f"data.views.{name}", "the augmentation spec must be a non-empty string such as 'none'")
            _check_view_spec(err, f"data.views.{name}", spec)
        for name in d.teacher_views:
            if name not in d.views:
                raise err("data.teacher_views", f"{name!r} is not a view{suggest(name, d.views)}; "
                                                f"views: {', '.join(d.views)}")
        if d.teacher_views and self.teacher is None:
            raise err("teacher", f"data.teacher_views={d.teacher_views} needs a teacher model")
        queue_size = self.loss.get("queue_size")
        if isinstance(queue_size, int) and queue_size and 0 < queue_size < self.train.batch_size:
            raise err("loss.queue_size", f"K={queue_size} is smaller than train.batch_size={self.train.batch_size}: "
                                         "the FIFO queue must hold at least one batch (use 0 for no queue)")
        return self

    def _error(self, path: str, message: str) -> ConfigError:
        return ConfigError(where(self._source, self._lines, path) + message)


def read_yaml(path: Path, error: type[Exception]) -> tuple[Any, dict[str, int]]:
    """``(data, {dotted key: line})`` of a YAML file; a syntax error raises ``error`` naming the file and line."""
    text = path.read_text(encoding="utf-8")
    try:
        return yaml.safe_load(text), _yaml_key_lines(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise error(f"{path}{line}: not valid YAML: {getattr(err, 'problem', err)}") from None


def load_yaml_with_overrides(path: str | os.PathLike, overrides: list[str] | None, *, nearby_hint: bool = False,
                             error: type[ConfigError] = ConfigError) -> tuple[dict[str, Any], dict[str, int]]:
    """A config file's mapping with ``key.path=value`` overrides applied, and its ``{dotted key: line}`` (0: the
    command line)."""
    path = Path(path)
    if not path.is_file():
        hint = ""
        if nearby_hint and path.parent.is_dir():
            siblings = sorted(p.name for p in path.parent.glob("*.y*ml"))
            close = difflib.get_close_matches(path.name, siblings, n=1)
            hint = f"; did you mean {path.parent / close[0]}?" if close else (
                f"; files there: {', '.join(siblings)}" if siblings else "")
        raise error(f"config file not found: {path}{hint}")
    data, lines = read_yaml(path, error)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise error(f"{path}:1: a config file must be a mapping of fields, got {type(data).__name__}")
    apply_overrides(data, lines, overrides or [])
    return data, lines


def apply_overrides(data: dict[str, Any], lines: dict[str, int], overrides: list[str]) -> None:
    """``key.path=value`` overrides into ``data`` (values parsed as YAML), their lines marked 0 (the command line)."""
    for item in overrides:
        key, value = _parse_override(item)
        _set_path(data, key, value, item)
        lines[key] = 0  # 0 = came from the command line, see where()


def _move_runtime_knobs(d: dict[str, Any], source: str | None, lines: dict[str, int]) -> dict[str, Any]:
    """``extra.<knob>`` of an older config moved to ``runtime.<knob>``, with one deprecation line per key."""
    extra = d.get("extra")
    if not isinstance(extra, dict) or not any(key in extra for key in RUNTIME_KNOBS):
        return d
    d = dict(d)
    extra = dict(extra)
    runtime = d.get("runtime")
    runtime = dict(runtime) if isinstance(runtime, dict) else ({} if runtime is None else runtime)
    if not isinstance(runtime, dict):
        return d  # the schema says what is wrong with runtime
    moved = {}
    for key in RUNTIME_KNOBS:
        if key not in extra:
            continue
        value = extra.pop(key)
        if key in runtime and runtime[key] != value and not _later_spelling_wins(key, runtime[key], lines):
            raise ConfigError(where(source, lines, f"extra.{key}") + f"moved to runtime.{key}, which this config "
                              f"also sets ({runtime[key]!r}); keep runtime.{key} only")
        runtime[key] = value
        moved[key] = value
        if f"extra.{key}" in lines:
            lines[f"runtime.{key}"] = lines[f"extra.{key}"]
    d["extra"], d["runtime"] = extra, runtime
    _warn_moved(moved, source, lines)
    return d


def _later_spelling_wins(key: str, in_runtime: Any, lines: dict[str, int]) -> bool:
    """Whether ``extra.<key>`` may replace what ``runtime.<key>`` holds: it came from the command line (``--set``
    overrides the file, as for any field), or ``runtime`` only holds the default (a saved config's ``to_dict``).
    Both written in the file, or given as data with different values, are a conflict."""
    if lines.get(f"extra.{key}") == 0:
        return True
    default = RuntimeConfig.__pydantic_fields__[key].get_default()
    return f"runtime.{key}" not in lines and in_runtime == default


def _warn_moved(moved: dict[str, Any], source: str | None, lines: dict[str, int]) -> None:
    for key in moved:
        line = line_of(lines, f"extra.{key}")
        message = (f"extra.{key} is deprecated: it moved to runtime.{key}; write it there (the old spelling still "
                   "loads)")
        # Attributed to the config file and line (not to this module), so the warning points where to edit.
        warnings.warn_explicit(("--set " if line == 0 else "") + message, ConfigDeprecationWarning,
                               filename=source or "<config>", lineno=line or 0, module="raydistill.config")


def raydistill_home() -> Path:
    return Path(os.environ.get("RAYDISTILL_HOME", "~/.cache/raydistill")).expanduser()


# ----------------------------------------------------------------------------------------------------------------
# Building (the schema library does the checking; this adds the section aliases)


def _build(cls: type, data: dict[str, Any], prefix: str, source: str | None, lines: dict[str, int]):
    """``cls`` (a ``@section``) from ``data``, with the spellings of ``_SECTION_ALIASES`` folded in first."""
    data = _fold_aliases(data, prefix, source, lines)
    return build(cls, data, source=source, lines=lines, prefix=prefix)


def _fold_aliases(data: dict[str, Any], prefix: str, source: str | None, lines: dict[str, int]) -> dict[str, Any]:
    if not isinstance(data, dict):
        return data
    data = dict(data)
    for (section_name, alias_key), (inner, target) in _SECTION_ALIASES.items():
        parts = section_name.split(".")
        holder = data
        for part in parts[:-1]:
            holder = holder.get(part) if isinstance(holder, dict) else None
        if not isinstance(holder, dict) or not isinstance(holder.get(parts[-1]), dict):
            continue
        block_owner = dict(holder[parts[-1]])
        if not isinstance(block_owner.get(alias_key), dict):
            continue
        block = block_owner.pop(alias_key)
        path = f"{prefix}{section_name}."
        for key in block:
            if key != inner:
                raise ConfigError(where(source, lines, f"{path}{alias_key}.{key}") + f"unknown field; allowed: {inner}")
        if inner in block:
            if target in block_owner and block_owner[target] != block[inner]:
                raise ConfigError(where(source, lines, f"{path}{target}") + f"given twice, also as "
                                  f"{path}{alias_key}.{inner}; keep one")
            block_owner[target] = block[inner]
        holder[parts[-1]] = block_owner
    return data


def _to_plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj) if not f.name.startswith("_")}
    if isinstance(obj, dict):
        return {k: _to_plain(v) for k, v in dict.items(obj)}
    if isinstance(obj, (list, tuple)):
        return [_to_plain(v) for v in obj]
    return obj


# ----------------------------------------------------------------------------------------------------------------
# Helpers

# The names other config modules import (tenc/config.py, tune/space.py).
_where = where
_line_of = line_of
_suggest = suggest


def _check_view_spec(err, path: str, spec: str) -> None:
    if spec == "pair":  # the second text of a pairs file (runtime.pipeline)
        return
    from raydistill.augment import AugmentationError, parse_spec

    try:
        parse_spec(spec)
    except AugmentationError as exc:
        raise err(path, str(exc)) from None


def _short_name(name: str) -> str:
    return Path(name.rstrip("/")).name


def _parse_override(item: str) -> tuple[str, Any]:
    if "=" not in item:
        raise ConfigError(f"--set {item}: expected key.path=value, e.g. train.lr=1e-4")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*", key):
        raise ConfigError(f"--set {item}: {key!r} is not a dotted field path")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return key, value


def _set_path(data: dict, key: str, value: Any, item: str) -> None:
    for (owner, alias_key), (inner, target) in _SECTION_ALIASES.items():
        if key == f"{owner}.{alias_key}.{inner}":
            key = f"{owner}.{target}"
        if key == f"{owner}.{target}":  # an override of the field replaces the alias spelling in the file
            block = data.get(owner, {}).get(alias_key) if isinstance(data.get(owner), dict) else None
            if isinstance(block, dict):
                block.pop(inner, None)
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"--set {item}: '{part}' is not a section")
        node = child
    node[parts[-1]] = value


def _drop_paths(plain: dict, exclude: tuple[str, ...]) -> dict:
    plain = json.loads(json.dumps(plain, default=str))
    for path in exclude:
        node = plain
        parts = path.split(".")
        for part in parts[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
            if node is None:
                break
        if isinstance(node, dict):
            node.pop(parts[-1], None)
    return plain


def hashed_fields_of(plain: dict, exclude: tuple[str, ...] = DEFAULT_HASH_EXCLUDE) -> dict:
    """A plain job config (also one a checkpoint stored) as the config hash sees it."""
    return _drop_paths(plain, exclude + paths_at_default(plain, _HASHED_ONLY_WHEN_SET))


def paths_at_default(plain: dict, defaults: dict[str, tuple]) -> tuple[str, ...]:
    """The dotted paths of ``defaults`` whose value in ``plain`` is one of their "as before" values (or absent)."""
    values = flatten(plain)
    return tuple(path for path, as_before in defaults.items() if values.get(path, as_before[0]) in as_before)


def _yaml_key_lines(text: str) -> dict[str, int]:
    """Dotted key path -> 1-based line, from the YAML node tree (safe_load drops positions)."""
    lines: dict[str, int] = {}

    def walk(node, prefix: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if isinstance(key_node, yaml.ScalarNode):
                    path = f"{prefix}{key_node.value}"
                    lines[path] = key_node.start_mark.line + 1
                    walk(value_node, path + ".")

    root = yaml.compose(text, Loader=yaml.SafeLoader)
    if root is not None:
        walk(root, "")
    # resources.data.max_cpus is an alias of resources.data_max_cpus
    if "resources.data.max_cpus" in lines:
        lines.setdefault("resources.data_max_cpus", lines["resources.data.max_cpus"])
    return lines
