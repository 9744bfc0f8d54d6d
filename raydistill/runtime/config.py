"""Job configuration: typed dataclasses, YAML loading, ``--set a.b=c`` overrides and validation.

A distillation job is described by one YAML file. Everything that changes *what is trained* lives in
``method``/``student``/``teacher``/``data``/``train``/``loss``/``extra``; everything that changes only *where and how
fast* it runs lives in ``resources`` and ``tracking``. That split is what ``config_hash()`` relies on: a run
checkpointed on a laptop resumes on a GPU cluster when only ``resources`` (and ``tracking``) change. The shipped
``*-gpu.yaml`` configs also change scale knobs (data, epochs, batch), so they are other runs, not the same one moved.

Parsing is strict. A typo such as ``train.learning_rate`` is an error that names the file, the line, the field and
the closest valid name, because a silently ignored key would train with the default and waste a run.
``validate()`` adds the semantic checks of the schema itself (ranges, allowed values, views against teacher views,
queue size against batch size). It is pure: it reads no file, model or cluster. The method's own rules are
``raydistill.methods.validate_method``, and ``raydistill.runtime.preflight.preflight`` adds, explicitly, what
touches the machine (models, data files, writable output directories) before any Ray actor exists, so a bad
config fails in a second instead of after the teacher pass.

    cfg = JobConfig.from_yaml("configs/congen.yaml", overrides=["train.lr=1e-4", "loss.queue_size=16384"])
    cfg.validate()             # the schema; preflight(cfg) checks models, files and directories
    cfg.config_hash()          # stable across processes; ignores RUNTIME_ONLY_FIELDS (resources, tracking, ...)
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import yaml

__all__ = [
    "ConfigError",
    "RoleResources",
    "LearnerResources",
    "ResourcesConfig",
    "DataConfig",
    "TrainConfig",
    "TrackingConfig",
    "JobConfig",
    "raydistill_home",
    "DEFAULT_HASH_EXCLUDE",
    "RUNTIME_ONLY_FIELDS",
]


class ConfigError(ValueError):
    """A config problem, worded as ``<file>:<line>: field '<path>': <what is wrong>`` where the file is known."""


# ----------------------------------------------------------------------------------------------------------------
# Sections


@dataclass
class RoleResources:
    """Resources of one actor role (teacher, queue). Applied with ``.options()``, never in decorators."""

    num_actors: int = 1
    num_cpus: float = 1
    num_gpus: float = 0
    threads: int = 1  # torch intra-op threads inside the actor; Ray gives fractional-CPU actors 1 thread otherwise
    batch_size: int = 128  # sentences per forward pass (teacher)
    # Teacher only: padded tokens per forward (None: raydistill.runtime.teacher.DEFAULT_TEACHER_MAX_TOKENS), and
    # "auto" | "fp32" | "bf16" ("auto": bf16 where the hardware multiplies bf16 natively, fp32 elsewhere). bf16
    # vectors are cached apart from fp32 ones (teacher_identity).
    max_tokens: int | None = None
    precision: str = "auto"


@dataclass
class LearnerResources:
    num_learners: int = 0  # 0 = the learner runs in the driver process (tests, laptops), like RLlib's LearnerGroup
    num_cpus: float = 1
    num_gpus: float = 0
    threads: int = 2
    # On CPU, models/speedups.py: dropout masks from a quarter of the random draws (same p), the word-embedding
    # gradient in one reused buffer (same values). Off: torch's own dropout and a new dense gradient every step.
    cpu_speedups: bool = True


@dataclass
class ResourcesConfig:
    num_cpus: float = 2  # only used when raydistill starts a local Ray itself
    teacher: RoleResources = field(default_factory=RoleResources)
    learner: LearnerResources = field(default_factory=LearnerResources)
    queue: RoleResources = field(default_factory=lambda: RoleResources(num_cpus=0))
    # CPUs that actors must leave to Ray Data: with every CPU held by actors, Data's tasks never get scheduled and
    # the job hangs (measured, docs/runtime.md, Ray behaviour; ray-project/ray#44687).
    data_max_cpus: float = 0.5


@dataclass
class DataConfig:
    # "flickr" | "nli" | "flickr+nli" | "mixed" | "file:<path>[#column]" (.txt, JSON Lines, CSV/TSV, Parquet, a
    # Hugging Face datasets directory; sentences or pairs): raydistill.data.corpus, docs/data.md
    corpus: str = "flickr"
    max_sentences: int | None = 20000
    # view name -> augmentation spec of raydistill.augment ("none" = the sentence itself, "caption" = another
    # caption of the same image, "delete:0.1", ...). Each view becomes a text_<view> column.
    views: dict[str, str] = field(default_factory=lambda: {"a": "none"})
    teacher_views: list[str] = field(default_factory=list)  # views whose teacher embeddings the method needs
    max_length: int = 32  # student tokens
    teacher_max_length: int = 128
    shuffle: bool = True


@dataclass
class TrainConfig:
    batch_size: int = 128
    lr: float = 5e-4
    epochs: int = 1
    max_steps: int | None = None
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    eval_every: int = 100
    checkpoint_every: int = 200
    keep_last: int = 2
    patience: int | None = None
    # "fp32", or "bf16": the student's forward and backward under torch.autocast(bfloat16), and ConGen's
    # products against the queue (teacher and student logits, the student's gradient) in bf16; weights, optimiser
    # state, the queue and every softmax stay fp32. On a CPU with AVX512-BF16 (or AMX) bf16 matrix products run
    # 2-4x faster than fp32; on a CPU without them (AVX2 only) torch emulates bf16 products, tens of times slower
    # than fp32, and the learner warns. On CUDA it is the usual mixed precision. bench/train_step.py measures the
    # speed; committed ConGen runs the 7-STS cost (docs/benchmarks.md).
    precision: str = "fp32"


@dataclass
class TrackingConfig:
    enabled: bool = True
    tracking_uri: str | None = None  # None: $MLFLOW_TRACKING_URI, else sqlite:///<cwd>/mlflow.db
    experiment: str = "raydistill"
    run_name: str | None = None


# Fields that change how a run is executed, watched or kept, never what it trains: they may change between the
# invocations of one run, and a checkpoint resumes across them. The config hash leaves out exactly these, and a
# "written by a different config" refusal names them as the settings that may change. (Where the checkpoints live,
# extra.storage_path, is left out too but checked on its own: checkpoint.check_resume refuses to move a started run.)
# train.checkpoint_every only places the next checkpoints: saving reads the state and draws no random number, and a
# resume continues from the manifest's step, epoch and batch, so the steps trained are the same at any interval.
RUNTIME_ONLY_FIELDS = (
    "resources", "tracking", "run_dir", "cache_dir",
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


@dataclass
class JobConfig:
    method: str
    student: str
    teacher: str | None = None
    seed: int = 1000
    run_dir: str | None = None  # default runs/<method>-<student>-<teacher>
    cache_dir: str | None = None  # default $RAYDISTILL_HOME/embeddings
    student_pooling: str = "mean"
    # a projection to the teacher's width, when the method adds one: "default" (the authors'), "orthogonal"
    # (keeps the student's cosine geometry at the start; raydistill.models.bi_encoder.init_projection) or
    # "least_squares" (fitted to map the student's vectors onto the teacher's before training; BiEncoder.fit_projection)
    student_projection_init: str = "default"
    teacher_pooling: str | None = None  # None: what the teacher checkpoint declares (sentence-transformers config)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    loss: dict[str, Any] = field(default_factory=dict)  # method-specific kwargs, checked by the method's validator
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    extra: dict[str, Any] = field(default_factory=dict)  # method-specific (e.g. stage-2 settings)

    # Where the config came from, for error messages; not part of the config itself.
    _source: str | None = field(default=None, repr=False, compare=False)
    _lines: dict[str, int] = field(default_factory=dict, repr=False, compare=False)

    # ------------------------------------------------------------------------------------------------------------
    # Construction

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, source: str | None = None, lines: dict[str, int] | None = None) -> "JobConfig":
        """Build a config from plain data; unknown keys and wrong types raise ConfigError naming the field."""
        if not isinstance(d, dict):
            raise ConfigError(_where(source, lines or {}, "") + f"a config must be a mapping, got {type(d).__name__}")
        cfg = _build(cls, d, "", source, lines or {})
        cfg._source, cfg._lines = source, dict(lines or {})
        return cfg

    @classmethod
    def from_yaml(cls, path: str | os.PathLike, overrides: list[str] | None = None) -> "JobConfig":
        """Load ``path`` and apply ``key.path=value`` overrides (values parsed as YAML, e.g. ``train.lr=1e-4``)."""
        path = Path(path)
        if not path.is_file():
            hint = ""
            if path.parent.is_dir():
                siblings = sorted(p.name for p in path.parent.glob("*.y*ml"))
                close = difflib.get_close_matches(path.name, siblings, n=1)
                hint = f"; did you mean {path.parent / close[0]}?" if close else (
                    f"; files there: {', '.join(siblings)}" if siblings else "")
            raise ConfigError(f"config file not found: {path}{hint}")
        data, lines = read_yaml(path, ConfigError)
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(f"{path}:1: a config file must be a mapping of fields, got {type(data).__name__}")
        for item in overrides or []:
            key, value = _parse_override(item)
            _set_path(data, key, value, item)
            lines[key] = 0  # 0 = came from the command line, see _where()
        return cls.from_dict(data, source=str(path), lines=lines)

    def with_overrides(self, overrides: list[str]) -> "JobConfig":
        """A new config with ``key.path=value`` overrides applied (same rules as ``from_yaml``)."""
        data = self.to_dict()
        lines = dict(self._lines)
        for item in overrides:
            key, value = _parse_override(item)
            _set_path(data, key, value, item)
            lines[key] = 0
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
        mine = _flatten(self.hashed_fields(exclude))
        theirs_dict = other.to_dict() if isinstance(other, JobConfig) else other
        theirs = _flatten(hashed_fields_of(theirs_dict, exclude))
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
        """The schema's semantic checks; raises ConfigError with the field path and the allowed values. Returns
        self. Pure: no file, model or cluster is touched."""
        err = self._error
        if not self.method:
            raise err("method", "must name a distillation method")
        if self.student_pooling not in _POOLINGS:
            raise err("student_pooling", f"{self.student_pooling!r} is not one of {', '.join(_POOLINGS)}")
        if self.student_projection_init not in _PROJECTION_INITS:
            raise err("student_projection_init",
                      f"{self.student_projection_init!r} is not one of {', '.join(_PROJECTION_INITS)}")
        if self.teacher_pooling is not None and self.teacher_pooling not in _POOLINGS:
            raise err("teacher_pooling", f"{self.teacher_pooling!r} is not one of {', '.join(_POOLINGS)} (or null)")

        d = self.data
        if d.corpus.startswith("file:"):
            from raydistill.data.corpus import parse_corpus_spec

            try:  # the spec's form only; whether the file exists and parses is preflight's
                parse_corpus_spec(d.corpus)
            except ValueError as exc:
                raise err("data.corpus", str(exc)) from None
        elif d.corpus not in _CORPORA:
            raise err("data.corpus", f"{d.corpus!r}{_suggest(d.corpus, _CORPORA)}; allowed: "
                                     f"{', '.join(_CORPORA)} or file:<path>")
        _positive(err, "data.max_sentences", d.max_sentences, allow_none=True)
        if not d.views:
            raise err("data.views", "needs at least one view, e.g. {a: none}")
        for name, spec in d.views.items():
            if not re.fullmatch(r"[a-z][a-z0-9_]*", str(name)):
                raise err(f"data.views.{name}", "view names must be lower-case identifiers (they become column names)")
            if not isinstance(spec, str) or not spec:
                raise err(f"data.views.{name}", "the augmentation spec must be a non-empty string such as 'none'")
            _check_view_spec(err, f"data.views.{name}", spec)
        for name in d.teacher_views:
            if name not in d.views:
                raise err("data.teacher_views", f"{name!r} is not a view{_suggest(name, d.views)}; "
                                                f"views: {', '.join(d.views)}")
        if d.teacher_views and self.teacher is None:
            raise err("teacher", f"data.teacher_views={d.teacher_views} needs a teacher model")
        _positive(err, "data.max_length", d.max_length)
        _positive(err, "data.teacher_max_length", d.teacher_max_length)

        t = self.train
        for name in ("batch_size", "epochs", "eval_every", "checkpoint_every", "keep_last"):
            _positive(err, f"train.{name}", getattr(t, name))
        _positive(err, "train.max_steps", t.max_steps, allow_none=True)
        _positive(err, "train.patience", t.patience, allow_none=True)
        _positive(err, "train.lr", t.lr)
        if not 0 <= t.warmup_ratio < 1:
            raise err("train.warmup_ratio", f"{t.warmup_ratio} must be in [0, 1)")
        if t.weight_decay < 0:
            raise err("train.weight_decay", f"{t.weight_decay} must be >= 0")
        if t.grad_clip < 0:
            raise err("train.grad_clip", f"{t.grad_clip} must be >= 0 (0 = no clipping)")
        if t.precision not in _PRECISIONS:
            raise err("train.precision", f"{t.precision!r} is not one of {', '.join(_PRECISIONS)}")

        self._check_loss()

        r = self.resources
        _positive(err, "resources.num_cpus", r.num_cpus)
        for role in ("teacher", "queue", "learner"):
            rr = getattr(r, role)
            for name in ("num_cpus", "num_gpus"):
                if getattr(rr, name) < 0:
                    raise err(f"resources.{role}.{name}", f"{getattr(rr, name)} must be >= 0")
            _positive(err, f"resources.{role}.threads", rr.threads)
        _positive(err, "resources.teacher.num_actors", r.teacher.num_actors)
        _positive(err, "resources.teacher.batch_size", r.teacher.batch_size)
        _positive(err, "resources.teacher.max_tokens", r.teacher.max_tokens, allow_none=True)
        if r.teacher.precision not in _TEACHER_PRECISIONS:
            raise err("resources.teacher.precision",
                      f"{r.teacher.precision!r} is not one of {', '.join(_TEACHER_PRECISIONS)}")
        if r.learner.num_learners < 0:
            raise err("resources.learner.num_learners", f"{r.learner.num_learners} must be >= 0 (0 = in the driver)")
        if r.data_max_cpus < 0.5:
            raise err("resources.data_max_cpus", f"{r.data_max_cpus} is below 0.5: Ray Data needs CPU headroom or "
                                                 "the pipeline hangs (ray-project/ray#44687)")
        if not self.tracking.experiment:
            raise err("tracking.experiment", "must be a non-empty name")

        return self

    def _check_loss(self) -> None:
        err = self._error
        for key, value in self.loss.items():
            path = f"loss.{key}"
            is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if _is_temperature(key) and value is not None and not isinstance(value, bool):
                # (bools are switches such as learnable_temperature: true)
                if not is_number or not math.isfinite(value) or value <= 0:
                    raise err(path, f"temperature must be a number > 0, got {value!r}")
            if key.endswith("size") or key.endswith("_k") or key == "k":
                if not (value is None or (isinstance(value, int) and not isinstance(value, bool))):
                    raise err(path, f"must be an integer, got {value!r}")
                if value is not None and value < 0:
                    raise err(path, f"{value} must be >= 0")
        queue_size = self.loss.get("queue_size")
        if queue_size and queue_size < self.train.batch_size:
            raise err("loss.queue_size", f"K={queue_size} is smaller than train.batch_size={self.train.batch_size}: "
                                         "the FIFO queue must hold at least one batch (use 0 for no queue)")

    def _error(self, path: str, message: str) -> ConfigError:
        return ConfigError(_where(self._source, self._lines, path) + message)


_POOLINGS = ("mean", "cls")
# raydistill.models.bi_encoder.PROJECTION_INITS, + least_squares: fitted to the teacher's vectors before step 1
_PROJECTION_INITS = ("default", "orthogonal", "least_squares")
_PRECISIONS = ("fp32", "bf16")
_TEACHER_PRECISIONS = ("auto", "fp32", "bf16")  # raydistill.runtime.teacher.PRECISIONS
_CORPORA = ("flickr", "nli", "flickr+nli", "mixed")  # raydistill.data.corpus.NAMED_CORPORA
_MISSING = object()


def read_yaml(path: Path, error: type[Exception]) -> tuple[Any, dict[str, int]]:
    """``(data, {dotted key: line})`` of a YAML file; a syntax error raises ``error`` naming the file and line."""
    text = path.read_text(encoding="utf-8")
    try:
        return yaml.safe_load(text), _yaml_key_lines(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise error(f"{path}{line}: not valid YAML: {getattr(err, 'problem', err)}") from None


def raydistill_home() -> Path:
    return Path(os.environ.get("RAYDISTILL_HOME", "~/.cache/raydistill")).expanduser()


# ----------------------------------------------------------------------------------------------------------------
# Generic strict builder


def _build(cls: type, data: dict[str, Any], prefix: str, source: str | None, lines: dict[str, int]):
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")]
    data = dict(data)
    for (section, alias_key), (inner, target) in [(k, v) for k, v in _SECTION_ALIASES.items()]:
        if prefix.rstrip(".") == section and isinstance(data.get(alias_key), dict):
            block = data.pop(alias_key)
            for key in block:
                if key != inner:
                    raise ConfigError(_where(source, lines, f"{prefix}{alias_key}.{key}")
                                      + f"unknown field; allowed: {inner}")
            if inner in block:
                if target in data and data[target] != block[inner]:
                    raise ConfigError(_where(source, lines, f"{prefix}{target}") + f"given twice, also as "
                                      f"{prefix}{alias_key}.{inner}; keep one")
                data[target] = block[inner]
    kwargs = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if key not in names:
            raise ConfigError(_where(source, lines, path) + f"unknown field{_suggest(str(key), names)}; "
                              f"allowed in {prefix.rstrip('.') or 'the top level'}: {', '.join(names)}")
        kwargs[key] = _coerce(value, hints[key], path, source, lines)
    missing = [f.name for f in dataclasses.fields(cls)
               if f.name not in kwargs and not f.name.startswith("_")
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(_where(source, lines, prefix.rstrip(".")) + f"missing required field(s): "
                          f"{', '.join(prefix + m for m in missing)}")
    return cls(**kwargs)


def _coerce(value: Any, hint: Any, path: str, source: str | None, lines: dict[str, int]) -> Any:
    def fail(expected: str) -> ConfigError:
        return ConfigError(_where(source, lines, path) + f"expected {expected}, got {value!r}")

    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        non_none = [a for a in args if a is not type(None)]
        if len(non_none) == 1:
            return _coerce(value, non_none[0], path, source, lines)
        return value
    if dataclasses.is_dataclass(hint):
        if value is None:
            return hint()
        if not isinstance(value, dict):
            raise fail(f"a mapping of {hint.__name__} fields")
        return _build(hint, value, path + ".", source, lines)
    if hint is Any:
        _refuse_non_finite(value, path, source, lines)
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise fail("true or false")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise fail("an integer")
    if hint is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):
            # PyYAML reads "1e-4" (no dot) as a string; accept it rather than make users write 1.0e-4.
            try:
                number = float(value)
            except ValueError:
                pass
        if number is None or not math.isfinite(number):
            raise fail("a finite number")
        return number
    if hint is str:
        if isinstance(value, str):
            return value
        raise fail("a string")
    if origin is dict:
        if not isinstance(value, dict):
            raise fail("a mapping")
        key_type, value_type = typing.get_args(hint)
        return {str(k): _coerce(v, value_type, f"{path}.{k}", source, lines) for k, v in value.items()}
    if origin is list:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise fail("a list")
        (item_type,) = typing.get_args(hint)
        return [_coerce(v, item_type, f"{path}[{i}]", source, lines) for i, v in enumerate(value)]
    return value


def _refuse_non_finite(value: Any, path: str, source: str | None, lines: dict[str, int]) -> None:
    """NaN or infinity anywhere in a free-form section (loss, extra): no setting means either, and a NaN learning
    rate or clip would train a broken model until the first check notices."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(_where(source, lines, path) + f"expected a finite number, got {value!r}")
    if isinstance(value, dict):
        for key, item in value.items():
            _refuse_non_finite(item, f"{path}.{key}", source, lines)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _refuse_non_finite(item, f"{path}[{i}]", source, lines)


def _to_plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: _to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj) if not f.name.startswith("_")}
    if isinstance(obj, dict):
        return {k: _to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_to_plain(v) for v in obj]
    return obj


# ----------------------------------------------------------------------------------------------------------------
# Helpers


def _where(source: str | None, lines: dict[str, int], path: str) -> str:
    line = _line_of(lines, path)
    if line == 0:
        location = "--set "
    elif source:
        location = f"{source}:{line}: " if line else f"{source}: "
    else:
        location = ""
    return f"{location}field '{path}': " if path else location


def _line_of(lines: dict[str, int], path: str) -> int | None:
    # The closest ancestor with a known line (e.g. a default filled under a section points at the section).
    while path:
        if path in lines:
            return lines[path]
        path = path[:path.rindex("[")] if path.endswith("]") else path.rpartition(".")[0]
    return None


def _suggest(name: str, choices) -> str:
    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _positive(err, path: str, value, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if value is None or value <= 0:
        raise err(path, f"must be > 0, got {value!r}")


def _check_view_spec(err, path: str, spec: str) -> None:
    if spec == "pair":  # the second text of a pairs file (runtime.pipeline)
        return
    from raydistill.augment import AugmentationError, parse_spec

    try:
        parse_spec(spec)
    except AugmentationError as exc:
        raise err(path, str(exc)) from None


def _is_temperature(key: str) -> bool:
    return key == "tau" or key.startswith(("tau_", "temperature")) or key.endswith(("_tau", "_temperature"))


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
    for (section, alias_key), (inner, target) in _SECTION_ALIASES.items():
        if key == f"{section}.{alias_key}.{inner}":
            key = f"{section}.{target}"
        if key == f"{section}.{target}":  # an override of the field replaces the alias spelling in the file
            block = data.get(section, {}).get(alias_key) if isinstance(data.get(section), dict) else None
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
    values = _flatten(plain)
    return tuple(path for path, as_before in defaults.items() if values.get(path, as_before[0]) in as_before)


def _flatten(plain: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(plain, dict) and plain:
        out: dict[str, Any] = {}
        for k, v in plain.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): plain}


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
