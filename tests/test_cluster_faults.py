"""Losing a Ray node or the Ray head, for real, on Ray clusters started on this machine.

* ``node-lost``: a two-node cluster (``ray.cluster_utils.Cluster``: a head without CPUs, where the driver and Train's
  controller live, and two worker nodes of 2 CPUs); the node hosting the Train worker is removed mid-epoch (its raylet
  and every process on it killed). Train's ``FailureConfig`` restarts the worker group on the node that remains, the
  new worker resumes from the newest checkpoint, and every step's loss equals the uninterrupted run's.
* ``ray-head-lost``: a job whose driver is connected to a ``ray start --head`` cluster; the head's GCS and raylet are
  SIGKILLed mid-epoch. Nothing survives the head (the workers and the Train controller die with it); the driver
  fails with Ray's error naming the lost GCS, and the same command against a new head resumes from the checkpoint.

Each job is the tiny ConGen job of ``tests/distill_fixtures.py`` run by a driver in a subprocess (a driver joins one
cluster; this pytest process already runs the session's Ray), compared with that module's uninterrupted reference.

Marked ``e2e`` (minutes each; ``pytest -m e2e``): the default run guards each of these faults where it happens.
A lost node is a dead Train worker to Ray Train: tests/test_faults.py SIGKILLs the worker process and checks the
restart and the exact resume. A lost head leaves a run dir that the same command resumes: the SIGTERM test there
resumes a second driver from its checkpoint with the uninterrupted run's losses, and tests/test_checkpoint.py takes
over the stale run-dir lock a killed driver leaves. A family pinned to a node is a resource request on its actors:
tests/test_mutual_tenc.py checks what the families ask for against what the cluster has.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.distill_fixtures import (  # noqa: F401 - distill_runs and teacher_dir are fixtures
    CHECKPOINT_EVERY,
    STEPS,
    RunLog,
    distill_runs,
    final_history,
    teacher_dir,
)
from tests.ray_fixtures import ray_session  # noqa: F401 - the session-wide Ray fixture

pytest_plugins = ["tests.reliability_log"]
pytestmark = [pytest.mark.ray, pytest.mark.e2e]

FAULT_AFTER_STEP = 7  # mid-epoch (10 steps an epoch), after the checkpoint of step 5
STEP_LINE = re.compile(r"^\[congen\] step (\d+)/")
DRIVER = """\
import json, sys
from raydistill.config.job import JobConfig
from raydistill.runtime.jobs.distill import run_distillation

record = run_distillation(JobConfig.from_yaml(sys.argv[1]), result_path=sys.argv[2], evaluate=False)
print("TRAINING " + json.dumps(record["training"]), flush=True)
"""
NODE_RESOURCES = ("node_a", "node_b")
# The driver of a lost head gives up reconnecting to its GCS after this long (Ray's default: 60 s).
GCS_RECONNECT_S = 10


class Driver:
    """``DRIVER`` on one job config, as a subprocess joined to the cluster at ``address``."""

    def __init__(self, tmp_path: Path, cfg, name: str):
        self.tmp_path, self.name = tmp_path, name
        cfg.to_yaml(tmp_path / f"{name}.yaml")
        (tmp_path / "driver.py").write_text(DRIVER)
        self.command = [sys.executable, str(tmp_path / "driver.py"), str(tmp_path / f"{name}.yaml"),
                        str(tmp_path / f"{name}-result.json")]

    def env(self, address: str) -> dict[str, str]:
        return {**os.environ, "RAY_ADDRESS": address, "PYTHONUNBUFFERED": "1",
                "RAY_gcs_rpc_server_reconnect_timeout_s": str(GCS_RECONNECT_S)}

    def start(self, address: str, log: Path) -> subprocess.Popen:
        with log.open("w") as out:
            return subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT, env=self.env(address))

    def run(self, address: str, timeout: float = 400) -> subprocess.CompletedProcess:
        return subprocess.run(self.command, capture_output=True, text=True, env=self.env(address), timeout=timeout)


def wait_for_step(driver: subprocess.Popen, log: Path, step: int, timeout: float = 300) -> None:
    marker = f"[congen] step {step}/{STEPS}"
    deadline = time.time() + timeout
    while marker not in log.read_text() and driver.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    assert marker in log.read_text(), f"the job never reached step {step}:\n{log.read_text()[-3000:]}"


def steps_printed(text: str) -> list[int]:
    return [int(match.group(1)) for line in text.splitlines() if (match := STEP_LINE.match(line.strip()))]


def training_of(stdout: str) -> dict:
    return json.loads(stdout.split("TRAINING ", 1)[1].splitlines()[0])


def compare_with_reference(cfg, training: dict, reference: RunLog) -> float:
    """Every step 1..STEPS once in the final weights' lineage, on the reference's batches; the largest per-step loss
    difference from the uninterrupted run."""
    run = RunLog({"training": training}, [], final_history(cfg.resolved_run_dir()), cfg.resolved_run_dir())
    assert training["steps"] == STEPS
    assert [row["step"] for row in run.history if "loss" in row] == list(range(1, STEPS + 1))
    assert run.batches() == reference.batches()
    losses, reference_losses = run.losses(), reference.losses()
    return max(abs(losses[step] - reference_losses[step]) for step in reference_losses)


def processes_of(temp_dir: str):
    """The Ray processes started with ``temp_dir`` (GCS, raylet, dashboard, log monitor): only this test's."""
    import psutil

    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if temp_dir in " ".join(process.info["cmdline"] or []):
                found.append(process)
        except psutil.Error:
            continue
    return found


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


# ----------------------------------------------------------------------------------------------------------------
# A node lost


@pytest.fixture(scope="module")
def two_nodes(ray_session):
    """A head without CPUs (driver, Train controller) and two worker nodes of 2 CPUs, shared by the module's tests.
    Each worker node alone fits the learner (1 CPU) and a Ray Data task (which asks for a whole CPU)."""
    from ray.cluster_utils import Cluster

    temp_dir = tempfile.mkdtemp(prefix="rd-2n-", dir="/tmp")  # short: AF_UNIX socket paths
    cluster = Cluster()
    try:
        retried_once(lambda: cluster.add_node(num_cpus=0, temp_dir=temp_dir, include_dashboard=False,
                                              object_store_memory=128 * 2**20))
        cluster.node_of_resource = {}
        for resource in NODE_RESOURCES:  # a custom resource per node: a Trans-Encoder family can be pinned to it
            node = retried_once(lambda: cluster.add_node(num_cpus=2, resources={resource: 2},
                                                         object_store_memory=128 * 2**20))
            cluster.node_of_resource[resource] = node.node_id
        yield cluster
    finally:
        cluster.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


def restore_nodes(cluster) -> None:
    """A node of each custom resource again, where a test removed one."""
    alive = {node.node_id for node in cluster.worker_nodes}
    for resource in NODE_RESOURCES:
        if cluster.node_of_resource.get(resource) not in alive:
            node = retried_once(lambda: cluster.add_node(num_cpus=2, resources={resource: 2},
                                                         object_store_memory=128 * 2**20))
            cluster.node_of_resource[resource] = node.node_id
    cluster.wait_for_nodes()


def retried_once(start):
    """``start()`` again if Ray's node start-up gave up: it waits 30 s for a raylet to register, which a machine
    loaded by other test sessions can miss."""
    try:
        return start()
    except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception for this
        if "timed out during startup" not in str(exc):
            raise
        return start()


def node_hosting(cluster, title: str):
    """The worker node whose raylet started the process whose title contains ``title``."""
    import psutil

    for node in cluster.worker_nodes:
        raylet = psutil.Process(node.all_processes["raylet"][0].process.pid)
        if any(title in " ".join(child.cmdline()) for child in raylet.children(recursive=True)):
            return node
    return None


def test_node_hosting_the_train_worker_lost_mid_epoch_resumes_on_the_node_that_remains(two_nodes, distill_runs,
                                                                                       tmp_path, reliability):
    reference = distill_runs.reference()
    cfg = distill_runs.config("node-lost")
    driver = Driver(tmp_path, cfg, "node-lost")
    log = tmp_path / "node-lost.log"
    started = time.monotonic()
    process = driver.start(two_nodes.address, log)
    try:
        wait_for_step(process, log, FAULT_AFTER_STEP)
        lost = node_hosting(two_nodes, "RayTrainWorker")
        assert lost is not None, "no worker node hosts the Train worker"
        two_nodes.remove_node(lost, allow_graceful=False)  # its raylet and every worker on it SIGKILLed
        status = process.wait(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
    seconds = time.monotonic() - started
    text = log.read_text()
    assert status == 0, text[-4000:]
    training = training_of(text)
    restart_line = next(line.strip() for line in text.splitlines() if "learner worker died" in line)
    seen = steps_printed(text)
    restart_at = next(i for i in range(1, len(seen)) if seen[i] <= seen[i - 1])  # the first step trained again
    last_before = seen[restart_at - 1]
    resumed_from = training["stages"][0]["resumed_from"]
    loss_diff = compare_with_reference(cfg, training, reference)
    reliability.record(
        "fault", "node-lost",
        input=f"a two-node Ray cluster on this machine (ray.cluster_utils.Cluster: a head without CPUs, two worker "
              f"nodes of 2 CPUs); the node hosting the Train worker removed (raylet and its workers SIGKILLed) after "
              f"step {FAULT_AFTER_STEP} of {STEPS}; checkpoint every {CHECKPOINT_EVERY} steps",
        did=f"Ray Train saw the worker die with its node and restarted the worker group on the node that remained "
            f"(FailureConfig); the new worker resumed from checkpoint step {resumed_from} and finished all {STEPS} "
            f"steps; every step's loss equals the uninterrupted run's (max difference {loss_diff:.1e})",
        message=restart_line, lost=f"the steps after checkpoint step {resumed_from}, trained again",
        resumed_from=resumed_from, restarts=training["restarts"], max_loss_difference=loss_diff,
        seconds=round(seconds))
    assert training["restarts"] == 1
    assert resumed_from in (CHECKPOINT_EVERY, 2 * CHECKPOINT_EVERY) and last_before - resumed_from <= CHECKPOINT_EVERY
    assert loss_diff <= 1e-5, f"the resumed run's per-step losses differ from the uninterrupted run's by {loss_diff}"


# ----------------------------------------------------------------------------------------------------------------
# The head lost


class RayHead:
    """A ``ray start --head`` cluster of its own temp dir and port, as an operator starts one."""

    def __init__(self):
        self.temp_dir = tempfile.mkdtemp(prefix="rd-head-", dir="/tmp")
        port = free_port()
        started = subprocess.run(
            [str(Path(sys.executable).with_name("ray")), "start", "--head", f"--port={port}", "--num-cpus=2",
             f"--temp-dir={self.temp_dir}", "--include-dashboard=false", f"--object-store-memory={256 * 2**20}"],
            capture_output=True, text=True, timeout=180)
        assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
        self.address = re.search(rf"(\d+\.\d+\.\d+\.\d+:{port})", started.stdout).group(1)

    def kill(self) -> list[str]:
        """SIGKILL the head's GCS and raylet; returns their names."""
        head = [p for p in processes_of(self.temp_dir) if p.name() in ("gcs_server", "raylet")]
        for process in head:
            process.send_signal(signal.SIGKILL)
        return sorted(process.name() for process in head)

    def remove(self) -> None:
        for process in processes_of(self.temp_dir):
            try:
                process.kill()
            except Exception:  # noqa: BLE001 - already gone
                pass
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def test_ray_head_killed_mid_epoch_fails_the_job_and_a_new_head_resumes_it(distill_runs, ray_session, tmp_path,
                                                                          reliability):
    reference = distill_runs.reference()
    cfg = distill_runs.config("head-lost")
    driver = Driver(tmp_path, cfg, "head-lost")
    log = tmp_path / "head-lost.log"
    started = time.monotonic()
    head = RayHead()
    try:
        process = driver.start(head.address, log)
        try:
            wait_for_step(process, log, FAULT_AFTER_STEP)
            killed = head.kill()
            killed_at = time.monotonic()
            status = process.wait(timeout=GCS_RECONNECT_S + 120)
            failed_after = time.monotonic() - killed_at
        finally:
            if process.poll() is None:
                process.kill()
    finally:
        head.remove()
    first = log.read_text()
    assert killed == ["gcs_server", "raylet"], killed
    error_line = next((line.strip() for line in first.splitlines() if "Failed to connect to GCS" in line), None)
    last_before = max(steps_printed(first))

    # A new head: the session's Ray, started by this pytest process; the same command with the same run dir.
    second = driver.run(ray_session.get_runtime_context().gcs_address)
    seconds = time.monotonic() - started
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    training = training_of(second.stdout)
    resumed_from = training["stages"][0]["resumed_from"]
    loss_diff = compare_with_reference(cfg, training, reference)
    reliability.record(
        "fault", "ray-head-lost",
        input=f"a job connected to a `ray start --head` cluster; the head's gcs_server and raylet SIGKILLed after "
              f"step {last_before} of {STEPS} (checkpoint every {CHECKPOINT_EVERY}); then the same command against "
              "a new head",
        did=f"the Train controller and worker died with the head; the driver exited with status {status} "
            f"{failed_after:.0f} s later, Ray's error naming the lost GCS (reconnect limit "
            f"RAY_gcs_rpc_server_reconnect_timeout_s={GCS_RECONNECT_S}, default 60); the second run found "
            f"checkpoint step {resumed_from} in the run dir and resumed there; every step's loss equals the "
            f"uninterrupted run's (max difference {loss_diff:.1e})",
        message=error_line or first.strip().splitlines()[-1], lost=f"steps {resumed_from + 1}-{last_before}, "
        "trained again after the resume", resumed_from=resumed_from, last_step_before=last_before,
        max_loss_difference=loss_diff, seconds=round(seconds))
    assert status != 0 and "TRAINING" not in first, f"the job did not fail with its head:\n{first[-3000:]}"
    assert error_line is not None, f"no error naming the lost GCS:\n{first[-3000:]}"
    assert failed_after <= GCS_RECONNECT_S + 60, f"the driver took {failed_after:.0f} s to fail"
    assert training["restarts"] == 0 and resumed_from == CHECKPOINT_EVERY
    assert loss_diff <= 1e-5, f"the resumed run's per-step losses differ from the uninterrupted run's by {loss_diff}"


# ----------------------------------------------------------------------------------------------------------------
# One Trans-Encoder family per node


TENC_DRIVER = """\
import json, sys
from raydistill.runtime.tenc import run_trans_encoder
from raydistill.runtime.tenc.config import TencConfig

run_trans_encoder(TencConfig.from_yaml(sys.argv[1]))
"""


def test_the_two_node_cluster_runs_one_trans_encoder_family_per_node(two_nodes, tiny_models, tmp_path, reliability):
    """resources.families pins each family's bi- and cross-encoder actor to a node's custom resource; every stage
    of every family is trained on its own node (the node id each learner records in state.json)."""
    from tests.test_mutual_tenc import tiny_config

    restore_nodes(two_nodes)  # the node-lost test removed one
    cfg = tiny_config(tiny_models, tmp_path, resources={
        "num_cpus": 2, "bi": {"num_cpus": 0.25, "threads": 1, "batch_size": 512},
        "cross": {"num_cpus": 0.25, "threads": 1, "batch_size": 512}, "data_max_cpus": 1.0,
        "families": {"bert": {"node_a": 1}, "mpnet": {"node_b": 1}}})
    (tmp_path / "job.yaml").write_text(json.dumps(cfg.to_dict()))  # JSON is YAML
    (tmp_path / "tenc_driver.py").write_text(TENC_DRIVER)
    env = {**os.environ, "RAY_ADDRESS": two_nodes.address, "PYTHONUNBUFFERED": "1"}
    done = subprocess.run([sys.executable, str(tmp_path / "tenc_driver.py"), str(tmp_path / "job.yaml")],
                          capture_output=True, text=True, env=env, timeout=600)
    expected = {"bert": two_nodes.node_of_resource["node_a"], "mpnet": two_nodes.node_of_resource["node_b"]}
    state = json.loads((tmp_path / "run" / "state.json").read_text()) if done.returncode == 0 else {"stages": {}}
    trained_on = {(stage, family): summary.get("node_id") for stage, record in state["stages"].items()
                  for family, summary in record["families"].items()}
    reliability.record(
        "fault", "node-lost",
        input="the same two-node cluster; a mutual Trans-Encoder job with resources.families {bert: {node_a: 1}, "
              "mpnet: {node_b: 1}} (each worker node started with its own custom resource)",
        did=f"exit status {done.returncode}; every stage of each family trained on the node of its resource "
            f"({len(trained_on)} stage-family pairs, {len(set(trained_on.values()))} distinct nodes)",
        lost="nothing")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert len(trained_on) == 4  # two stages of one cycle, two families
    assert all(node == expected[family] for (_, family), node in trained_on.items()), (trained_on, expected)
