"""What a Trans-Encoder job reports at its end: model selection that includes the start, the per-family verdict and
summary.json, the transductive pair-classification runs on QQP / MRPC pairs with their ROC AUC, and the per-cycle
dev curves on the MLflow parent run; and the label weighting and per-family stage settings a mutual run applies.

The runs are the session's shared ones (tests/tenc_runs.py): the self-distillation run on 40 QQP dev pairs (3 steps
per stage, stopped after its first stage and resumed) and the mutual run with dev-weighted labels.
Every number the job reports is recomputed here from the models it saved.
"""

from __future__ import annotations

import gzip
import json
import shutil

import numpy as np
import pytest

from raydistill.config.job import ConfigError
from raydistill.runtime.tenc.pairs import PAIR_SOURCES, build_pair_set, gold_pair_labels, split_held_out
from raydistill.evaluation.plots import plot_dev_by_cycle
from raydistill.runtime.tenc import TencConfig, read_label_set, run_trans_encoder, stage_key
from raydistill.cli import main as cli_main
import tests.tenc_runs as tenc_runs
from tests.tenc_runs import QQP_PAIRS, QQP_SEED, WEIGHT_TEMPERATURE, self_qqp_config
from tests.test_mutual_tenc import (
    bi_cosines,
    cross_scores,
    fingerprint_of,
    read_state,
    tiny_config,
)

from tests.ray_fixtures import ray_session  # noqa: F401,E402 - the session's Ray

pytest_plugins = ["tests.reliability_log"]  # the reliability rows
mutual_run, self_qqp_run = tenc_runs.mutual_run, tenc_runs.self_qqp_run  # the shared runs, fixtures here too


def auc_x100(scores, labels) -> float:
    """The reference ROC AUC x 100: scikit-learn's where installed, else the pairwise definition."""
    scores, labels = np.asarray(scores, dtype=np.float64), np.asarray(labels)
    try:
        from sklearn.metrics import roc_auc_score
    except ImportError:
        positives, negatives = scores[labels == 1], scores[labels == 0]
        wins = (positives[:, None] > negatives[None, :]).sum() + 0.5 * (positives[:, None] == negatives[None, :]).sum()
        return 100.0 * wins / (len(positives) * len(negatives))
    return 100.0 * roc_auc_score(labels, scores)


# ----------------------------------------------------------------------------------------------------------------
# No Ray


def test_qqp_and_mrpc_sources_are_the_bundled_pairs_without_their_labels(tmp_path, monkeypatch):
    from dataclasses import fields

    from raydistill.data import load_dataset

    assert PAIR_SOURCES["qqp"] == ("qqp_dev",) and PAIR_SOURCES["mrpc"] == ("mrpc_train", "mrpc_val")
    qqp = build_pair_set("qqp")
    bundled = load_dataset("qqp_dev")
    assert qqp.pool_size == len(bundled) and qqp.transductive
    assert qqp.pairs() == [(p.sentence1, p.sentence2) for p in bundled]  # no QQP dev pair repeats
    mrpc = build_pair_set("mrpc")
    listed = {frozenset((p.sentence1, p.sentence2)) for name in PAIR_SOURCES["mrpc"] for p in load_dataset(name)}
    assert {frozenset(p) for p in mrpc.pairs()} == listed and mrpc.pool_size == len(listed)
    # What the learners get holds sentences and ids only: no field for a label or a score
    assert {f.name for f in fields(qqp)} == {"pair_id", "sentence1", "sentence2", "source", "pool_size",
                                             "fingerprint", "held_out"}

    # The gold labels are each pair's own, in pair-set order (a subsample keeps its pairs' labels)
    sample = build_pair_set("qqp", max_pairs=300, seed=QQP_SEED)
    label_of = {(p.sentence1, p.sentence2): p.label for p in bundled}
    gold = gold_pair_labels(sample)
    assert gold.tolist() == [label_of[pair] for pair in sample.pairs()] and 0 < gold.mean() < 1

    # Every label flipped (a user's copy of the data under $RAYDISTILL_DATA): the pairs the job trains on are
    # bit-identical, only the labels read back for the AUC change
    flipped_dir = tmp_path / "data" / "para"
    flipped_dir.mkdir(parents=True)
    with gzip.open(flipped_dir / "qqp-dev.jsonl.gz", "wt", encoding="utf-8") as stream:
        for p in bundled:
            stream.write(json.dumps({"sentence1": p.sentence1, "sentence2": p.sentence2, "label": 1 - p.label}) + "\n")
    monkeypatch.setenv("RAYDISTILL_DATA", str(tmp_path / "data"))
    flipped = build_pair_set("qqp", max_pairs=300, seed=QQP_SEED)
    assert flipped.fingerprint == sample.fingerprint
    assert gold_pair_labels(flipped).tolist() == (1 - gold).tolist()

    with pytest.raises(ValueError, match="no gold pair labels"):
        gold_pair_labels(build_pair_set("inductive", max_pairs=5))


def test_pair_classification_sources_validate_by_name(tiny_models, tmp_path):
    for source in ("qqp", "mrpc"):
        tiny_config(tiny_models, tmp_path, pairs={"source": source, "max_pairs": 10}).validate()
    with pytest.raises(ConfigError, match=r"pairs\.source.*did you mean 'qqp'"):
        tiny_config(tiny_models, tmp_path, pairs={"source": "qqq"}).validate()
    from raydistill.runtime.tenc import TencConfig
    from raydistill.shipped import resolve_config

    shipped = TencConfig.from_yaml(resolve_config("mutual_tenc-qqp")).validate()
    assert shipped.pairs.source == "qqp" and shipped.eval.dev_set == "stsb_dev"
    assert shipped.eval.test_cycles != "none"  # its result files need the 7-STS scores beside the AUC
    default = TencConfig.from_yaml(resolve_config("mutual_tenc"))  # the QQP run is the default job on other pairs
    assert (shipped.families, shipped.bi, shipped.cross, shipped.cycles, shipped.label_weighting, shipped.teacher) == \
        (default.families, default.bi, default.cross, default.cycles, default.label_weighting, default.teacher)
    # a sample of one class has no AUC: refused before Ray starts or anything is written
    with pytest.raises(ConfigError, match="one class only"):
        run_trans_encoder(tiny_config(tiny_models, tmp_path, pairs={"source": "qqp", "max_pairs": 1}))
    assert not (tmp_path / "run").exists()


def test_a_held_out_split_learns_from_one_half_and_scores_pairs_of_the_other_that_share_no_sentence(tiny_models,
                                                                                                       tmp_path):
    pool = build_pair_set("qqp")
    learned, scored = split_held_out("qqp", 2000, seed=1000)
    assert len(scored) == 2000 and 0 < len(learned) <= pool.pool_size // 2
    # no sentence in both, and the pair ids are the pool's: the two sets are disjoint pairs of the same pool
    assert not ({*learned.sentence1, *learned.sentence2} & {*scored.sentence1, *scored.sentence2})
    assert not set(learned.pair_id.tolist()) & set(scored.pair_id.tolist())
    assert [(pool.sentence1[i], pool.sentence2[i]) for i in scored.pair_id] == scored.pairs()
    assert 0 < gold_pair_labels(scored).sum() < len(scored)
    # inductive: neither the STS sets nor the scored pairs are in what the job learns from
    assert learned.transductive is False and build_pair_set("qqp", 100).transductive is True
    # seeded: the same split again, another with another seed; max_pairs subsamples the learned half only
    again, _ = split_held_out("qqp", 2000, seed=1000)
    assert again.fingerprint == learned.fingerprint
    assert split_held_out("qqp", 2000, seed=1001)[0].fingerprint != learned.fingerprint
    fewer, scored_again = split_held_out("qqp", 2000, max_pairs=500, seed=1000)
    assert len(fewer) == 500 and set(fewer.pair_id.tolist()) <= set(learned.pair_id.tolist())
    assert scored_again.fingerprint == scored.fingerprint
    # only the pair-classification sources have labels to score held-out pairs by; hashed only when set
    with pytest.raises(ConfigError, match=r"pairs\.held_out.*gold 0/1 labels"):
        tiny_config(tiny_models, tmp_path, pairs={"source": "inductive", "held_out": 100}).validate()
    plain = tiny_config(tiny_models, tmp_path, pairs={"source": "qqp"})
    assert tiny_config(tiny_models, tmp_path, pairs={"source": "qqp", "held_out": None}).config_hash() == \
        plain.config_hash() != tiny_config(tiny_models, tmp_path, pairs={"source": "qqp", "held_out": 9}).config_hash()


def test_a_second_job_on_a_run_dir_in_use_is_refused_before_it_reads_or_writes_anything(tiny_models, tmp_path,
                                                                                        reliability):
    import os

    from raydistill.runtime.engine.rundir import RunDirLock, RunDirLockedError

    cfg = tiny_config(tiny_models, tmp_path)
    run_dir = cfg.validate().resolved_run_dir()
    refused = pytest.raises(RunDirLockedError, match=f"in use by another job .*pid {os.getpid()}")
    with RunDirLock(run_dir), refused as caught:  # the first job holds the lock
        run_trans_encoder(cfg)
    assert sorted(p.name for p in run_dir.iterdir()) == [".raydistill.lock"]  # no state.json, labels or models
    reliability.record(
        "checkpoint", "tenc-run-dir-locked",
        input="a Trans-Encoder job started on a run dir whose lock another job holds",
        did="refused (RunDirLockedError) naming the holder's host and pid, before reading the run state or starting "
            "Ray; the run dir holds nothing but the lock file", message=str(caught.value), lost="nothing")


def test_label_weighting_is_validated_by_name_and_needs_mutual_mode(tiny_models, tmp_path):
    with pytest.raises(ConfigError, match=r"label_weighting.*did you mean 'dev'"):
        tiny_config(tiny_models, tmp_path, label_weighting="deb").validate()
    with pytest.raises(ConfigError, match=r"label_weighting.*only mode mutual"):
        tiny_config(tiny_models, tmp_path, mode="self", label_weighting="dev").validate()
    with pytest.raises(ConfigError, match=r"label_weight_temperature.*> 0"):
        tiny_config(tiny_models, tmp_path, label_weight_temperature=0).validate()
    plain = tiny_config(tiny_models, tmp_path)
    assert tiny_config(tiny_models, tmp_path, label_weighting="mean").config_hash() == plain.config_hash()
    assert tiny_config(tiny_models, tmp_path, label_weighting="dev").config_hash() != plain.config_hash()


@pytest.mark.ray
def test_dev_weighted_labels_are_the_families_labels_weighted_by_their_labellers_dev(mutual_run):
    from raydistill.objectives.trans_encoder import dev_weights

    # One cycle covers both ways labels are made: by the starts before training (their dev measured first), and by
    # the models a stage has just trained (cycle 1's cross-encoders), weighted by that stage's best dev.
    tmp_path = mutual_run.root
    state = json.loads((tmp_path / "run" / "state.json").read_text())
    temperature = state["config"]["label_weight_temperature"]
    assert state["config"]["label_weighting"] == "dev" and temperature == WEIGHT_TEMPERATURE
    families = ["bert", "mpnet"]
    labellers_dev = {  # who labelled each stage: the starts, then cycle 1's cross-encoders
        stage_key(1, "bi2cross"): [state["start_dev"][f] for f in families],
        stage_key(1, "cross2bi"): [state["stages"][stage_key(1, "bi2cross")]["families"][f]["best_dev"]
                                   for f in families]}
    for key, dev in labellers_dev.items():
        weights = dev_weights(dev, temperature=temperature)
        assert [state["labels"][key]["weights"][f] for f in families] == pytest.approx(weights.tolist())
        table = read_label_set(tmp_path / "run" / "labels" / key)
        np.testing.assert_allclose(table["score"], weights[0] * table["score_bert"] + weights[1] * table["score_mpnet"],
                                   rtol=1e-5, atol=1e-6)


def test_dev_by_cycle_plot_draws_every_family_and_encoder(tmp_path):
    curves = {("minilm-l3", "bi"): [(0, 83.97), (1, 83.11), (2, 82.27)], ("minilm-l3", "cross"): [(1, 81.55)],
              ("bert-small", "bi"): [(0, 78.31), (1, 80.90)], ("bert-small", "cross"): [(1, 78.74), (2, 78.62)]}
    png = plot_dev_by_cycle(curves, tmp_path / "plots" / "dev.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no dev score"):
        plot_dev_by_cycle({}, tmp_path / "empty.png")


# ----------------------------------------------------------------------------------------------------------------
# Ray run


@pytest.mark.ray
def test_qqp_run_reports_transductive_auc_selection_with_the_start_and_dev_curves(self_qqp_run, tiny_models, tmp_path,
                                                                                  capsys):
    from mlflow import MlflowClient

    from raydistill.evaluation import validate_result_file

    run = self_qqp_run
    summary, printed = run.summary, run.printed
    run_dir, results = run.run_dir, run.results
    state = read_state(run_dir)
    pair_set = build_pair_set("qqp", QQP_PAIRS, QQP_SEED)
    pairs, gold = pair_set.pairs(), gold_pair_labels(pair_set)
    assert 0 < gold.sum() < len(gold)
    cycles = range(1, state["config"]["cycles"] + 1)

    def stage_dev(cycle: int, stage: str, family: str) -> float:
        return state["stages"][stage_key(cycle, stage)]["families"][family]["best_dev"]

    # Training saw the pairs only: the first labels are the starting bi-encoders' cosines, the tables hold no gold
    bi_labels = read_label_set(run_dir / "labels" / "cycle=1" / "stage=bi2cross")
    assert set(bi_labels.columns) == {"pair_id", "sentence1", "sentence2", "score_bert", "score_mpnet", "score"}
    for family in ("bert", "mpnet"):
        np.testing.assert_allclose(bi_labels[f"score_{family}"], bi_cosines(tiny_models[family], pairs), atol=2e-4)

    # A start scores here what `raydistill eval` gives it (its checkpoint's own max length, fp32), not what it
    # scores at the stage's max length
    for family in ("bert", "mpnet"):
        eval_file = tmp_path / f"eval-{family}.json"
        assert cli_main(["eval", "--model", str(tiny_models[family]), "--no-extra", "--quiet",
                         "--out", str(eval_file)]) == 0
        evaluated = json.loads(eval_file.read_text())["scores"]
        in_job = state["evaluations"][f"cycle=0/bi/{family}"]["scores"]
        assert {name: round(in_job[name], 2) for name in evaluated} == pytest.approx(evaluated, abs=0.011), family

    # Selection by dev: the bi-encoder's candidates are the start (cycle 0, its dev measured as the stages measure
    # theirs: at the stage's max length, not as the cycle-0 evaluation scores it) and every cycle; the
    # cross-encoder's, the cycles (no cross-encoder before cycle 1). Ties go to the earlier cycle.
    from raydistill.evaluation import evaluate_sts
    from raydistill.models import BiEncoder

    for family in ("bert", "mpnet"):
        start_dev = state["start_dev"][family]
        at_stage_length = BiEncoder.from_pretrained(str(tiny_models[family]), max_length=state["config"]["bi"]["max_length"])
        assert start_dev == pytest.approx(evaluate_sts(at_stage_length, sets=["stsb_dev"], progress=False)["stsb_dev"],
                                          abs=0.01)
        bi_candidates = [(start_dev, 0)] + [(stage_dev(c, "cross2bi", family), c) for c in cycles]
        cross_candidates = [(stage_dev(c, "bi2cross", family), c) for c in cycles]
        assert summary["best"][family]["bi"]["cycle"] == max(bi_candidates, key=lambda x: (x[0], -x[1]))[1]
        assert summary["best"][family]["cross"]["cycle"] == max(cross_candidates, key=lambda x: (x[0], -x[1]))[1]

    # summary.json: per family start / best / cycles / improved, the same file in the run and the results dir
    on_disk = json.loads((run_dir / "summary.json").read_text())
    assert json.loads((results / "summary.json").read_text()) == on_disk
    assert on_disk["transductive"] is True and on_disk["pair_classification"]["labels_used_for_training"] is False
    # ...and what reproduces it: the config that ran (it hashes as the run's state does), the code and the command
    assert TencConfig.from_dict(on_disk["config"]).config_hash() == state["config_hash"]
    assert on_disk["git_sha"] and on_disk["date"] and on_disk["command"]
    for family in ("bert", "mpnet"):
        by_cycle = on_disk["stsb_dev_by_cycle"][family]
        assert by_cycle == {
            "bi": {"0": round(state["start_dev"][family], 2),
                   **{str(c): round(stage_dev(c, "cross2bi", family), 2) for c in cycles}},
            "cross": {str(c): round(stage_dev(c, "bi2cross", family), 2) for c in cycles}}
    # A result file no evaluation of this run wrote (planted before the second invocation) is gone, and it says so
    assert not (results / tenc_runs.STALE_RESULT).exists()
    assert f"removed 1 result file(s) of {results}" in printed and tenc_runs.STALE_RESULT in printed
    records = {p.name: validate_result_file(p) for p in results.glob("*.json") if p.name != "summary.json"}
    best_cross_scores = {}
    for family in ("bert", "mpnet"):
        row = on_disk["by_family"][family]
        best_bi, best_cross = row["best_bi_cycle"], row["best_cross_cycle"]
        assert row["start_bi_cycle"] == 0
        assert (best_bi, best_cross) == (summary["best"][family]["bi"]["cycle"],
                                         summary["best"][family]["cross"]["cycle"])
        assert row["start_bi"] == records[f"{family}-bi-cycle0.json"]["scores"]["avg"]
        assert row["best_bi"] == records[f"{family}-bi-cycle{best_bi}.json"]["scores"]["avg"]
        assert row["best_cross"] == records[f"{family}-cross-cycle{best_cross}.json"]["scores"]["avg"]
        assert row["improved"] == (best_bi > 0 and row["best_bi"] > row["start_bi"])
        assert row["cross_beats_start_bi"] == (row["best_cross"] > row["start_bi"])
        verdict = "training improved on the start" if row["improved"] else "training did NOT improve on the start"
        assert (f"{family} bi: start {row['start_bi']:.2f}, best {row['best_bi']:.2f} (cycle {best_bi}) — "
                f"{verdict}") in printed

        # AUC: the job's pair scores are the saved models' own (recomputed here), and its AUC of them against the
        # gold labels of the same pairs is scikit-learn's
        start_scores = np.load(run_dir / "eval" / "cycle=0" / "bi" / f"{family}-pairs.npy")
        cross_dir = run_dir / "models" / f"cycle={best_cross}" / "cross" / family
        best_cross_scores[family] = np.load(run_dir / "eval" / f"cycle={best_cross}" / "cross" / f"{family}-pairs.npy")
        np.testing.assert_allclose(start_scores, bi_cosines(tiny_models[family], pairs), atol=2e-4)
        np.testing.assert_allclose(best_cross_scores[family], cross_scores(cross_dir, pairs), atol=2e-4)
        assert row["start_bi_auc"] == pytest.approx(auc_x100(start_scores, gold), abs=0.006)
        assert row["best_cross_auc"] == pytest.approx(auc_x100(best_cross_scores[family], gold), abs=0.006)
        start_record = records[f"{family}-bi-cycle0.json"]
        assert start_record["extra"]["pair_auc"]["auc"] == row["start_bi_auc"]
        assert start_record["extra"]["pair_auc"]["transductive"] is True
        assert start_record["extra"]["pair_auc"]["pairs"] == QQP_PAIRS
        assert start_record["training"]["transductive"] is True and start_record["training"]["pairs_source"] == "qqp"
        assert records[f"{family}-cross-cycle{best_cross}.json"]["extra"]["pair_auc"]["auc"] == row["best_cross_auc"]
        assert f"{family} qqp ROC AUC (on the {QQP_PAIRS} pairs the job learned from, unlabeled (transductive))" \
            in printed
        assert start_record["extra"]["pair_auc"]["held_out"] is False
    mean_cross = np.mean([best_cross_scores[family] for family in ("bert", "mpnet")], axis=0)
    assert records["ensemble-cross-best.json"]["extra"]["pair_auc"]["auc"] == pytest.approx(
        auc_x100(mean_cross, gold), abs=0.006)

    # MLflow parent: every family's dev per cycle (cycle 0 = the start for bi), and the chart of them all; the
    # resumed job's parent run holds the points of the stages the stopped one finished too
    client = MlflowClient(tracking_uri=run.tracking_uri)
    parent_id = summary["mlflow_run_id"]
    for family in ("bert", "mpnet"):
        bi_curve = client.get_metric_history(parent_id, f"dev/{family}/bi")
        cross_curve = client.get_metric_history(parent_id, f"dev/{family}/cross")
        assert sorted((m.step, round(m.value, 4)) for m in bi_curve) == [
            (0, round(state["start_dev"][family], 4)), *((c, round(stage_dev(c, "cross2bi", family), 4))
                                                         for c in cycles)]
        assert sorted((m.step, round(m.value, 4)) for m in cross_curve) == [
            (c, round(stage_dev(c, "bi2cross", family), 4)) for c in cycles]
    assert {a.path for a in client.list_artifacts(parent_id, "plots")} == {"plots/dev_by_cycle.png"}
    assert (run_dir / "plots" / "dev_by_cycle.png").is_file()

    # Training that never beats its start on dev keeps the start. A copy of the run again, with the trained
    # bi-encoders' recorded dev scores lowered below their starts (as harmful cycles would leave them): model
    # selection, done afresh at every run's end, picks cycle 0, best/<family>/bi is the start checkpoint saved as
    # the job used it, and the verdict says training did not improve.
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    lowered = read_state(copy)
    for cycle in cycles:
        for family in ("bert", "mpnet"):
            lowered["stages"][stage_key(cycle, "cross2bi")]["families"][family]["best_dev"] = \
                lowered["start_dev"][family] - 1.0
    (copy / "state.json").write_text(json.dumps(lowered, indent=2))
    capsys.readouterr()
    again = run_trans_encoder(self_qqp_config(tiny_models, tmp_path, tracking={"enabled": False}))
    printed = capsys.readouterr().out
    for family in ("bert", "mpnet"):
        row = again["by_family"][family]
        assert row["best_bi_cycle"] == 0 and row["improved"] is False and row["best_bi"] == row["start_bi"]
        assert (f"{family} bi: start {row['start_bi']:.2f}, best {row['start_bi']:.2f} (cycle 0) — training did "
                "NOT improve on the start") in printed
        best_dir = copy / "best" / family / "bi"
        assert fingerprint_of(best_dir, "bi") == fingerprint_of(tiny_models[family], "bi")
        assert json.loads((best_dir / "sentence_bert_config.json").read_text())["max_seq_length"] == 32
    assert (tmp_path / "results" / "ensemble-bi-best.json").is_file()
    assert json.loads((tmp_path / "results" / "summary.json").read_text())["by_family"] == again["by_family"]


def test_a_held_out_run_learns_from_one_half_and_reports_the_auc_of_the_other_half(tiny_models, tmp_path,
                                                                                      ray_session, capsys):
    pairs = {"source": "qqp", "max_pairs": 24, "held_out": 30, "seed": QQP_SEED}
    config = tiny_config(tiny_models, tmp_path, mode="self", families=[{"name": "bert", "bi": str(tiny_models["bert"])}],
                         pairs=pairs)
    summary = run_trans_encoder(config)
    printed = capsys.readouterr().out
    run_dir = tmp_path / "run"
    learned, scored = split_held_out("qqp", 30, max_pairs=24, seed=QQP_SEED)
    gold = gold_pair_labels(scored)

    # The models learned from the first half's pairs only: every label set holds exactly those
    for stage in ("bi2cross", "cross2bi"):
        labels = read_label_set(run_dir / "labels" / "cycle=1" / f"stage={stage}")
        assert labels["pair_id"].tolist() == learned.pair_id.tolist()
        assert not set(labels["sentence1"]) & {*scored.sentence1, *scored.sentence2}
    # ...and the AUC is of the held-out pairs: the saved models' own scores of them, scikit-learn's AUC
    on_disk = json.loads((run_dir / "summary.json").read_text())
    row = on_disk["by_family"]["bert"]
    start_scores = np.load(run_dir / "eval" / "cycle=0" / "bi" / "bert-pairs.npy")
    np.testing.assert_allclose(start_scores, bi_cosines(tiny_models["bert"], scored.pairs()), atol=2e-4)
    assert row["start_bi_auc"] == pytest.approx(auc_x100(start_scores, gold), abs=0.006)
    cross_cycle = row["best_cross_cycle"]
    cross_scores_held_out = np.load(run_dir / "eval" / f"cycle={cross_cycle}" / "cross" / "bert-pairs.npy")
    np.testing.assert_allclose(cross_scores_held_out, cross_scores(run_dir / "models" / f"cycle={cross_cycle}" /
                                                                   "cross" / "bert", scored.pairs()), atol=2e-4)
    note = on_disk["pair_classification"]
    assert (note["held_out"], note["transductive"], note["pairs"], on_disk["transductive"]) == (True, False, 30, False)
    assert summary["by_family"]["bert"]["start_bi_auc"] == row["start_bi_auc"]
    assert "qqp ROC AUC (on 30 held-out pairs of the other half" in printed


def test_stage_precision_is_validated_and_bf16_labels_track_fp32(tiny_models, tmp_path):
    from raydistill.runtime.teachers.teacher import bf16_support
    from raydistill.runtime.tenc.learners import BiEncoderLearner, CrossEncoderLearner

    with pytest.raises(ConfigError, match=r"cross\.precision.*'fp16' is not one of fp32, bf16, auto"):
        tiny_config(tiny_models, tmp_path, cross={"batch_size": 8, "precision": "fp16"}).validate()
    plain = tiny_config(tiny_models, tmp_path)
    bf16_bi = dict(plain.to_dict()["bi"], precision="bf16")
    assert tiny_config(tiny_models, tmp_path, bi=dict(bf16_bi, precision="fp32")).config_hash() == plain.config_hash()
    assert tiny_config(tiny_models, tmp_path, bi=bf16_bi).config_hash() != plain.config_hash()

    # The setting reaches every forward pass: labels move by bf16 rounding, and no further.
    pair_set = build_pair_set("inductive", max_pairs=24, seed=QQP_SEED)
    for learner_class in (BiEncoderLearner, CrossEncoderLearner):
        labels = {}
        for precision in ("fp32", "bf16"):
            learner = learner_class("bert", pair_set, dict(bf16_bi, precision=precision, head="segment_cosine"),
                                    threads=1, device="cpu")
            learner.load(str(tiny_models["bert"]), cycle=0)
            labels[precision] = learner.predict_pairs()
        assert learner.precision == "bf16"
        assert not np.array_equal(labels["fp32"], labels["bf16"])
        np.testing.assert_allclose(labels["bf16"], labels["fp32"], atol=0.05)
    # auto: bf16 exactly where the CPU multiplies bf16 in hardware
    auto = BiEncoderLearner("bert", pair_set, dict(bf16_bi, precision="auto"), threads=1, device="cpu")
    assert auto.precision == ("bf16" if bf16_support()[0] else "fp32")


def test_a_familys_own_stage_settings_are_validated_and_hashed_only_when_set(tiny_models, tmp_path):
    families = [{"name": "bert", "bi": str(tiny_models["bert"])}, {"name": "mpnet", "bi": str(tiny_models["mpnet"])}]
    plain = tiny_config(tiny_models, tmp_path, families=families)
    unset = tiny_config(tiny_models, tmp_path, families=[dict(f, bi_stage=None, cross_stage=None) for f in families])
    assert unset.config_hash() == plain.config_hash()
    own = tiny_config(tiny_models, tmp_path, families=[dict(families[0], bi_stage={"lr": 5e-4, "max_steps": 1}),
                                                       families[1]]).validate()
    assert own.config_hash() != plain.config_hash()
    assert (own.stage_settings(own.families[0], "bi").lr, own.stage_settings(own.families[0], "bi").max_steps) \
        == (5e-4, 1)
    assert own.stage_settings(own.families[1], "bi") == own.bi  # the other family keeps the shared settings
    assert own.stage_settings(own.families[0], "cross") == own.cross
    with pytest.raises(ConfigError, match=r"families\[0\]\.bi_stage\.max_length.*not a per-family setting"):
        tiny_config(tiny_models, tmp_path, families=[dict(families[0], bi_stage={"max_length": 64}),
                                                     families[1]]).validate()
    with pytest.raises(ConfigError, match=r"families\[1\]\.cross_stage\.lr.*must be > 0"):
        tiny_config(tiny_models, tmp_path, families=[families[0], dict(families[1], cross_stage={"lr": 0})]).validate()


@pytest.mark.ray
def test_a_familys_own_stage_settings_reach_only_its_learner(mutual_run):
    from tests.tenc_runs import MUTUAL_BI_STEPS

    state = json.loads((mutual_run.root / "run" / "state.json").read_text())
    assert state["config"]["families"][0]["cross_stage"]["max_steps"] == 2  # bert's own; the shared cross: 3 steps
    crosses = state["stages"][stage_key(1, "bi2cross")]["families"]
    assert (crosses["bert"]["steps"], crosses["mpnet"]["steps"]) == (2, 3)
    trained = state["stages"][stage_key(1, "cross2bi")]["families"]
    assert (trained["bert"]["steps"], trained["mpnet"]["steps"]) == (MUTUAL_BI_STEPS, MUTUAL_BI_STEPS)


def test_mode_self_on_the_shipped_default_runs_with_mean_labels():
    from raydistill.runtime.entry import self_mode_overrides
    from raydistill.shipped import shipped_config

    default = TencConfig.from_yaml(shipped_config("mutual_tenc"))
    assert (default.label_weighting, default.teacher) == ("dev", "mpnet-base")
    twin = TencConfig.from_yaml(shipped_config("mutual_tenc"), ["mode=self", *self_mode_overrides("self", [])])
    assert (twin.validate().label_weighting, twin.teacher) == ("mean", None)
    assert self_mode_overrides("mutual", []) == []
    # an explicit choice is the user's, and validation still names the field
    assert self_mode_overrides("self", ["label_weighting=dev"]) == ["teacher=null"]
    with pytest.raises(ConfigError, match="label_weighting"):
        TencConfig.from_yaml(shipped_config("mutual_tenc"), ["mode=self", "label_weighting=dev",
                                                              "teacher=null"]).validate()
    with pytest.raises(ConfigError, match="field 'teacher'"):
        TencConfig.from_yaml(shipped_config("mutual_tenc"), ["mode=self", "label_weighting=mean"]).validate()
