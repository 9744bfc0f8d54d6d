"""End to end: a tiny ConGen job under local Ray, MLflow and the teacher cache; then a resumed, killed-and-restarted run.

Tiny random models (2 layers) keep each run to seconds of compute; everything else is the real thing: Ray Data
teacher pool, embedding cache, a Ray Train worker streaming the rows, checkpoints, the 7-STS evaluation, the result
schema and MLflow.
"""

from __future__ import annotations

import threading
import time

import pytest

from raydistill.runtime import checkpoint as ckpt
from raydistill.runtime.config import JobConfig
from raydistill.runtime.preflight import preflight
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
    from raydistill.runtime.distill import run_distillation

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


def test_second_job_hits_the_cache_and_survives_a_killed_learner(ray_session, tiny_bert, tiny_teacher, workspace):
    import os
    import signal

    from raydistill.runtime.distill import run_distillation

    cfg = job_config(tiny_bert, tiny_teacher, workspace, "second")
    run_dir = workspace["root"] / "second"
    killed: dict[str, object] = {}
    workers: list[int] = []

    def note_the_worker(event, info, step) -> None:
        if event == "start":
            workers.append(int(info["pid"]))

    def kill_learner_after_first_checkpoint() -> None:
        deadline = time.time() + 240
        while time.time() < deadline:
            if ckpt.list_checkpoints(run_dir) and workers:
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


def test_two_learners_average_gradients_and_share_the_teacher_queue(ray_session, tiny_bert, tiny_teacher, tmp_path):
    """Two learner actors on different batches: identical weights after every step (all-reduced gradients), and
    each learner's queue holds the other's teacher vectors too (a private queue would hold only its own)."""
    import numpy as np
    import ray

    from raydistill.models import BiEncoder
    from raydistill.methods import get_method
    from raydistill.runtime.learner import LearnerActor
    from raydistill.runtime.learner_group import make_shared_queues
    from tiny_models import load_real_sentences

    cfg = preflight(JobConfig.from_dict({
        "method": "ckd", "student": str(tiny_bert), "teacher": str(tiny_teacher), "run_dir": str(tmp_path),
        "train": {"batch_size": BATCH, "lr": 1e-3}, "loss": {"queue_size": 64},
        "resources": {"learner": {"num_learners": 2, "num_cpus": 0.5, "threads": 1}},
        "tracking": {"enabled": False},
    }))
    spec = get_method("ckd")
    sentences = np.array(load_real_sentences(n_captions=64, n_stsb=0)[:4 * BATCH], dtype=object)
    teacher_vectors = BiEncoder.from_pretrained(str(tiny_teacher)).encode(list(sentences), normalize=True)
    batches = [{"idx": np.arange(i, i + BATCH), "text_a": sentences[i:i + BATCH],
                "teacher_a": teacher_vectors[i:i + BATCH]} for i in range(0, len(sentences), BATCH)]

    queues = make_shared_queues(spec, cfg, teacher_dim=48)
    learners = [LearnerActor(cfg, rank=rank, world_size=2, total_steps=10, teacher_dim=48, run_dir=str(tmp_path),
                             queue_actors=queues) for rank in range(2)]
    try:
        address, port = ray.get(learners[0].address.remote(), timeout=120)
        assert ray.get([a.init_process_group.remote(address, port) for a in learners], timeout=120) == [True, True]
        for step in range(2):
            losses = ray.get([learners[rank].train_step.remote(batches[2 * step + rank]) for rank in range(2)],
                             timeout=120)
            assert losses[0]["loss"] != losses[1]["loss"]  # different data on each learner
        states = ray.get([a.state_dict.remote() for a in learners], timeout=120)
        for name, tensor in states[0]["student"].items():
            assert np.array_equal(tensor.numpy(), states[1]["student"][name].numpy()), name
        for state in states:
            assert int(state["loss"]["queue.filled"]) >= 3 * BATCH  # own 2 batches + at least one of the other's
    finally:
        for actor in learners + queues:
            ray.kill(actor)
