"""Job configuration: the schema of a job (``JobConfig`` and its sections), YAML loading, ``--set a.b=c`` overrides,
validation and the config hash.

A distillation job is one YAML file. What changes *what is trained* lives in ``method``/``student``/``teacher``/
``data``/``train``/``loss``/``extra``; what changes only *where and how fast* it runs, or how it is watched and kept,
lives in ``resources``, ``tracking`` and ``runtime``. ``config_hash()`` relies on that split: a run checkpointed on a
laptop resumes on a GPU cluster when only those sections change (the shipped ``*-gpu.yaml`` configs also change
data, epochs and batch, so they are other runs).

Every section is a pydantic dataclass (``raydistill.config.schema``): unknown keys, wrong types, values out of range
and NaN or infinity are refused while the config loads, with the file, the line, the field and the closest valid
name, because a silently ignored key would train with the default and waste a run. ``loss`` and ``extra`` are the
method's ``MethodSettings`` once the method is registered (``raydistill.methods`` registers it in ``config.help``).
``validate()`` adds the checks across fields; it is pure (no file, model or cluster is read).
``raydistill.runtime.engine.preflight.preflight`` checks what touches the machine (models, data files, writable
directories) before any Ray actor exists, so a bad config fails in a second instead of after the teacher pass.

The parts live beside this module and are re-exported from here (import them from this module): ``sections.py``,
``loading.py`` (YAML with the line of every key, ``--set`` overrides, building a section), ``runtime_knobs.py`` (the
runtime knobs' old ``extra.*`` spelling still loads, with a ``ConfigDeprecationWarning``; it hashes the same).

    cfg = JobConfig.from_yaml("configs/congen.yaml", overrides=["train.lr=1e-4", "loss.queue_size=16384"])
    cfg.validate()             # across fields; preflight(cfg) checks the method, models, files and directories
    cfg.config_hash()          # stable across processes; ignores RUNTIME_ONLY_FIELDS (resources, tracking, ...)

A stage that a job trains on its way (a method's later stage, a teacher, a Trans-Encoder encoder) is
``JobConfig.for_stage(method, student, ...)``: the same checks, its sections given as data or as the job's own.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BeforeValidator, Field
from pydantic_core import PydanticCustomError

from raydistill.nested import deep_merge, flatten
from raydistill.config.help import METHOD_DOCS
from raydistill.config.loading import _build, apply_overrides, load_yaml_with_overrides, read_yaml
from raydistill.config.runtime_knobs import RUNTIME_KNOBS, ConfigDeprecationWarning, _move_runtime_knobs, _warn_moved
from raydistill.config.schema import ConfigError, Int, MethodSettings, finite_everywhere, section, suggest, where
from raydistill.config.sections import (_DEFAULTS_IF_NULL, DataConfig, LearnerResources, Reservation, ResourcesConfig,
                                        RoleResources, RuntimeConfig, TrackingConfig, TrainConfig, _Section)

__all__ = ["ConfigError", "ConfigDeprecationWarning", "RoleResources", "LearnerResources", "ResourcesConfig",
           "DataConfig", "TrainConfig", "TrackingConfig", "RuntimeConfig", "JobConfig", "model_short_name",
           "raydistill_home", "DEFAULT_HASH_EXCLUDE", "RUNTIME_ONLY_FIELDS", "RUNTIME_KNOBS", "read_yaml"]


_CORPORA = ("flickr", "nli", "flickr+nli", "mixed")  # raydistill.data.corpus.NAMED_CORPORA
_MISSING = object()

# Fields that change how a run is executed, watched or kept, never what it trains: a checkpoint resumes across
# changes of them, the config hash leaves out exactly these, and a "written by a different config" refusal names
# them as the settings that may change (runtime.storage_path is checked on its own: resume.check_resume refuses to
# move a started run). train.checkpoint_every only places the next checkpoints: saving draws no random number and a
# resume continues from the manifest's step, epoch and batch. The extra.* paths: configs stored before the runtime
# section existed keep the runtime knobs there.
RUNTIME_ONLY_FIELDS = (
    "resources", "tracking", "runtime", "run_dir", "cache_dir",
    "train.eval_every", "train.checkpoint_every", "train.keep_last",
    "extra.learner_timeout_s", "extra.max_restarts", "extra.log_every", "extra.storage_path",
)
DEFAULT_HASH_EXCLUDE = RUNTIME_ONLY_FIELDS

# Fields (dotted paths) added after run directories existed, with the values that mean "as before": while a field
# holds one of them it stays out of the config hash, so old run directories keep theirs (see paths_at_default).
_HASHED_ONLY_WHEN_SET = {"student_projection_init": ("default",), "train.precision": ("fp32",),
                         "train.budget": (None,), "train.dev_pairs": (None,)}


def _mapping(value: Any) -> Any:
    if value is None:
        return {}
    if not isinstance(value, (dict, MethodSettings)):
        raise PydanticCustomError("dict_type", "Input should be a valid dictionary")
    return value


#: ``loss:``/``extra:``: plain data until the method is known, then the method's ``MethodSettings``.
_MethodSection = Annotated[Any, BeforeValidator(_mapping), AfterValidator(finite_everywhere)]


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
    train: _Section[TrainConfig, _DEFAULTS_IF_NULL] = Field(default_factory=TrainConfig, description="the optimisation")
    loss: _MethodSection = Field(default_factory=dict, description="the method's loss settings (their schema: the "
                                                              "method's loss_settings); unset keys take the "
                                                              "method's defaults")
    resources: _Section[ResourcesConfig, _DEFAULTS_IF_NULL] = Field(default_factory=ResourcesConfig,
                                                                    description="what each actor role reserves")
    tracking: _Section[TrackingConfig, _DEFAULTS_IF_NULL] = Field(default_factory=TrackingConfig, description="MLflow")
    runtime: _Section[RuntimeConfig, _DEFAULTS_IF_NULL] = Field(
        default_factory=RuntimeConfig, description="restarts, timeouts, progress lines, checkpoint storage")
    extra: _MethodSection = Field(default_factory=dict, description="the method's other settings (their schema: the "
                                                               "method's extra_settings), e.g. a later stage's")

    # Where the config came from, for error messages; not part of the config itself.
    _source: str | None = dataclasses.field(default=None, init=False, repr=False, compare=False)
    _lines: dict[str, int] = dataclasses.field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        moved = {key: self.extra[key] for key in RUNTIME_KNOBS if key in self.extra}
        if moved:  # built directly (JobConfig(...)), not through from_dict, which moves them with the lines
            _warn_moved(moved, None, {})
            self.runtime = dataclasses.replace(self.runtime, **{k: v for k, v in moved.items() if v is not None})
        self.extra = {k: v for k, v in self.extra.items() if k not in moved}


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
        method = METHOD_DOCS.get(cfg.method)
        if method is not None:
            for name, schema, owner in (("loss", method.loss_settings, f"the {cfg.method} loss"),
                                        ("extra", method.extra_settings, f"method {cfg.method!r}")):
                setattr(cfg, name, schema.from_config(dict(getattr(cfg, name)), source=source, lines=lines,
                                                      prefix=f"{name}.", owner=owner))
        return cfg

    @classmethod
    def for_stage(cls, method: str, student: str, *, seed: int, run_dir: str | None, source: str,
                  parent: "JobConfig | None" = None, **sections: Any) -> "JobConfig":
        """The config of a stage that a job trains on its way: ``method`` training ``student`` without a teacher.

        With ``parent`` (a method's later stage) the parent's settings carry over, but not what belongs to the
        parent's method (teacher, views, projection, loss, ``extra`` keys ``method`` does not take); without, the
        defaults and no MLflow run (the job records its stages itself). ``sections`` (``train=..., data=...``) are
        merged over them: plain data, a section of another schema (a Trans-Encoder ``StageConfig``: the fields this
        section has count), or a list of those, in order. A problem raises ConfigError naming ``source``."""
        if parent is not None:
            accepted = getattr(METHOD_DOCS[method].extra_settings, "__pydantic_fields__", {})
            plain = {**parent.to_dict(), "teacher": None, "teacher_pooling": None, "loss": {},
                     "student_projection_init": "default",  # a later stage starts from the previous one's model
                     "extra": {key: value for key, value in parent.extra.items() if key in accepted}}
            plain["data"] = {k: v for k, v in plain["data"].items() if k not in ("views", "teacher_views")}
            # A budget is the first stage's length: a later stage (DistilCSE's NLI fine-tuning) runs its own epochs
            # unless its extra.stage<N> gives it a budget of its own.
            plain["train"] = {k: v for k, v in plain["train"].items() if k != "budget"}
        else:
            plain = {"tracking": {"enabled": False}}
        plain.update(method=method, student=student, seed=seed, run_dir=run_dir)
        for name, layers in sections.items():
            for layer in layers if isinstance(layers, list) else [layers]:
                if dataclasses.is_dataclass(layer):
                    layer = {key: getattr(layer, key) for key in _SECTIONS[name].__pydantic_fields__
                             if hasattr(layer, key)}
                plain[name] = deep_merge(plain.get(name) or {}, layer)
        return cls.from_dict(plain, source=source)

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
        parts = [self.method, model_short_name(self.student)] + (
            [model_short_name(self.teacher)] if self.teacher else [])
        return (Path("runs") / "-".join(parts)).resolve()

    def actor_reservation(self) -> Reservation:
        return self.resources.actor_reservation()

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
        queue_size = getattr(self.loss, "queue_size", None)  # the method's setting in use, when it has a queue
        if isinstance(queue_size, int) and queue_size and 0 < queue_size < self.train.batch_size:
            raise err("loss.queue_size", f"K={queue_size} is smaller than train.batch_size={self.train.batch_size}: "
                                         "the FIFO queue must hold at least one batch (use 0 for no queue)")
        return self

    def _error(self, path: str, message: str) -> ConfigError:
        return ConfigError(where(self._source, self._lines, path) + message)


def raydistill_home() -> Path:
    return Path(os.environ.get("RAYDISTILL_HOME", "~/.cache/raydistill")).expanduser()


_SECTIONS = {"data": DataConfig, "train": TrainConfig, "resources": ResourcesConfig, "tracking": TrackingConfig,
             "runtime": RuntimeConfig}


def _to_plain(obj: Any) -> Any:
    if isinstance(obj, MethodSettings):  # the keys the config set, as written (what a run records and hashes)
        return _to_plain(dict(obj.items()))
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj) if not f.name.startswith("_")}
    if isinstance(obj, dict):
        return {k: _to_plain(v) for k, v in dict.items(obj)}
    if isinstance(obj, (list, tuple)):
        return [_to_plain(v) for v in obj]
    return obj


# ----------------------------------------------------------------------------------------------------------------
# Helpers

# The names other config modules import (tenc/config.py, the engine's preflight).
_where = where
_suggest = suggest


def _check_view_spec(err, path: str, spec: str) -> None:
    if spec == "pair":  # the second text of a pairs file (runtime.pipeline)
        return
    from raydistill.augment import AugmentationError, parse_spec

    try:
        parse_spec(spec)
    except AugmentationError as exc:
        raise err(path, str(exc)) from None


def model_short_name(name: str) -> str:
    """A model as a reader names it: a preset by its name, a directory by its own name, not the path to it."""
    return Path(str(name).rstrip("/")).name


def _drop_paths(plain: dict, exclude: tuple[str, ...]) -> dict:
    plain = json.loads(json.dumps(plain, default=str))
    for path in exclude:
        node = plain
        *parents, last = path.split(".")
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return plain


def hashed_fields_of(plain: dict, exclude: tuple[str, ...] = DEFAULT_HASH_EXCLUDE) -> dict:
    """A plain job config (also one a checkpoint stored) as the config hash sees it."""
    return _drop_paths(plain, exclude + paths_at_default(plain, _HASHED_ONLY_WHEN_SET))


def paths_at_default(plain: dict, defaults: dict[str, tuple]) -> tuple[str, ...]:
    """The dotted paths of ``defaults`` whose value in ``plain`` is one of their "as before" values (or absent)."""
    values = flatten(plain)
    return tuple(path for path, as_before in defaults.items() if values.get(path, as_before[0]) in as_before)
