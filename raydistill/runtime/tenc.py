"""Trans-Encoder self- and mutual distillation as a Ray job: families of bi-/cross-encoder actors exchanging labels.

Trans-Encoder (Liu, Jiao, Massiah, Yilmaz & Havrylov, ICLR 2022, arXiv:2109.13059; repo amzn/trans-encoder) turns
a pretrained sentence encoder into a better one without labels by alternating its two formulations on a set of
unlabeled pairs (``pairs.py``). One *cycle*, for every model family f (a bi-encoder b_f and a cross-encoder c_f
built from one checkpoint):

    bi2cross:  y_f  = cos(b_f(s1), b_f(s2))             every family labels every pair          (Parquet)
               y    = mean_f y_f   (mutual)   or  y_f   (self)
               c_f <- BCEWithLogits(c_f(s1,s2), t(y)) + both orders, best STS-B dev checkpoint
    cross2bi:  z_f  = (sigmoid c_f(s1,s2) + sigmoid c_f(s2,s1)) / 2                             (Parquet)
               z    = mean_f z_f   (mutual)   or  z_f   (self)
               b_f <- MSE(cos(b_f(s1), b_f(s2)), z), best STS-B dev checkpoint

Mutual distillation averages the families' labels, so each family learns from an ensemble of differently
pretrained models; self-distillation uses one family's own labels. Each learner is a Ray actor (``tenc_learners.py``,
resources from the config); families train concurrently and meet only at the label exchange, where the driver
averages, writes the label table and hands each learner its target vector. The authors' "parallel" script trains
the models one after another in one process (docs/methods.md, Trans-Encoder).

Initialisation (``init``): ``refresh`` (the paper's ``--init_with_new_models``; the authors' mutual script always
refreshes, here both modes honour ``init``) starts every cross-encoder from the family's original checkpoint with a
new head and every bi-encoder from its original checkpoint, so only labels carry information across stages;
``sequential`` starts each stage from the weights of the stage before it (cross_k from bi_{k-1}, bi_k from cross_k's
encoder, heads dropped/new).

Run directory (everything a resume or an inspection needs):

    <run_dir>/state.json                                  completed stages, label sets, evaluations, config hash
    <run_dir>/labels/cycle=<k>/stage=<bi2cross|cross2bi>/ Parquet: pair_id, sentence1, sentence2,
                                                          score_<family> per family, score (the average)
    <run_dir>/models/cycle=<k>/<bi|cross>/<family>/       the stage's best-dev model (cycle 0 = start checkpoints)
    <run_dir>/eval/cycle=<k>/<bi|cross>/<family>.npz      per-pair test predictions (ensembles are computed from these)
    <run_dir>/eval/cycle=<k>/<bi|cross>/<family>-pairs.npy the model's score of every training pair (qqp, mrpc)
    <run_dir>/best/<family>/<bi|cross>                    the best-dev model over all cycles (a copy)
    <run_dir>/summary.json                                start, best and whether training improved, per family
    <run_dir>/plots/dev_by_cycle.png                      every family's dev score per cycle (MLflow parent artifact)

A restarted job with the same config skips every completed stage and reuses its Parquet and models; ``cycles``
may grow between runs (a 3-cycle run continues to 5). Results go to ``results_dir`` as result-schema JSON: one per
family, encoder and cycle (``eval.test_cycles: all``; cycle 0 = the starting bi-encoders) or for cycle 0 and each
family's best-dev models only (``best``), plus the ensembles of the families (mean of their predictions), and a
copy of ``summary.json``.

Model selection (``_finish``) is on the dev set (STS-B dev) and includes the start: the bi-encoder candidates are
cycles 0..N, where cycle 0 is the starting checkpoint, so a run whose training never beats its start keeps the start
and says so. The cross-encoder candidates are cycles 1..N: before cycle 1 there is no cross-encoder, only the
checkpoint with a new, untrained head, whose score means nothing; the best cross-encoder is instead compared with
the starting bi-encoder. The job's last lines and ``summary.json`` state, per family, the start, the best (cycle) and
whether training improved on the start.

Pair classification (``pairs.source: qqp`` or ``mrpc``, the paper's binary tasks): the job learns on the unlabeled
pairs of QQP dev, or of MRPC train + validation, and scores every evaluated bi- and cross-encoder (at least the
start and the best-dev ones) by the ROC AUC x 100 of its pair scores (bi: cosine; cross: symmetrised sigmoid) against
the gold 0/1 labels of those same pairs. Transductive by design; the labels are read in the driver for this score
only (``pairs.gold_pair_labels``), never handed to a learner. Model selection stays on STS-B dev, a set apart from
the pairs and their labels, so the AUC never chooses a model; result files carry the AUC in ``extra.pair_auc``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from raydistill.runtime.config import (
    ConfigError,
    RoleResources,
    TrackingConfig,
    _build,
    _drop_paths,
    _flatten,
    _parse_override,
    _set_path,
    _suggest,
    _to_plain,
    _where,
    _yaml_key_lines,
    paths_at_default,
)

__all__ = [
    "FamilyConfig",
    "StageConfig",
    "PairsConfig",
    "TencEvalConfig",
    "TencResources",
    "TencConfig",
    "TENC_HASH_EXCLUDE",
    "STAGES",
    "stage_key",
    "run_trans_encoder",
    "read_label_set",
]

log = logging.getLogger(__name__)

STS7 = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr")
STAGES = ("bi2cross", "cross2bi")  # bi labels -> cross learns; cross labels -> bi learns
STAGE_TRAINS = {"bi2cross": "cross", "cross2bi": "bi"}  # which encoder a stage trains
STAGE_LABELS = {"bi2cross": "bi", "cross2bi": "cross"}  # which encoder labels a stage's pairs
STAGE_TRAINED_IN = {"cross": "bi2cross", "bi": "cross2bi"}
MODES = ("mutual", "self")
INITS = ("refresh", "sequential")
TEST_CYCLES = ("all", "best", "none")
_FAMILY_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]*")
_STAGE_KEY = re.compile(r"cycle=(\d+)/stage=(bi2cross|cross2bi)")
STATE_FILE = "state.json"


# ----------------------------------------------------------------------------------------------------------------
# Configuration


@dataclass
class FamilyConfig:
    """One model family: a bi-encoder and a cross-encoder built from the same pretrained encoder."""

    name: str  # used in column names (score_<name>), paths and run names
    bi: str  # preset name or local directory
    cross: str | None = None  # start checkpoint of the cross-encoder; None = the bi checkpoint (new head)
    pooling: str | None = None  # bi-encoder pooling; None = the checkpoint's own (mean for plain HF checkpoints)

    @property
    def cross_start(self) -> str:
        return self.cross or self.bi


@dataclass
class StageConfig:
    """Training of one encoder kind in every cycle (the bi- or the cross-encoder stage)."""

    batch_size: int = 32
    lr: float = 2e-5
    epochs: int = 1
    max_steps: int | None = None  # cap per stage (quick runs, tests)
    max_length: int = 64
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    eval_every: int = 200  # STS-B dev every N steps and at each epoch end; the best checkpoint is the stage's output
    amp: bool = True  # bf16 autocast on CUDA only (the authors train with AMP); ignored on CPU
    # Cross-encoder only (bi: leave null). "classifier": AutoModelForSequenceClassification's head on [CLS] (the
    # paper's); "segment_cosine": scale · cos of the two sentences' mean token states in the joint encoding
    # (models/cross_encoder.py). null = classifier.
    head: str | None = None


@dataclass
class PairsConfig:
    source: str = "transductive"  # "transductive" | "inductive" | "qqp" | "mrpc" | "file:<path.jsonl>" (pairs.py)
    max_pairs: int | None = None  # seeded subsample of the deduplicated pool
    seed: int | None = None  # None = the job's seed


@dataclass
class TencEvalConfig:
    dev_set: str = "stsb_dev"  # model selection inside every stage
    test_sets: list[str] = field(default_factory=lambda: list(STS7))
    # "all": 7-STS of every family, encoder and cycle (+ cycle 0); "best": cycle 0 and the best-dev model of each
    # family and encoder only; "none": no test evaluation (quick checks).
    test_cycles: str = "all"


@dataclass
class TencResources:
    """Per-role actor resources. Each family has one bi- and one cross-encoder actor; they never compute at the
    same time, so on a small machine both may reserve a fraction of a CPU while running one thread each."""

    num_cpus: float = 2  # only used when the job starts a local Ray
    # batch_size of each role = sentences (bi) / pairs (cross) per forward pass when labelling and evaluating
    bi: RoleResources = field(default_factory=lambda: RoleResources(num_cpus=0.25, threads=1, batch_size=128))
    cross: RoleResources = field(default_factory=lambda: RoleResources(num_cpus=0.25, threads=1, batch_size=64))
    # CPUs the actors must leave to Ray Data (the Parquet writes): with every CPU reserved its tasks never run
    # (measured hang, docs/runtime.md, Ray behaviour).
    data_max_cpus: float = 1.0


def _paper_bi_stage() -> StageConfig:
    # docs/methods.md, Trans-Encoder: batch 128, 10 epochs, lr 5e-5, no warm-up, max_seq_length 32.
    return StageConfig(batch_size=128, lr=5e-5, epochs=10, max_length=32, warmup_ratio=0.0)


def _paper_cross_stage() -> StageConfig:
    # docs/methods.md, Trans-Encoder: batch 32, 1 epoch, lr 2e-5, warm-up 10 %, max_length 64.
    return StageConfig(batch_size=32, lr=2e-5, epochs=1, max_length=64, warmup_ratio=0.1)


def _default_families() -> list[FamilyConfig]:
    return [FamilyConfig(name="minilm-l3", bi="minilm-l3"), FamilyConfig(name="bert-small", bi="bert-small")]


@dataclass
class TencConfig:
    """A Trans-Encoder job. Defaults are the paper's training settings; configs/*.yaml scale them to a machine."""

    mode: str = "mutual"  # "mutual" (average the families' labels) | "self" (each family its own labels)
    families: list[FamilyConfig] = field(default_factory=_default_families)
    cycles: int = 3
    init: str = "refresh"  # "refresh" | "sequential"
    # bi cosine -> cross-encoder BCE target (objectives.trans_encoder.cosine_to_target): "clip" (default; the
    # authors' raw cosine wherever it is >= 0, 0 below), "affine" ((c + 1) / 2) or "raw" (the authors' code).
    label_scaling: str = "clip"
    # mutual mode: how the families' labels are combined (objectives.trans_encoder): "mean" (the authors' plain
    # mean) or "dev" (weights softmax(dev / label_weight_temperature) from each labelling model's dev score).
    label_weighting: str = "mean"
    label_weight_temperature: float = 2.0  # in dev points: at 2, 4 points better on dev weighs e^2 (7.4x) more
    seed: int = 1000
    pairs: PairsConfig = field(default_factory=PairsConfig)
    bi: StageConfig = field(default_factory=_paper_bi_stage)
    cross: StageConfig = field(default_factory=_paper_cross_stage)
    eval: TencEvalConfig = field(default_factory=TencEvalConfig)
    run_dir: str | None = None  # default runs/<run_name>
    run_name: str | None = None  # default tenc-<mode>-<families>-<pairs>-<config hash> (see default_run_name)
    results_dir: str | None = None  # default results/mutual_tenc/<run_name>
    resources: TencResources = field(default_factory=TencResources)
    tracking: TrackingConfig = field(default_factory=lambda: TrackingConfig(experiment="raydistill-tenc"))
    # Tests only: stop cleanly once this stage ("cycle=1/stage=bi2cross") is complete, as a crash there would.
    stop_after_stage: str | None = None

    _source: str | None = field(default=None, repr=False, compare=False)
    _lines: dict[str, int] = field(default_factory=dict, repr=False, compare=False)

    # ------------------------------------------------------------------------------------------------------------
    # Construction (config.py's strict builder: unknown keys are errors naming file, line and the closest valid name)

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, source: str | None = None,
                  lines: dict[str, int] | None = None) -> "TencConfig":
        if not isinstance(d, dict):
            raise ConfigError(_where(source, lines or {}, "") + f"a config must be a mapping, got {type(d).__name__}")
        d = _expand_family_shorthand(d)
        cfg = _build(cls, d, "", source, lines or {})
        cfg._source, cfg._lines = source, dict(lines or {})
        return cfg

    @classmethod
    def from_yaml(cls, path: str | os.PathLike, overrides: list[str] | None = None) -> "TencConfig":
        import yaml

        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        text = path.read_text(encoding="utf-8")
        try:
            data = yaml.safe_load(text) or {}
            lines = _yaml_key_lines(text)
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            line = f":{mark.line + 1}" if mark is not None else ""
            raise ConfigError(f"{path}{line}: not valid YAML: {getattr(err, 'problem', err)}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}:1: a config file must be a mapping of fields, got {type(data).__name__}")
        for item in overrides or []:
            key, value = _parse_override(item)
            _set_path(data, key, value, item)
            lines[key] = 0
        return cls.from_dict(data, source=str(path), lines=lines)

    def with_overrides(self, overrides: list[str]) -> "TencConfig":
        data, lines = self.to_dict(), dict(self._lines)
        for item in overrides:
            key, value = _parse_override(item)
            _set_path(data, key, value, item)
            lines[key] = 0
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
        mine, theirs = _flatten(_hashed(self.to_dict())), _flatten(_hashed(other))
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

    # ------------------------------------------------------------------------------------------------------------
    # Validation (before Ray starts)

    def validate(self) -> "TencConfig":
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

        source = self.pairs.source
        if source.startswith("file:"):
            if not Path(source[len("file:"):]).expanduser().is_file():
                raise err("pairs.source", f"pair file not found: {source[len('file:'):]}")
        else:
            from raydistill.runtime.pairs import PAIR_SOURCES

            if source not in PAIR_SOURCES:
                raise err("pairs.source", f"{source!r}{_suggest(source, PAIR_SOURCES)} is not one of "
                                          f"{', '.join(PAIR_SOURCES)} or file:<path>")
        _positive(err, "pairs.max_pairs", self.pairs.max_pairs, allow_none=True)

        for kind in ("bi", "cross"):
            stage: StageConfig = getattr(self, kind)
            for name in ("batch_size", "epochs", "max_length", "eval_every", "lr"):
                _positive(err, f"{kind}.{name}", getattr(stage, name))
            _positive(err, f"{kind}.max_steps", stage.max_steps, allow_none=True)
            if not 0 <= stage.warmup_ratio < 1:
                raise err(f"{kind}.warmup_ratio", f"{stage.warmup_ratio} must be in [0, 1)")
            if stage.weight_decay < 0 or stage.grad_clip < 0:
                raise err(f"{kind}.weight_decay" if stage.weight_decay < 0 else f"{kind}.grad_clip", "must be >= 0")
            if stage.max_length < 8:
                raise err(f"{kind}.max_length", f"{stage.max_length} tokens cannot hold a sentence (pair)")
        from raydistill.models.cross_encoder import HEADS

        if self.bi.head is not None:
            raise err("bi.head", "the head is a cross-encoder setting (bi-encoders pool: families[i].pooling); "
                                 "remove it")
        if self.cross.head is not None and self.cross.head not in HEADS:
            raise err("cross.head", f"{self.cross.head!r}{_suggest(self.cross.head, HEADS)} is not one of "
                                    f"{', '.join(HEADS)}")

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
        if r.data_max_cpus < 0.5:
            raise err("resources.data_max_cpus", f"{r.data_max_cpus} is below 0.5: Ray Data needs CPU headroom or "
                                                 "its Parquet writes hang (ray-project/ray#44687)")
        if not self.tracking.experiment:
            raise err("tracking.experiment", "must be a non-empty name")
        if self.stop_after_stage is not None and not _STAGE_KEY.fullmatch(self.stop_after_stage):
            raise err("stop_after_stage", f"{self.stop_after_stage!r}: expected cycle=<k>/stage=<bi2cross|cross2bi>")
        return self

    def actor_reservation(self) -> tuple[float, float]:
        """(CPUs, GPUs) that the job's actors hold while it runs."""
        n = len(self.families)
        r = self.resources
        return n * (r.bi.num_cpus + r.cross.num_cpus), n * (r.bi.num_gpus + r.cross.num_gpus)

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
                             "label_weighting": ("mean",), "label_weight_temperature": (2.0,)}


def _hashed(plain: dict[str, Any]) -> dict[str, Any]:
    """A config dict as the hash sees it (also a stored one, for diff_keys)."""
    return _drop_paths(plain, TENC_HASH_EXCLUDE + paths_at_default(plain, TENC_HASHED_ONLY_WHEN_SET))


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


def stage_key(cycle: int, stage: str) -> str:
    return f"cycle={cycle}/stage={stage}"


# ----------------------------------------------------------------------------------------------------------------
# Run state (stage-boundary resume)


class RunState:
    """``<run_dir>/state.json``: what is done. Written atomically after every stage, label set and evaluation."""

    def __init__(self, path: Path, data: dict[str, Any]):
        self.path = path
        self.data = data

    @classmethod
    def open(cls, run_dir: Path, cfg: TencConfig, pair_fingerprint: str, pair_count: int) -> "RunState":
        path = run_dir / STATE_FILE
        if path.is_file():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}:{exc.lineno}: the run state is not valid JSON ({exc.msg}); delete the "
                                  "run directory or pass another --run-dir") from None
            if data.get("config_hash") != cfg.config_hash():
                differing = cfg.diff_keys(data.get("config", {}))
                raise ConfigError(
                    f"{path}: this run directory was written by another config (hash {data.get('config_hash')} vs "
                    f"{cfg.config_hash()}; differing: {', '.join(differing) or '?'}). Resuming would mix two "
                    "trainings: use another --run-dir, or delete this one to start over")
            if data.get("pairs", {}).get("fingerprint") != pair_fingerprint:
                raise ConfigError(f"{path}: the unlabeled pair set changed since this run started (fingerprint "
                                  f"{data.get('pairs', {}).get('fingerprint')} vs {pair_fingerprint}); the data "
                                  "files differ. Use another --run-dir")
            data["config"] = cfg.to_dict()  # the excluded fields (cycles, eval, resources) may have changed
            return cls(path, data)
        data = {
            "version": 1,
            "config_hash": cfg.config_hash(),
            "config": cfg.to_dict(),
            "pairs": {"fingerprint": pair_fingerprint, "count": pair_count},
            "labels": {},
            "stages": {},
            "evaluations": {},
            "created": _now(),
        }
        state = cls(path, data)
        state.save()
        return state

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(self.data, indent=2, default=_json_default) + "\n", encoding="utf-8")
        os.replace(tmp, self.path)

    @property
    def labels(self) -> dict[str, Any]:
        return self.data["labels"]

    @property
    def stages(self) -> dict[str, Any]:
        return self.data["stages"]

    @property
    def evaluations(self) -> dict[str, Any]:
        return self.data["evaluations"]


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def _json_default(value: Any):
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


# ----------------------------------------------------------------------------------------------------------------
# Label sets (Ray Datasets materialised as Parquet)


def write_label_set(directory: Path, pair_set, scores: dict[str, np.ndarray], averaged: np.ndarray) -> int:
    """Write one stage's label table as Parquet with Ray Data, atomically (temp directory, then rename).

    Columns: pair_id, sentence1, sentence2, score_<family> for each family, score (the average over families).
    """
    import pyarrow as pa
    import ray

    columns = pair_set.columns()
    table = pa.table({
        "pair_id": pa.array(columns["pair_id"], type=pa.int64()),
        "sentence1": pa.array(list(pair_set.sentence1), type=pa.string()),
        "sentence2": pa.array(list(pair_set.sentence2), type=pa.string()),
        **{f"score_{name}": pa.array(np.asarray(values, dtype=np.float32)) for name, values in scores.items()},
        "score": pa.array(np.asarray(averaged, dtype=np.float32)),
    })
    tmp = directory.with_name(f"{directory.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    ray.data.from_arrow(table).write_parquet(str(tmp))
    if directory.exists():
        shutil.rmtree(directory)
    os.replace(tmp, directory)
    return table.num_rows


def read_label_set(directory: str | os.PathLike) -> "Any":
    """A stage's label table as a pandas DataFrame sorted by pair_id.

    Read with pyarrow, not Ray Data: the driver needs the whole (small) table at once, and a Ray Data read here
    would only add task scheduling (≈10 s measured) to every stage. ``ray.data.read_parquet(<run_dir>/labels)``
    reads every stage at once, with ``cycle`` and ``stage`` as Hive partition columns.
    """
    import pyarrow.parquet as pq

    table = pq.read_table(str(directory), partitioning=None)
    frame = table.to_pandas()
    frame = frame[[c for c in frame.columns if c in ("pair_id", "sentence1", "sentence2", "score")
                   or c.startswith("score_")]]
    return frame.sort_values("pair_id", kind="stable").reset_index(drop=True)


# ----------------------------------------------------------------------------------------------------------------
# Orchestration


class _Families:
    """The actors of every family and which model each one holds (so a labeller is reloaded only when needed)."""

    def __init__(self, cfg: TencConfig, pair_set_ref, poolings: dict[str, str | None]):
        import ray

        from raydistill.runtime.tenc_learners import BiEncoderLearner, CrossEncoderLearner

        self.cfg = cfg
        self.actors: dict[tuple[str, str], Any] = {}
        self.holding: dict[tuple[str, str], str | None] = {}
        learner_classes = {"bi": BiEncoderLearner, "cross": CrossEncoderLearner}
        for family in cfg.families:
            for kind in ("bi", "cross"):
                resources: RoleResources = getattr(cfg.resources, kind)
                device = "cuda" if resources.num_gpus > 0 else "cpu"
                actor_class = ray.remote(learner_classes[kind])
                self.actors[(family.name, kind)] = actor_class.options(
                    num_cpus=resources.num_cpus, num_gpus=resources.num_gpus,
                    name=None, max_restarts=0,
                ).remote(
                    family.name, pair_set_ref, dataclasses.asdict(getattr(cfg, kind)),
                    pooling=poolings.get(family.name), label_scaling=cfg.label_scaling, seed=cfg.seed,
                    threads=resources.threads, device=device, inference_batch_size=resources.batch_size,
                    dev_set=cfg.eval.dev_set,
                )
                self.holding[(family.name, kind)] = None

    def actor(self, family: str, kind: str):
        return self.actors[(family, kind)]

    def load(self, family: str, kind: str, checkpoint: str, cycle: int):
        """A ref to (re)load ``checkpoint`` into the actor, seeded for ``cycle``."""
        self.holding[(family, kind)] = str(checkpoint)
        return self.actor(family, kind).load.remote(str(checkpoint), cycle=cycle)

    def ensure_loaded(self, family: str, kind: str, checkpoint: str, cycle: int):
        """A ref to load ``checkpoint`` unless the actor already holds it (None then); for labelling/evaluation."""
        if self.holding[(family, kind)] == str(checkpoint):
            return None
        return self.load(family, kind, checkpoint, cycle)

    def kill(self) -> None:
        import ray

        for actor in self.actors.values():
            ray.kill(actor)


class TransEncoderJob:
    """Runs (or resumes) one Trans-Encoder job; ``run()`` returns the summary that is also written to the run dir."""

    def __init__(self, cfg: TencConfig):
        self.cfg = cfg.validate()
        self.run_dir = cfg.resolved_run_dir()
        self.results_dir = cfg.resolved_results_dir()
        self.run_name = cfg.resolved_run_name()
        self.families = [f.name for f in cfg.families]
        self.family_cfg = {f.name: f for f in cfg.families}
        self.started = time.perf_counter()
        self.tracker = None
        self.children: dict[tuple[str, str], Any] = {}
        self.step_offsets: dict[tuple[str, str], int] = {}
        self.gold_labels: np.ndarray | None = None  # qqp / mrpc: each pair's 0/1 label, for the AUC only
        self.dev_points_logged: set[tuple[str, str, int]] = set()  # (family, kind, cycle) on the parent run

    # ------------------------------------------------------------------------------------------------------------
    # Paths

    def model_dir(self, cycle: int, kind: str, family: str) -> Path:
        return self.run_dir / "models" / f"cycle={cycle}" / kind / family

    def labels_dir(self, cycle: int, stage: str) -> Path:
        return self.run_dir / "labels" / f"cycle={cycle}" / f"stage={stage}"

    def eval_file(self, cycle: int, kind: str, family: str) -> Path:
        return self.run_dir / "eval" / f"cycle={cycle}" / kind / f"{family}.npz"

    def pair_scores_file(self, cycle: int, kind: str, family: str) -> Path:
        return self.run_dir / "eval" / f"cycle={cycle}" / kind / f"{family}-pairs.npy"

    def start_checkpoint(self, kind: str, family: str) -> str:
        from raydistill.models import resolve_model

        f = self.family_cfg[family]
        return str(resolve_model(f.bi if kind == "bi" else f.cross_start))

    def trained_model(self, cycle: int, kind: str, family: str) -> str:
        """The best model of ``kind`` after ``cycle`` (cycle 0 = the start checkpoint)."""
        if cycle == 0:
            return self.start_checkpoint(kind, family)
        return str(self.model_dir(cycle, kind, family))

    def init_checkpoint(self, cycle: int, stage: str, family: str) -> str:
        """Where the model trained in ``stage`` of ``cycle`` starts from (refresh vs sequential)."""
        kind = STAGE_TRAINS[stage]
        if self.cfg.init == "refresh":
            return self.start_checkpoint(kind, family)
        if stage == "bi2cross":  # cross_k from the bi-encoder that labelled its pairs (bi_{k-1}, or the start)
            return self.trained_model(cycle - 1, "bi", family)
        return self.trained_model(cycle, "cross", family)  # bi_k from cross_k's encoder weights

    # ------------------------------------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """The job, holding the run dir's lock: a second job on the same run dir is refused before it reads the
        run state or starts Ray (two jobs would interleave stages and overwrite each other's labels and models)."""
        from raydistill.runtime.checkpoint import RunDirLock
        from raydistill.runtime.pairs import PAIR_CLASSIFICATION_SOURCES, build_pair_set, gold_pair_labels

        cfg = self.cfg
        self.pair_set = build_pair_set(cfg.pairs.source, cfg.pairs.max_pairs, cfg.pairs_seed())
        if self.pair_set.source in PAIR_CLASSIFICATION_SOURCES:
            # Kept in the driver for the AUC; the actors get the label-free pair set only.
            self.gold_labels = gold_pair_labels(self.pair_set)
            if len(np.unique(self.gold_labels)) < 2:  # found now, before anything is written
                raise ConfigError(f"pairs: the {len(self.pair_set)} {self.pair_set.source} pairs sampled hold one "
                                  "class only, and the ROC AUC needs both; raise pairs.max_pairs or change pairs.seed")
        lock = RunDirLock(self.run_dir).acquire(report=self._say)
        try:
            return self._run_locked()
        finally:
            lock.release()

    def _run_locked(self) -> dict[str, Any]:
        import ray

        from raydistill.runtime.cluster import warn_if_outputs_are_ephemeral
        from raydistill.runtime.tracking import Tracker

        cfg, pair_set = self.cfg, self.pair_set
        self.state = RunState.open(self.run_dir, cfg, pair_set.fingerprint, len(pair_set))
        self._say(f"Trans-Encoder {cfg.mode} distillation: families {', '.join(self.families)}; {len(pair_set):,} "
                  f"{cfg.pairs.source} pairs (pool {pair_set.pool_size:,}); {cfg.cycles} cycle(s), init {cfg.init}; "
                  f"run dir {self.run_dir}")
        done = list(self.state.stages)
        if done:
            self._say(f"resuming: {len(done)} completed stage(s) will be skipped ({', '.join(done)})")

        restore_data_context = start_ray(cfg)
        status, families = "FAILED", None
        try:
            poolings = self._poolings()
            self.tracker = Tracker(cfg.tracking, run_name=self.run_name,
                                   tags={"method": cfg.method, "run_dir": str(self.run_dir),
                                         "resumed": str(bool(done)).lower()})
            self.tracker.log_params(self._params(pair_set))
            warn_if_outputs_are_ephemeral({"run dir": self.run_dir, "results dir": cfg.resolved_results_dir(),
                                           "MLflow store": self.tracker.tracking_uri or ""})
            families = _Families(cfg, ray.put(pair_set), poolings)
            self._cycle_zero(families)
            stopped = None
            for cycle in range(1, cfg.cycles + 1):
                for stage in STAGES:
                    self._run_stage(families, cycle, stage)
                    if cfg.eval.test_cycles == "all":  # (skips models a previous run already evaluated)
                        self._evaluate(families, STAGE_TRAINS[stage], {f: cycle for f in self.families},
                                       name=f"cycle{cycle}")
                    if cfg.stop_after_stage == stage_key(cycle, stage):
                        stopped = stage_key(cycle, stage)
                        break
                if stopped:
                    break
            if stopped:
                self._say(f"stopping after {stopped} as configured (stop_after_stage)")
                summary = {"stopped_after": stopped, "run_dir": str(self.run_dir), "state": self.state.data}
            else:
                summary = self._finish(families)
            status = "FINISHED"
            return summary
        finally:
            if families is not None:
                families.kill()
            for child in self.children.values():
                child.end(status)
            if self.tracker is not None:
                self.tracker.end(status)
            restore_data_context()

    # ------------------------------------------------------------------------------------------------------------
    # Cycle 0: the starting bi-encoders label the first pair set and are evaluated as they are

    def _cycle_zero(self, families: _Families) -> None:
        key = stage_key(1, "bi2cross")
        if key not in self.state.labels and key not in self.state.stages:
            self._label(families, 1, "bi2cross")
        starts = {f: 0 for f in self.families}
        if self.cfg.eval.test_cycles != "none":
            self._evaluate(families, "bi", starts, name="cycle0")
        else:
            self._evaluate_pair_auc(families, "bi", starts, name="cycle0")
        self._measure_start_dev(families)
        self._log_dev_curves()

    def _measure_start_dev(self, families: _Families) -> None:
        """The dev score of each starting bi-encoder: the cycle-0 candidate of model selection. Taken from its
        cycle-0 evaluation when there is one, else measured by its actor (as every stage measures its models)."""
        import ray

        start_dev = self.state.data.setdefault("start_dev", {})
        dev_set = self.cfg.eval.dev_set
        for f in self.families:
            scores = self.state.evaluations.get(f"cycle=0/bi/{f}", {}).get("scores", {})
            if f not in start_dev and dev_set in scores:
                start_dev[f] = scores[dev_set]
        todo = [f for f in self.families if f not in start_dev]
        if todo:
            refs = [families.ensure_loaded(f, "bi", self.trained_model(0, "bi", f), 0) for f in todo]
            ray.get([r for r in refs if r is not None])
            for f, score in zip(todo, ray.get([families.actor(f, "bi").dev_score.remote() for f in todo])):
                start_dev[f] = float(score)
        self.state.save()
        self._say("starting bi-encoders on " + dev_set + ": "
                  + ", ".join(f"{f} {start_dev[f]:.2f}" for f in self.families) + " (the cycle-0 candidates of "
                  "model selection)")

    # ------------------------------------------------------------------------------------------------------------

    def _run_stage(self, families: _Families, cycle: int, stage: str) -> None:
        import ray

        key = stage_key(cycle, stage)
        kind = STAGE_TRAINS[stage]
        if key in self.state.stages:
            self._say(f"[{key}] already complete; reusing its models and labels")
            return
        stage_started = time.perf_counter()
        if key not in self.state.labels:  # a resumed or extended run: the labelling models make them now
            self._label(families, cycle, stage)
        labels = self._read_labels(cycle, stage)
        self._say(f"[{key}] {', '.join(self.families)} {kind}-encoders learn the "
                  f"{'averaged' if self.cfg.mode == 'mutual' else 'own'} {STAGE_LABELS[stage]}-encoder labels")

        # This stage's models label the next stage: labels left by an interrupted earlier attempt are stale.
        next_cycle, next_stage = (cycle, "cross2bi") if stage == "bi2cross" else (cycle + 1, "bi2cross")
        if self.state.labels.pop(stage_key(next_cycle, next_stage), None) is not None:
            self.state.save()
        # Always a fresh load, even of the checkpoint the actor holds: the stage's seed draws the new head.
        inits = dict(zip(self.families, ray.get([
            families.load(f, kind, self.init_checkpoint(cycle, stage, f), cycle) for f in self.families])))
        fit_refs, target_columns = [], {}
        for f in self.families:
            target_columns[f] = "score" if self.cfg.mode == "mutual" else f"score_{f}"
            target = labels[target_columns[f]]
            out_dir = self.model_dir(cycle, kind, f)
            fit_refs.append(families.actor(f, kind).fit.remote(
                np.ascontiguousarray(target, dtype=np.float32), cycle=cycle, stage=stage, out_dir=str(out_dir)))
            families.holding[(f, kind)] = str(out_dir)  # fit leaves the best model in memory
        # The next stage's labels come from the models just trained: queue them on the same actors, so each family
        # labels as soon as its own training ends; the exchange (average, Parquet) waits for all of them.
        label_next = next_cycle <= self.cfg.cycles
        label_refs = [families.actor(f, kind).predict_pairs.remote() for f in self.families] if label_next else []
        summaries = dict(zip(self.families, ray.get(fit_refs)))
        for f in self.families:
            summaries[f]["init"] = inits[f]
            summaries[f]["target_column"] = target_columns[f]
        if label_refs:
            weights = (self._label_weights(next_cycle, next_stage, {f: float(summaries[f]["best_dev"])
                                                                     for f in self.families})
                       if self._weights_by_dev() else None)
            self._record_labels(next_cycle, next_stage, dict(zip(self.families, ray.get(label_refs))), weights)

        wall_s = time.perf_counter() - stage_started
        self.state.stages[key] = {
            "completed": _now(),
            "wall_s": wall_s,
            "families": {f: {k: v for k, v in s.items() if k != "history"} for f, s in summaries.items()},
        }
        self.state.save()
        self._track_stage(cycle, stage, summaries)
        self._log_dev_curves()
        self._say(f"[{key}] complete in {wall_s:.0f} s: "
                  + ", ".join(f"{f} {kind} dev {s['best_dev']:.2f} ({s['steps']} steps, {s['wall_s']:.0f} s)"
                              for f, s in summaries.items()))

    def _label(self, families: _Families, cycle: int, stage: str) -> None:
        """Every family's labelling model of ``stage`` labels the pairs; the table goes to Parquet."""
        import ray

        kind = STAGE_LABELS[stage]
        labeller_cycle = cycle - 1 if stage == "bi2cross" else cycle
        refs = [families.ensure_loaded(f, kind, self.trained_model(labeller_cycle, kind, f), labeller_cycle)
                for f in self.families]
        ray.get([r for r in refs if r is not None])
        self._say(f"[{stage_key(cycle, stage)}] labelling the pairs with the {kind}-encoders of cycle "
                  f"{labeller_cycle}")
        labels = ray.get([families.actor(f, kind).predict_pairs.remote() for f in self.families])
        weights = (self._label_weights(cycle, stage, self._labeller_dev(families, labeller_cycle, kind))
                   if self._weights_by_dev() else None)
        self._record_labels(cycle, stage, dict(zip(self.families, labels)), weights)

    def _weights_by_dev(self) -> bool:
        return self.cfg.mode == "mutual" and self.cfg.label_weighting == "dev"

    def _label_weights(self, cycle: int, stage: str, dev: dict[str, float]) -> dict[str, float]:
        """Each family's weight in the stage's mean label, from its labelling model's dev score (dev_weights)."""
        from raydistill.objectives.trans_encoder import dev_weights

        weights = dict(zip(self.families, dev_weights([dev[f] for f in self.families],
                                                      self.cfg.label_weight_temperature).tolist()))
        self._say(f"[{stage_key(cycle, stage)}] label weights from {self.cfg.eval.dev_set}: " + ", ".join(
            f"{f} {weights[f]:.3f} (dev {dev[f]:.2f})" for f in self.families))
        return weights

    def _labeller_dev(self, families: _Families, labeller_cycle: int, kind: str) -> dict[str, float]:
        """Each family's dev score of its ``kind`` model of ``labeller_cycle``: the starting bi-encoder's at cycle 0,
        else the best dev of the stage that trained it (the model the stage handed on)."""
        if labeller_cycle == 0:
            self._measure_start_dev(families)
            return {f: float(self.state.data["start_dev"][f]) for f in self.families}
        trained_in = self.state.stages[stage_key(labeller_cycle, STAGE_TRAINED_IN[kind])]
        return {f: float(trained_in["families"][f]["best_dev"]) for f in self.families}

    def _read_labels(self, cycle: int, stage: str) -> dict[str, np.ndarray]:
        """The score columns of the stage's Parquet, checked row by row against the job's pair set."""
        directory = self.labels_dir(cycle, stage)
        frame = read_label_set(directory)
        if len(frame) != len(self.pair_set) or not np.array_equal(frame["pair_id"].to_numpy(),
                                                                  self.pair_set.pair_id):
            raise RuntimeError(f"{directory}: the label set's pair_ids do not match the job's pair set "
                               f"({len(frame)} rows vs {len(self.pair_set)} pairs)")
        missing = [f"score_{f}" for f in self.families if f"score_{f}" not in frame.columns]
        if missing:
            raise RuntimeError(f"{directory}: columns {', '.join(missing)} are missing")
        return {column: frame[column].to_numpy(dtype=np.float32) for column in frame.columns
                if column.startswith("score")}

    def _record_labels(self, cycle: int, stage: str, per_family: dict[str, np.ndarray],
                       weights: dict[str, float] | None = None) -> None:
        """The label table of a stage: each family's labels and their mean (weighted by ``weights`` when given),
        which mutual mode trains every family on."""
        from raydistill.objectives.trans_encoder import average_pseudo_labels

        averaged = np.asarray(average_pseudo_labels([per_family[f] for f in self.families],
                                                    None if weights is None else [weights[f] for f in self.families]),
                              dtype=np.float32)
        directory = self.labels_dir(cycle, stage)
        started = time.perf_counter()
        rows = write_label_set(directory, self.pair_set, per_family, averaged)
        key = stage_key(cycle, stage)
        stats = _label_stats(per_family, averaged)
        self.state.labels[key] = {"path": str(directory), "rows": rows, "written": _now(), **stats,
                                  **({"weights": weights} if weights is not None else {})}
        self.state.save()
        self._say(f"[{key}] wrote {rows:,} labels to {directory} in {time.perf_counter() - started:.1f} s "
                  f"(mean {stats['mean']:.3f}, std {stats['std']:.3f}"
                  + (f", family agreement (Spearman) {stats['agreement']:.3f})" if "agreement" in stats else ")"))
        if self.tracker is not None:
            self.tracker.log_metrics({f"labels/{stage}/{k}": v for k, v in stats.items()}, step=cycle)

    # ------------------------------------------------------------------------------------------------------------
    # Evaluation and results

    def _evaluate(self, families: _Families, kind: str, cycles: dict[str, int], name: str) -> None:
        """Test predictions of each family's ``kind`` model of ``cycles[family]`` (families in parallel): result
        files per model, and one for the ensemble (mean of the families' predictions) named ``name``."""
        import ray

        self._evaluate_pair_auc(families, kind, cycles, name)  # before the result files, which carry it
        sets = list(dict.fromkeys(list(self.cfg.eval.test_sets) + [self.cfg.eval.dev_set]))
        todo = [f for f, c in cycles.items() if f"cycle={c}/{kind}/{f}" not in self.state.evaluations]
        if todo:
            refs = [families.ensure_loaded(f, kind, self.trained_model(cycles[f], kind, f), cycles[f]) for f in todo]
            ray.get([r for r in refs if r is not None])
            self._say(f"evaluating the {kind}-encoders " + ", ".join(f"{f} (cycle {cycles[f]})" for f in todo)
                      + f" on {', '.join(sets)}")
            started = time.perf_counter()
            results = ray.get([families.actor(f, kind).test_predictions.remote(sets) for f in todo])
            params = ray.get([families.actor(f, kind).params_m.remote() for f in todo])
            for f, predictions, params_m in zip(todo, results, params):
                cycle = cycles[f]
                path = self.eval_file(cycle, kind, f)
                path.parent.mkdir(parents=True, exist_ok=True)
                np.savez(path, **predictions)
                scores = scores_from_predictions(predictions)
                self.state.evaluations[f"cycle={cycle}/{kind}/{f}"] = {
                    "scores": scores, "predictions": str(path), "params_m": params_m,
                    "wall_s": time.perf_counter() - started}
                self.state.save()
                self._write_result(f, kind, cycle, scores, params_m)
                self._say(f"[cycle {cycle}] {f}/{kind}: 7-STS avg {scores.get('avg', float('nan')):.2f}, "
                          f"{self.cfg.eval.dev_set} {scores.get(self.cfg.eval.dev_set, float('nan')):.2f} "
                          f"(evaluated in {time.perf_counter() - started:.0f} s)")
        recorded = self.state.evaluations.get(f"{name}/{kind}/ensemble", {})
        if len(cycles) > 1 and recorded.get("members") != dict(cycles):
            self._write_ensemble(kind, cycles, name)

    def _evaluate_pair_auc(self, families: _Families, kind: str, cycles: dict[str, int], name: str) -> None:
        """qqp / mrpc sources: ROC AUC x 100 of each family's ``kind`` model of ``cycles[family]`` (and of their
        ensemble, the mean of their scores) on the job's own pairs against the gold labels. A model's pair scores
        are the labels it handed on when it made some (read from the Parquet), else its actor scores the pairs."""
        import ray

        from raydistill.evaluation import roc_auc
        from raydistill.objectives.trans_encoder import average_pseudo_labels

        if self.gold_labels is None:
            return
        records = self.state.data.setdefault("pair_auc", {})
        todo = [f for f, c in cycles.items() if f"cycle={c}/{kind}/{f}" not in records]
        scores = {f: self._handed_on_scores(kind, cycles[f], f) for f in todo}
        ask = [f for f in todo if scores[f] is None]
        if ask:
            refs = [families.ensure_loaded(f, kind, self.trained_model(cycles[f], kind, f), cycles[f]) for f in ask]
            ray.get([r for r in refs if r is not None])
            scores.update(zip(ask, ray.get([families.actor(f, kind).predict_pairs.remote() for f in ask])))
        for f in todo:
            cycle = cycles[f]
            path = self.pair_scores_file(cycle, kind, f)
            path.parent.mkdir(parents=True, exist_ok=True)
            np.save(path, np.asarray(scores[f], dtype=np.float32))
            auc = roc_auc(scores[f], self.gold_labels) * 100.0
            records[f"cycle={cycle}/{kind}/{f}"] = {"auc": auc, "pair_scores": str(path)}
            self.state.save()
            self._say(f"[cycle {cycle}] {f}/{kind}: {self.cfg.pairs.source} ROC AUC {auc:.2f} on the "
                      f"{len(self.pair_set):,} pairs it learned from (transductive)")
            if self.tracker is not None:
                self.tracker.log_metrics({f"pair_auc/{f}/{kind}": auc}, step=cycle)
        ensemble_key = f"{name}/{kind}/ensemble"
        if len(cycles) > 1 and records.get(ensemble_key, {}).get("members") != dict(cycles):
            mean = average_pseudo_labels([np.load(records[f"cycle={c}/{kind}/{f}"]["pair_scores"])
                                          for f, c in cycles.items()])
            records[ensemble_key] = {"auc": roc_auc(mean, self.gold_labels) * 100.0, "members": dict(cycles)}
            self.state.save()

    def _handed_on_scores(self, kind: str, cycle: int, family: str) -> np.ndarray | None:
        """The labels that ``family``'s ``kind`` model of ``cycle`` gave the pairs, if it labelled a stage: the
        bi-encoder of cycle k labels cycle k+1's bi2cross stage, the cross-encoder of cycle k cycle k's cross2bi."""
        labelled_cycle, stage = (cycle + 1, "bi2cross") if kind == "bi" else (cycle, "cross2bi")
        if stage_key(labelled_cycle, stage) not in self.state.labels:
            return None
        return self._read_labels(labelled_cycle, stage)[f"score_{family}"]

    def _pair_auc_extra(self, key: str) -> dict[str, Any] | None:
        """``extra.pair_auc`` of a result file: the AUC recorded under ``key`` and what it was measured on."""
        from raydistill.runtime.pairs import pair_sets_of

        record = self.state.data.get("pair_auc", {}).get(key)
        if record is None:
            return None
        return {"auc": round(float(record["auc"]), 2), "source": self.cfg.pairs.source,
                "sets": list(pair_sets_of(self.cfg.pairs.source)), "pairs": len(self.pair_set),
                "transductive": True, "labels_used_for_training": False,
                "metric": "ROC AUC x 100 of the pair scores (bi: cosine; cross: mean sigmoid over both orders) "
                          "against the gold 0/1 labels of the pairs the job learned from"}

    def _write_ensemble(self, kind: str, cycles: dict[str, int], name: str) -> None:
        from raydistill.objectives.trans_encoder import average_pseudo_labels

        keys = [f"cycle={c}/{kind}/{f}" for f, c in cycles.items()]
        per_family = []
        for key in keys:
            with np.load(self.state.evaluations[key]["predictions"]) as archive:
                per_family.append({set_name: archive[set_name] for set_name in archive.files})
        averaged = {set_name: np.asarray(average_pseudo_labels([p[set_name] for p in per_family]))
                    for set_name in per_family[0]}
        scores = scores_from_predictions(averaged)
        params_m = sum(self.state.evaluations[k]["params_m"] for k in keys)
        self.state.evaluations[f"{name}/{kind}/ensemble"] = {"scores": scores, "params_m": params_m,
                                                             "members": dict(cycles)}
        self.state.save()
        self._write_result("ensemble", kind, cycles, scores, params_m, name=name)
        self._say(f"[{name}] ensemble of the {kind}-encoders: 7-STS avg {scores.get('avg', float('nan')):.2f}")

    def _write_result(self, family: str, kind: str, cycle, scores: dict[str, float], params_m: float,
                      name: str | None = None) -> None:
        """One result-schema file. ``cycle`` is an int, or {family: cycle} for an ensemble."""
        from raydistill.evaluation import write_result

        cfg = self.cfg
        training = {
            "transductive": self.pair_set.transductive,
            "pairs_source": cfg.pairs.source,
            "pairs": len(self.pair_set),
            "mode": cfg.mode,
            "init": cfg.init,
            "label_scaling": cfg.label_scaling,
            "label_weighting": cfg.label_weighting,
            "cycles": cfg.cycles,
            "families": {f.name: {"bi": f.bi, "cross": f.cross_start} for f in cfg.families},
            "bi": dataclasses.asdict(cfg.bi),
            "cross": dataclasses.asdict(cfg.cross),
            "run_dir": str(self.run_dir),
        }
        extra: dict[str, Any] = {"run_name": self.run_name}
        if family == "ensemble":
            members: dict[str, int] = cycle
            model = "ensemble(" + "+".join(self._model_name(f, kind) for f in members) + ")"
            model_dir = None
            extra.update(family="ensemble", members={f: {"cycle": c, "model_dir": self.trained_model(c, kind, f)}
                                                     for f, c in members.items()})
            pair_auc = self._pair_auc_extra(f"{name}/{kind}/ensemble")
            training["cycle"] = next(iter(members.values())) if len(set(members.values())) == 1 else None
            file_name = f"ensemble-{kind}-{name}.json"
        else:
            model = self._model_name(family, kind)
            model_dir = self.trained_model(cycle, kind, family)
            extra.update(family=family, cycle=cycle)
            pair_auc = self._pair_auc_extra(f"cycle={cycle}/{kind}/{family}")
            training["cycle"] = cycle
            stage = "bi2cross" if kind == "cross" else "cross2bi"
            stage_info = self.state.stages.get(stage_key(cycle, stage), {}).get("families", {}).get(family, {})
            if stage_info:
                training.update(steps=stage_info.get("steps"), best_step=stage_info.get("best_step"),
                                stage_best_dev=round(float(stage_info.get("best_dev")), 2),
                                stage_wall_s=round(float(stage_info.get("wall_s", 0)), 1))
            file_name = f"{family}-{kind}-cycle{cycle}.json"
        if pair_auc is not None:
            extra["pair_auc"] = pair_auc
        fields = dict(
            kind="mutual_tenc", method=cfg.method, model=model, encoder=kind, teacher=None,
            params_m=round(float(params_m), 3), scores={k: round(float(v), 2) for k, v in scores.items()},
            extra=extra, training=training, wall_s=round(time.perf_counter() - self.started, 1),
        )
        if self.tracker is not None and self.tracker.run_id:
            fields["mlflow_run_id"] = self.tracker.run_id
        if model_dir:
            fields["model_dir"] = model_dir
        write_result(self.results_dir / file_name, **fields)
        step = cycle if isinstance(cycle, int) else max(cycle.values())
        self._track_eval(family, kind, step, scores, name)

    def _model_name(self, family: str, kind: str) -> str:
        f = self.family_cfg[family]
        return f.bi if kind == "bi" else f.cross_start

    # ------------------------------------------------------------------------------------------------------------

    def _finish(self, families: _Families) -> dict[str, Any]:
        """Best bi- and cross-encoder of each family by the dev set, their evaluation, the summary and the verdict.

        Candidates of the bi-encoder: cycles 0..N, cycle 0 being the starting checkpoint (its dev score measured at
        cycle 0), so a run whose training never beats its start keeps the start: ``best/<family>/bi`` is then the
        start checkpoint, saved as the job used it (max length, pooling), and the verdict says training did not
        improve on it. Candidates of the cross-encoder: cycles 1..N. Before cycle 1 there is no cross-encoder, only
        the checkpoint with a new, untrained head, whose score would mean nothing; the best cross-encoder's "start"
        is the starting bi-encoder, and the verdict compares it with that. Ties go to the earlier cycle.
        """
        import ray

        best: dict[str, dict[str, Any]] = {f: {} for f in self.families}
        for kind in ("bi", "cross"):
            stage = STAGE_TRAINED_IN[kind]
            for f in self.families:
                candidates = [(self.state.stages[stage_key(c, stage)]["families"][f]["best_dev"], c)
                              for c in range(1, self.cfg.cycles + 1)]
                if kind == "bi":
                    candidates.insert(0, (self.state.data["start_dev"][f], 0))
                dev, cycle = max(candidates, key=lambda item: (item[0], -item[1]))  # ties: the earlier cycle
                if cycle == 0 and not self.model_dir(0, kind, f).is_dir():
                    ref = families.ensure_loaded(f, kind, self.trained_model(0, kind, f), 0)
                    ray.get([r for r in [ref] if r is not None])
                    ray.get(families.actor(f, kind).save.remote(str(self.model_dir(0, kind, f))))
                target = self.run_dir / "best" / f / kind
                tmp = target.with_name(f"{kind}.tmp-{os.getpid()}")
                shutil.rmtree(tmp, ignore_errors=True)
                shutil.copytree(self.model_dir(cycle, kind, f), tmp)
                shutil.rmtree(target, ignore_errors=True)
                os.replace(tmp, target)
                best[f][kind] = {"cycle": cycle, "best_dev": dev, "model_dir": str(target)}
            chosen = {f: best[f][kind]["cycle"] for f in self.families}
            if self.cfg.eval.test_cycles != "none":
                # Already evaluated with test_cycles "all" (and cycle 0 always); then only the ensemble is new.
                self._evaluate(families, kind, chosen, name="best")
                for f in self.families:
                    best[f][kind]["scores"] = self.state.evaluations[f"cycle={chosen[f]}/{kind}/{f}"]["scores"]
            else:
                self._evaluate_pair_auc(families, kind, chosen, name="best")
        by_family = self._outcome(best)
        dev_set = self.cfg.eval.dev_set
        summary = {
            "run_name": self.run_name, "run_dir": str(self.run_dir), "results_dir": str(self.results_dir),
            "mode": self.cfg.mode, "families": self.families, "pairs": len(self.pair_set),
            "pairs_source": self.cfg.pairs.source,
            "transductive": self.pair_set.transductive, "cycles": self.cfg.cycles, "init": self.cfg.init,
            "best": best,
            "by_family": by_family,
            "score_unit": "7-STS average: Spearman x 100 of the model's similarity against gold on STS12-16, STS-B "
                          f"test and SICK-R test, averaged; *_{dev_set}: Spearman x 100 on {dev_set}",
            "selection": {"dev_set": dev_set,
                          "bi_candidates": f"cycles 0..{self.cfg.cycles} (0 = the starting checkpoint)",
                          "cross_candidates": f"cycles 1..{self.cfg.cycles} (no cross-encoder exists before cycle "
                                              "1; the best one is compared with the starting bi-encoder)",
                          "ties": "the earlier cycle"},
            "pair_classification": self._pair_classification_note(),
            "stage_wall_s": {k: round(v["wall_s"], 1) for k, v in self.state.stages.items()},
            "wall_s": round(time.perf_counter() - self.started, 1),
            "mlflow_run_id": self.tracker.run_id if self.tracker else None,
        }
        summary_path = self.run_dir / "summary.json"
        summary_path.write_text(json.dumps(summary, indent=2, default=_json_default) + "\n", encoding="utf-8")
        self.results_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(summary_path, self.results_dir / "summary.json")
        self.tracker.log_artifact(summary_path)
        self.tracker.log_artifact(self.state.path)
        for f in self.families:
            for kind in ("bi", "cross"):
                self.tracker.log_metrics({f"best/{f}/{kind}/stsb_dev": best[f][kind]["best_dev"],
                                          f"best/{f}/{kind}/cycle": best[f][kind]["cycle"]})
            self.tracker.log_metrics({f"improved/{f}": int(by_family[f]["improved"])})
        self._log_dev_curves()
        try:
            from raydistill.runtime.plots import plot_dev_by_cycle

            png = plot_dev_by_cycle(self._dev_curves(), self.run_dir / "plots" / "dev_by_cycle.png", dev_set,
                                    title=f"{self.cfg.mode}: best {dev_set} of each stage, per cycle")
            self.tracker.log_artifact(png, "plots")
        except Exception as exc:  # noqa: BLE001 - a plot must never stop a run
            log.warning("dev-by-cycle plot failed: %s", exc)
        self._say("best models (by STS-B dev): " + "; ".join(
            f"{f}/{kind} cycle {b['cycle']} dev {b['best_dev']:.2f}"
            + (f" 7-STS {b['scores']['avg']:.2f}" if "avg" in b.get("scores", {}) else "")
            for f, kinds in best.items() for kind, b in kinds.items()))
        self._say(f"done in {summary['wall_s']:.0f} s; results in {self.results_dir}")
        for line in self._verdict_lines(by_family):
            self._say(line)
        return summary

    def _outcome(self, best: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """Per family: the start's and the best models' 7-STS averages (null, with the reason, without test
        evaluation), their cycles and dev scores, whether training improved on the start and, with qqp / mrpc pairs,
        the AUCs. Scores rounded to 2 decimals, as in the result files, and compared as rounded."""
        dev_set = self.cfg.eval.dev_set
        tested = self.cfg.eval.test_cycles != "none"
        start_dev = self.state.data["start_dev"]
        auc = self.state.data.get("pair_auc", {})
        outcome: dict[str, dict[str, Any]] = {}

        def avg(scores: dict[str, float]) -> float | None:
            return round(float(scores["avg"]), 2) if tested and "avg" in scores else None

        for f in self.families:
            bi, cross = best[f]["bi"], best[f]["cross"]
            start_scores = self.state.evaluations.get(f"cycle=0/bi/{f}", {}).get("scores", {})
            row: dict[str, Any] = {
                "start_bi": avg(start_scores), "best_bi": avg(bi.get("scores", {})),
                "best_cross": avg(cross.get("scores", {})),
                "start_bi_cycle": 0, "best_bi_cycle": bi["cycle"], "best_cross_cycle": cross["cycle"],
                f"start_bi_{dev_set}": round(float(start_dev[f]), 2),
                f"best_bi_{dev_set}": round(float(bi["best_dev"]), 2),
                f"best_cross_{dev_set}": round(float(cross["best_dev"]), 2),
            }
            if row["start_bi"] is not None and row["best_bi"] is not None and row["best_cross"] is not None:
                row["improved"] = bi["cycle"] > 0 and row["best_bi"] > row["start_bi"]
                row["improved_on"] = "7-STS average of the best-dev bi-encoder against the start's"
                row["cross_beats_start_bi"] = row["best_cross"] > row["start_bi"]
            else:
                # A trained cycle is selected only when its dev score beats the start's (ties keep the start).
                row["improved"] = bi["cycle"] > 0
                row["improved_on"] = f"{dev_set} (no 7-STS scores)"
                row["cross_beats_start_bi"] = row[f"best_cross_{dev_set}"] > row[f"start_bi_{dev_set}"]
                row["scores_missing"] = ("eval.test_cycles is none: no model was evaluated on the 7 STS sets, so "
                                         "start_bi, best_bi and best_cross are null; rerun the same command with "
                                         "--set eval.test_cycles=best to evaluate (completed stages are reused)")
            if self.gold_labels is not None:
                row["start_bi_auc"] = _rounded(auc.get(f"cycle=0/bi/{f}", {}).get("auc"))
                row["best_bi_auc"] = _rounded(auc.get(f"cycle={bi['cycle']}/bi/{f}", {}).get("auc"))
                row["best_cross_auc"] = _rounded(auc.get(f"cycle={cross['cycle']}/cross/{f}", {}).get("auc"))
            outcome[f] = row
        return outcome

    def _pair_classification_note(self) -> dict[str, Any] | None:
        """What the AUCs of a qqp / mrpc run were measured on, for the summary (None for the STS sources)."""
        if self.gold_labels is None:
            return None
        from raydistill.runtime.pairs import pair_sets_of

        return {"source": self.cfg.pairs.source, "sets": list(pair_sets_of(self.cfg.pairs.source)),
                "pairs": len(self.pair_set), "positives": int(self.gold_labels.sum()), "transductive": True,
                "labels_used_for_training": False,
                "metric": "ROC AUC x 100 of each model's pair scores (bi: cosine; cross: mean sigmoid over both "
                          "orders) against the gold 0/1 labels of the very pairs the job learned from, unlabeled",
                "selection": f"{self.cfg.eval.dev_set}, apart from these pairs and their labels"}

    def _verdict_lines(self, by_family: dict[str, dict[str, Any]]) -> list[str]:
        """The job's last words: per family and encoder, the start, the best (cycle) and whether training improved
        on the start; 7-STS averages, or dev scores when there was no test evaluation."""
        dev_set = self.cfg.eval.dev_set
        lines = []
        for f, row in by_family.items():
            on_dev = row["start_bi"] is None or row["best_bi"] is None or row["best_cross"] is None
            start, best_bi, best_cross = ((row[f"start_bi_{dev_set}"], row[f"best_bi_{dev_set}"],
                                           row[f"best_cross_{dev_set}"]) if on_dev
                                          else (row["start_bi"], row["best_bi"], row["best_cross"]))
            unit = f" ({dev_set}; eval.test_cycles none, so no 7-STS)" if on_dev else ""
            if row["improved"]:
                verdict = f"training improved on the start ({best_bi - start:+.2f})"
            else:
                verdict = "training did NOT improve on the start"
                if row["best_bi_cycle"] > 0:  # dev chose a trained cycle whose 7-STS is not above the start's
                    verdict += (f" ({dev_set} rose {row[f'start_bi_{dev_set}']:.2f} -> "
                                f"{row[f'best_bi_{dev_set}']:.2f}, which selected cycle {row['best_bi_cycle']})")
            lines.append(f"{f} bi{unit}: start {start:.2f}, best {best_bi:.2f} (cycle {row['best_bi_cycle']}) "
                         f"— {verdict}")
            beats = "beats" if row["cross_beats_start_bi"] else "does NOT beat"
            lines.append(f"{f} cross{unit}: start bi {start:.2f}, best {best_cross:.2f} "
                         f"(cycle {row['best_cross_cycle']}) — the best cross-encoder {beats} the start bi-encoder")
            if "start_bi_auc" in row:
                lines.append(f"{f} {self.cfg.pairs.source} ROC AUC (transductive, on the {len(self.pair_set):,} "
                             f"pairs learned from): start bi {_fmt(row['start_bi_auc'])}, best bi "
                             f"{_fmt(row['best_bi_auc'])} (cycle {row['best_bi_cycle']}), best cross "
                             f"{_fmt(row['best_cross_auc'])} (cycle {row['best_cross_cycle']})")
        return lines

    # ------------------------------------------------------------------------------------------------------------
    # Tracking: one parent run; a child per family and encoder (stage), metrics per cycle with the cycle as step

    def _child(self, family: str, kind: str):
        if (family, kind) not in self.children:
            stage = "bi2cross" if kind == "cross" else "cross2bi"
            self.children[(family, kind)] = self.tracker.child(
                f"{self.run_name}/{family}/{kind}", tags={"family": family, "encoder": kind, "stage": stage})
            self.children[(family, kind)].log_params({"family": family, "encoder": kind, "stage": stage,
                                                      "model": self._model_name(family, kind)})
        return self.children[(family, kind)]

    def _track_stage(self, cycle: int, stage: str, summaries: dict[str, dict[str, Any]]) -> None:
        from raydistill.runtime.plots import plot_learning_curve

        kind = STAGE_TRAINS[stage]
        for f, s in summaries.items():
            child = self._child(f, kind)
            offset = self.step_offsets.get((f, kind), 0)
            # Every dev evaluation, and the loss at most ~200 times per stage (one MLflow call each).
            loss_rows = [row for row in s["history"] if "loss" in row]
            kept = {id(row) for row in loss_rows[::max(1, len(loss_rows) // 200)] + loss_rows[-1:]}
            for row in s["history"]:
                if "loss" in row and id(row) not in kept:
                    continue
                metrics = {("train/loss" if k == "loss" else "train/stsb_dev"): v
                           for k, v in row.items() if k != "step"}
                child.log_metrics(metrics, step=offset + int(row["step"]))
            self.step_offsets[(f, kind)] = offset + int(s["steps"])
            child.log_metrics({"stsb_dev_best": s["best_dev"], "best_step": s["best_step"], "steps": s["steps"],
                               "stage_wall_s": s["wall_s"]}, step=cycle)
            try:
                png = plot_learning_curve(s["history"], self.run_dir / "plots" / f"cycle={cycle}-{stage}-{f}.png",
                                          title=f"cycle {cycle} {stage}: {f} {kind}-encoder")
                child.log_artifact(png, "learning_curves")
            except Exception as exc:  # noqa: BLE001 - a plot must never stop a run
                log.warning("learning-curve plot failed: %s", exc)
        self.tracker.log_metrics({f"stage_wall_s/{stage}": self.state.stages[stage_key(cycle, stage)]["wall_s"]},
                                 step=cycle)

    def _dev_curves(self) -> dict[tuple[str, str], list[tuple[int, float]]]:
        """(family, bi|cross) -> [(cycle, dev score)] so far: the starting bi-encoder at cycle 0, then the best-dev
        model of each completed stage (a cross-encoder first exists at cycle 1)."""
        curves: dict[tuple[str, str], list[tuple[int, float]]] = {}
        start_dev = self.state.data.get("start_dev", {})
        for f in self.families:
            if f in start_dev:
                curves[(f, "bi")] = [(0, float(start_dev[f]))]
        for cycle in range(1, self.cfg.cycles + 1):
            for stage in STAGES:
                completed = self.state.stages.get(stage_key(cycle, stage))
                if completed is None:
                    continue
                for f in self.families:
                    curves.setdefault((f, STAGE_TRAINS[stage]), []).append(
                        (cycle, float(completed["families"][f]["best_dev"])))
        return curves

    def _log_dev_curves(self) -> None:
        """Parent-run metrics ``dev/<family>/<bi|cross>`` with the cycle as step, so MLflow's chart of the parent
        overlays every family's per-cycle dev curve; each point once per job run (a resumed run logs the stages
        of earlier runs too: it is a new MLflow run)."""
        if self.tracker is None:
            return
        for (f, kind), points in self._dev_curves().items():
            for cycle, dev in points:
                if (f, kind, cycle) not in self.dev_points_logged:
                    self.tracker.log_metrics({f"dev/{f}/{kind}": dev}, step=cycle)
                    self.dev_points_logged.add((f, kind, cycle))

    def _track_eval(self, family: str, kind: str, step: int, scores: dict[str, float], name: str | None) -> None:
        if self.tracker is None:
            return
        metrics = {f"sts/{set_name}": value for set_name, value in scores.items()}
        if family == "ensemble":
            if name == "best":  # the best models may come from different cycles: not a point of the per-cycle curve
                self.tracker.log_metrics({f"ensemble_best/{kind}/{k}": v for k, v in metrics.items()})
            else:
                self.tracker.log_metrics({f"ensemble/{kind}/{k}": v for k, v in metrics.items()}, step=step)
        else:
            self._child(family, kind).log_metrics(metrics, step=step)

    def _params(self, pair_set) -> dict[str, Any]:
        params = self.cfg.to_dict()
        params["families"] = {f.name: {"bi": f.bi, "cross": f.cross_start, "pooling": f.pooling}
                              for f in self.cfg.families}
        params["pairs"] = dict(params["pairs"], count=len(pair_set), pool_size=pair_set.pool_size,
                               fingerprint=pair_set.fingerprint)
        params["transductive"] = pair_set.transductive
        params["label_scaling"] = self.cfg.label_scaling
        params["label_weighting"] = self.cfg.label_weighting
        return params

    def _poolings(self) -> dict[str, str | None]:
        """Each family's bi-encoder pooling, fixed once: a saved cross-encoder carries none, so a sequential bi
        stage that starts from one must be told the family's pooling."""
        from raydistill.models.bi_encoder import read_sentence_transformers_layout

        poolings = {}
        for f in self.cfg.families:
            if f.pooling:
                poolings[f.name] = f.pooling
                continue
            layout = read_sentence_transformers_layout(Path(self.start_checkpoint("bi", f.name)))
            poolings[f.name] = layout.pooling if layout is not None else "mean"
        return poolings

    def _say(self, message: str) -> None:
        print(f"[tenc] {message}", flush=True)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(float(value), 2)


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def scores_from_predictions(predictions: dict[str, np.ndarray]) -> dict[str, float]:
    """Spearman x 100 of each set's predictions against its gold scores, and ``avg`` over the seven STS sets."""
    from raydistill.data import load_dataset
    from raydistill.evaluation import STS_SETS, spearman

    scores = {}
    for name, predicted in predictions.items():
        gold = np.array([p.score for p in load_dataset(STS_SETS.get(name, name))], dtype=np.float64)
        scores[name] = float(spearman(np.asarray(predicted, dtype=np.float64), gold))
    if all(name in scores for name in STS7):
        scores["avg"] = float(np.mean([scores[name] for name in STS7]))
    return scores


def _label_stats(per_family: dict[str, np.ndarray], averaged: np.ndarray) -> dict[str, float]:
    stats = {"mean": float(np.mean(averaged)), "std": float(np.std(averaged)),
             "min": float(np.min(averaged)), "max": float(np.max(averaged))}
    if len(per_family) > 1:
        from raydistill.evaluation import spearman

        names = list(per_family)
        rhos = []
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                # A collapsed labeller (one value for every pair) agrees with nothing: rho 0, not an error.
                constant = np.ptp(per_family[a]) == 0 or np.ptp(per_family[b]) == 0
                rhos.append(0.0 if constant else spearman(per_family[a], per_family[b]) / 100.0)
        stats["agreement"] = float(np.mean(rhos))
    return stats


def start_ray(cfg: TencConfig):
    """``cluster.init_ray`` (joins ``RAY_ADDRESS`` / an initialised Ray, else a local one with the config's CPUs),
    then Ray Data is told which CPUs the learner actors hold so its Parquet tasks plan around them.

    Returns a function that restores the previous Ray Data settings."""
    import ray
    from ray.data import DataContext, ExecutionResources

    from raydistill.runtime.cluster import init_ray

    if ray.is_initialized() or os.environ.get("RAY_ADDRESS"):
        init_ray(None)
    else:
        init_ray(None, num_cpus=cfg.resources.num_cpus)
    held_cpus, held_gpus = cfg.actor_reservation()
    available = ray.cluster_resources()
    cpus, gpus = float(available.get("CPU", 0)), float(available.get("GPU", 0))
    problems = []
    if held_cpus + cfg.resources.data_max_cpus > cpus + 1e-9:
        problems.append(f"{len(cfg.families)} families x (bi {cfg.resources.bi.num_cpus:g} + cross "
                        f"{cfg.resources.cross.num_cpus:g}) CPU + Ray Data headroom {cfg.resources.data_max_cpus:g} "
                        f"= {held_cpus + cfg.resources.data_max_cpus:g} CPU > {cpus:g}: lower "
                        "resources.bi.num_cpus / resources.cross.num_cpus (fractions are fine: threads set the "
                        "compute)")
    if held_gpus > gpus + 1e-9:
        problems.append(f"the actors ask for {held_gpus:g} GPU but the cluster has {gpus:g}; set "
                        "resources.bi.num_gpus / resources.cross.num_gpus: 0")
    if problems:
        from raydistill.runtime.cluster import ResourceError

        source = f"{cfg._source}: " if cfg._source else ""
        raise ResourceError(f"{source}resources do not fit the Ray cluster:\n  - " + "\n  - ".join(problems))
    # Ray Data plans with what the actors leave (not with the whole cluster), capped by data_max_cpus.
    ctx = DataContext.get_current()
    options = ctx.execution_options
    previous = (options.resource_limits, options.exclude_resources, ctx.enable_progress_bars)
    # Ray Data refuses a limit and an exclusion on the same resource; a distillation job earlier in this process
    # may have left an exclusion (cluster.configure_data_context), so the limit replaces it for this job.
    options.exclude_resources = ExecutionResources.zero()
    options.resource_limits = ExecutionResources(cpu=min(cfg.resources.data_max_cpus, cpus - held_cpus), gpu=0)
    ctx.enable_progress_bars = False

    def restore() -> None:  # the DataContext is process-wide: leave it as found (tests, notebooks)
        options.resource_limits, options.exclude_resources, ctx.enable_progress_bars = previous

    return restore


def run_trans_encoder(cfg: TencConfig) -> dict[str, Any]:
    """Validate, start/join Ray, run (or resume) the job; returns the summary (also ``<run_dir>/summary.json``)."""
    return TransEncoderJob(cfg).run()
