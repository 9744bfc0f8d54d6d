"""Atomic, resumable training checkpoints.

None of the authors' repositories can resume a run: SCT and ConGen keep their queues as plain attributes and save only
the best model's weights, DistilCSE saves a bare state_dict (docs/methods.md, what users do by hand). A crash after hours
of CPU therefore meant starting over. Here a checkpoint holds everything the next step depends on:

    <run_dir>/checkpoints/step-0000200/
        manifest.json        {step, epoch, batch_in_epoch, config_hash, config, git_sha, raydistill_version, created,
                              files, extra}
        student.pt           student state_dict (incl. the projection layer)
        loss.pt              loss-module state (SCT projector, learnable temperature, instance queues)
        optimizer.pt         AdamW moments
        scheduler.pt         LR schedule position
        rng.pt               python / numpy / torch RNG states (dropout masks after resume are the ones a run
                             without the crash would have drawn)

Atomicity: the directory is written as ``step-XXXXXXX.tmp-<pid>`` (every file fsync'ed, ``manifest.json`` last) and
then ``os.replace``d to its final name. A crash at any point leaves either the complete new checkpoint or none, and
the previous checkpoints untouched; half-written ``.tmp-*`` directories are never read and are swept by the next
save. Only the newest ``keep_last`` step checkpoints are kept.

A checkpoint is refused when the config that wrote it hashes differently (``JobConfig.config_hash``, which ignores
fields that do not change training: resources, tracking, eval cadence, run/cache dirs). The message names both
hashes and the differing keys, because silently resuming a run with another learning rate or teacher corrupts it.

Output directories fail early: ``check_output_dir`` (run by ``JobConfig.validate`` for run_dir and the embedding
cache, before Ray or any model starts) refuses a directory that cannot be created or written, or whose filesystem
has less than ``MIN_FREE_BYTES`` free. A disk that fills up later makes ``save_checkpoint`` raise
``CheckpointError`` saying so; the half-written directory is removed and the previous checkpoints stay loadable.
"""

from __future__ import annotations

import datetime as _dt
import errno
import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from raydistill.evaluation.results import git_sha

__all__ = [
    "CheckpointError",
    "CheckpointMismatchError",
    "save_checkpoint",
    "load_checkpoint",
    "list_checkpoints",
    "latest_checkpoint",
    "read_manifest",
    "check_compatible",
    "checkpoint_root",
    "OutputDirError",
    "check_output_dir",
    "MIN_FREE_BYTES",
]

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
_STEP_DIR = re.compile(r"^step-(\d{7,})$")
_TMP_DIR = re.compile(r"^step-\d{7,}\.tmp-(\d+)$")
# Below this a run cannot keep even one checkpoint of a small student (weights + AdamW moments + queue: tens to
# hundreds of MB), so it is refused up front rather than after the first checkpoint interval.
MIN_FREE_BYTES = 256 * 2**20
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable or incomplete."""


class CheckpointMismatchError(CheckpointError):
    """The checkpoint was written by a config that trains something else."""


class OutputDirError(CheckpointError):
    """An output directory that cannot be created or written, or sits on a (nearly) full filesystem."""


def check_output_dir(path: str | os.PathLike, *, min_free_bytes: int = MIN_FREE_BYTES) -> Path:
    """Raise OutputDirError unless ``path`` can be created and written and has ``min_free_bytes`` free.

    Creates nothing: a missing directory is judged by its nearest existing ancestor, where a temporary file is
    written and removed (a real write, because ``os.access`` says yes to root on a read-only directory and
    knows nothing of quotas or full disks). Returns the absolute path.
    """
    path = Path(path).expanduser().absolute()
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        below = "" if existing == path else f": {existing} is a file"
        raise OutputDirError(f"{path}: cannot create this directory{below}")
    try:
        fd, probe = tempfile.mkstemp(prefix=".raydistill-write-probe-", dir=existing)
    except OSError as exc:
        raise OutputDirError(f"{path}: cannot write in {existing} ({exc.strerror or exc})") from None
    try:
        os.write(fd, b"probe")
        os.fsync(fd)
    except OSError as exc:
        raise OutputDirError(f"{path}: cannot write in {existing} ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
        os.unlink(probe)
    free = shutil.disk_usage(existing).free
    if free < min_free_bytes:
        raise OutputDirError(f"{path}: only {free / 2**20:.0f} MiB free on its filesystem; a run needs at least "
                             f"{min_free_bytes / 2**20:.0f} MiB for its checkpoints")
    return path


def checkpoint_root(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / "checkpoints"


# ----------------------------------------------------------------------------------------------------------------
# Writing


def save_checkpoint(run_dir: str | os.PathLike, *, step: int, epoch: int, batch_in_epoch: int, config,
                    state: dict[str, Any], keep_last: int = 2, extra: dict[str, Any] | None = None) -> Path:
    """Write ``state`` (name -> torch-serialisable object, one ``<name>.pt`` each) atomically; prune old ones.

    ``config``: the JobConfig of the run (its hash and its plain dict go into the manifest, the dict so that a later
    mismatch can name the differing keys). ``batch_in_epoch``: batches of ``epoch`` already consumed, i.e. where
    the data iterator resumes. Returns the final checkpoint directory.
    """
    import raydistill

    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    for name in state:
        if not re.fullmatch(r"[A-Za-z0-9_\-]+", name):
            raise ValueError(f"checkpoint entry names become file names; {name!r} is not a plain identifier")
    root = checkpoint_root(run_dir)
    final = root / f"step-{int(step):07d}"
    tmp = root / f"{final.name}.tmp-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        _sweep_stale_tmp(root)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        files = []
        for name, obj in state.items():
            path = tmp / f"{name}.pt"
            with open(path, "wb") as fh:
                torch.save(obj, fh)
                fh.flush()
                os.fsync(fh.fileno())
            files.append(path.name)
        manifest = {
            "step": int(step),
            "epoch": int(epoch),
            "batch_in_epoch": int(batch_in_epoch),
            "config_hash": config.config_hash(),
            "config": config.to_dict(),
            "git_sha": git_sha(),
            "raydistill_version": raydistill.__version__,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "files": files,
            "extra": extra or {},
        }
        # The manifest goes last: a directory with a manifest is complete by construction.
        with open(tmp / MANIFEST, "w", encoding="utf-8") as fh:
            json.dump(manifest, fh, indent=2, default=str)
            fh.flush()
            os.fsync(fh.fileno())
        _fsync_dir(tmp)
    except (OSError, RuntimeError) as exc:
        # torch.save reports a failed write as RuntimeError ("... file write failed"), with the OSError as cause.
        cause = exc if isinstance(exc, OSError) else exc.__cause__ or exc.__context__
        if not isinstance(cause, OSError) and "write failed" not in str(exc):
            raise
        raise _write_failure(run_dir, root, tmp, final, cause if isinstance(cause, OSError) else exc) from exc

    if final.exists():
        # Same step written again (a resumed run re-reaching a step): move the old one aside first, because
        # os.replace cannot replace a non-empty directory.
        old = root / f"{final.name}.old-{os.getpid()}"
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    _fsync_dir(root)
    _prune(root, keep_last)
    return final


def _write_failure(run_dir, root: Path, tmp: Path, final: Path, exc: BaseException) -> CheckpointError:
    """Remove the half-written directory and say what happened, what is left, and how to go on."""
    shutil.rmtree(tmp, ignore_errors=True)
    previous = latest_checkpoint(run_dir)
    kept = f"; the previous checkpoint {previous.name} is intact" if previous is not None else ""
    no_space = isinstance(exc, OSError) and exc.errno in _NO_SPACE or "file write failed" in str(exc)
    if no_space:
        where = root if root.exists() else Path(run_dir)
        free = shutil.disk_usage(where).free if where.exists() else 0
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "file write failed"
        return CheckpointError(f"{root}: out of space writing {final.name} ({reason}; {free / 2**20:.0f} MiB free "
                               f"on the filesystem){kept}. Free space and re-run with the same run_dir to resume.")
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return CheckpointError(f"{root}: cannot write {final.name} ({reason}){kept}")


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sweep_stale_tmp(root: Path) -> None:
    """Remove half-written checkpoints of processes that are gone (a crash mid-write)."""
    for path in root.iterdir():
        match = _TMP_DIR.match(path.name)
        if match and (int(match.group(1)) == os.getpid() or not _pid_alive(int(match.group(1)))):
            log.info("removing incomplete checkpoint %s (its writer died mid-write)", path)
            shutil.rmtree(path, ignore_errors=True)
        elif ".old-" in path.name and path.is_dir():
            shutil.rmtree(path, ignore_errors=True)


def _prune(root: Path, keep_last: int) -> None:
    for path in list_checkpoints(root.parent)[:-keep_last]:
        shutil.rmtree(path, ignore_errors=True)


# ----------------------------------------------------------------------------------------------------------------
# Reading


def list_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """Complete checkpoints (final name and a manifest), oldest first."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = _STEP_DIR.match(path.name)
        if match and (path / MANIFEST).is_file():
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def read_manifest(path: str | os.PathLike) -> dict[str, Any]:
    path = Path(path)
    try:
        return json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: not a complete checkpoint (no {MANIFEST})") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path / MANIFEST}:{exc.lineno}: unreadable manifest: {exc.msg}") from None


def check_compatible(manifest: dict[str, Any], config, path: str | os.PathLike = "checkpoint") -> None:
    """Raise CheckpointMismatchError naming both hashes and the differing keys if ``config`` trains something else."""
    mine = config.config_hash()
    theirs = manifest.get("config_hash")
    if theirs == mine:
        return
    stored = manifest.get("config") or {}
    keys = config.diff_keys(stored) if stored else []
    details = []
    flat_stored, flat_mine = _flatten(stored), _flatten(config.to_dict())
    for key in keys[:12]:
        details.append(f"{key}: checkpoint {flat_stored.get(key, '<absent>')!r}, this run {flat_mine.get(key, '<absent>')!r}")
    more = f" (+{len(keys) - 12} more)" if len(keys) > 12 else ""
    raise CheckpointMismatchError(
        f"{path} was written by a different config (hash {theirs}, this run {mine}); differing keys: "
        + ("; ".join(details) if details else "unknown (the manifest has no config)") + more
        + ". Resume with the original config, or give this run another run_dir.")


def load_checkpoint(path: str | os.PathLike, config=None, map_location: str | torch.device = "cpu",
                    ) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(manifest, state)`` of a complete checkpoint; refuses one written by another config (when given)."""
    path = Path(path)
    manifest = read_manifest(path)
    if config is not None:
        check_compatible(manifest, config, path)
    state = {}
    for name in manifest.get("files", []):
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"{path}: manifest lists {name} but the file is missing")
        # weights_only=False: RNG states are numpy/python objects; these files are our own, never downloaded.
        state[file.stem] = torch.load(file, map_location=map_location, weights_only=False)
    return manifest, state


def _flatten(plain: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(plain, dict) and plain:
        out: dict[str, Any] = {}
        for k, v in plain.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): plain}
