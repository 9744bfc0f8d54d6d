"""Teacher-embedding cache: encode every sentence with a given teacher once, ever.

The teacher pass is the slow part of ConGen/SCT/CKD-style distillation (a large model over every training sentence)
while its output never changes for a frozen teacher. The authors' code caches it under fixed file names, so a new
teacher or data file silently reuses stale vectors (ConGen) or never hits at all (SCT);
docs/methods.md, ConGen and SCT. Here the cache lives in ``<root>/<teacher identity>/`` (see
``teacher.teacher_identity``), is keyed by a hash of the sentence, and grows by appending part files:

    <root>/<identity>/teacher.json                        what the identity stands for (model, pooling, max length)
    <root>/<identity>/part-<time>-<pid>-<uuid>.npy        structured rows: key V16 (text hash), embedding f4[D]
    <root>/<identity>/part-<time>-<pid>-<uuid>.parquet    the same rows, as written before (still read)

A ``.npy`` part is opened as a memory map (``np.load(mmap_mode="r")``): loading reads only the keys, to index them,
and a lookup copies just the rows asked for out of the parts that hold them, so neither opening the cache nor
adding a part ever copies the whole array (the old loader concatenated every part onto the whole, quadratic in the
number of parts). Each part is written to a temporary name and ``os.replace``d, so concurrent writers (several jobs
or Tune trials) never expose a half-written file; a sentence written twice is harmless (same teacher, same vector).

``ensure_teacher_embeddings`` looks every sentence up and sends **only the misses** through a Ray Data
``map_batches(TeacherEmbed, compute=ActorPoolStrategy(size=n))`` pool (or, ``in_process=True``, a teacher in this
process), appending what comes back every ``_APPEND_EVERY_ROWS`` rows: a pass stopped at 80 % keeps its 80 % and
the next run encodes only the rest. A second epoch or a second run with the same teacher does no teacher forward
pass at all; ``stats["teacher_forward_sentences"]`` is counted by a forward hook inside the teacher, not inferred.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raydistill.runtime.teacher import TeacherEmbed, TeacherEncoder, TeacherSpec

__all__ = ["EmbeddingCache", "TeacherVectors", "ensure_teacher_embeddings", "text_hash"]

log = logging.getLogger(__name__)

_KEY_BYTES = 16


def text_hash(text: str) -> bytes:
    """16-byte key of a sentence (blake2b; collisions are out of reach at any corpus size)."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=_KEY_BYTES).digest()


def _row_dtype(dim: int) -> np.dtype:
    """One cached row: the sentence's key and its vector, so a part is one file written (and renamed) at once."""
    return np.dtype([("key", f"V{_KEY_BYTES}"), ("embedding", "<f4", (dim,))])


class EmbeddingCache:
    """Append-only store of one teacher's sentence embeddings: memory-mapped ``.npy`` parts and an in-memory index.

    ``_parts[p]`` is one part's embeddings ``float32 [n_p, D]`` (a view into its memory map, or for an old Parquet
    part its rows read once); ``_row_of[key] = p << 32 | row``.
    """

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
        """``bool[N]``: which texts have a cached vector (the index only: no vector is read)."""
        self._load()
        return np.fromiter((text_hash(t) in self._row_of for t in texts), dtype=bool, count=len(texts))

    def lookup(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """``(hit_mask bool[N], embeddings float32[N, D])``; rows where ``hit_mask`` is False are zeros.

        Only the requested rows are copied out of the parts, one fancy-index gather per part that holds any.
        """
        self._load()
        found = np.fromiter((self._row_of.get(text_hash(t), -1) for t in texts), dtype=np.int64, count=len(texts))
        hit_mask = found >= 0
        embeddings = np.zeros((len(texts), self.dim or 0), dtype=np.float32)
        if hit_mask.any():
            positions = np.flatnonzero(hit_mask)
            part_of, row_of = found[positions] >> 32, found[positions] & 0xFFFFFFFF
            for part in np.unique(part_of):
                in_part = part_of == part
                embeddings[positions[in_part]] = self._parts[part][row_of[in_part]]
                # The kernel maps whole neighbourhoods around each row read (fault-around, read-around): scattered
                # rows would leave most of the part resident in this process.
                self._release_pages(self._parts[part])
            # A NaN/inf vector (a part damaged on disk, a teacher that overflowed) would train towards NaN: such
            # rows count as misses, so the teacher recomputes them and a newer part supersedes them. Checked on the
            # rows copied out, so the memory-mapped parts are still never read whole.
            bad = positions[~np.isfinite(embeddings[positions]).all(axis=1)]
            if len(bad):
                log.warning("embedding cache %s: %d cached vectors are not finite (NaN/inf); recomputing them",
                            self.dir, len(bad))
                hit_mask[bad] = False
                embeddings[bad] = 0.0
        self.stats["hits"] += int(hit_mask.sum())
        self.stats["misses"] += int((~hit_mask).sum())
        return hit_mask, embeddings

    def append(self, texts: list[str], embeddings: np.ndarray, view: str = "") -> Path | None:
        """Add rows as one new part file (written whole, then renamed into place) and to the index.

        ``view`` is accepted for callers that name the view they encoded; vectors do not depend on it.
        """
        embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)
        if embeddings.ndim != 2 or len(embeddings) != len(texts):
            raise ValueError(f"append: {len(texts)} texts but embeddings of shape {embeddings.shape}")
        if not texts:
            return None
        self._load()
        if self.dim is not None and embeddings.shape[1] != self.dim:
            raise ValueError(f"append: embedding dim {embeddings.shape[1]} != cached dim {self.dim} for teacher "
                             f"{self.teacher_identity}")
        rows = np.empty(len(texts), dtype=_row_dtype(embeddings.shape[1]))
        rows["key"] = np.frombuffer(b"".join(text_hash(t) for t in texts), dtype=f"V{_KEY_BYTES}")
        rows["embedding"] = embeddings
        self.dir.mkdir(parents=True, exist_ok=True)
        self._write_description()
        name = f"part-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{uuid.uuid4().hex[:8]}.npy"
        tmp = self.dir / f".{name}.tmp"
        with open(tmp, "wb") as fh:
            np.save(fh, rows)
            fh.flush()
            os.fsync(fh.fileno())  # on disk before the rename makes it visible: a crash leaves no torn part
        os.replace(tmp, self.dir / name)
        self._parts_loaded.add(name)
        self._add_part(self._open_npy(self.dir / name))
        self.stats["teacher_sentences_encoded"] += len(texts)
        return self.dir / name

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

    def _write_description(self) -> None:
        path = self.dir / "teacher.json"
        if not path.exists():
            tmp = self.dir / f".teacher.json.{os.getpid()}.tmp"
            tmp.write_text(json.dumps({"identity": self.teacher_identity, **self.description}, indent=2, default=str))
            os.replace(tmp, path)


class TeacherVectors:
    """One teacher's cached vectors, read batch by batch: ``vectors(texts) -> float32 [B, D]``.

    What a training batch carries instead of a column of the whole corpus's vectors: each call gathers only its
    rows out of the memory-mapped parts, so the process holds the cache's index (~100 bytes a sentence), never the
    vectors. Pickles as its location (it reopens the cache in the process it is sent to).
    """

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


def ensure_teacher_embeddings(texts: list[str], view: str, teacher_cfg, cache_root: str | os.PathLike, *,
                              in_process: bool = False, return_vectors: bool = True,
                              ) -> tuple[np.ndarray | None, dict[str, Any]]:
    """Teacher embeddings float32[N, D] of ``texts`` in order, encoding only what the cache lacks.

    ``return_vectors=False``: make sure every text is cached and return ``(None, stats)`` without gathering a
    single vector: what a training job does, whose batches read their rows' vectors from the memory-mapped cache
    (``TeacherVectors``), so no process holds the corpus's vectors whole.

    ``teacher_cfg``: a TeacherSpec, a JobConfig, or a dict of TeacherSpec fields (model, encoder, pooling,
    max_length, resources). Misses are encoded by a pool of ``resources.num_actors`` TeacherEmbed actors through
    Ray Data (Ray must be initialised: ``raydistill.runtime.cluster.init_ray``), or with ``in_process=True`` by one
    teacher in this process, and appended to the cache every ``_APPEND_EVERY_ROWS`` rows as they arrive (and once
    more when the pass is interrupted), so a stopped teacher pass resumes where it stopped.
    Returns ``(embeddings, stats)``; stats: hits, misses (unique sentences not cached), teacher_forward_sentences
    (rows counted inside the teacher), precision, cache_dir, seconds.
    """
    started = time.perf_counter()
    spec = TeacherSpec.coerce(teacher_cfg)
    identity = spec.identity()
    precision, why = spec.precision()
    cache = EmbeddingCache(cache_root, identity, description={**spec.describe(), "precision": precision})
    texts = [str(t) for t in texts]
    if return_vectors:
        hit_mask, embeddings = cache.lookup(texts)
    else:
        hit_mask, embeddings = cache.contains(texts), None

    miss_positions = np.flatnonzero(~hit_mask)
    unique_misses = list(dict.fromkeys(texts[i] for i in miss_positions))  # first-seen order, no duplicates
    forward_rows = 0
    if unique_misses:
        log.info("teacher pass (%s, view %s): %d of %d sentences to encode, %s (%s)", identity, view,
                 len(unique_misses), len(texts), precision, why)
        batches = (_in_process_batches(unique_misses, spec) if in_process
                   else _ray_data_batches(unique_misses, spec))
        new_embeddings, forward_rows = _collect(batches, unique_misses, cache, view, keep=return_vectors)
        if return_vectors:
            if embeddings.shape[1] == 0:
                embeddings = np.zeros((len(texts), new_embeddings.shape[1]), dtype=np.float32)
            row_of = {t: i for i, t in enumerate(unique_misses)}
            embeddings[miss_positions] = new_embeddings[[row_of[texts[i]] for i in miss_positions]]
    stats = {
        "teacher": identity,
        "view": view,
        "sentences": len(texts),
        "hits": int(hit_mask.sum()),
        "misses": len(unique_misses),
        "teacher_forward_sentences": int(forward_rows),
        "precision": precision,
        "cache_dir": str(cache.dir),
        "seconds": round(time.perf_counter() - started, 3),
    }
    log.info("teacher embeddings (%s, view %s): %d cached, %d encoded in %.1fs",
             identity, view, stats["hits"], stats["misses"], stats["seconds"])
    return embeddings, stats


# Rows per cache part written while the pass streams: what a stopped pass can lose at most (a SIGKILL; any other
# interruption saves what arrived). ~1-2 minutes of mpnet-base on 2 CPU cores.
_APPEND_EVERY_ROWS = 4096
# Rows per Ray Data map_batches call, i.e. per TeacherEncoder.encode: enough for its length buckets to be full.
_ROWS_PER_TEACHER_CALL = 1024


def _length_order(texts: list[str]) -> np.ndarray:
    """Indices of ``texts`` by character length, so each block (and each teacher call) holds similar lengths."""
    return np.argsort(np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts)), kind="stable")


def _in_process_batches(texts: list[str], spec: TeacherSpec):
    """``(idx int64[b], embeddings float32[b, D], forward rows)`` per call of one in-process teacher."""
    teacher = TeacherEncoder(**spec.encoder_kwargs())
    order = _length_order(texts)
    for start in range(0, len(order), _ROWS_PER_TEACHER_CALL):
        idx = order[start:start + _ROWS_PER_TEACHER_CALL]
        rows_before = teacher.forward_rows
        block = teacher.encode([texts[i] for i in idx])
        yield idx, block, teacher.forward_rows - rows_before


def _ray_data_batches(texts: list[str], spec: TeacherSpec):
    """``(idx, embeddings, forward rows)`` per output block of a TeacherEmbed actor pool (Ray Data)."""
    import ray
    import ray.data

    if not ray.is_initialized():
        raise RuntimeError("teacher embeddings need Ray: call raydistill.runtime.cluster.init_ray(cfg) first "
                           "(Ray Data would otherwise start a Ray of its own with every CPU), or pass "
                           "in_process=True")
    resources = spec.resources
    order = _length_order(texts)
    # Enough blocks for every pool actor to get work, and blocks small enough to stream (bounded memory).
    num_blocks = max(1, min(len(texts), max(2 * resources.num_actors, math.ceil(len(texts) / 4096))))
    source = ray.data.from_arrow(pa.table({"idx": order.astype(np.int64), "text": [texts[i] for i in order]}),
                                 override_num_blocks=num_blocks)
    remote_args: dict[str, Any] = {"num_cpus": resources.num_cpus}
    if resources.num_gpus:
        remote_args["num_gpus"] = resources.num_gpus
    embedded = source.map_batches(
        TeacherEmbed,
        batch_size=max(resources.batch_size, _ROWS_PER_TEACHER_CALL),
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=resources.num_actors),
        fn_constructor_kwargs=spec.encoder_kwargs(),
        **remote_args,
    )
    _leave_room_for_the_pool(embedded, resources.num_actors * resources.num_cpus,
                             resources.num_actors * resources.num_gpus)
    for batch in embedded.iter_batches(batch_size=None, batch_format="numpy"):
        yield (np.asarray(batch["idx"]), np.asarray(batch["embedding"], dtype=np.float32),
               int(np.asarray(batch["teacher_forward_rows"]).sum()))


def _collect(batches, texts: list[str], cache: EmbeddingCache, view: str, keep: bool = True,
             ) -> tuple[np.ndarray | None, int]:
    """Append ``(idx, embeddings, forward rows)`` batches to ``cache`` every ``_APPEND_EVERY_ROWS`` rows and on the
    way out of an interrupted pass; with ``keep``, also gather them into float32 [N, D] in input order.

    Returns (embeddings in input order, or None without ``keep``; rows that went through the teacher's transformer).
    """
    embeddings: np.ndarray | None = None
    seen = np.zeros(len(texts), dtype=bool)
    forward_rows = 0
    unsaved: list[tuple[np.ndarray, np.ndarray]] = []  # (idx, vectors) encoded but not yet in a cache part

    def save() -> None:
        if unsaved:
            idx = np.concatenate([i for i, _ in unsaved])
            cache.append([texts[i] for i in idx], np.concatenate([block for _, block in unsaved]), view=view)
            unsaved.clear()

    try:
        for idx, block, rows in batches:
            if keep:
                if embeddings is None:
                    embeddings = np.zeros((len(texts), block.shape[1]), dtype=np.float32)
                embeddings[idx] = block
            seen[idx] = True
            forward_rows += rows
            unsaved.append((idx, np.asarray(block, dtype=np.float32)))
            if sum(len(i) for i, _ in unsaved) >= _APPEND_EVERY_ROWS:
                save()
    finally:
        # Interrupted (Ctrl-C, a failed actor, a stopped job): keep what was computed for the next run.
        save()
    if not seen.all():
        raise RuntimeError(f"teacher pool returned {int(seen.sum())} of {len(texts)} embeddings")
    return embeddings, forward_rows


def _leave_room_for_the_pool(dataset, pool_cpus: float, pool_gpus: float) -> None:
    """Cap this dataset's ``exclude_resources`` (CPUs kept for learner actors, cluster.configure_data_context) so
    that Ray Data may still plan the teacher pool.

    The teacher pass runs before the learners start, so the reservation must not make the pool unschedulable in
    Ray Data's budget. If actors really hold those CPUs, the pool's actors cannot start and Ray Data's
    ``wait_for_min_actors_s`` turns that into an error instead of a hang.
    """
    import ray
    from ray.data import ExecutionResources

    options = dataset.context.execution_options
    excluded = options.exclude_resources
    if excluded is None:
        return
    total = ray.cluster_resources()
    cpu = min(excluded.cpu, max(0.0, total.get("CPU", 0.0) - pool_cpus))
    gpu = min(excluded.gpu, max(0.0, total.get("GPU", 0.0) - pool_gpus))
    if (cpu, gpu) != (excluded.cpu, excluded.gpu):
        options.exclude_resources = ExecutionResources(cpu=cpu, gpu=gpu)
