"""Durable state: a job killed between the two renames that swap in a new ``best/`` gets it back at the next start;
state files go through the one atomic, fsynced writer; a run never overwrites another run's result file; names read
from files cannot leave their folder; lock files are never opened through a symlink; no ``torch.load`` unpickles
arbitrary objects."""

from __future__ import annotations

import ast
import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from raydistill.fileio import UnsafeNameError, child_path

pytest_plugins = ["tests.reliability_log"]

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "raydistill"

# The real replace_directory, killed with SIGKILL right after its first rename (best/ moved aside, the new one not
# yet in place): the state a crash, an OOM kill or a preemption at that instant leaves on disk.
KILLED_BETWEEN_RENAMES = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from raydistill import fileio

    run_dir = Path(sys.argv[1])
    staged = run_dir / f".best.tmp-{os.getpid()}"
    staged.mkdir()
    (staged / "raydistill_best.json").write_text('{"step": 20}')
    real_replace = os.replace

    def replace_then_die(src, dst):
        real_replace(src, dst)
        if ".best.old-" in str(dst):
            os.kill(os.getpid(), signal.SIGKILL)

    os.replace = replace_then_die
    fileio.replace_directory(staged, run_dir / "best")
""")


@pytest.fixture
def no_ray_start(monkeypatch):
    from raydistill.runtime.engine import cluster

    def started(*args, **kwargs):
        raise AssertionError("the job started Ray")

    monkeypatch.setattr(cluster, "init_ray", started)


def test_a_crash_between_the_renames_of_best_is_undone_at_the_next_start(tmp_path, no_ray_start, reliability):
    from raydistill.methods import with_method_defaults
    from raydistill.runtime.engine import checkpoint as ckpt
    from raydistill.config.job import JobConfig
    from raydistill.runtime.jobs.distill import run_distillation

    written_by = with_method_defaults(JobConfig.from_dict({
        "method": "congen", "student": "bert-tiny", "teacher": "minilm-l6", "train": {"lr": 5e-4},
        "run_dir": str(tmp_path / "run"), "cache_dir": str(tmp_path / "cache")}))
    run_dir = written_by.resolved_run_dir()
    ckpt.save_checkpoint(run_dir, step=10, epoch=0, batch_in_epoch=10, config=written_by, state={"s": {}},
                         extra={"world_size": 1})
    (run_dir / "best").mkdir()
    (run_dir / "best" / "raydistill_best.json").write_text('{"step": 10}')

    killed = subprocess.run([sys.executable, "-c", KILLED_BETWEEN_RENAMES, str(run_dir)], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    left = sorted(path.name for path in run_dir.iterdir() if path.name.startswith(".best"))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not (run_dir / "best").exists() and [name.split("-")[0] for name in left] == [".best.old", ".best.tmp"]

    # The next start of the job (refused here by its checkpoint of another lr, so no Ray and no model loads: the
    # recovery runs before anything reads best/).
    with pytest.raises(ckpt.CheckpointMismatchError):
        run_distillation(written_by.with_overrides(["train.lr=1e-4"]), results_dir=tmp_path / "results")
    restored = (run_dir / "best" / "raydistill_best.json").read_text() if (run_dir / "best").is_dir() else None
    leftovers = sorted(path.name for path in run_dir.iterdir() if path.name.startswith(".best"))
    reliability.record("fault", "state-files-durable",
                       input="job SIGKILLed between best/'s two renames (best/ moved to .best.old-<pid>, the new "
                             "best in .best.tmp-<pid>), then started again",
                       did=f"next start restored best/ ({restored}) and removed {left}",
                       lost="the new best model the killed job had not yet swapped in; the previous best is kept",
                       details={"left_by_the_crash": left, "after_restart": leftovers})
    assert restored == '{"step": 10}'
    assert leftovers == []


# Files that legitimately write without raydistill.fileio: a checkpoint's manifest is written inside its own
# directory, which is fsynced and renamed whole; corpus.py regenerates a table of docs/data.md (a developer tool).
NOT_STATE_FILES = {("runtime/engine/checkpoint.py", "dump"), ("data/corpus.py", "write_text")}


def _hand_rolled_writes() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = str(path.relative_to(PACKAGE))
        if relative == "fileio.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            name = node.func.attr
            owner = node.func.value.id if isinstance(node.func.value, ast.Name) else None
            writes = name == "write_text" or (name == "dump" and owner in ("json", "yaml")) or (
                name == "safe_dump" and owner == "yaml" and len(node.args) > 1)
            if writes and (relative, name) not in NOT_STATE_FILES:
                found.append(f"raydistill/{relative}:{node.lineno}: {name}")
    return found


def test_state_files_are_written_only_through_the_atomic_writer():
    """``write_text`` and ``json.dump`` into an open file are neither atomic nor fsynced: a crash mid-write leaves a
    torn or empty config.yaml / summary.json / trial.json. Every state file goes through raydistill.fileio."""
    assert _hand_rolled_writes() == []


def test_a_run_never_overwrites_another_runs_result_file(tmp_path, reliability, capsys):
    from raydistill.evaluation.results import result_path_of_run, run_id, write_result

    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from readme_tables import load_results
    finally:
        sys.path.remove(str(REPO / "scripts"))
    results = tmp_path / "results"
    scores = {name: 70.0 for name in ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr", "avg")}

    def record(run_dir: Path, avg: float) -> Path:
        path = result_path_of_run(results / "congen-bert-tiny-minilm-l6.json", run_dir)
        write_result(path, kind="distill", method="congen", model="bert-tiny", params_m=4.4, command="test",
                     scores={**scores, "avg": avg}, training={"run_dir": str(run_dir)})
        return path

    real, smoke = tmp_path / "runs" / "real", tmp_path / "elsewhere" / "smoke"
    first = record(real, 71.0)
    second = record(smoke, 12.0)  # a smoke run in another run dir, same method, student and teacher
    message = capsys.readouterr().out
    kept = json.loads(first.read_text())["scores"]["avg"]
    third = record(real, 72.0)  # the real run again (a rerun or resume): its own file is updated
    legacy = results / "sct-bert-tiny.json"  # a committed record from before run dirs were recorded
    legacy.write_text(json.dumps({"kind": "distill", "scores": scores}))
    beside_legacy = result_path_of_run(legacy, smoke, report=lambda text: None)
    files = sorted(r["_file"] for r in load_results(results))
    reliability.record("fault", "result-not-overwritten",
                       input="a smoke run in another run dir finishing with the same method/student/teacher as a "
                             "real run whose result file exists",
                       did=f"wrote {second.name} beside it and said so; the real run's file kept its score "
                           f"({kept}); a rerun of the real run updated its own file", message=message.strip(),
                       lost="nothing")
    assert kept == 71.0 and json.loads(third.read_text())["scores"]["avg"] == 72.0
    assert first == third == results / "congen-bert-tiny-minilm-l6.json"
    assert second.name == f"congen-bert-tiny-minilm-l6-{run_id(smoke)}.json"
    assert json.loads(second.read_text())["scores"]["avg"] == 12.0
    assert "holds the record of" in message and second.name in message
    assert beside_legacy.name == f"sct-bert-tiny-{run_id(smoke)}.json"
    assert files == ["congen-bert-tiny-minilm-l6-" + run_id(smoke) + ".json", "congen-bert-tiny-minilm-l6.json",
                     "sct-bert-tiny.json"]


def _torch_loads_without_weights_only() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "load"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"):
                safe = [k for k in node.keywords if k.arg == "weights_only" and isinstance(k.value, ast.Constant)
                        and k.value.value is True]
                if not safe:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    return found


def test_unsafe_names_and_links_are_refused(tmp_path, reliability):
    from raydistill.fileio import UnsafeLockFileError
    from raydistill.runtime.engine import checkpoint as ckpt
    from raydistill.runtime.engine import rundir
    from raydistill.config.job import JobConfig
    from raydistill.runtime.tune.plan import SweepPlan
    from raydistill.runtime.tune.trial import TrialState, _take_over_donor_run
    from ray.train import Checkpoint

    unpinned = _torch_loads_without_weights_only()

    # A lock file planted as a symlink to another file: locking must not follow it, nor empty the target.
    victim = tmp_path / "precious.txt"
    victim.write_text("not a lock file")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / rundir.LOCK_FILE).symlink_to(victim)
    with pytest.raises(UnsafeLockFileError) as lock_error:
        rundir.RunDirLock(run_dir).acquire()
    victim_after = victim.read_text()

    # A checkpoint whose manifest names its trial "../../<outside>": PBT would copy that folder's best model in.
    cfg = JobConfig.from_dict({"method": "congen", "student": "bert-tiny", "teacher": "minilm-l6",
                               "run_dir": str(tmp_path / "sweep" / "trials" / "t1")})
    donor_ckpt = tmp_path / "donor"
    written = ckpt.save_checkpoint(donor_ckpt, step=3, epoch=0, batch_in_epoch=3, config=cfg, state={"s": {}},
                                   extra={"trial_id": "../../outside"})
    sweep = SweepPlan(name="s", sweep_dir=str(tmp_path / "sweep"), student="bert-tiny", method="congen",
                      teacher="minilm-l6", space_file="", params={}, start_from=[], base_config={}, settings={},
                      algorithm="random", tracking_uri="", experiment="x")
    (tmp_path / "outside" / "best").mkdir(parents=True)
    (tmp_path / "outside" / "best" / "raydistill_best.json").write_text('{"step": 1, "stsb_dev": 99.0}')
    with pytest.raises(ckpt.CheckpointError) as donor_error:
        _take_over_donor_run(Checkpoint.from_directory(str(written)), TrialState(trial_id="t1"), cfg, sweep)
    adopted = (tmp_path / "sweep" / "trials" / "t1" / "best").exists()

    refused_names = []
    for name in ("..", "../x", "/etc", "a/b", "", "."):
        with pytest.raises(UnsafeNameError):
            child_path(tmp_path, name)
        refused_names.append(name)
    reliability.record("fault", "unsafe-names-refused",
                       input="run dir lock file symlinked to another file; a checkpoint manifest naming its trial "
                             "'../../outside'; names with '..', '/', absolute; torch.load calls in the package",
                       did="refused the symlinked lock (target untouched) and the manifest's trial id before "
                           f"anything was copied; every torch.load passes weights_only=True (unpinned: {unpinned})",
                       message=f"{lock_error.value}\n{donor_error.value}", lost="nothing: refused before use",
                       details={"refused_names": refused_names})
    assert victim_after == "not a lock file"
    assert "symlink" in str(lock_error.value)
    assert "'../../outside'" in str(donor_error.value) and not adopted
    assert unpinned == []
    assert child_path(tmp_path, "trial_00001") == tmp_path / "trial_00001"
