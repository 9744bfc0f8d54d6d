"""The Trans-Encoder job's configuration: its schema (``TencConfig`` and its sections), validation, and the names of
a cycle's two stages. The sections and the stage names live in ``sections.py`` and are re-exported here; import them
from this module.

Defaults are the paper's training settings; ``configs/mutual_tenc*.yaml`` scale them to a machine. Every section is a
pydantic dataclass of ``raydistill.config.schema`` (as the job config's): an unknown key, a wrong type, a value out
of its range or not among its choices is an error naming the file, the line, the field and the closest valid name;
``validate()`` checks the rules across fields and the names of models and data sets. Each field's ``description`` is
its line in ``--help``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationError

from raydistill.nested import flatten
from raydistill.config.sections import Reservation
from raydistill.config.job import (ConfigError, TrackingConfig, _build, _drop_paths, _suggest, _to_plain, _where,
                                  apply_overrides, load_yaml_with_overrides, paths_at_default)
from raydistill.config.schema import Float, Int, error_text, section, states
from raydistill.objectives.trans_encoder import LABEL_SCALINGS, LABEL_WEIGHTINGS
from raydistill.runtime.tenc.pairs import PAIR_CLASSIFICATION_SOURCES, PAIR_SOURCES
from raydistill.runtime.tenc.sections import (_DEFAULTS_IF_NULL, STAGE_LABELS, STAGE_TRAINED_IN, STAGE_TRAINS, STAGES,
                                            STS7, TEACHER_LABELLER, FamilyConfig, PairsConfig, StageConfig,
                                            TencEvalConfig, TencResources, stage_key)

__all__ = ["STAGES", "STAGE_LABELS", "STAGE_TRAINED_IN", "STAGE_TRAINS", "STS7", "TEACHER_LABELLER",
           "TENC_HASH_EXCLUDE", "FamilyConfig", "PairsConfig", "StageConfig", "TencConfig", "TencEvalConfig",
           "TencResources", "stage_key"]

_STAGE_KEY = re.compile(r"cycle=(\d+)/stage=(" + "|".join(STAGES) + ")")
# What a family may set for itself (families[i].bi_stage / cross_stage): how long and how fast it trains. Lengths,
# precision and the head stay shared, so every family labels and is evaluated the same way.
FAMILY_STAGE_KEYS = ("lr", "epochs", "batch_size", "max_steps", "warmup_ratio", "weight_decay", "grad_clip",
                     "eval_every")


@states("cycle=<k>/stage=<bi2cross|cross2bi>")
def _stage_key(key: str | None) -> str | None:
    if key is not None and not _STAGE_KEY.fullmatch(key):
        raise ValueError(f"{key!r}: expected cycle=<k>/stage=<bi2cross|cross2bi>")
    return key


@section
class TencConfig:
    """A Trans-Encoder job. Defaults are the paper's training settings; configs/*.yaml scale them to a machine."""

    mode: Literal["mutual", "self"] = Field("mutual", description="mutual (average the families' labels) or self (each family its own "
                                            "labels)")
    families: list[FamilyConfig] = Field(default_factory=lambda: [FamilyConfig(name="minilm-l3", bi="minilm-l3"),
                                                                  FamilyConfig(name="bert-small", bi="bert-small")],
                                         description="model families, one bi- and one cross-encoder each "
                                                     "(shorthand: a list of presets)")
    cycles: Int = Field(3, gt=0, description="bi -> cross -> bi cycles")
    init: Literal["refresh", "sequential"] = Field("refresh", description="refresh (each stage starts from the original checkpoint) or "
                                             "sequential (from the previous stage's weights)")
    # objectives.trans_encoder.cosine_to_target; "clip" keeps the authors' raw cosine wherever it is >= 0.
    label_scaling: Literal[LABEL_SCALINGS] = Field("clip", description="bi cosine -> cross-encoder BCE target: clip (the raw cosine, 0 "
                                                   "below 0), affine ((c + 1) / 2) or raw (the authors' code)")
    label_weighting: Literal[LABEL_WEIGHTINGS] = Field("mean", description="mutual mode, how the families' labels combine: mean (the "
                                                     "authors') or dev (weights softmax(dev / "
                                                     "label_weight_temperature) from each labeller's dev score)")
    # at 2, 4 points better on dev weighs e^2 (7.4x) more
    label_weight_temperature: Float = Field(2.0, gt=0, description="temperature of the dev weighting, in dev points")
    teacher: str | None = Field(None, description="mutual mode: a frozen bi-encoder (a preset or a local directory) "
                                                 "whose cosine joins every label set as one more labeller "
                                                 f"(score_{TEACHER_LABELLER}), weighed as label_weighting weighs the "
                                                 "families' labellers; computed once per run (null: none)")
    seed: Int = Field(1000, description="seed of sampling, shuffling and initialisation")
    pairs: Annotated[PairsConfig, _DEFAULTS_IF_NULL] = Field(default_factory=PairsConfig,
                                                             description="the unlabeled pairs")
    # docs/methods.md, Trans-Encoder: bi batch 128, 10 epochs, lr 5e-5, no warm-up, max_seq_length 32; cross batch 32,
    # 1 epoch, lr 2e-5, warm-up 10 %, max_length 64.
    bi: Annotated[StageConfig, _DEFAULTS_IF_NULL] = Field(
        default_factory=lambda: StageConfig(batch_size=128, lr=5e-5, epochs=10, max_length=32, warmup_ratio=0.0),
        description="the bi-encoder stage of every cycle")
    cross: Annotated[StageConfig, _DEFAULTS_IF_NULL] = Field(
        default_factory=lambda: StageConfig(batch_size=32, lr=2e-5, epochs=1, max_length=64, warmup_ratio=0.1),
        description="the cross-encoder stage of every cycle")
    eval: Annotated[TencEvalConfig, _DEFAULTS_IF_NULL] = Field(default_factory=TencEvalConfig,
                                                               description="model selection and final evaluation")
    run_dir: str | None = Field(None, description="labels, models and state (null: runs/<run_name>)")
    run_name: str | None = Field(None, description="null: tenc-<mode>-<families>-<pairs>-<config hash>")
    results_dir: str | None = Field(None, description="result files (null: results/mutual_tenc/<run_name>)")
    resources: Annotated[TencResources, _DEFAULTS_IF_NULL] = Field(default_factory=TencResources,
                                                                   description="per-role actor resources")
    tracking: Annotated[TrackingConfig, _DEFAULTS_IF_NULL] = Field(
        default_factory=lambda: TrackingConfig(experiment="raydistill-tenc"), description="MLflow")
    stop_after_stage: Annotated[str | None, AfterValidator(_stage_key)] = Field(None, description="tests only: stop cleanly once this stage "
                                                           "(cycle=1/stage=bi2cross) is complete, as a crash there "
                                                           "would")

    _source: str | None = dataclasses.field(default=None, init=False, repr=False, compare=False)
    _lines: dict[str, int] = dataclasses.field(default_factory=dict, init=False, repr=False, compare=False)

    # ------------------------------------------------------------------------------------------------------------
    # Construction (config.py's strict builder: unknown keys are errors naming file, line and the closest valid name)

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, source: str | None = None,
                  lines: dict[str, int] | None = None) -> TencConfig:
        if not isinstance(d, dict):
            raise ConfigError(_where(source, lines or {}, "") + f"a config must be a mapping, got {type(d).__name__}")
        d = _expand_family_shorthand(d)
        cfg = _build(cls, d, "", source, lines or {})
        cfg._source, cfg._lines = source, dict(lines or {})
        return cfg

    @classmethod
    def from_yaml(cls, path: str | os.PathLike, overrides: list[str] | None = None) -> TencConfig:
        data, lines = load_yaml_with_overrides(path, overrides)
        return cls.from_dict(data, source=str(path), lines=lines)

    def with_overrides(self, overrides: list[str]) -> TencConfig:
        data, lines = self.to_dict(), dict(self._lines)
        apply_overrides(data, lines, overrides)
        return TencConfig.from_dict(data, source=self._source, lines=lines)

    def to_dict(self) -> dict[str, Any]:
        return _to_plain(self)

    # ------------------------------------------------------------------------------------------------------------
    # Identity and locations

    def config_hash(self) -> str:
        import hashlib

        canonical = json.dumps(_hashed(self.to_dict()), sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def diff_keys(self, other: dict[str, Any]) -> list[str]:
        mine, theirs = flatten(_hashed(self.to_dict())), flatten(_hashed(other))
        return sorted(k for k in mine.keys() | theirs.keys() if mine.get(k, "<absent>") != theirs.get(k, "<absent>"))

    @property
    def method(self) -> str:
        return f"tenc-{self.mode}"

    def default_run_name(self) -> str:
        """``tenc-<mode>-<family>+<family>-<pairs>-<config hash>``: runs that differ in anything that changes
        training never share a directory, and rerunning the same command resumes the same one."""
        pairs = "all" if self.pairs.max_pairs is None else f"p{self.pairs.max_pairs}"
        return f"tenc-{self.mode}-{'+'.join(f.name for f in self.families)}-{pairs}-{self.config_hash()[:8]}"

    def resolved_run_dir(self) -> Path:
        if self.run_dir:
            return _output_path(self.run_dir)
        return _output_path(Path("runs") / (self.run_name or self.default_run_name()))

    def resolved_run_name(self) -> str:
        return self.run_name or self.resolved_run_dir().name

    def resolved_results_dir(self) -> Path:
        if self.results_dir:
            return _output_path(self.results_dir)
        return _output_path(Path("results") / "mutual_tenc" / self.resolved_run_name())

    def pairs_seed(self) -> int:
        return self.seed if self.pairs.seed is None else self.pairs.seed

    def stage_settings(self, family: FamilyConfig, kind: str) -> StageConfig:
        """The ``bi`` or ``cross`` stage settings of ``family``: the shared ones, with the family's own on top."""
        return dataclasses.replace(getattr(self, kind), **family.own_stage(kind))

    # ------------------------------------------------------------------------------------------------------------
    # Validation (before Ray starts)

    def validate(self) -> TencConfig:
        """The rules across fields and the names of models and data sets (ranges and choices were checked while the
        config was built), in a fixed order: the first problem found is the one reported; raises ConfigError naming
        the field (and the file and line). Returns self."""
        err = self._error
        if not self.families:
            raise err("families", "needs at least one model family")
        if self.mode == "mutual" and len(self.families) < 2:
            raise err("families", f"mutual distillation averages the labels of two or more families, got "
                                  f"{len(self.families)}; add a family or use mode: self")
        names = [f.name for f in self.families]
        for i, family in enumerate(self.families):
            if names.count(family.name) > 1:
                raise err(f"families[{i}].name", f"family name {family.name!r} is used twice")
            self._check_model(f"families[{i}].bi", family.bi)
            if family.cross is not None:
                self._check_model(f"families[{i}].cross", family.cross)
                if self.init == "sequential" and family.cross != family.bi:
                    raise err(f"families[{i}].cross", "init: sequential starts every cross-encoder from the "
                                                      "preceding bi-encoder's weights, so a separate cross "
                                                      "checkpoint would be unused; remove it or use init: refresh")
        if self.teacher is not None:
            if self.mode != "mutual":
                raise err("teacher", "a teacher labels the pairs every family learns from, which only mode mutual "
                                     "shares; remove it or use mode: mutual")
            if TEACHER_LABELLER in names:
                raise err(f"families[{names.index(TEACHER_LABELLER)}].name",
                          f"{TEACHER_LABELLER!r} names the teacher's labels (score_{TEACHER_LABELLER}); rename the "
                          "family")
            self._check_model("teacher", self.teacher)
        if self.label_weighting == "dev" and self.mode != "mutual":
            raise err("label_weighting", "'dev' weighs the families' labels against each other, which only mode "
                                         "mutual combines; use mean with mode self")
        source = self.pairs.source
        if source.startswith("file:"):
            if not Path(source[len("file:"):]).expanduser().is_file():
                raise err("pairs.source", f"pair file not found: {source[len('file:'):]}")
        elif source not in PAIR_SOURCES:
            raise err("pairs.source", f"{source!r}{_suggest(source, PAIR_SOURCES)} is not one of "
                                      f"{', '.join(PAIR_SOURCES)} or file:<path>")
        if self.pairs.held_out is not None and source not in PAIR_CLASSIFICATION_SOURCES:
            raise err("pairs.held_out", f"held-out pairs are scored against their gold 0/1 labels, which only "
                                        f"{' and '.join(PAIR_CLASSIFICATION_SOURCES)} pairs carry; remove it or use "
                                        f"one of those sources")
        self._check_family_stages()
        if self.bi.head is not None:
            raise err("bi.head", "the head is a cross-encoder setting (bi-encoders pool: families[i].pooling); "
                                 "remove it")
        self._check_evaluation()
        self._check_resources()
        return self

    def _check_family_stages(self) -> None:
        """Each family's own stage settings: only the per-family keys, valid over the shared ones."""
        for i, family in enumerate(self.families):
            for kind in ("bi", "cross"):
                own = family.own_stage(kind)
                where = f"families[{i}].{kind}_stage"
                for key in own:
                    if key not in FAMILY_STAGE_KEYS:
                        raise self._error(f"{where}.{key}", f"not a per-family setting"
                                                            f"{_suggest(key, FAMILY_STAGE_KEYS)}; a family sets only "
                                                            f"{', '.join(FAMILY_STAGE_KEYS)} (the rest under {kind}:)")
                try:
                    self.stage_settings(family, kind)
                except ValidationError as exc:
                    path, message = error_text(StageConfig, exc, f"{where}.")
                    raise self._error(path, message) from None

    def _check_evaluation(self) -> None:
        """The dev and test sets and which cycles are tested."""
        err = self._error
        from raydistill.data import DATASETS
        from raydistill.evaluation import STS_SETS

        known_sets = list(STS_SETS) + [n for n, s in DATASETS.items() if s.kind == "scored_pairs"]
        for i, name in enumerate([self.eval.dev_set] + list(self.eval.test_sets)):
            path = "eval.dev_set" if i == 0 else f"eval.test_sets[{i - 1}]"
            if name not in known_sets:
                raise err(path, f"unknown STS set {name!r}{_suggest(name, known_sets)}")
        if self.eval.test_cycles != "none" and not set(STS7) <= set(self.eval.test_sets):
            raise err("eval.test_sets", f"result files need all of {', '.join(STS7)}; use eval.test_cycles: none "
                                        "to skip test evaluation")

    def _check_resources(self) -> None:
        """One actor per family and role, and custom resources only for families that exist."""
        err = self._error
        for role in ("bi", "cross"):
            if getattr(self.resources, role).num_actors != 1:
                raise err(f"resources.{role}.num_actors", "each family has exactly one actor per role; leave it at 1")
        family_names = [family.name for family in self.families]
        for name in self.resources.families:
            if name not in family_names:
                raise err(f"resources.families.{name}", f"no family is named {name!r} (families: "
                                                         f"{', '.join(family_names)})")

    def actor_reservation(self) -> Reservation:
        """What the job's actors hold while it runs (a bi- and a cross-encoder actor per family), for
        ``cluster.check_resources`` and Ray Data's planning (``cluster.configure_data_context``)."""
        n = len(self.families)
        r = self.resources
        # Families train at the same time, one stage each: n stages' Train workers at once (none in local mode).
        workers = n * r.learners.num_learners
        return Reservation(
            cpus=n * (r.bi.num_cpus + r.cross.num_cpus) + workers * r.learners.num_cpus,
            gpus=n * (r.bi.num_gpus + r.cross.num_gpus) + workers * r.learners.num_gpus,
            cpu_terms=f"{n} families x (bi {r.bi.num_cpus:g} + cross {r.cross.num_cpus:g}) CPU"
                      + (f" + {n} stages x {r.learners.num_learners} learner(s) x {r.learners.num_cpus:g} CPU"
                         if workers else ""),
            holders="the bi- and cross-encoder actors" + (" and the stages' learners" if workers else ""),
            cpu_fix="lower resources.bi.num_cpus / resources.cross.num_cpus (fractions are fine: threads set the "
                    "compute)" + (", resources.learners.num_learners or num_cpus" if workers else ""),
            gpu_fix="set resources.bi.num_gpus / resources.cross.num_gpus: 0"
                    + (" and resources.learners.num_gpus: 0" if workers else ""),
        )

    def _check_model(self, path: str, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise self._error(path, "must name a model preset or a local directory")
        if Path(name).expanduser().is_dir():
            return
        if "/" in name or name.startswith((".", "~")):
            raise self._error(path, f"model directory not found: {name}")
        from raydistill.models.registry import PRESETS, find_preset

        if find_preset(name) is None:
            raise self._error(path, f"unknown model preset {name!r}{_suggest(name, PRESETS)}; presets: "
                                    f"{', '.join(sorted(PRESETS))} (or a local model directory)")

    def _error(self, path: str, message: str) -> ConfigError:
        return ConfigError(_where(self._source, self._lines, path) + message)


# Fields that do not change what a completed stage produced: a run may be resumed across them. ``cycles`` is here
# so that a finished 3-cycle run can be extended to 5 by rerunning with cycles: 5.
TENC_HASH_EXCLUDE = ("cycles", "eval", "run_dir", "run_name", "results_dir", "resources", "tracking",
                     "stop_after_stage", "bi.eval_every", "cross.eval_every", "bi.amp", "cross.amp")
# Fields added after run directories existed, and the values that hash as if they were absent: a null head is the
# classifier, so runs from before ``head`` existed keep their directories.
TENC_HASHED_ONLY_WHEN_SET = {"bi.head": (None, "classifier"), "cross.head": (None, "classifier"),
                             "bi.precision": ("fp32",), "cross.precision": ("fp32",),
                             "label_weighting": ("mean",), "label_weight_temperature": (2.0,), "teacher": (None,),
                             "pairs.held_out": (None,)}


def _hashed(plain: dict[str, Any]) -> dict[str, Any]:
    """A config dict as the hash sees it (also a stored one, for diff_keys). A family's unset ``bi_stage`` /
    ``cross_stage`` is left out, so runs from before they existed keep their directories."""
    plain = _drop_paths(plain, TENC_HASH_EXCLUDE + paths_at_default(plain, TENC_HASHED_ONLY_WHEN_SET))
    if isinstance(plain.get("families"), list):
        plain["families"] = [{k: v for k, v in family.items() if not (k.endswith("_stage") and v is None)}
                             if isinstance(family, dict) else family for family in plain["families"]]
    return plain


def _expand_family_shorthand(d: dict[str, Any]) -> dict[str, Any]:
    """``families: [minilm-l3, bert-small]`` means ``[{name: minilm-l3, bi: minilm-l3}, ...]``."""
    families = d.get("families")
    if isinstance(families, list):
        d = dict(d)
        d["families"] = [{"name": _family_name(item), "bi": item} if isinstance(item, str) else item
                         for item in families]
    return d


def _family_name(model: str) -> str:
    return re.sub(r"[^a-z0-9_.-]+", "-", Path(model.rstrip("/")).name.lower()).strip("-") or "model"


def _output_path(path: str | os.PathLike) -> Path:
    """Relative output paths resolve against $RAYDISTILL_OUTPUT_ROOT when set, else the working directory.

    Under ``ray job submit --working-dir .`` the job runs in a temporary copy of the project, so outputs written
    relative to it would vanish with it; pass the project's absolute path in that variable (runtime_env env_vars).
    """
    path = Path(path).expanduser()
    if path.is_absolute():
        return path
    root = os.environ.get("RAYDISTILL_OUTPUT_ROOT")
    return (Path(root).expanduser() / path).resolve() if root else path.resolve()
