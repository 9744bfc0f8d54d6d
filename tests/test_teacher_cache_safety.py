"""The teacher-embedding cache and the rows file are never trusted blindly: damage is detected, reported and redone.

* damaged cache parts (truncated, of another vector width, holding NaN vectors) among good ones are warned about and
  recomputed; a NaN row is found on the jobs' own teacher-pass path (``cache_teacher_vectors``, which returns no
  vectors), and a NaN vector is never written;
* a teacher changed anywhere in its weights gets a cache of its own;
* a torn or altered rows file is rebuilt;
* a full disk ends the pass with a message that says where and how much, and the rerun resumes it;
* a killed pool actor and a stopped pass cache every row exactly once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from raydistill.config.job import RoleResources
from raydistill.runtime.teachers.embedding_cache import (
    CacheDiskFullError,
    EmbeddingCache,
    NonFiniteTeacherVectorsError,
    ensure_teacher_embeddings,
)
from raydistill.runtime.teachers.teacher import TeacherEncoder, TeacherSpec
from tests.distill_fixtures import teacher_dir  # noqa: F401 - fixture
from tests.ray_fixtures import ray_session  # noqa: F401 - the session-wide Ray fixture

pytest_plugins = ["tests.reliability_log"]

PART_ROWS = 40


def test_truncated_wrong_width_and_nan_parts_are_detected_warned_and_recomputed(teacher_dir, real_sentences, tmp_path,
                                                                                caplog, reliability):
    texts = list(dict.fromkeys(real_sentences))[:4 * PART_ROWS]
    spec = TeacherSpec(model=str(teacher_dir), max_length=32,
                       resources=RoleResources(num_actors=1, num_cpus=1, threads=1, batch_size=16))
    root = tmp_path / "cache"
    for start in range(0, len(texts), PART_ROWS):  # four parts of 40 sentences
        ensure_teacher_embeddings(texts[start:start + PART_ROWS], "control", spec, root, in_process=True)
    cache_dir = EmbeddingCache(root, spec.identity()).dir
    parts = sorted(cache_dir.glob("part-*.npy"))
    assert len(parts) == 4
    truncated, wrong_width, with_nan, intact = parts

    data = truncated.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])  # a copy cut short
    rows = np.load(wrong_width)
    wider = np.empty(len(rows), dtype=[("key", rows.dtype["key"]), ("embedding", "<f4", (rows["embedding"].shape[1] + 5,))])
    wider["key"], wider["embedding"] = rows["key"], 0.1  # the same sentences, vectors of another teacher's width
    np.save(wrong_width, wider)
    rows = np.load(with_nan)
    rows["embedding"][::4, 3] = np.nan  # every 4th vector damaged
    np.save(with_nan, rows)
    nan_rows = len(rows[::4])

    caplog.set_level(logging.WARNING, logger="raydistill.runtime.teachers.embedding_cache")
    embeddings, stats = ensure_teacher_embeddings(texts, "control", spec, root, in_process=True)
    warnings = [record.getMessage() for record in caplog.records]
    assert any(str(truncated) in w and "unreadable part" in w for w in warnings), warnings
    assert any(str(wrong_width) in w and "vectors of dimension 53 where this teacher's have 48" in w
               for w in warnings), warnings
    assert any(f"{nan_rows} cached vectors are not finite" in w for w in warnings), warnings
    # Exactly the damaged rows went through the teacher again; the intact part was a hit.
    assert stats["misses"] == stats["teacher_forward_sentences"] == 2 * PART_ROWS + nan_rows
    assert stats["hits"] == PART_ROWS + (PART_ROWS - nan_rows)
    assert np.isfinite(embeddings).all()
    direct = TeacherEncoder(**spec.encoder_kwargs()).encode(texts)
    np.testing.assert_allclose(embeddings, direct, atol=1e-5)

    # The recomputed rows are cached now: a second pass reads every sentence from the cache, all finite.
    again, stats_again = ensure_teacher_embeddings(texts, "control", spec, root, in_process=True)
    assert (stats_again["hits"], stats_again["misses"]) == (len(texts), 0)
    np.testing.assert_allclose(again, direct, atol=1e-5)
    reliability.record(
        "fault", "teacher-cache-corrupt",
        input=f"a teacher cache of 4 parts x {PART_ROWS} sentences: one part cut to half its bytes, one rewritten with "
              f"vectors 5 wider, one with NaN in every 4th vector ({nan_rows} rows), one intact",
        did="each detected and logged (unreadable part; part of another dimension skipped; non-finite cached "
            f"vectors); exactly those {2 * PART_ROWS + nan_rows} sentences were recomputed by the teacher and "
            "cached again; the returned vectors equal a fresh teacher's and a second pass is all hits",
        message=" / ".join(w for w in warnings if "embedding cache" in w)[:600],
        lost="the damaged parts' teacher work, recomputed")


# ----------------------------------------------------------------------------------------------------------------
# Non-finite vectors: found on the jobs' own teacher-pass path, and never written


def job_config(teacher_dir, root, **teacher_resources):
    """A tiny ConGen job's config: its teacher pass (``cache_teacher_vectors``) is what these tests drive."""
    from raydistill.config.job import JobConfig
    from tests.distill_fixtures import congen_config

    cfg = congen_config(teacher_dir, teacher_dir, root, "job")
    cfg["resources"]["teacher"].update(teacher_resources)
    return JobConfig.from_dict(cfg)


@pytest.mark.ray
def test_nan_cached_row_is_found_by_the_jobs_teacher_pass_and_recomputed(teacher_dir, real_sentences, tmp_path,
                                                                         ray_session, caplog, reliability):
    """A NaN row in the cache (a part damaged on disk, or written by a teacher that overflowed before vectors were
    checked) is a miss for the job's teacher pass (``return_vectors=False``), so the batches find a finite vector."""
    from raydistill.runtime.teachers.pipeline import cache_teacher_vectors

    cfg = job_config(teacher_dir, tmp_path)
    spec = TeacherSpec.from_config(cfg)
    texts = list(dict.fromkeys(real_sentences))[:64]
    ensure_teacher_embeddings(texts, "control", spec, cfg.resolved_cache_dir(), in_process=True, return_vectors=False)
    (part,) = EmbeddingCache(cfg.resolved_cache_dir(), spec.identity()).dir.glob("part-*.npy")
    rows = np.load(part)
    rows["embedding"][::8, 5] = np.nan  # every 8th vector damaged
    np.save(part, rows)
    nan_rows = len(rows[::8])

    caplog.set_level(logging.WARNING, logger="raydistill.runtime.teachers.embedding_cache")
    teacher, stats = cache_teacher_vectors(cfg, {"control": texts})
    warnings = [r.getMessage() for r in caplog.records if "not finite" in r.getMessage()]
    batch_vectors = teacher["control"](texts)  # what a training batch reads: TeacherVectors over the cache
    again_teacher, again = cache_teacher_vectors(cfg, {"control": texts})
    reliability.record(
        "teacher cache", "cache-nan-recomputed",
        input=f"a teacher cache of {len(texts)} sentences with NaN in every 8th cached vector ({nan_rows} rows); "
              "the job's teacher pass (cache_teacher_vectors, Ray Data pool, return_vectors=False) run again",
        did=f"the pass read the cached rows, found {stats['views']['control']['non_finite_cached']} not finite, "
            f"warned, and sent {stats['teacher_forward_sentences']} sentences through the teacher; the batches' "
            f"TeacherVectors then read finite vectors equal to the teacher's; a second pass: {again['hits']} hits, "
            f"{again['teacher_forward_sentences']} encoded",
        message=" / ".join(warnings)[:400], lost="the damaged rows' teacher work, recomputed")
    assert warnings and f"{nan_rows} cached vectors are not finite" in warnings[0]
    assert (stats["hits"], stats["misses"], stats["teacher_forward_sentences"]) == (
        len(texts) - nan_rows, nan_rows, nan_rows)
    assert stats["views"]["control"]["non_finite_cached"] == nan_rows
    np.testing.assert_allclose(batch_vectors, TeacherEncoder(**spec.encoder_kwargs()).encode(texts), atol=1e-5)
    assert (again["hits"], again["teacher_forward_sentences"]) == (len(texts), 0)
    np.testing.assert_array_equal(again_teacher["control"](texts), batch_vectors)


def nan_token_teacher(teacher_dir, tmp_path, texts):
    """A copy of the teacher whose embedding of one word piece is NaN: exactly the sentences holding that piece
    come out NaN (attention spreads it over the sentence), as a teacher that overflows on some inputs does."""
    import shutil

    from safetensors.numpy import load_file, save_file
    from transformers import AutoTokenizer

    model = tmp_path / "nan-teacher"
    shutil.copytree(teacher_dir, model)
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    pieces = [set(tokenizer(t, truncation=True, max_length=32)["input_ids"]) for t in texts]
    special = set(tokenizer.all_special_ids)
    counts: dict[int, int] = {}
    for ids in pieces:
        for i in ids - special:
            counts[i] = counts.get(i, 0) + 1
    piece = min((i for i, n in counts.items() if len(texts) // 8 <= n <= len(texts) // 3), key=lambda i: -counts[i])
    weights = load_file(model / "model.safetensors")
    (name,) = [key for key in weights if key.endswith("word_embeddings.weight")]
    weights[name][piece] = np.nan
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
    return model, np.array([piece in ids for ids in pieces])


def test_non_finite_teacher_vectors_are_refused_when_written(teacher_dir, real_sentences, tmp_path, reliability):
    texts = list(dict.fromkeys(real_sentences))[:48]
    model, poisoned = nan_token_teacher(teacher_dir, tmp_path, texts)
    spec = TeacherSpec(model=str(model), max_length=32, resources=RoleResources(threads=1, precision="fp32"))
    root = tmp_path / "cache"
    first = int(np.flatnonzero(poisoned)[0])
    with pytest.raises(NonFiniteTeacherVectorsError) as refused:
        ensure_teacher_embeddings(texts, "control", spec, root, in_process=True, return_vectors=False)
    cache = EmbeddingCache(root, spec.identity())
    cached = cache.contains(texts)
    with pytest.raises(ValueError, match=r"refusing 1 teacher vectors that are not finite .* sentence 1 of the 2"):
        cache.append(texts[:2], np.array([[0.5] * 48, [np.nan] * 48], dtype=np.float32))
    reliability.record(
        "teacher cache", "cache-nan-recomputed",
        input=f"a teacher whose vectors are NaN for {int(poisoned.sum())} of {len(texts)} sentences (one word "
              "piece's embedding set to NaN), through the teacher pass; and EmbeddingCache.append of a NaN vector",
        did=f"the pass cached the {int(cached.sum())} finite vectors and then failed naming the first NaN "
            "sentence's index and text; append refused the NaN vector naming its index, writing nothing",
        message=str(refused.value), lost="nothing: the finite vectors are cached")
    assert f"for {int(poisoned.sum())} of {len(texts)} sentences, the first sentence {first} " in str(refused.value)
    assert "precision: fp32" in str(refused.value)
    np.testing.assert_array_equal(cached, ~poisoned)  # every finite vector kept, no NaN written
    assert cache.usable(texts).sum() == (~poisoned).sum()
    assert len(list(cache.dir.glob("part-*.npy"))) == 1 and not list(cache.dir.glob(".*tmp*"))


# ----------------------------------------------------------------------------------------------------------------
# The teacher's identity covers every byte of its weights


def middle_tensor(path: Path) -> tuple[str, int, int]:
    """``(name, start, end)``: byte range in the safetensors file of a tensor that lies wholly between its first and
    its last MiB (what the old fingerprint read)."""
    import json
    import struct

    data = path.read_bytes()
    header_bytes = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + header_bytes])
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        start, end = (8 + header_bytes + offset for offset in entry["data_offsets"])
        if start >= 2**20 and end <= len(data) - 2**20 and name.endswith("weight") and end - start >= 4096:
            return name, start, end
    raise AssertionError(f"no tensor of {path} lies between its first and last MiB")


def test_changed_middle_tensor_gives_a_new_teacher_identity_and_cache(real_sentences, tmp_path, monkeypatch,
                                                                      reliability):
    """Two teachers that differ only in a tensor between their weight file's first and last MiB get different
    caches; the full-content hash is remembered by (path, size, mtime), so a rerun does not read the file again."""
    import hashlib
    import json
    import os

    from raydistill.runtime.teachers import teacher as teacher_module
    from tests.tiny_models import make_tiny_model

    monkeypatch.setenv("RAYDISTILL_HOME", str(tmp_path / "home"))  # the hash memo lives there
    monkeypatch.setattr(teacher_module, "_SHA256_MEMO", {})
    model = make_tiny_model("bert", tmp_path / "teacher", real_sentences, hidden=32, intermediate=8192, seed=5)
    weights = model / "model.safetensors"
    assert weights.stat().st_size > 3 * 2**20
    spec = TeacherSpec(model=str(model), max_length=32, resources=RoleResources(threads=1, precision="fp32"))
    texts = list(dict.fromkeys(real_sentences))[:32]
    before, before_stats = ensure_teacher_embeddings(texts, "control", spec, tmp_path / "cache", in_process=True)
    memo = json.loads((tmp_path / "home" / "file-hashes.json").read_text())
    assert memo[str(weights.resolve())]["sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()

    name, start, end = middle_tensor(weights)
    data = bytearray(weights.read_bytes())
    tensor = np.frombuffer(data, dtype="<f4", count=(end - start) // 4, offset=start).copy()
    data[start:end] = (tensor * 1.5).astype("<f4").tobytes()  # one middle tensor, scaled
    weights.write_bytes(bytes(data))
    after, after_stats = ensure_teacher_embeddings(texts, "control", spec, tmp_path / "cache", in_process=True)
    reliability.record(
        "teacher cache", "teacher-identity-full",
        input=f"a teacher whose {weights.stat().st_size / 2**20:.1f} MiB weight file changed only in {name} "
              f"(bytes {start}..{end}, between its first and last MiB), the teacher pass run before and after",
        did=f"the identity changed ({before_stats['teacher']} -> {after_stats['teacher']}): the changed teacher got "
            f"a cache of its own and encoded all {after_stats['misses']} sentences, reusing no vector of the old one",
        lost="nothing")
    assert after_stats["teacher"] != before_stats["teacher"]
    assert (after_stats["hits"], after_stats["teacher_forward_sentences"]) == (0, len(texts))
    assert not np.allclose(after, before, atol=1e-4)

    # Remembered: the next process (an empty in-process memo) takes the hash from the memo file, keyed by path, size
    # and mtime. Proven by changing the bytes but restoring size and mtime: the identity does not move, because the
    # file was not read (a real change of a file also changes its mtime).
    monkeypatch.setattr(teacher_module, "_SHA256_MEMO", {})
    stat = weights.stat()
    data[start:start + 4] = b"\0\0\0\0"
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert spec.identity() == after_stats["teacher"]
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert spec.identity() != after_stats["teacher"]


# ----------------------------------------------------------------------------------------------------------------
# The rows file


def test_torn_or_altered_rows_file_is_detected_reported_and_rebuilt(real_sentences, tmp_path, caplog, reliability):
    import hashlib

    import pyarrow as pa

    from raydistill.runtime.teachers.pipeline import RowsFileError, _mapped_rows, write_rows_file

    texts = list(dict.fromkeys(real_sentences))[:200]
    columns = {"idx": np.arange(len(texts)), "group": np.arange(len(texts)),
               "text_control": np.array(texts, dtype=object)}

    def intact(path: Path) -> bool:
        return hashlib.sha256(path.read_bytes()).hexdigest()[:32] == path.stem

    path = write_rows_file(columns, tmp_path)
    assert intact(path) and not list(path.parent.glob(".*"))
    good = path.read_bytes()
    torn = tmp_path / "torn-copy.arrow"
    torn.write_bytes(good[:len(good) // 2])
    with pytest.raises(RowsFileError, match=str(torn)):  # a reader names the file it cannot read
        _mapped_rows(str(torn))

    caplog.set_level(logging.WARNING, logger="raydistill.runtime.teachers.pipeline")
    outcomes = []
    for damage, damaged in (("torn", good[:len(good) // 2]),
                            ("altered", good[:len(good) // 2] + bytes([good[len(good) // 2] ^ 1]) +
                             good[len(good) // 2 + 1:])):
        path.write_bytes(damaged)
        caplog.clear()
        again = write_rows_file(columns, tmp_path)
        warnings = [r.getMessage() for r in caplog.records]
        outcomes.append((damage, again == path and intact(path), warnings))
    reliability.record(
        "teacher cache", "rows-file-verified",
        input=f"the rows file of {len(texts)} rows (<cache>/rows/<sha256>.arrow) cut to half its bytes, then one byte "
              "of it flipped (same size), and the job's write_rows_file run again each time",
        did="each time the file's hash did not match its name: it was reported with its path and rebuilt (streamed "
            "to a temporary file, fsynced, renamed); a reader of a torn rows file gets an error naming it",
        message=" / ".join(w for _, _, ws in outcomes for w in ws)[:500], lost="nothing: the rows are rebuilt")
    for damage, rebuilt, warnings in outcomes:
        assert rebuilt, f"the {damage} rows file was not rebuilt"
        assert any(str(path) in w and "damaged" in w for w in warnings), (damage, warnings)
    assert _mapped_rows(str(path)).equals(pa.ipc.open_file(pa.py_buffer(good)).read_all())
    assert not list(path.parent.glob(".*"))


# ----------------------------------------------------------------------------------------------------------------
# A full disk


@contextlib.contextmanager
def small_filesystem(directory: Path, size: str):
    """A real filesystem of ``size`` (tmpfs) mounted at ``directory``: writes past it fail with ENOSPC."""
    directory.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"a full disk needs a small filesystem, and mounting a tmpfs was refused here "
                    f"(needs root or CAP_SYS_ADMIN): {mounted.stderr.strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=False)


def resize(directory: Path, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(directory)], check=True)


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_full_disk_during_a_cache_append_ends_the_pass_clearly_and_the_rerun_resumes(
        teacher_dir, real_sentences, tmp_path, monkeypatch, reliability):
    """The job's teacher pass with its teacher in process (the appends are the driver's either way; a Ray pool
    would add two actor starts to this test)."""
    from raydistill.runtime.teachers import embedding_cache
    from raydistill.runtime.teachers.embedding_cache import _HOST, cache_row_bytes
    from raydistill.runtime.teachers.pipeline import cache_teacher_vectors

    monkeypatch.setattr(embedding_cache, "_APPEND_EVERY_ROWS", 64)  # several parts, so the disk fills mid-pass
    monkeypatch.setattr(embedding_cache, "_ROWS_PER_TEACHER_CALL", 64)
    texts = list(dict.fromkeys(real_sentences))[:512]
    with small_filesystem(tmp_path / "disk", "48k") as disk:
        cfg = job_config(teacher_dir, tmp_path, precision="fp32").with_overrides([f"cache_dir={disk}"])
        cache_dir = EmbeddingCache(disk, TeacherSpec.from_config(cfg).identity()).dir
        with pytest.raises(CacheDiskFullError) as full:
            cache_teacher_vectors(cfg, {"control": texts}, in_process=True)
        left_behind = [p.name for p in cache_dir.glob(".*")]
        kept_rows = len(EmbeddingCache(disk, cache_dir.name))
        free_then = shutil.disk_usage(disk).free

        resize(disk, "1m")  # space freed; a writer that died mid-append, and a live one, left temporary parts
        stale = cache_dir / f".part-20260101T000000-{dead_pid()}-0badc0de.npy.{_HOST}.tmp"
        live = cache_dir / f".part-20260101T000000-{os.getpid()}-0badc0de.npy.{_HOST}.tmp"
        stale.write_bytes(b"half a part"), live.write_bytes(b"a part being written")
        teacher, stats = cache_teacher_vectors(cfg, {"control": texts}, in_process=True)
        vectors = teacher["control"](texts)
        swept = not stale.exists() and live.exists()
    error = str(full.value)
    reliability.record(
        "teacher cache", "cache-disk-full",
        input=f"the job's teacher pass of {len(texts)} sentences (a part every 64) into a cache on a 48 KiB "
              "filesystem (tmpfs), which fills after a few parts; then the filesystem grown and the job run again",
        did=f"the append failed with ENOSPC; the pass ended with CacheDiskFullError naming the cache folder, the space "
            f"the rest of the pass needs and the space left; no temporary file stayed ({left_behind or 'none'}) and "
            f"the {kept_rows} rows already appended were kept; the rerun encoded only the other "
            f"{stats['teacher_forward_sentences']}, and removed a dead writer's temporary part (not a live one's)",
        message=error, lost="the rows of the part that did not fit, recomputed")
    assert str(cache_dir) in error and "out of disk space" in error and "run the job again" in error
    rest = (len(texts) - kept_rows) * cache_row_bytes(48)
    assert full.value.needed_bytes >= rest and f"needs {full.value.needed_bytes / 2**20:.2f} MiB" in error
    assert abs(full.value.free_bytes - free_then) <= 8192 and "MiB left" in error
    assert left_behind == [], left_behind
    assert 0 < kept_rows < len(texts) and kept_rows % 64 == 0
    assert (stats["hits"], stats["teacher_forward_sentences"]) == (kept_rows, len(texts) - kept_rows)
    assert np.isfinite(vectors).all() and swept


def test_preflight_sizes_the_cache_from_the_corpus_and_the_teacher_width(teacher_dir, real_sentences, tmp_path,
                                                                         reliability):
    """The space preflight asks of the cache's filesystem follows the corpus and the teacher's width (it asked
    256 MiB for every job)."""
    import json

    from raydistill.config.job import ConfigError
    from raydistill.runtime.teachers.embedding_cache import cache_row_bytes
    from raydistill.runtime.engine.preflight import preflight, teacher_cache_bytes

    pairs = tmp_path / "pairs.jsonl"
    # Numbered, so that none is an evaluation sentence (a corpus drops those) and every row counts.
    texts = [f"{sentence} (line {i})" for i, sentence in enumerate(real_sentences * 4)]
    with small_filesystem(tmp_path / "disk", "2m") as disk:
        def config(rows: int):
            pairs.write_text("".join(json.dumps({"sentence1": texts[i], "sentence2": texts[-1 - i]}) + "\n"
                                     for i in range(rows)))
            return job_config(teacher_dir, tmp_path).with_overrides([f"cache_dir={disk}"])

        small = preflight(config(400))
        small_need, _ = teacher_cache_bytes(small)
        with pytest.raises(ConfigError) as refused:
            preflight(config(3000))
    reliability.record(
        "teacher cache", "cache-disk-full",
        input="preflight of a job of 400 pairs, then of 3000, with the cache dir on a 2 MiB filesystem (a 48-wide "
              "teacher: 208 bytes a cached vector)",
        did=f"the 400-row job passed (it needs ~{small_need / 2**20:.2f} MiB); the 3000-row one was refused before "
            "anything started, naming cache_dir, the space left and the estimate (sentences x views x bytes a "
            "vector, rows file, margin)",
        message=str(refused.value), lost="nothing: refused before the teacher pass")
    assert small_need < 2 * 2**20 and small_need >= 400 * cache_row_bytes(48)
    assert "cache_dir" in str(refused.value) and str(disk) in str(refused.value)
    assert "3000 sentences x 1 teacher views x 208 bytes" in str(refused.value)


# ----------------------------------------------------------------------------------------------------------------
# The teacher pool (Ray Data): a killed actor, then a stopped pass


def part_rows(cache_dir: Path) -> tuple[int, list[bytes]]:
    """Rows in the cache's part files and their keys (rows on disk, not distinct keys: a block appended twice
    keeps the key count and doubles the rows)."""
    rows, keys = 0, []
    for part in sorted(cache_dir.glob("part-*.npy")):
        table = np.load(part, mmap_mode="r")
        rows += len(table)
        keys += [bytes(key) for key in table["key"]]
    return rows, keys


@pytest.mark.ray
def test_teacher_actor_killed_then_pass_stopped_every_row_cached_once_and_rerun_encodes_only_the_rest(
        teacher_dir, real_sentences, tmp_path, ray_session, monkeypatch, reliability):
    """The pool actor is SIGKILLed after parts have been appended (Ray Data restarts it and retries its block), then
    the pass is stopped (SIGINT) a few parts later. No row is cached twice, and the rerun encodes only the rest."""
    import signal

    from raydistill.runtime.teachers import embedding_cache
    from raydistill.runtime.teachers.pipeline import cache_teacher_vectors
    from tests.ray_fixtures import faulty_pass_batches

    rows_per_part = 64
    monkeypatch.setattr(embedding_cache, "_APPEND_EVERY_ROWS", rows_per_part)
    monkeypatch.setattr(embedding_cache, "_ROWS_PER_BLOCK", rows_per_part)
    monkeypatch.setattr(embedding_cache, "_ROWS_PER_TEACHER_CALL", rows_per_part)
    texts = list(dict.fromkeys(real_sentences))[:1200]
    cfg = job_config(teacher_dir, tmp_path, batch_size=8)
    spec = TeacherSpec.from_config(cfg)
    cache_dir = EmbeddingCache(cfg.resolved_cache_dir(), spec.identity()).dir
    seen: dict[str, int] = {}
    # The actor is killed once the driver holds two blocks (two parts appended), the driver stopped at four.
    monkeypatch.setattr(embedding_cache, "_ray_data_batches",
                        faulty_pass_batches(embedding_cache._ray_data_batches, {2: "kill", 4: "sigint"}, seen,
                                            cache_dir=cache_dir))
    # Ctrl-C raises KeyboardInterrupt even where the suite runs with SIGINT ignored (in the background, under CI).
    previous_handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            cache_teacher_vectors(cfg, {"control": texts})
    finally:
        signal.signal(signal.SIGINT, previous_handler)
    seen["parts_at_stop"] = seen.pop("parts_at_sigint", None)
    first_rows, first_keys = part_rows(cache_dir)
    # The rerun's teacher in process: the same pass and cache, without a third pool actor start in this test.
    teacher, stats = cache_teacher_vectors(cfg, {"control": texts}, in_process=True)
    rows_on_disk, keys_on_disk = part_rows(cache_dir)
    reliability.record(
        "fault", "cache-rows-once",
        input=f"the job's teacher pass of {len(texts)} sentences (1 pool actor, a cache part every {rows_per_part} "
              f"rows): SIGKILL of the TeacherEmbed pool actor mid-block after {seen.get('parts_at_kill')} part(s) "
              f"were appended, then SIGINT of the driver at {seen.get('parts_at_stop')} parts; the job run again",
        did="Ray Data restarted the pool actor and retried its block; the interrupted pass saved what had arrived "
            f"({first_rows} rows, each key once); the rerun encoded only the other "
            f"{stats['teacher_forward_sentences']} ({stats['hits']} hits), and the parts then hold {rows_on_disk} rows "
            f"for {len(texts)} sentences, each exactly once",
        lost="the killed block's and the stopped blocks' teacher work, recomputed; no vector cached twice",
        killed_pid_count=int("killed_pid" in seen))
    assert "killed_pid" in seen and seen.get("parts_at_stop") and seen["parts_at_kill"] >= 1, f"the pass ended before the faults: {seen}"
    assert 0 < first_rows < len(texts) and first_rows == len(set(first_keys))
    assert (stats["hits"], stats["misses"], stats["teacher_forward_sentences"]) == (
        first_rows, len(texts) - first_rows, len(texts) - first_rows)
    assert rows_on_disk == len(set(keys_on_disk)) == len(texts)
    np.testing.assert_allclose(teacher["control"](texts), TeacherEncoder(**spec.encoder_kwargs()).encode(texts),
                               atol=1e-5)
