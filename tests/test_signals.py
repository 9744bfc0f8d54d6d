"""SIGTERM and SIGINT (Ctrl-C) to the jobs, for real: a job stops where it stands, keeps what it did, says how to
resume, and the same command continues from there.

Each case runs the real job in its own process (joined to the session's Ray, as under ``ray job submit``) with tiny
random models, and sends the signal once a progress line (or a cache file) shows the job is in the phase under test.
The Trans-Encoder job runs once for the module (stopped, then run again to its end); the damaged-state test damages a
copy of that finished run, so it pays only for its own rerun.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.distill_fixtures import congen_config, teacher_dir  # noqa: F401 - teacher_dir is a fixture
from tests.ray_fixtures import ray_session  # noqa: F401 - the session-wide Ray fixture
from tests.test_mutual_tenc import tiny_config

pytest_plugins = ["tests.reliability_log"]

ROOT = Path(__file__).resolve().parents[1]


def job_env() -> dict[str, str]:
    import ray

    return {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address, "PYTHONUNBUFFERED": "1"}


def start_and_signal(command: list[str], log: Path, ready, signum: int, timeout_s: float = 300) -> tuple[int, str]:
    """Run ``command``, send ``signum`` once ``ready(output so far)`` is true, wait; (exit status, output)."""
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=job_env(), cwd=ROOT)
        deadline = time.time() + timeout_s
        while not ready(log.read_text()) and process.poll() is None and time.time() < deadline:
            time.sleep(0.02)
        process.send_signal(signum)
        status = process.wait(timeout=180)
    return status, log.read_text()


# ----------------------------------------------------------------------------------------------------------------
# The handlers themselves (in this process: no job)


def test_a_signal_outside_a_step_loop_stops_at_once_and_inside_one_only_asks(capsys):
    """SIGINT outside ``step_boundaries`` raises ``JobStopped`` where the job stands; inside, it only sets the flag
    that the step loop checks; a second signal is only reported. Exit status: 128 + the signal."""
    from raydistill.runtime.engine import stopping

    before = signal.getsignal(signal.SIGINT)  # SIG_IGN where the suite runs in the background (nohup, CI)
    handlers = stopping.StopOnSignals("test").install()
    try:
        with pytest.raises(stopping.JobStopped, match=r"stop requested \(SIGINT\)"):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the handler raises here, at once
        assert stopping.exit_status() == 130
        stopping.clear_stop_request()
        with stopping.step_boundaries():
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
        assert stopping.stop_requested() and stopping.exit_status() == 143
        with pytest.raises(stopping.JobStopped, match=r"stop requested \(SIGTERM\) before stage 2"):
            stopping.raise_if_stop_requested("before stage 2")
    finally:
        handlers.restore()
    assert not stopping.stop_requested() and signal.getsignal(signal.SIGINT) is before
    out = capsys.readouterr().out
    assert "SIGTERM received: stopping at the next step boundary" in out and "SIGTERM received again" in out


# ----------------------------------------------------------------------------------------------------------------
# The teacher pass of a distillation job


# Rows per teacher-cache part (and per Ray Data block and teacher call) in the test's job: a small corpus still
# makes many parts, so the pass is stopped with most of it still to encode.
ROWS_PER_PART = 128

# The distillation job without its evaluation.
SMALL_PARTS_DRIVER = f"""\
import functools, sys
from raydistill.runtime.teachers import embedding_cache
from raydistill.runtime.jobs.distill import run_distillation
from raydistill.runtime.entry import distill_job_main

embedding_cache._APPEND_EVERY_ROWS = embedding_cache._ROWS_PER_BLOCK = embedding_cache._ROWS_PER_TEACHER_CALL = \\
    {ROWS_PER_PART}
distill_job_main("distill", None, sys.argv[1:], runner=functools.partial(run_distillation, evaluate=False))
"""


def cached_rows(cache_dir: Path) -> int:
    return sum(len(np.load(part, mmap_mode="r")) for part in cache_dir.glob("*/part-*.npy"))


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_sigterm_during_the_teacher_pass_keeps_the_encoded_rows(teacher_dir, tiny_bert, tmp_path,  # noqa: F811
                                                                reliability):
    """SIGTERM while the teacher encodes the corpus: the rows encoded so far go to the cache, the job exits 143
    saying how to resume, and the same command sends only the rest through the teacher (that rerun is stopped too,
    once its teacher-cache line is out: its training is not under test, and starting Ray Train would double the
    test's time)."""
    from raydistill.data import load_dataset

    captions = list(dict.fromkeys(c for group in load_dataset("flickr_captions") for c in group.captions))[:2048]
    corpus = tmp_path / "captions.txt"
    corpus.write_text("\n".join(captions) + "\n", encoding="utf-8")
    config = congen_config(tiny_bert, teacher_dir, tmp_path, "run", corpus=corpus)
    config["data"] = {**config["data"], "views": {"control": "none", "generalize": "none"}, "max_sentences": None}
    config["train"] = {**config["train"], "max_steps": 2, "eval_every": 100, "checkpoint_every": 100}
    (tmp_path / "job.yaml").write_text(json.dumps(config))
    script = tmp_path / "driver.py"
    script.write_text(SMALL_PARTS_DRIVER)
    command = [sys.executable, str(script), "--config", str(tmp_path / "job.yaml")]
    cache_dir = tmp_path / "embeddings"

    # The first cache part (every 128 rows) shows the pass under way with most of the corpus still to encode.
    status, first = start_and_signal(command, tmp_path / "first.log", lambda _: any(cache_dir.glob("*/part-*.npy")),
                                     signal.SIGTERM)
    kept = cached_rows(cache_dir)
    second_status, second = start_and_signal(command, tmp_path / "second.log",
                                             lambda out: "teacher cache: " in out, signal.SIGTERM)
    counts = re.search(r"teacher cache: (\d+) hits, (\d+) misses, (\d+) sentences through the teacher", second)
    hits, misses, forward = (int(x) for x in counts.groups()) if counts else (None, None, None)
    stop_line = next((line for line in first.splitlines() if "stop requested (SIGTERM)" in line), "")
    reliability.record(
        "fault", "sigterm-teacher-pass",
        input=f"SIGTERM to a ConGen job's driver during its teacher pass ({hits and hits + misses} sentences), once "
              f"the first cache part ({ROWS_PER_PART} rows) was written; then the same command",
        did=f"exit status {status}; the {kept} rows encoded so far were in the teacher cache; the second run found "
            f"{hits} cached and sent {forward} sentences through the teacher (then was stopped: exit status "
            f"{second_status})",
        message=stop_line.strip(), lost=f"{(forward or 0) - (misses or 0)} sentences encoded twice",
        exit_status=status, kept_rows=kept, hits=hits, misses=misses, teacher_forward_sentences=forward)
    assert status == 143, first[-3000:]
    assert "teacher pass" in stop_line and "to resume" in stop_line, first[-3000:]
    assert "Traceback" not in first and "[congen] step " not in first  # stopped in the pass, not at training
    assert second_status == 143 and "Traceback" not in second, second[-3000:]
    assert 0 < kept == hits < hits + misses  # stopped mid-pass, and everything it encoded was kept
    assert forward == misses  # the rest only


# ----------------------------------------------------------------------------------------------------------------
# The Trans-Encoder job


TENC_STEPS = 40  # of the cross2bi stage: 20 batches of 4 pairs an epoch, 2 epochs
SIGNAL_AT = 5  # the step whose dev line (eval_every) shows both learners training the stage


def stop_test_config(tiny_models: dict[str, Path], root: Path, tracking_uri: str | None = None):
    """Two families, one cycle: bi2cross 2 steps, cross2bi ``TENC_STEPS`` steps with a dev line every ``SIGNAL_AT``."""
    return tiny_config(
        tiny_models, root, pairs={"source": "inductive", "max_pairs": 80, "seed": 7},
        bi={"batch_size": 4, "lr": 1e-3, "epochs": 2, "max_steps": TENC_STEPS, "max_length": 16,
            "eval_every": SIGNAL_AT, "warmup_ratio": 0.0},
        cross={"batch_size": 8, "lr": 1e-3, "epochs": 1, "max_steps": 2, "max_length": 16, "eval_every": 1000},
        tracking={"enabled": True, "tracking_uri": tracking_uri, "experiment": "tenc-stop"} if tracking_uri
        else {"enabled": False})


@dataclass
class StoppedThenResumed:
    """What ``jobs/mutual_tenc.py`` did when SIGTERMed mid-stage, and what the same command did next."""

    run_dir: Path
    status: int  # exit status of the stopped job
    first: str  # its output
    state: dict  # state.json after the stop
    saved: dict[str, bool]  # family -> its stopped-stage file existed after the stop
    stopped_at: dict[str, int]  # family -> the step its learner stopped after
    mlflow_statuses: list[str]  # of the job's parent MLflow runs, after the stop
    second: subprocess.CompletedProcess
    resumed_at: dict[str, int]  # family -> the step its learner resumed at
    final: dict  # state.json after the rerun
    saved_after: dict[str, bool]  # family -> its stopped-stage file still existed after the rerun


@pytest.fixture(scope="module")
def tenc_stopped_then_resumed(tiny_models, tmp_path_factory, ray_session) -> StoppedThenResumed:  # noqa: F811
    """The job run, SIGTERMed once both learners are ``SIGNAL_AT`` steps into cross2bi, then run again to the end.
    Its finished run dir is also the run whose state.json ``test_a_damaged_state_file...`` damages (a copy)."""
    from mlflow import MlflowClient

    root = tmp_path_factory.mktemp("tenc-stop")
    tracking_uri = f"sqlite:///{root}/mlflow.db"
    (root / "job.yaml").write_text(json.dumps(stop_test_config(tiny_models, root, tracking_uri).to_dict()))
    command = [sys.executable, "jobs/mutual_tenc.py", "--config", str(root / "job.yaml")]
    run_dir = root / "run"
    dev_lines = [f"cross2bi {f}/bi] step {SIGNAL_AT}/{TENC_STEPS} dev" for f in ("bert", "mpnet")]

    status, first = start_and_signal(command, root / "first.log", lambda out: all(d in out for d in dev_lines),
                                     signal.SIGTERM)
    saved_files = {f: run_dir / "models" / "cycle=1" / "bi" / f"{f}.stopped.pt" for f in ("bert", "mpnet")}
    saved = {f: path.is_file() for f, path in saved_files.items()}
    stopped_at = {f: int(m) for f, m in re.findall(r"cross2bi (\w+)/bi\] stop requested: stopped after step (\d+)/",
                                                    first)}
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name("tenc-stop")
    parents = [run.info.status for run in client.search_runs([experiment.experiment_id])
               if "mlflow.parentRunId" not in run.data.tags] if experiment else []
    state = json.loads((run_dir / "state.json").read_text())
    second = subprocess.run(command, capture_output=True, text=True, env=job_env(), cwd=ROOT, timeout=400)
    return StoppedThenResumed(
        run_dir=run_dir, status=status, first=first, state=state, saved=saved, stopped_at=stopped_at,
        mlflow_statuses=parents, second=second,
        resumed_at={f: int(m) for f, m in re.findall(r"cross2bi (\w+)/bi\] resuming at step (\d+)/", second.stdout)},
        final=json.loads((run_dir / "state.json").read_text()),
        saved_after={f: path.exists() for f, path in saved_files.items()})


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_sigterm_mid_stage_stops_the_trans_encoder_job_and_the_rerun_continues_the_stage(tenc_stopped_then_resumed,
                                                                                       reliability):
    """SIGTERM to ``jobs/mutual_tenc.py`` while the cross2bi stage trains: each learner stops at its next step and
    saves the stage's position, the finished bi2cross stage stays recorded, MLflow ends KILLED, the job exits 143
    saying how to resume; the rerun skips bi2cross and continues cross2bi from the saved steps to the end."""
    job = tenc_stopped_then_resumed
    stage = job.final["stages"].get("cycle=1/stage=cross2bi", {}).get("families", {})
    trained = {f: s.get("steps") for f, s in stage.items()}
    stop_line = next((line for line in job.first.splitlines() if "stop requested (SIGTERM) while training" in line),
                     "")
    reliability.record(
        "fault", "sigterm-main-job",
        input=f"SIGTERM to python jobs/mutual_tenc.py (2 families, 1 cycle) once both bi-encoders were past step "
              f"{SIGNAL_AT} of the cross2bi stage's {TENC_STEPS}; then the same command",
        did=f"exit status {job.status}; each learner stopped at its next step ({job.stopped_at}) and saved model, "
            f"optimizer, schedule, RNG and data position; the finished bi2cross stage stayed recorded; the MLflow run "
            f"ended {job.mlflow_statuses}; the rerun skipped bi2cross and continued cross2bi at {job.resumed_at} to "
            f"{trained} steps",
        message=stop_line.strip(), lost="0 steps: the rerun continued each learner from the step it stopped at",
        exit_status=job.status, stopped_at=job.stopped_at, resumed_at=job.resumed_at)
    assert job.status == 143, job.first[-4000:]
    assert "to resume" in stop_line and "*** SIGTERM received ***" not in job.first and "Traceback" not in job.first
    assert set(job.state["stages"]) == {"cycle=1/stage=bi2cross"}
    assert set(job.stopped_at) == {"bert", "mpnet"} and all(
        SIGNAL_AT <= step < TENC_STEPS for step in job.stopped_at.values()), job.first[-4000:]
    assert job.saved == {"bert": True, "mpnet": True}
    assert job.mlflow_statuses == ["KILLED"]

    assert job.second.returncode == 0, job.second.stdout[-4000:] + job.second.stderr[-4000:]
    assert "1 completed stage(s) will be skipped" in job.second.stdout
    assert "bi2cross bert/cross] training on" not in job.second.stdout  # the finished stage is not trained again
    assert "cross2bi bert/bi] training on" not in job.second.stdout  # the stopped one is continued, not restarted
    assert job.resumed_at == job.stopped_at and trained == {"bert": TENC_STEPS, "mpnet": TENC_STEPS}
    assert {f: s["resumed_from"] for f, s in stage.items()} == job.stopped_at
    assert job.saved_after == {"bert": False, "mpnet": False}


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_a_damaged_state_file_is_rebuilt_from_the_finished_stages(tenc_stopped_then_resumed, tiny_models, tmp_path,
                                                                  capsys, reliability):
    """state.json cut short (a crash of an older writer, a full disk): the rerun rebuilds it from the stage records
    in the model directories, keeps every finished stage and says so, instead of asking to delete the run."""
    from raydistill.runtime.tenc import run_trans_encoder

    job = tenc_stopped_then_resumed
    assert job.second.returncode == 0, ("no finished run to damage: the SIGTERM test's job did not finish\n"
                                        + job.second.stdout[-3000:] + job.second.stderr[-3000:])
    run_dir = Path(shutil.copytree(job.run_dir, tmp_path / "run"))  # a copy of that finished run, damaged here
    cfg = stop_test_config(tiny_models, tmp_path)  # the same config (tracking is not part of it), this run dir
    before = json.loads((run_dir / "state.json").read_text())
    models = {p: p.stat().st_mtime_ns for p in (run_dir / "models" / "cycle=1").rglob("*")}
    damaged = (run_dir / "state.json").read_text()[:200]
    (run_dir / "state.json").write_text(damaged)
    capsys.readouterr()

    error = None
    try:
        run_trans_encoder(cfg)
    except Exception as exc:  # noqa: BLE001 - recorded, then asserted below
        error = exc
    out = capsys.readouterr().out
    after = json.loads((run_dir / "state.json").read_text())
    rebuilt_line = next((line for line in out.splitlines() if "rebuilt it from the finished stages" in line), "")
    kept = [key for key in before["stages"] if key in after["stages"] and all(
        after["stages"][key]["families"][f][field] == before["stages"][key]["families"][f][field]
        for f in ("bert", "mpnet") for field in ("best_dev", "steps", "fingerprint", "model_dir"))]
    reliability.record(
        "checkpoint", "state-files-durable",
        input="a Trans-Encoder run's state.json cut to its first 200 bytes after both stages of its cycle finished; "
              "then the same job",
        did=f"moved the damaged file aside and rebuilt state.json from each stage's stage.json in its model "
            f"directories: {len(kept)} of {len(before['stages'])} finished stage(s) kept, no model retrained"
        if error is None else f"failed: {error}",
        message=re.sub(r"damaged-\d+", "damaged-<time>", rebuilt_line.strip() or str(error)),
        lost="nothing trained: label sets and evaluations are redone",
        kept=kept)
    assert error is None, error
    assert "rebuilt it from the finished stages" in rebuilt_line and "2 finished stage(s) kept" in rebuilt_line
    assert kept == list(before["stages"]) == ["cycle=1/stage=bi2cross", "cycle=1/stage=cross2bi"]
    assert {p: p.stat().st_mtime_ns for p in (run_dir / "models" / "cycle=1").rglob("*")} == models
    assert list(run_dir.glob("state.json.damaged-*"))[0].read_text() == damaged
    assert after["stages"]["cycle=1/stage=cross2bi"]["families"]["bert"]["best_dev"] == \
        before["stages"]["cycle=1/stage=cross2bi"]["families"]["bert"]["best_dev"]
