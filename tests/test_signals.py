"""SIGTERM and SIGINT (Ctrl-C) to the jobs, for real: a job stops where it stands, keeps what it did, says how to
resume, and the same command continues from there.

Each case runs the real job in its own process (joined to the session's Ray, as under ``ray job submit``) with tiny
random models, and sends the signal once a progress line (or a cache file) shows the job is in the phase under test;
what the stop kept is then resumed in this process. The Trans-Encoder job is the session's shared mutual config
(tests/tenc_runs.py): stopped mid-stage, then run again to its end, it must end as the shared uninterrupted run of
that config did. The damaged-state test damages a copy of that uninterrupted run.
"""

from __future__ import annotations

import contextlib
import io
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

import tests.distill_fixtures as distill_fixtures
import tests.tenc_runs as tenc_runs
from tests.distill_fixtures import congen_config
from tests.tenc_runs import MUTUAL_BI_STEPS, MUTUAL_EVAL_EVERY, mutual_config

from tests.ray_fixtures import ray_session  # noqa: F401,E402 - the session's Ray

pytest_plugins = ["tests.reliability_log"]  # the reliability rows
# fixtures here too: the session's tiny teacher, the shared mutual Trans-Encoder run
teacher_dir, mutual_run = distill_fixtures.teacher_dir, tenc_runs.mutual_run

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
def test_sigterm_during_the_teacher_pass_keeps_the_encoded_rows(teacher_dir, tiny_bert, tmp_path, monkeypatch,
                                                                reliability):
    """SIGTERM while the teacher encodes the corpus: the rows encoded so far go to the cache, the job exits 143
    saying how to resume, and the pass run again over the same corpus and cache sends only the rest through the
    teacher (in this process, with the job's config: the job's rerun adds a process and a pool-actor start, and what
    a rerun's pass does with a stopped pass's cache is tests/test_teacher_cache_safety.py's)."""
    from raydistill.config.job import JobConfig
    from raydistill.data import load_dataset
    from raydistill.data.corpus import read_corpus
    from raydistill.runtime.teachers import embedding_cache
    from raydistill.runtime.teachers.pipeline import cache_teacher_vectors

    captions = list(dict.fromkeys(c for group in load_dataset("flickr_captions") for c in group.captions))[:1024]
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
    texts = list(read_corpus(f"file:{corpus}").texts)  # what the job's pass encodes: the corpus less evaluation text
    for name in ("_APPEND_EVERY_ROWS", "_ROWS_PER_BLOCK", "_ROWS_PER_TEACHER_CALL"):
        monkeypatch.setattr(embedding_cache, name, ROWS_PER_PART)
    _, stats = cache_teacher_vectors(JobConfig.from_dict(config), {"control": texts}, in_process=True)
    hits, misses, forward = stats["hits"], stats["misses"], stats["teacher_forward_sentences"]
    stop_line = next((line for line in first.splitlines() if "stop requested (SIGTERM)" in line), "")
    reliability.record(
        "fault", "sigterm-teacher-pass",
        input=f"SIGTERM to a ConGen job's driver during its teacher pass ({len(texts)} sentences), once the first "
              f"cache part ({ROWS_PER_PART} rows) was written; then the teacher pass again with the job's config",
        did=f"exit status {status}; the {kept} rows encoded so far were in the teacher cache; the pass run again "
            f"found {hits} cached and sent {forward} sentences through the teacher",
        message=stop_line.strip(), lost=f"{forward - misses} sentences encoded twice",
        exit_status=status, kept_rows=kept, hits=hits, misses=misses, teacher_forward_sentences=forward)
    assert status == 143, first[-3000:]
    assert "teacher pass" in stop_line and "to resume" in stop_line, first[-3000:]
    assert "Traceback" not in first and "[congen] step " not in first  # stopped in the pass, not at training
    assert 0 < kept == hits < hits + misses == len(texts)  # stopped mid-pass, and everything it encoded was kept
    assert forward == misses  # the rest only


# ----------------------------------------------------------------------------------------------------------------
# The Trans-Encoder job


TENC_STEPS = MUTUAL_BI_STEPS  # of the cross2bi stage
SIGNAL_AT = MUTUAL_EVAL_EVERY  # the step whose dev line (eval_every) shows both learners training the stage
FAMILIES = ("bert", "mpnet")
# What a stage of the resumed run must share with the uninterrupted one: the stage's labels, its best model and score
SAME_AS_UNINTERRUPTED = ("labels_sha", "best_dev", "best_step", "steps", "fingerprint")


@dataclass
class StoppedThenResumed:
    """What ``jobs/mutual_tenc.py`` on the shared mutual config did when SIGTERMed mid-stage, and what the same job
    (in this process) did next."""

    run_dir: Path
    status: int  # exit status of the stopped job
    first: str  # its output
    state: dict  # state.json after the stop
    saved: dict[str, bool]  # family -> its stage's run dir held a checkpoint after the stop
    stopped_at: dict[str, int]  # family -> the step its learner stopped after
    mlflow_statuses: list[str]  # of the job's parent MLflow runs, after the stop
    mlflow_after: list[str]  # the same after the rerun (which continues the stopped run)
    bi2cross_files: dict[Path, int]  # the finished stage's model files (path -> mtime) after the stop
    second: str  # what the rerun printed
    second_error: BaseException | None  # what the rerun raised
    final: dict  # state.json after the rerun
    saved_after: dict[str, bool]  # family -> its stage's run dir still existed after the rerun


@pytest.fixture(scope="module")
def tenc_stopped_then_resumed(tiny_models, tmp_path_factory, ray_session, mutual_run) -> StoppedThenResumed:
    """The job run, SIGTERMed once both learners are ``SIGNAL_AT`` steps into cross2bi, then run again to the end.
    Its MLflow runs go to the shared run's store (an experiment of their own): a new store costs seconds to create."""
    from mlflow import MlflowClient

    from raydistill.runtime.tenc import TencConfig, run_trans_encoder

    root = tmp_path_factory.mktemp("tenc-stop")
    cfg = TencConfig.from_dict({**mutual_config(tiny_models, root).to_dict(), "tracking": {
        "enabled": True, "tracking_uri": mutual_run.tracking_uri, "experiment": "tenc-stop"}})
    (root / "job.yaml").write_text(json.dumps(cfg.to_dict()))
    command = [sys.executable, "jobs/mutual_tenc.py", "--config", str(root / "job.yaml")]
    run_dir = root / "run"
    # the engine's progress line of a dev evaluation: "[cycle 1 cross2bi bert/bi] step 5/40 (12%) ep 1/2 ... dev"
    dev_lines = [re.compile(rf"cross2bi {f}/bi\] step {SIGNAL_AT}/{TENC_STEPS} \(.* dev ") for f in FAMILIES]

    status, first = start_and_signal(command, root / "first.log",
                                     lambda out: all(d.search(out) for d in dev_lines), signal.SIGTERM)
    # the stage's engine run dir, with the checkpoint of the step boundary where each learner stopped
    saved_files = {f: run_dir / "training" / "cycle=1" / "bi" / f for f in FAMILIES}
    saved = {f: any(path.glob("checkpoints/step-*")) for f, path in saved_files.items()}
    stopped_at = {f: int(m) for f, m in re.findall(r"cross2bi (\w+)/bi\] stop requested: stopped after step (\d+)/",
                                                    first)}
    client = MlflowClient(cfg.tracking.tracking_uri)
    experiment = client.get_experiment_by_name(cfg.tracking.experiment)
    parents = [run.info.status for run in client.search_runs([experiment.experiment_id])
               if "mlflow.parentRunId" not in run.data.tags] if experiment else []
    state = json.loads((run_dir / "state.json").read_text())
    bi2cross_files = {p: p.stat().st_mtime_ns for p in (run_dir / "models" / "cycle=1" / "cross").rglob("*")}
    # The rerun in this process: what it continues is in the run dir; a second job process adds only its start.
    printed, error = io.StringIO(), None
    with contextlib.redirect_stdout(printed):
        try:
            run_trans_encoder(cfg)
        except Exception as exc:  # noqa: BLE001 - the tests report it
            error = exc
    after = [run.info.status for run in client.search_runs([experiment.experiment_id])
             if "mlflow.parentRunId" not in run.data.tags] if experiment else []
    return StoppedThenResumed(
        run_dir=run_dir, status=status, first=first, state=state, saved=saved, stopped_at=stopped_at,
        mlflow_statuses=parents, mlflow_after=after, bi2cross_files=bi2cross_files, second=printed.getvalue(), second_error=error,
        final=json.loads((run_dir / "state.json").read_text()),
        saved_after={f: path.exists() for f, path in saved_files.items()})


@pytest.mark.ray
def test_sigterm_mid_stage_stops_the_trans_encoder_job_and_the_rerun_continues_the_stage(tenc_stopped_then_resumed,
                                                                                       mutual_run, reliability):
    """SIGTERM to ``jobs/mutual_tenc.py`` while the cross2bi stage trains: each learner stops at its next step and
    saves the stage's position, the finished bi2cross stage stays recorded, MLflow ends KILLED, the job exits 143
    saying how to resume; the rerun skips bi2cross and continues cross2bi from the saved steps to the end, where
    both stages are what the uninterrupted run of the same config trained (same labels, best step and weights)."""
    job = tenc_stopped_then_resumed
    stage = job.final["stages"].get("cycle=1/stage=cross2bi", {}).get("families", {})
    trained = {f: s.get("steps") for f, s in stage.items()}
    resumed_at = {f: s.get("resumed_from") for f, s in stage.items()}
    uninterrupted = json.loads((mutual_run.root / "run" / "state.json").read_text())["stages"]
    differing = sorted(f"{key} {family} {field}" for key, done in uninterrupted.items()
                       for family, record in done["families"].items() for field in SAME_AS_UNINTERRUPTED
                       if job.final["stages"].get(key, {}).get("families", {}).get(family, {}).get(field)
                       != record[field])
    stop_line = next((line for line in job.first.splitlines() if "stop requested (SIGTERM) while training" in line),
                     "")
    reliability.record(
        "fault", "sigterm-main-job",
        input=f"SIGTERM to python jobs/mutual_tenc.py (2 families, 1 cycle) once both bi-encoders were past step "
              f"{SIGNAL_AT} of the cross2bi stage's {TENC_STEPS}; then the same job again",
        did=f"exit status {job.status}; each learner stopped at its next step ({job.stopped_at}) and saved model, "
            f"optimizer, schedule, RNG and data position; the finished bi2cross stage stayed recorded; the MLflow run "
            f"ended {job.mlflow_statuses}; the rerun skipped bi2cross and continued cross2bi at {resumed_at} to "
            f"{trained} steps; "
            + ("both stages ended as in the uninterrupted run (labels, best step and dev, weights)" if not differing
               else f"differing from the uninterrupted run: {', '.join(differing)}"),
        message=stop_line.strip(), lost="0 steps: the rerun continued each learner from the step it stopped at",
        exit_status=job.status, stopped_at=job.stopped_at, resumed_at=resumed_at, differing=differing)
    assert job.status == 143, job.first[-4000:]
    assert "to resume" in stop_line and "*** SIGTERM received ***" not in job.first and "Traceback" not in job.first
    assert set(job.state["stages"]) == {"cycle=1/stage=bi2cross"}
    assert set(job.stopped_at) == set(FAMILIES) and all(
        SIGNAL_AT <= step < TENC_STEPS for step in job.stopped_at.values()), job.first[-4000:]
    assert job.saved == {"bert": True, "mpnet": True}
    assert job.mlflow_statuses == ["KILLED"]

    assert job.second_error is None, f"{job.second_error!r}\n{job.second[-4000:]}"
    assert "1 completed stage(s) will be skipped" in job.second
    # the finished stage is not trained again, the stopped one is continued from where each learner stopped
    assert {p: p.stat().st_mtime_ns for p in (job.run_dir / "models" / "cycle=1" / "cross").rglob("*")} == \
        job.bi2cross_files
    assert resumed_at == job.stopped_at and trained == {"bert": TENC_STEPS, "mpnet": TENC_STEPS}
    assert job.saved_after == {"bert": False, "mpnet": False}
    assert set(job.final["stages"]) == set(uninterrupted) and not differing, differing
    assert job.mlflow_after == ["FINISHED"]  # the rerun continued the stopped MLflow run: one run for one training


@pytest.mark.ray
def test_a_damaged_state_file_is_rebuilt_from_the_finished_stages(mutual_run, tiny_models, tmp_path, capsys,
                                                                  reliability):
    """state.json cut short (a crash of an older writer, a full disk): opening the run's state, as every job does at
    its start, rebuilds it from the stage records in the model directories, keeps every finished stage and says so,
    instead of asking to delete the run. (The whole job on such a run: the e2e test below.)"""
    from raydistill.runtime.tenc.pairs import build_pair_set
    from raydistill.runtime.tenc.state import RunState

    run_dir = Path(shutil.copytree(mutual_run.root / "run", tmp_path / "run"))  # a copy of the finished run
    cfg = mutual_config(tiny_models, tmp_path)  # the same config, this run dir
    before = json.loads((run_dir / "state.json").read_text())
    damaged = (run_dir / "state.json").read_text()[:200]
    (run_dir / "state.json").write_text(damaged)
    capsys.readouterr()

    pair_set = build_pair_set(cfg.pairs.source, cfg.pairs.max_pairs, cfg.pairs_seed())
    error, state = None, None
    try:
        state = RunState.open(run_dir, cfg, pair_set.fingerprint, len(pair_set), started=time.perf_counter())
    except Exception as exc:  # noqa: BLE001 - recorded, then asserted below
        error = exc
    out = capsys.readouterr().out
    after = json.loads((run_dir / "state.json").read_text())
    rebuilt_line = next((line for line in out.splitlines() if "rebuilt it from the finished stages" in line), "")
    kept = [key for key in before["stages"] if key in after["stages"] and all(
        after["stages"][key]["families"][f][field] == before["stages"][key]["families"][f][field]
        for f in FAMILIES for field in ("best_dev", "steps", "fingerprint", "model_dir"))]
    reliability.record(
        "checkpoint", "state-files-durable",
        input="a Trans-Encoder run's state.json cut to its first 200 bytes after both stages of its cycle finished; "
              "then the run's state opened as the job opens it",
        did=f"moved the damaged file aside and rebuilt state.json from each stage's stage.json in its model "
            f"directories: {len(kept)} of {len(before['stages'])} finished stage(s) kept, no model retrained"
        if error is None else f"failed: {error}",
        message=re.sub(r"damaged-\d+", "damaged-<time>", rebuilt_line.strip() or str(error)),
        lost="nothing trained: label sets and evaluations are redone",
        kept=kept)
    assert error is None, error
    assert "rebuilt it from the finished stages" in rebuilt_line and "2 finished stage(s) kept" in rebuilt_line
    assert kept == list(before["stages"]) == ["cycle=1/stage=bi2cross", "cycle=1/stage=cross2bi"]
    assert set(state.stages) == set(before["stages"]) and after["config_hash"] == before["config_hash"]
    assert list(run_dir.glob("state.json.damaged-*"))[0].read_text() == damaged
    assert after["stages"]["cycle=1/stage=cross2bi"]["families"]["bert"]["best_dev"] == \
        before["stages"]["cycle=1/stage=cross2bi"]["families"]["bert"]["best_dev"]


@pytest.mark.ray
@pytest.mark.e2e
def test_the_job_on_a_damaged_state_file_keeps_every_finished_stage_and_retrains_none(mutual_run, tiny_models,
                                                                                      tmp_path, capsys):
    """The whole job on a run whose state.json was cut short: it rebuilds the state, skips both finished stages
    (no model file touched), makes again the label sets and evaluations the rebuilt state lacks, and ends with the
    same best dev scores."""
    from raydistill.runtime.tenc import run_trans_encoder

    run_dir = Path(shutil.copytree(mutual_run.root / "run", tmp_path / "run"))
    cfg = mutual_config(tiny_models, tmp_path)
    before = json.loads((run_dir / "state.json").read_text())
    models = {p: p.stat().st_mtime_ns for p in (run_dir / "models" / "cycle=1").rglob("*")}
    (run_dir / "state.json").write_text((run_dir / "state.json").read_text()[:200])
    capsys.readouterr()
    summary = run_trans_encoder(cfg)
    out = capsys.readouterr().out
    after = json.loads((run_dir / "state.json").read_text())
    assert "rebuilt it from the finished stages" in out and "2 finished stage(s) kept" in out
    assert "2 completed stage(s) will be skipped" in out
    assert {p: p.stat().st_mtime_ns for p in (run_dir / "models" / "cycle=1").rglob("*")} == models
    for key, stage in before["stages"].items():
        for family in FAMILIES:
            assert after["stages"][key]["families"][family]["best_dev"] == stage["families"][family]["best_dev"]
    for family in FAMILIES:
        for kind in ("bi", "cross"):
            assert summary["best"][family][kind]["cycle"] == mutual_run.summary["best"][family][kind]["cycle"]
            assert summary["best"][family][kind]["best_dev"] == pytest.approx(
                mutual_run.summary["best"][family][kind]["best_dev"])
