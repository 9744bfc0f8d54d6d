"""What a job prints: no Ray notice its user cannot act on, and a progress line at least every 30 s of training.

Ray's notices are checked where Ray raises them, without starting a Ray: the token-authentication notice of a new
local cluster (Ray's own check, run as ``ray.init`` runs it) and the deprecation of Ray Data's
``ExecutionOptions.exclude_resources`` (set by raydistill before, and passed through by Ray Train for every run with
datasets). The progress cadence is driven by fake clocks in ``learner_group``, whose progress printer the
Trans-Encoder stages and the DvBERT teacher loops use, and in ``train_loop``, whose rank 0 reports a step 30 s after
its previous report, so no test waits.
"""

from __future__ import annotations

import logging
import math
import os
import re
import warnings

import numpy as np
import pytest

from raydistill.config.job import JobConfig
from raydistill.runtime.engine import cluster, learner_group, train_loop
from raydistill.runtime.jobs.stage_data import ENGINE_SERVICES

AUTH_MODE_ENV = "RAY_AUTH_MODE"
AUTH_NOTICE = "Token authentication is enabled for this Ray cluster"
STEP_LINE = re.compile(r"^\[(?P<tag>[^\]]+)\] step (?P<step>\d+)/(?P<total>\d+) \(\d+%\) ep \d+/\d+ "
                       r"loss \S+ .*ETA \S+$")


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def auth_mode_unset(monkeypatch):
    """RAY_AUTH_MODE unset for the test and put back as it was afterwards (also when the code under test sets it)."""
    monkeypatch.setenv(AUTH_MODE_ENV, "placeholder")
    monkeypatch.delenv(AUTH_MODE_ENV)


def _start_local_ray_as_ray_init_would(monkeypatch) -> tuple[dict, list[logging.LogRecord]]:
    """``cluster.start_local_ray`` with ``ray.init`` replaced by the first thing it does for a new local cluster:
    Ray's decision on token authentication, which logs the notice when the mode was left to Ray."""
    import ray
    from ray._private.authentication import authentication_token_setup as auth

    seen: dict = {"reread": []}

    class Config:  # Ray's settings of this process stay as they are; re-reading them is recorded
        @staticmethod
        def initialize(text: str) -> None:
            seen["reread"].append(os.environ.get(AUTH_MODE_ENV))

    monkeypatch.setattr(auth, "Config", Config)
    handler = _Records()
    auth.logger.addHandler(handler)  # Ray's loggers do not propagate to the root logger

    def init(**kwargs):
        seen["mode"], seen["kwargs"] = os.environ.get(AUTH_MODE_ENV), kwargs
        auth.enable_token_auth_by_default()

    monkeypatch.setattr(ray, "init", init)
    try:
        cluster.start_local_ray(num_cpus=1)
    finally:
        auth.logger.removeHandler(handler)
    return seen, handler.records


def test_a_local_ray_keeps_rays_own_auth_mode_without_its_notice(monkeypatch, auth_mode_unset):
    seen, records = _start_local_ray_as_ray_init_would(monkeypatch)
    assert seen["mode"] is None and seen["kwargs"]["address"] == "local"  # the mode is left to Ray
    assert seen["reread"] == ["token"] and os.environ[AUTH_MODE_ENV] == "token"  # Ray turned token auth on
    assert not [r for r in records if AUTH_NOTICE in r.getMessage()]


def test_a_users_own_auth_mode_is_kept(monkeypatch, auth_mode_unset):
    monkeypatch.setenv(AUTH_MODE_ENV, "disabled")
    seen, records = _start_local_ray_as_ray_init_would(monkeypatch)
    assert seen["mode"] == "disabled" and not seen["reread"] and not records


def test_ray_data_gets_the_cpus_the_actors_leave_without_a_deprecated_setting():
    """The Data budget is the cluster less the actors' CPUs, as a limit; neither raydistill's setting nor Ray Train's
    copy of the DataContext's options (``DataConfig.default_ingest_options``, run for every run with datasets)
    raises the deprecation of ``exclude_resources``."""
    from ray.data import DataContext, ExecutionOptions, ExecutionResources
    from ray.train import DataConfig

    cfg = JobConfig.from_dict({"method": "congen", "student": "bert-tiny",
                               "resources": {"num_cpus": 2, "learner": {"num_learners": 2, "num_cpus": 0.5}}})
    options = DataContext.get_current().execution_options
    before = options.resource_limits
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        restore = cluster.configure_data_context(cfg)
        try:
            limits = DataContext.get_current().execution_options.resource_limits
            # 2 CPUs (this session's Ray, or the config's when none runs) less 2 learners x 0.5 CPU; no actor holds
            # a GPU, so Ray Data's GPU budget stays its own
            assert limits.cpu == 1.0 and math.isinf(limits.gpu)
            DataConfig.default_ingest_options()
            # Only Ray's own pass-through is quiet: code that sets the deprecated option is still told
            ExecutionOptions().exclude_resources = ExecutionResources(cpu=1)
        finally:
            restore()
    assert DataContext.get_current().execution_options.resource_limits == before
    deprecations = [w for w in caught if "exclude_resources" in str(w.message)]
    assert [w.filename for w in deprecations] == [__file__]


def test_the_teacher_pass_may_plan_its_pool_on_the_learners_cpus(monkeypatch):
    """The teacher pass runs before the learners start: its dataset's limit is raised to what the pool asks for."""
    import ray
    from ray.data import ExecutionOptions, ExecutionResources

    from raydistill.runtime.teachers.embedding_cache import _leave_room_for_the_pool

    class Dataset:
        class context:
            execution_options = ExecutionOptions(resource_limits=ExecutionResources.for_limits(cpu=0.5))

    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        _leave_room_for_the_pool(Dataset, pool_cpus=1.0, pool_gpus=0.0)
    limits = Dataset.context.execution_options.resource_limits
    assert limits.cpu == 1.0 and math.isinf(limits.gpu)  # a pool without GPUs leaves the GPU limit as it was


# ----------------------------------------------------------------------------------------------------------------
# Progress lines


class FakeClock:
    """``time`` for learner_group's progress printer and the training loop (whose rank 0 reports a step 30 s after
    its previous report): each reading is ``step_s`` seconds after the previous one."""

    def __init__(self, step_s: float):
        self.now, self.step_s = 0.0, step_s

    def perf_counter(self) -> float:
        self.now += self.step_s
        return self.now


def _step_lines(out: str, tag: str) -> list[int]:
    steps = []
    for line in out.splitlines():
        match = STEP_LINE.match(line.strip())
        if match and match["tag"] == tag:
            steps.append(int(match["step"]))
    return steps


def test_a_trans_encoder_stage_prints_a_line_whenever_30_s_passed(tiny_bert, tmp_path, monkeypatch, capsys):
    """Each step of this stage "takes" 31 s on the printer's clock: every step gets its line, though log_every
    alone would print none before the last; the line has the distillation jobs' form, with an ETA."""
    from raydistill.runtime.tenc.learners import BiEncoderLearner

    train = {"batch_size": 4, "lr": 1e-3, "epochs": 1, "max_steps": None, "max_length": 32, "warmup_ratio": 0.0,
             "weight_decay": 0.0, "grad_clip": 1.0, "eval_every": 1000, "amp": False, "precision": "fp32"}
    learner = BiEncoderLearner("bert", None, train, threads=1, device="cpu", log_every=1000)
    learner.load(str(tiny_bert), cycle=1)
    sentences = [f"a dog number {i} runs on the grass" for i in range(24)]
    rows = (sentences[:12], sentences[12:], np.linspace(0.0, 1.0, 12, dtype=np.float32))  # 3 full batches of 4
    monkeypatch.setattr(learner, "training_rows", lambda labels_dir, column: rows)  # no Ray Data read
    monkeypatch.setattr(learner, "dev_score", lambda: 50.0)  # no STS-B dev pass
    monkeypatch.setattr(learner_group, "time", FakeClock(31.0))
    monkeypatch.setattr(train_loop, "time", FakeClock(31.0))
    train_config_log = _Records()  # the stage's local-mode Train run announces itself there; raydistill drops it
    logging.getLogger("ray.train.v2.api.config").addHandler(train_config_log)
    try:
        summary = learner.fit(str(tmp_path / "labels"), "score", cycle=1, stage="cross2bi",
                              out_dir=str(tmp_path / "bi"))
    finally:
        logging.getLogger("ray.train.v2.api.config").removeHandler(train_config_log)
    assert summary["steps"] == 3
    assert _step_lines(capsys.readouterr().out, "cycle 1 cross2bi bert/bi") == [1, 2, 3]
    assert not [r.getMessage() for r in train_config_log.records if "local mode" in r.getMessage()]


def test_a_short_stage_prints_only_its_last_step(tiny_bert, tmp_path, monkeypatch, capsys):
    from raydistill.runtime.tenc.learners import BiEncoderLearner

    train = {"batch_size": 4, "lr": 1e-3, "epochs": 1, "max_steps": None, "max_length": 32, "warmup_ratio": 0.0,
             "weight_decay": 0.0, "grad_clip": 1.0, "eval_every": 1000, "amp": False, "precision": "fp32"}
    learner = BiEncoderLearner("bert", None, train, threads=1, device="cpu", log_every=1000)
    learner.load(str(tiny_bert), cycle=1)
    rows = ([f"first {i}" for i in range(12)], [f"second {i}" for i in range(12)], np.full(12, 0.5, np.float32))
    monkeypatch.setattr(learner, "training_rows", lambda labels_dir, column: rows)
    monkeypatch.setattr(learner, "dev_score", lambda: 50.0)
    monkeypatch.setattr(learner_group, "time", FakeClock(1.0))

    learner.fit(str(tmp_path / "labels"), "score", cycle=1, stage="cross2bi", out_dir=str(tmp_path / "bi"))
    assert _step_lines(capsys.readouterr().out, "cycle 1 cross2bi bert/bi") == [3]


def _nli_training(**overrides):
    from raydistill.methods import dvbert_teachers as dv

    return dv.TeacherTraining.from_dict({"epochs": 2, "lr": 1e-3, "batch_size": 4, "max_length": 32, "folds": 2,
                                         "head": "mean", **overrides})


def test_a_dvbert_head_prints_a_line_whenever_30_s_passed(monkeypatch, capsys, tmp_path):
    from raydistill.methods import dvbert_teachers as dv

    rng = np.random.default_rng(0)
    pooled = rng.normal(size=(24, 8)).astype(np.float32)
    gold = rng.integers(0, 3, size=24)
    cfg = _nli_training(finetune=False)
    monkeypatch.setattr(learner_group, "time", FakeClock(31.0))
    monkeypatch.setattr(train_loop, "time", FakeClock(31.0))
    dv._fit_fold({"label": gold}, np.arange(16), np.arange(16, 24), cfg, 0, tmp_path, tmp_path / "fold", "cpu",
                 "dvbert-teacher tiny fold 1/2 head", ENGINE_SERVICES, pooled=pooled)
    # 16 rows / batch 4 = 4 steps an epoch, 2 epochs
    assert _step_lines(capsys.readouterr().out, "dvbert-teacher tiny fold 1/2 head") == list(range(1, 9))


def test_a_dvbert_fold_fine_tuning_prints_a_line_whenever_30_s_passed(tiny_bert, monkeypatch, capsys, tmp_path):
    from raydistill.models import resolve_model
    from raydistill.models.bi_encoder import transformer_directory
    from raydistill.methods import dvbert_teachers as dv

    columns = dv.nli_pairs(12, seed=3)
    cfg = _nli_training(finetune=True, epochs=1)
    weights = transformer_directory(resolve_model(str(tiny_bert)))
    monkeypatch.setattr(learner_group, "time", FakeClock(31.0))
    monkeypatch.setattr(train_loop, "time", FakeClock(31.0))
    model, probs, stats = dv._fit_fold(columns, np.arange(8), np.arange(8, 12), cfg, 0, weights,
                                       tmp_path / "fold", "cpu", "dvbert-teacher tiny fold 1/2",
                                       ENGINE_SERVICES)
    assert probs.shape == (4, 3) and stats["steps"] == 2
    # 2 steps, each past 30 s: a line after each, where every 50 steps printed only the last before
    assert _step_lines(capsys.readouterr().out, "dvbert-teacher tiny fold 1/2") == [1, 2]


def test_ray_workers_load_models_without_a_progress_bar(tiny_bert, monkeypatch):
    """transformers 5 draws a "Loading weights" bar at every model load; the environment every worker of a local
    Ray inherits turns it off (a process started without it still draws one, so the check can fail)."""
    import subprocess
    import sys

    from raydistill.runtime.engine.cluster import WORKER_ENV, prepare_worker_environment

    load = ("from transformers import AutoModel; "
            f"AutoModel.from_pretrained({str(tiny_bert)!r}, local_files_only=True)")
    bare = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    drawn = subprocess.run([sys.executable, "-c", load], env=bare, capture_output=True, text=True, check=True)
    assert "Loading weights" in drawn.stderr
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    prepare_worker_environment()
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == WORKER_ENV["HF_HUB_DISABLE_PROGRESS_BARS"]
    quiet = subprocess.run([sys.executable, "-c", load], env=dict(os.environ), capture_output=True, text=True,
                           check=True)
    assert "Loading weights" not in quiet.stderr


def test_a_cross_encoder_from_a_sentence_encoder_loads_without_transformers_load_report(tiny_bert, tmp_path,
                                                                                        capfd, caplog):
    """Every Trans-Encoder cross stage (and AugSBERT's teacher) builds a cross-encoder from a sentence encoder: its
    new head is intended, so transformers' report of the missing head weights is not printed; a saved
    cross-encoder loads as before, and the report's logger keeps its level afterwards."""
    from raydistill.models import CrossEncoder

    reporter = logging.getLogger("transformers.modeling_utils")
    level = reporter.level
    with caplog.at_level(logging.WARNING):
        cross = CrossEncoder.from_pretrained(str(tiny_bert), num_labels=1)
        cross.save(tmp_path / "cross")
        CrossEncoder.from_pretrained(str(tmp_path / "cross"), num_labels=1)
    out, err = capfd.readouterr()
    assert "LOAD REPORT" not in out + err + caplog.text
    assert reporter.level == level
