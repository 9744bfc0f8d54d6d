"""Teacher-embedding cache: encode every sentence with a given teacher once, ever.

The teacher pass is the slow part of ConGen/SCT/CKD-style distillation (a large model over every training sentence)
while its output never changes for a frozen teacher. The authors' code caches it under fixed file names, so a new
teacher or data file silently reuses stale vectors (ConGen) or never hits at all (SCT);
docs/methods.md, ConGen and SCT. Here the cache lives in ``<root>/<teacher identity>/`` (see
``teacher.teacher_identity``), is keyed by a hash of the sentence, and grows by appending Parquet part files:

    <root>/<identity>/teacher.json                 what the identity stands for (model, pooling, max length)
    <root>/<identity>/part-<time>-<pid>-<uuid>.parquet   text_hash binary(16), view string, embedding float32[D]

Each part is written to a temporary name and ``os.replace``d, so concurrent writers (several jobs or Tune trials)
never expose a half-written file; a sentence written twice is harmless (same teacher, same vector).

``ensure_teacher_embeddings`` looks every sentence up and sends **only the misses** through a Ray Data
``map_batches(TeacherEmbed, compute=ActorPoolStrategy(size=n))`` pool, then appends them. A second epoch or a second
run with the same teacher does no teacher forward pass at all; ``stats["teacher_forward_sentences"]`` is counted by a
forward hook inside the teacher, not inferred.
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

from raydistill.runtime.teacher import TeacherEmbed, TeacherSpec

__all__ = ["EmbeddingCache", "ensure_teacher_embeddings", "text_hash"]

log = logging.getLogger(__name__)


def text_hash(text: str) -> bytes:
    """16-byte key of a sentence (blake2b; collisions are out of reach at any corpus size)."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


class EmbeddingCache:
    """Append-only Parquet store of one teacher's sentence embeddings."""

    def __init__(self, root: str | os.PathLike, teacher_identity: str, description: dict[str, Any] | None = None):
        self.root = Path(root).expanduser()
        self.teacher_identity = teacher_identity
        self.dir = self.root / teacher_identity
        self.description = description or {}
        self.stats = {"hits": 0, "misses": 0, "teacher_sentences_encoded": 0}
        self._row_of: dict[bytes, int] | None = None  # text hash -> row of self._embeddings
        self._embeddings = np.zeros((0, 0), dtype=np.float32)
        self._parts_loaded: set[str] = set()

    # ------------------------------------------------------------------------------------------------------------

    @property
    def dim(self) -> int | None:
        self._load()
        return self._embeddings.shape[1] if len(self._embeddings) else None

    def __len__(self) -> int:
        self._load()
        return len(self._row_of)

    def lookup(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """``(hit_mask bool[N], embeddings float32[N, D])``; rows where ``hit_mask`` is False are zeros."""
        self._load()
        rows = np.fromiter((self._row_of.get(text_hash(t), -1) for t in texts), dtype=np.int64, count=len(texts))
        hit_mask = rows >= 0
        dim = self._embeddings.shape[1] if len(self._embeddings) else 0
        embeddings = np.zeros((len(texts), dim), dtype=np.float32)
        if hit_mask.any():
            embeddings[hit_mask] = self._embeddings[rows[hit_mask]]
        self.stats["hits"] += int(hit_mask.sum())
        self.stats["misses"] += int((~hit_mask).sum())
        return hit_mask, embeddings

    def append(self, texts: list[str], embeddings: np.ndarray, view: str = "") -> Path | None:
        """Add rows as one new part file (atomically) and to the in-memory index."""
        embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)
        if embeddings.ndim != 2 or len(embeddings) != len(texts):
            raise ValueError(f"append: {len(texts)} texts but embeddings of shape {embeddings.shape}")
        if not texts:
            return None
        self._load()
        if len(self._embeddings) and embeddings.shape[1] != self._embeddings.shape[1]:
            raise ValueError(f"append: embedding dim {embeddings.shape[1]} != cached dim "
                             f"{self._embeddings.shape[1]} for teacher {self.teacher_identity}")
        hashes = [text_hash(t) for t in texts]
        dim = embeddings.shape[1]
        table = pa.table({
            "text_hash": pa.array(hashes, type=pa.binary(16)),
            "view": pa.array([view] * len(texts), type=pa.string()),
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(embeddings.reshape(-1), type=pa.float32()), dim),
        })
        self.dir.mkdir(parents=True, exist_ok=True)
        self._write_description()
        name = f"part-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{uuid.uuid4().hex[:8]}.parquet"
        tmp = self.dir / f".{name}.tmp"
        pq.write_table(table, tmp)
        os.replace(tmp, self.dir / name)
        self._parts_loaded.add(name)
        self._add_rows(hashes, embeddings)
        self.stats["teacher_sentences_encoded"] += len(texts)
        return self.dir / name

    # ------------------------------------------------------------------------------------------------------------

    def _load(self) -> None:
        """Read part files not seen yet (other processes may have appended since)."""
        if self._row_of is None:
            self._row_of = {}
        if not self.dir.is_dir():
            return
        for part in sorted(self.dir.glob("part-*.parquet")):
            if part.name in self._parts_loaded:
                continue
            try:
                table = pq.read_table(part, columns=["text_hash", "embedding"])
            except (OSError, pa.ArrowInvalid) as exc:
                log.warning("embedding cache: skipping unreadable part %s (%s)", part, exc)
                continue
            self._parts_loaded.add(part.name)
            if table.num_rows == 0:
                continue
            column = table.column("embedding").combine_chunks()
            dim = column.type.list_size
            embeddings = column.flatten().to_numpy(zero_copy_only=False).astype(np.float32).reshape(-1, dim)
            self._add_rows(table.column("text_hash").to_pylist(), embeddings)

    def _add_rows(self, hashes: list[bytes], embeddings: np.ndarray) -> None:
        if len(self._embeddings) == 0:
            self._embeddings = np.zeros((0, embeddings.shape[1]), dtype=np.float32)
        start = len(self._embeddings)
        self._embeddings = np.concatenate([self._embeddings, embeddings])
        for offset, key in enumerate(hashes):
            self._row_of[key] = start + offset

    def _write_description(self) -> None:
        path = self.dir / "teacher.json"
        if not path.exists():
            tmp = self.dir / f".teacher.json.{os.getpid()}.tmp"
            tmp.write_text(json.dumps({"identity": self.teacher_identity, **self.description}, indent=2, default=str))
            os.replace(tmp, path)


def ensure_teacher_embeddings(texts: list[str], view: str, teacher_cfg, cache_root: str | os.PathLike,
                              ) -> tuple[np.ndarray, dict[str, Any]]:
    """Teacher embeddings float32[N, D] of ``texts`` in order, encoding only what the cache lacks.

    ``teacher_cfg``: a TeacherSpec, a JobConfig, or a dict of TeacherSpec fields (model, encoder, pooling,
    max_length, resources). Misses are encoded by a pool of ``resources.num_actors`` TeacherEmbed actors through
    Ray Data (Ray must be initialised: ``raydistill.runtime.cluster.init_ray``) and appended to the cache every
    ~8k rows as they arrive, so an interrupted teacher pass resumes where it stopped.
    Returns ``(embeddings, stats)``; stats: hits, misses (unique sentences not cached), teacher_forward_sentences
    (rows counted inside the teacher), cache_dir, seconds.
    """
    started = time.perf_counter()
    spec = TeacherSpec.coerce(teacher_cfg)
    identity = spec.identity()
    cache = EmbeddingCache(cache_root, identity, description=spec.describe())
    texts = [str(t) for t in texts]
    hit_mask, embeddings = cache.lookup(texts)

    miss_positions = np.flatnonzero(~hit_mask)
    unique_misses = list(dict.fromkeys(texts[i] for i in miss_positions))  # first-seen order, no duplicates
    forward_rows = 0
    if unique_misses:
        new_embeddings, forward_rows = _encode_with_ray_data(unique_misses, spec, cache, view)
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
        "cache_dir": str(cache.dir),
        "seconds": round(time.perf_counter() - started, 3),
    }
    log.info("teacher embeddings (%s, view %s): %d cached, %d encoded in %.1fs",
             identity, view, stats["hits"], stats["misses"], stats["seconds"])
    return embeddings, stats


# Rows per cache part written while the teacher pool streams: a crash or a stopped job keeps what was encoded.
_APPEND_EVERY_ROWS = 8192


def _encode_with_ray_data(texts: list[str], spec: TeacherSpec, cache: EmbeddingCache,
                          view: str) -> tuple[np.ndarray, int]:
    """Run ``texts`` through a TeacherEmbed actor pool, appending results to ``cache`` as they stream in.

    Returns (embeddings in input order, rows that went through the teacher's transformer).
    """
    import ray
    import ray.data

    if not ray.is_initialized():
        raise RuntimeError("teacher embeddings need Ray: call raydistill.runtime.cluster.init_ray(cfg) first "
                           "(Ray Data would otherwise start a Ray of its own with every CPU)")
    resources = spec.resources
    # Enough blocks for every pool actor to get work, and blocks small enough to stream (bounded memory).
    num_blocks = max(1, min(len(texts), max(2 * resources.num_actors, math.ceil(len(texts) / 4096))))
    source = ray.data.from_arrow(pa.table({"idx": np.arange(len(texts), dtype=np.int64), "text": texts}),
                                 override_num_blocks=num_blocks)
    remote_args: dict[str, Any] = {"num_cpus": resources.num_cpus}
    if resources.num_gpus:
        remote_args["num_gpus"] = resources.num_gpus
    embedded = source.map_batches(
        TeacherEmbed,
        batch_size=resources.batch_size,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=resources.num_actors),
        fn_constructor_kwargs=spec.encoder_kwargs(),
        **remote_args,
    )
    _leave_room_for_the_pool(embedded, resources.num_actors * resources.num_cpus,
                             resources.num_actors * resources.num_gpus)
    embeddings: np.ndarray | None = None
    seen = np.zeros(len(texts), dtype=bool)
    forward_rows = 0
    unsaved: list[np.ndarray] = []  # idx arrays encoded but not yet in a cache part

    def save() -> None:
        idx = np.concatenate(unsaved)
        cache.append([texts[i] for i in idx], embeddings[idx], view=view)
        unsaved.clear()

    for batch in embedded.iter_batches(batch_size=None, batch_format="numpy"):
        idx = np.asarray(batch["idx"])
        block = np.asarray(batch["embedding"], dtype=np.float32)
        if embeddings is None:
            embeddings = np.zeros((len(texts), block.shape[1]), dtype=np.float32)
        embeddings[idx] = block
        seen[idx] = True
        forward_rows += int(np.asarray(batch["teacher_forward_rows"]).sum())
        unsaved.append(idx)
        if sum(len(i) for i in unsaved) >= _APPEND_EVERY_ROWS:
            save()
    if unsaved:
        save()
    if embeddings is None or not seen.all():
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
