"""One job per run dir, and output directories that fail before anything starts.

``RunDirLock`` is an exclusive ``flock`` on ``<run_dir>/.raydistill.lock`` that names its holder: a second job on
the same run dir is refused (``RunDirLockedError``, naming the holder), and a lock whose holder died is taken over
with a line that says so. ``check_output_dir`` (run by ``preflight`` for run_dir and the embedding cache, and by the
jobs for the results dir, before Ray or any model starts) refuses a directory that cannot be created or written, or
whose filesystem has less than ``MIN_FREE_BYTES`` free (``OutputDirError``). Both errors are ``CheckpointError``s:
what a job reports as a run dir it cannot use.
"""

from __future__ import annotations

import datetime as _dt
import errno
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from raydistill.runtime.engine.checkpoint import CheckpointError

__all__ = ["LOCK_FILE", "MIN_FREE_BYTES", "OutputDirError", "RunDirLock", "RunDirLockedError", "check_output_dir"]

log = logging.getLogger(__name__)

# Below this a run cannot keep even one checkpoint of a small student (weights + AdamW moments + queue: tens to
# hundreds of MB), so it is refused up front rather than after the first checkpoint interval.
MIN_FREE_BYTES = 256 * 2**20


class RunDirLockedError(CheckpointError):
    """Another live job holds the run dir."""


class OutputDirError(CheckpointError):
    """An output directory that cannot be created or written, or sits on a (nearly) full filesystem."""


def check_output_dir(path: str | os.PathLike, *, min_free_bytes: int = MIN_FREE_BYTES) -> Path:
    """The absolute ``path``; OutputDirError unless it can be created and written and has ``min_free_bytes`` free.
    Creates nothing: a temporary file is written in its nearest existing ancestor and removed (``os.access`` says yes
    to root on a read-only directory and knows nothing of quotas or full disks)."""
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


LOCK_FILE = ".raydistill.lock"


class RunDirLock:
    """One job per run dir: an exclusive ``flock`` on ``<run_dir>/.raydistill.lock``, which names its holder. The
    kernel drops it when its process dies (SIGKILL, OOM; the next job says so). Emptied on release, never removed:
    removing it would let a third job lock a new file while a second holds the old, unlinked one."""

    def __init__(self, run_dir: str | os.PathLike):
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self, report=None) -> "RunDirLock":
        import fcntl
        import socket

        report = report or log.warning
        self.path.parent.mkdir(parents=True, exist_ok=True)
        from raydistill.fileio import open_lock_file

        fd = open_lock_file(self.path)  # never through a symlink, nor a hard link to another file
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            holder = _read_holder(self.path)
            raise RunDirLockedError(
                f"{self.path.parent} is in use by another job (host {holder.get('host', '?')}, pid "
                f"{holder.get('pid', '?')}, since {holder.get('started', '?')}); wait for it to end, stop it, or "
                "give this job another run_dir") from None
        previous = _read_holder(self.path)
        if previous:
            report(f"{self.path.parent}: taking over the stale lock of host {previous.get('host', '?')} pid "
                   f"{previous.get('pid', '?')} (since {previous.get('started', '?')}): that process is gone")
        me = {"host": socket.gethostname(), "pid": os.getpid(),
              "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        import fcntl

        try:
            os.ftruncate(self._fd, 0)  # an empty file: released cleanly, nothing to take over
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "RunDirLock":
        return self.acquire() if self._fd is None else self

    def __exit__(self, *exc) -> None:
        self.release()


def _read_holder(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8").strip()
        return json.loads(text) if text else {}
    except (OSError, json.JSONDecodeError):
        return {"host": "?", "pid": "? (unreadable lock file)"}
