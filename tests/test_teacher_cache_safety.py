"""A damaged teacher-embedding cache is detected, warned about and recomputed, never trained on: a truncated part,
a part of another vector width and a part holding NaN vectors, each in a cache of otherwise good parts."""

from __future__ import annotations

import logging

import numpy as np

from raydistill.runtime.config import RoleResources
from raydistill.runtime.embedding_cache import EmbeddingCache, ensure_teacher_embeddings
from raydistill.runtime.teacher import TeacherEncoder, TeacherSpec
from tests.distill_fixtures import teacher_dir  # noqa: F401 - fixture

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

    caplog.set_level(logging.WARNING, logger="raydistill.runtime.embedding_cache")
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
