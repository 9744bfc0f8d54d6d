"""``raydistill tune``: a Ray Tune search over one method's learning rate, temperatures and queue size for a student.

    raydistill tune --student bert-mini [--method congen] [--teacher mpnet-base] [--num-samples 16] [--time-budget 3h]
    raydistill tune --list
    raydistill tune --resume --student bert-mini            # or --resume --sweep-dir DIR

What a sweep does (``plan_sweep`` then ``run_sweep``):

1. Plan, before Ray starts. The student's space file ``tune_spaces/<student>.yaml`` (``default.yaml`` when there is
   none; both shipped in the package) gives the searched values and the sweep settings; the base job config is the
   shipped ``configs/<method>.yaml`` (when it exists) + the space's ``base:`` section + ``--set`` overrides, with ``--student``/``--teacher``. Every candidate
   value goes through ``JobConfig.validate`` on top of the base config, so a typo or an invalid value fails here,
   naming the space file, line and field, not in the tenth trial.
2. Teacher pass, once per sweep, in the driver: stage 1's training data is built through the embedding cache
   (``pipeline.build_training_data``) before any trial starts. Searched keys may only be ``train.*``, ``loss.*``,
   ``data.max_length`` and ``student_pooling``, none of which changes what the teacher encodes, so every trial finds
   all its teacher vectors cached. The driver's teacher forward count and each trial's (0) go to the summary and
   MLflow.
3. Trials (``distill_trial``): each is ``run_distillation`` of the base config with the sampled values
   (``evaluate=False``; the learner runs in the trial process), with a progress hook that reports STS-B dev to
   Tune at every evaluation (``train.eval_every`` steps and epoch ends). A trial that raises (a bad combination,
   a NaN loss: the learner raises ``FloatingPointError``) is marked failed; the sweep goes on.
4. Scheduler: ASHA (``time_attr="step"``, metric ``best_stsb_dev``, the papers' model-selection rule: best STS-B dev
   so far), grace period ``grace_evals`` evaluations, ``stop_last_trials=False`` so a trial that reaches the end
   finishes its own bookkeeping. The final evaluation of a trial is reported after ``run_distillation`` returns, so
   a stop decision there never cuts its checkpoint, plots and MLflow artifacts.
5. Export: the best trial (highest best STS-B dev, failed trials excluded) is copied to ``<sweep>/best/model``
   (sentence-transformers directory, as the learner saved it) and its config written back as
   ``<sweep>/best/config.yaml`` (the base config + the best values: ``python jobs/<method>.py --config`` it).
   Optionally the best model and the ``start_from`` trial (the paper's setting: the untuned default) get a 7-STS
   evaluation and result files (``kind: tune``).

Search algorithm. ``algorithm: auto`` (default) uses Optuna's TPE sampler (``OptunaSearch``, seeded) when optuna is
installed (``pip install 'raydistill[optuna]'``) and the space has no ``grid`` entries, else Tune's
``BasicVariantGenerator`` (seeded random sampling, plus ``grid`` products). Why: the spaces are the papers' grids,
small and categorical (lr x K x tau_t x tau_s, about a thousand points) while a CPU budget buys 10-30 trials.
TPE begins with random trials (10 by default) and only then models the good region, so it can only beat random
search on longer sweeps; ASHA, which stops the weak half at every rung, is where most of the saving comes from in
either case. Random search needs no extra package and is exactly reproducible from the seed, so it is the fallback
and what the tests use. Both run the space's ``start_from`` points first, so every sweep contains the untuned
default as a reference trial.

Resources. ``resources_per_trial: {num_cpus, num_gpus, threads}`` (space file, ``--cpus-per-trial`` /
``--gpus-per-trial``) goes to ``tune.with_resources``; the trial's learner runs in the trial process
(``resources.learner.num_learners: 0``) with ``torch.set_num_threads(threads)`` (default: the trial's whole CPUs,
at least 1). Each trial builds its data with Ray Data, whose tasks are scheduled outside the trial's reservation,
so the sweep always leaves one CPU of the cluster unreserved: at most ``floor((CPUs - 1) / num_cpus)`` trials run
at once (``trial_concurrency``; a smaller ``max_concurrent_trials`` wins), and a trial that would take every CPU is
refused before the teacher pass. On 2 CPUs ``num_cpus: 1`` runs one trial at a time with one thread, and
``num_cpus: 0.5`` two at a time with one thread each; on a cluster the same file runs as many trials as there are
CPUs/GPUs (``num_gpus: 1`` puts each learner on a GPU).

Resume. Ctrl-C (SIGINT) stops the sweep; Tune saves its state under ``<sweep>/tune``. ``--resume`` restores it with
``Tuner.restore(resume_unfinished=True)``: finished, stopped and failed trials are kept as they are, running ones
restart and continue from their own last checkpoint (``<sweep>/trials/<id>/checkpoints``, the learner's resume), and
the search goes on where it was. The plan (``sweep.json``) is reused as it was, so a resumed sweep searches the same
space.

MLflow (``Tracker``): one parent run per sweep (settings, space, teacher-pass counts, the trials' outcome, the best
score, artifacts: summary, best config and model) and one child run per trial (tag ``mlflow.parentRunId``; params =
the trial's config and the sampled values; metrics = the training curve and STS-B dev). Trials log with an absolute
tracking URI (Tune trials may change directory). A trial stopped by ASHA is left as ``KILLED`` with tag
``raydistill.trial_status=stopped_early``; the driver sets every child's final status at the end of the sweep.

Layout of a sweep directory (default ``runs/tune/<method>-<student>-<teacher>``):

    sweep.json        the plan (resume reads it)          summary.json   trials table, best, teacher counts
    tune/             Ray Tune's experiment state          teacher_passes.json   one entry per driver run
    trials/<id>/      each trial's run dir (checkpoints/, best/, plots/, config.yaml, trial.json)
    best/model/       the best trial's model               best/config.yaml   its ready-to-use job config
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import logging
import math
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import yaml

from raydistill.runtime.config import ConfigError, JobConfig, TrackingConfig
from raydistill.shipped import shipped_config, tune_spaces_dir

__all__ = [
    "SpaceError", "Param", "MethodSpace", "SearchSpace", "SweepSettings", "SweepPlan",
    "spaces_dir", "load_space", "space_for", "list_spaces", "parse_duration", "default_sweep_dir",
    "plan_sweep", "run_sweep", "resume_sweep", "distill_trial", "format_trials_table", "uses_teacher", "SEARCHABLE",
]

log = logging.getLogger(__name__)

DISTRIBUTIONS = ("choice", "grid", "uniform", "loguniform", "randint")
# What a space may vary: nothing that changes the text the teacher encodes, so one teacher pass serves every trial.
SEARCHABLE = ("train.", "loss.", "data.max_length", "student_pooling")
ALGORITHMS = ("auto", "random", "optuna")
METRIC = "best_stsb_dev"
TRIAL_STATE = "trial.json"


class SpaceError(ConfigError):
    """A problem in a search-space file or in the sweep options, worded ``<file>:<line>: field '<path>': ...``."""


def spaces_dir() -> Path:
    """``$RAYDISTILL_TUNE_SPACES`` if set, else the ``tune_spaces/`` shipped in the package."""
    return Path(os.environ.get("RAYDISTILL_TUNE_SPACES") or tune_spaces_dir()).expanduser().resolve()


def parse_duration(value: Any) -> float:
    """Seconds from ``3600``, ``"90m"``, ``"3h"``, ``"1h30m"``, ``"45s"``; raises ValueError otherwise."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        text = str(value).strip().lower()
        match = re.fullmatch(r"(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?", text)
        if not text or not match or not any(match.groups()):
            raise ValueError(f"expected a duration such as 3600, 90m, 3h or 1h30m, got {value!r}")
        hours, minutes, secs = (float(g) if g else 0.0 for g in match.groups())
        seconds = hours * 3600 + minutes * 60 + secs
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"a duration must be > 0, got {value!r}")
    return seconds


# ----------------------------------------------------------------------------------------------------------------
# Space files


@dataclass(frozen=True)
class Param:
    """One searched config key: ``choice``/``grid`` over values, or ``uniform``/``loguniform``/``randint`` [low, high]."""

    key: str
    kind: str
    values: tuple
    line: int | None = None

    def candidates(self) -> list:
        """Values checked against the config before the sweep: every choice, or a range's two ends."""
        if self.kind == "randint":  # Tune's randint excludes the upper bound
            return [self.values[0], self.values[1] - 1]
        return list(self.values)

    def to_tune(self):
        from ray import tune

        if self.kind == "choice":
            return tune.choice(list(self.values))
        if self.kind == "grid":
            return tune.grid_search(list(self.values))
        return getattr(tune, self.kind)(*self.values)

    def describe(self) -> str:
        return f"{self.kind}{list(self.values)}"

    def to_dict(self) -> dict[str, list]:
        return {self.kind: list(self.values)}


@dataclass
class MethodSpace:
    """A method's section of a space file: job-config ``base`` overrides, ``start_from`` points, searched ``params``."""

    method: str
    params: dict[str, Param]
    base: dict[str, Any] = field(default_factory=dict)
    start_from: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class SearchSpace:
    """One ``tune_spaces/*.yaml`` file."""

    path: Path
    student: str
    description: str
    methods: dict[str, MethodSpace]
    settings: dict[str, Any]  # SweepSettings fields given by the file (search / scheduler / resources_per_trial)
    lines: dict[str, int] = field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        return self.path.stem

    def error(self, path: str, message: str) -> SpaceError:
        return _space_error(self.path, self.lines, path, message)

    def method(self, name: str) -> MethodSpace:
        if name not in self.methods:
            raise SpaceError(f"{self.path}: no search space for method {name!r}{_suggest(name, self.methods)}; "
                             f"this file has: {', '.join(self.methods) or '(none)'}. Add a 'methods: {{{name}: "
                             "{space: ...}}' section")
        return self.methods[name]


_TOP_KEYS = ("student", "description", "search", "scheduler", "resources_per_trial", "methods")
_SETTING_SECTIONS = {
    "search": {"num_samples": "num_samples", "time_budget": "time_budget_s", "algorithm": "algorithm",
               "seed": "seed", "max_concurrent_trials": "max_concurrent_trials"},
    "scheduler": {"grace_evals": "grace_evals", "reduction_factor": "reduction_factor"},
    "resources_per_trial": {"num_cpus": "num_cpus", "num_gpus": "num_gpus", "threads": "threads"},
}
_METHOD_KEYS = ("base", "start_from", "space")


def load_space(path: str | os.PathLike) -> SearchSpace:
    """Read and check one space file (structure and value types; values against a config in ``plan_sweep``)."""
    from raydistill.runtime.config import _yaml_key_lines
    from raydistill.methods import job_methods

    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise SpaceError(f"search-space file not found: {path}")
    text = path.read_text(encoding="utf-8")
    try:
        data = yaml.safe_load(text)
        lines = _yaml_key_lines(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        raise SpaceError(f"{path}{f':{mark.line + 1}' if mark else ''}: not valid YAML: "
                         f"{getattr(err, 'problem', err)}") from None
    if not isinstance(data, dict):
        raise SpaceError(f"{path}:1: a search-space file is a mapping with keys {', '.join(_TOP_KEYS)}")

    def err(where: str, message: str) -> SpaceError:
        return _space_error(path, lines, where, message)

    for key in data:
        if key not in _TOP_KEYS:
            raise err(str(key), f"unknown key{_suggest(str(key), _TOP_KEYS)}; allowed: {', '.join(_TOP_KEYS)}")
    settings: dict[str, Any] = {}
    for section, fields in _SETTING_SECTIONS.items():
        block = data.get(section) or {}
        if not isinstance(block, dict):
            raise err(section, f"expected a mapping of {', '.join(fields)}")
        for key, value in block.items():
            if key not in fields:
                raise err(f"{section}.{key}", f"unknown key{_suggest(str(key), fields)}; allowed: "
                                              f"{', '.join(fields)}")
            try:
                settings[fields[key]] = SweepSettings.check_field(fields[key], value)
            except ValueError as exc:
                raise err(f"{section}.{key}", str(exc)) from None

    methods_block = data.get("methods")
    if not isinstance(methods_block, dict) or not methods_block:
        raise err("methods", "expected a mapping of method name -> {base, start_from, space}")
    known = job_methods()
    methods: dict[str, MethodSpace] = {}
    for method, section in methods_block.items():
        where = f"methods.{method}"
        if method not in known:
            raise err(where, f"unknown method{_suggest(str(method), known)}; known: {', '.join(known)}")
        if not isinstance(section, dict):
            raise err(where, "expected a mapping with keys base, start_from, space")
        for key in section:
            if key not in _METHOD_KEYS:
                raise err(f"{where}.{key}", f"unknown key{_suggest(str(key), _METHOD_KEYS)}; allowed: "
                                            f"{', '.join(_METHOD_KEYS)}")
        base = section.get("base") or {}
        if not isinstance(base, dict):
            raise err(f"{where}.base", "expected a mapping of job-config fields (as in configs/*.yaml)")
        params = _parse_params(section.get("space"), f"{where}.space", err)
        start_from = section.get("start_from") or []
        if isinstance(start_from, dict):
            start_from = [start_from]
        if not isinstance(start_from, list) or not all(isinstance(p, dict) for p in start_from):
            raise err(f"{where}.start_from", "expected a mapping (or a list of mappings) of searched key -> value")
        for point in start_from:
            for key in point:
                if key not in params:
                    raise err(f"{where}.start_from", f"{key!r} is not searched in this section"
                                                     f"{_suggest(str(key), params)}; searched: {', '.join(params)}")
        methods[method] = MethodSpace(method=method, params=params, base=base,
                                      start_from=[dict(p) for p in start_from])
    student = str(data.get("student") or path.stem)
    return SearchSpace(path=path, student=student, description=str(data.get("description") or "").strip(),
                       methods=methods, settings=settings, lines=lines)


def _parse_params(block: Any, where: str, err) -> dict[str, Param]:
    if not isinstance(block, dict) or not block:
        raise err(where, "expected a mapping of config key -> {choice: [...]} (or grid / uniform / loguniform / "
                         "randint)")
    params: dict[str, Param] = {}
    for key, spec in block.items():
        path = f"{where}.{key}"
        key = str(key)
        if not (key.startswith(SEARCHABLE[:2]) or key in SEARCHABLE[2:]):
            raise err(path, "a sweep may search train.*, loss.*, data.max_length and student_pooling only: the "
                            "teacher pass is shared by every trial, so data and teacher settings are fixed per "
                            "sweep (set them under base:)")
        if not isinstance(spec, dict) or len(spec) != 1:
            raise err(path, f"expected one of {{{': ..., '.join(DISTRIBUTIONS)}: ...}}, got {spec!r}")
        kind, values = next(iter(spec.items()))
        if kind not in DISTRIBUTIONS:
            raise err(path, f"unknown distribution {kind!r}{_suggest(str(kind), DISTRIBUTIONS)}; allowed: "
                            f"{', '.join(DISTRIBUTIONS)}")
        if not isinstance(values, list) or not values:
            raise err(path, f"{kind}: expected a non-empty list, got {values!r}")
        values = [_number(v) for v in values]
        if kind in ("uniform", "loguniform", "randint"):
            if len(values) != 2 or not all(isinstance(v, (int, float)) for v in values) or values[0] >= values[1]:
                raise err(path, f"{kind}: expected [low, high] numbers with low < high, got {values!r}")
            if kind == "loguniform" and values[0] <= 0:
                raise err(path, f"loguniform: low must be > 0, got {values[0]!r}")
            if kind == "randint" and not all(isinstance(v, int) for v in values):
                raise err(path, f"randint: expected integers, got {values!r}")
        params[key] = Param(key=key, kind=kind, values=tuple(values))
    return params


def _number(value: Any) -> Any:
    # YAML 1.1 reads 1e-4 (no dot) as a string; a space file means the number.
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return value
        return int(number) if number.is_integer() and re.fullmatch(r"[+-]?\d+", value.strip()) else number
    return value


def space_for(student: str, directory: str | os.PathLike | None = None) -> Path:
    """``<dir>/<student>.yaml``, else ``<dir>/default.yaml`` (a local model directory uses its last name)."""
    directory = Path(directory) if directory else spaces_dir()
    own = directory / f"{Path(str(student).rstrip('/')).name}.yaml"
    if own.is_file():
        return own
    default = directory / "default.yaml"
    if default.is_file():
        return default
    raise SpaceError(f"no search space for {student!r} in {directory} (and no default.yaml); add "
                     f"{own.name} there or pass --space FILE")


def list_spaces(directory: str | os.PathLike | None = None) -> list[SearchSpace]:
    """Every ``*.yaml`` space file of ``directory`` (default ``spaces_dir()``), loaded and checked."""
    directory = Path(directory) if directory else spaces_dir()
    return [load_space(p) for p in sorted(directory.glob("*.yaml"))]


# ----------------------------------------------------------------------------------------------------------------
# Settings and plan


@dataclass
class SweepSettings:
    """How much to search and with what: defaults < the space file's sections < command-line options."""

    num_samples: int = 12
    time_budget_s: float | None = None
    algorithm: str = "auto"
    seed: int = 0
    max_concurrent_trials: int | None = None
    grace_evals: int = 2
    reduction_factor: float = 2.0
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    threads: int | None = None

    @staticmethod
    def check_field(name: str, value: Any) -> Any:
        """``value`` checked and converted for field ``name``; ValueError says what is expected."""
        if value is None and name in ("time_budget_s", "max_concurrent_trials", "threads"):
            return None
        if name == "time_budget_s":
            return parse_duration(value)
        if name == "algorithm":
            if value not in ALGORITHMS:
                raise ValueError(f"expected one of {', '.join(ALGORITHMS)}, got {value!r}")
            return value
        if name in ("num_samples", "max_concurrent_trials", "grace_evals", "threads"):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"expected an integer >= 1, got {value!r}")
            return value
        if name == "seed":
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"expected an integer, got {value!r}")
            return value
        if name == "reduction_factor":
            value = _number(value)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 1:
                raise ValueError(f"expected a number > 1, got {value!r}")
            return float(value)
        if name in ("num_cpus", "num_gpus"):
            value = _number(value)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (
                    name == "num_cpus" and value == 0):
                raise ValueError(f"expected a number {'> 0' if name == 'num_cpus' else '>= 0'}, got {value!r}")
            return float(value)
        raise ValueError(f"unknown setting {name!r}")

    def updated(self, values: dict[str, Any]) -> "SweepSettings":
        checked = {k: self.check_field(k, v) for k, v in values.items() if v is not None}
        return dataclasses.replace(self, **checked)

    def trial_threads(self) -> int:
        return int(self.threads or max(1, math.floor(self.num_cpus)))


@dataclass
class SweepPlan:
    """Everything a sweep needs, resolved and checked; saved as ``<sweep_dir>/sweep.json`` (resume reads it)."""

    name: str
    sweep_dir: str
    student: str
    method: str
    teacher: str | None
    space_file: str
    params: dict[str, dict[str, list]]  # key -> {kind: values}
    start_from: list[dict[str, Any]]
    base_config: dict[str, Any]  # the user's job config, validated (no sweep paths in it)
    settings: dict[str, Any]
    algorithm: str  # resolved: random | optuna
    tracking_uri: str
    experiment: str
    tracking_enabled: bool = True
    cache_dir: str | None = None
    evaluate_sets: list[str] = field(default_factory=list)
    results_dir: str | None = None
    parent_run_id: str | None = None
    created: str | None = None
    command: str | None = None

    # --- persistence

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SweepPlan":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def save(self) -> Path:
        path = Path(self.sweep_dir) / "sweep.json"
        _write_json(path, self.to_dict())
        return path

    @classmethod
    def load(cls, sweep_dir: str | os.PathLike) -> "SweepPlan":
        path = Path(sweep_dir).expanduser().resolve() / "sweep.json"
        if not path.is_file():
            raise SpaceError(f"no sweep to resume in {path.parent} (sweep.json not found); start one with "
                             "raydistill tune --student ...")
        return cls.from_dict(json.loads(path.read_text(encoding="utf-8")))

    # --- derived

    @property
    def sweep_settings(self) -> SweepSettings:
        return SweepSettings(**self.settings)

    @property
    def tune_dir(self) -> Path:
        return Path(self.sweep_dir) / "tune"

    def trial_dir(self, trial_id: str) -> Path:
        return Path(self.sweep_dir) / "trials" / trial_id

    def param_objects(self) -> dict[str, Param]:
        return {key: Param(key, *next(iter(spec.items()))) for key, spec in self.params.items()}

    def param_space(self) -> dict[str, Any]:
        return {key: param.to_tune() for key, param in self.param_objects().items()}

    def expected_trials(self) -> int:
        grid = math.prod(len(spec["grid"]) for spec in self.params.values() if "grid" in spec)
        return int(self.sweep_settings.num_samples) * grid

    def tracking(self, run_name: str | None = None) -> TrackingConfig:
        return TrackingConfig(enabled=self.tracking_enabled, tracking_uri=self.tracking_uri,
                              experiment=self.experiment, run_name=run_name)

    def base(self) -> JobConfig:
        return JobConfig.from_dict(self.base_config, source=f"{self.sweep_dir}/sweep.json (base_config)")

    def trial_config(self, params: dict[str, Any], run_dir: str | os.PathLike, trial_id: str) -> JobConfig:
        """The base config with ``params``, run in the trial process: in-process learner with the trial's threads
        and GPUs, absolute run/cache/tracking locations (Tune trials may change directory)."""
        from raydistill.runtime.preflight import preflight

        settings = self.sweep_settings
        data = _with_params(self.base_config, params)
        data["run_dir"] = str(run_dir)
        if self.cache_dir:
            data["cache_dir"] = self.cache_dir
        learner = data.setdefault("resources", {}).setdefault("learner", {})
        learner.update(num_learners=0, threads=settings.trial_threads(), num_gpus=settings.num_gpus)
        data["tracking"] = {**data.get("tracking", {}), **dataclasses.asdict(self.tracking(f"trial-{trial_id}"))}
        return preflight(JobConfig.from_dict(data, source=f"trial {trial_id} of sweep {self.name}"))

    def export_config(self, params: dict[str, Any]) -> JobConfig:
        """The base config with ``params``: what a user runs as a normal job (its own resources and run dir)."""
        data = _with_params(self.base_config, params)
        data["run_dir"] = None
        data.setdefault("tracking", {})["run_name"] = None
        return JobConfig.from_dict(data)


def _with_params(base: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    data = json.loads(json.dumps(base))
    for key, value in params.items():
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return data


def default_sweep_dir(method: str, student: str, teacher: str | None) -> Path:
    """``runs/tune/<method>-<student>-<teacher>`` under the working directory (no teacher part without one)."""
    return (Path("runs") / "tune" / _sweep_name(method, student, teacher)).resolve()


def _sweep_name(method: str, student: str, teacher: str | None) -> str:
    parts = [method, Path(str(student).rstrip("/")).name] + ([Path(str(teacher).rstrip("/")).name] if teacher else [])
    return "-".join(parts)


def uses_teacher(method: str) -> bool:
    from raydistill.methods import get_method

    spec = get_method(method)
    return spec.needs_teacher or bool(spec.teacher_views)


def plan_sweep(student: str, method: str = "congen", teacher: str | None = None, *,
               space_file: str | os.PathLike | None = None, config_path: str | os.PathLike | None = None,
               overrides: Iterable[str] = (), settings: dict[str, Any] | None = None,
               param_values: dict[str, list] | None = None, sweep_dir: str | os.PathLike | None = None,
               tracking_uri: str | None = None, experiment: str | None = None,
               evaluate_sets: Iterable[str] | None = None, results_dir: str | os.PathLike | None = None,
               command: str | None = None) -> SweepPlan:
    """Resolve and check a sweep without starting Ray; raises SpaceError / ConfigError naming file, line and field.

    ``teacher``: default ``mpnet-base`` for methods that distil a teacher, none otherwise.
    ``config_path``: the base job config; default the shipped ``configs/<method>.yaml`` when it exists.
    ``overrides``: ``key.path=value`` on the base config (``--set``). ``settings``: SweepSettings fields
    (command-line values; None = keep the file's). ``param_values``: searched key -> list of values, replacing the
    file's entry by a ``choice`` (``--lr``, ``--queue-size``, ...). ``evaluate_sets``: evaluate the best and the
    ``start_from`` trial on these sets after the sweep (the seven STS sets write result files).
    """
    from raydistill.methods import with_method_defaults
    from raydistill.runtime.tracking import resolve_tracking_uri

    space = load_space(space_file) if space_file else load_space(space_for(student))
    section = space.method(method)
    if teacher is None and uses_teacher(method):
        teacher = "mpnet-base"
    base = _base_config(method, student, teacher, section, space, config_path, list(overrides))
    params = dict(section.params)
    for key, values in (param_values or {}).items():
        if values:
            params[key] = Param(key=key, kind="choice", values=tuple(values), line=0)
    sweep_settings = SweepSettings().updated(space.settings).updated(settings or {})
    where = f"methods.{method}"
    for key, param in params.items():
        for value in param.candidates():
            _check_values(base, {key: value}, space, f"{where}.space.{key}" if param.line != 0 else None,
                          f"{key}={value!r}")
    for i, point in enumerate(section.start_from):
        _check_values(base, point, space, f"{where}.start_from", f"start_from[{i}] {point}")
    algorithm = _resolve_algorithm(sweep_settings.algorithm, params, space)

    name = _sweep_name(method, student, teacher)
    sweep_path = Path(sweep_dir).expanduser().resolve() if sweep_dir else default_sweep_dir(method, student, teacher)
    tracking_cfg = base.tracking
    uri = resolve_tracking_uri(tracking_uri or tracking_cfg.tracking_uri)
    effective = with_method_defaults(base)
    cache_dir = str(effective.resolved_cache_dir()) if effective.data.teacher_views else None
    if command is None:
        from raydistill.evaluation import default_command

        command = default_command()
    return SweepPlan(
        name=name, sweep_dir=str(sweep_path), student=student, method=method, teacher=teacher,
        space_file=str(space.path), params={k: p.to_dict() for k, p in params.items()},
        start_from=[dict(p) for p in section.start_from], base_config=base.to_dict(),
        settings=dataclasses.asdict(sweep_settings), algorithm=algorithm, tracking_uri=uri,
        experiment=experiment or "raydistill-tune", tracking_enabled=tracking_cfg.enabled, cache_dir=cache_dir,
        evaluate_sets=list(evaluate_sets or []),
        results_dir=str(Path(results_dir).expanduser().resolve()) if results_dir else None,
        created=time.strftime("%Y-%m-%dT%H:%M:%S%z"), command=command)


def _base_config(method: str, student: str, teacher: str | None, section: MethodSpace, space: SearchSpace,
                 config_path, overrides: list[str]) -> JobConfig:
    from raydistill.methods import _deep_merge
    from raydistill.runtime.preflight import preflight

    if config_path is None:
        candidate = shipped_config(method)
        config_path = candidate if candidate.is_file() else None
    if config_path is not None:
        cfg = JobConfig.from_yaml(config_path)
        if cfg.method != method:
            raise ConfigError(f"{config_path}: field 'method': this config is for {cfg.method!r}, the sweep is for "
                              f"{method!r}")
        data, source, lines = cfg.to_dict(), str(config_path), dict(cfg._lines)
    else:
        data, source, lines = {"method": method}, None, {}
    data = _deep_merge(data, section.base)
    if section.base:
        source = f"{source} + {space.path} (methods.{method}.base)" if source else f"{space.path} " \
                                                                                  f"(methods.{method}.base)"
    data.update(method=method, student=student, teacher=teacher)
    if teacher is None:
        data["teacher_pooling"] = None
    try:
        return preflight(JobConfig.from_dict(data, source=source, lines=lines).with_overrides(overrides))
    except ConfigError as exc:
        raise ConfigError(f"base config of the sweep: {exc}") from None


def _check_values(base: JobConfig, values: dict[str, Any], space: SearchSpace, where: str | None,
                  label: str) -> None:
    """``values`` on top of the base config must give a valid job (the error names the space file and line)."""
    from raydistill.runtime.preflight import preflight

    try:
        preflight(JobConfig.from_dict(_with_params(base.to_dict(), values)))
    except ConfigError as exc:
        message = f"{label}: {exc}"
        if where is None:  # a command-line value
            raise SpaceError(f"command-line search values: {message}") from None
        raise space.error(where, message) from None


def _resolve_algorithm(requested: str, params: dict[str, Param], space: SearchSpace) -> str:
    has_grid = any(p.kind == "grid" for p in params.values())
    optuna_available = _optuna_available()
    if requested == "optuna":
        if not optuna_available:
            raise SpaceError("search algorithm 'optuna' needs the optuna package: pip install 'raydistill[optuna]' "
                             "(or use --search random)")
        if has_grid:
            raise SpaceError(f"{space.path}: search algorithm 'optuna' cannot sample 'grid' entries; use choice, "
                             "or --search random")
        return "optuna"
    if requested == "random" or has_grid or not optuna_available:
        return "random"
    return "optuna"


def _optuna_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("optuna") is not None


# ----------------------------------------------------------------------------------------------------------------
# The trial


@dataclass
class _TrialState:
    """``<trial dir>/trial.json``: what the trial itself knows (the driver adds Tune's view)."""

    trial_id: str
    params: dict[str, Any] = field(default_factory=dict)
    attempts: int = 0
    status: str = "pending"  # running | finished | stopped | failed
    mlflow_run_id: str | None = None
    best_stsb_dev: float | None = None
    best_step: int | None = None
    last_step: int = 0
    total_steps: int | None = None
    reports: int = 0
    teacher_forward_sentences: int = 0
    teacher_cache_hits: int = 0
    teacher_cache_misses: int = 0
    resumed_from: int | None = None  # the checkpoint step a restarted attempt continued from
    error: str | None = None

    @classmethod
    def load(cls, run_dir: Path, trial_id: str) -> "_TrialState":
        path = run_dir / TRIAL_STATE
        if path.is_file():
            data = json.loads(path.read_text(encoding="utf-8"))
            names = {f.name for f in dataclasses.fields(cls)}
            return cls(**{k: v for k, v in data.items() if k in names})
        return cls(trial_id=trial_id)

    def save(self, run_dir: Path) -> None:
        _write_json(run_dir / TRIAL_STATE, dataclasses.asdict(self))


class _TrialReporter:
    """The ``run_distillation`` progress hook: STS-B dev to Tune at every evaluation, the mean loss in between."""

    def __init__(self, state: _TrialState, run_dir: Path, num_stages: int):
        self.state, self.run_dir, self.num_stages = state, run_dir, num_stages
        self.final_step: int | None = None
        self.loss_sum, self.loss_count, self.lr = 0.0, 0, None
        self.stage = 1
        self.pending: dict[str, Any] | None = None
        self.reported = 0

    def __call__(self, event: str, info: dict[str, Any], step: int) -> None:
        state = self.state
        if event == "stage":
            self.stage = int(info["stage"])
            state.teacher_forward_sentences += int(info.get("teacher_forward_sentences", 0))
            state.teacher_cache_hits += int(info.get("hits", 0))
            state.teacher_cache_misses += int(info.get("misses", 0))
            if self.stage == self.num_stages:
                self.final_step = int(info["step_offset"]) + int(info["total_steps"])
            state.total_steps = self.final_step or state.total_steps
            state.save(self.run_dir)
        elif event == "step":
            if math.isfinite(info.get("loss", math.nan)):
                self.loss_sum += float(info["loss"])
                self.loss_count += 1
            self.lr = info.get("lr", self.lr)
            state.last_step = step
        elif event == "eval":
            best = info.get("best_stsb_dev")
            if best is not None and math.isfinite(best) and (state.best_stsb_dev is None or best > state.best_stsb_dev):
                state.best_stsb_dev, state.best_step = float(best), step
            state.last_step = step
            metrics = self._metrics(info, step)
            state.save(self.run_dir)
            if self.final_step is not None and step >= self.final_step:
                # The last evaluation goes to Tune after run_distillation returns: a stop decision made on it
                # (ASHA, a time budget) must not cut the trial's final checkpoint, plots and artifacts.
                self.pending = metrics
            else:
                self._report(metrics)

    def _metrics(self, info: dict[str, Any], step: int) -> dict[str, Any]:
        metrics = {
            "stsb_dev": float(info["stsb_dev"]),
            METRIC: float(self.state.best_stsb_dev if self.state.best_stsb_dev is not None else info["stsb_dev"]),
            "step": int(step), "stage": self.stage, "total_steps": int(self.final_step or 0),
            "teacher_forward_sentences": self.state.teacher_forward_sentences,
            "teacher_cache_hits": self.state.teacher_cache_hits, "attempt": self.state.attempts,
        }
        if self.loss_count:
            metrics["loss"] = self.loss_sum / self.loss_count
        if self.lr is not None:
            metrics["lr"] = float(self.lr)
        self.loss_sum, self.loss_count = 0.0, 0
        return metrics

    def _report(self, metrics: dict[str, Any]) -> None:
        from ray import tune

        self.state.reports += 1
        self.reported += 1
        self.state.save(self.run_dir)
        tune.report(metrics)  # Tune may stop the trial here: it raises SystemExit in this thread

    def finish(self, record: dict[str, Any]) -> None:
        """Report the held-back final evaluation (or, when this attempt evaluated nothing, the run's best)."""
        if self.pending is not None:
            metrics, self.pending = self.pending, None
        elif self.reported == 0:
            training = record.get("training", {})
            best = training.get("best_stsb_dev")
            if best is None:
                return
            metrics = {"stsb_dev": float(best), METRIC: float(best), "step": int(training.get("steps", 0)),
                       "stage": self.stage, "total_steps": int(self.final_step or training.get("steps", 0)),
                       "teacher_forward_sentences": self.state.teacher_forward_sentences,
                       "teacher_cache_hits": self.state.teacher_cache_hits, "attempt": self.state.attempts}
        else:
            return
        self._report(metrics)


def distill_trial(config: dict[str, Any], plan: dict[str, Any]) -> None:
    """The Tune trainable: one ``run_distillation`` of the base config with the sampled ``config`` values."""
    import torch
    from ray import tune

    from raydistill.runtime import checkpoint as ckpt
    from raydistill.runtime.distill import run_distillation
    from raydistill.methods import stage_plan
    from raydistill.runtime.tracking import Tracker

    sweep = SweepPlan.from_dict(plan)
    trial_id = tune.get_context().get_trial_id()
    params = {key: _plain(value) for key, value in config.items()}
    run_dir = sweep.trial_dir(trial_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    state = _TrialState.load(run_dir, trial_id)
    state.params, state.attempts, state.status, state.error = params, state.attempts + 1, "running", None
    latest = ckpt.latest_checkpoint(run_dir)  # what the learner will continue from (a restarted attempt)
    state.resumed_from = int(ckpt.read_manifest(latest)["step"]) if latest is not None else None
    threads = sweep.sweep_settings.trial_threads()
    torch.set_num_threads(threads)
    tracker = Tracker(sweep.tracking(f"trial-{trial_id}"), parent_run_id=sweep.parent_run_id,
                      run_id=state.mlflow_run_id,
                      tags={"raydistill.sweep": sweep.name, "raydistill.trial_id": trial_id,
                            "raydistill.attempt": state.attempts, "method": sweep.method, "student": sweep.student,
                            "teacher": sweep.teacher or "none"})
    state.mlflow_run_id = tracker.run_id or state.mlflow_run_id
    state.save(run_dir)
    tracker.log_params({f"tune.{key}": value for key, value in params.items()}
                       | {"tune.trial_id": trial_id, "tune.threads": threads})
    try:
        cfg = sweep.trial_config(params, run_dir, trial_id)
        reporter = _TrialReporter(state, run_dir, num_stages=len(stage_plan(cfg)))
        print(f"[tune] trial {trial_id} (attempt {state.attempts}): {params}", flush=True)
        record = run_distillation(cfg, evaluate=False, tracker=tracker, progress=reporter,
                                  command=f"raydistill tune (sweep {sweep.name}, trial {trial_id})")
    except SystemExit:  # Tune stopped this trial inside tune.report (ASHA or the time budget)
        state.status = "stopped"
        state.save(run_dir)
        tracker.set_tags({"raydistill.trial_status": "stopped_early"})
        tracker.end("KILLED")
        raise
    except BaseException as exc:
        state.status, state.error = "failed", f"{type(exc).__name__}: {exc}"[:2000]
        state.save(run_dir)
        tracker.set_tags({"raydistill.trial_status": "failed", "raydistill.error": state.error[:500]})
        tracker.end("FAILED")
        raise
    training = record.get("training", {})
    if training.get("best_stsb_dev") is not None:
        state.best_stsb_dev, state.best_step = float(training["best_stsb_dev"]), training.get("best_step")
    state.status, state.last_step = "finished", int(training.get("steps", state.last_step))
    state.save(run_dir)
    tracker.set_tags({"raydistill.trial_status": "finished"})
    tracker.end("FINISHED")
    reporter.finish(record)


def trial_concurrency(settings: "SweepSettings", cluster_cpus: float, data_cpus: float = 1.0) -> int:
    """How many trials may run at once: their CPUs plus ``data_cpus`` left free for the Ray Data tasks every trial
    starts (from_arrow, iteration), which Ray schedules outside the trial's placement group. With every CPU held by
    trials those tasks would wait forever (docs/runtime.md, Ray behaviour)."""
    free = cluster_cpus - data_cpus
    if settings.num_cpus > free + 1e-9:
        raise SpaceError(
            f"resources_per_trial.num_cpus = {settings.num_cpus:g} leaves no CPU for Ray Data on a cluster of "
            f"{cluster_cpus:g} CPUs (each trial's data tasks need {data_cpus:g} CPU outside the trials): use "
            f"--cpus-per-trial {max(0.25, free):g} or less")
    cap = max(1, int(math.floor(free / settings.num_cpus + 1e-9)))
    return min(cap, settings.max_concurrent_trials or cap)


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


def _trial_dirname(trial) -> str:
    return trial.trial_id


# ----------------------------------------------------------------------------------------------------------------
# The driver


def run_sweep(plan: SweepPlan, *, resume: bool = False, callbacks: list | None = None,
              verbose: int = 1) -> dict[str, Any]:
    """Run (or, with ``resume``, continue) ``plan``'s sweep; return the summary (also ``<sweep_dir>/summary.json``).

    ``callbacks``: extra ``ray.tune.Callback`` objects for the Tuner (they are saved with it and come back on resume).
    """
    import ray
    from ray import tune

    from raydistill.runtime.cluster import init_ray
    from raydistill.runtime.tracking import Tracker

    started = time.time()
    sweep_dir = Path(plan.sweep_dir)
    if not resume and (sweep_dir / "sweep.json").is_file():
        raise SpaceError(f"a sweep already exists in {sweep_dir}; continue it with --resume, or choose another "
                         "--sweep-dir")
    if resume and not tune.Tuner.can_restore(str(plan.tune_dir)):
        raise SpaceError(f"{plan.tune_dir}: no Ray Tune state to resume (the sweep never started its trials); "
                         f"remove {sweep_dir} and start again")
    sweep_dir.mkdir(parents=True, exist_ok=True)
    base = plan.base()
    init_ray(base)
    concurrency = trial_concurrency(plan.sweep_settings, float(ray.cluster_resources().get("CPU", 0)))

    parent = Tracker(plan.tracking(plan.name), run_id=plan.parent_run_id if resume else None,
                     tags={"raydistill.sweep": plan.name, "raydistill.kind": "tune", "method": plan.method,
                           "student": plan.student, "teacher": plan.teacher or "none"})
    if parent.run_id:
        plan.parent_run_id = parent.run_id
    plan.save()
    if not resume:
        settings = plan.sweep_settings
        parent.log_params({"student": plan.student, "method": plan.method, "teacher": plan.teacher or "none",
                           "search.algorithm": plan.algorithm, "search.num_samples": settings.num_samples,
                           "search.seed": settings.seed, "search.time_budget_s": settings.time_budget_s,
                           "scheduler": "ASHA", "scheduler.metric": METRIC,
                           "scheduler.grace_evals": settings.grace_evals,
                           "scheduler.reduction_factor": settings.reduction_factor,
                           "resources_per_trial.num_cpus": settings.num_cpus,
                           "resources_per_trial.num_gpus": settings.num_gpus,
                           "resources_per_trial.threads": settings.trial_threads(),
                           "space_file": plan.space_file, "config_hash": base.config_hash(),
                           "start_from": json.dumps(plan.start_from)}
                          | {f"space.{key}": Param(key, *next(iter(spec.items()))).describe()
                             for key, spec in plan.params.items()})
    print(f"[tune] sweep {plan.name}: {plan.sweep_dir}; search {plan.algorithm}, "
          f"{plan.sweep_settings.num_samples} samples" + (f"; MLflow {parent.tracking_uri} run {parent.run_id}"
                                                          if parent.run_id else ""), flush=True)
    try:
        teacher_pass, max_t = _shared_data_pass(plan, parent)
        print(f"[tune] up to {concurrency} trial(s) at once ({plan.sweep_settings.num_cpus:g} CPU and "
              f"{plan.sweep_settings.trial_threads()} thread(s) each; 1 CPU left to Ray Data)", flush=True)
        tuner = _tuner(plan, max_t, resume=resume, callbacks=callbacks, verbose=verbose, concurrency=concurrency)
        tuner.fit()
        summary = _summarize(plan, teacher_pass, started)
        _prune_checkpoints(summary)
        _finish_children(plan, summary)
        _export_best(plan, summary)
        _evaluate(plan, summary)
        summary["wall_s"] = round(time.time() - started, 1)
        summary["concurrent_trials"] = concurrency
        _write_json(sweep_dir / "summary.json", summary)
        _log_summary(parent, plan, summary)
    except BaseException:
        parent.end("FAILED")
        raise
    parent.end("KILLED" if summary["ended_by"] == "interrupted" else "FINISHED")
    return summary


def resume_sweep(sweep_dir: str | os.PathLike, **kwargs) -> dict[str, Any]:
    """Continue the sweep saved in ``sweep_dir`` (``run_sweep(SweepPlan.load(sweep_dir), resume=True)``)."""
    return run_sweep(SweepPlan.load(sweep_dir), resume=True, **kwargs)


def _shared_data_pass(plan: SweepPlan, parent) -> tuple[dict[str, Any], int]:
    """Build stage 1's training data once in the driver (the teacher pass through the embedding cache), so every
    trial only hits caches; return its counts and ASHA's ``max_t`` (the base config's steps)."""
    from raydistill.runtime.learner_group import LearnerGroup
    from raydistill.methods import stage_plan
    from raydistill.runtime.stage_data import build_stage_data

    cfg = plan.trial_config({}, Path(plan.sweep_dir) / "trials" / "_shared", "shared")
    stage = stage_plan(cfg)[0]
    started = time.perf_counter()
    data = build_stage_data(stage.cfg, stage.spec)
    seconds = time.perf_counter() - started
    stats = dict(getattr(data, "cache_stats", {}) or {})
    counts = {"sentences": int(data.num_rows), "hits": int(stats.get("hits", 0)),
              "misses": int(stats.get("misses", 0)),
              "teacher_forward_sentences": int(stats.get("teacher_forward_sentences", 0)),
              "seconds": round(seconds, 2), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    max_t = LearnerGroup(stage.cfg, stage.spec, run_dir=stage.run_dir).total_steps(data)
    shutil.rmtree(Path(plan.sweep_dir) / "trials" / "_shared", ignore_errors=True)
    passes_path = Path(plan.sweep_dir) / "teacher_passes.json"
    passes = json.loads(passes_path.read_text()) if passes_path.is_file() else []
    passes.append(counts)
    _write_json(passes_path, passes)
    print(f"[tune] teacher pass (once for all trials): {counts['sentences']} rows, {counts['hits']} cached, "
          f"{counts['teacher_forward_sentences']} sentences through the teacher ({seconds:.1f}s)", flush=True)
    parent.log_metrics({"teacher_forward_sentences": counts["teacher_forward_sentences"],
                        "teacher_cache_hits": counts["hits"], "teacher_cache_misses": counts["misses"],
                        "teacher_pass_s": seconds}, step=len(passes) - 1)
    return {"passes": passes}, max_t


def _tuner(plan: SweepPlan, max_t: int, *, resume: bool, callbacks: list | None, verbose: int, concurrency: int):
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    settings = plan.sweep_settings
    trainable = tune.with_resources(tune.with_parameters(distill_trial, plan=plan.to_dict()),
                                    {"cpu": settings.num_cpus, "gpu": settings.num_gpus})
    if resume:
        return tune.Tuner.restore(str(plan.tune_dir), trainable=trainable, resume_unfinished=True,
                                  resume_errored=False, restart_errored=False)
    eval_every = int(plan.base_config.get("train", {}).get("eval_every") or 1)
    grace = max(1, min(settings.grace_evals * eval_every, max_t))
    scheduler = ASHAScheduler(time_attr="step", max_t=max(max_t, grace), grace_period=grace,
                              reduction_factor=settings.reduction_factor, stop_last_trials=False)
    points = [dict(p) for p in plan.start_from]
    max_concurrent = concurrency  # trial_concurrency: the CPU cap and max_concurrent_trials, whichever is lower
    if plan.algorithm == "optuna":
        from ray.tune.search.optuna import OptunaSearch

        search = OptunaSearch(points_to_evaluate=points or None, seed=settings.seed)
    else:
        from ray.tune.search.basic_variant import BasicVariantGenerator

        # Tune ignores TuneConfig.max_concurrent_trials for a BasicVariantGenerator passed in: it takes its own.
        search = BasicVariantGenerator(points_to_evaluate=points or None, random_state=settings.seed,
                                       max_concurrent=max_concurrent or 0)
        max_concurrent = None
    tune_config = tune.TuneConfig(metric=METRIC, mode="max", search_alg=search, scheduler=scheduler,
                                  num_samples=settings.num_samples, max_concurrent_trials=max_concurrent,
                                  time_budget_s=settings.time_budget_s, trial_dirname_creator=_trial_dirname,
                                  # the next trial runs in the finished one's process: no new worker, no second
                                  # import of torch/transformers/ray.data (bench/sweep.py measures the difference)
                                  reuse_actors=True)
    run_config = tune.RunConfig(name=plan.tune_dir.name, storage_path=str(plan.tune_dir.parent),
                                failure_config=tune.FailureConfig(max_failures=0, fail_fast=False),
                                callbacks=callbacks, verbose=verbose)
    return tune.Tuner(trainable, param_space=plan.param_space(), tune_config=tune_config, run_config=run_config)


def _summarize(plan: SweepPlan, teacher_pass: dict[str, Any], started: float) -> dict[str, Any]:
    from ray.tune import ExperimentAnalysis
    from ray.tune.experiment import Trial

    analysis = ExperimentAnalysis(str(plan.tune_dir))
    start_points = [_canonical(p) for p in plan.start_from]
    rows = []
    for trial in sorted(analysis.trials, key=lambda t: t.trial_id):
        run_dir = plan.trial_dir(trial.trial_id)
        state = _TrialState.load(run_dir, trial.trial_id)
        params = state.params or {k: _plain(v) for k, v in (trial.config or {}).items()}
        if trial.status == Trial.ERROR:
            status = "failed"
        elif trial.status == Trial.TERMINATED:
            status = "finished" if state.status == "finished" else "stopped_early"
        else:
            status = "interrupted"
        error = state.error
        if status == "failed" and not error:
            tune_error = trial.get_error()
            error = str(tune_error).strip().splitlines()[-1][:2000] if tune_error else "unknown error"
        best_dir = run_dir / "best"
        rows.append({
            "trial_id": trial.trial_id, "params": params, "status": status, "tune_status": trial.status,
            "stopped_early": status == "stopped_early", "best_stsb_dev": _round(state.best_stsb_dev),
            "best_step": state.best_step, "last_step": state.last_step, "total_steps": state.total_steps,
            "reports": state.reports, "attempts": state.attempts, "resumed_from": state.resumed_from,
            "teacher_forward_sentences": state.teacher_forward_sentences,
            "teacher_cache_hits": state.teacher_cache_hits, "error": error if status == "failed" else None,
            "start_point": _canonical(params) in start_points, "run_dir": str(run_dir),
            "best_dir": str(best_dir) if (best_dir / "modules.json").is_file() else None,
            "mlflow_run_id": state.mlflow_run_id,
        })
    rows.sort(key=lambda r: (r["best_stsb_dev"] is None, -(r["best_stsb_dev"] or 0.0), r["trial_id"]))
    counts = {status: sum(r["status"] == status for r in rows)
              for status in ("finished", "stopped_early", "failed", "interrupted")}
    settings = plan.sweep_settings
    elapsed = time.time() - started
    if counts["interrupted"] or (len(rows) < plan.expected_trials() and not (
            settings.time_budget_s and elapsed >= settings.time_budget_s)):
        ended_by = "interrupted"
    elif settings.time_budget_s and elapsed >= settings.time_budget_s:
        ended_by = "time_budget"
    else:
        ended_by = "completed"
    passes = teacher_pass["passes"]
    driver_forward = sum(p["teacher_forward_sentences"] for p in passes)
    trial_forward = sum(r["teacher_forward_sentences"] for r in rows)
    summary = {
        "sweep": plan.name, "sweep_dir": plan.sweep_dir, "student": plan.student, "method": plan.method,
        "teacher": plan.teacher, "space_file": plan.space_file, "search_algorithm": plan.algorithm,
        "scheduler": {"name": "ASHA", "metric": METRIC, "time_attr": "step", "grace_evals": settings.grace_evals,
                      "reduction_factor": settings.reduction_factor},
        "settings": plan.settings, "space": plan.params, "start_from": plan.start_from,
        "ended_by": ended_by, "trials_expected": plan.expected_trials(), "trials_total": len(rows),
        "trials": rows, "counts": counts,
        "teacher_forward_sentences": {"driver": driver_forward, "trials": trial_forward,
                                      "total": driver_forward + trial_forward},
        "teacher_passes": passes,
        "mlflow": {"tracking_uri": plan.tracking_uri, "experiment": plan.experiment,
                   "parent_run_id": plan.parent_run_id},
        "best": None, "default": None,
        "resume_command": f"raydistill tune --resume --sweep-dir {plan.sweep_dir}",
    }
    return summary


def _canonical(params: dict[str, Any]) -> str:
    return json.dumps({k: float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v
                       for k, v in sorted(params.items())}, sort_keys=True)


def _round(value: float | None) -> float | None:
    return None if value is None else round(float(value), 4)


def _prune_checkpoints(summary: dict[str, Any]) -> None:
    """Step checkpoints of trials that Tune will not run again (a queue of 131072 x 768 is 400 MB each); only an
    interrupted trial needs its own to continue on --resume. Every trial keeps its best model."""
    for row in summary["trials"]:
        if row["status"] != "interrupted":
            shutil.rmtree(Path(row["run_dir"]) / "checkpoints", ignore_errors=True)


def _finish_children(plan: SweepPlan, summary: dict[str, Any]) -> None:
    """Give every trial's MLflow run its final status (a trial stopped inside tune.report may not have)."""
    from raydistill.runtime.tracking import Tracker

    status_of = {"finished": "FINISHED", "stopped_early": "KILLED", "failed": "FAILED", "interrupted": "KILLED"}
    for row in summary["trials"]:
        if not row["mlflow_run_id"] or not plan.tracking_enabled:
            continue
        child = Tracker(plan.tracking(), run_id=row["mlflow_run_id"],
                        tags={"raydistill.trial_status": row["status"]})
        if row["best_stsb_dev"] is not None:
            child.log_metrics({"trial_best_stsb_dev": row["best_stsb_dev"]}, step=row["last_step"] or 0)
        if row["error"]:
            child.set_tags({"raydistill.error": row["error"][:500]})
        child.end(status_of[row["status"]])


def _export_best(plan: SweepPlan, summary: dict[str, Any]) -> None:
    """Copy the best trial's model to ``<sweep>/best/model`` and write its job config to ``<sweep>/best/config.yaml``."""
    candidates = [r for r in summary["trials"] if r["status"] != "failed" and r["best_dir"]]
    for label, pick in (("best", candidates[:1]), ("default", [r for r in candidates if r["start_point"]][:1])):
        if pick:
            summary[label] = {k: pick[0][k] for k in ("trial_id", "params", "best_stsb_dev", "best_step", "status")}
    if not summary["best"]:
        print("[tune] no trial produced a model; nothing to export", flush=True)
        return
    best = candidates[0]
    out = Path(plan.sweep_dir) / "best"
    out.mkdir(parents=True, exist_ok=True)
    model_dir = out / "model"
    tmp = out / f".model.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(best["best_dir"], tmp)
    shutil.rmtree(model_dir, ignore_errors=True)
    os.replace(tmp, model_dir)
    cfg = plan.export_config(best["params"])
    header = (f"# Tuned by `raydistill tune` (sweep {plan.name}, trial {best['trial_id']}, best STS-B dev "
              f"{best['best_stsb_dev']} at step {best['best_step']}).\n"
              f"# Searched values: {json.dumps(best['params'])}\n"
              f"# Train it as a normal job: python jobs/{plan.method}.py --config {out / 'config.yaml'}\n")
    (out / "config.yaml").write_text(header + cfg.to_yaml(), encoding="utf-8")
    summary["best"].update(model_dir=str(model_dir), config_path=str(out / "config.yaml"))
    print(f"[tune] best trial {best['trial_id']}: STS-B dev {best['best_stsb_dev']} with {best['params']}; model "
          f"{model_dir}, config {out / 'config.yaml'}", flush=True)


def _evaluate(plan: SweepPlan, summary: dict[str, Any]) -> None:
    """STS scores of the best and the start_from (default-setting) trial's models; result files for the 7 sets."""
    if not plan.evaluate_sets:
        return
    from raydistill.evaluation import STS7, evaluate_sts, write_result
    from raydistill.models import BiEncoder

    results_dir = Path(plan.results_dir or "results").resolve() / "tune"
    for label in ("best", "default"):
        entry = summary.get(label)
        if not entry:
            continue
        row = next(r for r in summary["trials"] if r["trial_id"] == entry["trial_id"])
        model_dir = entry.get("model_dir") or row["best_dir"]
        started = time.time()
        model = BiEncoder.from_pretrained(str(model_dir))
        scores = evaluate_sts(model, sets=tuple(plan.evaluate_sets), progress=False)
        entry["scores"] = {k: round(float(v), 2) for k, v in scores.items()}
        print(f"[tune] {label} trial {entry['trial_id']}: " + ", ".join(f"{k} {v:.2f}" for k, v in
                                                                          entry["scores"].items()), flush=True)
        if not set(STS7) <= set(scores):
            continue
        path = results_dir / f"{plan.name}-{'tuned' if label == 'best' else 'default'}.json"
        write_result(str(path), kind="tune", method=plan.method, model=plan.student, encoder="bi",
                     teacher=plan.teacher, params_m=round(sum(p.numel() for p in model.parameters()) / 1e6, 3),
                     scores=entry["scores"], wall_s=round(time.time() - started, 1), model_dir=str(model_dir),
                     command=plan.command or "raydistill tune",
                     training={"sweep": plan.name, "trial_id": entry["trial_id"], "params": entry["params"],
                               "trial_status": entry["status"], "best_stsb_dev": entry["best_stsb_dev"],
                               "best_step": entry["best_step"], "search_algorithm": plan.algorithm,
                               "trials": summary["trials_total"], "base_config_hash": plan.base().config_hash(),
                               "transductive": False},
                     **({"mlflow_run_id": row["mlflow_run_id"]} if row["mlflow_run_id"] else {}))
        entry["result_path"] = str(path)


def _log_summary(parent, plan: SweepPlan, summary: dict[str, Any]) -> None:
    counts = summary["counts"]
    metrics = {"trials_total": summary["trials_total"], "trials_finished": counts["finished"],
               "trials_stopped_early": counts["stopped_early"], "trials_failed": counts["failed"],
               "trials_interrupted": counts["interrupted"],
               "teacher_forward_sentences_total": summary["teacher_forward_sentences"]["total"],
               "teacher_forward_sentences_trials": summary["teacher_forward_sentences"]["trials"]}
    for label in ("best", "default"):
        entry = summary.get(label) or {}
        if entry.get("best_stsb_dev") is not None:
            metrics[f"{label}_stsb_dev"] = entry["best_stsb_dev"]
        for key, value in (entry.get("scores") or {}).items():
            metrics[f"{label}_test_{key}"] = value
    parent.log_metrics(metrics)
    parent.set_tags({"raydistill.ended_by": summary["ended_by"]})
    if summary.get("best"):
        parent.log_params({f"best.{k}": v for k, v in summary["best"]["params"].items()}
                          | {"best.trial_id": summary["best"]["trial_id"]})
        parent.log_artifact(summary["best"]["config_path"], "best")
        parent.log_artifacts(summary["best"]["model_dir"], "best/model")
    parent.log_artifact(Path(plan.sweep_dir) / "summary.json")


def format_trials_table(summary: dict[str, Any]) -> str:
    """The trials as a fixed-width table (best first), for the command line."""
    keys = list(summary.get("space", {}))
    header = ["trial", "status", "best dev", "step"] + [k.split(".")[-1] for k in keys]
    rows = [header]
    for row in summary["trials"]:
        dev = "-" if row["best_stsb_dev"] is None else f"{row['best_stsb_dev']:.2f}"
        step = f"{row['last_step']}/{row['total_steps'] or '?'}"
        rows.append([row["trial_id"] + ("*" if row["start_point"] else ""), row["status"], dev, step]
                    + [_short_value(row["params"].get(k)) for k in keys])
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(header))]
    lines = ["  ".join(str(cell).ljust(width) for cell, width in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


def _short_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return "-" if value is None else str(value)


# ----------------------------------------------------------------------------------------------------------------
# Helpers


def _space_error(path: Path, lines: dict[str, int], where: str, message: str) -> SpaceError:
    line = None
    probe = where
    while probe:
        if probe in lines:
            line = lines[probe]
            break
        probe = probe.rpartition(".")[0]
    location = f"{path}:{line}" if line else str(path)
    return SpaceError(f"{location}: field '{where}': {message}")


def _suggest(name: str, choices) -> str:
    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)
