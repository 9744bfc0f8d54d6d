"""Checkpoints: atomic writes (a real crash mid-write), keep_last pruning, config-hash refusal, round trips."""

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
from raydistill.runtime.config import JobConfig

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


def test_crash_mid_write_leaves_previous_checkpoint_intact(tmp_path):
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


def test_checkpoint_of_another_config_is_refused_with_the_differing_keys(tmp_path):
    written_by = make_config()
    path = ckpt.save_checkpoint(tmp_path, step=3, epoch=0, batch_in_epoch=3, config=written_by, state={"s": {}})
    other = make_config(lr=1e-4)
    with pytest.raises(ckpt.CheckpointMismatchError) as excinfo:
        ckpt.load_checkpoint(path, config=other)
    message = str(excinfo.value)
    assert "train.lr" in message and "0.0005" in message and "0.0001" in message
    assert written_by.config_hash() in message and other.config_hash() in message


def test_fields_that_do_not_change_training_do_not_block_resume(tmp_path):
    cfg = make_config()
    path = ckpt.save_checkpoint(tmp_path, step=3, epoch=0, batch_in_epoch=3, config=cfg, state={"s": {}})
    moved = cfg.with_overrides(["resources.learner.num_learners=2", "train.eval_every=7", "tracking.enabled=false"])
    manifest, _ = ckpt.load_checkpoint(path, config=moved)
    assert manifest["step"] == 3


def test_unreadable_manifest_names_the_file(tmp_path):
    cfg = make_config()
    path = ckpt.save_checkpoint(tmp_path, step=1, epoch=0, batch_in_epoch=1, config=cfg, state={"s": {}})
    (path / ckpt.MANIFEST).write_text("{not json")
    with pytest.raises(ckpt.CheckpointError, match="manifest.json:1"):
        ckpt.read_manifest(path)
    data = json.loads(json.dumps({"files": ["missing.pt"], "config_hash": cfg.config_hash()}))
    (path / ckpt.MANIFEST).write_text(json.dumps(data))
    with pytest.raises(ckpt.CheckpointError, match="missing.pt"):
        ckpt.load_checkpoint(path, config=cfg)
    assert os.path.isdir(path)
