"""Atomic, resumable training checkpoints.

None of the authors' repositories can resume a run (docs/methods.md, what users do by hand): a crash after hours of
CPU meant starting over. Here a checkpoint holds everything the next step depends on:

    <run_dir>/checkpoints/step-0000200/
        manifest.json        {format, step, epoch, batch_in_epoch, config_hash, config, data_fingerprint, git_sha,
                              raydistill_version, created, files: [{name, size, sha256}], extra}
        student.pt           student state_dict (incl. the projection layer)
        loss.pt              loss-module state (SCT projector, learnable temperature, instance queues)
        optimizer.pt         AdamW moments
        scheduler.pt         LR schedule position
        rng.pt               python / numpy / torch RNG states as tensors and plain lists (dropout masks after
                             resume are the ones a run without the crash would have drawn)

Loading never runs code from the run dir: every file is read with ``torch.load(weights_only=True)``, and before
anything is read the manifest's file names must be plain ``<name>.pt`` names inside the checkpoint directory (no
``../``, no absolute path, no symlink) and each file's size and sha256 must match the manifest. A truncated or
altered file is named in the error, and ``latest_good_checkpoint`` falls back to the previous checkpoint, saying
which one it skipped and why.

Atomicity: the directory is built in its staging sibling ``.step-XXXXXXX.tmp-<pid>`` (``manifest.json`` last) and
swapped in whole by ``fileio.staged_directory``. A crash at any point leaves either the complete new checkpoint or
none, and the previous checkpoints untouched; leftovers of dead writers are swept by the next save. Re-saving a step
moves the old directory to ``.step-XXXXXXX.old-<pid>`` first: a crash between the two renames leaves the old one,
which ``list_checkpoints`` still lists, so a loadable checkpoint of that step always exists. Only the newest
``keep_last`` step checkpoints are kept.

A checkpoint is refused when the config that wrote it hashes differently (``JobConfig.config_hash``, which ignores
``config.RUNTIME_ONLY_FIELDS``), or when the content of a ``file:`` corpus changed since (``data_fingerprint``). The
message names both hashes and the differing keys, because silently resuming a run with another learning rate,
teacher or corpus corrupts it. ``resume.check_resume`` runs this check in the driver before Ray starts.

A disk that fills up while a checkpoint is written makes ``save_checkpoint`` raise ``CheckpointError`` saying so;
the half-written directory is removed and the previous checkpoints stay loadable.
"""

from __future__ import annotations

import datetime as _dt
import errno
import hashlib
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable

import torch

from raydistill.evaluation.results import git_sha
from raydistill.fileio import atomic_write_text, file_sha256, recover_directory, staged_directory
from raydistill.config.job import RUNTIME_ONLY_FIELDS
from raydistill.nested import flatten

__all__ = ["CheckpointError", "CheckpointMismatchError", "save_checkpoint", "load_checkpoint", "list_checkpoints",
           "latest_checkpoint", "read_manifest", "verify_checkpoint", "latest_good_checkpoint", "data_fingerprint",
           "check_compatible", "checkpoint_root"]

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
# Manifests with a (name, size, sha256) entry per file and weights_only-loadable files. Older checkpoints held
# pickled numpy/python objects, which a safe loader cannot read.
FORMAT = 2
STEP_DIR = re.compile(r"^step-(\d{7,})$")
# What fileio's directory swap leaves beside step-XXXXXXX while it runs, or when its writer died mid-swap.
_SWAP_LEFTOVER = re.compile(r"^\.(step-\d{7,})\.(?:tmp|old)-\d+$")
_MOVED_ASIDE = re.compile(r"^\.step-(\d{7,})\.old-\d+$")
_FILE_NAME = re.compile(r"^[A-Za-z0-9_\-]+\.pt$")
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable or incomplete."""


class CheckpointMismatchError(CheckpointError):
    """The checkpoint was written by a config that trains something else."""


def checkpoint_root(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / "checkpoints"


# ----------------------------------------------------------------------------------------------------------------
# Writing


def save_checkpoint(run_dir: str | os.PathLike, *, step: int, epoch: int, batch_in_epoch: int, config,
                    state: dict[str, Any], keep_last: int = 2, extra: dict[str, Any] | None = None) -> Path:
    """Write ``state`` (name -> torch-serialisable object, one ``<name>.pt`` each) atomically, prune old ones and
    return the directory. ``config``'s hash and dict go into the manifest (the dict names a later mismatch's keys);
    ``batch_in_epoch``: batches of ``epoch`` already consumed (where the data iterator resumes)."""
    import raydistill

    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    for name in state:
        if not re.fullmatch(r"[A-Za-z0-9_\-]+", name):
            raise ValueError(f"checkpoint entry names become file names; {name!r} is not a plain identifier")
    root = checkpoint_root(run_dir)
    final = root / f"step-{int(step):07d}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        _recover_interrupted_saves(root)
        # A same-step re-save (a resumed run re-reaching a step) replaces the step whole; between the swap's two
        # renames only .step-XXXXXXX.old-<pid> holds it, which list_checkpoints lists, so the step stays loadable.
        with staged_directory(final) as staged:
            staged.mkdir()
            files = []
            for name, obj in state.items():
                path = staged / f"{name}.pt"
                # Through a file object: a failed write then surfaces as "file write failed", which _write_failure
                # recognises (torch's own file-name writer reports it as an unrelated position error).
                with open(path, "wb") as fh:
                    torch.save(obj, fh)
                files.append({"name": path.name, "size": path.stat().st_size, "sha256": file_sha256(path)})
            manifest = {
                "format": FORMAT, "step": int(step), "epoch": int(epoch), "batch_in_epoch": int(batch_in_epoch),
                "config_hash": config.config_hash(), "config": config.to_dict(),
                "data_fingerprint": data_fingerprint(config), "git_sha": git_sha(),
                "raydistill_version": raydistill.__version__,
                "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "files": files, "extra": extra or {},
            }
            # The manifest goes last: a directory with a manifest is complete by construction.
            atomic_write_text(staged / MANIFEST, json.dumps(manifest, indent=2, default=str))
    except (OSError, RuntimeError) as exc:
        # torch.save reports a failed write as RuntimeError ("... file write failed"), with the OSError as cause.
        cause = exc if isinstance(exc, OSError) else exc.__cause__ or exc.__context__
        if not isinstance(cause, OSError) and "write failed" not in str(exc):
            raise
        raise _write_failure(run_dir, root, final, cause if isinstance(cause, OSError) else exc) from exc
    _prune(root, keep_last)
    return final


def _write_failure(run_dir, root: Path, final: Path, exc: BaseException) -> CheckpointError:
    """Say what happened, what is left, and how to go on (``staged_directory`` removed the half-written one)."""
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


_SHA256_BY_FILE_STATE: dict[tuple[str, int, int], str] = {}


def _file_sha256_memo(path: Path) -> str:
    """sha256 of a file, computed once per (path, size, mtime) in this process: every checkpoint records the
    corpus fingerprint, and re-reading a large corpus at each checkpoint would stall training."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _SHA256_BY_FILE_STATE:
        _SHA256_BY_FILE_STATE[key] = file_sha256(path)
    return _SHA256_BY_FILE_STATE[key]


def data_fingerprint(config) -> dict[str, str]:
    """sha256 of each training file the config names by path (``data.corpus: file:...``, ``train.dev_pairs``); a
    directory corpus hashes its files' relative names and contents. Empty when no user file is read (or readable).

    The config hash covers the path only: an edited corpus under the same name would otherwise resume a run on other
    data (named corpora are covered by the package version)."""
    found = {}
    # Dev pairs choose the best model and stop the run early: other pairs under the same name are another run.
    dev_pairs = getattr(getattr(config, "train", None), "dev_pairs", None)
    if isinstance(dev_pairs, str) and Path(dev_pairs).expanduser().is_file():
        found["train.dev_pairs"] = _file_sha256_memo(Path(dev_pairs).expanduser())
    corpus = getattr(getattr(config, "data", None), "corpus", None)
    if not isinstance(corpus, str) or not corpus.startswith("file:"):
        return found
    from raydistill.data.corpus import parse_corpus_spec

    try:
        path = parse_corpus_spec(corpus).path
    except ValueError:
        return found
    digest = hashlib.sha256()
    try:
        if path.is_dir():
            for file in sorted(p for p in path.rglob("*") if p.is_file()):
                digest.update(str(file.relative_to(path)).encode() + b"\0" + file_sha256(file).encode())
        elif path.is_file():
            digest.update(_file_sha256_memo(path).encode())
        else:
            return found
    except OSError:
        return found
    return {**found, "data.corpus": digest.hexdigest()}


def _recover_interrupted_saves(root: Path) -> None:
    """Tidy what writers that are gone left behind (``fileio.recover_directory``, step by step): half-written
    staging directories are removed, and a step moved aside by a re-save whose writer died before the new
    directory took its place is renamed back. Directories of a live writer (another job) are not touched."""
    for step_name in sorted({match.group(1) for path in root.iterdir() if (match := _SWAP_LEFTOVER.match(path.name))}):
        recover_directory(root / step_name)


def _prune(root: Path, keep_last: int) -> None:
    for path in list_checkpoints(root.parent)[:-keep_last]:
        shutil.rmtree(path, ignore_errors=True)


# ----------------------------------------------------------------------------------------------------------------
# Reading


def list_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """Complete checkpoints (a manifest), oldest first, one per step: ``step-XXXXXXX``, else a
    ``.step-XXXXXXX.old-<pid>`` with a manifest (a re-save interrupted between its two renames)."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    found: dict[int, Path] = {}
    for path in sorted(root.iterdir()):
        match = STEP_DIR.match(path.name)
        if match and (path / MANIFEST).is_file():
            found[int(match.group(1))] = path
    for path in sorted(root.iterdir()):
        match = _MOVED_ASIDE.match(path.name)
        if match and int(match.group(1)) not in found and (path / MANIFEST).is_file():
            found[int(match.group(1))] = path
    return [found[step] for step in sorted(found)]


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


def verify_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """The manifest of ``path`` once every file it lists is a plain name inside ``path`` with the recorded size and
    sha256; CheckpointError naming the file otherwise. Reads bytes only: nothing is unpickled."""
    path = Path(path)
    manifest = read_manifest(path)
    if manifest.get("format") != FORMAT or not isinstance(manifest.get("files"), list):
        raise CheckpointError(f"{path}: written by an older raydistill (checkpoint format {manifest.get('format', 1)},"
                              f" this version reads {FORMAT}: files with sizes and sha256, no pickled objects); "
                              "start this run in a new run_dir")
    for entry in manifest["files"]:
        name = entry.get("name") if isinstance(entry, dict) else entry
        # Checked before the path is touched: a name like ../x.pt or /abs.pt would read outside the checkpoint.
        if not isinstance(name, str) or not _FILE_NAME.fullmatch(name):
            raise CheckpointError(f"{path / MANIFEST}: refused file name {name!r}: a checkpoint file must be a plain "
                                  "<name>.pt inside the checkpoint directory")
        if not isinstance(entry, dict) or not isinstance(entry.get("size"), int) or \
                not isinstance(entry.get("sha256"), str):
            raise CheckpointError(f"{path / MANIFEST}: {name} has no size and sha256; the file cannot be verified")
        file = path / name
        if file.is_symlink():
            raise CheckpointError(f"{file}: a symlink; refused (it could point outside the checkpoint)")
        if not file.is_file():
            raise CheckpointError(f"{path}: manifest lists {name} but the file is missing")
        size = file.stat().st_size
        if size != entry["size"]:
            kind = "truncated" if size < entry["size"] else "longer than written"
            raise CheckpointError(f"{file}: {kind}: {size} bytes, the manifest says {entry['size']}")
        if file_sha256(file) != entry["sha256"]:
            raise CheckpointError(f"{file}: content altered: its sha256 differs from the manifest's")
    return manifest


def latest_good_checkpoint(run_dir: str | os.PathLike, report=None) -> tuple[Path | None, dict[str, Any] | None]:
    """The newest checkpoint that verifies, and its manifest; ``(None, None)`` when the run dir has none. A damaged
    newer one is skipped, and ``report(message)`` (default: a log warning) says which, why and what is used instead.
    CheckpointError when checkpoints exist but none verifies: starting over silently would overwrite them."""
    report = report or log.warning
    found = list_checkpoints(run_dir)
    problems = []
    for path in reversed(found):
        try:
            manifest = verify_checkpoint(path)
        except CheckpointError as exc:
            problems.append(str(exc))
            continue
        for problem in problems:
            report(f"checkpoint damaged: {problem}; falling back to the previous good checkpoint {path.name}")
        return path, manifest
    if problems:
        raise CheckpointError(f"{checkpoint_root(run_dir)}: no checkpoint can be loaded: " + "; ".join(problems)
                              + ". Move the checkpoints directory aside to start this run over.")
    return None, None


def check_compatible(manifest: dict[str, Any], config, path: str | os.PathLike = "checkpoint",
                     may_differ: Callable[[str], bool] | None = None) -> None:
    """Raise CheckpointMismatchError naming both hashes and the differing keys if ``config`` trains something else
    (another config, or the same corpus path with other content). A checkpoint differing only in keys ``may_differ``
    accepts is fine: the loader applies those itself (a PBT trial taking a donor's checkpoint with a new lr)."""
    mine = config.config_hash()
    theirs = manifest.get("config_hash")
    stored_data = manifest.get("data_fingerprint") or {}
    my_data = data_fingerprint(config) if stored_data else {}
    changed_data = sorted(key for key in stored_data if stored_data.get(key) != my_data.get(key))
    if theirs == mine and not changed_data:
        return
    stored = manifest.get("config") or {}
    keys = config.diff_keys(stored) if stored and theirs != mine else []
    if stored and not keys and not changed_data:
        return  # same training fields; the hash was taken while more settings were hashed (an older raydistill)
    if keys and may_differ is not None and not changed_data and all(may_differ(key) for key in keys):
        return
    details = []
    flat_stored, flat_mine = flatten(stored), flatten(config.to_dict())
    for key in keys[:12]:
        details.append(f"{key}: checkpoint {flat_stored.get(key, '<absent>')!r}, this run {flat_mine.get(key, '<absent>')!r}")
    more = f" (+{len(keys) - 12} more)" if len(keys) > 12 else ""
    for key in changed_data:
        details.append(f"{key} (file content): checkpoint sha256 {str(stored_data[key])[:16]}, this run "
                       f"{str(my_data.get(key, '<unreadable>'))[:16]}")
    if theirs != mine and not keys:
        details.append("unknown (the manifest has no config)")
    raise CheckpointMismatchError(
        f"{path} was written by a different config (hash {theirs}, this run {mine}); differing keys: "
        + "; ".join(details) + more
        + ". Resume with the original config and data, or give this run another run_dir. (Settings that do not "
        + f"change training may differ between runs: {', '.join(RUNTIME_ONLY_FIELDS)}.)")


def load_checkpoint(path: str | os.PathLike, config=None, map_location: str | torch.device = "cpu",
                    may_differ: Callable[[str], bool] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(manifest, state)`` of a complete, verified checkpoint, loaded with ``weights_only=True`` (tensors and plain
    containers only); refuses one of another config when given (``check_compatible``)."""
    import pickle

    path = Path(path)
    manifest = verify_checkpoint(path)
    if config is not None:
        check_compatible(manifest, config, path, may_differ)
    state = {}
    for entry in manifest["files"]:
        file = path / entry["name"]
        try:
            state[file.stem] = torch.load(file, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError as exc:
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CheckpointError(f"{file}: refused: holds objects other than tensors and plain containers, "
                                  f"which loading would execute ({first_line})") from None
    return manifest, state
