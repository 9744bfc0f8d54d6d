"""Where a run keeps its checkpoints, and whether this config may resume them: the driver's check before anything
starts.

``check_resume`` reads manifests only, where the run keeps its checkpoints (``checkpoint_home``: the run dir, or
``<runtime.storage_path>/<run dir name>`` with Train workers), and refuses a checkpoint written by a config that
trains something else (``checkpoint.check_compatible``) or with another learner count; before that it refuses a run
whose checkpoints are elsewhere than its config now points (the run dir records the place, ``claim_checkpoint_home``)
or whose storage folder another run dir owns. ``resume_point`` is the checkpoint a run in a home resumes from. Homes
are local paths or pyarrow filesystem URIs; nothing here writes a checkpoint (``checkpoint`` does).
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

from raydistill.runtime.engine.checkpoint import (
    MANIFEST,
    STEP_DIR,
    CheckpointError,
    CheckpointMismatchError,
    check_compatible,
    latest_good_checkpoint,
    list_checkpoints,
    read_manifest,
)

__all__ = ["STORAGE_OWNER", "STORAGE_RECORD", "check_resume", "checkpoint_home", "claim_checkpoint_home",
           "resume_point"]

# A run dir records where its checkpoints live (STORAGE_RECORD), and a storage folder names the run dir that owns
# it (STORAGE_OWNER): a run whose checkpoints are elsewhere than its config now points would start at step 0 and
# overwrite best/, and two run dirs of the same name sharing <storage_path>/<name> would resume each other's.

STORAGE_RECORD = "checkpoint_storage.json"
STORAGE_OWNER = ".raydistill-owner.json"


def check_resume(run_dir: str | os.PathLike, config, world_size: int | None = None) -> Path | None:
    """Refuse, before anything starts, to resume ``run_dir`` with a config that trains something else, or with
    another ``world_size`` (the learner count sets an epoch's steps, hence the total and the LR schedule the
    checkpoint is part-way through). Returns the checkpoint that will be resumed, or None."""
    home = checkpoint_home(run_dir, config)
    _refuse_moved_checkpoints(run_dir, home)
    _refuse_foreign_storage(run_dir, home)
    for path, manifest in _manifests_newest_first(home):
        check_compatible(manifest, config, path)
        written_with = (manifest.get("extra") or {}).get("world_size")
        if world_size is not None and written_with is not None and int(written_with) != int(world_size):
            raise CheckpointMismatchError(
                f"{path} was trained with {written_with} learner(s); this run asks for {world_size} "
                f"(resources.learner.num_learners). The learner count sets the steps per epoch, hence the total "
                f"steps and the LR schedule the checkpoint is part-way through, so it is not changed mid-run: "
                f"resume with resources.learner.num_learners={written_with} (0 or 1 for one learner), or give this "
                f"run another run_dir.")
        return path
    return None


def checkpoint_home(run_dir: str | os.PathLike, config) -> str:
    """The folder whose ``checkpoints/`` holds the run's checkpoints: ``<runtime.storage_path>/<run dir name>`` when
    Train workers persist them there, else the run dir (also in Train's local mode, ``num_learners: 0``, where Train
    persists nothing and rank 0 writes them into the run dir). Local paths come back absolute."""
    return _home(run_dir, config.runtime.storage_path, config.resources.learner.num_learners)


def _home(run_dir: str | os.PathLike, storage: str | None, num_learners: int) -> str:
    if not storage or int(num_learners) == 0:
        return str(Path(run_dir).resolve())
    if "://" not in str(storage):
        storage = str(Path(storage).expanduser().resolve())
    return f"{str(storage).rstrip('/')}/{Path(run_dir).resolve().name}"


def claim_checkpoint_home(run_dir: str | os.PathLike, config) -> str:
    """Record in the run dir where its checkpoints live and, in a storage folder, which run dir owns it; returns
    the home. Call under the run-dir lock, after ``check_resume`` accepted the run."""
    from raydistill.fileio import atomic_write_json

    run_dir = Path(run_dir).resolve()
    home = checkpoint_home(run_dir, config)
    record = _read_json(run_dir / STORAGE_RECORD)
    run_id = record.get("run_id") or uuid.uuid4().hex
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(run_dir / STORAGE_RECORD, {"checkpoint_home": home, "run_id": run_id,
                                                 "storage_path": config.runtime.storage_path})
    if home != str(run_dir):
        owner = json.dumps({"run_dir": str(run_dir), "run_id": run_id}, indent=2)
        local = _local_path(home)
        if local is None:
            import pyarrow.fs

            fs, path = pyarrow.fs.FileSystem.from_uri(home)
            fs.create_dir(path, recursive=True)
            with fs.open_output_stream(f"{path}/{STORAGE_OWNER}") as out:
                out.write(owner.encode())
        else:
            local.mkdir(parents=True, exist_ok=True)
            atomic_write_json(local / STORAGE_OWNER, json.loads(owner))
    return home


def resume_point(home: str) -> tuple[Any, dict[str, Any] | None]:
    """``(checkpoint, manifest)`` a run in ``home`` resumes from: the newest that verifies (local), or the newest
    whose manifest reads (a remote storage, where Train's own record picks the checkpoint); ``(None, None)``."""
    local = _local_path(home)
    if local is not None:
        return latest_good_checkpoint(local, report=lambda message: None)
    return next(_manifests_newest_first(home), (None, None))


def _refuse_moved_checkpoints(run_dir: str | os.PathLike, home: str) -> None:
    """The run's checkpoints are at ``home``, where this config looks, or nowhere yet."""
    run_dir = Path(run_dir).resolve()
    recorded = _read_json(run_dir / STORAGE_RECORD).get("checkpoint_home") or _home_before_the_record(run_dir)
    if recorded is None or recorded == home or not _has_checkpoints(recorded):
        return

    def where(folder: str) -> str:
        return f"{folder}/checkpoints" + (" (the run dir)" if folder == str(run_dir) else "")

    raise CheckpointMismatchError(
        f"{run_dir}: this run's checkpoints are in {where(recorded)}, but this config would keep them in "
        f"{where(home)} (runtime.storage_path; Train's local mode, resources.learner.num_learners: 0, keeps them in "
        f"the run dir). Starting there would train from step 0 and overwrite {run_dir / 'best'}. Resume with the "
        f"runtime.storage_path (and learner mode) that wrote them, move the checkpoints to the new place and update "
        f"{run_dir / STORAGE_RECORD}, or give this run another run_dir.")


def _home_before_the_record(run_dir: Path) -> str | None:
    """Where a run dir written before STORAGE_RECORD existed kept its checkpoints: the run dir if it holds some,
    else the storage folder its ``config.yaml`` (the last start's config) names."""
    if list_checkpoints(run_dir):
        return str(run_dir)
    try:
        import yaml

        previous = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))
        learner = (previous.get("resources") or {}).get("learner") or {}
        # A config stored before the runtime section existed kept the storage path under extra.
        storage = (previous.get("runtime") or {}).get("storage_path") or (previous.get("extra") or {}).get("storage_path")
        return _home(run_dir, storage, learner.get("num_learners") or 0)
    except (OSError, ValueError, TypeError, AttributeError, yaml.YAMLError):
        return None


def _refuse_foreign_storage(run_dir: str | os.PathLike, home: str) -> None:
    """A storage folder belongs to the run dir that first trained there (same path, or the same run moved)."""
    run_dir = Path(run_dir).resolve()
    if home == str(run_dir):
        return
    owner = _read_owner(home)
    if not owner or owner.get("run_dir") == str(run_dir):
        return
    mine = _read_json(run_dir / STORAGE_RECORD).get("run_id")
    if mine is not None and owner.get("run_id") == mine:
        return  # this run dir, moved since
    raise CheckpointMismatchError(
        f"{home} holds the checkpoints of the run in {owner.get('run_dir', '?')} ({home}/{STORAGE_OWNER}); this "
        f"run dir is {run_dir}. Two runs sharing it would resume each other's checkpoints: give this run another "
        f"runtime.storage_path or a run_dir of another name.")


def _local_path(home: str) -> Path | None:
    """``home`` as a local path, or None for a remote (pyarrow filesystem) URI."""
    if home.startswith("file://"):
        return Path(home[len("file://"):])
    return None if "://" in home else Path(home)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _read_owner(home: str) -> dict[str, Any]:
    local = _local_path(home)
    if local is not None:
        return _read_json(local / STORAGE_OWNER)
    try:
        import pyarrow.fs

        fs, path = pyarrow.fs.FileSystem.from_uri(home)
        with fs.open_input_stream(f"{path}/{STORAGE_OWNER}") as stream:
            data = json.loads(stream.read().decode("utf-8"))
    except (OSError, ValueError, ImportError):
        return {}
    return data if isinstance(data, dict) else {}


def _has_checkpoints(home: str) -> bool:
    try:
        return next(_manifests_newest_first(home), None) is not None
    except OSError:
        return True  # unreachable storage: assume the run's checkpoints are there rather than start over


def _manifests_newest_first(home: str):
    """``(checkpoint, manifest)`` of every checkpoint in ``home`` whose manifest parses, newest first (a damaged
    manifest is skipped: the resume falls back past it, and says so)."""
    local = _local_path(home)
    if local is not None:
        for path in reversed(list_checkpoints(local)):
            try:
                yield path, read_manifest(path)
            except CheckpointError:
                continue
        return
    import pyarrow.fs

    fs, root = pyarrow.fs.FileSystem.from_uri(f"{home.rstrip('/')}/checkpoints")
    infos = fs.get_file_info(pyarrow.fs.FileSelector(root, allow_not_found=True))
    steps = sorted((info for info in infos if info.type == pyarrow.fs.FileType.Directory
                    and STEP_DIR.match(info.base_name)), key=lambda info: info.base_name, reverse=True)
    for info in steps:
        try:
            with fs.open_input_stream(f"{info.path}/{MANIFEST}") as stream:
                yield f"{home.rstrip('/')}/checkpoints/{info.base_name}", json.loads(stream.read().decode("utf-8"))
        except (OSError, ValueError):
            continue
