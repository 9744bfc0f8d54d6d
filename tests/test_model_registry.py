"""Every job's best student as an MLflow model: logged with the sentence-transformers flavor, registered, served.

The unit tests log a tiny saved BiEncoder into a fresh sqlite store (no Ray). The job tests read the runs the suite
already makes: the shared ConGen reference job (tests/distill_fixtures.py, its MLflow store) and the shared mutual
Trans-Encoder run (tests/tenc_runs.py). The serving test registers the ConGen job's model, runs the serve command the
job printed (``mlflow models serve ... --env-manager local``, pointed at that version) from a shell whose PATH holds
no environment, on loopback, and compares the vectors it answers with the student's own ``encode``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from raydistill.config.job import TrackingConfig
from raydistill.runtime.engine.model_logging import (
    EXAMPLE_SENTENCES,
    REGISTER_KNOB,
    LoggedStudent,
    log_student,
    register_student,
)
from raydistill.runtime.engine.tracking import Tracker
from tests import distill_fixtures, ray_fixtures, tenc_runs

distill_runs, teacher_dir, ray_session = distill_fixtures.distill_runs, distill_fixtures.teacher_dir, \
    ray_fixtures.ray_session
mutual_run = tenc_runs.mutual_run

SENTENCES = ["A child is riding a red bicycle down the street.", "Stock markets fell sharply on Monday.",
             "The cat sleeps on the warm windowsill."]
# A served model must answer what the student computes; float32 through JSON keeps ~7 digits.
ATOL = 1e-5
SERVER_READY_S = 600  # a bound on a hung server, not a speed requirement: this 2-core box may be busy


@pytest.fixture(scope="module")
def student_dir(tmp_path_factory, tiny_bert) -> Path:
    """What a job leaves in ``run_dir/best``: a BiEncoder saved as a sentence-transformers directory."""
    from raydistill.models import BiEncoder

    out = tmp_path_factory.mktemp("student") / "best"
    BiEncoder.from_pretrained(str(tiny_bert)).save(out)
    return out


def _encode(model_dir: Path, sentences: list[str]) -> np.ndarray:
    from raydistill.models import BiEncoder

    model = BiEncoder.from_pretrained(str(model_dir))
    # sentence-transformers applies a saved Normalize module; BiEncoder only records it
    return model.encode(sentences, normalize=model.normalize_in_sentence_transformers)


def _model_files(client, model_id: str) -> Path:
    """The logged model's directory in a local artifact store."""
    from mlflow.utils.file_utils import local_file_uri_to_path

    return Path(local_file_uri_to_path(client.get_logged_model(model_id).artifact_location))


def _check_logged(client, model_id: str, run, dimension: int) -> dict:
    """A READY model of ``run``, in its experiment, with the signature, the input example and pinned requirements
    written; returns its MLmodel."""
    import yaml

    from mlflow.entities import LoggedModelStatus

    model = client.get_logged_model(model_id)
    assert model.status == LoggedModelStatus.READY, model.status
    assert model.source_run_id == run.info.run_id
    assert model.experiment_id == run.info.experiment_id  # not the default experiment
    files = _model_files(client, model_id)
    mlmodel = yaml.safe_load((files / "MLmodel").read_text())
    assert "sentence_transformers" in mlmodel["flavors"] and "python_function" in mlmodel["flavors"]
    assert json.loads(mlmodel["signature"]["inputs"]) == [{"type": "string", "required": True}]
    assert json.loads(mlmodel["signature"]["outputs"]) == [
        {"type": "tensor", "tensor-spec": {"dtype": "float32", "shape": [-1, dimension]}}]
    assert json.loads((files / "input_example.json").read_text()) == list(EXAMPLE_SENTENCES)
    assert json.loads((files / "serving_input_example.json").read_text()) == {"inputs": list(EXAMPLE_SENTENCES)}
    requirements = (files / "requirements.txt").read_text().split()
    for package in ("sentence-transformers", "transformers", "torch"):
        assert any(r.startswith(f"{package}==") for r in requirements), requirements
    assert not any("+" in r for r in requirements), requirements  # no local version label PyPI cannot resolve
    return mlmodel


def _predict(client, model_id: str, sentences: list[str]) -> np.ndarray:
    import mlflow.pyfunc

    return np.asarray(mlflow.pyfunc.load_model(str(_model_files(client, model_id))).predict(sentences))


# ----------------------------------------------------------------------------------------------------------------
# model_logging on a tiny student, no Ray


def test_a_student_is_logged_with_signature_and_example_and_registered_by_name(student_dir, tmp_path, monkeypatch,
                                                                               capfd, caplog):
    from mlflow import MlflowClient

    monkeypatch.chdir(tmp_path)  # where MLflow's defaults (./mlruns, ./mlflow.db) would land
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/elsewhere.db")  # not the job's store
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    expected = _encode(student_dir, SENTENCES)
    with Tracker(TrackingConfig(tracking_uri=uri, experiment="registry-test"), run_name="job") as tracker:
        assert tracker.active, tracker.failed_reason
        tracker.log_params({"lr": 1e-3})
        tracker.log_metrics({"test_avg": 61.5}, step=20)
        capfd.readouterr()
        with caplog.at_level(logging.WARNING):
            logged = tracker.log_model(student_dir, register="tiny-student", step=20, tags={"method": "congen"})
        err = capfd.readouterr().err
        assert tracker.active
    assert isinstance(logged, LoggedStudent) and logged.dimension == expected.shape[1]
    assert (logged.name, logged.version, logged.registered_uri) == ("tiny-student", 1, "models:/tiny-student/1")
    # Nothing a user cannot act on: no warning, no per-file progress bars.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert "Loading weights" not in err and "Writing model shards" not in err, err
    # The job's store only, and the process's MLflow settings as they were.
    assert os.environ["MLFLOW_TRACKING_URI"] == f"sqlite:///{tmp_path}/elsewhere.db"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]

    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(tracker.run_id)
    _check_logged(client, logged.model_id, run, expected.shape[1])
    assert [o.model_id for o in run.outputs.model_outputs] == [logged.model_id]
    model = client.get_logged_model(logged.model_id)
    assert model.tags["method"] == "congen" and model.params == {"lr": "0.001"}  # the run's params
    assert {m.key: m.value for m in model.metrics} == {"test_avg": 61.5}  # the metrics of its step
    version = client.get_model_version("tiny-student", "1")
    assert version.run_id == run.info.run_id and version.source == logged.model_uri
    np.testing.assert_allclose(_predict(client, logged.model_id, SENTENCES), expected, atol=ATOL)

    # Registering the same name again adds a version; log_student(register=...) does both steps.
    again = log_student(student_dir, tracking_uri=uri, run_id=run.info.run_id, register="tiny-student")
    assert again.version == 2 and again.model_id != logged.model_id
    assert register_student(uri, again, "other-name").registered_uri == "models:/other-name/1"


def test_a_directory_mlflow_cannot_load_as_a_model_warns_and_is_kept_as_artifacts(tmp_path, caplog):
    from mlflow import MlflowClient

    broken = tmp_path / "best"
    broken.mkdir()
    (broken / "modules.json").write_text("not json")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    with Tracker(TrackingConfig(tracking_uri=uri, experiment="registry-test"), run_name="job") as tracker:
        with caplog.at_level(logging.WARNING):
            assert tracker.log_model(broken, register="never") is None
        assert tracker.active  # the rest of the run is still tracked
        tracker.log_metrics({"after": 1.0})
    warnings_seen = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings_seen) == 1 and "log_model model failed at " + uri in warnings_seen[0], warnings_seen
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(tracker.run_id)
    assert run.info.status == "FINISHED" and run.data.metrics == {"after": 1.0}
    assert {a.path for a in client.list_artifacts(run.info.run_id, "model")} == {"model/modules.json"}
    assert client.search_registered_models() == []


# ----------------------------------------------------------------------------------------------------------------
# The knob and --register


def test_register_flag_sets_the_knob_of_every_training_job(tmp_path, capsys):
    from raydistill.config.job import ConfigError, JobConfig
    from raydistill.runtime.entry import JOBS, distill_job_main, run_job
    from raydistill.shipped import resolve_config

    assert REGISTER_KNOB == "tracking.register_model"
    assert JobConfig.from_yaml(resolve_config("congen")).tracking.register_model is None
    seen = {}

    def runner(cfg, results_dir):
        seen["cfg"] = cfg
        return {"result_path": "-"}

    # Quoted on the way in: a name YAML would read as a number or null stays the name.
    for name in ("my-encoder", "2024", "null"):
        distill_job_main("congen", None, ["--register", name], runner=runner)
        assert seen["cfg"].tracking.register_model == name
    for job in JOBS:
        if job == "teacher_pass":
            continue  # trains nothing
        with pytest.raises(SystemExit) as exit_info:
            run_job(job, ["--help"])
        assert exit_info.value.code == 0
        assert "--register NAME" in capsys.readouterr().out, job
    with pytest.raises(SystemExit) as exit_info:
        distill_job_main("congen", None, ["--register", "a/b"], runner=runner)
    assert exit_info.value.code == 2
    assert "tracking.register_model" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="register_model"):
        JobConfig.from_yaml(resolve_config("congen"), ["tracking.enabled=false", "tracking.register_model=x"])


# ----------------------------------------------------------------------------------------------------------------
# The jobs' models


@pytest.mark.ray
def test_trans_encoder_logs_each_familys_best_bi_encoder(mutual_run):
    from mlflow import MlflowClient

    summary = mutual_run.summary
    client = MlflowClient(tracking_uri=mutual_run.tracking_uri)
    run = client.get_run(summary["mlflow_run_id"])
    by_name = {client.get_logged_model(o.model_id).name: o for o in run.outputs.model_outputs}
    assert set(by_name) == {f"{family}-bi" for family in summary["families"]}
    for family in summary["families"]:
        best = summary["best"][family]["bi"]
        output = by_name[f"{family}-bi"]
        assert output.step == best["cycle"]
        expected = _encode(Path(best["model_dir"]), SENTENCES)
        _check_logged(client, output.model_id, run, expected.shape[1])
        np.testing.assert_allclose(_predict(client, output.model_id, SENTENCES), expected, atol=ATOL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, payload: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def _wait_until_serving(server: subprocess.Popen, url: str, log_path: Path) -> None:
    deadline = time.monotonic() + SERVER_READY_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"mlflow models serve exited with {server.returncode}:\n{log_path.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(url + "/ping", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    pytest.fail(f"mlflow models serve did not answer /ping in {SERVER_READY_S} s:\n{log_path.read_text()[-4000:]}")


@pytest.mark.ray
def test_the_distillation_jobs_model_is_registered_and_served_by_mlflow(distill_runs, tmp_path):
    from mlflow import MlflowClient

    reference = distill_runs.reference()
    best = reference.run_dir / "best"
    uri = distill_runs.tracking_uri
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(reference.record["mlflow_run_id"])
    (output,) = run.outputs.model_outputs
    assert output.step == distill_fixtures.STEPS  # linked to the final 7-STS
    expected = _encode(best, SENTENCES)
    _check_logged(client, output.model_id, run, expected.shape[1])
    assert "test_avg" in {m.key for m in client.get_logged_model(output.model_id).metrics}
    assert f"MLflow model model logged as models:/{output.model_id}" in reference.out

    name = f"congen-reference-{run.info.run_id[:8]}"
    logged = register_student(uri, LoggedStudent(f"models:/{output.model_id}", output.model_id, run.info.run_id,
                                                 expected.shape[1]), name)
    assert logged.registered_uri == f"models:/{name}/1"

    # The command the job printed, run as a user would from a fresh shell: no activated environment on PATH.
    printed = re.search(r"serve it with: (.+)$", reference.out, re.MULTILINE).group(1)
    command = printed.replace(f"models:/{output.model_id}", f"models:/{name}/1")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {key: value for key, value in os.environ.items() if key not in ("VIRTUAL_ENV", "MLFLOW_TRACKING_URI")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PATH="/usr/local/bin:/usr/bin:/bin")
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log_file:
        server = subprocess.Popen(["/bin/bash", "-c", f"{command} -h 127.0.0.1 -p {port}"], env=env,
                                  cwd=tmp_path, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_until_serving(server, url, log_path)
        answer = _post(url + "/invocations", {"inputs": SENTENCES})
    finally:
        # The server's workers are its children, in the session it leads: stop them all.
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
    served = np.asarray(answer["predictions"], dtype=np.float32)
    assert served.shape == expected.shape
    np.testing.assert_allclose(served, expected, atol=ATOL)
