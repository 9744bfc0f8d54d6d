"""Checkpoints: atomic writes (a real crash mid-write), keep_last pruning, config-hash refusal, round trips; output
directories that cannot be written (or a full disk) fail early with a clear message. Reliability cases are recorded
for docs/reliability.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from raydistill.runtime.engine import checkpoint as ckpt
from raydistill.runtime.engine import resume, rundir
from raydistill.config.job import ConfigError, JobConfig

pytest_plugins = ["tests.reliability_log"]

REPO = Path(__file__).resolve().parents[1]


def make_config(**train) -> JobConfig:
    return JobConfig.from_dict({"method": "congen", "student": "bert-tiny", "teacher": "minilm-l6",
                                "train": {"lr": 5e-4, **train}})


def test_round_trip_manifest_and_state(tmp_path):
    cfg = make_config()
    weights = torch.randn(4, 3)
    path = ckpt.save_checkpoint(tmp_path, step=12, epoch=1, batch_in_epoch=5, config=cfg,
                                state={"student": {"w": weights}, "rng": {"torch": torch.get_rng_state()}},
                                extra={"note": "x"})
    assert path == tmp_path / "checkpoints" / "step-0000012"
    manifest, state = ckpt.load_checkpoint(path, config=cfg)
    assert (manifest["step"], manifest["epoch"], manifest["batch_in_epoch"]) == (12, 1, 5)
    assert manifest["config_hash"] == cfg.config_hash()
    assert manifest["extra"] == {"note": "x"}
    assert {"git_sha", "raydistill_version", "created"} <= manifest.keys()
    assert torch.equal(state["student"]["w"], weights)
    assert ckpt.latest_checkpoint(tmp_path) == path


def test_keep_last_prunes_oldest(tmp_path):
    cfg = make_config()
    for step in (10, 20, 30, 40, 50):
        ckpt.save_checkpoint(tmp_path, step=step, epoch=0, batch_in_epoch=step, config=cfg,
                             state={"s": {"step": step}}, keep_last=2)
    names = [p.name for p in ckpt.list_checkpoints(tmp_path)]
    assert names == ["step-0000040", "step-0000050"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == names


def test_resaving_a_step_replaces_it(tmp_path):
    cfg = make_config()
    ckpt.save_checkpoint(tmp_path, step=5, epoch=0, batch_in_epoch=5, config=cfg, state={"s": {"v": 1}})
    ckpt.save_checkpoint(tmp_path, step=5, epoch=0, batch_in_epoch=5, config=cfg, state={"s": {"v": 2}})
    _, state = ckpt.load_checkpoint(ckpt.latest_checkpoint(tmp_path), config=cfg)
    assert state["s"] == {"v": 2}
    assert len(list((tmp_path / "checkpoints").iterdir())) == 1


def test_crash_mid_write_leaves_previous_checkpoint_intact(tmp_path, reliability):
    """A process that dies while pickling its second file must leave step 1 loadable and step 2 invisible."""
    script = textwrap.dedent(f"""
        import os, sys, torch
        sys.path.insert(0, {str(REPO)!r})
        from raydistill.runtime.engine import checkpoint as ckpt
        from raydistill.config.job import JobConfig

        class DiesWhilePickled:
            def __reduce__(self):
                os._exit(3)          # the process dies here, with student.pt already on disk

        cfg = JobConfig.from_dict({{"method": "congen", "student": "bert-tiny", "teacher": "minilm-l6",
                                    "train": {{"lr": 5e-4}}}})
        run_dir = {str(tmp_path)!r}
        ckpt.save_checkpoint(run_dir, step=1, epoch=0, batch_in_epoch=1, config=cfg,
                             state={{"student": {{"w": torch.ones(1000)}}, "optimizer": {{"m": 1}}}})
        ckpt.save_checkpoint(run_dir, step=2, epoch=0, batch_in_epoch=2, config=cfg,
                             state={{"student": {{"w": torch.full((1000,), 2.0)}}, "optimizer": DiesWhilePickled()}})
        print("not reached")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert "not reached" not in proc.stdout

    root = tmp_path / "checkpoints"
    leftovers = sorted(p.name for p in root.iterdir())
    assert "step-0000001" in leftovers
    partial = [name for name in leftovers if name.startswith(".step-0000002.tmp-")]
    assert partial, f"expected the half-written step-2 directory, found {leftovers}"
    assert not (root / partial[0] / ckpt.MANIFEST).exists()

    cfg = make_config()
    latest = ckpt.latest_checkpoint(tmp_path)
    assert latest == root / "step-0000001"
    manifest, state = ckpt.load_checkpoint(latest, config=cfg)
    assert manifest["step"] == 1 and torch.equal(state["student"]["w"], torch.ones(1000))

    # The next save (by a live process) sweeps the dead writer's temporary directory.
    ckpt.save_checkpoint(tmp_path, step=2, epoch=0, batch_in_epoch=2, config=cfg, state={"s": {}})
    assert sorted(p.name for p in root.iterdir()) == ["step-0000001", "step-0000002"]
    reliability.record("checkpoint", "process killed while writing a checkpoint",
                       input="os._exit while pickling the 2nd file of step 2",
                       did="step 2 stayed a .step-0000002.tmp-<pid> directory without a manifest, never listed or "
                           "loaded; step 1 loads; the next save swept the leftover",
                       lost="the steps since step 1 (at most one checkpoint interval)")


def test_checkpoint_of_another_config_is_refused_with_the_differing_keys(tmp_path, reliability):
    written_by = make_config()
    path = ckpt.save_checkpoint(tmp_path, step=3, epoch=0, batch_in_epoch=3, config=written_by, state={"s": {}})
    other = make_config(lr=1e-4)
    with pytest.raises(ckpt.CheckpointMismatchError) as excinfo:
        ckpt.load_checkpoint(path, config=other)
    message = str(excinfo.value)
    assert "train.lr" in message and "0.0005" in message and "0.0001" in message
    assert written_by.config_hash() in message and other.config_hash() in message
    reliability.record("checkpoint", "resuming with a different config", input="checkpoint written with train.lr "
                       "5e-4, resumed with 1e-4", did="refused (CheckpointMismatchError) naming both config hashes "
                       "and the differing keys", message=message, lost="nothing: the checkpoint is left as it was")


def test_fields_that_do_not_change_training_do_not_block_resume(tmp_path):
    cfg = make_config()
    path = ckpt.save_checkpoint(tmp_path, step=3, epoch=0, batch_in_epoch=3, config=cfg, state={"s": {}})
    moved = cfg.with_overrides(["resources.learner.num_learners=2", "train.eval_every=7", "tracking.enabled=false"])
    manifest, _ = ckpt.load_checkpoint(path, config=moved)
    assert manifest["step"] == 3


def test_unreadable_manifest_names_the_file(tmp_path, reliability):
    cfg = make_config()
    path = ckpt.save_checkpoint(tmp_path, step=1, epoch=0, batch_in_epoch=1, config=cfg, state={"s": {}})
    (path / ckpt.MANIFEST).write_text("{not json")
    with pytest.raises(ckpt.CheckpointError, match="manifest.json:1"):
        ckpt.read_manifest(path)
    data = {"format": ckpt.FORMAT, "files": [{"name": "missing.pt", "size": 1, "sha256": "0" * 64}],
            "config_hash": cfg.config_hash()}
    (path / ckpt.MANIFEST).write_text(json.dumps(data))
    with pytest.raises(ckpt.CheckpointError, match="missing.pt") as caught:
        ckpt.load_checkpoint(path, config=cfg)
    assert os.path.isdir(path)
    reliability.record("checkpoint", "damaged checkpoint", input="manifest.json that is not JSON; a manifest listing "
                       "a missing file", did="refused (CheckpointError) naming the file", message=str(caught.value),
                       lost="nothing: the directory is left for inspection")


# ----------------------------------------------------------------------------------------------------------------
# Output directories that cannot be written, and a disk that fills up


@pytest.fixture
def no_ray_start(monkeypatch):
    """The job must refuse before it starts Ray (and so before any model loads)."""
    from raydistill.runtime.engine import cluster

    def started(*args, **kwargs):
        raise AssertionError("the job started Ray before refusing its output directory")

    monkeypatch.setattr(cluster, "init_ray", started)


def job_dict(tmp_path: Path, **fields) -> dict:
    # Tests run as root, where chmod does not stop writes: a path below a regular file is unwritable for anyone.
    return {"method": "congen", "student": "bert-tiny", "teacher": "minilm-l6",
            "run_dir": str(tmp_path / "run"), "cache_dir": str(tmp_path / "cache"), **fields}


@pytest.mark.parametrize("field", ["run_dir", "cache_dir"])
def test_unwritable_output_dir_fails_before_the_job_starts(tmp_path, field, no_ray_start, reliability):
    from raydistill.runtime.jobs.distill import run_distillation

    blocker = tmp_path / "afile"
    blocker.write_text("a file where a directory should be")
    cfg = JobConfig.from_dict(job_dict(tmp_path, **{field: str(blocker / "sub")}))
    with pytest.raises(ConfigError) as caught:
        run_distillation(cfg, results_dir=tmp_path / "results")
    assert str(caught.value) == f"field '{field}': {blocker / 'sub'}: cannot create this directory: {blocker} is a file"
    assert not (tmp_path / "run").exists() and not (tmp_path / "results").exists()
    reliability.record("output dir", f"unwritable {field}", input=f"{field} below a regular file",
                       did="run_distillation refused the config (ConfigError from preflight)",
                       message=str(caught.value), lost="nothing: no Ray, no model loaded")


def test_unwritable_results_dir_fails_before_training(tmp_path, no_ray_start, reliability):
    from raydistill.runtime.jobs.distill import run_distillation

    blocker = tmp_path / "afile"
    blocker.write_text("x")
    cfg = JobConfig.from_dict(job_dict(tmp_path))
    with pytest.raises(ConfigError) as caught:
        run_distillation(cfg, results_dir=blocker / "results")
    assert str(caught.value) == f"results dir: {blocker / 'results'}: cannot create this directory: {blocker} is a file"
    reliability.record("output dir", "unwritable results dir", input="results_dir below a regular file",
                       did="refused before Ray starts, not when the result file is written after training",
                       message=str(caught.value), lost="nothing: no Ray, no model loaded")


def test_output_dir_checks(tmp_path, reliability):
    ok = rundir.check_output_dir(tmp_path / "new" / "deeper")
    assert ok == tmp_path / "new" / "deeper" and not (tmp_path / "new").exists()  # judged, not created
    assert list(tmp_path.iterdir()) == []  # the write probe is gone
    # A real free-space query of this filesystem against a threshold no disk meets.
    with pytest.raises(rundir.OutputDirError, match=r"MiB free on its filesystem; a run needs at least") as caught:
        rundir.check_output_dir(tmp_path, min_free_bytes=2**62)
    reliability.record("output dir", "not enough free disk at the start", input="a filesystem with less free space "
                       f"than the run needs (default threshold {rundir.MIN_FREE_BYTES // 2**20} MiB; here 4 EiB asked)",
                       did="refused by preflight (check_output_dir)", message=str(caught.value),
                       lost="nothing: no Ray, no model loaded")


def test_disk_full_while_writing_a_checkpoint(tmp_path, reliability):
    """A real write failure: the child process may write at most 300 kB per file (RLIMIT_FSIZE)."""
    script = textwrap.dedent(f"""
        import resource, signal, sys, torch
        sys.path.insert(0, {str(REPO)!r})
        from raydistill.runtime.engine import checkpoint as ckpt
        from raydistill.config.job import JobConfig

        cfg = JobConfig.from_dict({{"method": "congen", "student": "bert-tiny", "teacher": "minilm-l6",
                                    "train": {{"lr": 5e-4}}}})
        run_dir = {str(tmp_path)!r}
        ckpt.save_checkpoint(run_dir, step=1, epoch=0, batch_in_epoch=1, config=cfg,
                             state={{"student": {{"w": torch.ones(1000)}}}})
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (300_000, 300_000))
        try:
            ckpt.save_checkpoint(run_dir, step=2, epoch=0, batch_in_epoch=2, config=cfg,
                                 state={{"student": {{"w": torch.ones(1_000_000)}}}})
        except ckpt.CheckpointError as exc:
            print(exc)
            sys.exit(7)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 7, proc.stderr
    message = proc.stdout.strip()
    root = tmp_path / "checkpoints"
    assert message.startswith(f"{root}: out of space writing step-0000002 (File too large; ")
    assert message.endswith("the previous checkpoint step-0000001 is intact. Free space and re-run with the same "
                            "run_dir to resume.")
    assert sorted(p.name for p in root.iterdir()) == ["step-0000001"]  # the half-written step 2 is gone
    manifest, state = ckpt.load_checkpoint(root / "step-0000001", config=make_config())
    assert manifest["step"] == 1 and torch.equal(state["student"]["w"], torch.ones(1000))
    reliability.record("output dir", "disk full while writing a checkpoint", input="a 4 MB checkpoint with writes "
                       "capped at 300 kB per file (RLIMIT_FSIZE: a real EFBIG from the kernel)",
                       did="CheckpointError saying so; the half-written directory removed; the previous checkpoint "
                           "loads", message=message, lost="the steps since the previous checkpoint")


# ----------------------------------------------------------------------------------------------------------------
# Loading never executes code; damaged files are named and skipped


def write_manifest(path: Path, manifest: dict) -> None:
    (path / ckpt.MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")


def file_entry(file: Path, name: str | None = None) -> dict:
    import hashlib

    return {"name": name or file.name, "size": file.stat().st_size,
            "sha256": hashlib.sha256(file.read_bytes()).hexdigest()}


class WritesMarkerWhenUnpickled:
    """A pickle payload: unpickling it runs ``exec``, which creates the marker file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({str(self.marker)!r}, 'w').write('unpickled')",)


def test_crafted_manifest_or_pickle_payload_is_refused_before_unpickling(tmp_path, reliability):
    cfg = make_config()
    run_dir = tmp_path / "run"
    path = ckpt.save_checkpoint(run_dir, step=4, epoch=0, batch_in_epoch=4, config=cfg,
                                state={"student": {"w": torch.ones(3)}})
    manifest = ckpt.read_manifest(path)
    marker = tmp_path / "code-ran"
    payload = tmp_path / "payload.pt"
    torch.save({"w": WritesMarkerWhenUnpickled(marker)}, payload)
    assert not marker.exists()
    messages = {}

    # 1. A name that climbs out of the checkpoint directory to a file the attacker controls.
    outside = tmp_path / "evil.pt"
    outside.write_bytes(payload.read_bytes())
    write_manifest(path, {**manifest, "files": [file_entry(outside, "../../../evil.pt")]})
    with pytest.raises(ckpt.CheckpointError, match=r"refused file name '\.\./\.\./\.\./evil\.pt'") as caught:
        ckpt.load_checkpoint(path, config=cfg)
    messages["dotdot"] = str(caught.value)

    # 2. An absolute name.
    write_manifest(path, {**manifest, "files": [file_entry(outside, str(outside))]})
    with pytest.raises(ckpt.CheckpointError, match="refused file name") as caught:
        ckpt.load_checkpoint(path, config=cfg)
    messages["absolute"] = str(caught.value)

    # 3. A pickle payload under a legitimate name, with a manifest whose size and sha256 match it (whoever can write
    #    the run dir can rewrite both): weights_only loading refuses the object instead of running it.
    (path / "student.pt").write_bytes(payload.read_bytes())
    write_manifest(path, {**manifest, "files": [file_entry(path / "student.pt")]})
    with pytest.raises(ckpt.CheckpointError, match="student.pt: refused: holds objects other than tensors") as caught:
        ckpt.load_checkpoint(path, config=cfg)
    messages["payload"] = str(caught.value)

    assert not marker.exists(), "loading the checkpoint ran code from it"
    # The payload is live: a plain (unsafe) load does run it, so the test above could have failed.
    torch.load(payload, weights_only=False)
    assert marker.read_text() == "unpickled"
    reliability.record(
        "checkpoint", "checkpoint-pickle-refused",
        input="a manifest naming ../../../evil.pt; one naming an absolute path; student.pt replaced by a pickle whose "
              "unpickling runs exec (manifest size and sha256 rewritten to match)",
        did="refused each with CheckpointError before anything was unpickled: file names must be plain <name>.pt "
            "inside the checkpoint; files load with torch.load(weights_only=True), which refuses the object; the "
            "payload's code never ran",
        message=messages["dotdot"] + " / " + messages["payload"], lost="nothing: the run dir is left as it was")


def test_truncated_or_altered_file_is_named_and_the_resume_falls_back(tmp_path, reliability):
    cfg = make_config()
    for step in (5, 10):
        ckpt.save_checkpoint(tmp_path, step=step, epoch=0, batch_in_epoch=step, config=cfg, keep_last=3,
                             state={"student": {"w": torch.full((1000,), float(step))}, "optimizer": {"m": step}})
    newest = ckpt.checkpoint_root(tmp_path) / "step-0000010"

    student = newest / "student.pt"
    original = student.read_bytes()
    student.write_bytes(original[: len(original) // 2])  # a copy cut short, a disk that filled up
    with pytest.raises(ckpt.CheckpointError) as truncated:
        ckpt.load_checkpoint(newest, config=cfg)
    assert str(truncated.value).startswith(f"{student}: truncated: {len(original) // 2} bytes, the manifest says "
                                           f"{len(original)}")

    altered = bytearray(original)
    altered[-100] ^= 0xFF  # same size, one byte flipped
    student.write_bytes(bytes(altered))
    with pytest.raises(ckpt.CheckpointError, match="student.pt: content altered") as changed:
        ckpt.load_checkpoint(newest, config=cfg)

    reports: list[str] = []
    path, manifest = ckpt.latest_good_checkpoint(tmp_path, report=reports.append)
    assert path == ckpt.checkpoint_root(tmp_path) / "step-0000005" and manifest["step"] == 5
    assert reports == [f"checkpoint damaged: {student}: content altered: its sha256 differs from the manifest's; "
                       "falling back to the previous good checkpoint step-0000005"]
    _, state = ckpt.load_checkpoint(path, config=cfg)
    assert torch.equal(state["student"]["w"], torch.full((1000,), 5.0))

    # With no good checkpoint left the resume stops instead of silently starting over on top of them.
    (path / "optimizer.pt").write_bytes(b"")
    with pytest.raises(ckpt.CheckpointError, match="no checkpoint can be loaded"):
        ckpt.latest_good_checkpoint(tmp_path, report=reports.append)
    reliability.record(
        "checkpoint", "checkpoint-truncated-fallback",
        input="the newest checkpoint's student.pt cut to half its size; then the same file with one byte flipped",
        did="the manifest's size and sha256 per file caught both; CheckpointError named the file; the resume "
            "(latest_good_checkpoint, used by LearnerGroup) fell back to the previous checkpoint and said so",
        message=str(truncated.value) + " / " + reports[0],
        lost="the steps between the previous checkpoint and the damaged one")


def test_crash_between_the_renames_of_a_resave_leaves_a_loadable_checkpoint(tmp_path, reliability):
    script = textwrap.dedent(f"""
        import os, sys, torch
        sys.path.insert(0, {str(REPO)!r})
        from raydistill.runtime.engine import checkpoint as ckpt
        from raydistill.config.job import JobConfig

        cfg = JobConfig.from_dict({{"method": "congen", "student": "bert-tiny", "teacher": "minilm-l6",
                                    "train": {{"lr": 5e-4}}}})
        run_dir = {str(tmp_path)!r}
        ckpt.save_checkpoint(run_dir, step=5, epoch=0, batch_in_epoch=5, config=cfg,
                             state={{"student": {{"w": torch.ones(10)}}}})
        real_replace = os.replace

        def replace_then_die(src, dst):
            real_replace(src, dst)
            if ".old-" in str(dst):
                os._exit(9)   # the process dies after the 1st rename

        os.replace = replace_then_die
        ckpt.save_checkpoint(run_dir, step=5, epoch=0, batch_in_epoch=5, config=cfg,
                             state={{"student": {{"w": torch.full((10,), 2.0)}}}})
        print("not reached")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 9, proc.stderr
    root = ckpt.checkpoint_root(tmp_path)
    leftovers = sorted(p.name for p in root.iterdir())
    assert "step-0000005" not in leftovers and any(".old-" in name for name in leftovers), leftovers

    cfg = make_config()
    latest = ckpt.latest_checkpoint(tmp_path)
    assert latest is not None and latest.name.startswith(".step-0000005.old-")
    manifest, state = ckpt.load_checkpoint(latest, config=cfg)
    assert manifest["step"] == 5 and torch.equal(state["student"]["w"], torch.ones(10))

    # The next save puts the step back under its own name and clears the dead writer's leftovers.
    ckpt.save_checkpoint(tmp_path, step=6, epoch=0, batch_in_epoch=6, config=cfg, state={"s": {}})
    assert sorted(p.name for p in root.iterdir()) == ["step-0000005", "step-0000006"]
    reliability.record(
        "checkpoint", "resave-crash-safe",
        input="a same-step re-save of step 5 killed (os._exit) between moving the old directory aside and renaming "
              "the new one into place",
        did="list_checkpoints listed the moved-aside .step-0000005.old-<pid> (it has its manifest), which loads and "
            "verifies; the next save renamed it back to step-0000005 and removed the dead writer's temporary directory",
        lost="nothing: the step's previous checkpoint is intact")


def test_a_second_job_on_a_locked_run_dir_is_refused_and_a_stale_lock_is_taken_over(tmp_path, no_ray_start,
                                                                                     reliability):
    import socket

    from raydistill.runtime.jobs.distill import run_distillation

    cfg = JobConfig.from_dict(job_dict(tmp_path))
    run_dir = cfg.resolved_run_dir()
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from raydistill.runtime.engine.rundir import RunDirLock
        RunDirLock({str(run_dir)!r}).acquire()
        print("locked", flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(rundir.RunDirLockedError) as caught:
            run_distillation(cfg, results_dir=tmp_path / "results")
        refused = str(caught.value)
        assert f"host {socket.gethostname()}, pid {holder.pid}," in refused
        assert not (run_dir / "config.yaml").exists()
    finally:
        holder.kill()
        holder.wait(timeout=60)

    # The holder was SIGKILLed: its lock file still names it, but the kernel dropped its flock.
    assert f'"pid": {holder.pid}' in (run_dir / rundir.LOCK_FILE).read_text()
    reports: list[str] = []
    lock = rundir.RunDirLock(run_dir).acquire(report=reports.append)
    try:
        assert reports == [f"{run_dir}: taking over the stale lock of host {socket.gethostname()} pid {holder.pid} "
                           f"(since {reports[0].split('(since ')[1].split(')')[0]}): that process is gone"]
        assert f'"pid": {os.getpid()}' in (run_dir / rundir.LOCK_FILE).read_text()
    finally:
        lock.release()
    assert (run_dir / rundir.LOCK_FILE).read_text() == ""  # released cleanly: nothing to take over next time
    reliability.record(
        "checkpoint", "run-dir-locked",
        input="a job started on a run dir whose lock another live process holds; then that process SIGKILLed and "
              "the run dir locked again",
        did="the second job was refused (RunDirLockedError) naming the holder's host and pid, before Ray started "
            "and without touching config.yaml; after the holder died its stale lock was taken over, and the log "
            "said so", message=refused + " / " + reports[0], lost="nothing")


def test_resume_with_another_lr_corpus_content_or_learner_count_is_refused_before_ray(tmp_path, no_ray_start,
                                                                                      monkeypatch, reliability):
    from raydistill.runtime.teachers import pipeline
    from raydistill.runtime.jobs.distill import run_distillation
    from raydistill.methods import with_method_defaults

    def teacher_pass(*args, **kwargs):
        raise AssertionError("the job built its training data (the teacher pass) before refusing the checkpoint")

    monkeypatch.setattr(pipeline, "build_training_data", teacher_pass)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"sentence number {i} about a dog on the beach\n" for i in range(64)))
    # As run_distillation sees it (the method's defaults filled in), so that lr is the only difference below.
    written_by = with_method_defaults(JobConfig.from_dict(job_dict(tmp_path, train={"lr": 5e-4}, data={
        "corpus": f"file:{corpus}", "views": {"control": "none", "generalize": "delete:0.1"}})))
    run_dir = written_by.resolved_run_dir()
    ckpt.save_checkpoint(run_dir, step=5, epoch=0, batch_in_epoch=5, config=written_by, state={"s": {}},
                         extra={"world_size": 1})
    written_by.to_yaml(run_dir / "config.yaml")
    config_yaml = (run_dir / "config.yaml").read_bytes()
    messages = {}

    changed_lr = written_by.with_overrides(["train.lr=1e-4"])
    with pytest.raises(ckpt.CheckpointMismatchError) as caught:
        run_distillation(changed_lr, results_dir=tmp_path / "results")
    messages["lr"] = str(caught.value)
    assert "differing keys: train.lr: checkpoint 0.0005, this run 0.0001" in messages["lr"]

    corpus.write_text(corpus.read_text().replace("dog", "cat"))  # same path, same config, other sentences
    with pytest.raises(ckpt.CheckpointMismatchError) as caught:
        run_distillation(written_by, results_dir=tmp_path / "results")
    messages["corpus"] = str(caught.value)
    assert "differing keys: data.corpus (file content): checkpoint sha256 " in messages["corpus"]
    corpus.write_text(corpus.read_text().replace("cat", "dog"))

    two_learners = written_by.with_overrides(["resources.learner.num_learners=2"])
    with pytest.raises(ckpt.CheckpointMismatchError) as caught:
        run_distillation(two_learners, results_dir=tmp_path / "results")
    messages["learners"] = str(caught.value)
    assert "trained with 1 learner(s); this run asks for 2" in messages["learners"]
    assert "resume with resources.learner.num_learners=1" in messages["learners"]

    assert (run_dir / "config.yaml").read_bytes() == config_yaml
    assert resume.check_resume(run_dir, written_by, world_size=1) == ckpt.latest_checkpoint(run_dir)
    reliability.record(
        "checkpoint", "resume-config-changed-before-ray",
        input="a run dir with a checkpoint, resumed with train.lr 1e-4 instead of 5e-4; with the corpus file edited "
              "under the same path; with resources.learner.num_learners 2 instead of 1",
        did="each refused (CheckpointMismatchError) listing the differing keys (the corpus by its sha256), before "
            "Ray started and before the teacher pass, with config.yaml untouched. A different learner count is "
            "refused: it changes the steps per epoch, the total steps and the LR schedule",
        message=messages["lr"] + " / " + messages["corpus"] + " / " + messages["learners"],
        lost="nothing: the checkpoint and config.yaml are left as they were")


def test_runtime_settings_may_change_between_invocations_and_training_settings_may_not(tmp_path, reliability):
    written_by = make_config()
    run_dir = tmp_path / "run"
    path = ckpt.save_checkpoint(run_dir, step=5, epoch=0, batch_in_epoch=5, config=written_by, state={"s": {}},
                                extra={"world_size": 1})
    runtime_changes = ["runtime.learner_timeout_s=1800", "runtime.max_restarts=6", "runtime.log_every=5",
                       "train.keep_last=1", "train.checkpoint_every=50"]
    relaunched = written_by.with_overrides(runtime_changes)
    resumed_from = resume.check_resume(run_dir, relaunched, world_size=1)
    # A checkpoint whose hash an older raydistill took over more settings resumes when the training fields agree.
    older_hash = json.loads((path / "manifest.json").read_text())
    older_hash["config_hash"] = "0123456789abcdef"
    ckpt.check_compatible(older_hash, relaunched, path)
    with pytest.raises(ckpt.CheckpointMismatchError) as caught:
        resume.check_resume(run_dir, relaunched.with_overrides(["train.lr=1e-4"]), world_size=1)
    message = str(caught.value)
    reliability.record(
        "checkpoint", "resume-runtime-settings",
        input="a run dir with a checkpoint, resumed with " + ", ".join(runtime_changes) + "; then also train.lr 1e-4",
        did=f"the runtime settings resumed from {Path(resumed_from).name if resumed_from else None} (the config "
            "hash leaves out one declared list of runtime-only fields); the learning rate change was refused, the "
            "message naming the settings that may change",
        message=message, lost="nothing: the checkpoint is resumed, or left as it was")
    assert resumed_from == path
    assert "train.lr" in message and "runtime" in message and "train.keep_last" in message


def _save_in(home, config, step=5):
    """A checkpoint where Train would persist it: ``<home>/checkpoints/step-XXXXXXX``."""
    return ckpt.save_checkpoint(home, step=step, epoch=0, batch_in_epoch=step, config=config, state={"s": {}},
                                extra={"world_size": 1})


def test_adding_dropping_changing_or_sharing_checkpoint_storage_is_refused_before_ray(tmp_path, no_ray_start,
                                                                                     monkeypatch, reliability):
    from raydistill.methods import with_method_defaults
    from raydistill.runtime.teachers import pipeline
    from raydistill.runtime.jobs.distill import run_distillation

    monkeypatch.setattr(pipeline, "build_training_data", lambda *a, **k: pytest.fail("teacher pass before refusal"))
    storage = tmp_path / "storage"
    plain = with_method_defaults(JobConfig.from_dict(job_dict(tmp_path, resources={"learner": {"num_learners": 1}})))
    run_dir = plain.resolved_run_dir()
    stored = plain.with_overrides([f"runtime.storage_path={storage}"])
    messages = {}

    # A run dir that trained without a storage path, started again with one: refused before Ray, naming both places.
    _save_in(run_dir, plain)
    with pytest.raises(ckpt.CheckpointMismatchError) as caught:
        run_distillation(stored, results_dir=tmp_path / "results")
    messages["added"] = str(caught.value)
    assert f"{run_dir}/checkpoints (the run dir)" in messages["added"] and f"{storage}/run/checkpoints" in \
        messages["added"]

    # A run that keeps its checkpoints in the storage folder (as its config.yaml says, written at its start):
    # dropping or changing the storage is refused, and the checks see its checkpoints there.
    ckpt.shutil.rmtree(run_dir)
    run_dir.mkdir()
    stored.to_yaml(run_dir / "config.yaml")
    written = _save_in(storage / "run", stored)
    assert resume.check_resume(run_dir, stored, world_size=1) == written
    with pytest.raises(ckpt.CheckpointMismatchError) as caught:
        resume.check_resume(run_dir, plain, world_size=1)
    messages["dropped"] = str(caught.value)
    elsewhere = stored.with_overrides([f"runtime.storage_path={tmp_path / 'elsewhere'}"])
    with pytest.raises(ckpt.CheckpointMismatchError) as caught:
        resume.check_resume(run_dir, elsewhere, world_size=1)
    messages["changed"] = str(caught.value)
    assert f"{storage}/run/checkpoints" in messages["changed"] and f"{tmp_path / 'elsewhere'}/run/checkpoints" in \
        messages["changed"]
    with pytest.raises(ckpt.CheckpointMismatchError, match="trained with 1 learner.*asks for 2"):
        resume.check_resume(run_dir, stored.with_overrides(["resources.learner.num_learners=2"]), world_size=2)

    # Another run dir of the same name on the same storage: refused, naming the run that owns the folder (the run
    # records its checkpoint home, and the folder its owner, when it starts training: LearnerGroup.fit).
    assert resume.claim_checkpoint_home(run_dir, stored) == f"{storage}/run"
    assert resume.check_resume(run_dir, stored, world_size=1) == written
    other = stored.with_overrides([f"run_dir={tmp_path / 'other' / 'run'}"])
    with pytest.raises(ckpt.CheckpointMismatchError) as caught:
        resume.check_resume(other.resolved_run_dir(), other, world_size=1)
    messages["shared"] = str(caught.value)
    assert str(run_dir) in messages["shared"] and str(other.resolved_run_dir()) in messages["shared"]
    # The same run moved elsewhere (its record travels with it) still owns its storage folder.
    moved = tmp_path / "moved" / "run"
    moved.parent.mkdir()
    os.replace(run_dir, moved)
    assert resume.check_resume(moved, stored.with_overrides([f"run_dir={moved}"]), world_size=1) == written
    reliability.record(
        "checkpoint", "storage-path-change-refused",
        input="a run dir with checkpoints, started again with runtime.storage_path added; a run with its checkpoints "
              "in <storage>/run, started without it, with another storage path, with 2 learners; another run dir "
              "named run on the same storage",
        did="each refused (CheckpointMismatchError) before Ray and before the teacher pass, naming where the "
            "checkpoints are and where this config would look (the run dir records its checkpoint home, the "
            "storage folder its owner); the learner-count check reads the storage folder's checkpoints",
        message=" / ".join(messages.values()),
        lost="nothing: the checkpoints and best/ are left as they were")
    assert all("step 0" in messages[key] for key in ("added", "dropped", "changed"))
