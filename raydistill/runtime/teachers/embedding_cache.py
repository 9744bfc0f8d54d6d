"""Teacher-embedding cache: encode every sentence with a given teacher once, ever.

The teacher pass is the slow part of ConGen/SCT/CKD-style distillation while its output never changes for a frozen
teacher. The authors' code caches it under fixed file names, so a new teacher or data file silently reuses stale
vectors (ConGen) or never hits at all (SCT; docs/methods.md). Here the cache lives in ``<root>/<teacher identity>/``
(``teacher.teacher_identity``), keyed by a hash of the sentence; its store (``cache_store.py``, re-exported here)
describes the layout and its guarantees.

``ensure_teacher_embeddings`` looks every sentence up and sends **only the misses** through a Ray Data
``map_batches(TeacherEmbed, compute=ActorPoolStrategy(size=n))`` pool (or, ``in_process=True``, a teacher in this
process), appending what comes back every ``_APPEND_EVERY_ROWS`` rows: a pass stopped at 80 % keeps its 80 % and
the next run encodes only the rest. A second epoch or a second run with the same teacher does no teacher forward
pass at all; ``stats["teacher_forward_sentences"]`` is counted by a forward hook inside the teacher, not inferred.
Vectors the teacher returns that are not finite (a bf16/fp16 teacher that overflowed) are not cached: the pass saves
the others and then fails naming the first such sentence.
"""

from __future__ import annotations

import logging
import math
import os
import time
from typing import Any

import numpy as np
import pyarrow as pa

from raydistill.runtime.teachers import cache_store
from raydistill.runtime.teachers.cache_store import (
    CacheDiskFullError,
    EmbeddingCache,
    TeacherVectors,
    cache_row_bytes,
    text_hash,
)
from raydistill.runtime.teachers.teacher import TeacherEmbed, TeacherEncoder, TeacherSpec

__all__ = ["EmbeddingCache", "TeacherVectors", "CacheDiskFullError", "NonFiniteTeacherVectorsError",
           "ensure_teacher_embeddings", "text_hash", "cache_row_bytes"]

log = logging.getLogger(__name__)

# The host tag of temporary part names, which tests name (re-exported).
_HOST = cache_store._HOST


class NonFiniteTeacherVectorsError(ValueError):
    """The teacher returned NaN/inf vectors; they were not cached."""


def ensure_teacher_embeddings(texts: list[str], view: str, teacher_cfg, cache_root: str | os.PathLike, *,
                              in_process: bool = False, return_vectors: bool = True,
                              ) -> tuple[np.ndarray | None, dict[str, Any]]:
    """``(embeddings float32[N, D] of texts in order, stats)``, encoding only what the cache lacks; with
    ``return_vectors=False`` ``(None, stats)``, all cached (training batches read the cache: ``TeacherVectors``).

    ``teacher_cfg``: a TeacherSpec, a JobConfig or a dict of TeacherSpec fields. Misses go through
    ``resources.num_actors`` TeacherEmbed actors (Ray initialised) unless ``in_process``. stats: hits, misses (unique
    sentences), non_finite_cached (recomputed), teacher_forward_sentences (counted inside the teacher), precision,
    cache_dir, seconds. ``CacheDiskFullError`` on a full disk; ``NonFiniteTeacherVectorsError`` on NaN/inf vectors
    from the teacher (after caching the others)."""
    started = time.perf_counter()
    spec = TeacherSpec.coerce(teacher_cfg)
    identity = spec.identity()
    precision, why = spec.precision()
    cache = EmbeddingCache(cache_root, identity, description={**spec.describe(), "precision": precision})
    cache.sweep_stale_temporaries()
    texts = [str(t) for t in texts]
    hit_mask, embeddings = cache.lookup(texts) if return_vectors else (cache.usable(texts), None)

    miss_positions = np.flatnonzero(~hit_mask)
    first_position: dict[str, int] = {}  # first-seen order, no duplicates
    for i in miss_positions:
        first_position.setdefault(texts[i], int(i))
    unique_misses = list(first_position)
    forward_rows = 0
    if unique_misses:
        log.info("teacher pass (%s, view %s): %d of %d sentences to encode, %s (%s)", identity, view,
                 len(unique_misses), len(texts), precision, why)
        batches = (_in_process_batches(unique_misses, spec) if in_process
                   else _ray_data_batches(unique_misses, spec))
        new_embeddings, forward_rows = _collect(batches, unique_misses, cache, view, keep=return_vectors,
                                                positions=list(first_position.values()),
                                                progress=_PassProgress(f"teacher pass ({spec.model}, view {view})",
                                                                       len(unique_misses)))
        if return_vectors:
            if embeddings.shape[1] == 0:
                embeddings = np.zeros((len(texts), new_embeddings.shape[1]), dtype=np.float32)
            row_of = {t: i for i, t in enumerate(unique_misses)}
            embeddings[miss_positions] = new_embeddings[[row_of[texts[i]] for i in miss_positions]]
    stats = {"teacher": identity, "view": view, "sentences": len(texts), "hits": int(hit_mask.sum()),
             "misses": len(unique_misses), "non_finite_cached": int(cache.stats.get("non_finite", 0)),
             "teacher_forward_sentences": int(forward_rows), "precision": precision, "cache_dir": str(cache.dir),
             "seconds": round(time.perf_counter() - started, 3)}
    log.info("teacher embeddings (%s, view %s): %d cached, %d encoded in %.1fs",
             identity, view, stats["hits"], stats["misses"], stats["seconds"])
    return embeddings, stats


# Rows per cache part written while the pass streams: what a stopped pass can lose at most (a SIGKILL; any other
# interruption saves what arrived). ~1-2 minutes of mpnet-base on 2 CPU cores.
_APPEND_EVERY_ROWS = 4096
# Rows per Ray Data map_batches call, i.e. per TeacherEncoder.encode: enough for its length buckets to be full.
_ROWS_PER_TEACHER_CALL = 1024
# Rows per block of the Ray Data source (at least two blocks per pool actor): blocks small enough to stream.
_ROWS_PER_BLOCK = 4096


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
        raise RuntimeError("teacher embeddings need Ray: call raydistill.runtime.engine.cluster.init_ray(cfg) first "
                           "(Ray Data would otherwise start a Ray of its own with every CPU), or pass "
                           "in_process=True")
    resources = spec.resources
    order = _length_order(texts)
    # Enough blocks for every pool actor to get work, and blocks small enough to stream (bounded memory).
    num_blocks = max(1, min(len(texts), max(2 * resources.num_actors, math.ceil(len(texts) / _ROWS_PER_BLOCK))))
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


class _PassProgress:
    """One line every ``every_s`` seconds while a teacher pass runs, and one at its end: sentences done, rate, ETA."""

    def __init__(self, what: str, total: int, every_s: float = 30.0):
        self.what, self.total, self.every_s = what, int(total), float(every_s)
        self.started = self.last = time.perf_counter()
        print(f"[teacher] {what}: {self.total:,} sentences to encode", flush=True)

    def update(self, done: int) -> None:
        now = time.perf_counter()
        if done < self.total and now - self.last < self.every_s:
            return
        self.last, elapsed = now, max(now - self.started, 1e-9)
        rate = done / elapsed
        left = (self.total - done) / rate if rate > 0 else float("inf")
        eta = f", ~{left / 60:.0f} min left" if done < self.total and math.isfinite(left) else ""
        print(f"[teacher] {self.what}: {done:,}/{self.total:,} sentences ({rate:.0f}/s{eta})", flush=True)


def _collect(batches, texts: list[str], cache: EmbeddingCache, view: str, keep: bool = True,
             positions: list[int] | None = None, progress: _PassProgress | None = None,
             ) -> tuple[np.ndarray | None, int]:
    """Append ``(idx, embeddings, forward rows)`` batches to ``cache`` every ``_APPEND_EVERY_ROWS`` rows and on the
    way out of an interrupted pass; return (with ``keep``, float32 [N, D] in input order, else None; teacher forward
    rows). A non-finite vector's sentence is named by ``positions[i]`` (its index in the caller's texts)."""
    embeddings: np.ndarray | None = None
    seen = np.zeros(len(texts), dtype=bool)
    non_finite = np.zeros(len(texts), dtype=bool)
    forward_rows = saved_rows = 0
    unsaved: list[tuple[np.ndarray, np.ndarray]] = []  # (idx, vectors) encoded but not yet in a cache part

    def save() -> None:
        nonlocal saved_rows
        if not unsaved:
            return
        idx = np.concatenate([i for i, _ in unsaved])
        vectors = np.concatenate([block for _, block in unsaved])
        unsaved.clear()  # written or not, never retried: a full disk stays full on the way out
        try:
            cache.append([texts[i] for i in idx], vectors, view=view)
        except CacheDiskFullError as full:
            rest = (len(texts) - saved_rows) * cache_row_bytes(vectors.shape[1])
            raise CacheDiskFullError(full.directory, max(rest, full.needed_bytes), full.free_bytes,
                                     f"the teacher vectors of {len(texts) - saved_rows} sentences not cached yet "
                                     f"({cache_row_bytes(vectors.shape[1])} bytes each)") from full
        saved_rows += len(idx)

    try:
        for idx, block, rows in batches:
            idx, block = np.asarray(idx), np.asarray(block, dtype=np.float32)
            if keep:
                if embeddings is None:
                    embeddings = np.zeros((len(texts), block.shape[1]), dtype=np.float32)
                embeddings[idx] = block
            seen[idx] = True
            forward_rows += rows
            finite = np.isfinite(block).all(axis=1)
            non_finite[idx[~finite]] = True
            unsaved.append((idx[finite], block[finite]))
            if sum(len(i) for i, _ in unsaved) >= _APPEND_EVERY_ROWS:
                save()
            if progress is not None:
                progress.update(int(seen.sum()))
    finally:
        # Interrupted (Ctrl-C, a failed actor, a stopped job): keep what was computed for the next run.
        save()
    if not seen.all():
        raise RuntimeError(f"teacher pool returned {int(seen.sum())} of {len(texts)} embeddings")
    if non_finite.any():
        first, count = int(np.flatnonzero(non_finite)[0]), int(non_finite.sum())
        raise NonFiniteTeacherVectorsError(
            f"teacher pass (view {view}): the teacher returned vectors that are not finite (NaN/inf) for {count} of "
            f"{len(texts)} sentences, the first sentence {positions[first] if positions else first} "
            f"({texts[first][:80]!r}); they were not cached (the other {len(texts) - count} were, in {cache.dir}). "
            "A teacher in bf16 can overflow: set resources.teacher.precision: fp32, or check the teacher's weights")
    return embeddings, forward_rows


def _leave_room_for_the_pool(dataset, pool_cpus: float, pool_gpus: float) -> None:
    """Raise this dataset's ``resource_limits`` (the cluster less the learners' CPUs) to what the teacher pool asks:
    the pass runs before the learners start, so their reservation must not starve it. If actors really hold those
    CPUs, ``wait_for_min_actors_s`` turns the wait into an error instead of a hang."""
    import ray

    options = dataset.context.execution_options
    limits = options.resource_limits
    total = ray.cluster_resources()
    cpu = max(limits.cpu, min(pool_cpus, total.get("CPU", 0.0)))
    gpu = max(limits.gpu, min(pool_gpus, total.get("GPU", 0.0)))
    if (cpu, gpu) != (limits.cpu, limits.gpu):
        options.resource_limits = limits.copy(cpu=cpu, gpu=gpu)
