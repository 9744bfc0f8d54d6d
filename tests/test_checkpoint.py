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

from raydistill.runtime import checkpoint as ckpt
from raydistill.runtime.config import ConfigError, JobConfig

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
        from raydistill.runtime import checkpoint as ckpt
        from raydistill.runtime.config import JobConfig

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
    partial = [name for name in leftovers if name.startswith("step-0000002.tmp-")]
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
                       did="step 2 stayed a step-0000002.tmp-<pid> directory without a manifest, never listed or "
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
    data = json.loads(json.dumps({"files": ["missing.pt"], "config_hash": cfg.config_hash()}))
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
    from raydistill.runtime import cluster

    def started(*args, **kwargs):
        raise AssertionError("the job started Ray before refusing its output directory")

    monkeypatch.setattr(cluster, "init_ray", started)


def job_dict(tmp_path: Path, **fields) -> dict:
    # Tests run as root, where chmod does not stop writes: a path below a regular file is unwritable for anyone.
    return {"method": "congen", "student": "bert-tiny", "teacher": "minilm-l6",
            "run_dir": str(tmp_path / "run"), "cache_dir": str(tmp_path / "cache"), **fields}


@pytest.mark.parametrize("field", ["run_dir", "cache_dir"])
def test_unwritable_output_dir_fails_before_the_job_starts(tmp_path, field, no_ray_start, reliability):
    from raydistill.runtime.distill import run_distillation

    blocker = tmp_path / "afile"
    blocker.write_text("a file where a directory should be")
    cfg = JobConfig.from_dict(job_dict(tmp_path, **{field: str(blocker / "sub")}))
    with pytest.raises(ConfigError) as caught:
        run_distillation(cfg, results_dir=tmp_path / "results")
    assert str(caught.value) == f"field '{field}': {blocker / 'sub'}: cannot create this directory: {blocker} is a file"
    assert not (tmp_path / "run").exists() and not (tmp_path / "results").exists()
    reliability.record("output dir", f"unwritable {field}", input=f"{field} below a regular file",
                       did="run_distillation refused the config (ConfigError from JobConfig.validate)",
                       message=str(caught.value), lost="nothing: no Ray, no model loaded")


def test_unwritable_results_dir_fails_before_training(tmp_path, no_ray_start, reliability):
    from raydistill.runtime.distill import run_distillation

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
    ok = ckpt.check_output_dir(tmp_path / "new" / "deeper")
    assert ok == tmp_path / "new" / "deeper" and not (tmp_path / "new").exists()  # judged, not created
    assert list(tmp_path.iterdir()) == []  # the write probe is gone
    # A real free-space query of this filesystem against a threshold no disk meets.
    with pytest.raises(ckpt.OutputDirError, match=r"MiB free on its filesystem; a run needs at least") as caught:
        ckpt.check_output_dir(tmp_path, min_free_bytes=2**62)
    reliability.record("output dir", "not enough free disk at the start", input="a filesystem with less free space "
                       f"than the run needs (default threshold {ckpt.MIN_FREE_BYTES // 2**20} MiB; here 4 EiB asked)",
                       did="refused by JobConfig.validate (check_output_dir)", message=str(caught.value),
                       lost="nothing: no Ray, no model loaded")


def test_disk_full_while_writing_a_checkpoint(tmp_path, reliability):
    """A real write failure: the child process may write at most 300 kB per file (RLIMIT_FSIZE)."""
    script = textwrap.dedent(f"""
        import resource, signal, sys, torch
        sys.path.insert(0, {str(REPO)!r})
        from raydistill.runtime import checkpoint as ckpt
        from raydistill.runtime.config import JobConfig

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
