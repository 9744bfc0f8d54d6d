"""Tracker against a real sqlite MLflow store, read back with MlflowClient; broken stores never raise."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from raydistill.config.job import TrackingConfig
from raydistill.evaluation.plots import plot_dev_scatter, plot_learning_curve
from raydistill.runtime.engine.tracking import Tracker, flatten_params, resolve_tracking_uri

pytest_plugins = ["tests.reliability_log"]


def _fake_training_step(step: int) -> float:
    # Stands in for "the training code that must keep going": a real computation whose result we check.
    return float(np.exp(-step / 10))


@pytest.fixture(scope="module")
def mlflow_dir(tmp_path_factory):
    # One store for the module: creating an MLflow sqlite database (schema migrations) takes ~4 s.
    return tmp_path_factory.mktemp("mlflow")


def test_tracker_writes_params_metrics_artifacts_and_children(tmp_path, mlflow_dir):
    from mlflow import MlflowClient

    uri = f"sqlite:///{mlflow_dir}/mlflow.db"
    cfg = TrackingConfig(tracking_uri=uri, experiment="raydistill-test")
    history = []
    with Tracker(cfg, run_name="parent", tags={"method": "congen"}) as tracker:
        assert tracker.active, tracker.failed_reason
        tracker.log_params({"train": {"lr": 1e-4, "batch_size": 64}, "student": "bert-tiny", "teacher": None})
        for step in range(1, 4):
            loss = _fake_training_step(step)
            history.append({"step": step, "loss": loss})
            tracker.log_metrics({"loss": loss, "lr": 1e-4 * step, "note": "ignored"}, step=step)
        history.append({"step": 3, "stsb_dev": 71.5})
        curve = plot_learning_curve(history, tmp_path / "plots" / "learning_curve.png")
        scatter = plot_dev_scatter([0.0, 1.0, 2.5, 4.0, 5.0], [0.1, 0.3, 0.5, 0.7, 0.9], tmp_path / "plots" / "dev.png")
        tracker.log_artifact(curve)
        tracker.log_artifacts(tmp_path / "plots", artifact_path="plots")
        with tracker.child("stage-2") as child:
            child.log_metrics({"stsb_dev": 70.25}, step=5)
        parent_id, child_id = tracker.run_id, child.run_id

    client = MlflowClient(tracking_uri=uri)
    parent = client.get_run(parent_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.params == {"train.lr": "0.0001", "train.batch_size": "64", "student": "bert-tiny",
                                  "teacher": ""}
    assert parent.data.tags["method"] == "congen"
    losses = client.get_metric_history(parent_id, "loss")
    assert [(m.step, m.value) for m in losses] == [(s, pytest.approx(_fake_training_step(s))) for s in (1, 2, 3)]
    assert "note" not in parent.data.metrics
    artifacts = {a.path for a in client.list_artifacts(parent_id)}
    assert {"learning_curve.png", "plots"} <= artifacts
    assert {a.path for a in client.list_artifacts(parent_id, "plots")} == {"plots/learning_curve.png", "plots/dev.png"}
    # artifacts sit beside the database, not in the current directory
    assert (mlflow_dir / "mlartifacts").is_dir()
    assert scatter.stat().st_size > 1000

    child_run = client.get_run(child_id)
    assert child_run.data.tags["mlflow.parentRunId"] == parent_id
    assert child_run.data.metrics == {"stsb_dev": 70.25}
    assert child_run.info.experiment_id == parent.info.experiment_id


def test_failed_run_is_marked_failed(mlflow_dir):
    from mlflow import MlflowClient

    uri = f"sqlite:///{mlflow_dir}/mlflow.db"
    with pytest.raises(RuntimeError, match="boom"):
        with Tracker(TrackingConfig(tracking_uri=uri), run_name="crash") as tracker:
            raise RuntimeError("boom")
    assert MlflowClient(tracking_uri=uri).get_run(tracker.run_id).info.status == "FAILED"


def test_a_job_rerun_in_its_run_dir_continues_its_mlflow_run(tmp_path, mlflow_dir):
    """A job's run dir records its MLflow run: a resumed job logs into the same run (one run for one training);
    another store, or a run deleted by hand, gets a new run."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{mlflow_dir}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    with Tracker(TrackingConfig(tracking_uri=uri), run_name="job", run_dir=tmp_path) as first:
        first.log_metrics({"loss": 1.0}, step=1)
    with Tracker(TrackingConfig(tracking_uri=uri), run_name="job", run_dir=tmp_path) as again:
        again.log_metrics({"loss": 0.5}, step=2)
    assert again.run_id == first.run_id
    assert [m.step for m in client.get_metric_history(first.run_id, "loss")] == [1, 2]
    assert client.get_run(first.run_id).info.status == "FINISHED"
    client.delete_run(first.run_id)
    with Tracker(TrackingConfig(tracking_uri=uri), run_name="job", run_dir=tmp_path) as after_delete:
        pass
    assert after_delete.run_id not in (None, first.run_id)
    with Tracker(TrackingConfig(tracking_uri=f"sqlite:///{tmp_path}/other.db"), run_dir=tmp_path) as other:
        pass
    assert other.run_id not in (None, first.run_id, after_delete.run_id)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the socket is: nothing listens there


@pytest.mark.parametrize("kind", ["sqlite-under-a-file", "sqlite-db-is-a-directory", "http-closed-port"])
def test_unusable_tracking_uri_warns_once_and_training_continues(kind, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    if kind == "sqlite-under-a-file":
        blocker = tmp_path / "not-a-directory"
        blocker.write_text("x")
        uri = f"sqlite:///{blocker}/mlflow.db"
    elif kind == "sqlite-db-is-a-directory":
        (tmp_path / "mlflow.db").mkdir()
        uri = f"sqlite:///{tmp_path}/mlflow.db"
    else:
        uri = f"http://127.0.0.1:{_closed_port()}"
    started = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="raydistill.runtime.engine.tracking"):
        tracker = Tracker(TrackingConfig(tracking_uri=uri), run_name="broken")
        losses = []
        for step in range(5):
            losses.append(_fake_training_step(step))
            tracker.log_metrics({"loss": losses[-1]}, step=step)
        tracker.log_params({"lr": 1e-4})
        tracker.log_artifact(tmp_path)
        child = tracker.child("stage-2")
        child.log_metrics({"x": 1.0})
        tracker.end()
    assert losses == [_fake_training_step(s) for s in range(5)]  # the "training" ran to the end
    assert not tracker.active and tracker.run_id is None and tracker.failed_reason
    warnings = [r for r in caplog.records if "tracking disabled" in r.getMessage()]
    assert len(warnings) == 1 and uri in warnings[0].getMessage()
    assert tracker.lost_metrics == 5 and any("lost 5 metric value(s)" in r.getMessage() for r in caplog.records)
    assert time.perf_counter() - started < 10  # MLflow's own retries would take ~100 s


def test_disabled_tracker_is_a_noop(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tracker = Tracker(TrackingConfig(enabled=False), run_name="off")
    tracker.log_metrics({"loss": 1.0}, step=1)
    tracker.end()
    assert not tracker.active and not (tmp_path / "mlflow.db").exists()


def test_uri_resolution(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert resolve_tracking_uri(None) == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    assert resolve_tracking_uri("sqlite:///sub/x.db") == f"sqlite:///{tmp_path.resolve()}/sub/x.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.internal:5000")
    assert resolve_tracking_uri(None) == "http://mlflow.internal:5000"
    assert resolve_tracking_uri("sqlite:////abs/m.db") == "sqlite:////abs/m.db"  # the config wins over the env


def test_flatten_params_truncates_long_values():
    flat = flatten_params({"a": {"b": 1, "c": {"d": [1, 2]}}, "long": "x" * 7000, "empty": {}})
    assert flat["a.b"] == "1" and flat["a.c.d"] == "[1, 2]" and flat["empty"] == "{}"
    assert len(flat["long"]) == 6000 and flat["long"].endswith("...")


def test_experiments_are_marked_as_model_training(mlflow_dir):
    """MLflow 3's UI opens an experiment without a kind on its GenAI pages (Traces, Token usage), where no training
    run shows; raydistill's experiments say they hold model training, new ones at creation and older ones (made
    before the tag, or by hand) when raydistill next logs a run into them."""
    from mlflow import MlflowClient

    from raydistill.runtime.engine.tracking import EXPERIMENT_KIND_TAG, TRAINING_EXPERIMENT_KIND

    uri = f"sqlite:///{mlflow_dir}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    with Tracker(TrackingConfig(tracking_uri=uri, experiment="raydistill-kind-new")) as tracker:
        assert tracker.active, tracker.failed_reason
    created = client.get_experiment_by_name("raydistill-kind-new")
    assert created.tags[EXPERIMENT_KIND_TAG] == TRAINING_EXPERIMENT_KIND == "custom_model_development"

    older = client.create_experiment("raydistill-kind-older")  # as an earlier raydistill left it: no kind
    with Tracker(TrackingConfig(tracking_uri=uri, experiment="raydistill-kind-older")) as tracker:
        assert tracker.active, tracker.failed_reason
    assert client.get_experiment(older).tags[EXPERIMENT_KIND_TAG] == TRAINING_EXPERIMENT_KIND

    chosen = client.create_experiment("raydistill-kind-chosen", tags={EXPERIMENT_KIND_TAG: "genai_development"})
    with Tracker(TrackingConfig(tracking_uri=uri, experiment="raydistill-kind-chosen")) as tracker:
        assert tracker.active, tracker.failed_reason
    assert client.get_experiment(chosen).tags[EXPERIMENT_KIND_TAG] == "genai_development"  # a user's choice stays


def test_raydistill_ui_prints_the_training_runs_link_of_each_experiment(mlflow_dir, capsys):
    """MLflow 3.17's UI ignores the kind tag when it picks a landing page (a browser-global GenAI / "Model training"
    switch decides, GenAI by default); its ``workflowType`` URL parameter opens the runs table whatever the switch
    says, so that is the link ``raydistill ui`` prints."""
    from mlflow import MlflowClient

    from raydistill.cli import main
    from raydistill.runtime.engine.tracking import training_runs_url

    uri = f"sqlite:///{mlflow_dir}/mlflow.db"
    with Tracker(TrackingConfig(tracking_uri=uri, experiment="raydistill-ui")) as tracker:
        assert tracker.active, tracker.failed_reason
    experiment = MlflowClient(tracking_uri=uri).get_experiment_by_name("raydistill-ui")
    assert main(["ui", "--store", uri, "--port", "5077", "--no-serve"]) == 0
    link = training_runs_url("http://127.0.0.1:5077", experiment.experiment_id)
    assert link == f"http://127.0.0.1:5077/#/experiments/{experiment.experiment_id}?workflowType=machine_learning"
    assert f"raydistill-ui: {link}" in capsys.readouterr().out


# Another process holds an exclusive transaction on the store (as a trial does while MLflow migrates or writes) for
# a little longer than one attempt waits for it (the sqlite probe's 5 s): the first attempt meets a real "database
# is locked".
HOLD_EXCLUSIVE = """
import sqlite3, sys, time
connection = sqlite3.connect(sys.argv[1], isolation_level=None)
connection.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
connection.execute("COMMIT")
"""


def test_a_locked_sqlite_store_is_retried_and_nothing_is_lost(mlflow_dir, caplog, reliability):
    from mlflow import MlflowClient

    uri = f"sqlite:///{mlflow_dir}/mlflow.db"
    cfg = TrackingConfig(tracking_uri=uri, experiment="raydistill-locked")
    with Tracker(cfg, run_name="creates-the-store") as first:
        assert first.active, first.failed_reason
    holder = subprocess.Popen([sys.executable, "-c", HOLD_EXCLUSIVE, str(mlflow_dir / "mlflow.db"), "5.5"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with caplog.at_level(logging.WARNING, logger="raydistill.runtime.engine.tracking"):
            tracker = Tracker(cfg, run_name="while-locked")
            for step in range(1, 4):
                tracker.log_metrics({"loss": _fake_training_step(step)}, step=step)
            tracker.end()
    finally:
        holder.wait(timeout=60)
    retried = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
    logged = ([m.value for m in MlflowClient(tracking_uri=uri).get_metric_history(tracker.run_id, "loss")]
              if tracker.run_id else [])
    reliability.record("fault", "tracking-retries",
                       input="MLflow sqlite store held in an exclusive transaction by another process for 5.5 s "
                             "while a run starts and logs metrics",
                       did=f"retried {tracker.retries} time(s) with back-off, then logged the run "
                           f"({len(logged)} of 3 metric values); tracking stayed on",
                       message=retried[0] if retried else "", lost=f"{tracker.lost_metrics} metric values")
    assert tracker.active is False and tracker.failed_reason is None, tracker.failed_reason
    assert tracker.retries >= 1 and "database is locked" in retried[0]
    assert logged == [pytest.approx(_fake_training_step(s)) for s in (1, 2, 3)] and tracker.lost_metrics == 0
