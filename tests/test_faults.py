"""Faults injected for real under local Ray: killed learner and queue actors, a killed driver (the killed teacher
pool actor is tested with the cache, in test_teacher_cache_safety.py). Each run must finish, lose at most one checkpoint interval, train every batch of the uninterrupted run
exactly once in the lineage of its final weights, and end within noise of the uninterrupted run.

How the runtime survives each fault, and why it uses which failure mechanism:
  * learner workers (Ray Train workers) and shared-queue actors: Train's ``FailureConfig`` restarts the whole worker
    group, and each new worker loads the newest checkpoint (weights, AdamW, schedule, queues, RNG, data position)
    before its first step. A dead queue actor fails the workers' next queue read; the ``EventRelay`` that keeps the
    queues hands the restarted workers new ones, whose content comes from the checkpoint (a restarted queue actor
    alone would hand the learners an empty queue).
  * the driver: nothing survives it (the Train controller and workers it owns die with it); a job started again
    with the same ``run_dir`` resumes from the latest checkpoint.

The driver hears of each step as rank 0's event arrives, so a fault injected "after step 7" lands while the
workers are at step 7 or a little further; what is asserted holds wherever it lands.

"Noise" is the spread of the final STS-B dev over three seeds of the uninterrupted run (``seed_spread``). The final
7-STS is not computed here: it costs about 50 s per model even for these tiny models, against 2 s for STS-B dev,
which is the score the best model is selected by. Every case records what happened in docs/reliability.md.

Each fault is tested once by default, where it happens; the other paths to the same fault are marked ``e2e``
(``pytest -m e2e``): a Train worker's death is the SIGKILL test (``ray.kill`` of its actor is the same death to
Ray Train); a new driver resuming a run dir is the SIGTERM test (a SIGKILLed driver leaves the same checkpoints
and a stale lock, which tests/test_checkpoint.py takes over); a half-copied checkpoint is skipped where checkpoints
are read (tests/test_checkpoint.py and tests/test_resume_safety.py); a dead shared-queue actor is tests/
test_distill_job.py's two-worker job.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from raydistill.runtime.engine import checkpoint as ckpt
from raydistill.config.job import JobConfig
from tests.distill_fixtures import (  # noqa: F401 - distill_runs and teacher_dir are fixtures
    CHECKPOINT_EVERY,
    STEPS,
    DistillRuns,
    RunLog,
    distill_runs,
    expected_batches,
    final_history,
    teacher_dir,
)
from tests.ray_fixtures import ray_session  # noqa: F401 - the session-wide Ray fixture

pytest_plugins = ["tests.reliability_log"]
pytestmark = pytest.mark.ray

FAULT_AFTER_STEP = 7  # mid-epoch (10 steps an epoch), after the checkpoint of step 5
RESTART_LINE = "learner worker died"
# One learner resumes with the uninterrupted run's per-step losses (to 1e-5), so its final score must match to the
# determinism contract's tolerance (tests/test_determinism.py), tighter than the spread over seeds.
EXACT_RESUME_TOLERANCE = 0.05


@pytest.fixture(autouse=True)
def one_thread(one_thread):
    # The driver evaluates STS-B dev only in-process learners; keep it from competing with the actors.
    yield


@pytest.fixture(scope="module")
def seed_spread(distill_runs: DistillRuns) -> float:
    """The tolerance of every score comparison: the spread of the uninterrupted run's final STS-B dev over 3 seeds."""
    return distill_runs.seed_spread()


# ----------------------------------------------------------------------------------------------------------------
# Helpers


class Workers:
    """What the driver learns at each (re)start of the learners: rank 0's pid and actor, the shared queue actors."""

    def __init__(self):
        self.starts: list[dict] = []

    def __call__(self, info: dict) -> None:
        self.starts.append(info)

    @property
    def current(self) -> dict:
        assert self.starts, "the learners never started"
        return self.starts[-1]


def worker_line(line: str) -> str:
    """A line a Ray Train worker printed, as the driver shows it, without Ray's colour codes and worker prefix."""
    import re

    return re.sub(r"^\(RayTrainWorker pid=\d+\)\s*", "", re.sub(r"\x1b\[[0-9;]*m", "", line.strip()))


def check_resumed(run: RunLog, reference: RunLog, tolerance: float, *, learners: int = 1) -> dict:
    """The assertions every learner-side fault shares; returns the numbers the reliability row reports."""
    total = reference.training["steps"]
    training = run.training
    assert training["steps"] == total, "the job did not finish"
    resumed_from = training["stages"][0]["resumed_from"]
    assert resumed_from is not None and resumed_from % CHECKPOINT_EVERY == 0 and resumed_from > 0
    # Step counters: the driver saw 1..k, then resumed_from+1..total; what was replayed is what was lost.
    seen = run.steps_seen
    restart_at = next(i for i in range(1, len(seen)) if seen[i] <= seen[i - 1])
    before = seen[:restart_at]
    assert before == list(range(1, before[-1] + 1))
    assert seen[restart_at:] == list(range(resumed_from + 1, total + 1))
    lost = before[-1] - resumed_from
    assert 0 <= lost <= CHECKPOINT_EVERY, f"lost {lost} steps, more than one checkpoint interval"
    # Batches: the final weights descend from steps 1..total, one each, on exactly the uninterrupted run's batches.
    assert [row["step"] for row in run.history if "loss" in row] == list(range(1, total + 1))
    assert run.batches() == reference.batches() == expected_batches_of(reference, learners)
    losses, reference_losses = run.losses(), reference.losses()
    loss_diff = max(abs(losses[step] - reference_losses[step]) for step in reference_losses)
    if learners == 1:
        # One learner resumes exactly: checkpointed RNG, optimiser, schedule, queue and data position reproduce
        # the uninterrupted run's losses. (Learners of rank > 0 draw new dropout masks after a restart.)
        assert loss_diff <= 1e-5, f"the resumed run's losses differ from the uninterrupted run's by {loss_diff}"
    delta = abs(run.best_stsb_dev - reference.best_stsb_dev)
    assert delta <= tolerance, f"STS-B dev {run.best_stsb_dev} vs {reference.best_stsb_dev} uninterrupted"
    manifest = ckpt.read_manifest(ckpt.latest_checkpoint(run.run_dir))
    assert manifest["step"] == total and manifest["extra"]["finished"]
    return {"resumed_from": resumed_from, "last_step_before": before[-1], "lost_steps": lost,
            "stsb_dev": run.best_stsb_dev, "reference_stsb_dev": reference.best_stsb_dev, "tolerance": tolerance,
            "max_loss_difference": loss_diff}


def expected_batches_of(reference: RunLog, learners: int) -> list[int]:
    return expected_batches(JobConfig.from_yaml(reference.run_dir / "config.yaml"), learners)


def lost_text(numbers: dict, unit: str = "optimiser steps") -> str:
    first, last = numbers["resumed_from"] + 1, numbers["last_step_before"]
    replayed = f"{unit} {first}-{last}" if last >= first else "no step"
    tolerance = ("the determinism contract" if numbers["tolerance"] == EXACT_RESUME_TOLERANCE
                 else "spread over 3 seeds")
    return (f"{numbers['lost_steps']} {unit} ({replayed}, at most one checkpoint interval = {CHECKPOINT_EVERY}), "
            f"trained again after the resume; no batch skipped or trained twice in the final weights' lineage; "
            f"final STS-B dev {numbers['stsb_dev']:.2f} vs {numbers['reference_stsb_dev']:.2f} uninterrupted "
            f"(tolerance {numbers['tolerance']:.2f}: {tolerance})")


# ----------------------------------------------------------------------------------------------------------------
# Learner-side faults (one learner actor)


@pytest.mark.e2e
def test_learner_killed_by_ray_kill_mid_epoch_resumes_from_the_checkpoint(distill_runs, seed_spread, reliability,
                                                                          capsys):
    import ray

    reference = distill_runs.reference()
    workers = Workers()
    killed: dict[str, object] = {}

    def kill_while_the_next_step_runs(step: int) -> None:
        if step == FAULT_AFTER_STEP and not killed:
            actor = workers.current["actor"]  # rank 0's Train worker actor
            # From another thread, while the workers run the next step: the actor dies mid-step or just before.
            threading.Thread(target=lambda: (time.sleep(0.05), ray.kill(actor)), daemon=True).start()
            killed["after_step"] = step

    run = distill_runs.run("ray-kill", on_step=kill_while_the_next_step_runs, on_start=workers)
    assert killed, "the learner was never killed"
    out = capsys.readouterr().out
    restart_line = next(line for line in out.splitlines() if RESTART_LINE in line)
    assert run.training["restarts"] == 1
    numbers = check_resumed(run, reference, seed_spread)
    reliability.record(
        "fault", "learner actor killed (ray.kill) mid-epoch",
        input=f"ray.kill of rank 0's Ray Train worker actor while the workers ran step {FAULT_AFTER_STEP + 1} or "
              f"so of {STEPS} (epoch 1 of 2); checkpoint every {CHECKPOINT_EVERY} steps",
        did=f"Ray Train saw the worker die and restarted the worker group (FailureConfig); the new worker loaded "
            f"checkpoint step {numbers['resumed_from']} (weights, AdamW, schedule, queue, RNG, data position) and "
            f"finished all {STEPS} steps", message=restart_line.strip(), lost=lost_text(numbers), **numbers)


def test_learner_worker_sigkilled_mid_epoch_resumes_from_the_checkpoint(distill_runs, reliability, capsys):
    reference = distill_runs.reference()
    workers = Workers()
    killed: dict[str, int] = {}

    def sigkill_the_worker(step: int) -> None:
        if step == FAULT_AFTER_STEP and not killed:
            pid = int(workers.current["pid"])
            os.kill(pid, signal.SIGKILL)  # what the OOM killer does: no exception handler, no cleanup
            killed["pid"] = pid

    run = distill_runs.run("sigkill", on_step=sigkill_the_worker, on_start=workers)
    assert killed, "the learner's worker process was never killed"
    out = capsys.readouterr().out
    restart_line = next(line for line in out.splitlines() if RESTART_LINE in line)
    assert run.training["restarts"] == 1
    numbers = check_resumed(run, reference, EXACT_RESUME_TOLERANCE)
    # The whole replay is the steps after the checkpoint the kill followed (5, or 10 if the workers ran ahead).
    assert numbers["resumed_from"] in (5, 10) and numbers["lost_steps"] <= CHECKPOINT_EVERY
    reliability.record(
        "fault", "learner worker process SIGKILLed mid-epoch",
        input=f"os.kill(SIGKILL) of rank 0's Ray Train worker process (its pid from the workers' start event) "
              f"when the driver saw step {FAULT_AFTER_STEP} of {STEPS}",
        did=f"Ray Train saw the worker die and restarted the worker group (FailureConfig); the new worker loaded "
            f"checkpoint step {numbers['resumed_from']} and finished all {STEPS} steps", message=restart_line.strip(),
        lost=lost_text(numbers), **numbers)


@pytest.mark.e2e
def test_train_worker_killed_while_ray_persists_its_checkpoint_resumes_from_the_previous_one(
        distill_runs, seed_spread, reliability, capsys):
    """With Train workers, rank 0 writes a checkpoint into a local staging directory and Ray Train copies it, file by
    file, into ``<run_dir>/checkpoints/step-XXXXXXX`` (not atomically). The worker is SIGKILLed in the middle of that
    copy: the half-copied directory must never be loaded, and the restarted worker resumes from the previous
    complete checkpoint.

    The copy is held mid-file by a named pipe put where step 10's ``student.pt`` will be copied: Ray's copy blocks on
    it until this test reads the first bytes, then the worker is killed; the pipe is replaced by the bytes that had
    arrived, which is what a copy killed mid-file leaves on disk."""
    reference = distill_runs.reference()
    workers = Workers()
    cfg = distill_runs.config("persist-kill")
    target = ckpt.checkpoint_root(cfg.resolved_run_dir()) / f"step-{2 * CHECKPOINT_EVERY:07d}"
    pipe = target / "student.pt"
    caught: dict[str, object] = {}

    def hold_the_copy_and_kill_the_worker() -> None:
        with open(pipe, "rb") as reader:  # blocks until Ray's copy opens the file for writing
            caught["arrived"] = reader.read(4096)
            caught["manifest_copied"] = (target / ckpt.MANIFEST).is_file()
            caught["pid"] = int(workers.current["pid"])
            os.kill(caught["pid"], signal.SIGKILL)
        partial = target / "student.pt.partial"
        partial.write_bytes(caught["arrived"])
        os.replace(partial, pipe)  # before the restarted worker looks (it starts in seconds, this takes ms)

    def set_the_trap(info: dict) -> None:
        workers(info)
        if "pid" not in caught and not pipe.exists():
            target.mkdir(parents=True)
            os.mkfifo(pipe)
            threading.Thread(target=hold_the_copy_and_kill_the_worker, daemon=True).start()

    try:
        run = distill_runs.run("persist-kill", on_start=set_the_trap)
    finally:
        if "pid" not in caught and pipe.exists() and not pipe.is_file():  # release the waiting reader
            os.close(os.open(pipe, os.O_WRONLY | os.O_NONBLOCK))
    assert "pid" in caught, "the worker was never killed while its checkpoint was copied"
    out = [worker_line(line) for line in capsys.readouterr().out.splitlines()]
    restart_line = next(line for line in out if RESTART_LINE in line)
    # The workers' own lines reach this process through Ray's log monitor, possibly after the run returned.
    worker_said = [line for line in out if "resuming from" in line or "checkpoint damaged" in line]
    numbers = check_resumed(run, reference, seed_spread)
    skipped = ("its manifest had arrived, so the resume listed it, found student.pt shorter than the manifest says "
               "and skipped it" if caught["manifest_copied"] else "without its manifest it was never listed")
    did = (f"Ray Train's copy of checkpoint step 10 into the run dir was cut after {len(caught['arrived'])} bytes of "
           f"student.pt; Ray Train restarted the worker group; the half-copied directory was not loaded ({skipped}); "
           f"the new worker resumed from checkpoint step {numbers['resumed_from']}, the last complete one, and every "
           f"step's loss equals the uninterrupted run's (max difference {numbers['max_loss_difference']:.1e})")
    reliability.record(
        "checkpoint", "process killed while writing a checkpoint",
        input=f"SIGKILL of rank 0's Ray Train worker while Ray Train copied its staged checkpoint of step "
              f"{2 * CHECKPOINT_EVERY} into <run_dir>/checkpoints/ (the Train-worker path)",
        did=did, message=" / ".join([restart_line, *worker_said]), lost=lost_text(numbers), **numbers)
    assert run.training["restarts"] == 1
    assert numbers["resumed_from"] == CHECKPOINT_EVERY, "the resume did not fall back to the previous checkpoint"


# ----------------------------------------------------------------------------------------------------------------
# The shared queue (two learners)


@pytest.mark.e2e
def test_shared_queue_actor_killed_two_learners_resume_from_the_checkpoint(distill_runs, seed_spread, reliability,
                                                                           capsys):
    import ray

    reference = distill_runs.reference(learners=2)
    workers = Workers()
    killed: dict[str, object] = {}
    after_step = 7  # 5 steps an epoch with two learners: mid-epoch 2, after the checkpoint of step 5

    def kill_the_queue(step: int) -> None:
        if step == after_step and not killed:
            queues = workers.current["queue_actors"]  # the handles rank 0's QueueClients hold
            assert len(queues) == 1
            ray.kill(queues[0])
            killed["queues"] = len(queues)

    run = distill_runs.run("queue-kill", on_step=kill_the_queue, on_start=workers, learners=2)
    assert killed, "the queue actor was never killed"
    out = capsys.readouterr().out
    restart_line = next(line for line in out.splitlines() if RESTART_LINE in line)
    assert run.training["restarts"] == 1
    numbers = check_resumed(run, reference, seed_spread, learners=2)
    # Every rank's batches, not only rank 0's: rank 1 trains on other rows and would skip or repeat its own.
    cfg = JobConfig.from_yaml(reference.run_dir / "config.yaml")
    by_rank = run.batches_by_rank(learners=2)
    for rank, seen in enumerate(by_rank):
        expected = expected_batches(cfg, learners=2, rank=rank)
        assert seen == expected, f"rank {rank} trained other batches than the uninterrupted run (skips or repeats)"
        assert seen == reference.batches_by_rank(learners=2)[rank]
    every_batch = [crc for seen in by_rank for crc in seen]
    assert len(set(every_batch)) == len(every_batch), "a batch was trained twice across ranks"
    reliability.record(
        "fault", "queue-kill-all-ranks",
        input=f"ray.kill of the SharedQueueActor that two Ray Train workers share, when the driver saw step "
              f"{after_step} of {reference.training['steps']} (2 batches a step)",
        did="the workers' next queue read raised ActorDiedError; Ray Train restarted the worker group, the "
            "EventRelay handed the new workers a new queue actor, and they loaded checkpoint step "
            f"{numbers['resumed_from']} (the queue's content is in it) and finished; the batches of both ranks "
            "(gathered into each checkpointed step) equal the uninterrupted run's, none skipped or repeated",
        message=restart_line.strip(),
        lost=lost_text(numbers), **numbers)


# ----------------------------------------------------------------------------------------------------------------
# The driver


DRIVER = """\
import json, sys
from raydistill.config.job import JobConfig
from raydistill.runtime.jobs.distill import run_distillation

record = run_distillation(JobConfig.from_yaml(sys.argv[1]), result_path=sys.argv[2], evaluate=False)
print("TRAINING " + json.dumps(record["training"]), flush=True)
"""


@pytest.mark.e2e
def test_driver_killed_and_restarted_resumes_from_the_checkpoint(distill_runs, seed_spread, tmp_path,
                                                                 reliability):
    """The job's driver (a separate process joined to the cluster, as under ``ray job submit``) is SIGKILLed after
    step 7; the same command started again with the same run_dir resumes from the checkpoint."""
    import ray

    reference = distill_runs.reference()
    cfg = distill_runs.config("driver-kill")
    cfg.to_yaml(tmp_path / "job.yaml")
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address, "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, str(script), str(tmp_path / "job.yaml"), str(tmp_path / "result.json")]
    marker = f"step {FAULT_AFTER_STEP}/{STEPS}"

    first_log = tmp_path / "first.log"
    with first_log.open("w") as log:
        driver = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + 240
        while marker not in first_log.read_text() and driver.poll() is None and time.time() < deadline:
            time.sleep(0.02)
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=60)
    first = first_log.read_text()
    assert marker in first and "TRAINING" not in first, f"the driver was not killed mid-run:\n{first[-3000:]}"
    last_step_before = max(int(line.split("step ")[1].split("/")[0]) for line in first.splitlines()
                           if line.startswith("[congen] step "))

    second = subprocess.run(command, capture_output=True, text=True, env=env, timeout=400)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    import json

    training = json.loads(second.stdout.split("TRAINING ", 1)[1].splitlines()[0])
    resume_line = worker_line(next(line for line in second.stdout.splitlines() if "resuming from" in line))
    run = RunLog({"training": training}, [], final_history(cfg.resolved_run_dir()), cfg.resolved_run_dir())
    resumed_from = training["stages"][0]["resumed_from"]
    assert training["steps"] == STEPS and training["restarts"] == 0
    assert resumed_from == CHECKPOINT_EVERY  # the newest checkpoint when it was killed after step 7
    lost = last_step_before - resumed_from
    assert 0 < lost <= CHECKPOINT_EVERY
    assert [row["step"] for row in run.history if "loss" in row] == list(range(1, STEPS + 1))
    assert run.batches() == reference.batches()
    # The resumed lineage reproduces the uninterrupted run step by step, not just its final score.
    losses, reference_losses = run.losses(), reference.losses()
    assert sorted(losses) == sorted(reference_losses) == list(range(1, STEPS + 1))
    loss_diff = max(abs(losses[step] - reference_losses[step]) for step in reference_losses)
    assert loss_diff <= 1e-5, f"the resumed run's per-step losses differ from the uninterrupted run's by {loss_diff}"
    assert abs(run.best_stsb_dev - reference.best_stsb_dev) <= seed_spread
    numbers = {"resumed_from": resumed_from, "last_step_before": last_step_before, "lost_steps": lost,
               "stsb_dev": run.best_stsb_dev, "reference_stsb_dev": reference.best_stsb_dev,
               "tolerance": seed_spread, "max_loss_difference": loss_diff}
    reliability.record(
        "fault", "driver-kill-exact",
        input=f"SIGKILL of the job's driver process (joined to the running cluster, as under ray job submit) after "
              f"step {last_step_before} of {STEPS}; then the same command with the same run_dir",
        did="the Train controller and worker died with their owner; the second run found checkpoint step "
            f"{resumed_from} and resumed there (epoch, batch in epoch, weights, optimiser, RNG); every step's loss "
            f"equals the uninterrupted run's (max difference {loss_diff:.1e} <= 1e-5)",
        message=resume_line.strip(), lost=lost_text(numbers), **numbers)


# ----------------------------------------------------------------------------------------------------------------
# Preemption and an unresponsive learner


PREEMPTIBLE_DRIVER = """\
import json, sys
from raydistill.config.job import JobConfig
from raydistill.runtime.jobs.distill import run_distillation
from raydistill.runtime.engine.learner_group import PreemptedError

try:
    record = run_distillation(JobConfig.from_yaml(sys.argv[1]), result_path=sys.argv[2], evaluate=False)
except PreemptedError as exc:
    print("PREEMPTED " + json.dumps({"step": exc.step, "checkpoint": exc.checkpoint}), flush=True)
    sys.exit(143)
print("TRAINING " + json.dumps(record["training"]), flush=True)
"""


def test_sigterm_checkpoints_at_the_next_step_and_the_resume_redoes_nothing(distill_runs, tmp_path, reliability):
    """SIGTERM (a preempted node) to the job's driver: it finishes the step in flight, checkpoints there, ends its
    MLflow run KILLED and exits 143; the same command resumes at that step and trains the uninterrupted run's steps."""
    import json

    import ray
    from mlflow import MlflowClient

    reference = distill_runs.reference()
    tracking_uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = distill_runs.config("sigterm").with_overrides(["tracking.enabled=true", f"tracking.tracking_uri={tracking_uri}",
                                                         "tracking.experiment=preemption"])
    cfg.to_yaml(tmp_path / "job.yaml")
    script = tmp_path / "driver.py"
    script.write_text(PREEMPTIBLE_DRIVER)
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address, "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, str(script), str(tmp_path / "job.yaml"), str(tmp_path / "result.json")]
    marker = f"step {FAULT_AFTER_STEP}/{STEPS}"

    first_log = tmp_path / "first.log"
    with first_log.open("w") as log:
        driver = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + 300
        while marker not in first_log.read_text() and driver.poll() is None and time.time() < deadline:
            time.sleep(0.02)
        driver.send_signal(signal.SIGTERM)
        status = driver.wait(timeout=180)
    first = first_log.read_text()
    assert status == 143, f"exit status {status}, expected 143 (preempted):\n{first[-3000:]}"
    preempted = json.loads(first.split("PREEMPTED ", 1)[1].splitlines()[0])
    stopped_line = next(line for line in first.splitlines() if "stop requested (SIGTERM)" in line)
    last_step_before = max(int(line.split("step ")[1].split("/")[0]) for line in first.splitlines()
                           if line.startswith("[congen] step "))
    # The step boundary after the signal: the last step the driver saw, checkpointed.
    assert FAULT_AFTER_STEP <= preempted["step"] == last_step_before < STEPS
    manifest = ckpt.read_manifest(ckpt.latest_checkpoint(cfg.resolved_run_dir()))
    assert manifest["step"] == last_step_before
    runs = MlflowClient(tracking_uri).search_runs(
        [MlflowClient(tracking_uri).get_experiment_by_name("preemption").experiment_id])
    assert [run.info.status for run in runs] == ["KILLED"]

    second = subprocess.run(command, capture_output=True, text=True, env=env, timeout=400)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    training = json.loads(second.stdout.split("TRAINING ", 1)[1].splitlines()[0])
    resumed_from = training["stages"][0]["resumed_from"]
    assert resumed_from == last_step_before  # 0 steps redone
    steps_after = [int(line.split("step ")[1].split("/")[0]) for line in second.stdout.splitlines()
                   if line.startswith("[congen] step ")]
    assert steps_after[0] == last_step_before + 1, f"the resumed job redid steps: {steps_after[:3]}"
    run = RunLog({"training": training}, [], final_history(cfg.resolved_run_dir()), cfg.resolved_run_dir())
    losses, reference_losses = run.losses(), reference.losses()
    assert sorted(losses) == list(range(1, STEPS + 1))
    loss_diff = max(abs(losses[step] - reference_losses[step]) for step in reference_losses)
    assert loss_diff <= 1e-5
    statuses = sorted(run.info.status for run in MlflowClient(tracking_uri).search_runs(
        [MlflowClient(tracking_uri).get_experiment_by_name("preemption").experiment_id]))
    assert statuses == ["FINISHED", "KILLED"]
    reliability.record(
        "fault", "sigterm-checkpoint",
        input=f"SIGTERM to the job's driver after step {FAULT_AFTER_STEP} of {STEPS} (checkpoint every "
              f"{CHECKPOINT_EVERY}); then the same command with the same run_dir",
        did=f"finished the step in flight, wrote checkpoint step {last_step_before} at that step boundary, ended the "
            "MLflow run KILLED and exited with status 143; the second run resumed at that step and its per-step "
            f"losses equal the uninterrupted run's (max difference {loss_diff:.1e})",
        message=stopped_line.strip(), lost="0 steps: the resumed job redid no step", lost_steps=0,
        resumed_from=resumed_from)


def test_unresponsive_learner_ends_the_job_within_the_timeout(distill_runs, reliability):
    """A learner worker that stops answering (SIGSTOP: alive to the OS and to Ray, but silent): the job ends after
    ``runtime.learner_timeout_s`` without an event of the workers, saying how to resume. (A killed Ray head is
    tests/test_cluster_faults.py.)"""
    from raydistill.runtime.engine.learner_group import LearnerUnresponsiveError

    # Longer than any step of this tiny job on a loaded machine (start-up has its own, longer bound).
    timeout_s = 30.0
    workers = Workers()
    stopped: dict[str, float] = {}

    def freeze_the_learner(step: int) -> None:
        if step == FAULT_AFTER_STEP and not stopped:
            pid = int(workers.current["pid"])
            os.kill(pid, signal.SIGSTOP)
            stopped.update(pid=pid, at=time.monotonic())

    try:
        with pytest.raises(LearnerUnresponsiveError) as caught:
            distill_runs.run("unresponsive", on_step=freeze_the_learner, on_start=workers,
                             learner_timeout_s=timeout_s)
        assert stopped, f"the job gave up before the learner was frozen: {caught.value}"
        waited = time.monotonic() - stopped["at"]
    finally:
        if stopped:  # the worker is ours (this session's Ray): let it go so Ray can reap it
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(int(stopped["pid"]), sig)
                except ProcessLookupError:
                    pass
    message = str(caught.value)
    assert waited <= timeout_s + 30, f"the job took {waited:.0f} s to give up, with a {timeout_s:.0f} s timeout"
    assert "runtime.learner_timeout_s" in message and "run the same command again with run_dir" in message
    assert "checkpoint step-0000005" in message or "checkpoint step-0000010" in message
    reliability.record(
        "fault", "learner-unresponsive",
        input=f"SIGSTOP of rank 0's Ray Train worker process when the driver saw step {FAULT_AFTER_STEP} of {STEPS} "
              f"(alive to the OS and to Ray but silent); "
              f"runtime.learner_timeout_s={timeout_s:g} (default 600)",
        did=f"no event of the workers arrived for {timeout_s:g} s; the job stopped within {timeout_s:g} s (+30 s "
            "allowed for the step in flight) of the worker freezing, with LearnerUnresponsiveError saying how to "
            "resume (never the hour a call could block before); the relay tells the workers to leave once the "
            "frozen one returns or dies",
        message=message, lost="the steps since checkpoint step 5, when resumed", waited_s=round(waited))
