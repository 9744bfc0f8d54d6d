"""Faults injected for real under local Ray: killed learner and queue actors, a killed driver (the killed teacher
pool actor is tested with the cache, in test_teacher_cache_safety.py). Each run must finish, lose at most one
checkpoint interval, train every batch of the uninterrupted run exactly once in the lineage of its final weights,
and end within noise of the uninterrupted run.

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

"Noise" is the spread of the final STS-B dev over three seeds of the uninterrupted run (``seed_spread``); one learner
resumes exactly, so its runs must match the uninterrupted run's per-step losses and score. The final 7-STS is not
computed for the faulted runs: STS-B dev is the score the best model is selected by. Every case records what
happened in docs/reliability.md.

Each fault is tested once by default, where it happens; the other paths to the same fault are marked ``e2e``
(``pytest -m e2e``): a Train worker's death is the SIGKILL test (``ray.kill`` of its actor is the same death to
Ray Train); a job started again on a run dir resumes in the SIGTERM test (a SIGKILLed driver leaves the same
checkpoints and a stale lock, which tests/test_checkpoint.py takes over); a half-copied checkpoint is skipped where
checkpoints are read (tests/test_checkpoint.py and tests/test_resume_safety.py); a dead shared-queue actor is
tests/test_distill_job.py's two-worker job.

Every run here is compared with the shared uninterrupted reference of tests/distill_fixtures.py, and the default
faults are injected into jobs run by this process: the SIGTERM goes to this process while its job trains (a SIGTERM
to a job's own driver process, with the job script's exit status, is tests/test_signals.py's). The SIGKILL and the
SIGTERM case share one job (``killed_then_stopped``): its worker is killed after step 7, and the restarted worker
is stopped after step 11; the same job then runs to its end, and each case checks its part.

One rank of two Train workers killed while the other lives is a job of its own (the L2 baseline without dropout,
whose two-worker runs repeat to rounding), compared with the same two-worker job uninterrupted.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import pytest

from raydistill.config.job import JobConfig
from raydistill.runtime.engine import checkpoint as ckpt
from raydistill.runtime.engine.learner_group import PreemptedError
from tests import distill_fixtures, ray_fixtures
from tests.distill_fixtures import (
    CHECKPOINT_EVERY,
    EXPERIMENT,
    STEPS,
    DistillRuns,
    RunLog,
    Watch,
    expected_batches,
    final_history,
)

pytest_plugins = ["tests.reliability_log"]
# The shared fixtures, seen by this module's tests (distill_runs asks for the other two).
distill_runs, teacher_dir, ray_session = distill_fixtures.distill_runs, distill_fixtures.teacher_dir, \
    ray_fixtures.ray_session
pytestmark = pytest.mark.ray

FAULT_AFTER_STEP = 7  # mid-epoch (10 steps an epoch), after the checkpoint of step 5
# The SIGTERM of the killed job: the first step after this one that the restarted worker trains (it resumed from 5, or
# 10 if the workers ran ahead of the kill). Workers a few steps ahead of the driver still stop well before step 20.
STOP_AFTER_STEP = 11
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
    """The assertions every learner-side fault of one job shares; returns the numbers the reliability row reports."""
    resumed_from = run.training["stages"][0]["resumed_from"]
    numbers = check_replay(run.steps_seen, resumed_from, reference.training["steps"])
    return {**numbers, **check_lineage(run, reference, tolerance, learners=learners)}


def check_replay(seen: list[int], resumed_from: int | None, last_step: int) -> dict:
    """The steps the driver saw: 1..k, then, after the restart, ``resumed_from``+1..``last_step``; what was replayed
    is what was lost, at most one checkpoint interval."""
    assert resumed_from is not None and resumed_from % CHECKPOINT_EVERY == 0 and resumed_from > 0
    restart_at = next(i for i in range(1, len(seen)) if seen[i] <= seen[i - 1])
    before = seen[:restart_at]
    assert before == list(range(1, before[-1] + 1))
    assert seen[restart_at:] == list(range(resumed_from + 1, last_step + 1))
    lost = before[-1] - resumed_from
    assert 0 <= lost <= CHECKPOINT_EVERY, f"lost {lost} steps, more than one checkpoint interval"
    return {"resumed_from": resumed_from, "last_step_before": before[-1], "lost_steps": lost}


def check_lineage(run: RunLog, reference: RunLog, tolerance: float, *, learners: int = 1) -> dict:
    """A finished run against the uninterrupted one: the final weights descend from steps 1..total, one each, on
    exactly its batches; one learner with its per-step losses; the final score within ``tolerance``."""
    total = reference.training["steps"]
    assert run.training["steps"] == total, "the job did not finish"
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
    return {"stsb_dev": run.best_stsb_dev, "reference_stsb_dev": reference.best_stsb_dev, "tolerance": tolerance,
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


@dataclass
class KilledThenStopped:
    """One job through both default learner-side faults, then the same job again to its end."""

    workers: Workers  # the first job's (re)starts of the learners
    killed_pid: int | None
    signalled_after: int  # the step the driver had seen when it sent SIGTERM
    first: Watch  # the steps the first job's driver saw and what it printed
    stopped: PreemptedError  # how the first job ended
    stop_manifest: dict  # its last checkpoint's
    statuses_after_stop: list[str]  # of the MLflow runs then
    second: RunLog
    statuses: list[str]  # of the MLflow runs at the end


@pytest.fixture(scope="module")
def killed_then_stopped(distill_runs) -> KilledThenStopped:
    """Rank 0's Train worker process SIGKILLed when the driver saw step FAULT_AFTER_STEP (Train restarts it from the
    checkpoint), then SIGTERM to this process, the job's, when the restarted worker had trained to STOP_AFTER_STEP or
    further (it checkpoints at the next step boundary and the job raises ``PreemptedError``); then the same job
    again, to its end. One job for both faults, each checked against the uninterrupted run's steps: a Train run
    costs ~20 s to start on two cores, more than its 20 steps."""
    from mlflow import MlflowClient

    from raydistill.runtime.engine.stopping import StopOnSignals

    name = "killed-then-stopped"
    workers = Workers()
    killed: dict[str, int] = {}

    def kill_then_stop(step: int) -> None:
        if step == FAULT_AFTER_STEP and not killed:
            killed["pid"] = int(workers.current["pid"])
            os.kill(killed["pid"], signal.SIGKILL)  # what the OOM killer does: no exception handler, no cleanup
        elif step >= STOP_AFTER_STEP and len(workers.starts) == 2 and "stop" not in killed:
            # Only to the job's own handler: with Python's default one the signal would end this test session.
            handler = signal.getsignal(signal.SIGTERM)
            assert isinstance(getattr(handler, "__self__", None), StopOnSignals), f"SIGTERM handler {handler!r}"
            os.kill(os.getpid(), signal.SIGTERM)
            killed["stop"] = step

    try:
        distill_runs.run(name, on_step=kill_then_stop, on_start=workers, tracked=True)
    except PreemptedError as exc:
        stopped = exc
    else:
        pytest.fail(f"the job ran to its end: worker killed {killed.get('pid')}, SIGTERM after step "
                    f"{killed.get('stop')}, starts {[info['resumed_from'] for info in workers.starts]}")
    client = MlflowClient(distill_runs.tracking_uri)
    experiment = client.get_experiment_by_name(EXPERIMENT).experiment_id

    def statuses() -> list[str]:
        return sorted(run.info.status for run in client.search_runs(
            [experiment], filter_string=f"tags.mlflow.runName = '{name}'"))

    first = distill_runs.watches[name]
    run_dir = distill_runs.config(name).resolved_run_dir()
    stop_manifest, statuses_after_stop = ckpt.read_manifest(ckpt.latest_checkpoint(run_dir)), statuses()
    second = distill_runs.run(name, tracked=True)
    return KilledThenStopped(workers, killed.get("pid"), killed["stop"], first, stopped, stop_manifest,
                             statuses_after_stop, second, statuses())


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


def test_learner_worker_sigkilled_mid_epoch_resumes_from_the_checkpoint(killed_then_stopped, distill_runs,
                                                                        reliability):
    job, reference = killed_then_stopped, distill_runs.reference()
    assert job.killed_pid, "the learner's worker process was never killed"
    restart_line = next(line for line in job.first.out.splitlines() if RESTART_LINE in line)
    starts = job.workers.starts
    assert len(starts) == 2 and starts[0]["pid"] == job.killed_pid != starts[1]["pid"], "no single restart"
    numbers = check_replay(job.first.steps_seen, starts[1]["resumed_from"], job.stopped.step)
    # The whole replay is the steps after the checkpoint the kill followed (5, or 10 if the workers ran ahead).
    assert numbers["resumed_from"] in (5, 10)
    assert job.stop_manifest["extra"]["restarts"] == 1  # the restarted worker's checkpoints count the restart
    # The job, stopped later by SIGTERM and run again to its end, trained every step once, as the uninterrupted run.
    numbers.update(check_lineage(job.second, reference, EXACT_RESUME_TOLERANCE))
    reliability.record(
        "fault", "learner worker process SIGKILLed mid-epoch",
        input=f"os.kill(SIGKILL) of rank 0's Ray Train worker process (its pid from the workers' start event) "
              f"when the driver saw step {FAULT_AFTER_STEP} of {STEPS}",
        did=f"Ray Train saw the worker die and restarted the worker group (FailureConfig); the new worker loaded "
            f"checkpoint step {numbers['resumed_from']} and trained on (to step {job.stopped.step}, where the "
            f"SIGTERM case stopped the job, which the same job then finished: all {STEPS} steps)",
        message=restart_line.strip(), lost=lost_text(numbers), **numbers)


@pytest.fixture(scope="module")
def dropout_free_student(tmp_path_factory, real_sentences):
    """The tiny BERT without dropout: a Train worker of rank > 0 draws new dropout masks after a restart (only rank
    0's RNG is checkpointed), so only a student without dropout lets two workers' resumed run repeat the
    uninterrupted one step by step."""
    from tiny_models import make_tiny_model

    return make_tiny_model("bert", tmp_path_factory.mktemp("bert-no-dropout"), real_sentences, dropout=0.0)


def test_one_of_two_train_workers_sigkilled_both_stop_and_the_job_resumes_with_the_reference_losses(
        distill_runs, dropout_free_student, reliability):
    """Rank 1 of two Ray Train workers (DDP, gloo) SIGKILLed while rank 0 lives: rank 0 must not wait on its dead
    peer (a lone rank once blocked in a collective for over 10 minutes); the whole group stops, Train starts two new
    workers, both resume from the newest checkpoint and the run ends with the losses, batches and identical weights
    of the same job uninterrupted.

    The L2 baseline (no shared queue, whose content depends on which rank's push arrives first) and a student
    without dropout make a two-worker run repeatable to rounding, so the resumed run's losses are compared with an
    uninterrupted run of the same job, step by step."""
    import psutil

    from raydistill.methods import get_method
    from raydistill.runtime.engine.learner_group import LearnerGroup
    from raydistill.runtime.engine.preflight import preflight
    from raydistill.runtime.teachers.pipeline import build_training_data
    from tests.distill_fixtures import congen_config, quick_train_polls
    from tests.ray_fixtures import descendants

    distill_runs.reference()  # its teacher pass fills the cache this job's data reads

    def two_workers(run_name: str) -> JobConfig:
        job = congen_config(dropout_free_student, distill_runs.teacher, distill_runs.root, run_name,
                            corpus=distill_runs.corpus, learners=2)
        job.update(method="l2", loss={})
        job["data"].update(views={"a": "none"}, teacher_views=["a"])
        # A checkpoint every 2 steps, no dev evaluation before the end; a group that hangs fails the test in
        # minutes, not at the default learner timeout.
        job["train"].update(checkpoint_every=2, eval_every=100)
        job["runtime"]["learner_timeout_s"] = 120
        return preflight(JobConfig.from_dict(job))

    def fit(cfg: JobConfig, on_event=None):
        data = build_training_data(cfg)
        assert data.cache_stats["misses"] == 0
        group = LearnerGroup(cfg, get_method("l2"), run_dir=cfg.resolved_run_dir(), teacher_dim=data.teacher_dim)
        with quick_train_polls():
            return group.fit(data, on_event=on_event)

    reference = fit(two_workers("two-workers-reference"))
    cfg = two_workers("two-workers-rank1-killed")
    total = STEPS // 2  # 5 steps of 2 x 16 rows an epoch
    kill_after = 3  # after the checkpoint of step 2, before that of step 4
    starts: list[dict] = []
    losses_seen: dict[int, list[float]] = {}
    killed: dict[str, int] = {}

    def kill_rank_1(kind, info, step) -> None:
        if kind == "start":
            starts.append(dict(info, pid=int(info["pid"])))
        elif kind == "step":
            losses_seen.setdefault(step, []).append(float(info["loss"]))
            if step >= kill_after and not killed:
                rank0 = starts[-1]["pid"]
                others = [p for p in descendants("RayTrainWorker") if p.pid != rank0]
                assert len(others) == 1, f"rank 1's process among {[p.cmdline() for p in others]}"
                others[0].kill()  # SIGKILL, as the OOM killer would: no handler, no goodbye to its peer
                killed.update(pid=others[0].pid, after_step=step, survivor=rank0)

    summary = fit(cfg, on_event=kill_rank_1)
    assert killed, "rank 1 was never killed"
    assert len(starts) == 2 and summary["restarts"] == 1, f"starts {starts}, restarts {summary['restarts']}"
    # Both stopped: the survivor's process ended with its peer's, and Train started a new rank 0 as well as rank 1.
    survivor = killed["survivor"]
    assert starts[1]["pid"] not in (survivor, killed["pid"])
    deadline = time.monotonic() + 60
    while psutil.pid_exists(survivor) and psutil.Process(survivor).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, f"rank 0 (pid {survivor}) outlived its killed peer by a minute"
        time.sleep(0.1)
    resumed_from = summary["resumed_from"]
    assert resumed_from == starts[1]["resumed_from"] and resumed_from in (2, 4)
    assert summary["steps"] == reference["steps"] == total
    crcs = summary["weights_crc_by_rank"]
    assert len(crcs) == 2 and crcs[0] == crcs[1], "DDP left the workers with different weights"
    history = [row for row in summary["history"] if "loss" in row]
    reference_history = [row for row in reference["history"] if "loss" in row]
    assert [row["step"] for row in history] == [row["step"] for row in reference_history] == \
        list(range(1, total + 1))
    for rank in range(2):
        assert [row["batch_crc32_by_rank"][rank] for row in history] == \
            expected_batches(cfg, learners=2, rank=rank), f"rank {rank} skipped or repeated a batch"
    loss_diff = max(abs(row["loss"] - ref["loss"]) for row, ref in zip(history, reference_history))
    assert loss_diff <= 1e-5, f"the resumed run's losses differ from the uninterrupted run's by {loss_diff}"
    # The steps trained twice (lost with the first group, replayed by the second) gave the same loss both times.
    replayed = {step: seen for step, seen in losses_seen.items() if len(seen) > 1}
    assert all(max(seen) - min(seen) <= 1e-5 for seen in replayed.values()), replayed
    reliability.record(
        "fault", "one of two Train workers SIGKILLed",
        input=f"os.kill(SIGKILL) of rank 1 of two Ray Train workers (DDP, gloo) when the driver saw step "
              f"{killed['after_step']} of {total}; rank 0 left alive (checkpoint every 2 steps)",
        did=f"rank 0 stopped with its peer (its process gone), Ray Train started two new workers, both loaded "
            f"checkpoint step {resumed_from} and finished all {total} steps with identical weights; every step's "
            f"loss equals the uninterrupted run's (max difference {loss_diff:.1e}), each rank trained its batches "
            "once", lost=f"{len(replayed)} step(s) trained again after the resume",
        resumed_from=resumed_from, killed_after_step=killed["after_step"], replayed_steps=sorted(replayed),
        max_loss_difference=loss_diff)


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
            queues = workers.current["shared_actors"]  # the queue actors rank 0's QueueClients use
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


def test_sigterm_checkpoints_at_the_next_step_and_the_resume_redoes_nothing(killed_then_stopped, distill_runs,
                                                                           reliability):
    """SIGTERM (a preempted node) while the job trains: the job's handler asks the Train worker to stop, which
    finishes the step in flight and checkpoints there; the job ends its MLflow run KILLED and raises
    ``PreemptedError``; the same job started again resumes at that step, in the same MLflow run, and trains the
    uninterrupted run's steps.
    (The job's worker had been SIGKILLed and restarted before: the SIGKILL case.)"""
    job, reference = killed_then_stopped, distill_runs.reference()
    stopped_line = next(line for line in job.first.out.splitlines() if "stop requested (SIGTERM)" in line)
    last_step_before = max(job.first.steps_seen)
    # The step boundary after the signal: the last step the driver saw, checkpointed.
    assert STOP_AFTER_STEP <= job.signalled_after <= job.stopped.step == last_step_before < STEPS
    assert job.stop_manifest["step"] == last_step_before and job.stop_manifest["extra"]["preempted"]
    assert job.statuses_after_stop == ["KILLED"]

    run = job.second
    resumed_from = run.training["stages"][0]["resumed_from"]
    assert resumed_from == last_step_before  # 0 steps redone
    assert run.steps_seen == list(range(last_step_before + 1, STEPS + 1)), \
        f"the resumed job redid steps: {run.steps_seen[:3]}"
    assert run.training["restarts"] == 0
    loss_diff = check_lineage(run, reference, EXACT_RESUME_TOLERANCE)["max_loss_difference"]
    assert job.statuses == ["FINISHED"]  # the rerun continued the stopped MLflow run: one run for one training
    reliability.record(
        "fault", "sigterm-checkpoint",
        input=f"SIGTERM to the job's process after step {job.signalled_after} of {STEPS} (checkpoint every "
              f"{CHECKPOINT_EVERY}); then the same job with the same run_dir",
        did=f"finished the step in flight, wrote checkpoint step {last_step_before} at that step boundary, ended the "
            "MLflow run KILLED and raised PreemptedError (the job scripts exit with status 143 on it); the second run "
            "resumed at that step and its per-step losses equal the uninterrupted run's (max difference "
            f"{loss_diff:.1e})",
        message=stopped_line.strip(), lost="0 steps: the resumed job redid no step", lost_steps=0,
        resumed_from=resumed_from)


def test_unresponsive_learner_ends_the_job_within_the_timeout(distill_runs, reliability):
    """A learner worker that stops answering (SIGSTOP: alive to the OS and to Ray, but silent): the job ends after
    ``runtime.learner_timeout_s`` without an event of the workers, saying how to resume. (A killed Ray head is
    tests/test_cluster_faults.py.)"""
    from raydistill.runtime.engine.learner_group import LearnerUnresponsiveError

    # Longer than any gap between two events of this tiny job on a loaded machine (start-up has its own, longer
    # bound): the longest measured was the first step's, 12 s at load 26 on two cores.
    timeout_s = 20.0
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
