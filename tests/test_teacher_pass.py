"""The teacher pass: precision choice, token-budget batches, a memory-mapped cache that resumes an interrupted pass.

These run in process (``ensure_teacher_embeddings(..., in_process=True)``) with a tiny teacher; the Ray Data pool is
covered by tests/test_runtime_data.py and tests/test_teacher_cache_safety.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from raydistill.runtime.teachers import embedding_cache
from raydistill.config.job import RoleResources
from raydistill.runtime.teachers.embedding_cache import EmbeddingCache, ensure_teacher_embeddings
from raydistill.runtime.teachers.teacher import TeacherEncoder, TeacherSpec, resolve_precision, token_batches


@pytest.fixture(scope="module")
def spec(tiny_models):
    # fp32 pinned: the comparisons below are exact to 1e-5, which bf16 (auto on a bf16 CPU) is not.
    return TeacherSpec(model=str(tiny_models["bert"]), max_length=32,
                       resources=RoleResources(threads=1, batch_size=64, max_tokens=256, precision="fp32"))


@pytest.fixture(scope="module")
def sentences(real_sentences):
    return list(dict.fromkeys(real_sentences))[:300]


def test_token_batches_respect_the_budget_and_cover_every_input_once():
    lengths = [5, 30, 12, 12, 7, 30, 3, 18, 9, 25] * 7
    batches = token_batches(lengths, max_tokens=64, max_sentences=6)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    for batch in batches:
        longest = max(lengths[i] for i in batch)
        assert len(batch) <= 6 and (len(batch) * longest <= 64 or len(batch) == 1)
        assert lengths[batch[0]] == longest  # sorted: the first is the longest, so padding is to it
    # Sorted by length, a batch pads only to its own longest: far less padding than input-order batches of 6.
    padded = sum(len(b) * max(lengths[i] for i in b) for b in batches)
    unsorted = sum(len(lengths[s:s + 6]) * max(lengths[s:s + 6]) for s in range(0, len(lengths), 6))
    assert padded < 0.8 * unsorted


def test_precision_auto_follows_the_hardware_and_says_why(monkeypatch):
    from raydistill.runtime.teachers import teacher

    monkeypatch.setattr(teacher, "bf16_support", lambda: (False, "no AVX512-BF16 or AMX"))
    assert resolve_precision("auto") == ("fp32", "no AVX512-BF16 or AMX")
    assert resolve_precision("fp32")[0] == "fp32"
    assert resolve_precision("bf16")[0] == "bf16"  # asked for explicitly: kept (with a warning)
    monkeypatch.setattr(teacher, "bf16_support", lambda: (True, "torch reports avx512_bf16"))
    assert resolve_precision("auto") == ("bf16", "torch reports avx512_bf16")
    assert resolve_precision("auto", "cuda")[0] == "bf16"
    with pytest.raises(ValueError, match="one of auto, fp32, bf16"):
        resolve_precision("fp16")


def test_bf16_teacher_is_close_to_fp32_and_cached_apart(spec, sentences):
    texts = sentences[:48]
    fp32 = TeacherEncoder(**spec.encoder_kwargs()).encode(texts)
    bf16_kwargs = {**spec.encoder_kwargs(), "precision": "bf16"}
    bf16 = TeacherEncoder(**bf16_kwargs).encode(texts)
    assert bf16.dtype == np.float32
    cosine = np.sum(fp32 * bf16, axis=1)  # both L2-normalised
    assert cosine.mean() > 0.99, cosine.mean()
    bf16_spec = TeacherSpec(model=spec.model, max_length=spec.max_length,
                            resources=RoleResources(precision="bf16"))
    assert bf16_spec.identity() != spec.identity()
    auto_on_fp32 = TeacherSpec(model=spec.model, max_length=spec.max_length, resources=RoleResources())
    if auto_on_fp32.precision()[0] == "fp32":  # caches written before the precision setting keep their identity
        assert auto_on_fp32.identity() == spec.identity()


def test_bucketed_encode_matches_one_padded_batch(spec, sentences, tiny_models):
    from raydistill.models import BiEncoder

    texts = sentences[:100]
    ours = TeacherEncoder(**spec.encoder_kwargs()).encode(texts)
    reference = BiEncoder.from_pretrained(str(tiny_models["bert"]), max_length=32).encode(
        texts, batch_size=len(texts), normalize=True)
    np.testing.assert_allclose(ours, reference, atol=1e-5)


def test_interrupted_pass_resumes_with_only_the_rest(spec, sentences, tmp_path, monkeypatch):
    """A pass stopped after 3 of 5 chunks keeps them; the rerun sends only the other 2 through the teacher."""
    monkeypatch.setattr(embedding_cache, "_ROWS_PER_TEACHER_CALL", 60)
    monkeypatch.setattr(embedding_cache, "_APPEND_EVERY_ROWS", 60)
    calls = {"n": 0}
    real_encode = TeacherEncoder.encode

    def encode_then_die(self, texts):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt  # the job is stopped while the 4th chunk is in the teacher
        return real_encode(self, texts)

    monkeypatch.setattr(TeacherEncoder, "encode", encode_then_die)
    with pytest.raises(KeyboardInterrupt):
        ensure_teacher_embeddings(sentences, "a", spec, tmp_path, in_process=True)
    cache = EmbeddingCache(tmp_path, spec.identity())
    assert len(cache) == 180 and len(list(cache.dir.glob("part-*.npy"))) == 3

    monkeypatch.setattr(TeacherEncoder, "encode", real_encode)
    resumed, stats = ensure_teacher_embeddings(sentences, "a", spec, tmp_path, in_process=True)
    assert (stats["hits"], stats["misses"], stats["teacher_forward_sentences"]) == (180, 120, 120)
    np.testing.assert_allclose(resumed, TeacherEncoder(**spec.encoder_kwargs()).encode(sentences), atol=1e-5)
    again, stats = ensure_teacher_embeddings(sentences, "a", spec, tmp_path, in_process=True)
    assert stats["teacher_forward_sentences"] == 0
    np.testing.assert_array_equal(again, resumed)


def test_cache_reads_parts_as_memory_maps_without_concatenating(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    writer = EmbeddingCache(tmp_path, "bi-test")
    texts = [f"sentence {i}" for i in range(400)]
    vectors = rng.standard_normal((400, 8)).astype(np.float32)
    for start in range(0, 400, 10):  # 40 parts
        writer.append(texts[start:start + 10], vectors[start:start + 10])

    def no_concatenate(*args, **kwargs):
        raise AssertionError("the cache concatenated arrays while loading or looking up")

    reader = EmbeddingCache(tmp_path, "bi-test")
    monkeypatch.setattr(np, "concatenate", no_concatenate)
    monkeypatch.setattr(np, "vstack", no_concatenate)
    order = rng.permutation(400)
    asked = [texts[i] for i in order] + ["not cached"]
    hit, rows = reader.lookup(asked)
    assert len(reader) == 400 and reader.dim == 8
    assert len(reader._parts) == 40 and all(isinstance(part, np.memmap) for part in reader._parts)
    assert hit[:-1].all() and not hit[-1]
    np.testing.assert_array_equal(rows[:-1], vectors[order])
    np.testing.assert_array_equal(rows[-1], 0)


def test_old_parquet_parts_are_still_read(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from raydistill.runtime.teachers.embedding_cache import text_hash

    directory = tmp_path / "bi-old"
    directory.mkdir()
    vectors = np.arange(12, dtype=np.float32).reshape(3, 4)
    texts = ["a", "b", "c"]
    pq.write_table(pa.table({
        "text_hash": pa.array([text_hash(t) for t in texts], type=pa.binary(16)),
        "view": pa.array(["x"] * 3),
        "embedding": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1), type=pa.float32()), 4),
    }), directory / "part-20260101T000000-1-abcdef12.parquet")
    cache = EmbeddingCache(tmp_path, "bi-old")
    cache.append(["d"], np.full((1, 4), 7, dtype=np.float32))
    hit, rows = EmbeddingCache(tmp_path, "bi-old").lookup(["c", "d", "a"])
    assert hit.all()
    np.testing.assert_array_equal(rows, np.stack([vectors[2], np.full(4, 7, np.float32), vectors[0]]))
