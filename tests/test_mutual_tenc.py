"""Trans-Encoder self-/mutual distillation job: config, pair sets, label sets read by the learners, and real
two-family runs under Ray.

The runs use the tiny random BERT and MPNet checkpoints of conftest (two families of different architectures),
a few dozen real pairs and a few optimiser steps per stage. They are the session's shared runs (tests/tenc_runs.py):
the mutual run and the self-distillation run that was stopped after its first stage and resumed. Every check
recomputes what the job claims from the saved models and the Parquet it wrote.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from raydistill.runtime.engine.cluster import ResourceError, check_resources
from raydistill.config.job import ConfigError
from raydistill.runtime.tenc.pairs import build_pair_set
from raydistill.runtime.tenc import (
    TencConfig,
    read_label_set,
    stage_key,
)
from raydistill.runtime.tenc.labels import write_label_set
from raydistill.runtime.tenc.learners import (
    BiEncoderLearner,
    SymmetricCrossScorer,
    encoder_fingerprint,
    labels_digest,
    stage_seed,
)
import tests.tenc_runs as tenc_runs
from tests.tenc_runs import MUTUAL_PAIRS, mutual_config, tiny_config

from tests.ray_fixtures import ray_session  # noqa: F401,E402 - the session's Ray
# The shared runs, fixtures here too; other test files take the mutual run and the configs (tiny_config,
# mutual_config) from here.
mutual_run = tenc_runs.mutual_run
self_qqp_run = tenc_runs.self_qqp_run


def bi_cosines(model_dir, pairs) -> np.ndarray:
    from raydistill.models import BiEncoder

    model = BiEncoder.from_pretrained(str(model_dir), max_length=32)
    first = model.encode([a for a, _ in pairs], normalize=True)
    second = model.encode([b for _, b in pairs], normalize=True)
    return np.einsum("nd,nd->n", first, second)


def cross_scores(model_dir, pairs) -> np.ndarray:
    from raydistill.models import CrossEncoder

    return SymmetricCrossScorer(CrossEncoder.from_pretrained(str(model_dir), max_length=32)).score(pairs)


def fingerprint_of(model_dir, kind: str) -> str:
    from raydistill.models import BiEncoder, CrossEncoder

    model = BiEncoder.from_pretrained(str(model_dir)) if kind == "bi" else CrossEncoder.from_pretrained(str(model_dir))
    return encoder_fingerprint(model)


def read_state(run_dir: Path) -> dict:
    return json.loads((run_dir / "state.json").read_text())


# ----------------------------------------------------------------------------------------------------------------
# No Ray


def test_config_defaults_are_the_paper_and_errors_name_the_field(tiny_models, tmp_path):
    paper = TencConfig()
    assert (paper.bi.batch_size, paper.bi.lr, paper.bi.epochs, paper.bi.max_length) == (128, 5e-5, 10, 32)
    assert (paper.cross.batch_size, paper.cross.lr, paper.cross.epochs, paper.cross.max_length) == (32, 2e-5, 1, 64)
    assert paper.cycles == 3 and paper.init == "refresh"

    shorthand = TencConfig.from_dict({"families": ["minilm-l3", "bert-small"]})
    assert [(f.name, f.bi, f.cross_start) for f in shorthand.families] == [
        ("minilm-l3", "minilm-l3", "minilm-l3"), ("bert-small", "bert-small", "bert-small")]

    with pytest.raises(ConfigError, match=r"cross\.epoch.*did you mean 'epochs'"):
        TencConfig.from_dict({"cross": {"epoch": 2}})
    with pytest.raises(ConfigError, match="families.*two or more"):
        tiny_config(tiny_models, tmp_path, families=[{"name": "bert", "bi": str(tiny_models["bert"])}]).validate()
    with pytest.raises(ConfigError, match=r"families\[1\]\.cross.*sequential"):
        tiny_config(tiny_models, tmp_path, init="sequential",
                    families=[{"name": "bert", "bi": str(tiny_models["bert"])},
                              {"name": "mpnet", "bi": str(tiny_models["mpnet"]),
                               "cross": str(tiny_models["bert"])}]).validate()
    with pytest.raises(ConfigError, match="pairs.source.*inductive"):
        tiny_config(tiny_models, tmp_path, pairs={"source": "inductiv"}).validate()
    with pytest.raises(ConfigError, match="stop_after_stage"):
        tiny_config(tiny_models, tmp_path, stop_after_stage="after the first").validate()
    # One config hash across fields that cannot change a completed stage (cycles may grow on resume).
    base = tiny_config(tiny_models, tmp_path)
    assert base.config_hash() == tiny_config(tiny_models, tmp_path, cycles=5, resources={"num_cpus": 8}).config_hash()
    assert base.config_hash() != tiny_config(tiny_models, tmp_path, cross={"lr": 5e-4}).config_hash()
    # cross.head: null and classifier are the same head (and the hash of runs from before the field existed)
    cross = dict(base.to_dict()["cross"])
    assert base.config_hash() == tiny_config(tiny_models, tmp_path, cross={**cross, "head": "classifier"}).config_hash()
    segment = tiny_config(tiny_models, tmp_path, cross={**cross, "head": "segment_cosine"})
    assert segment.validate().config_hash() != base.config_hash()
    # a config differs from its own saved dict in nothing, null heads included; from the other head in the head
    assert base.diff_keys(base.to_dict()) == [] and segment.diff_keys(base.to_dict()) == ["cross.head"]
    with pytest.raises(ConfigError, match=r"cross\.head.*did you mean 'segment_cosine'"):
        tiny_config(tiny_models, tmp_path, cross={**cross, "head": "segment_cosin"}).validate()
    with pytest.raises(ConfigError, match=r"bi\.head.*cross-encoder setting"):
        tiny_config(tiny_models, tmp_path, bi={**base.to_dict()["bi"], "head": "segment_cosine"}).validate()


def test_the_cluster_checks_the_families_actors_as_it_checks_any_jobs_roles(tiny_models, tmp_path):
    cfg = tiny_config(tiny_models, tmp_path)  # 2 families x (0.25 + 0.25) CPU, 1 CPU left to Ray Data
    assert (cfg.actor_reservation().cpus, cfg.actor_reservation().gpus) == (1.0, 0.0)
    check_resources(cfg, {"CPU": 2})
    with pytest.raises(ResourceError, match=r"2 families x \(bi 0\.25 \+ cross 0\.25\) CPU \+ Ray Data headroom 1 "
                                            r"CPU = 2 CPU > 1: lower resources\.bi\.num_cpus"):
        check_resources(cfg, {"CPU": 1})
    # A family pinned to a node (resources.families): both of its actors ask for the node's custom resource, so a
    # cluster without that node is refused before any actor waits for it forever.
    pinned = tiny_config(tiny_models, tmp_path, resources={**cfg.to_dict()["resources"],
                                                           "families": {"bert": {"node_a": 1}}})
    check_resources(pinned, {"CPU": 2, "node_a": 2})
    with pytest.raises(ResourceError, match=r"family bert's two actors ask for 2 x 1 of the custom resource 'node_a'; "
                                            r"the cluster has 1"):
        check_resources(pinned, {"CPU": 2, "node_a": 1})
    # Stages on Train workers (resources.learners): both families' stages train at once, each on its workers.
    workers = tiny_config(tiny_models, tmp_path, resources={**cfg.to_dict()["resources"], "learners": {
        "num_learners": 2, "num_cpus": 1, "num_gpus": 0.5}})
    assert (workers.actor_reservation().cpus, workers.actor_reservation().gpus) == (5.0, 2.0)
    check_resources(workers, {"CPU": 6, "GPU": 2})
    with pytest.raises(ResourceError, match=r"\+ 2 stages x 2 learner\(s\) x 1 CPU \+ Ray Data headroom 1 CPU = 6 CPU "
                                            r"> 4: .*resources\.learners\.num_learners"):
        check_resources(workers, {"CPU": 4, "GPU": 2})


def test_pair_sets_are_deduplicated_unordered_subsampled_by_stable_id():
    inductive = build_pair_set("inductive")
    keys = {tuple(sorted(p)) for p in inductive.pairs()}
    assert len(keys) == len(inductive)  # no pair twice, in either order
    assert not inductive.transductive and build_pair_set("transductive", 10).transductive

    transductive = build_pair_set("transductive")
    from raydistill.data import load_dataset

    stsb_test_pair = load_dataset("stsb_test")[0]
    assert {stsb_test_pair.sentence1, stsb_test_pair.sentence2} in [set(p) for p in transductive.pairs()]
    # the inductive pool shares no sentence with the evaluation sets, the transductive pool holds their pairs
    assert not {s for p in inductive.pairs() for s in p} & {stsb_test_pair.sentence1, stsb_test_pair.sentence2}

    small = build_pair_set("inductive", max_pairs=50, seed=3)
    again = build_pair_set("inductive", max_pairs=50, seed=3)
    other = build_pair_set("inductive", max_pairs=50, seed=4)
    assert small.fingerprint == again.fingerprint != other.fingerprint
    assert len(small) == 50 and np.all(np.diff(small.pair_id) > 0)
    for i, pair_id in enumerate(small.pair_id):  # the id is the row of the full pool, whatever the subsample
        assert (small.sentence1[i], small.sentence2[i]) == (inductive.sentence1[pair_id], inductive.sentence2[pair_id])


def test_cross_learner_trains_both_orders_on_scaled_bi_labels(tiny_bert):
    from raydistill.objectives.trans_encoder import cosine_to_target
    from raydistill.runtime.tenc.learners import CrossEncoderLearner

    pair_set = build_pair_set("inductive", max_pairs=6, seed=1)
    swapped = list(zip(pair_set.sentence2, pair_set.sentence1))
    cosines = np.array([-0.4, 0.0, 0.3, 0.7, 0.95, 1.0], dtype=np.float32)
    train = {"batch_size": 4, "max_length": 32}
    for scaling in ("clip", "affine", "raw"):
        learner = CrossEncoderLearner("bert", pair_set, train, label_scaling=scaling, threads=1)
        rows = learner.spec.training_columns(list(pair_set.sentence1), list(pair_set.sentence2), cosines, scaling)
        first, second, targets = rows["text_a"], rows["text_b"], rows["score"]
        assert list(zip(first, second)) == pair_set.pairs() + swapped
        np.testing.assert_allclose(targets, np.tile(cosine_to_target(cosines, scaling), 2))
    assert targets[0] == pytest.approx(-0.4)  # raw keeps the authors' negative BCE target

    # the label a cross-encoder hands on does not depend on which sentence comes first
    learner.load(str(tiny_bert), cycle=1)
    scorer = learner.scorer()
    np.testing.assert_allclose(scorer.score(pair_set.pairs()), scorer.score(swapped), atol=1e-6)
    direct = learner.model.score(pair_set.pairs(), activation="sigmoid")
    assert not np.allclose(direct, learner.model.score(swapped, activation="sigmoid"), atol=1e-4)


def test_each_stage_starts_from_the_checkpoint_its_init_names_in_every_cycle(tiny_models, tmp_path):
    """refresh: every cross-encoder from the family's cross start, every bi-encoder from its start; sequential:
    cross_k from bi_(k-1) (the start at k = 1), bi_k from cross_k. The paths the job loads, for three cycles (the
    self run below checks, by weights, that cycle 1's stages really start there, across a restart)."""
    from raydistill.runtime.tenc import TransEncoderJob

    for init in ("refresh", "sequential"):
        job = TransEncoderJob(tiny_config(tiny_models, tmp_path, init=init, cycles=3))
        for family in ("bert", "mpnet"):
            start = str(tiny_models[family])
            assert job.start_checkpoint("bi", family) == job.start_checkpoint("cross", family) == start
            for cycle in (1, 2, 3):
                labelled_by = start if cycle == 1 else str(tmp_path / "run" / "models" / f"cycle={cycle - 1}" / "bi"
                                                           / family)
                expected = {"refresh": (start, start),
                            "sequential": (labelled_by,
                                           str(tmp_path / "run" / "models" / f"cycle={cycle}" / "cross" / family))}
                assert (job.init_checkpoint(cycle, "bi2cross", family),
                        job.init_checkpoint(cycle, "cross2bi", family)) == expected[init], (init, family, cycle)


# ----------------------------------------------------------------------------------------------------------------
# Ray runs


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_cycle_two_learns_from_the_labels_of_cycle_ones_models_and_the_teacher(tiny_models, tiny_teacher, tmp_path):
    """Two cycles of the mutual job with a teacher labeller (the shipped job runs three cycles; the shared runs,
    one): each label set was made by the models the cycle before trained, told by the weight fingerprint of each
    model that labelled it, and each stage trained on that set. cycle 2's cross-encoders learn from cycle 1's
    bi-encoders, its bi-encoders from cycle 2's cross-encoders; the frozen teacher's cosine, computed once, joins
    every set, weighed by its dev score like the families' labellers."""
    from raydistill.runtime.tenc import run_trans_encoder

    steps = {"batch_size": 8, "lr": 1e-3, "epochs": 1, "max_steps": 2, "max_length": 32, "eval_every": 1}
    pairs = [(a, b) for a, b in build_pair_set("inductive", max_pairs=24, seed=7).pairs()]
    run_trans_encoder(tiny_config(tiny_models, tmp_path, cycles=2, teacher=str(tiny_teacher), label_weighting="dev",
                                  pairs={"source": "inductive", "max_pairs": 24, "seed": 7},
                                  bi={**steps, "warmup_ratio": 0.0}, cross=steps))
    state = read_state(tmp_path / "run")
    stages, label_sets, teacher = state["stages"], state["labels"], state["teacher"]
    assert set(stages) == set(label_sets) == {stage_key(c, s) for c in (1, 2) for s in ("bi2cross", "cross2bi")}
    assert teacher["fingerprint"] == fingerprint_of(tiny_teacher, "bi")
    teacher_cosines = bi_cosines(tiny_teacher, pairs)

    def trained(cycle, stage, family):
        return stages[stage_key(cycle, stage)]["families"][family]["fingerprint"]

    for family in ("bert", "mpnet"):
        labellers = {key: label_set["labellers"][family] for key, label_set in label_sets.items()}
        assert labellers[stage_key(1, "bi2cross")] == fingerprint_of(tiny_models[family], "bi")  # the start
        assert labellers[stage_key(1, "cross2bi")] == trained(1, "bi2cross", family)
        assert labellers[stage_key(2, "bi2cross")] == trained(1, "cross2bi", family) != labellers[
            stage_key(1, "bi2cross")]
        assert labellers[stage_key(2, "cross2bi")] == trained(2, "bi2cross", family) != trained(1, "bi2cross", family)
    for key, label_set in label_sets.items():
        table = read_label_set(label_set["path"])
        assert label_set["labellers"]["teacher"] == teacher["fingerprint"]
        np.testing.assert_allclose(table["score_teacher"], teacher_cosines, atol=1e-4)
        weights = label_set["weights"]
        assert set(weights) == {"bert", "mpnet", "teacher"} and sum(weights.values()) == pytest.approx(1.0)
        np.testing.assert_allclose(table["score"], sum(weights[name] * table[f"score_{name}"] for name in weights),
                                   atol=1e-5)
        for family in ("bert", "mpnet"):  # mutual: every family trains on the weighted mean of all labellers
            info = stages[key]["families"][family]
            assert info["target_column"] == "score"
            assert info["labels_sha"] == labels_digest(table["score"].to_numpy()), key


def test_a_teacher_labeller_is_checked_before_the_run(tiny_models, tmp_path):
    with pytest.raises(ConfigError, match=r"field 'teacher': .*only mode mutual"):
        tiny_config(tiny_models, tmp_path, mode="self", teacher=str(tiny_models["bert"])).validate()
    with pytest.raises(ConfigError, match=r"field 'teacher': model directory not found"):
        tiny_config(tiny_models, tmp_path, teacher=str(tmp_path / "nowhere")).validate()
    teacher_family = [{"name": "teacher", "bi": str(tiny_models["bert"])}, {"name": "mpnet",
                                                                              "bi": str(tiny_models["mpnet"])}]
    with pytest.raises(ConfigError, match=r"field 'families\[0\]\.name': 'teacher' names the teacher's labels"):
        tiny_config(tiny_models, tmp_path, families=teacher_family, teacher=str(tiny_models["bert"])).validate()
    assert tiny_config(tiny_models, tmp_path).config_hash() == tiny_config(tiny_models, tmp_path,
                                                                           teacher=None).config_hash()



@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_a_learner_reads_its_stage_rows_from_the_label_set_through_ray_data(tiny_bert, tmp_path, monkeypatch):
    """A learner trains on the rows of the label set's Parquet, which it reads itself through Ray Data, visited in
    the order its stage seed gives: the same in every run of the stage, so a rerun trains on the same batches (that it
    trains the same model: tests/test_determinism.py, tests/test_signals.py)."""
    import ray

    pair_set = build_pair_set("inductive", max_pairs=12, seed=1)
    rng = np.random.default_rng(0)
    scores = {"bert": rng.uniform(-1, 1, 12).astype(np.float32), "mpnet": rng.uniform(-1, 1, 12).astype(np.float32)}
    labels_dir = tmp_path / "labels" / "cycle=1" / "stage=cross2bi"
    write_label_set(labels_dir, pair_set, scores, (scores["bert"] + scores["mpnet"]) / 2)

    reads = []
    read_parquet = ray.data.read_parquet

    def recorded_read(paths, **kwargs):
        reads.append((paths, kwargs.get("columns")))
        return read_parquet(paths, **kwargs)

    monkeypatch.setattr(ray.data, "read_parquet", recorded_read)
    train = {"batch_size": 5, "lr": 1e-3, "epochs": 2, "max_steps": None, "max_length": 32, "warmup_ratio": 0.0,
             "weight_decay": 0.0, "grad_clip": 1.0, "eval_every": 100, "amp": False}

    def stage(column: str) -> tuple[list[tuple[str, str, float]], dict]:
        learner = BiEncoderLearner("bert", pair_set, train, threads=1)
        learner.load(str(tiny_bert), cycle=1)
        trained_on, batch_to_features = [], learner.spec.batch_to_features

        def recorded_batch(ctx, batch):
            trained_on.extend(zip(batch["text_a"], batch["text_b"], batch["score"].tolist()))
            return batch_to_features(ctx, batch)

        learner.spec = dataclasses.replace(learner.spec, batch_to_features=recorded_batch)
        summary = learner.fit(str(labels_dir), column, cycle=1, stage="cross2bi", out_dir=str(tmp_path / column))
        return trained_on, summary

    parquet = pq.read_table(labels_dir).to_pandas().sort_values("pair_id")
    # self mode's column: a family's own labels, not the table's mean (mutual mode's "score": the mutual run's learners)
    column = "score_mpnet"
    trained_on, summary = stage(column)
    assert reads == [(str(labels_dir), ["pair_id", "sentence1", "sentence2", column])]
    rows = list(zip(parquet["sentence1"], parquet["sentence2"], parquet[column]))
    # The order of each epoch is the permutation drawn from (stage seed, epoch) (data.arrays.ArrayData, as every
    # labelled set the engine trains on): every run of the stage (a rerun, a resume) visits the rows in this order;
    # an epoch's last, partial batch is dropped, as the engine drops it.
    full, seed = len(rows) // train["batch_size"] * train["batch_size"], stage_seed(1000, 1, "bi", "bert")
    expected = [rows[i] for epoch in range(train["epochs"])
                for i in np.random.default_rng([seed, epoch]).permutation(len(rows))[:full]]
    assert [(a, b) for a, b, _ in trained_on] == [(a, b) for a, b, _ in expected]
    np.testing.assert_allclose([t for *_, t in trained_on], [t for *_, t in expected], rtol=1e-6)
    assert summary["labels_dir"] == str(labels_dir) and summary["target_column"] == column
    assert summary["labels_sha"] == labels_digest(parquet[column].to_numpy())


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_a_stage_whose_loss_turns_nan_is_refused_at_that_step(tiny_bert, tmp_path):
    """A stage trains through the engine's loop, whose NaN refusal names the method, the step and the loss parts;
    the stage writes no model directory."""
    pair_set = build_pair_set("inductive", max_pairs=12, seed=1)
    scores = np.random.default_rng(0).uniform(-1, 1, 12).astype(np.float32)
    labels_dir = tmp_path / "labels" / "cycle=1" / "stage=cross2bi"
    write_label_set(labels_dir, pair_set, {"bert": scores}, scores)
    train = {"batch_size": 4, "lr": 1e-3, "epochs": 1, "max_steps": None, "max_length": 32, "warmup_ratio": 0.0,
             "weight_decay": 0.0, "grad_clip": 1.0, "eval_every": 100, "amp": False}
    learner = BiEncoderLearner("bert", pair_set, train, threads=1)
    learner.load(str(tiny_bert), cycle=1)
    batch_to_features = learner.spec.batch_to_features

    def nan_targets_at_step_2(ctx, batch):
        features, targets = batch_to_features(ctx, batch)
        return features, targets * float("nan") if ctx.step == 1 else targets

    learner.spec = dataclasses.replace(learner.spec, batch_to_features=nan_targets_at_step_2)
    with pytest.raises(FloatingPointError,
                       match=r"tenc-bi: loss is nan at step 2 \(parts \{'mse': nan\}\); lower the job's bi.lr"):
        learner.fit(str(labels_dir), "score", cycle=1, stage="cross2bi", out_dir=str(tmp_path / "model"))
    assert not (tmp_path / "model").exists()


@pytest.mark.ray
def test_mutual_cycle_writes_averaged_parquet_labels_and_refreshes_models(mutual_run, tiny_models):
    cfg, summary = mutual_config(tiny_models, mutual_run.root), mutual_run.summary
    run_dir = Path(cfg.run_dir)
    pair_set = build_pair_set("inductive", MUTUAL_PAIRS, 7)
    pairs = pair_set.pairs()
    state = read_state(run_dir)
    assert set(state["stages"]) == {stage_key(1, "bi2cross"), stage_key(1, "cross2bi")}

    for stage in ("bi2cross", "cross2bi"):
        directory = run_dir / "labels" / "cycle=1" / f"stage={stage}"
        schema_names = set(pq.read_schema(next(directory.glob("*.parquet"))).names)
        assert schema_names == {"pair_id", "sentence1", "sentence2", "score_bert", "score_mpnet", "score"}
        frame = read_label_set(directory)
        assert len(frame) == MUTUAL_PAIRS
        assert frame["pair_id"].tolist() == pair_set.pair_id.tolist()
        assert list(zip(frame["sentence1"], frame["sentence2"])) == pairs
        # mutual: the training target is the mean of the two families' labels, weighted as the state records
        # (label_weighting dev; which weights, tests/test_tenc_outcomes.py; the plain mean, the self run below)
        weights = state["labels"][stage_key(1, stage)]["weights"]
        assert sum(weights.values()) == pytest.approx(1.0)
        np.testing.assert_allclose(frame["score"], weights["bert"] * frame["score_bert"]
                                   + weights["mpnet"] * frame["score_mpnet"], rtol=1e-5, atol=1e-6)
        assert not np.allclose(frame["score_bert"], frame["score_mpnet"], atol=1e-3)
        # ... which every learner of the stage read from this directory itself
        for family in ("bert", "mpnet"):
            trained = state["stages"][stage_key(1, stage)]["families"][family]
            assert (trained["labels_dir"], trained["target_column"]) == (str(directory), "score")
            assert trained["labels_sha"] == labels_digest(frame["score"].to_numpy())

    bi_labels = read_label_set(run_dir / "labels" / "cycle=1" / "stage=bi2cross")
    cross_labels = read_label_set(run_dir / "labels" / "cycle=1" / "stage=cross2bi")
    for family in ("bert", "mpnet"):
        # bi2cross labels = the starting bi-encoder's cosines, recomputed here
        np.testing.assert_allclose(bi_labels[f"score_{family}"], bi_cosines(tiny_models[family], pairs), atol=2e-4)
        # cross2bi labels = the trained cross-encoder's symmetrised sigmoid, recomputed from its saved directory
        cross_dir = run_dir / "models" / "cycle=1" / "cross" / family
        expected = cross_scores(cross_dir, pairs)
        np.testing.assert_allclose(cross_labels[f"score_{family}"], expected, atol=2e-4)
        assert np.all((expected > 0) & (expected < 1))

        # refresh: both stages start from the family's original weights
        stages = state["stages"]
        original = fingerprint_of(tiny_models[family], "bi")
        assert stages[stage_key(1, "bi2cross")]["families"][family]["init"]["init_fingerprint"] == original
        assert stages[stage_key(1, "cross2bi")]["families"][family]["init"]["init_fingerprint"] == original
        trained_bi = run_dir / "models" / "cycle=1" / "bi" / family
        assert fingerprint_of(trained_bi, "bi") != original  # and it did train
        # the start is a candidate too: cycle 1 only where training raised the dev score
        trained_dev = stages[stage_key(1, "cross2bi")]["families"][family]["best_dev"]
        assert summary["best"][family]["bi"]["cycle"] == (1 if trained_dev > state["start_dev"][family] else 0)
        # no test evaluation: the summary's 7-STS values are null and say why; the verdict is on STS-B dev
        row = summary["by_family"][family]
        assert row["start_bi"] is None and row["best_bi"] is None
        assert "eval.test_cycles is none" in row["scores_missing"]
        assert row["improved"] == (row["best_bi_cycle"] == 1) and row["start_bi_stsb_dev"] == round(
            state["start_dev"][family], 2)
        assert (run_dir / "best" / family / "cross" / "config.json").is_file()

    # MLflow: one parent, a child per family and encoder with the cycle as the step of per-cycle metrics
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=mutual_run.tracking_uri)
    experiment = client.get_experiment_by_name("tenc-test")
    runs = client.search_runs([experiment.experiment_id])
    parent = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == summary["mlflow_run_id"]]
    assert len(parent) == 1 and parent[0].info.run_id == summary["mlflow_run_id"]
    assert {(r.data.tags["family"], r.data.tags["encoder"]) for r in children} == {
        ("bert", "bi"), ("bert", "cross"), ("mpnet", "bi"), ("mpnet", "cross")}
    for child in children:
        history = client.get_metric_history(child.info.run_id, "stsb_dev_best")
        assert [m.step for m in history] == [1]
    assert parent[0].data.params["transductive"] == "False"
    assert parent[0].data.params["label_scaling"] == cfg.label_scaling


@pytest.mark.ray
def test_self_sequential_run_stopped_between_stages_resumes_the_weight_chain(self_qqp_run, tiny_models):
    """Self-distillation with sequential init, stopped after the first stage (as a crash there would) and rerun:
    completed work is reused, not redone, and every stage starts from the weights of the stage before it, also
    across the restart. Then the result files: 7-STS of cycle 0 and of the best models, and their ensembles."""
    run = self_qqp_run
    run_dir, resumed = run.run_dir, run.summary
    assert run.stopped["stopped_after"] == stage_key(1, "bi2cross")
    stopped_state = run.stopped_state
    assert set(stopped_state["stages"]) == {stage_key(1, "bi2cross")}
    assert set(stopped_state["labels"]) == {stage_key(1, "bi2cross"), stage_key(1, "cross2bi")}
    stopped_invocation = stopped_state["invocations"]
    assert len(stopped_invocation) == 1 and stopped_invocation[0]["wall_s"] > 0

    state = read_state(run_dir)
    stages = state["stages"]
    # the whole run's wall time counts both invocations: the stopped one and the one that finished it
    assert [i["cycles"] for i in state["invocations"]] == [1, 1]
    assert state["invocations"][0] == stopped_invocation[0]
    assert resumed["wall_s_total"] == round(sum(i["wall_s"] for i in resumed["invocations"]), 1) > resumed["wall_s"]
    assert set(stages) == {stage_key(1, s) for s in ("bi2cross", "cross2bi")}
    assert stages[stage_key(1, "bi2cross")]["completed"] == stopped_state["stages"][stage_key(1, "bi2cross")][
        "completed"]
    cross_dir = run_dir / "models" / "cycle=1" / "cross" / "bert"
    assert {p.name: p.stat().st_mtime_ns for p in cross_dir.iterdir()} == run.stopped_cross_files  # not retrained
    assert {p: p.stat().st_mtime_ns for p in (run_dir / "labels" / "cycle=1").rglob("*.parquet")} == \
        run.stopped_label_files

    def init_of(family, cycle, stage):
        return stages[stage_key(cycle, stage)]["families"][family]["init"]["init_fingerprint"]

    def saved(family, cycle, kind):
        return fingerprint_of(run_dir / "models" / f"cycle={cycle}" / kind / family, kind)

    for family in ("bert", "mpnet"):
        original = fingerprint_of(tiny_models[family], "bi")
        assert init_of(family, 1, "bi2cross") == original  # cross_1 from the starting bi-encoder
        # bi_1 from cross_1 (saved before the stop); cross_k from bi_(k-1) further on: the test above
        assert init_of(family, 1, "cross2bi") == saved(family, 1, "cross") != original

        # self: each family learned its own labels, not the average
        for cycle, stage in ((1, "bi2cross"), (1, "cross2bi")):
            info = stages[stage_key(cycle, stage)]["families"][family]
            labels = read_label_set(run_dir / "labels" / f"cycle={cycle}" / f"stage={stage}")
            assert info["target_column"] == f"score_{family}"
            assert info["labels_sha"] == labels_digest(labels[f"score_{family}"].to_numpy())
            assert info["labels_sha"] != labels_digest(labels["score"].to_numpy())
            # ... and the table's score column is their plain mean (label_weighting is mutual mode's only)
            np.testing.assert_allclose(labels["score"], (labels["score_bert"] + labels["score_mpnet"]) / 2,
                                       atol=1e-6)
        assert resumed["best"][family]["bi"]["cycle"] in (0, 1)  # 0: the start, when no cycle beat its dev

    # results: schema files for the starting bi-encoders (cycle 0) and the best models, plus the ensembles
    from raydistill.evaluation import validate_result_file
    from raydistill.runtime.tenc import scores_from_predictions

    results = run.results
    best = resumed["best"]
    expected = {"bert-bi-cycle0.json", "mpnet-bi-cycle0.json", "ensemble-bi-cycle0.json",
                "ensemble-bi-best.json", "ensemble-cross-best.json"}
    expected |= {f"{f}-{kind}-cycle{best[f][kind]['cycle']}.json"
                 for f in ("bert", "mpnet") for kind in ("bi", "cross")}
    assert {p.name for p in results.glob("*.json")} == expected | {"summary.json"}
    records = {p.name: validate_result_file(p) for p in results.glob("*.json") if p.name != "summary.json"}
    record = records[f"bert-cross-cycle{best['bert']['cross']['cycle']}.json"]
    assert (record["kind"], record["method"], record["encoder"]) == ("mutual_tenc", "tenc-self", "cross")
    assert record["training"]["transductive"] is True  # QQP pairs: learned on the pairs it is scored on
    assert record["training"]["init"] == "sequential" and os.path.isdir(record["model_dir"])
    # the configured head was trained, saved and is what a reload of the stage's model gets
    from raydistill.models import CrossEncoder

    assert record["training"]["cross"]["head"] == "segment_cosine"
    assert CrossEncoder.from_pretrained(record["model_dir"]).head == "segment_cosine"
    # an ensemble's scores are the Spearman of the mean of its members' saved predictions
    members = [np.load(run_dir / "eval" / "cycle=0" / "bi" / f"{f}.npz") for f in ("bert", "mpnet")]
    mean = {name: (members[0][name] + members[1][name]) / 2 for name in members[0].files}
    assert records["ensemble-bi-cycle0.json"]["scores"]["avg"] == pytest.approx(
        scores_from_predictions(mean)["avg"], abs=0.006)
    single = scores_from_predictions({name: members[0][name] for name in members[0].files})
    assert records["bert-bi-cycle0.json"]["scores"]["sts12"] == pytest.approx(single["sts12"], abs=0.006)
