"""Tiny ConGen jobs shared by the job, fault and determinism tests.

    from tests.distill_fixtures import distill_runs, teacher_dir  # noqa: F401 - fixtures

``teacher_dir``: a tiny random MPNet teacher (hidden 48), built once per session. ``distill_runs``: a
``DistillRuns`` over one session-wide workspace (a fixed pairs corpus, one teacher-embedding cache), which runs a
tiny ConGen job with the real Ray runtime and keeps the uninterrupted reference runs, so the fault tests and the
determinism tests compare against the same runs instead of training them twice.

The corpus is a pairs file (two captions of one Flickr30k image per line, the ``pair`` view): no subsampling, so
the seed changes only the data order, the projection's initialisation and the dropout masks, and every seed reuses
the teacher vectors cached by the first run.
"""

from __future__ import annotations

import json
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
                  threads: int = 1, corpus: Path | None = None, **extra: Any) -> dict[str, Any]:
    """A tiny ConGen job as a config dict: 20 steps of 16 pairs, a checkpoint every 5 steps, dev every 10, no MLflow."""
    corpus = corpus or root / "pairs.jsonl"
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
        "tracking": {"enabled": False},
        # runtime knobs (learner_timeout_s, max_restarts, ...) go to the runtime section, method settings to extra
        "runtime": {"log_every": 1, **{key: value for key, value in extra.items() if key in RUNTIME_KNOBS}},
        "extra": {key: value for key, value in extra.items() if key not in RUNTIME_KNOBS},
    }


@dataclass
class RunLog:
    """What one job did: its result record, every optimiser step the driver saw (a replayed step appears twice),
    and the final checkpoint's history (the steps the final weights descend from)."""

    record: dict[str, Any]
    steps_seen: list[int]
    history: list[dict[str, Any]]
    run_dir: Path
    notes: dict[str, Any] = field(default_factory=dict)

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


class DistillRuns:
    """Runs tiny ConGen jobs in one workspace; uninterrupted runs are kept per (seed, learners, threads)."""

    def __init__(self, root: Path, student: Path, teacher: Path):
        self.root = root
        self.student, self.teacher = student, teacher
        self.corpus = write_caption_pairs(root / "pairs.jsonl")
        self._reference: dict[tuple[int, int, int], RunLog] = {}

    def config(self, run_name: str, **kwargs: Any) -> JobConfig:
        return JobConfig.from_dict(congen_config(self.student, self.teacher, self.root, run_name,
                                                 corpus=self.corpus, **kwargs))

    def run(self, run_name: str, *, on_step: Callable[[int], None] | None = None,
            on_start: Callable[[dict[str, Any]], None] | None = None, **kwargs: Any) -> RunLog:
        """Train to the end. In the driver, ``on_step(step)`` is called after every optimiser step (as its event
        arrives: the workers may be a step or two further) and ``on_start(info)`` whenever the learners (re)start
        (``info``: rank 0's ``pid`` and ``actor``, the ``queue_actors``, the checkpoint step ``resumed_from``)."""
        from raydistill.runtime.jobs.distill import run_distillation

        steps_seen: list[int] = []

        def progress(event: str, info: dict[str, Any], step: int) -> None:
            if event == "start" and on_start is not None:
                on_start(info)
            if event == "step":
                steps_seen.append(step)
                if on_step is not None:
                    on_step(step)

        cfg = self.config(run_name, **kwargs)
        record = run_distillation(cfg, result_path=self.root / "results" / f"{run_name}.json", evaluate=False,
                                  progress=progress)
        return RunLog(record, steps_seen, final_history(cfg.resolved_run_dir()), cfg.resolved_run_dir())

    def seed_spread(self, seeds: tuple[int, ...] = (SEED, SEED + 1, SEED + 2)) -> float:
        """max - min final STS-B dev of the uninterrupted one-learner run over ``seeds``: what "within noise" means
        for these tiny jobs."""
        scores = [self.reference(seed).best_stsb_dev for seed in seeds]
        assert len(set(scores)) > 1, f"seeds {seeds} gave the same score {scores}: the seed does not reach training"
        return max(scores) - min(scores)

    def reference(self, seed: int = SEED, learners: int = 1, threads: int = 1) -> RunLog:
        """The uninterrupted run of this seed and learner setup (trained on first use)."""
        key = (seed, learners, threads)
        if key not in self._reference:
            self._reference[key] = self.run(f"reference-s{seed}-l{learners}-t{threads}", seed=seed,
                                            learners=learners, threads=threads)
        return self._reference[key]


@pytest.fixture(scope="session")
def distill_runs(tmp_path_factory, tiny_bert, teacher_dir, ray_session) -> DistillRuns:
    with _LOCK:
        if "runs" not in _SESSION:
            _SESSION["runs"] = DistillRuns(tmp_path_factory.mktemp("distill_runs"), tiny_bert, teacher_dir)
    return _SESSION["runs"]
