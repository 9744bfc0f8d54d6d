"""Teacher embeddings through Ray Data with a real (tiny) teacher, the embedding cache, and the training-data stream.

Ray tests share one local Ray (tests/ray_fixtures.py). The teacher-pass counts below are rows counted by a forward hook
inside the teacher's transformer, in the Ray Data actor that ran it; they are not derived from the cache's bookkeeping.
A pool actor killed mid-pass must leave those counts exact: the retried block is counted and cached once.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from raydistill.config.job import RoleResources
from raydistill.runtime.teachers.embedding_cache import EmbeddingCache, ensure_teacher_embeddings
from raydistill.runtime.teachers.teacher import TeacherEncoder, TeacherSpec, teacher_identity
from tests.ray_fixtures import ray_session  # noqa: F401  (session-scoped fixture)

pytest_plugins = ["tests.reliability_log"]


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory):
    return tmp_path_factory.mktemp("embeddings")


@pytest.fixture(scope="module")
def teacher_spec(tiny_models):
    # fp32: these tests compare the pass's vectors with one in-process encode at 1e-5. In bf16 (``auto`` on a CPU
    # with AVX512-BF16) a row's vector depends on the batch it was padded into, by ~1e-3.
    return TeacherSpec(model=str(tiny_models["bert"]), max_length=32,
                       resources=RoleResources(num_actors=1, num_cpus=1, threads=1, batch_size=64, precision="fp32"))


@pytest.fixture(scope="module")
def in_process_teacher(teacher_spec):
    return TeacherEncoder(**teacher_spec.encoder_kwargs())


@pytest.mark.ray
def test_teacher_pass_runs_once_then_only_on_misses(ray_session, teacher_spec, in_process_teacher, real_sentences,
                                                    cache_root, monkeypatch):
    from raydistill.runtime.teachers import embedding_cache

    monkeypatch.setattr(embedding_cache, "_APPEND_EVERY_ROWS", 64)  # save as blocks stream in, not only at the end
    monkeypatch.setattr(embedding_cache, "_ROWS_PER_TEACHER_CALL", 64)  # several teacher calls, each saved
    texts = real_sentences[:240]
    # Duplicates and a shuffled order: rows must come back in input order, each unique sentence encoded once.
    order = np.random.default_rng(0).permutation(len(texts))
    requested = [texts[i] for i in order] + texts[:16]
    first, stats = ensure_teacher_embeddings(requested, "a", teacher_spec, cache_root)
    assert (stats["hits"], stats["misses"], stats["teacher_forward_sentences"]) == (0, 240, 240)
    assert first.shape == (256, in_process_teacher.dim) and first.dtype == np.float32
    assert len(list((cache_root / teacher_spec.identity()).glob("part-*.npy"))) >= 2
    expected = in_process_teacher.encode(requested)
    np.testing.assert_allclose(first, expected, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(first, axis=1), 1.0, atol=1e-5)  # the cache stores normalised rows

    # Second epoch / second run: every sentence is cached, the teacher does no forward pass at all.
    again, stats = ensure_teacher_embeddings(texts, "a", teacher_spec, cache_root)
    assert (stats["hits"], stats["misses"], stats["teacher_forward_sentences"]) == (240, 0, 0)
    np.testing.assert_array_equal(again, first[np.argsort(order)])

    # Partly cached: only the 40 new sentences go through the teacher.
    new = real_sentences[240:280]
    mixed = new[:20] + texts[100:150] + new[20:]
    partial, stats = ensure_teacher_embeddings(mixed, "b", teacher_spec, cache_root)
    assert (stats["hits"], stats["misses"], stats["teacher_forward_sentences"]) == (50, 40, 40)
    np.testing.assert_allclose(partial, in_process_teacher.encode(mixed), atol=1e-5)

    # A fresh cache object (another process) reads the same rows back from the Parquet parts.
    reopened = EmbeddingCache(cache_root, teacher_spec.identity())
    hit, rows = reopened.lookup(mixed)
    assert hit.all() and len(reopened) == 280
    np.testing.assert_array_equal(rows, partial)


@pytest.mark.ray
def test_a_killed_pool_actor_is_retried_and_every_sentence_goes_through_the_teacher_once(
        ray_session, teacher_spec, in_process_teacher, real_sentences, tmp_path, monkeypatch, reliability):
    """The teacher pool's actor SIGKILLed mid-pass, once a cache part is written: Ray Data restarts the actor and
    retries its block, and the pass ends with every vector, each sentence counted once by the teacher's forward hook
    (misses = teacher forwards = N) and appended to the cache once."""
    from raydistill.runtime.teachers import embedding_cache
    from tests.ray_fixtures import faulty_pass_batches
    from tests.test_teacher_cache_safety import part_rows

    rows_per_part = 64  # many blocks, parts and teacher calls, so the kill lands mid-pass
    for name in ("_APPEND_EVERY_ROWS", "_ROWS_PER_BLOCK", "_ROWS_PER_TEACHER_CALL"):
        monkeypatch.setattr(embedding_cache, name, rows_per_part)
    texts = list(dict.fromkeys(real_sentences))[:1200]
    # Batches of 8: a block takes long enough to be caught running.
    spec = TeacherSpec(model=teacher_spec.model, max_length=32,
                       resources=RoleResources(num_actors=1, num_cpus=1, threads=1, batch_size=8, precision="fp32"))
    cache_dir = tmp_path / spec.identity()
    seen: dict[str, int] = {}
    # The kill lands once the driver holds two blocks, so the first cache part is written; 17 blocks remain.
    monkeypatch.setattr(embedding_cache, "_ray_data_batches",
                        faulty_pass_batches(embedding_cache._ray_data_batches, {2: "kill"}, seen))
    embeddings, stats = ensure_teacher_embeddings(texts, "control", spec, tmp_path)
    assert "killed_pid" in seen, "the pool actor was never killed (the pass ended first)"
    assert "restarted_pid" in seen, "no other pool actor embedded a block after the kill"
    assert (stats["hits"], stats["misses"], stats["teacher_forward_sentences"]) == (0, len(texts), len(texts))
    np.testing.assert_allclose(embeddings, in_process_teacher.encode(texts), atol=1e-5)
    # Rows on disk, not distinct keys: a retried block appended twice would keep the key count and double the rows.
    rows_on_disk, keys_on_disk = part_rows(cache_dir)
    assert rows_on_disk == len(set(keys_on_disk)) == len(texts)
    reliability.record(
        "fault", "teacher pool actor killed mid-pass",
        input=f"SIGKILL of the Ray Data TeacherEmbed pool actor while it embedded a block, once a cache part was "
              f"written ({len(texts)} sentences, 1 pool actor, blocks of {rows_per_part} rows, batches of 8)",
        did="Ray Data restarted the pool actor and retried the block; the pass returned every vector, equal to an "
            f"in-process teacher's, with {stats['misses']} misses and {stats['teacher_forward_sentences']} sentences "
            f"counted through the teacher, and the cache's parts hold {rows_on_disk} rows, each sentence once",
        lost="the killed block's teacher work, recomputed; no vector lost, counted or cached twice",
        killed_pid_count=1)


def test_a_pool_actors_teacher_embeds_a_batch_like_the_in_process_teacher(teacher_spec, in_process_teacher,
                                                                          real_sentences):
    """TeacherEmbed is what each actor of the teacher pass's Ray Data pool runs on its batches (the pass itself is
    tested above): it keeps every row's idx, returns the in-process teacher's vectors, and reports the rows that went
    through the transformer once, on the batch's first row, so that the column sums to the pool's work."""
    from raydistill.runtime.teachers.teacher import TeacherEmbed

    embed = TeacherEmbed(**teacher_spec.encoder_kwargs())
    texts = real_sentences[300:340]
    idx = np.arange(139, 99, -1, dtype=np.int64)
    out = embed({"idx": idx, "text": np.asarray(texts, dtype=object)})
    np.testing.assert_array_equal(out["idx"], idx)
    np.testing.assert_allclose(out["embedding"], in_process_teacher.encode(texts), atol=1e-5)
    assert out["teacher_forward_rows"].tolist() == [40] + [0] * 39
    again = embed({"idx": idx[:3], "text": np.asarray(texts[:3], dtype=object)})
    assert again["teacher_forward_rows"].tolist() == [3, 0, 0]  # this batch's rows, not the actor's running total


def test_a_training_pass_caches_every_vector_and_batches_read_them_back(teacher_spec, in_process_teacher,
                                                                        real_sentences, tmp_path, capsys):
    """return_vectors=False gathers no vector (a job's batches read theirs from the cache); TeacherVectors gives
    each batch its rows' vectors and refuses, naming the cache, a sentence that has none. The pass prints its own
    progress lines (what it encodes, then done of total); a pass with nothing to encode prints none."""
    from raydistill.runtime.teachers.embedding_cache import TeacherVectors

    texts = real_sentences[:48]
    nothing, stats = ensure_teacher_embeddings(texts, "a", teacher_spec, tmp_path, in_process=True,
                                               return_vectors=False)
    assert nothing is None and (stats["hits"], stats["misses"]) == (0, 48)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[teacher]")]
    assert lines[0].endswith(": 48 sentences to encode") and "view a" in lines[0]
    assert "48/48 sentences (" in lines[-1] and "left" not in lines[-1]
    nothing, stats = ensure_teacher_embeddings(texts, "a", teacher_spec, tmp_path, in_process=True,
                                               return_vectors=False)
    assert nothing is None and (stats["hits"], stats["misses"], stats["teacher_forward_sentences"]) == (48, 0, 0)
    assert "[teacher]" not in capsys.readouterr().out

    vectors = TeacherVectors(tmp_path, teacher_spec.identity())
    batch = [texts[7], texts[3], texts[40]]
    np.testing.assert_allclose(vectors(batch), in_process_teacher.encode(batch), atol=1e-5)
    assert vectors.dim == in_process_teacher.dim
    with pytest.raises(RuntimeError, match=rf"embedding cache {tmp_path}.*1 of 2 sentences of this batch have no"):
        vectors([texts[0], "a sentence the teacher never saw"])


def test_cache_is_keyed_by_teacher_identity(tiny_models, tmp_path, real_sentences, in_process_teacher):
    bert = str(tiny_models["bert"])
    base = teacher_identity(bert, max_length=32)
    assert base == in_process_teacher.identity() == teacher_identity(bert, max_length=32)  # stable
    assert teacher_identity(str(tiny_models["roberta"]), max_length=32) != base
    assert teacher_identity(bert, max_length=64) != base
    assert teacher_identity(bert, pooling="cls", max_length=32) != base
    assert teacher_identity(bert, encoder="cross", max_length=32) != base
    # The same files elsewhere are the same teacher; one changed weight byte is another teacher.
    copy = shutil.copytree(tiny_models["bert"], tmp_path / "copy")
    assert teacher_identity(str(copy), max_length=32) == base
    weights = next(p for p in copy.iterdir() if p.suffix in (".safetensors", ".bin"))
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert teacher_identity(str(copy), max_length=32) != base

    texts = real_sentences[:5]
    bert_cache = EmbeddingCache(tmp_path / "emb", base)
    bert_cache.append(texts, in_process_teacher.encode(texts), view="a")
    assert bert_cache.lookup(texts)[0].all()
    other = EmbeddingCache(tmp_path / "emb", teacher_identity(str(tiny_models["roberta"]), max_length=32))
    hit, rows = other.lookup(texts)
    assert not hit.any() and other.stats["misses"] == 5


def test_cache_rejects_mismatched_rows(tmp_path):
    cache = EmbeddingCache(tmp_path, "bi-test")
    cache.append(["a", "b"], np.ones((2, 4), dtype=np.float32))
    with pytest.raises(ValueError, match="embedding dim 3 != cached dim 4"):
        cache.append(["c"], np.ones((1, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="2 texts but embeddings of shape"):
        cache.append(["c", "d"], np.ones((3, 4), dtype=np.float32))


# ---------------------------------------------------------------------------------------------------------------
# Training texts, views and the batch stream

from raydistill.config.job import DataConfig, JobConfig  # noqa: E402
from raydistill.runtime.teachers.pipeline import TrainingData, build_training_data, load_training_texts  # noqa: E402


def test_training_texts_and_views_are_deterministic():
    data_cfg = DataConfig(corpus="flickr", max_sentences=300, views={"control": "none", "generalize": "caption"})
    rows = load_training_texts(data_cfg, seed=7)
    assert rows == load_training_texts(data_cfg, seed=7)
    other_seed = load_training_texts(data_cfg, seed=8)
    assert [r["text_control"] for r in rows] != [r["text_control"] for r in other_seed]  # another sample
    assert len(rows) == 300 and [r["idx"] for r in rows] == list(range(300))
    assert len({r["text_control"] for r in rows}) == 300  # de-duplicated

    from raydistill.data import load_dataset

    image_of = {}
    for group in load_dataset("flickr_captions"):
        for caption in group.captions:
            image_of.setdefault(caption, set()).add(group.image)
    for row in rows:  # "caption": another caption of the same image, never the sentence itself
        assert row["text_generalize"] != row["text_control"]
        assert image_of[row["text_generalize"]] & image_of[row["text_control"]]


def test_rows_carry_their_caption_group_and_singletons_an_id_of_their_own():
    rows = load_training_texts(DataConfig(corpus="flickr+nli", max_sentences=None, views={"a": "none"}), seed=0)
    from raydistill.data import load_dataset

    image_of = {}
    for image, group in enumerate(load_dataset("flickr_captions")):
        for caption in group.captions:
            image_of.setdefault(caption, image)
    by_group: dict[int, list[str]] = {}
    for row in rows:
        by_group.setdefault(row["group"], []).append(row["text_a"])
    captions = [r for r in rows if r["text_a"] in image_of]
    assert all(r["group"] == image_of[r["text_a"]] for r in captions)  # a caption's group is its image
    assert max(len(texts) for texts in by_group.values()) > 1  # siblings share one
    others = [r for r in rows if r["text_a"] not in image_of]
    assert others and len({r["group"] for r in others}) == len(others)  # the rest: one id each
    assert not {r["group"] for r in others} & {r["group"] for r in captions}


def test_caption_view_without_caption_groups_is_refused_naming_the_view():
    with pytest.raises(ValueError, match=r"data\.views\.generalize: 'caption'.*no caption groups"):
        load_training_texts(DataConfig(corpus="nli", max_sentences=50,
                                       views={"control": "none", "generalize": "caption"}), seed=0)


def test_augmented_views_are_deterministic_per_view():
    data_cfg = DataConfig(corpus="nli", max_sentences=200, views={"a": "none", "b": "delete:0.3", "c": "delete:0.3"})
    rows = load_training_texts(data_cfg, seed=11)
    assert rows == load_training_texts(data_cfg, seed=11)
    changed_b = sum(r["text_b"] != r["text_a"] for r in rows)
    assert changed_b > 100  # a deletion rate of 0.3 edits almost every sentence
    assert sum(r["text_b"] != r["text_c"] for r in rows) > 100  # same spec, another view: other deletions
    import re

    for row in rows:  # a deletion view keeps a subsequence of the sentence's words
        remaining = iter(re.findall(r"\w+", row["text_a"]))
        assert all(word in remaining for word in re.findall(r"\w+", row["text_b"]))


def test_pairs_file_corpus_keeps_pairs(tmp_path):
    import json

    path = tmp_path / "pairs.jsonl"
    pairs = [("a man rides a grey horse", "a person is on a horse"), ("two dogs play", "dogs are playing"),
             ("a man rides a grey horse", "someone rides an animal")]
    path.write_text("".join(json.dumps({"sentence1": a, "sentence2": b}) + "\n" for a, b in pairs))
    rows = load_training_texts(DataConfig(corpus=f"file:{path}", max_sentences=None,
                                          views={"a": "none", "b": "pair"}), seed=0)
    assert [(r["text_a"], r["text_b"]) for r in rows] == pairs


def _iterate_epoch(data: TrainingData, epoch: int, batch_size: int, skip: int = 0, drop_last: bool = True):
    return [batch for batch in data.iter_batches(epoch, batch_size, skip_batches=skip, drop_last=drop_last)]


@pytest.mark.ray
def test_training_data_stream_is_deterministic_and_resumable(ray_session, tmp_path, tiny_models, real_sentences,
                                                            cache_root):
    # Building the data is a "second run": the teacher vectors of these sentences are cached already (by the first
    # test of this module, or here when this test runs alone).
    sentences = real_sentences[:240]
    corpus = tmp_path / "sentences.txt"
    corpus.write_text("\n".join(sentences) + "\n")
    teacher = TeacherEncoder(model=str(tiny_models["bert"]), max_length=32, precision="fp32")  # exact: see teacher_spec
    cache = EmbeddingCache(cache_root, teacher.identity())
    missing = [t for t, hit in zip(sentences, cache.lookup(sentences)[0]) if not hit]
    cache.append(missing, teacher.encode(missing), view="control")
    cfg = JobConfig.from_dict({
        "method": "congen", "student": str(tiny_models["bert"]), "teacher": str(tiny_models["bert"]),
        "cache_dir": str(cache_root), "seed": 3,
        "data": {"corpus": f"file:{corpus}", "max_sentences": 200, "views": {"control": "none", "generalize": "none"},
                 "teacher_views": ["control"], "teacher_max_length": 32},
        "resources": {"teacher": {"batch_size": 64, "precision": "fp32"}},
    })
    data = build_training_data(cfg)
    assert data.num_rows == 200 and data.teacher_dim == 32
    assert (data.cache_stats["hits"], data.cache_stats["misses"], data.cache_stats["teacher_forward_sentences"]) \
        == (200, 0, 0)
    # The rows live in their memory-mapped rows file under the cache dir, named by content; the teacher's vectors
    # are no column of it: each batch reads its own rows' vectors from the memory-mapped cache.
    rows_file = Path(data.rows_path)
    assert rows_file.parent == cache_root / "rows" and rows_file.suffix == ".arrow"
    assert data.column_names == ["idx", "group", "text_control", "text_generalize"]
    assert build_training_data(cfg).rows_path == data.rows_path  # the same rows: the same file, written once

    epoch0 = _iterate_epoch(data, 0, 32)
    assert len(epoch0) == data.num_batches(32) == 6  # 200 // 32, last partial batch dropped
    assert [b["idx"].tolist() for b in epoch0] == [b["idx"].tolist() for b in _iterate_epoch(data, 0, 32)]
    assert [b["idx"].tolist() for b in epoch0] != [b["idx"].tolist() for b in _iterate_epoch(data, 1, 32)]
    # Resume: skipping k batches yields exactly the batches k, k+1, ... of the same epoch.
    resumed = _iterate_epoch(data, 0, 32, skip=4)
    assert [b["idx"].tolist() for b in resumed] == [b["idx"].tolist() for b in epoch0[4:]]
    everything = np.concatenate([b["idx"] for b in _iterate_epoch(data, 2, 32, drop_last=False)])
    assert sorted(everything.tolist()) == list(range(200))  # each row once per epoch

    batch = epoch0[0]
    assert batch["text_control"].dtype == object and batch["teacher_control"].shape == (32, 32)
    texts = list(batch["text_control"])
    expected = teacher.encode(texts)
    np.testing.assert_allclose(batch["teacher_control"], expected, atol=1e-5)  # rows joined to the right text

    # A copy sent to another process (a Tune trial's Train worker) carries the locations, not the rows, and reads
    # the same batches.
    import pickle

    pickled = pickle.dumps(data)
    assert len(pickled) < 2000  # the 200 rows' texts alone are ~10 kB, their vectors 25 kB
    clone = pickle.loads(pickled)
    assert [b["idx"].tolist() for b in _iterate_epoch(clone, 0, 32)] == [b["idx"].tolist() for b in epoch0]
    np.testing.assert_array_equal(_iterate_epoch(clone, 0, 32)[0]["teacher_control"], batch["teacher_control"])
    assert list(_iterate_epoch(clone, 0, 32)[0]["text_control"]) == texts

    # The Ray Data stream of epochs 1..2 (what Train workers read): Data's tasks read the rows file; in order, its
    # batches are iter_batches' batches of each epoch, the partial last batch of an epoch left out.
    stream = data.epoch_stream(1, 3, rows_per_epoch=6 * 32)
    streamed = list(stream.iter_batches(batch_size=32, batch_format="numpy"))
    expected = _iterate_epoch(data, 1, 32) + _iterate_epoch(data, 2, 32)
    assert [(int(b["epoch"][0]), int(b["position"][0])) for b in streamed] == \
        [(ep, 32 * b) for ep in (1, 2) for b in range(6)]
    assert [b["idx"].tolist() for b in streamed] == [b["idx"].tolist() for b in expected]
    assert [list(b["text_generalize"]) for b in streamed] == [list(b["text_generalize"]) for b in expected]

    # Train's local mode (the learner in this process) streams the rows through Ray Data too, and trains on exactly
    # the batches of the seeded order.
    import zlib

    from raydistill.methods import get_method
    from raydistill.runtime.engine.learner_group import LearnerGroup
    from raydistill.runtime.engine.preflight import preflight

    local = preflight(cfg.with_overrides([f"run_dir={tmp_path / 'run'}", "train.batch_size=32", "train.epochs=1",
                                          "train.eval_every=100", "loss.queue_size=64", "tracking.enabled=false",
                                          "resources.learner.num_learners=0", "resources.learner.threads=1"]))
    summary = LearnerGroup(local, get_method("congen"), run_dir=tmp_path / "run", teacher_dim=32).fit(data)
    trained = [row["batch_crc32"] for row in summary["history"] if "batch_crc32" in row]
    assert trained == [zlib.crc32(np.ascontiguousarray(b["idx"], dtype=np.int64).tobytes()) for b in epoch0]


@pytest.mark.ray
def test_init_ray_joins_the_running_ray_and_keeps_data_off_actor_cpus(ray_session, monkeypatch):
    import ray
    from ray.data import DataContext

    from raydistill.runtime.engine.cluster import check_resources, init_ray

    cfg = JobConfig.from_dict({"method": "congen", "student": "bert-tiny",
                               "resources": {"num_cpus": 64, "learner": {"num_learners": 2, "num_cpus": 0.5}}})
    options = DataContext.get_current().execution_options
    before = options.resource_limits
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("RAYDISTILL_NO_PROGRESS", raising=False)
    monkeypatch.setattr(DataContext.get_current(), "enable_progress_bars", True)
    try:
        init_ray(cfg)  # already initialised: joins it, does not start a 64-CPU Ray
        # pytest's stdout is no terminal: Ray Data's ten-second log blocks are off, the jobs print their own lines,
        # and Ray Data's advice to turn the bars back on is not shown (its other messages are)
        assert DataContext.get_current().enable_progress_bars is False
        import logging

        progress_logger = logging.getLogger("ray.data._internal.progress")

        def record(message: str) -> logging.LogRecord:
            return logging.LogRecord(progress_logger.name, logging.WARNING, __file__, 1, message, None, None)

        assert not progress_logger.filter(record("Progress bars disabled. To enable, set `ray.data...`."))
        assert progress_logger.filter(record("Progress bars for operators disabled."))
        assert ray.cluster_resources()["CPU"] == 2
        # Ray Data plans with what the actors leave: 2 CPUs less the learners' 2 x 0.5
        assert DataContext.get_current().execution_options.resource_limits.cpu == 1.0
        check_resources(cfg)  # 2 x 0.5 learner CPUs + 0.5 for Ray Data fit in 2

        # The teacher pass runs before the learners exist: its dataset may plan the pool on the reserved CPUs.
        from ray.data import ExecutionResources

        from raydistill.runtime.teachers.embedding_cache import _leave_room_for_the_pool

        options.resource_limits = ExecutionResources.for_limits(cpu=0.0)
        teacher_pass = ray.data.from_items([{"idx": 0, "text": "a"}])
        _leave_room_for_the_pool(teacher_pass, pool_cpus=1.0, pool_gpus=0.0)
        assert teacher_pass.context.execution_options.resource_limits.cpu == 1.0
        assert options.resource_limits.cpu == 0.0  # the global setting is untouched
    finally:
        options.resource_limits = before


@pytest.mark.ray
def test_a_local_ray_with_the_dashboard_tells_its_processes_where_it_is(ray_session):
    """The tests' Ray starts as ``raydistill tune`` starts one (``start_local_ray(dashboard=True)``): its processes
    find it through ``RAY_ADDRESS`` and its state API answers them, which is how Ray Train's placement-group cleaner
    learns that a stopped trial's controller died; this process's own environment is as it was."""
    import ray

    @ray.remote(num_cpus=0)
    def where_and_state(actor_id: str) -> tuple[str, bool]:
        from ray.util.state import get_actor

        return os.environ.get("RAY_ADDRESS", ""), get_actor(actor_id, timeout=30).state == "ALIVE"

    @ray.remote(num_cpus=0)
    class Alive:
        def ping(self) -> bool:
            return True

    alive = Alive.remote()
    assert ray.get(alive.ping.remote())
    address, found_alive = ray.get(where_and_state.remote(alive._actor_id.hex()))
    assert address == ray.get_runtime_context().gcs_address and found_alive
    assert "RAY_ADDRESS" not in os.environ and "RAY_GCS_SERVER_PORT" not in os.environ
    ray.kill(alive)


@pytest.mark.ray
def test_teacher_pass_job_fills_the_cache_once_and_trains_nothing(ray_session, tiny_models, tmp_path, capsys):
    """raydistill run teacher_pass: the config's corpus through the teacher; a second run finds every sentence."""
    from raydistill.runtime.entry import run_job

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"sentence number {i} about a dog\n" for i in range(40)))
    argv = ["--config", "congen", "--set", f"student={tiny_models['bert']}", "--set", f"teacher={tiny_models['bert']}",
            "--set", f"data.corpus=file:{corpus}", "--set", "data.max_sentences=null",
            "--set", "data.views={control: none, generalize: 'delete:0.1'}", "--set", f"cache_dir={tmp_path / 'cache'}",
            "--set", f"run_dir={tmp_path / 'run'}", "--set", "resources.teacher.threads=1",
            "--set", "student_projection_init=default"]
    first = run_job("teacher_pass", argv)
    assert (first["rows"], first["misses"], first["hits"], first["teacher_forward_sentences"]) == (40, 40, 0, 40)
    again = run_job("teacher_pass", argv)
    assert (again["misses"], again["hits"], again["teacher_forward_sentences"]) == (0, 40, 0)
    assert '"misses": 0' in capsys.readouterr().out
    assert not (tmp_path / "run").exists()  # nothing trained


def test_scattered_lookups_leave_the_cache_out_of_the_resident_set(tmp_path):
    """Indexing a part and reading rows scattered over it keep its pages out of this process's resident set (they
    stay in the page cache): a job holds the index and its batches' rows, not the memory-mapped vectors."""
    import psutil

    rows, dim = 20_000, 768  # 60 MB of vectors in two parts
    texts = [f"sentence {i}" for i in range(rows)]
    vectors = np.random.default_rng(0).standard_normal((rows, dim)).astype(np.float32)
    writer = EmbeddingCache(tmp_path, "teacher")
    writer.append(texts[:rows // 2], vectors[:rows // 2])
    writer.append(texts[rows // 2:], vectors[rows // 2:])
    del writer
    process = psutil.Process()
    before = process.memory_info().rss
    cache = EmbeddingCache(tmp_path, "teacher")
    picked = np.random.default_rng(1).choice(rows, size=2_000, replace=False)
    hit, found = cache.lookup([texts[i] for i in picked])
    grown = process.memory_info().rss - before
    assert hit.all()
    np.testing.assert_array_equal(found, vectors[picked])
    assert grown < vectors.nbytes / 3, f"resident set grew by {grown / 2**20:.0f} MB for a 60 MB cache"
