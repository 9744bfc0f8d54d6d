"""The distillation methods, one file each: what a method reads, runs through the student and hands to its loss.

| method | student sees | teacher sees | loss | default loss |
|---|---|---|---|---|
| congen | control + generalize view | control view (cached) | soft CE over queue+batch, ½ con + ½ gen | K 16384, τ_t .05, τ_s .07 (MiniLM-L3 row of Table 7), queue from teacher vectors |
| sct | views a, b (+ a no-grad reference pass, dropout on) | — | cross-view KL over queue+batch | K 65536, τ_t .02, τ_s .03 (Small row) |
| sct-distill | views a, b | views a, b (cached) | cross-view KL (+ L_SCT, own τ .02/.03) | K 65536, τ_t .04, τ_s .05, queues from teacher vectors |
| ckd | view a | view a (cached) | InfoNCE vs teacher vectors + queue, learnable scale | K 65536, scale e (τ = e^-1), empty queue |
| congen-ckd | control + generalize view | control view (cached) | w · CKD + (1 − w) · ConGen over one queue (a recipe lever, no paper's method) | w .5; ConGen's K, τ_t, τ_s and queue init; CKD's scale e (τ = e^-1) learned |
| distilcse | ckd, then supervised SimCSE on NLI triplets | | | stage 2: τ .05, lr 5e-5 |
| dvbert | NLI pairs (siamese), then STS-B train | K fine-tuned NLI cross-encoders | teacher-annealed CE, then cosine MSE | |
| l2 | view a | view a (cached) | MSE to the teacher vector | |
| simcse | view a twice (two dropout masks) | — | InfoNCE, τ .05 | |

Defaults follow the authors' code (docs/methods.md says where and why they differ); every one can be overridden in
``loss:``. Projecting methods give a student narrower than the teacher ``Linear(d_s → d_t)`` as a
sentence-transformers Dense module, saved with the model. Queue losses read the rows' ``group``: rows of one caption
group (one image) are not each other's negatives.

Adding a method is an objective (raydistill/objectives/), a file here that defines its ``SPEC`` (with the schema of
its ``loss:`` and ``extra:`` settings) and a config: every module of this package with a ``SPEC`` is registered, and
``--help`` lists its settings (docs/adding-a-method.md).
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from pathlib import Path

from raydistill.config.help import register_method
from raydistill.config.job import ConfigError, JobConfig
from raydistill.config.schema import suggest
from raydistill.methods.base import CORPUS, MethodSpec, StepContext
from raydistill.nested import deep_merge as _deep_merge  # also raydistill.runtime.tune.plan's

__all__ = ["MethodSpec", "StepContext", "METHODS", "CORPUS", "get_method", "job_methods", "with_method_defaults",
           "validate_method", "Stage", "stage_plan", "stage_config"]


def _discover() -> dict[str, MethodSpec]:
    """The ``SPEC`` of every module of this package, by method name (a name defined twice is an error)."""
    specs: dict[str, MethodSpec] = {}
    for module_info in sorted(pkgutil.iter_modules(__path__), key=lambda info: info.name):
        spec = getattr(importlib.import_module(f"{__name__}.{module_info.name}"), "SPEC", None)
        if not isinstance(spec, MethodSpec):
            continue
        if spec.name in specs:
            raise RuntimeError(f"raydistill.methods.{module_info.name} defines method {spec.name!r} again")
        specs[spec.name] = spec
    return specs


METHODS: dict[str, MethodSpec] = _discover()
for _spec in METHODS.values():  # what --help lists (the config layer cannot import this package)
    register_method(_spec.name, _spec.summary, _spec.loss_settings, _spec.extra_settings, internal=_spec.internal)

_DEFAULT_VIEWS = {"a": "none"}


def get_method(name: str) -> MethodSpec:
    if name not in METHODS:
        raise KeyError(f"unknown method {name!r}{suggest(name, METHODS)}; known: {', '.join(job_methods())}")
    return METHODS[name]


def job_methods() -> list[str]:
    """Methods a job config may name (internal stages excluded)."""
    return [name for name, spec in METHODS.items() if not spec.internal]


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
    data["loss"] = cfg.loss.in_use() if isinstance(cfg.loss, spec.loss_settings) else {**spec.default_loss, **cfg.loss}
    if data == cfg.to_dict() and isinstance(cfg.loss, spec.loss_settings):
        return cfg
    return JobConfig.from_dict(data, source=cfg._source, lines=cfg._lines)


def validate_method(cfg: JobConfig) -> JobConfig:
    """``cfg`` with its method's defaults, schema-checked and checked against the method; raises ConfigError
    naming the field. Pure: no file, model or cluster is touched (``runtime.preflight`` does that)."""
    if cfg.method not in METHODS:
        raise cfg._error("method", f"unknown method {cfg.method!r}{suggest(cfg.method, job_methods())}; known: "
                                   f"{', '.join(job_methods())}")
    effective = with_method_defaults(cfg).validate()
    spec = METHODS[cfg.method]
    spec.validate(effective, dict(effective.data.views), spec.teacher_views_of(effective))
    return effective


@dataclass
class Stage:
    """One training stage of a job: its config, method, and directory (``best/``, ``checkpoints/``)."""

    index: int
    name: str
    cfg: JobConfig
    spec: MethodSpec
    run_dir: Path


def stage_config(cfg: JobConfig, index: int) -> JobConfig:
    """Config of stage ``index`` (≥ 1): the job's student/seed/resources/tracking, the stage method's data and loss,
    the job's ``train`` updated by the method's stage defaults and then by the user's ``extra.stage<index+1>``."""
    spec = METHODS[cfg.method]
    stage_method = spec.stages[index - 1]
    defaults = spec.stage_defaults[index - 1] if index - 1 < len(spec.stage_defaults) else {}
    user = getattr(cfg.extra, f"stage{index + 1}") or {}
    unknown = set(user) - {"train", "loss", "data", "resources"}
    if unknown:
        raise cfg._error(f"extra.stage{index + 1}", f"unknown section(s) {sorted(unknown)}; allowed: train, loss, "
                                                    "data, resources")
    views = {"data": {"views": dict(METHODS[stage_method].views)}} if METHODS[stage_method].views else {}
    sections = _deep_merge(_deep_merge(views, defaults), user)
    try:
        return validate_method(JobConfig.for_stage(
            stage_method, cfg.student, seed=cfg.seed, run_dir=None, parent=cfg,
            source=f"{cfg._source or 'config'} (extra.stage{index + 1})", **sections))
    except ConfigError as exc:
        raise ConfigError(f"stage {index + 1} ({stage_method}) of method {cfg.method!r}: {exc}") from None


def stage_plan(cfg: JobConfig) -> list[Stage]:
    """The stages of ``cfg``'s method. One stage: it lives in the run dir itself; several: ``stage<i>-<method>/``."""
    spec = METHODS[cfg.method]
    run_dir = cfg.resolved_run_dir()
    if not spec.stages:
        return [Stage(1, cfg.method, cfg, spec, run_dir)]
    return [Stage(1, cfg.method, cfg, spec, run_dir / f"stage1-{cfg.method}")] + [
        Stage(i + 1, name, stage_config(cfg, i), METHODS[name], run_dir / f"stage{i + 1}-{name}")
        for i, name in enumerate(spec.stages, start=1)]
