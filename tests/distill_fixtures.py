"""Tiny ConGen jobs shared by the job, fault and determinism tests.

    from tests import distill_fixtures
    distill_runs, teacher_dir = distill_fixtures.distill_runs, distill_fixtures.teacher_dir  # the fixtures

``teacher_dir``: a tiny random MPNet teacher (hidden 48), built once per session. ``distill_runs``: a
``DistillRuns`` over one session-wide workspace (a fixed pairs corpus, one teacher-embedding cache, one MLflow
store), which runs a tiny ConGen job with the real Ray runtime and keeps the uninterrupted reference runs, so the
job, fault and determinism tests compare against the same runs instead of training them again.

The reference of the default seed is the whole job: the session's first job in the workspace (every other run
trains it first), so its teacher pass is the one that fills the cache (every later run only hits it); it is tracked
in MLflow and scored on the 7 STS sets, so tests/test_distill_job.py checks its result file, MLflow run and cache
counts. What each run printed (the driver's progress, restart and stop lines) is kept with it (``RunLog.out``,
``DistillRuns.watches``), whichever test triggered it. Every run polls its Ray Train workers every 0.2 s
(``quick_train_polls``, also for tests that start Train runs of their own): at Train's default 2 s, a step of these
tiny jobs waited ~2 s for its report to be collected.

The corpus is a pairs file (two captions of one Flickr30k image per line, the ``pair`` view): no subsampling, so
the seed changes only the data order, the projection's initialisation and the dropout masks, and every seed reuses
the teacher vectors cached by the first run.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from raydistill.runtime.engine import checkpoint as ckpt
from raydistill.config.job import RUNTIME_KNOBS, JobConfig

ROWS, BATCH, EPOCHS = 160, 16, 2  # 10 batches an epoch, 20 steps
STEPS = ROWS // BATCH * EPOCHS
CHECKPOINT_EVERY = 5
EVAL_EVERY = 10  # an STS-B dev pass costs more than the 10 steps between them
SEED = 1000  # JobConfig's default
EXPERIMENT = "distill-runs"  # the MLflow experiment of the tracked runs (the reference's)

# Ray Train hands its controller a worker's reports one per poll, every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S (default
# 2 s): with a report after every step, a tiny job's step took 2 s instead of ~0.1 s. The controller of a Train run
# reads it from the driver's environment when the run starts; a missed poll is no failure (Train waits 10 minutes).
TRAIN_POLL_ENV, TRAIN_POLL_S = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2"

_SESSION: dict[str, Any] = {}
_LOCK = threading.Lock()


@pytest.fixture(scope="session")
def teacher_dir(tmp_path_factory, real_sentences) -> Path:
    # Imported into several test modules, so pytest sees several session fixtures: build the model only once.
    with _LOCK:
        if "teacher" not in _SESSION:
            from tiny_models import make_tiny_model

            _SESSION["teacher"] = make_tiny_model("mpnet", tmp_path_factory.mktemp("teacher48"), real_sentences,
                                                  hidden=48, heads=4, intermediate=96, seed=3)
    return _SESSION["teacher"]


def write_caption_pairs(path: Path, rows: int = ROWS) -> Path:
    """``rows`` lines ``{"sentence1": caption 1, "sentence2": caption 2}`` of the first Flickr30k images.

    Images with a caption that is also an evaluation sentence are skipped: a ``file:`` corpus drops such pairs, and
    the tests count on exactly ``rows`` training rows.
    """
    from raydistill.data import load_dataset
    from raydistill.data.corpus import evaluation_key, evaluation_keys

    evaluation = evaluation_keys()
    lines = []
    for group in load_dataset("flickr_captions"):
        if len(lines) == rows:
            break
        if evaluation_key(group.captions[0]) in evaluation or evaluation_key(group.captions[1]) in evaluation:
            continue
        lines.append(json.dumps({"sentence1": group.captions[0], "sentence2": group.captions[1]}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def congen_config(student: Path, teacher: Path, root: Path, run_name: str, *, seed: int = SEED, learners: int = 1,
                  threads: int = 1, corpus: Path | None = None, tracking_uri: str | None = None,
                  **extra: Any) -> dict[str, Any]:
    """A tiny ConGen job as a config dict: 20 steps of 16 pairs, a checkpoint every 5 steps, dev every 10; MLflow
    only with ``tracking_uri`` (experiment ``EXPERIMENT``, run named ``run_name``)."""
    corpus = corpus or root / "pairs.jsonl"
    tracking = ({"tracking_uri": tracking_uri, "experiment": EXPERIMENT, "run_name": run_name} if tracking_uri
                else {"enabled": False})
    return {
        "method": "congen", "student": str(student), "teacher": str(teacher), "seed": seed,
        "run_dir": str(root / run_name), "cache_dir": str(root / "embeddings"),
        "data": {"corpus": f"file:{corpus}", "views": {"control": "none", "generalize": "pair"},
                 "teacher_views": ["control"], "max_length": 32, "teacher_max_length": 32},
        "train": {"batch_size": BATCH, "lr": 1e-3, "epochs": EPOCHS, "eval_every": EVAL_EVERY,
                  "checkpoint_every": CHECKPOINT_EVERY, "keep_last": 2},
        "loss": {"queue_size": 64, "tau_teacher": 0.05, "tau_student": 0.07},
        # learners x 0.5 CPU leaves Ray Data its headroom on the 2-CPU test cluster
        "resources": {"num_cpus": 2, "teacher": {"num_actors": 1, "num_cpus": 1, "threads": 1, "batch_size": 64},
                      "learner": {"num_learners": learners, "num_cpus": 1 if learners == 1 else 0.5,
                                  "threads": threads}},
        "tracking": tracking,
        # runtime knobs (learner_timeout_s, max_restarts, ...) go to the runtime section, method settings to extra
        "runtime": {"log_every": 1, **{key: value for key, value in extra.items() if key in RUNTIME_KNOBS}},
        "extra": {key: value for key, value in extra.items() if key not in RUNTIME_KNOBS},
    }


@contextlib.contextmanager
def quick_train_polls():
    """Train runs started inside poll their workers every ``TRAIN_POLL_S``."""
    before = os.environ.get(TRAIN_POLL_ENV)
    os.environ[TRAIN_POLL_ENV] = TRAIN_POLL_S
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(TRAIN_POLL_ENV, None)
        else:
            os.environ[TRAIN_POLL_ENV] = before


@dataclass
class RunLog:
    """What one job did: its result record, every optimiser step the driver saw (a replayed step appears twice),
    and the final checkpoint's history (the steps the final weights descend from)."""

    record: dict[str, Any]
    steps_seen: list[int]
    history: list[dict[str, Any]]
    run_dir: Path
    notes: dict[str, Any] = field(default_factory=dict)
    out: str = ""  # what the driver printed while the job ran

    @property
    def training(self) -> dict[str, Any]:
        return self.record["training"]

    @property
    def best_stsb_dev(self) -> float:
        return float(self.training["best_stsb_dev"])

    def losses(self) -> dict[int, float]:
        return {row["step"]: row["loss"] for row in self.history if "loss" in row}

    def batches(self) -> list[int]:
        """crc32 of the row ids of each step's batch (rank 0's), in step order."""
        rows = sorted((row for row in self.history if "batch_crc32" in row), key=lambda row: row["step"])
        return [row["batch_crc32"] for row in rows]

    def batches_by_rank(self, learners: int) -> list[list[int]]:
        """Per learner rank, the crc32 of each step's batch, in step order (gathered into rank 0's history)."""
        rows = sorted((row for row in self.history if "loss" in row), key=lambda row: row["step"])
        if learners == 1:
            return [[row["batch_crc32"] for row in rows]]
        return [[row["batch_crc32_by_rank"][rank] for row in rows] for rank in range(learners)]


def final_history(run_dir: Path) -> list[dict[str, Any]]:
    latest = ckpt.latest_checkpoint(run_dir)
    assert latest is not None, f"{run_dir}: no checkpoint"
    _, state = ckpt.load_checkpoint(latest)
    return list(state["learner"]["history"])


def expected_batches(cfg: JobConfig, learners: int = 1, rank: int = 0) -> list[int]:
    """crc32 of the row ids of the batches an uninterrupted run trains on (learner ``rank``'s when several)."""
    import zlib

    from raydistill.runtime.teachers.pipeline import load_training_texts

    rows = len(load_training_texts(cfg.data, cfg.seed))
    out = []
    for epoch in range(cfg.train.epochs):
        order = np.random.default_rng([int(cfg.seed), epoch]).permutation(rows)  # TrainingData.epoch_order
        for b in range(rank, (rows // cfg.train.batch_size) // learners * learners, learners):
            idx = order[b * cfg.train.batch_size:(b + 1) * cfg.train.batch_size]
            out.append(zlib.crc32(np.ascontiguousarray(idx, dtype=np.int64).tobytes()))
    return out


@dataclass
class Watch:
    """What the driver saw of one run so far, kept when the job raises: the optimiser steps it heard of (a replayed
    step appears twice) and what it printed."""

    steps_seen: list[int] = field(default_factory=list)
    parts: list[str] = field(default_factory=list)

    @property
    def out(self) -> str:
        return "".join(self.parts)


class _Tee(io.TextIOBase):
    """``sys.stdout`` while a job runs: passes everything on (pytest's capture shows it) and keeps a copy."""

    def __init__(self, stream, parts: list[str]):
        self.stream, self.parts = stream, parts

    def write(self, text: str) -> int:
        self.parts.append(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def fileno(self) -> int:
        return self.stream.fileno()


class DistillRuns:
    """Runs tiny ConGen jobs in one workspace; uninterrupted runs are kept per (seed, learners, threads)."""

    def __init__(self, root: Path, student: Path, teacher: Path):
        self.root = root
        self.student, self.teacher = student, teacher
        self.corpus = write_caption_pairs(root / "pairs.jsonl")
        self.tracking_uri = f"sqlite:///{root / 'mlflow.db'}"
        self.watches: dict[str, Watch] = {}
        self._reference: dict[tuple[int, int, int], RunLog] = {}

    def config(self, run_name: str, *, tracked: bool = False, **kwargs: Any) -> JobConfig:
        """The job's config; ``tracked``: logged to the workspace's MLflow store."""
        return JobConfig.from_dict(congen_config(self.student, self.teacher, self.root, run_name, corpus=self.corpus,
                                                 tracking_uri=self.tracking_uri if tracked else None, **kwargs))

    def result_path(self, run_name: str) -> Path:
        return self.root / "results" / f"{run_name}.json"

    def run(self, run_name: str, *, on_step: Callable[[int], None] | None = None,
            on_start: Callable[[dict[str, Any]], None] | None = None, tracked: bool = False,
            evaluate: bool = False, **kwargs: Any) -> RunLog:
        """Train to the end (and with ``evaluate`` score the best model on the 7 STS sets and write the result file).
        In the driver, ``on_step(step)`` is called after every optimiser step (as its event arrives: the workers may
        be a step or two further) and ``on_start(info)`` whenever the learners (re)start (``info``: rank 0's ``pid``
        and ``actor``, the ``shared_actors``, the checkpoint step ``resumed_from``). ``watches[run_name]`` keeps the
        steps seen and the output also when the job raises."""
        import torch

        from raydistill.runtime.jobs.distill import run_distillation

        if run_name != _reference_name(*_SHARED):
            self.reference()  # the teacher pass is the reference's: every other run finds its rows cached
        watch = self.watches[run_name] = Watch()

        def progress(event: str, info: dict[str, Any], step: int) -> None:
            if event == "start" and on_start is not None:
                on_start(info)
            if event == "step":
                watch.steps_seen.append(step)
                if on_step is not None:
                    on_step(step)

        cfg = self.config(run_name, tracked=tracked, **kwargs)
        # The driver scores STS-B dev and the final evaluation: a tiny model on a busy 2-core box is ~10x slower on
        # 2 threads, whichever test asked for the run.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with contextlib.redirect_stdout(_Tee(sys.stdout, watch.parts)), quick_train_polls():
                record = run_distillation(cfg, result_path=self.result_path(run_name), evaluate=evaluate,
                                          command=f"tests/distill_fixtures.py {run_name}", progress=progress)
        finally:
            torch.set_num_threads(threads)
        return RunLog(record, watch.steps_seen, final_history(cfg.resolved_run_dir()), cfg.resolved_run_dir(),
                      out=watch.out)

    def seed_spread(self, seeds: tuple[int, ...] = (SEED, SEED + 1, SEED + 2)) -> float:
        """max - min final STS-B dev of the uninterrupted one-learner run over ``seeds``: what "within noise" means
        for these tiny jobs."""
        scores = [self.reference(seed).best_stsb_dev for seed in seeds]
        assert len(set(scores)) > 1, f"seeds {seeds} gave the same score {scores}: the seed does not reach training"
        return max(scores) - min(scores)

    def reference(self, seed: int = SEED, learners: int = 1, threads: int = 1) -> RunLog:
        """The uninterrupted run of this seed and learner setup (trained on first use). The default one is the
        whole job: tracked in MLflow, scored on the 7 STS sets, its result file written."""
        key = (seed, learners, threads)
        if key not in self._reference:
            whole = key == _SHARED
            self._reference[key] = self.run(_reference_name(*key), seed=seed, learners=learners, threads=threads,
                                            tracked=whole, evaluate=whole)
        return self._reference[key]


_SHARED = (SEED, 1, 1)  # the reference every default test compares with


def _reference_name(seed: int, learners: int, threads: int) -> str:
    return f"reference-s{seed}-l{learners}-t{threads}"


@pytest.fixture(scope="session")
def distill_runs(tmp_path_factory, tiny_bert, teacher_dir, ray_session) -> DistillRuns:
    with _LOCK:
        if "runs" not in _SESSION:
            _SESSION["runs"] = DistillRuns(tmp_path_factory.mktemp("distill_runs"), tiny_bert, teacher_dir)
    return _SESSION["runs"]
