"""The Trans-Encoder job's configuration: its schema (``TencConfig`` and its sections), validation, and the names of
a cycle's two stages. The sections and the stage names live in ``sections.py`` and are re-exported here; import them
from this module.

Defaults are the paper's training settings; ``configs/mutual_tenc*.yaml`` scale them to a machine. Every section is a
pydantic dataclass of ``raydistill.config.schema`` (as the job config's): an unknown key or a wrong type is an error
naming the file, the line and the closest valid name; ``validate()`` checks ranges, names and the rules across
fields. Each field's ``description`` is its line in ``--help``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, ValidationError

from raydistill.nested import flatten
from raydistill.runtime.engine.cluster import Reservation
from raydistill.config.job import (
    ConfigError,
    RoleResources,
    TrackingConfig,
    _build,
    _drop_paths,
    _suggest,
    _to_plain,
    _where,
    apply_overrides,
    load_yaml_with_overrides,
    paths_at_default,
)
from raydistill.config.schema import Float, Int, error_text, section
from raydistill.runtime.tenc.pairs import PAIR_SOURCES
from raydistill.runtime.tenc.sections import (
    _DEFAULTS_IF_NULL,
    STAGE_LABELS,
    STAGE_TRAINED_IN,
    STAGE_TRAINS,
    STAGES,
    STS7,
    FamilyConfig,
    PairsConfig,
    StageConfig,
    TencEvalConfig,
    TencResources,
    stage_key,
)

__all__ = [
    "STAGES",
    "STAGE_LABELS",
    "STAGE_TRAINED_IN",
    "STAGE_TRAINS",
    "STS7",
    "TENC_HASH_EXCLUDE",
    "FamilyConfig",
    "PairsConfig",
    "StageConfig",
    "TencConfig",
    "TencEvalConfig",
    "TencResources",
    "stage_key",
]

MODES = ("mutual", "self")
INITS = ("refresh", "sequential")
TEST_CYCLES = ("all", "best", "none")
_FAMILY_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]*")
_STAGE_KEY = re.compile(r"cycle=(\d+)/stage=(" + "|".join(STAGES) + ")")


STAGE_PRECISIONS = ("fp32", "bf16", "auto")
# What a family may set for itself (families[i].bi_stage / cross_stage): how long and how fast it trains. Lengths,
# precision and the head stay shared, so every family labels and is evaluated the same way.
FAMILY_STAGE_KEYS = ("lr", "epochs", "batch_size", "max_steps", "warmup_ratio", "weight_decay", "grad_clip",
                     "eval_every")


def _paper_bi_stage() -> StageConfig:
    # docs/methods.md, Trans-Encoder: batch 128, 10 epochs, lr 5e-5, no warm-up, max_seq_length 32.
    return StageConfig(batch_size=128, lr=5e-5, epochs=10, max_length=32, warmup_ratio=0.0)


def _paper_cross_stage() -> StageConfig:
    # docs/methods.md, Trans-Encoder: batch 32, 1 epoch, lr 2e-5, warm-up 10 %, max_length 64.
    return StageConfig(batch_size=32, lr=2e-5, epochs=1, max_length=64, warmup_ratio=0.1)


def _default_families() -> list[FamilyConfig]:
    return [FamilyConfig(name="minilm-l3", bi="minilm-l3"), FamilyConfig(name="bert-small", bi="bert-small")]


@section
class TencConfig:
    """A Trans-Encoder job. Defaults are the paper's training settings; configs/*.yaml scale them to a machine."""

    mode: str = Field("mutual", description="mutual (average the families' labels) or self (each family its own "
                                            "labels)")
    families: list[FamilyConfig] = Field(default_factory=_default_families,
                                         description="model families, one bi- and one cross-encoder each "
                                                     "(shorthand: a list of presets)")
    cycles: Int = Field(3, description="bi -> cross -> bi cycles")
    init: str = Field("refresh", description="refresh (each stage starts from the original checkpoint) or "
                                             "sequential (from the previous stage's weights)")
    # objectives.trans_encoder.cosine_to_target; "clip" keeps the authors' raw cosine wherever it is >= 0.
    label_scaling: str = Field("clip", description="bi cosine -> cross-encoder BCE target: clip (the raw cosine, 0 "
                                                   "below 0), affine ((c + 1) / 2) or raw (the authors' code)")
    label_weighting: str = Field("mean", description="mutual mode, how the families' labels combine: mean (the "
                                                     "authors') or dev (weights softmax(dev / "
                                                     "label_weight_temperature) from each labeller's dev score)")
    # at 2, 4 points better on dev weighs e^2 (7.4x) more
    label_weight_temperature: Float = Field(2.0, description="temperature of the dev weighting, in dev points")
    seed: Int = Field(1000, description="seed of sampling, shuffling and initialisation")
    pairs: Annotated[PairsConfig, _DEFAULTS_IF_NULL] = Field(default_factory=PairsConfig,
                                                             description="the unlabeled pairs")
    bi: Annotated[StageConfig, _DEFAULTS_IF_NULL] = Field(default_factory=_paper_bi_stage,
                                                          description="the bi-encoder stage of every cycle")
    cross: Annotated[StageConfig, _DEFAULTS_IF_NULL] = Field(default_factory=_paper_cross_stage,
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
    stop_after_stage: str | None = Field(None, description="tests only: stop cleanly once this stage "
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
        """Ranges, names and the rules across fields, section by section in a fixed order (the first problem found
        is the one reported); raises ConfigError naming the field (and the file and line). Returns self."""
        self._check_families()
        self._check_labels()
        self._check_pairs()
        self._check_stage_settings()
        self._check_evaluation()
        self._check_resources()
        self._check_run()
        return self

    def _check_families(self) -> None:
        """The mode and the model families: names, models, pooling."""
        err = self._error
        if self.mode not in MODES:
            raise err("mode", f"{self.mode!r}{_suggest(self.mode, MODES)} is not one of {', '.join(MODES)}")
        if not self.families:
            raise err("families", "needs at least one model family")
        if self.mode == "mutual" and len(self.families) < 2:
            raise err("families", f"mutual distillation averages the labels of two or more families, got "
                                  f"{len(self.families)}; add a family or use mode: self")
        names = [f.name for f in self.families]
        for i, family in enumerate(self.families):
            where = f"families[{i}]"
            if not _FAMILY_NAME.fullmatch(family.name or ""):
                raise err(f"{where}.name", f"{family.name!r} must be lower-case letters, digits, '-', '_' or '.' "
                                           "(it names Parquet columns and directories)")
            if names.count(family.name) > 1:
                raise err(f"{where}.name", f"family name {family.name!r} is used twice")
            self._check_model(f"{where}.bi", family.bi)
            if family.cross is not None:
                self._check_model(f"{where}.cross", family.cross)
                if self.init == "sequential" and family.cross != family.bi:
                    raise err(f"{where}.cross", "init: sequential starts every cross-encoder from the preceding "
                                                "bi-encoder's weights, so a separate cross checkpoint would be "
                                                "unused; remove it or use init: refresh")
            if family.pooling not in (None, "mean", "cls"):
                raise err(f"{where}.pooling", f"{family.pooling!r} is not one of mean, cls (or null)")

    def _check_labels(self) -> None:
        """How the stages' labels are made: init, cycles, label scaling and weighting."""
        err = self._error
        if self.init not in INITS:
            raise err("init", f"{self.init!r}{_suggest(self.init, INITS)} is not one of {', '.join(INITS)}")
        _positive(err, "cycles", self.cycles)
        from raydistill.objectives.trans_encoder import LABEL_SCALINGS

        if self.label_scaling not in LABEL_SCALINGS:
            raise err("label_scaling", f"{self.label_scaling!r}{_suggest(self.label_scaling, LABEL_SCALINGS)} "
                                       f"is not one of {', '.join(LABEL_SCALINGS)}")
        from raydistill.objectives.trans_encoder import LABEL_WEIGHTINGS

        if self.label_weighting not in LABEL_WEIGHTINGS:
            raise err("label_weighting", f"{self.label_weighting!r}{_suggest(self.label_weighting, LABEL_WEIGHTINGS)}"
                                         f" is not one of {', '.join(LABEL_WEIGHTINGS)}")
        if self.label_weighting == "dev" and self.mode != "mutual":
            raise err("label_weighting", "'dev' weighs the families' labels against each other, which only mode "
                                         "mutual combines; use mean with mode self")
        if not (isinstance(self.label_weight_temperature, (int, float)) and self.label_weight_temperature > 0):
            raise err("label_weight_temperature", f"must be a number > 0 (dev points), got "
                                                  f"{self.label_weight_temperature!r}")

    def _check_pairs(self) -> None:
        """The unlabeled pairs' source and size."""
        err = self._error
        source = self.pairs.source
        if source.startswith("file:"):
            if not Path(source[len("file:"):]).expanduser().is_file():
                raise err("pairs.source", f"pair file not found: {source[len('file:'):]}")
        elif source not in PAIR_SOURCES:
            raise err("pairs.source", f"{source!r}{_suggest(source, PAIR_SOURCES)} is not one of "
                                      f"{', '.join(PAIR_SOURCES)} or file:<path>")
        _positive(err, "pairs.max_pairs", self.pairs.max_pairs, allow_none=True)

    def _check_stage_settings(self) -> None:
        """The shared bi and cross stage settings, each family's own on top, and the heads."""
        err = self._error
        for kind in ("bi", "cross"):
            self._check_stage(kind, getattr(self, kind))
        for i, family in enumerate(self.families):
            for kind in ("bi", "cross"):
                own = family.own_stage(kind)
                where = f"families[{i}].{kind}_stage"
                for key in own:
                    if key not in FAMILY_STAGE_KEYS:
                        raise err(f"{where}.{key}", f"not a per-family setting{_suggest(key, FAMILY_STAGE_KEYS)}; a "
                                                    f"family sets only {', '.join(FAMILY_STAGE_KEYS)} (the rest "
                                                    f"under {kind}:)")
                if own:
                    try:
                        settings = self.stage_settings(family, kind)
                    except ValidationError as exc:
                        path, message = error_text(StageConfig, exc, f"{where}.")
                        raise err(path, message) from None
                    self._check_stage(where, settings)
        from raydistill.models.cross_encoder import HEADS

        if self.bi.head is not None:
            raise err("bi.head", "the head is a cross-encoder setting (bi-encoders pool: families[i].pooling); "
                                 "remove it")
        if self.cross.head is not None and self.cross.head not in HEADS:
            raise err("cross.head", f"{self.cross.head!r}{_suggest(self.cross.head, HEADS)} is not one of "
                                    f"{', '.join(HEADS)}")

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
        if self.eval.test_cycles not in TEST_CYCLES:
            raise err("eval.test_cycles", f"{self.eval.test_cycles!r} is not one of {', '.join(TEST_CYCLES)}")
        if self.eval.test_cycles != "none" and not set(STS7) <= set(self.eval.test_sets):
            raise err("eval.test_sets", f"result files need all of {', '.join(STS7)}; use eval.test_cycles: none "
                                        "to skip test evaluation")

    def _check_resources(self) -> None:
        """The actors' resources and Ray Data's headroom."""
        err = self._error
        r = self.resources
        _positive(err, "resources.num_cpus", r.num_cpus)
        for role in ("bi", "cross"):
            rr: RoleResources = getattr(r, role)
            if rr.num_actors != 1:
                raise err(f"resources.{role}.num_actors", "each family has exactly one actor per role; leave it at 1")
            for name in ("num_cpus", "num_gpus"):
                if getattr(rr, name) < 0:
                    raise err(f"resources.{role}.{name}", f"{getattr(rr, name)} must be >= 0")
            _positive(err, f"resources.{role}.threads", rr.threads)
            _positive(err, f"resources.{role}.batch_size", rr.batch_size)
        family_names = [family.name for family in self.families]
        for name, custom in r.families.items():
            if name not in family_names:
                raise err(f"resources.families.{name}", f"no family is named {name!r} (families: "
                                                         f"{', '.join(family_names)})")
            for resource, amount in custom.items():
                if amount <= 0:
                    raise err(f"resources.families.{name}.{resource}", f"{amount} must be > 0")
        if r.data_max_cpus < 0.5:
            raise err("resources.data_max_cpus", f"{r.data_max_cpus} is below 0.5: Ray Data needs CPU headroom or "
                                                 "its Parquet writes hang (ray-project/ray#44687)")

    def _check_run(self) -> None:
        """Tracking and the stage a test run stops after."""
        err = self._error
        if not self.tracking.experiment:
            raise err("tracking.experiment", "must be a non-empty name")
        if self.stop_after_stage is not None and not _STAGE_KEY.fullmatch(self.stop_after_stage):
            raise err("stop_after_stage", f"{self.stop_after_stage!r}: expected cycle=<k>/stage=<bi2cross|cross2bi>")


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

    def _check_stage(self, where: str, stage: StageConfig) -> None:
        err = self._error
        for name in ("batch_size", "epochs", "max_length", "eval_every", "lr"):
            _positive(err, f"{where}.{name}", getattr(stage, name))
        _positive(err, f"{where}.max_steps", stage.max_steps, allow_none=True)
        if not 0 <= stage.warmup_ratio < 1:
            raise err(f"{where}.warmup_ratio", f"{stage.warmup_ratio} must be in [0, 1)")
        if stage.weight_decay < 0 or stage.grad_clip < 0:
            raise err(f"{where}.weight_decay" if stage.weight_decay < 0 else f"{where}.grad_clip", "must be >= 0")
        if stage.max_length < 8:
            raise err(f"{where}.max_length", f"{stage.max_length} tokens cannot hold a sentence (pair)")
        if stage.precision not in STAGE_PRECISIONS:
            raise err(f"{where}.precision", f"{stage.precision!r} is not one of {', '.join(STAGE_PRECISIONS)}")

    def _check_model(self, path: str, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise self._error(path, "must name a model preset or a local directory")
        if Path(name).expanduser().is_dir():
            return
        if "/" in name or name.startswith((".", "~")):
            raise self._error(path, f"model directory not found: {name}")
        from raydistill.models.registry import PRESETS

        if name not in PRESETS:
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
                             "label_weighting": ("mean",), "label_weight_temperature": (2.0,)}


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


def _positive(err, path: str, value, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if value is None or isinstance(value, bool) or value <= 0:
        raise err(path, f"must be > 0, got {value!r}")


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
