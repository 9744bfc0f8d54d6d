"""The Trans-Encoder runs the tests share: each is run once per session, and every test that needs a whole job reads
one of them instead of paying for its own.

    tiny_config(tiny_models, root, **changes) -> TencConfig   two tiny families (BERT, MPNet), one cycle, 3 steps a
                                                              stage, no 7-STS pass, no MLflow; ``changes`` replace
                                                              top-level fields (a section replaces the whole section)
    mutual_config(tiny_models, root) -> TencConfig            the shared mutual run's config, MLflow under ``root``
    mutual_run -> MutualRun (session fixture)                 that config run once, uninterrupted
    self_qqp_config(tiny_models, root, **changes) -> TencConfig
    self_qqp_run -> SelfQqpRun (session fixture)              that config stopped after its first stage, then resumed

``mutual_run`` is read by tests/test_mutual_tenc.py (labels, refresh, MLflow children), tests/test_tenc_outcomes.py
(dev-weighted labels, a family's own stage settings), tests/test_signals.py (a SIGTERMed and resumed run of the same
config must end with the same stages; a damaged state.json rebuilt from its stages) and tests/test_determinism.py
(its stages trained again must give its models and labels). Its cross2bi stage has 40 steps with a dev line every
5, so the SIGTERM test can stop both learners mid-stage. ``self_qqp_run`` is read by tests/test_mutual_tenc.py (the
sequential weight chain across a restart, self labels, result files) and tests/test_tenc_outcomes.py (transductive
QQP AUC, model selection with the start, summary.json, dev curves). Both are the runs' outputs on disk: tests read
them and copy what they change.

The fixtures are imported into several modules, so pytest sees several session fixtures: each runs its job only once
(``_RUNS``).
"""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from raydistill.runtime.tenc import TencConfig, run_trans_encoder, stage_key

__all__ = ["MutualRun", "SelfQqpRun", "mutual_config", "mutual_run", "self_qqp_config", "self_qqp_run",
           "tiny_config", "MUTUAL_PAIRS", "STALE_RESULT", "MUTUAL_BI_STEPS", "MUTUAL_EVAL_EVERY", "QQP_PAIRS", "QQP_SEED",
           "WEIGHT_TEMPERATURE"]

_RUNS: dict[str, Any] = {}


def tiny_config(tiny_models: dict[str, Path], root: Path, **changes) -> TencConfig:
    """Two families (tiny BERT, tiny MPNet), one cycle, 3 steps per stage, no 7-STS pass, tracking off."""
    config = {
        "mode": "mutual",
        "families": [{"name": "bert", "bi": str(tiny_models["bert"])},
                     {"name": "mpnet", "bi": str(tiny_models["mpnet"])}],
        "cycles": 1,
        "init": "refresh",
        "pairs": {"source": "inductive", "max_pairs": 36, "seed": 7},
        # eval_every 2 of 3 steps: the best-dev selection runs twice per stage
        "bi": {"batch_size": 8, "lr": 1e-3, "epochs": 1, "max_steps": 3, "max_length": 32, "eval_every": 2,
               "warmup_ratio": 0.0},
        "cross": {"batch_size": 8, "lr": 1e-3, "epochs": 1, "max_steps": 3, "max_length": 32, "eval_every": 2},
        "eval": {"test_cycles": "none"},
        "run_dir": str(root / "run"),
        "results_dir": str(root / "results"),
        "resources": {"num_cpus": 2, "bi": {"num_cpus": 0.25, "threads": 1, "batch_size": 512},
                      "cross": {"num_cpus": 0.25, "threads": 1, "batch_size": 512}, "data_max_cpus": 1.0},
        "tracking": {"enabled": False},
    }
    config.update(changes)
    return TencConfig.from_dict(config)


def tracking(root: Path, experiment: str) -> dict[str, Any]:
    return {"enabled": True, "tracking_uri": f"sqlite:///{root}/mlflow.db", "experiment": experiment}


# ----------------------------------------------------------------------------------------------------------------
# The mutual run

MUTUAL_PAIRS = 80
MUTUAL_BI_STEPS = 40  # cross2bi: 20 batches of 4 pairs an epoch, 2 epochs
MUTUAL_EVAL_EVERY = 5  # a dev line every 5 steps: the SIGTERM test signals once both learners print step 5's
CROSS_STEPS = {"bert": 2, "mpnet": 3}  # bi2cross: bert has its own stage settings (families[0].cross_stage)
WEIGHT_TEMPERATURE = 5.0  # the start bi-encoders' dev scores differ by ~2: weights ~0.6 / 0.4, a real mix


def mutual_config(tiny_models: dict[str, Path], root: Path) -> TencConfig:
    """Mutual, refresh, one cycle of MUTUAL_PAIRS inductive pairs; labels weighted by their labellers' dev; bert's
    cross-encoder trains 2 steps, mpnet's 3; each bi-encoder MUTUAL_BI_STEPS steps; MLflow under ``root``."""
    return tiny_config(
        tiny_models, root,
        families=[{"name": "bert", "bi": str(tiny_models["bert"]), "cross_stage": {"max_steps": CROSS_STEPS["bert"]}},
                  {"name": "mpnet", "bi": str(tiny_models["mpnet"])}],
        pairs={"source": "inductive", "max_pairs": MUTUAL_PAIRS, "seed": 7},
        label_weighting="dev", label_weight_temperature=WEIGHT_TEMPERATURE,
        bi={"batch_size": 4, "lr": 1e-3, "epochs": 2, "max_steps": MUTUAL_BI_STEPS, "max_length": 32,
            "eval_every": MUTUAL_EVAL_EVERY, "warmup_ratio": 0.0},
        cross={"batch_size": 8, "lr": 1e-3, "epochs": 1, "max_steps": CROSS_STEPS["mpnet"], "max_length": 32,
               "eval_every": 2},
        tracking=tracking(root, "tenc-test"))


@dataclass
class MutualRun:
    """``mutual_config`` run once, uninterrupted, under ``root`` (run dir ``root/run``)."""

    root: Path
    tracking_uri: str
    summary: dict


@pytest.fixture(scope="session")
def mutual_run(tiny_models, tmp_path_factory, ray_session) -> MutualRun:
    if "mutual" not in _RUNS:
        import pandas as pd
        import pyarrow.parquet as pq
        import ray

        from raydistill.runtime.tenc import evaluation as tenc_evaluation

        root = tmp_path_factory.mktemp("mutual")
        with pytest.MonkeyPatch.context() as driver:
            # Every way this process could read a label set fails: the learners, in their own processes, read theirs.
            def no_label_reads_in_the_driver(*args, **kwargs):
                raise AssertionError(f"the driver read a label set: {args[:1]}")

            for module, name in ((ray.data, "read_parquet"), (pq, "read_table"), (pd, "read_parquet"),
                                 (tenc_evaluation, "read_label_set")):
                driver.setattr(module, name, no_label_reads_in_the_driver)
            summary = run_trans_encoder(mutual_config(tiny_models, root))
        _RUNS["mutual"] = MutualRun(root, f"sqlite:///{root}/mlflow.db", summary)
    return _RUNS["mutual"]


# ----------------------------------------------------------------------------------------------------------------
# The self-distillation run on QQP pairs, stopped after its first stage and resumed

QQP_PAIRS = 40
QQP_SEED = 7
STOP_AFTER = stage_key(1, "bi2cross")
STALE_RESULT = "bert-bi-cycle7.json"  # planted in the results directory before the second invocation


def self_qqp_config(tiny_models: dict[str, Path], root: Path, **changes) -> TencConfig:
    """Self-distillation, sequential init, one cycle on QQP_PAIRS QQP dev pairs (transductive, with their AUC), the
    segment-cosine cross head, 7-STS of cycle 0 and of the best models, MLflow under ``root``. (Which checkpoint
    each stage of later cycles starts from: tests/test_mutual_tenc.py, without a run.)"""
    cross = {"batch_size": 8, "lr": 1e-3, "epochs": 1, "max_steps": 3, "max_length": 32, "eval_every": 2,
             "head": "segment_cosine"}
    settings = {"mode": "self", "init": "sequential", "cycles": 1, "cross": cross, "eval": {"test_cycles": "best"},
                "pairs": {"source": "qqp", "max_pairs": QQP_PAIRS, "seed": QQP_SEED},
                "tracking": tracking(root, "tenc-self-qqp")}
    return tiny_config(tiny_models, root, **{**settings, **changes})


@dataclass
class SelfQqpRun:
    """``self_qqp_config`` stopped after STOP_AFTER (``stop_after_stage``, as a crash there would), then run again to
    its end. ``stopped_*``: what the first invocation returned and left; ``summary``/``printed``: the second's."""

    root: Path
    tracking_uri: str
    stopped: dict  # the first invocation's return value
    stopped_state: dict  # state.json after it
    stopped_cross_files: dict[str, int]  # bert's cycle-1 cross-encoder files (name -> mtime) after it
    stopped_label_files: dict[Path, int]  # cycle 1's label files (path -> mtime) after it
    summary: dict  # the second invocation's return value (its results directory held STALE_RESULT before it)
    printed: str  # what the second invocation printed

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def results(self) -> Path:
        return self.root / "results"


def _mtimes(paths) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in paths}


@pytest.fixture(scope="session")
def self_qqp_run(tiny_models, tmp_path_factory, ray_session) -> SelfQqpRun:
    if "self_qqp" not in _RUNS:
        root = tmp_path_factory.mktemp("self-qqp")
        run_dir = root / "run"
        stopped = run_trans_encoder(self_qqp_config(tiny_models, root, stop_after_stage=STOP_AFTER))
        stopped_state = json.loads((run_dir / "state.json").read_text())
        cross_files = {p.name: t for p, t in _mtimes((run_dir / "models" / "cycle=1" / "cross" / "bert").iterdir())
                       .items()}
        label_files = _mtimes((run_dir / "labels" / "cycle=1").rglob("*.parquet"))
        # A result file of an earlier run of the same name elsewhere (as a checkout's committed files would be):
        # the finished run must not leave it beside its own.
        (root / "results").mkdir(parents=True, exist_ok=True)
        (root / "results" / STALE_RESULT).write_text("{}")
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            summary = run_trans_encoder(self_qqp_config(tiny_models, root))
        _RUNS["self_qqp"] = SelfQqpRun(root, f"sqlite:///{root}/mlflow.db", stopped, stopped_state, cross_files,
                                       label_files, summary, printed.getvalue())
    return _RUNS["self_qqp"]
