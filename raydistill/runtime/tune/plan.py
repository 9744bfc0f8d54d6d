"""A sweep's plan (``SweepPlan``, saved as ``<sweep>/sweep.json``): the base job config, the searched values, the
settings and the search algorithm, resolved and checked before Ray starts (``plan_sweep``).

``raydistill.methods``, ``preflight`` and ``evaluation`` import torch or numpy, so the functions that need them import
them: importing the plan stays cheap.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from raydistill.config.job import ConfigError, JobConfig, TrackingConfig
from raydistill.runtime.engine.tracking import resolve_tracking_uri
from raydistill.config.sweep import SweepSettings, pbt_mutable
from raydistill.runtime.tune.space import MethodSpace, Param, SearchSpace, SpaceError, load_space, space_for
from raydistill.shipped import shipped_config

__all__ = ["SweepPlan", "plan_sweep", "default_sweep_dir", "uses_teacher", "write_json"]


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
        write_json(path, self.to_dict())
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

    def train_storage(self, trial_id: str) -> Path:
        """Where a trial's Train runs persist their checkpoints: inside the trial's directory of the sweep's Tune
        storage, so a trial restored elsewhere (another node sharing that storage) resumes from them."""
        return self.tune_dir / trial_id / "train"

    def param_objects(self) -> dict[str, Param]:
        return {key: Param(key, *next(iter(spec.items()))) for key, spec in self.params.items()}

    def param_space(self) -> dict[str, Any]:
        return {key: param.to_tune() for key, param in self.param_objects().items()}

    def pbt_mutations(self) -> dict[str, Any]:
        """PBT's ``hyperparam_mutations``: the searched keys it may change in a running trial (``pbt_mutable``)."""
        return {key: param.to_pbt() for key, param in self.param_objects().items() if pbt_mutable(key)}

    def scheduler_settings(self) -> dict[str, Any]:
        """The scheduler's own settings (PBT's mutable keys sorted), as the summary and the parent run record them."""
        s = self.sweep_settings
        if s.scheduler == "pbt":
            return {"perturbation_evals": s.perturbation_evals, "quantile_fraction": s.quantile_fraction,
                    "synchronous": s.synchronous, "mutations": sorted(self.pbt_mutations())}
        return {"grace_evals": s.grace_evals, "reduction_factor": s.reduction_factor}

    def expected_trials(self) -> int:
        grid = math.prod(len(spec["grid"]) for spec in self.params.values() if "grid" in spec)
        return int(self.sweep_settings.num_samples) * grid

    def tracking(self, run_name: str | None = None) -> TrackingConfig:
        return TrackingConfig(enabled=self.tracking_enabled, tracking_uri=self.tracking_uri,
                              experiment=self.experiment, run_name=run_name)

    def base(self) -> JobConfig:
        return JobConfig.from_dict(self.base_config, source=f"{self.sweep_dir}/sweep.json (base_config)")

    def trial_config(self, params: dict[str, Any], run_dir: str | os.PathLike, trial_id: str) -> JobConfig:
        """The base config with ``params``, run by a trial: its Train workers (``resources_per_trial``), their
        checkpoints in the sweep's Tune storage (``train_storage``; in local mode the trial reports its checkpoints
        to Tune itself), absolute run/cache/tracking locations."""
        from raydistill.runtime.engine.preflight import preflight

        settings = self.sweep_settings
        data = _with_params(self.base_config, params)
        data["run_dir"] = str(run_dir)
        if self.cache_dir:
            data["cache_dir"] = self.cache_dir
        learner = data.setdefault("resources", {}).setdefault("learner", {})
        learner.update(num_learners=settings.num_learners, num_cpus=settings.num_cpus,
                       threads=settings.trial_threads(), num_gpus=settings.num_gpus)
        if settings.num_learners:  # local mode: Tune persists the checkpoints the trial reports (train_loop)
            data.setdefault("runtime", {})["storage_path"] = str(self.train_storage(trial_id))
        if settings.scheduler == "pbt":  # PBT may hand any evaluation's checkpoint to a weaker trial
            train = data.setdefault("train", {})
            train["checkpoint_every"] = int(train.get("eval_every") or 1)
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
    """Whether ``method`` distils a teacher (a sweep of it then defaults to teacher ``mpnet-base``)."""
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

    ``teacher``: default ``mpnet-base`` where the method distils one. ``config_path``: the base job config (default
    the shipped ``configs/<method>.yaml``); ``overrides``: ``--set key.path=value``. ``settings``: SweepSettings
    fields (None keeps the file's). ``param_values``: searched key -> values, as a ``choice`` (``--lr``, ...).
    ``evaluate_sets``: sets for the best and ``start_from`` trials after the sweep (STS7 writes result files)."""
    from raydistill.methods import with_method_defaults

    space = load_space(space_file) if space_file else load_space(space_for(student))
    section = space.method(method)
    if teacher is None and uses_teacher(method):
        teacher = "mpnet-base"
    base = _base_config(method, student, teacher, section, space, config_path, list(overrides))
    params = dict(section.params)
    for key, values in (param_values or {}).items():
        if values:
            params[key] = Param(key=key, kind="choice", values=tuple(values), from_command_line=True)
    sweep_settings = SweepSettings().updated(space.settings).updated(settings or {})
    where = f"methods.{method}"
    for key, param in params.items():
        for value in param.candidates():
            _check_values(base, {key: value}, space, None if param.from_command_line else f"{where}.space.{key}",
                          f"{key}={value!r}")
    for i, point in enumerate(section.start_from):
        _check_values(base, point, space, f"{where}.start_from", f"start_from[{i}] {point}")
    algorithm = _resolve_algorithm(sweep_settings.algorithm, params, space, sweep_settings.scheduler)
    if sweep_settings.scheduler == "pbt":
        _check_pbt(base, params, sweep_settings)

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
    from raydistill.runtime.engine.preflight import preflight

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
        source = f"{source + ' + ' if source else ''}{space.path} (methods.{method}.base)"
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
    from raydistill.runtime.engine.preflight import preflight

    try:
        preflight(JobConfig.from_dict(_with_params(base.to_dict(), values)))
    except ConfigError as exc:
        message = f"{label}: {exc}"
        if where is None:  # a command-line value
            raise SpaceError(f"command-line search values: {message}") from None
        raise space.error(where, message) from None


def _resolve_algorithm(requested: str, params: dict[str, Param], space: SearchSpace, scheduler: str = "asha") -> str:
    """``auto``: Optuna's TPE when optuna is installed and no entry is a ``grid``, else seeded random search (with
    10-30 trials TPE's random start is most of the search anyway). PBT changes the values itself, which a model of
    finished trials' values cannot describe: random search."""
    has_grid = any(p.kind == "grid" for p in params.values())
    optuna_available = importlib.util.find_spec("optuna") is not None
    if scheduler == "pbt":
        if requested == "optuna":
            raise SpaceError("scheduler pbt changes a trial's values while it runs, which optuna's model of "
                             "finished trials cannot follow: use --search random (or auto)")
        return "random"
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


def _check_pbt(base: JobConfig, params: dict[str, Param], settings: SweepSettings) -> None:
    """PBT continues a weaker trial from a stronger trial's checkpoint, which Tune must hold and the trial must be
    able to load with changed values: refuse, before Ray starts, a sweep where that cannot happen."""
    from raydistill.methods import stage_plan, with_method_defaults

    if settings.num_learners != 0:
        raise SpaceError(
            "scheduler pbt needs resources_per_trial.num_learners: 0 (--learners-per-trial 0): a trial continues "
            "another trial's checkpoint, which Tune must hold, and a trial's Ray Train workers hand Tune only the "
            "path of theirs (Ray Train's TuneReportCallback), while a trial in Train's local mode reports its "
            "checkpoints to Tune itself")
    if not any(pbt_mutable(key) for key in params):
        raise SpaceError(f"scheduler pbt: none of the searched keys ({', '.join(params) or 'none'}) can change in a "
                         "running trial; PBT changes train.lr and the loss temperatures (loss.tau_*, "
                         "loss.temperature)")
    if len(stage_plan(with_method_defaults(base))) > 1:
        raise SpaceError(f"scheduler pbt: method {base.method!r} trains in several stages, and a trial continuing "
                         "another's checkpoint would have to continue its stages too; use the asha scheduler")


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` atomically and durably: a reader (or a resume) never sees half a file, a crash never loses it."""
    from raydistill.fileio import atomic_write_json

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, data, default=str)
