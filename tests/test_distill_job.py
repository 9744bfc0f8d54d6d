"""End to end: a tiny ConGen job under local Ray, MLflow and the teacher cache; then a resumed, killed-and-restarted run.

Tiny random models (2 layers) keep each run to seconds of compute; everything else is the real thing: Ray Data
teacher pool, embedding cache, a Ray Train worker streaming the rows, checkpoints, the 7-STS evaluation, the result
schema and MLflow.

The second job (cache hits, then a killed learner) is marked ``e2e``: by default a teacher pass that finds its rows
cached is tests/test_runtime_data.py's and tests/test_tune.py's (every trial reads the driver's cache), and a killed
Train worker is tests/test_faults.py's SIGKILL test.
"""

from __future__ import annotations

import threading
import time

import pytest

from raydistill.runtime.engine import checkpoint as ckpt
from raydistill.config.job import JobConfig
from raydistill.runtime.engine.preflight import preflight
from tests.ray_fixtures import ray_session  # noqa: F401 - the session-wide Ray fixture

pytestmark = pytest.mark.ray

ROWS, BATCH, STEPS = 160, 16, 20


@pytest.fixture(autouse=True)
def one_thread(one_thread):
    # The driver runs the final evaluation; tiny models on a busy 2-core box are ~10x slower with 2 threads.
    yield


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("distill")
    return {"cache": root / "embeddings", "mlflow": f"sqlite:///{root / 'mlflow.db'}", "root": root}


def job_config(student, teacher, workspace, run_name: str) -> JobConfig:
    return JobConfig.from_dict({
        "method": "congen", "student": str(student), "teacher": str(teacher),
        "run_dir": str(workspace["root"] / run_name), "cache_dir": str(workspace["cache"]),
        "data": {"corpus": "flickr", "max_sentences": ROWS, "views": {"control": "none", "generalize": "caption"},
                 "teacher_views": ["control"], "max_length": 32, "teacher_max_length": 32},
        "train": {"batch_size": BATCH, "lr": 1e-3, "epochs": 2, "max_steps": STEPS, "eval_every": 5,
                  "checkpoint_every": 5, "keep_last": 2},
        "loss": {"queue_size": 64, "tau_teacher": 0.05, "tau_student": 0.07},
        "resources": {"num_cpus": 2, "teacher": {"num_actors": 1, "num_cpus": 1, "threads": 1, "batch_size": 64},
                      "learner": {"num_learners": 1, "num_cpus": 1, "threads": 1}},
        "tracking": {"tracking_uri": workspace["mlflow"], "experiment": "test-distill", "run_name": run_name},
    })


def test_congen_job_writes_result_tracks_mlflow_and_caches_the_teacher(ray_session, tiny_bert, tiny_teacher,
                                                                        workspace, capsys):
    from mlflow import MlflowClient

    from raydistill.evaluation import validate_result_file
    from raydistill.runtime.jobs.distill import run_distillation

    cfg = job_config(tiny_bert, tiny_teacher, workspace, "first")
    result_path = workspace["root"] / "results" / "congen-tiny.json"
    record = run_distillation(cfg, result_path=result_path, command="pytest tests/test_distill_job.py")

    validate_result_file(str(result_path))
    assert record["kind"] == "distill" and record["method"] == "congen"
    assert set(record["scores"]) >= {"sts12", "sickr", "avg", "stsb_dev"}
    training = record["training"]
    assert training["steps"] == STEPS and training["sentences"] == ROWS
    assert training["views"] == {"control": "none", "generalize": "caption"}
    assert 0 < training["best_step"] <= STEPS
    # Two epochs, one teacher pass: every sentence went through the teacher exactly once.
    assert training["teacher_cache"] == {"hits": 0, "misses": ROWS, "teacher_forward_sentences": ROWS}
    assert (workspace["root"] / "first" / "best" / "modules.json").is_file()
    assert record["params_m"] > 0 and record["wall_s"] > 0

    out = capsys.readouterr().out
    assert f"step {STEPS}/{STEPS}" in out and "sent/s" in out and "ETA" in out

    client = MlflowClient(tracking_uri=workspace["mlflow"])
    run = client.get_run(record["mlflow_run_id"])
    params = run.data.params
    for key in ("method", "teacher", "student", "tau_teacher", "tau_student", "K", "lr", "batch_size", "seed",
                "git_sha", "config_hash", "corpus_size", "cache.misses"):
        assert key in params, key
    assert params["K"] == "64" and params["corpus_size"] == str(ROWS)
    metrics = run.data.metrics
    for key in ("loss", "loss_con", "loss_gen", "lr", "sentences_per_s", "stsb_dev", "teacher_cache_misses",
                "test_avg"):
        assert key in metrics, key
    assert len(client.get_metric_history(run.info.run_id, "loss")) == STEPS
    assert len(client.get_metric_history(run.info.run_id, "stsb_dev")) == STEPS // 5
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"plots", "model", result_path.name} <= artifacts
    plots = {a.path for a in client.list_artifacts(run.info.run_id, "plots")}
    assert plots == {"plots/learning_curve.png", "plots/stsb_dev_scatter.png"}


@pytest.mark.e2e
def test_second_job_hits_the_cache_and_survives_a_killed_learner(ray_session, tiny_bert, tiny_teacher, workspace):
    import os
    import signal

    from raydistill.runtime.jobs.distill import run_distillation

    cfg = job_config(tiny_bert, tiny_teacher, workspace, "second")
    run_dir = workspace["root"] / "second"
    killed: dict[str, object] = {}
    workers: list[int] = []

    def note_the_worker(event, info, step) -> None:
        if event == "start":
            workers.append(int(info["pid"]))

    def first_checkpoint_is_whole() -> bool:
        # Train copies a reported checkpoint into the run dir file by file: one seen half-copied is not there yet
        try:
            return ckpt.latest_good_checkpoint(run_dir, report=lambda message: None)[0] is not None
        except ckpt.CheckpointError:
            return False

    def kill_learner_after_first_checkpoint() -> None:
        deadline = time.time() + 240
        while time.time() < deadline:
            if workers and first_checkpoint_is_whole():
                killed["at_checkpoints"] = [p.name for p in ckpt.list_checkpoints(run_dir)]
                os.kill(workers[0], signal.SIGKILL)  # the Train worker's process, as the OOM killer would
                killed["name"] = workers[0]
                return
            time.sleep(0.02)

    killer = threading.Thread(target=kill_learner_after_first_checkpoint, daemon=True)
    killer.start()
    record = run_distillation(cfg, result_path=workspace["root"] / "results" / "second.json", evaluate=False,
                              progress=note_the_worker)
    killer.join(timeout=5)

    training = record["training"]
    assert training["teacher_cache"] == {"hits": ROWS, "misses": 0, "teacher_forward_sentences": 0}
    assert "name" in killed, "the learner worker was never killed"
    assert training["restarts"] == 1
    stage = training["stages"][0]
    assert stage["resumed_from"] is not None and stage["resumed_from"] >= 5 and stage["resumed_from"] % 5 == 0
    assert training["steps"] == STEPS  # it finished the run after resuming
    manifest = ckpt.read_manifest(ckpt.latest_checkpoint(run_dir))
    assert manifest["step"] == STEPS and manifest["extra"]["restarts"] == 1 and manifest["extra"]["finished"]


def test_two_train_workers_stay_identical_share_the_queue_and_resume_after_the_queue_actor_dies(
        ray_session, tiny_bert, tiny_teacher, workspace):
    """Two Ray Train workers (DDP, gloo) on the streamed corpus share one queue actor, which is killed: the workers'
    next queue read fails, Train's FailureConfig restarts both from the newest checkpoint with a new queue actor
    (its content from the checkpoint); afterwards both workers hold identical weights, every rank trained exactly
    its batches of the seeded order once, and the shared queue holds the other rank's teacher vectors. (A killed
    worker is tests/test_faults.py's SIGKILL test; the same queue fault against an uninterrupted two-learner run is
    the e2e test there.)"""
    import numpy as np
    import ray

    from raydistill.methods import get_method
    from raydistill.runtime.engine.learner_group import LearnerGroup
    from raydistill.runtime.teachers.pipeline import build_training_data
    from tests.distill_fixtures import expected_batches

    cfg = preflight(job_config(tiny_bert, tiny_teacher, workspace, "two-workers").with_overrides([
        "resources.learner.num_learners=2", "resources.learner.num_cpus=0.5", "train.epochs=4", "train.max_steps=null",
        "train.checkpoint_every=2", "train.eval_every=100", "tracking.enabled=false"]))
    data = build_training_data(cfg)
    group = LearnerGroup(cfg, get_method("congen"), run_dir=cfg.resolved_run_dir(), teacher_dim=data.teacher_dim)
    total = group.total_steps(data)
    assert total == 20  # 10 batches an epoch, 2 per step, 4 epochs
    workers: list[int] = []
    queues: list[list] = []
    killed: dict[str, int] = {}

    def kill_the_queue_after_step_3(kind, info, step) -> None:
        if kind == "start":
            workers.append(int(info["pid"]))
            queues.append(list(info["queue_actors"]))
        elif kind == "step" and step >= 3 and not killed:
            assert len(queues[-1]) == 1
            ray.kill(queues[-1][0])
            killed["after_step"] = step

    summary = group.fit(data, on_event=kill_the_queue_after_step_3)
    assert killed, "the queue actor was never killed"
    assert summary["restarts"] == 1 and len(workers) == 2 and workers[0] != workers[1]
    assert queues[1][0] != queues[0][0], "the restarted workers were handed the dead queue actor"
    assert summary["resumed_from"] is not None and summary["resumed_from"] % 2 == 0 and summary["resumed_from"] > 0
    assert summary["steps"] == total
    crcs = summary["weights_crc_by_rank"]
    assert len(crcs) == 2 and crcs[0] == crcs[1], "DDP left the workers with different weights"
    history = [row for row in summary["history"] if "loss" in row]
    assert [row["step"] for row in history] == list(range(1, total + 1))
    for rank in range(2):
        assert [row["batch_crc32_by_rank"][rank] for row in history] == expected_batches(cfg, learners=2, rank=rank)

    # The final checkpoint's queue (rank 0's mirror, K = 64: the last two steps' 2 x 16 rows) holds the teacher
    # vectors of one of rank 1's last two batches; a private queue would hold none of rank 1's. (Rank 1's push of
    # the very last step may still be on its way to the queue actor when rank 0 saves.)
    _, state = ckpt.load_checkpoint(ckpt.latest_checkpoint(cfg.resolved_run_dir()))
    queue = state["loss"]["queue.embeddings"].numpy()  # [K, D]
    queue = queue / np.maximum(np.linalg.norm(queue, axis=1, keepdims=True), 1e-12)
    order = data.epoch_order(cfg.train.epochs - 1)

    def in_queue(batch: int) -> bool:
        vectors = data.rows(order[batch * BATCH:(batch + 1) * BATCH])["teacher_control"]  # [16, D]
        vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        return bool(np.all((vectors @ queue.T).max(axis=1) > 0.999))

    # Batches 7 and 9 of the last epoch: rank 1's batches of its last two steps (batch b goes to rank b mod 2).
    assert in_queue(7) or in_queue(9), "none of rank 1's last teacher vectors are in rank 0's queue"
