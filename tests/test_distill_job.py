"""End to end: a tiny ConGen job under local Ray, MLflow and the teacher cache; then two Ray Train workers sharing
one queue actor, which is killed.

Tiny random models (2 layers) keep each run to seconds of compute; everything else is the real thing: Ray Data
teacher pool, embedding cache, a Ray Train worker streaming the rows, checkpoints, the 7-STS evaluation, the result
schema and MLflow. The job checked here is the shared reference run of tests/distill_fixtures.py, the session's
first job in its workspace: the determinism and fault tests compare their runs with the same one.

A second job that finds every teacher vector cached is tests/test_determinism.py's run of the same job again; a
killed Train worker is tests/test_faults.py's SIGKILL test.
"""

from __future__ import annotations

import pytest

from raydistill.runtime.engine import checkpoint as ckpt
from raydistill.runtime.engine.preflight import preflight
from tests import distill_fixtures, ray_fixtures
from tests.distill_fixtures import BATCH, EVAL_EVERY, ROWS, STEPS, quick_train_polls

# The shared fixtures, seen by this module's tests (distill_runs asks for the other two).
distill_runs, teacher_dir, ray_session = distill_fixtures.distill_runs, distill_fixtures.teacher_dir, \
    ray_fixtures.ray_session
pytestmark = pytest.mark.ray


def test_congen_job_writes_result_tracks_mlflow_and_caches_the_teacher(distill_runs):
    from mlflow import MlflowClient

    from raydistill.evaluation import validate_result_file

    reference = distill_runs.reference()
    record = reference.record
    result_path = distill_runs.result_path(reference.run_dir.name)

    assert record["result_path"] == str(result_path)
    validate_result_file(str(result_path))
    assert record["kind"] == "distill" and record["method"] == "congen"
    assert set(record["scores"]) >= {"sts12", "sickr", "avg", "stsb_dev"}
    training = record["training"]
    assert training["steps"] == STEPS and training["sentences"] == ROWS
    assert training["views"] == {"control": "none", "generalize": "pair"}
    assert 0 < training["best_step"] <= STEPS
    # Two epochs, one teacher pass: every sentence went through the teacher exactly once.
    assert training["teacher_cache"] == {"hits": 0, "misses": ROWS, "teacher_forward_sentences": ROWS}
    assert (reference.run_dir / "best" / "modules.json").is_file()
    assert record["params_m"] > 0 and record["wall_s"] > 0
    assert f"step {STEPS}/{STEPS}" in reference.out and "sent/s" in reference.out and "ETA" in reference.out

    client = MlflowClient(tracking_uri=distill_runs.tracking_uri)
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
    assert len(client.get_metric_history(run.info.run_id, "stsb_dev")) == STEPS // EVAL_EVERY
    # the best model is an MLflow model of the run (tests/test_model_registry.py), not plain artifacts
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"plots", result_path.name} <= artifacts and "model" not in artifacts
    plots = {a.path for a in client.list_artifacts(run.info.run_id, "plots")}
    assert plots == {"plots/learning_curve.png", "plots/stsb_dev_scatter.png"}


def test_two_train_workers_stay_identical_share_the_queue_and_resume_after_the_queue_actor_dies(
        distill_runs, one_thread):
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

    distill_runs.reference()  # its teacher pass fills the cache this job's data reads
    cfg = preflight(distill_runs.config("two-workers", learners=2).with_overrides([
        "train.checkpoint_every=2", "train.eval_every=100"]))
    data = build_training_data(cfg)
    assert data.cache_stats["misses"] == 0
    group = LearnerGroup(cfg, get_method("congen"), run_dir=cfg.resolved_run_dir(), teacher_dim=data.teacher_dim)
    total = group.total_steps(data)
    assert total == STEPS // 2  # 10 batches an epoch, 2 per step, 2 epochs
    workers: list[int] = []
    queues: list[list] = []
    killed: dict[str, int] = {}

    def kill_the_queue_after_step_3(kind, info, step) -> None:
        if kind == "start":
            workers.append(int(info["pid"]))
            queues.append(list(info["shared_actors"]))
        elif kind == "step" and step >= 3 and not killed:
            assert len(queues[-1]) == 1
            ray.kill(queues[-1][0])
            killed["after_step"] = step

    with quick_train_polls():
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
