"""Search-space files (``tune_spaces/*.yaml``): found, read, and checked for structure and value types.

A file's schema is ``SpaceFile`` (``raydistill.config.schema``, as the job config's): its ``search``, ``scheduler``
and ``resources_per_trial`` sections take ``SweepSettings`` fields under the names a space file gives them, with
their types and ranges; ``methods.<name>`` is a ``MethodSection``. The searched keys and their distributions are
checked here; whether the values make valid jobs is checked against the base config by ``plan_sweep``.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Optional

from pydantic import BeforeValidator, Field

from raydistill.config.job import ConfigError, read_yaml
from raydistill.config.schema import build, line_of, none_is_default, section, suggest
from raydistill.config.sweep import SweepSettings, yaml_number
from raydistill.shipped import tune_spaces_dir

__all__ = ["SpaceError", "Param", "MethodSpace", "SearchSpace", "DISTRIBUTIONS", "SEARCHABLE", "spaces_dir",
           "load_space", "space_for", "list_spaces"]

DISTRIBUTIONS = ("choice", "grid", "uniform", "loguniform", "randint")
# What a space may vary: nothing that changes the text the teacher encodes, so one teacher pass serves every trial.
SEARCHABLE = ("train.", "loss.", "data.max_length", "student_pooling")


class SpaceError(ConfigError):
    """A problem in a search-space file or in the sweep options, worded ``<file>:<line>: field '<path>': ...``."""


def spaces_dir() -> Path:
    """``$RAYDISTILL_TUNE_SPACES`` if set, else the ``tune_spaces/`` shipped in the package."""
    return Path(os.environ.get("RAYDISTILL_TUNE_SPACES") or tune_spaces_dir()).expanduser().resolve()


@dataclass(frozen=True)
class Param:
    """One searched config key: ``choice``/``grid`` over values, or ``uniform``/``loguniform``/``randint`` [low, high]."""

    key: str
    kind: str
    values: tuple
    from_command_line: bool = False  # an error then names the option, not a line of the space file

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

    def to_pbt(self):
        """What PBT's explore step draws a new value from: the list of values (it moves to a neighbour or
        resamples), or the distribution."""
        if self.kind in ("choice", "grid"):
            return list(self.values)
        return self.to_tune()

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
            raise SpaceError(f"{self.path}: no search space for method {name!r}{suggest(name, self.methods)}; "
                             f"this file has: {', '.join(self.methods) or '(none)'}. Add a 'methods: {{{name}: "
                             "{space: ...}}' section")
        return self.methods[name]


_SETTING_SECTIONS = {
    "search": {"num_samples": "num_samples", "time_budget": "time_budget_s", "algorithm": "algorithm",
               "seed": "seed", "max_concurrent_trials": "max_concurrent_trials"},
    "scheduler": {"name": "scheduler", "grace_evals": "grace_evals", "reduction_factor": "reduction_factor",
                  "perturbation_evals": "perturbation_evals", "quantile_fraction": "quantile_fraction",
                  "synchronous": "synchronous"},
    "resources_per_trial": {"num_cpus": "num_cpus", "num_gpus": "num_gpus", "threads": "threads",
                            "num_learners": "num_learners", "keep_checkpoints": "keep_checkpoints",
                            "max_failures": "max_trial_failures"},
}


def _settings_section(name: str, fields: dict[str, str], doc: str) -> type:
    """A section whose keys are ``SweepSettings`` fields under a space file's names: same types and ranges, unset by
    default (the sweep's own defaults and the command line fill in the rest)."""
    members = []
    for key, target in fields.items():
        info = SweepSettings.__pydantic_fields__[target]
        hint = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
        members.append((key, Optional[hint], Field(None, description=info.description)))
    cls = dataclasses.make_dataclass(name, members)
    cls.__doc__ = doc
    return section(cls)


SearchSection = _settings_section("SearchSection", _SETTING_SECTIONS["search"], "The search budget and algorithm.")
SchedulerSection = _settings_section("SchedulerSection", _SETTING_SECTIONS["scheduler"],
                                     "ASHA (the default) or PBT (name: pbt), and their settings.")
TrialResources = _settings_section("TrialResources", _SETTING_SECTIONS["resources_per_trial"],
                                   "What each trial holds, and how often a lost trial restarts.")


def _one_or_more(value: Any) -> Any:
    return [value] if isinstance(value, dict) else ([] if value is None else value)


@section
class MethodSection:
    """``methods.<method>`` of a space file."""

    space: dict[str, Any] = Field(description="searched config key -> {choice: [...]} (or grid, uniform, "
                                              "loguniform, randint)")
    base: Annotated[dict[str, Any], BeforeValidator(none_is_default)] = Field(
        default_factory=dict, description="job-config fields over the base config (as in configs/*.yaml)")
    start_from: Annotated[list[dict[str, Any]], BeforeValidator(_one_or_more)] = Field(
        default_factory=list, description="points (searched key -> value) the sweep runs first")


@section
class SpaceFile:
    """One ``tune_spaces/*.yaml`` file."""

    methods: dict[str, MethodSection] = Field(description="method name -> its section")
    student: str | None = Field(None, description="the student the file is for (null: the file's name)")
    description: str | None = Field(None, description="one line for `raydistill tune --list`")
    search: Annotated[SearchSection, BeforeValidator(none_is_default)] = Field(default_factory=SearchSection,
                                                                               description="search budget")
    scheduler: Annotated[SchedulerSection, BeforeValidator(none_is_default)] = Field(
        default_factory=SchedulerSection, description="the trial scheduler")
    resources_per_trial: Annotated[TrialResources, BeforeValidator(none_is_default)] = Field(
        default_factory=TrialResources, description="what each trial holds")


def load_space(path: str | os.PathLike) -> SearchSpace:
    """Read and check one space file (structure and value types; values against a config in ``plan_sweep``)."""
    from raydistill.methods import job_methods  # imports torch

    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise SpaceError(f"search-space file not found: {path}")
    data, lines = read_yaml(path, SpaceError)
    if not isinstance(data, dict):
        raise SpaceError(f"{path}:1: a search-space file is a mapping with keys "
                         f"{', '.join(SpaceFile.__pydantic_fields__)}")

    def err(where: str, message: str) -> SpaceError:
        return _space_error(path, lines, where, message)

    if not data.get("methods"):  # (before the schema: an empty mapping is as missing as none)
        raise err("methods", "expected a mapping of method name -> {base, start_from, space}")
    parsed = build(SpaceFile, data, source=str(path), lines=lines, error=SpaceError)
    settings: dict[str, Any] = {}
    for section_name, fields in _SETTING_SECTIONS.items():
        given = getattr(parsed, section_name)
        settings.update({target: getattr(given, key) for key, target in fields.items()
                         if getattr(given, key) is not None})

    known = job_methods()
    methods: dict[str, MethodSpace] = {}
    for method, block in parsed.methods.items():
        where = f"methods.{method}"
        if method not in known:
            raise err(where, f"unknown method{suggest(str(method), known)}; known: {', '.join(known)}")
        params = _parse_params(block.space, f"{where}.space", err)
        for point in block.start_from:
            for key in point:
                if key not in params:
                    raise err(f"{where}.start_from", f"{key!r} is not searched in this section"
                                                     f"{suggest(str(key), params)}; searched: {', '.join(params)}")
        methods[method] = MethodSpace(method=method, params=params, base=dict(block.base),
                                      start_from=[dict(p) for p in block.start_from])
    student = str(parsed.student or path.stem)
    return SearchSpace(path=path, student=student, description=str(parsed.description or "").strip(),
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
            raise err(path, f"unknown distribution {kind!r}{suggest(str(kind), DISTRIBUTIONS)}; allowed: "
                            f"{', '.join(DISTRIBUTIONS)}")
        if not isinstance(values, list) or not values:
            raise err(path, f"{kind}: expected a non-empty list, got {values!r}")
        values = [yaml_number(v) for v in values]
        if kind in ("uniform", "loguniform", "randint"):
            if len(values) != 2 or not all(isinstance(v, (int, float)) for v in values) or values[0] >= values[1]:
                raise err(path, f"{kind}: expected [low, high] numbers with low < high, got {values!r}")
            if kind == "loguniform" and values[0] <= 0:
                raise err(path, f"loguniform: low must be > 0, got {values[0]!r}")
            if kind == "randint" and not all(isinstance(v, int) for v in values):
                raise err(path, f"randint: expected integers, got {values!r}")
        params[key] = Param(key=key, kind=kind, values=tuple(values))
    return params


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


def _space_error(path: Path, lines: dict[str, int], where: str, message: str) -> SpaceError:
    line = line_of(lines, where)
    location = f"{path}:{line}" if line else str(path)
    return SpaceError(f"{location}: field '{where}': {message}")
