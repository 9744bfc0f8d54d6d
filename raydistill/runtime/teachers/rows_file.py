"""The rows file: a job's training rows as one uncompressed Arrow IPC file named by its content, read through a
memory map.

    path = write_rows_file({"idx": ..., "group": ..., "text_<view>": ...}, cache_dir)   # <cache_dir>/rows/<hash>.arrow
    batch = _take_rows(str(path), row_ids)     # those rows as numpy columns (texts as object arrays)

``write_rows_file`` writes a file once per content and reuses it only while its content still hashes to its name
(a torn or altered one is logged and rebuilt); the write is atomic (temporary file, fsync, rename). A reader that
cannot open one raises ``RowsFileError`` naming it. ``raydistill.runtime.teachers.pipeline`` (which re-exports
``write_rows_file`` and ``RowsFileError``) builds a job's rows file and streams its batches from it.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import numpy as np

# The records keep the logger name they had before this module was split out of the pipeline (log filters select it).
log = logging.getLogger("raydistill.runtime.teachers.pipeline")

# Where the rows files live, under the job's cache dir (next to the teacher's embedding cache).
ROWS_DIR = "rows"


@functools.lru_cache(maxsize=4)
def _mapped_rows(rows_path: str):
    """The rows file as an Arrow table over a read-only memory map (zero-copy; kept open per process)."""
    import pyarrow as pa

    try:
        with pa.memory_map(rows_path, "r") as source:
            return pa.ipc.open_file(source).read_all()
    except (OSError, pa.ArrowInvalid) as exc:
        raise RowsFileError(f"rows file {rows_path} is unreadable ({exc}); it was changed after the job's driver "
                            "checked it. Run the job again: its driver verifies the rows file and rebuilds a damaged "
                            "one") from exc


class RowsFileError(RuntimeError):
    """A rows file that cannot be read; the message names it."""


def _take_rows(rows_path: str, row_ids: np.ndarray) -> dict[str, np.ndarray]:
    """Rows ``row_ids`` of the rows file as numpy columns (texts as object arrays)."""
    import pyarrow as pa

    taken = _mapped_rows(rows_path).take(pa.array(row_ids, type=pa.int64()))
    return {name: (np.asarray(taken.column(name).to_pylist(), dtype=object) if name.startswith("text_")
                   else taken.column(name).to_numpy())
            for name in taken.column_names}


def write_rows_file(columns: dict[str, np.ndarray], cache_dir) -> Path:
    """Write the rows' ``idx``, ``group`` and ``text_<view>`` columns as an uncompressed Arrow IPC file
    ``<cache_dir>/rows/<sha256 of its content>.arrow`` (shared by every job on the same rows; checked once per
    process and file state) and return its path. On a multi-node cluster the cache dir is shared storage."""
    import pyarrow as pa

    table = pa.table({name: (pa.array(list(column), type=pa.string()) if name.startswith("text_")
                             else pa.array(column)) for name, column in columns.items()})
    digest = _write_ipc(table, _HashingSink()).hexdigest()  # the name first, serialised without keeping a copy
    path = Path(cache_dir) / ROWS_DIR / f"{digest[:_ROWS_NAME_HEX]}.arrow"
    if path.is_file():
        problem = _rows_file_problem(path)
        if problem is None:
            return path
        log.warning("rows file %s is damaged (%s); rebuilding it", path, problem)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_rows_durably(table, path)
    return path


# Hex digits of the content's SHA-256 in a rows file's name.
_ROWS_NAME_HEX = 32
# Rows files found intact in this process: path -> (size, mtime_ns) when checked.
_VERIFIED_ROWS_FILES: dict[str, tuple[int, int]] = {}


class _HashingSink:
    """A write-only file object that hashes what it is given and keeps nothing; with ``stream``, also writes it."""

    def __init__(self, stream=None):
        import hashlib

        self.digest, self.stream, self.closed, self.position = hashlib.sha256(), stream, False, 0

    def write(self, data) -> int:
        self.digest.update(data)
        if self.stream is not None:
            self.stream.write(data)
        self.position += len(data)
        return len(data)

    def tell(self) -> int:
        return self.position

    def flush(self) -> None:
        if self.stream is not None:
            self.stream.flush()

    def close(self) -> None:
        self.closed = True

    def writable(self) -> bool:
        return True

    def hexdigest(self) -> str:
        return self.digest.hexdigest()


def _write_ipc(table, sink: _HashingSink) -> _HashingSink:
    import pyarrow as pa

    with pa.PythonFile(sink, mode="w") as stream, pa.ipc.new_file(stream, table.schema) as writer:
        writer.write_table(table)
    return sink


def _rows_file_problem(path: Path) -> str | None:
    """None when the rows file's content hashes to its name, else what is wrong (remembered while intact)."""
    from raydistill.fileio import file_sha256

    stat = path.stat()
    if _VERIFIED_ROWS_FILES.get(str(path)) == (stat.st_size, stat.st_mtime_ns):
        return None
    digest = file_sha256(path)
    if digest[:_ROWS_NAME_HEX] != path.stem:
        return f"its {stat.st_size} bytes hash to sha256 {digest[:_ROWS_NAME_HEX]}, not to its name"
    _VERIFIED_ROWS_FILES[str(path)] = (stat.st_size, stat.st_mtime_ns)
    return None


def _write_rows_durably(table, path: Path) -> None:
    """Stream the IPC file through ``fileio.atomic_writer``, hashing as it goes: content that does not hash to the
    file's name is never renamed into place. The temporary name is unique per write, since two jobs in one process
    (a sweep's trials) may build the same rows file at once."""
    import os
    import uuid

    from raydistill.fileio import atomic_writer

    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    with atomic_writer(path, tmp=tmp) as stream:
        written = _write_ipc(table, _HashingSink(stream))
        if written.hexdigest()[:_ROWS_NAME_HEX] != path.stem:
            raise RuntimeError(f"rows file {path}: the content written hashes to {written.hexdigest()}, not to its "
                               "name (Arrow serialised the same table differently twice)")
    stat = path.stat()
    _VERIFIED_ROWS_FILES[str(path)] = (stat.st_size, stat.st_mtime_ns)
