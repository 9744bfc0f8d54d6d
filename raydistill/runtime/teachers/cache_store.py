"""The embedding cache's store: one teacher's sentence vectors in ``<root>/<teacher identity>/`` (see
``teacher.teacher_identity``), keyed by a hash of the sentence, grown by appending part files:

    <root>/<identity>/teacher.json                        what the identity stands for (model, pooling, max length)
    <root>/<identity>/part-<time>-<pid>-<uuid>.npy        structured rows: key V16 (text hash), embedding f4[D]
    <root>/<identity>/part-<time>-<pid>-<uuid>.parquet    the same rows, as written before (still read)

A ``.npy`` part is opened as a memory map: loading reads only the keys, to index them, and a lookup copies just the
rows asked for, so neither opening the cache nor adding a part ever copies the whole array. Each part is written to a
temporary name (``.part-*.<host>.tmp``), fsynced and renamed, so concurrent writers (jobs, Tune trials) never expose
a half-written file; a later part wins for a key. A writer opening the cache removes the temporary files of writers
that died (a dead process of this host, or anything a day old).

Only finite vectors are cached: ``append`` refuses a NaN/inf vector (naming the sentence), and a cached vector that
is not finite (a part damaged on disk, or an older version's) is a miss in ``lookup`` and ``usable``, so the pass
recomputes it and the new part supersedes it. A disk that fills up during an append raises ``CacheDiskFullError``
naming the folder, the space needed and the space left; the parts written so far stay, so the next run resumes.

``EmbeddingCache`` is the store; ``TeacherVectors`` reads one teacher's vectors batch by batch.
``raydistill.runtime.teachers.embedding_cache`` fills the cache and re-exports every public name of this module.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import shutil
import socket
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raydistill.fileio import atomic_write_json, atomic_writer, pid_alive

# The records keep the logger name they had before this module was split out of embedding_cache (log filters
# select it).
log = logging.getLogger("raydistill.runtime.teachers.embedding_cache")

_KEY_BYTES = 16


def text_hash(text: str) -> bytes:
    """16-byte key of a sentence (blake2b; collisions are out of reach at any corpus size)."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=_KEY_BYTES).digest()


def _row_dtype(dim: int) -> np.dtype:
    """One cached row: the sentence's key and its vector, so a part is one file written (and renamed) at once."""
    return np.dtype([("key", f"V{_KEY_BYTES}"), ("embedding", "<f4", (dim,))])


def cache_row_bytes(dim: int) -> int:
    """Bytes one cached sentence takes on disk for a teacher of width ``dim`` (its key and float32 vector)."""
    return _row_dtype(dim).itemsize


# Rows whose vectors are read at a time when checking cached vectors without returning them (``usable``).
_CHECK_ROWS = 8192
# A temporary part this old has no live writer on any host (a part of _APPEND_EVERY_ROWS rows takes seconds).
_STALE_TEMPORARY_S = 24 * 3600
_HOST = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname()) or "host"
_TEMPORARY_PART = re.compile(r"^\.part-\d{8}T\d{6}-(?P<pid>\d+)-[0-9a-f]+\.npy(?:\.(?P<host>[\w-]+))?\.tmp$")


def _megabytes(size: float) -> str:
    return f"{size / 2**20:.2f} MiB" if size < 10 * 2**20 else f"{size / 2**20:.0f} MiB"


class CacheDiskFullError(OSError):
    """The cache's filesystem ran out of space while a part was written; nothing torn or temporary is left."""

    def __init__(self, directory: Path, needed_bytes: int, free_bytes: int, what: str):
        self.directory, self.needed_bytes, self.free_bytes = directory, needed_bytes, free_bytes
        super().__init__(errno.ENOSPC, f"embedding cache {directory}: out of disk space writing {what}: it needs "
                                       f"{_megabytes(needed_bytes)} and its filesystem has {_megabytes(free_bytes)} "
                                       "left. Free space there (or set cache_dir to a larger disk) and run the job "
                                       "again: the vectors already cached are kept and the teacher pass encodes only "
                                       "the rest")

    def __str__(self) -> str:
        return self.strerror


def _out_of_space(exc: OSError, directory: Path, needed_bytes: int) -> bool:
    """Whether a failed write is a full disk: ENOSPC/EDQUOT/EFBIG, or numpy's errno-less short write
    ("N requested and M written") on a filesystem that has less room than the write needed."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return True
    return exc.errno is None and _free_bytes(directory) < needed_bytes


def _free_bytes(directory: Path) -> int:
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return 0


class EmbeddingCache:
    """Append-only store of one teacher's sentence embeddings: memory-mapped ``.npy`` parts and an in-memory index.
    ``_parts[p]``: a part's ``float32 [n_p, D]`` (memory-mapped, or an old Parquet part read); ``_row_of[key] = p << 32
    | row``."""

    def __init__(self, root: str | os.PathLike, teacher_identity: str, description: dict[str, Any] | None = None):
        self.root = Path(root).expanduser()
        self.teacher_identity = teacher_identity
        self.dir = self.root / teacher_identity
        self.description = description or {}
        self.stats = {"hits": 0, "misses": 0, "teacher_sentences_encoded": 0}
        self._row_of: dict[bytes, int] | None = None
        self._parts: list[np.ndarray] = []
        self._parts_loaded: set[str] = set()

    # ------------------------------------------------------------------------------------------------------------

    @property
    def dim(self) -> int | None:
        self._load()
        return self._parts[0].shape[1] if self._parts else None

    def __len__(self) -> int:
        self._load()
        return len(self._row_of)

    def contains(self, texts: list[str]) -> np.ndarray:
        """``bool[N]``: which texts have a cached vector (the index only: no vector is read, none is checked)."""
        self._load()
        return np.fromiter((text_hash(t) in self._row_of for t in texts), dtype=bool, count=len(texts))

    def usable(self, texts: list[str]) -> np.ndarray:
        """``bool[N]``: which texts have a finite cached vector (as ``lookup`` would return it), read ``_CHECK_ROWS``
        at a time (bounded memory); a NaN/inf one counts as missing, so the teacher pass recomputes it."""
        self._load()
        found = self._positions(texts)
        usable = np.zeros(len(texts), dtype=bool)
        non_finite = 0
        for start in range(0, len(texts), _CHECK_ROWS):
            _, usable[start:start + _CHECK_ROWS], bad = self._gather(found[start:start + _CHECK_ROWS])
            non_finite += bad
        self._count(usable, non_finite)
        return usable

    def lookup(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """``(hit_mask bool[N], embeddings float32[N, D])``, misses as zeros; only the requested rows are copied out
        of the parts. A cached vector that is not finite is a miss (warned about)."""
        self._load()
        embeddings, hit_mask, non_finite = self._gather(self._positions(texts))
        self._count(hit_mask, non_finite)
        return hit_mask, embeddings

    def append(self, texts: list[str], embeddings: np.ndarray, view: str = "") -> Path | None:
        """Add rows as one new part file (written whole, fsynced, renamed) and to the index (``view`` is ignored).
        ``ValueError`` for a non-finite vector (naming the sentence), ``CacheDiskFullError`` for a full filesystem;
        either way nothing is written."""
        embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)
        if embeddings.ndim != 2 or len(embeddings) != len(texts):
            raise ValueError(f"append: {len(texts)} texts but embeddings of shape {embeddings.shape}")
        if not texts:
            return None
        bad = np.flatnonzero(~np.isfinite(embeddings).all(axis=1))
        if len(bad):
            raise ValueError(f"embedding cache {self.dir}: refusing {len(bad)} teacher vectors that are not finite "
                             f"(NaN/inf), the first for sentence {bad[0]} of the {len(texts)} given "
                             f"({texts[bad[0]][:80]!r}); nothing was written")
        self._load()
        if self.dim is not None and embeddings.shape[1] != self.dim:
            raise ValueError(f"append: embedding dim {embeddings.shape[1]} != cached dim {self.dim} for teacher "
                             f"{self.teacher_identity}")
        rows = np.empty(len(texts), dtype=_row_dtype(embeddings.shape[1]))
        rows["key"] = np.frombuffer(b"".join(text_hash(t) for t in texts), dtype=f"V{_KEY_BYTES}")
        rows["embedding"] = embeddings
        name = f"part-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{uuid.uuid4().hex[:8]}.npy"
        self._write_part(name, rows)
        self._parts_loaded.add(name)
        self._add_part(self._open_npy(self.dir / name))
        self.stats["teacher_sentences_encoded"] += len(texts)
        return self.dir / name

    def sweep_stale_temporaries(self) -> list[Path]:
        """Remove temporary parts of writers that died mid-write: of a process of this host that is gone, or a day
        old whatever host wrote them (the cache dir may be shared storage). Returns what was removed."""
        removed = []
        for tmp in self.dir.glob(".part-*.tmp") if self.dir.is_dir() else ():
            match = _TEMPORARY_PART.match(tmp.name)
            if match is None:
                continue
            writer_gone = match["host"] == _HOST and not pid_alive(int(match["pid"]))
            if writer_gone or time.time() - _mtime_ns(tmp) / 1e9 > _STALE_TEMPORARY_S:
                tmp.unlink(missing_ok=True)
                removed.append(tmp)
        if removed:
            log.info("embedding cache %s: removed %d temporary parts of writers that died (%s)", self.dir,
                     len(removed), ", ".join(p.name for p in removed[:3]))
        return removed

    # ------------------------------------------------------------------------------------------------------------

    def _load(self) -> None:
        """Index part files not seen yet (other processes may have appended since)."""
        if self._row_of is None:
            self._row_of = {}
        if not self.dir.is_dir():
            return
        # Oldest first by modification time (then name, whose time stamp has whole seconds only): a later part wins
        # for a key, so a row recomputed because its cached vector was damaged supersedes it.
        parts = sorted(list(self.dir.glob("part-*.npy")) + list(self.dir.glob("part-*.parquet")),
                       key=lambda part: (_mtime_ns(part), part.name))
        opened = []
        for part in parts:
            if part.name in self._parts_loaded:
                continue
            # Marked seen either way: a part refused below is warned about once per process, not at every lookup.
            self._parts_loaded.add(part.name)
            try:
                rows = self._open_npy(part) if part.suffix == ".npy" else self._read_parquet(part)
            except (OSError, ValueError, pa.ArrowInvalid) as exc:  # a truncated part fails its memory map here
                log.warning("embedding cache: skipping unreadable part %s (%s); its sentences are recomputed",
                            part, exc)
                continue
            if rows is not None and len(rows[1]):
                opened.append((part, rows))
        # One teacher has one width: a part of another width (a file copied from another cache) is refused rather
        # than crashing every lookup. The width is the one already loaded, else the one most rows have.
        widths: dict[int, int] = {}
        for _, (_, embeddings) in opened:
            widths[embeddings.shape[1]] = widths.get(embeddings.shape[1], 0) + len(embeddings)
        width = self._parts[0].shape[1] if self._parts else max(widths, key=widths.get, default=None)
        for part, rows in opened:
            if rows[1].shape[1] != width:
                log.warning("embedding cache: skipping part %s: vectors of dimension %d where this teacher's have %d; "
                            "its sentences are recomputed", part, rows[1].shape[1], width)
                continue
            self._add_part(rows)

    @staticmethod
    def _open_npy(path: Path) -> tuple[np.ndarray, np.ndarray]:
        """``(keys V16[n], embeddings float32[n, D])`` as views into the part's memory map (nothing read yet)."""
        rows = np.load(path, mmap_mode="r")
        if rows.dtype.names != ("key", "embedding"):
            raise ValueError(f"not a cache part (fields {rows.dtype.names})")
        return rows["key"], rows["embedding"]

    @staticmethod
    def _release_pages(array: np.ndarray) -> None:
        """Drop the memory map's pages from this process's resident set; they stay in the page cache, so the next
        read of them is still a memory copy. Indexing a part reads its keys, which sit between the vectors (every
        page touched once); a lookup reads rows scattered over the part."""
        mapping = getattr(array.base, "_mmap", None) or getattr(array, "_mmap", None)
        if mapping is not None and hasattr(mapping, "madvise"):
            import mmap

            mapping.madvise(mmap.MADV_DONTNEED)

    @staticmethod
    def _read_parquet(path: Path) -> tuple[np.ndarray, np.ndarray] | None:
        """An old Parquet part, read into memory once (Parquet cannot be memory-mapped as float32 rows)."""
        table = pq.read_table(path, columns=["text_hash", "embedding"])
        if table.num_rows == 0:
            return None
        column = table.column("embedding").combine_chunks()
        dim = column.type.list_size
        embeddings = column.flatten().to_numpy(zero_copy_only=False).astype(np.float32).reshape(-1, dim)
        keys = np.frombuffer(b"".join(table.column("text_hash").to_pylist()), dtype=f"V{_KEY_BYTES}")
        return keys, embeddings

    def _add_part(self, rows: tuple[np.ndarray, np.ndarray]) -> None:
        keys, embeddings = rows
        if self._parts and embeddings.shape[1] != self._parts[0].shape[1]:
            raise ValueError(f"cache part of dim {embeddings.shape[1]} among parts of dim {self._parts[0].shape[1]} "
                             f"in {self.dir}")
        part = len(self._parts)
        self._parts.append(embeddings)
        raw = keys.tobytes()  # the keys only: 16 bytes a row
        self._release_pages(keys)
        # (part, row) packed into one int keeps the index near 100 bytes a sentence. Later parts win for a key
        # written twice (same teacher, same vector either way).
        self._row_of.update((raw[i * _KEY_BYTES:(i + 1) * _KEY_BYTES], (part << 32) | i) for i in range(len(keys)))

    def _positions(self, texts: list[str]) -> np.ndarray:
        """``int64[N]``: each text's packed (part, row) in the index, -1 when not cached."""
        return np.fromiter((self._row_of.get(text_hash(t), -1) for t in texts), dtype=np.int64, count=len(texts))

    def _gather(self, found: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """``(embeddings float32[n, D], usable bool[n], non-finite count)`` for packed positions ``found``. Missing
        (-1) or non-finite rows are zeros and unusable: a NaN/inf vector (damaged part, old teacher overflow) would
        train towards NaN, so it is recomputed. Checked on the rows copied out (parts are never read whole)."""
        usable = found >= 0
        embeddings = np.zeros((len(found), self.dim or 0), dtype=np.float32)
        if not usable.any():
            return embeddings, usable, 0
        positions = np.flatnonzero(usable)
        part_of, row_of = found[positions] >> 32, found[positions] & 0xFFFFFFFF
        for part in np.unique(part_of):
            in_part = part_of == part
            embeddings[positions[in_part]] = self._parts[part][row_of[in_part]]
            # The kernel maps whole neighbourhoods around each row read (fault-around, read-around): scattered
            # rows would leave most of the part resident in this process.
            self._release_pages(self._parts[part])
        bad = positions[~np.isfinite(embeddings[positions]).all(axis=1)]
        usable[bad] = False
        embeddings[bad] = 0.0
        return embeddings, usable, len(bad)

    def _count(self, usable: np.ndarray, non_finite: int) -> None:
        if non_finite:
            log.warning("embedding cache %s: %d cached vectors are not finite (NaN/inf); recomputing them",
                        self.dir, non_finite)
        self.stats["hits"] += int(usable.sum())
        self.stats["misses"] += int((~usable).sum())
        self.stats["non_finite"] = self.stats.get("non_finite", 0) + non_finite

    def _write_part(self, name: str, rows: np.ndarray) -> None:
        """Write ``rows`` as part ``name`` through ``fileio.atomic_writer`` (no torn part). The temporary file names
        this host, so on a shared cache dir ``sweep_stale_temporaries`` tells a dead writer's part from a live one
        elsewhere. A failed write removes it; a full disk raises ``CacheDiskFullError``."""
        needed = rows.nbytes + 4096  # the .npy header, teacher.json
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._write_description()
            with atomic_writer(self.dir / name, tmp=self.dir / f".{name}.{_HOST}.tmp") as stream:
                np.save(stream, rows)
        except OSError as exc:
            if _out_of_space(exc, self.dir, needed):
                raise CacheDiskFullError(self.dir, needed, _free_bytes(self.dir),
                                         f"a part of {len(rows)} teacher vectors") from exc
            raise

    def _write_description(self) -> None:
        path = self.dir / "teacher.json"
        if not path.exists():
            atomic_write_json(path, {"identity": self.teacher_identity, **self.description}, default=str)


class TeacherVectors:
    """One teacher's cached vectors, read batch by batch: ``vectors(texts) -> float32 [B, D]``; a process holds the
    cache's index (~100 bytes a sentence), never a column of the corpus's vectors. Pickles as its location."""

    def __init__(self, cache_root: str | os.PathLike, teacher_identity: str):
        self.cache_root, self.teacher_identity = str(cache_root), teacher_identity
        self._cache: EmbeddingCache | None = None

    def _open(self) -> EmbeddingCache:
        if self._cache is None:
            self._cache = EmbeddingCache(self.cache_root, self.teacher_identity)
        return self._cache

    @property
    def dim(self) -> int | None:
        return self._open().dim

    def __call__(self, texts) -> np.ndarray:
        cache = self._open()
        hit_mask, vectors = cache.lookup([str(t) for t in texts])
        if not hit_mask.all():
            missing = [str(t) for t, hit in zip(texts, hit_mask) if not hit]
            raise RuntimeError(f"embedding cache {cache.dir}: {len(missing)} of {len(hit_mask)} sentences of this "
                               f"batch have no usable teacher vector (first: {missing[0][:80]!r}); the cache was "
                               "changed or damaged after the teacher pass. Run the job again: its teacher pass "
                               "encodes only what is missing, and training resumes from its checkpoint")
        return vectors

    def __getstate__(self) -> dict[str, Any]:
        return {"cache_root": self.cache_root, "teacher_identity": self.teacher_identity, "_cache": None}


def _mtime_ns(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:  # removed meanwhile: sorted first, then skipped as unreadable
        return 0
