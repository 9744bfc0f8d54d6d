"""One local Ray per pytest session (a Ray start costs ~9 s here; docs/runtime.md, Ray behaviour).

Use it with ``from tests.ray_fixtures import ray_session`` (or ``pytest_plugins = ["tests.ray_fixtures"]``) and mark
the tests ``@pytest.mark.ray``. Importing the fixture into several modules gives pytest several fixture definitions;
the fixture is idempotent, so there is still one Ray per session, shut down once at the end.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from raydistill.runtime.engine.cluster import prepare_worker_environment, start_local_ray

_STATE: dict[str, str] = {}


@pytest.fixture(scope="session")
def ray_session():
    import ray

    from raydistill.runtime.engine.cluster import configure_data_context

    os.environ.setdefault("RAYDISTILL_ACTOR_WAIT_S", "120")  # a starved actor pool fails the test, not hangs it

    if not ray.is_initialized():
        prepare_worker_environment()  # offline HF, no usage stats, raydistill importable in workers
        # A short private temp dir: AF_UNIX socket paths must stay under ~107 bytes, and parallel pytest sessions of
        # different engineers must not share session_latest.
        temp_dir = tempfile.mkdtemp(prefix="rd-ray-", dir="/tmp")
        # With the state API, through which Ray Train removes the placement group of a Train run whose controller
        # died (a Tune trial that ASHA stopped); a Ray start costs the same with it.
        for attempt in (1, 2):
            try:
                start_local_ray(dashboard=True, num_cpus=2, object_store_memory=256 * 2**20,
                                _temp_dir=temp_dir, log_to_driver=True)
                break
            except Exception:
                # Ray gives its raylet 30 s to register; on a machine loaded by other test sessions it can miss that
                # once. A second start is cheaper than every Ray test of the session failing at setup.
                ray.shutdown()
                if attempt == 2:
                    raise
        _STATE["temp_dir"] = temp_dir
    configure_data_context()
    yield ray
    if ray.is_initialized() and _STATE.get("temp_dir"):
        ray.shutdown()
        shutil.rmtree(_STATE.pop("temp_dir"), ignore_errors=True)


def descendants(title: str) -> list:
    """This process's descendants (the local Ray's raylet and its workers) whose command line contains ``title``;
    Ray workers show ``ray::<Class>.<method>`` there. Other users' Ray processes are never touched."""
    import psutil

    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            if title in " ".join(process.cmdline()):
                found.append(process)
        except psutil.Error:
            continue
    return found


def faulty_pass_batches(real_batches, faults: dict, seen: dict, cache_dir=None, title: str = "TeacherEmbed"):
    """Wrap a teacher pass's stream of batches (``embedding_cache._ray_data_batches``) so that faults land at exact
    points of it, in the driver, whatever the machine's speed. ``faults`` maps the number of batches the driver has
    received to one fault, done before the next batch is asked for:

    * ``"kill"``: SIGKILL of the pool actor ``title`` while it embeds a block (its process title then ends in
      ``.submit``; waited for, up to 120 s), pid in ``seen["killed_pid"]``; a later batch from another live pool
      process records ``seen["restarted_pid"]``;
    * ``"sigint"``: SIGINT of this process, the job's Ctrl-C; ``seen["sigint_at_batch"]``.

    With ``cache_dir``, the cache parts on disk at each fault go in ``seen["parts_at_<fault>"]``.

    Triggering on batches received rather than polling from a thread: a thread racing the pass missed it on a slow
    machine (the pass ended first).
    """
    import signal
    import time

    def wrapped(*args, **kwargs):
        received = 0
        for batch in real_batches(*args, **kwargs):
            if "killed_pid" in seen and "restarted_pid" not in seen:
                seen.update({"restarted_pid": p.pid for p in descendants(title)
                             if p.pid != seen["killed_pid"] and p.is_running()})
            yield batch
            received += 1
            fault = faults.get(received)
            if fault and cache_dir is not None:
                seen[f"parts_at_{fault}"] = len(list(cache_dir.glob("part-*.npy")))
            if fault == "kill":
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    busy = [p for p in descendants(title) if ".submit" in " ".join(p.cmdline())]
                    if busy:
                        busy[0].kill()
                        seen["killed_pid"] = busy[0].pid
                        break
                    time.sleep(0.005)
            elif fault == "sigint":
                seen["sigint_at_batch"] = received
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)  # the KeyboardInterrupt lands here, inside the pass
    return wrapped
