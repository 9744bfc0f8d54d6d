"""Durable, atomic file writes: the one helper every state, result and config file goes through.

Contract: after ``atomic_write_*`` returns, the file at ``path`` holds the new content in full and survives a crash or
power loss; a crash at any earlier moment leaves the previous file (or none) in place, never a torn one. The content is
written to a temporary file in the same folder (``.<name>.tmp-<pid>``), fsynced, renamed over ``path`` and the folder
fsynced so the rename itself is on disk. A failed write removes its temporary file and re-raises. Content too large to
hold in memory (arrays, Arrow files) is streamed through ``atomic_writer(path)``, which gives the same guarantee.

``fsync_dir`` is exported for code that renames directories (checkpoints, ``best/``).

Directories: ``staged_directory(final)`` builds a directory in a staging sibling (``.<name>.tmp-<pid>``) and swaps it
in whole when the block ends (``replace_directory``: the old one is moved aside to ``.<name>.old-<pid>`` first,
because a rename cannot replace a non-empty directory), or removes it when the block raises; ``copy_directory``
publishes a copy the same way. ``recover_directory(final)``, run when a job starts, undoes what a writer that died
mid-swap left.

Names read from files (manifests, checkpoints, trial records) go through ``child_path(folder, name)``, which refuses
anything that would leave ``folder``. Lock files are opened with ``open_lock_file``, which never follows a symlink and
never truncates."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

__all__ = ["atomic_writer", "atomic_write_bytes", "atomic_write_text", "atomic_write_json",
           "fsync_dir", "pid_alive", "file_sha256",
           "fsync_tree", "replace_directory", "staged_directory", "copy_directory", "recover_directory", "child_path",
           "UnsafeNameError", "open_lock_file", "UnsafeLockFileError"]

log = logging.getLogger(__name__)


def fsync_dir(path: str | os.PathLike) -> None:
    """Flush a directory entry (a rename or a new file) to disk; a no-op where the OS cannot open directories."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)  # some filesystems (and Windows) refuse it on a directory; the rename is still atomic
    finally:
        os.close(fd)


def file_sha256(path: str | os.PathLike, chunk_bytes: int = 8 << 20) -> str:
    """The SHA-256 (hex) of a file's content, read in chunks (weight files and checkpoints are gigabytes)."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike, *, tmp: str | os.PathLike | None = None) -> Iterator[BinaryIO]:
    """A binary stream whose content becomes ``path`` atomically and durably when the block ends (module docstring).

    An exception in the block (a failed write, or a check of what was written) removes the temporary file and
    propagates; ``path`` keeps its previous content. ``tmp``: the temporary file, a sibling of ``path``, for a writer
    that sweeps its own leftovers by name or runs several writes of one path in one process."""
    path = Path(path)
    tmp = Path(tmp) if tmp is not None else path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as stream:
            yield stream
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically and durably (see the module docstring). Returns the path."""
    with atomic_writer(path) as stream:
        stream.write(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    return atomic_write_bytes(path, text.encode(encoding))


def atomic_write_json(path: str | os.PathLike, data: Any, *, indent: int | None = 2, sort_keys: bool = False,
                      ensure_ascii: bool = False, default: Any = None) -> Path:
    text = json.dumps(data, indent=indent, sort_keys=sort_keys, ensure_ascii=ensure_ascii, default=default)
    return atomic_write_text(path, text + "\n")


# ----------------------------------------------------------------------------------------------------------------
# Directories swapped in whole


def fsync_tree(path: str | os.PathLike) -> None:
    """fsync every file and folder under ``path``, so a rename of ``path`` never publishes unwritten content."""
    for folder, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(folder)


def _sibling(final: Path, kind: str, pid: int) -> Path:
    return final.with_name(f".{final.name}.{kind}-{pid}")


def replace_directory(staged: str | os.PathLike, final: str | os.PathLike) -> Path:
    """Make the complete directory ``staged`` become ``final``, replacing any previous ``final``.

    ``staged`` is fsynced first. Between the two renames only ``.<name>.old-<pid>`` holds the previous content; a
    crash there is undone by ``recover_directory`` at the next start."""
    staged, final = Path(staged), Path(final)
    fsync_tree(staged)
    old = _sibling(final, "old", os.getpid()) if final.exists() else None
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(staged, final)
    fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return final


@contextlib.contextmanager
def staged_directory(final: str | os.PathLike) -> Iterator[Path]:
    """The path to build a new ``final`` in (``.<name>.tmp-<pid>``, not yet created: ``model.save``, ``copytree`` and
    Ray Data's writers create their folder); ``replace_directory`` swaps it in when the block ends. An exception in
    the block removes it and leaves ``final`` as it was."""
    final = Path(final)
    staged = _sibling(final, "tmp", os.getpid())
    shutil.rmtree(staged, ignore_errors=True)  # this pid's leftover of an earlier, interrupted build
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        yield staged
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    replace_directory(staged, final)


def copy_directory(source: str | os.PathLike, final: str | os.PathLike) -> Path:
    """Make ``final`` a copy of the directory ``source``, swapped in whole (``staged_directory``)."""
    with staged_directory(final) as staged:
        shutil.copytree(source, staged)
    return Path(final)


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host (one we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # removed meanwhile by another process's sweep
        return 0.0


def recover_directory(final: str | os.PathLike) -> bool:
    """Undo an interrupted ``replace_directory``/staging of ``final``; returns True when ``final`` was put back.

    Only leftovers of processes that are gone (or of this one) are touched: a live writer may be mid-swap."""
    final = Path(final)
    if not final.parent.is_dir():
        return False
    pattern = re.compile(rf"^\.{re.escape(final.name)}\.(tmp|old)-(\d+)$")
    leftovers = sorted((path for path in final.parent.iterdir() if pattern.match(path.name)),
                       key=_mtime, reverse=True)  # the newest moved-aside copy is the one put back
    restored = False
    for path in leftovers:
        kind, pid = pattern.match(path.name).groups()
        if int(pid) != os.getpid() and pid_alive(int(pid)):
            continue
        if kind == "old" and not final.exists():
            os.replace(path, final)
            fsync_dir(final.parent)
            log.warning("restored %s from %s: the process that was replacing it (pid %s) died between its two "
                        "renames", final, path.name, pid)
            restored = True
        else:
            shutil.rmtree(path, ignore_errors=True)
            log.info("removed %s, left behind by pid %s", path, pid)
    return restored


# ----------------------------------------------------------------------------------------------------------------
# Names read from files


class UnsafeNameError(ValueError):
    """A name read from a file would point outside the folder it belongs to."""


def child_path(folder: str | os.PathLike, name: str) -> Path:
    """``folder / name`` for a plain name read from a file; UnsafeNameError for anything that could leave ``folder``
    (empty, ``.``/``..``, absolute, a path separator, a NUL byte)."""
    text = str(name) if name is not None else ""
    if (not isinstance(name, str) or text in ("", ".", "..") or "/" in text or "\\" in text or "\0" in text
            or os.path.isabs(text) or (os.altsep and os.altsep in text)):
        raise UnsafeNameError(f"refusing the name {name!r} for an entry of {folder}: a name read from a file must be "
                              "a plain file or folder name (no '..', no '/', not absolute); the file it came from "
                              "was altered or written by something else")
    return Path(folder) / text


# ----------------------------------------------------------------------------------------------------------------
# Lock files


class UnsafeLockFileError(OSError):
    """A lock file that is a symlink, a hard link or not a regular file: locking it could write elsewhere."""


def open_lock_file(path: str | os.PathLike) -> int:
    """Open (create if missing) ``path`` for locking and return its descriptor: never through a symlink, never
    truncated, and only when it is a regular file with a single link."""
    path = Path(path)
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError:
        if path.is_symlink():
            raise UnsafeLockFileError(f"{path} is a symlink (to {os.readlink(path)}); a lock file is never followed "
                                      "through a link, since locking it would write to the link's target. Remove "
                                      "the link and run again") from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        what = "not a regular file" if not stat.S_ISREG(info.st_mode) else f"a hard link ({info.st_nlink} names)"
        raise UnsafeLockFileError(f"{path} is {what}; a lock file must be a file of its own, since locking writes "
                                  "to it. Remove it and run again")
    return fd
