"""Determinism: the same seed and config give the same pseudo-labels and the same final scores.

Measured here, on this machine, under the real Ray runtime with tiny models:
  * a ConGen job run twice with one seed: the same batches, the same loss at every step, the same final STS-B dev
    (the second run finds every teacher vector in the cache the first one filled);
  * the same job with the learner on 2 torch threads instead of 1: the same batches, losses equal to float
    rounding, a final score within 0.05;
  * the teacher's vectors on 1 and 2 threads: equal to float rounding (the embedding cache does not key on threads);
  * a Trans-Encoder stage trained again, in local mode and on a Ray Train worker: the same weights (and pseudo-labels)
    as the job's;
  * a Trans-Encoder (mutual) cycle run twice: the same Parquet pseudo-label sets and the same best STS-B dev.
docs/reliability.md says what this covers and what it does not (other machines, GPUs).

The job twice adds one run to the shared reference of tests/distill_fixtures.py. The Trans-Encoder's determinism is
checked by default where it is made, in a stage: each cross-encoder of the mutual run of tests/tenc_runs.py
trained again in this process must come out with the job's weights and pseudo-labels; the whole cycle run twice is
marked ``e2e``. So is the 2-thread job: by default tests/test_learner.py checks the thread count where it acts, in
the learner's steps.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests import distill_fixtures, ray_fixtures, tenc_runs
from tests.distill_fixtures import ROWS

pytest_plugins = ["tests.reliability_log"]
# The shared fixtures, seen by this module's tests (distill_runs asks for the next two; mutual_run is the session's
# mutual Trans-Encoder run).
distill_runs, teacher_dir, ray_session = distill_fixtures.distill_runs, distill_fixtures.teacher_dir, \
    ray_fixtures.ray_session
mutual_run = tenc_runs.mutual_run
pytestmark = pytest.mark.ray

SCORE_TOLERANCE = 0.05  # the contract: "the same final scores to ±0.05"


def max_loss_difference(first, second) -> float:
    a, b = first.losses(), second.losses()
    assert a.keys() == b.keys()
    return max(abs(a[step] - b[step]) for step in a)


def test_distillation_twice_with_one_seed_trains_the_same_batches_losses_and_score(distill_runs, reliability):
    reference = distill_runs.reference()
    again = distill_runs.run("again")
    assert again.training["teacher_cache"] == {"hits": ROWS, "misses": 0, "teacher_forward_sentences": 0}
    assert again.batches() == reference.batches()
    difference = max_loss_difference(again, reference)
    assert difference == 0.0, f"per-step losses differ by up to {difference}"
    assert again.best_stsb_dev == reference.best_stsb_dev
    assert again.training["best_step"] == reference.training["best_step"]
    reliability.record(
        "determinism", "distillation job, same seed and config twice",
        input="a ConGen job (tiny student and teacher, 20 steps, one Ray Train worker on 1 torch thread) run twice",
        did=f"the same batches at every step, bit-identical losses at every step, the same final STS-B dev "
            f"({reference.best_stsb_dev:.2f}) and best step", lost="nothing: fully reproducible",
        stsb_dev=[reference.best_stsb_dev, again.best_stsb_dev], max_loss_difference=difference)


@pytest.mark.e2e
def test_learner_thread_count_changes_rounding_not_the_result(distill_runs, reliability):
    one = distill_runs.reference(threads=1)
    two = distill_runs.reference(threads=2)
    assert two.batches() == one.batches()  # data order does not depend on threads
    difference = max_loss_difference(two, one)
    assert difference < 1e-3, f"per-step losses differ by up to {difference} between 1 and 2 threads"
    score_difference = abs(two.best_stsb_dev - one.best_stsb_dev)
    assert score_difference <= SCORE_TOLERANCE
    reliability.record(
        "determinism", "learner on 2 torch threads instead of 1",
        input="the same ConGen job with resources.learner.threads 2 instead of 1",
        did=f"the same batches; losses differ by at most {difference:.1e} per step (parallel reductions add in "
            f"another order), final STS-B dev {two.best_stsb_dev:.2f} vs {one.best_stsb_dev:.2f}",
        lost=f"bit-reproducibility only: the score moved by {score_difference:.2f} (tolerance {SCORE_TOLERANCE})",
        max_loss_difference=difference, score_difference=score_difference)


def test_teacher_vectors_on_one_and_two_threads_agree_to_rounding(teacher_dir, real_sentences, reliability):
    from raydistill.runtime.teachers.teacher import TeacherEncoder

    texts = real_sentences[:256]
    one = TeacherEncoder(str(teacher_dir), max_length=32, threads=1).encode(texts)
    again = TeacherEncoder(str(teacher_dir), max_length=32, threads=1).encode(texts)
    two = TeacherEncoder(str(teacher_dir), max_length=32, threads=2).encode(texts)
    assert np.array_equal(one, again)
    difference = float(np.abs(two - one).max())
    assert difference < 1e-5
    reliability.record(
        "determinism", "teacher vectors on 1 and 2 torch threads",
        input=f"{len(texts)} sentences through the tiny teacher with 1 thread (twice) and with 2 threads",
        did=f"identical vectors on one thread count; at most {difference:.1e} apart across thread counts, so a "
            "cache written with one thread count serves jobs with another (it is keyed by the teacher, not threads)",
        lost="nothing", max_difference=difference)


def _retrain_cross_stage(mutual_run, tiny_models, family, out_dir, learners=None):
    """The mutual run's cycle-1 bi->cross stage of ``family`` trained again in this process as its actor did (same
    settings, start checkpoint, label set and seed), its learners ``learners`` (None: local mode, as the job's).
    Returns (the job's stage record, the learner, ``fit``'s summary)."""
    import dataclasses
    import json

    from raydistill.runtime.tenc import stage_key
    from raydistill.runtime.tenc.learners import CrossEncoderLearner
    from raydistill.runtime.tenc.pairs import build_pair_set

    cfg = tenc_runs.mutual_config(tiny_models, mutual_run.root)
    run_dir = mutual_run.root / "run"
    job = json.loads((run_dir / "state.json").read_text())["stages"][stage_key(1, "bi2cross")]["families"][family.name]
    learner = CrossEncoderLearner(
        family.name, build_pair_set(cfg.pairs.source, cfg.pairs.max_pairs, cfg.pairs_seed()),
        dataclasses.asdict(cfg.stage_settings(family, "cross")), label_scaling=cfg.label_scaling, seed=cfg.seed,
        threads=1, device="cpu", inference_batch_size=cfg.resources.cross.batch_size, dev_set=cfg.eval.dev_set,
        data_task_cpus=cfg.resources.data_task_cpus, learners=learners)
    assert learner.load(job["init"]["init_from"], cycle=1)["init_fingerprint"] == job["init"]["init_fingerprint"]
    again = learner.fit(job["labels_dir"], job["target_column"], cycle=1, stage="bi2cross", out_dir=str(out_dir))
    return job, learner, again


def test_a_trans_encoder_stage_trained_again_gives_the_jobs_model_and_pseudo_labels(mutual_run, tiny_models,
                                                                                    tmp_path, one_thread,
                                                                                    reliability):
    """Each family's cross-encoder of the session's mutual cycle, trained again in this process as its actor did
    (same settings, start checkpoint, label set and seed): the same weights as the job's, and bit-identical scores
    for every pair, which are the cycle's cross→bi pseudo-labels. The bi→cross labels are the start models' cosines,
    recomputed by tests/test_mutual_tenc.py."""
    from raydistill.runtime.tenc import read_label_set

    cfg = tenc_runs.mutual_config(tiny_models, mutual_run.root)
    labels = read_label_set(mutual_run.root / "run" / "labels" / "cycle=1" / "stage=cross2bi")
    differences = {}
    for family in cfg.families:
        job, learner, again = _retrain_cross_stage(mutual_run, tiny_models, family, tmp_path / family.name)
        assert (again["fingerprint"], again["best_step"]) == (job["fingerprint"], job["best_step"]), family.name
        scores = learner.predict_pairs()
        differences[family.name] = float(np.abs(scores - labels[f"score_{family.name}"].to_numpy()).max())
        assert differences[family.name] == 0.0, f"{family.name}: pseudo-labels differ by {differences[family.name]}"
    reliability.record(
        "determinism", "Trans-Encoder stage trained again, same seed",
        input="each family's cross-encoder of a mutual cycle (two tiny families) trained again in another process "
              "from the same start checkpoint, bi→cross label set and seed",
        did="the same weights as the job's (encoder fingerprint, best step) and bit-identical scores for every "
            "pair, the cycle's cross→bi pseudo-labels",
        lost="nothing: fully reproducible", label_differences=differences)


def test_a_trans_encoder_stage_on_a_train_worker_gives_the_local_mode_model(mutual_run, tiny_models, tmp_path,
                                                                             one_thread, monkeypatch):
    """``resources.learners.num_learners: 1``: the stage is a Ray Train run with one worker (another process) instead
    of Train's local mode in the actor, and trains the same model: the job's weights (trained in local mode) and
    best step, loaded back into the learner from the worker's ``best/``; its model directory says how it trained."""
    import json

    from raydistill.runtime.engine.learner_group import LearnerGroup

    def no_local_mode(*args, **kwargs):
        raise AssertionError("the stage ran in Train's local mode, not on a Train worker")

    monkeypatch.setattr(LearnerGroup, "_fit_local", no_local_mode)
    family = tenc_runs.mutual_config(tiny_models, mutual_run.root).families[0]
    workers = {"num_learners": 1, "num_cpus": 0.5, "num_gpus": 0, "threads": 1, "cpu_speedups": False}
    job, learner, again = _retrain_cross_stage(mutual_run, tiny_models, family, tmp_path / family.name, workers)
    assert (again["fingerprint"], again["best_step"]) == (job["fingerprint"], job["best_step"])
    assert learner.fingerprint() == job["fingerprint"]
    assert json.loads((tmp_path / family.name / "stage.json").read_text())["num_learners"] == 1


@pytest.mark.e2e
def test_trans_encoder_twice_with_one_seed_gives_the_same_pseudo_labels(mutual_run, tiny_models, tmp_path,
                                                                        reliability):
    from raydistill.runtime.tenc import read_label_set, run_trans_encoder

    summaries = [mutual_run.summary, run_trans_encoder(tenc_runs.mutual_config(tiny_models, tmp_path))]
    label_sets = []
    for root in (mutual_run.root, tmp_path):
        labels_dir = root / "run" / "labels" / "cycle=1"
        label_sets.append({stage: read_label_set(labels_dir / f"stage={stage}") for stage in ("bi2cross",
                                                                                             "cross2bi")})
    differences = {}
    for stage in ("bi2cross", "cross2bi"):
        first, second = label_sets[0][stage], label_sets[1][stage]
        assert list(first.columns) == list(second.columns) and len(first) == len(second) > 0
        assert first["pair_id"].tolist() == second["pair_id"].tolist()
        score_columns = [c for c in first.columns if c.startswith("score")]
        differences[stage] = float(np.abs(first[score_columns].to_numpy() - second[score_columns].to_numpy()).max())
        assert differences[stage] == 0.0, f"{stage} labels differ by up to {differences[stage]}"
    best_devs = []
    for family in ("bert", "mpnet"):
        for kind in ("bi", "cross"):
            a, b = (s["best"][family][kind]["best_dev"] for s in summaries)
            assert abs(a - b) <= SCORE_TOLERANCE, f"{family}/{kind}: best STS-B dev {a} vs {b}"
            best_devs.append((f"{family}/{kind}", a, b))
    reliability.record(
        "determinism", "Trans-Encoder (mutual) cycle, same seed and config twice",
        input="one mutual cycle of two tiny families (bi→cross labels, cross→bi labels), run twice",
        did="identical Parquet pseudo-label sets for both stages (every pair, every family's score and the mean) "
            "and the same best STS-B dev for every family and encoder: "
            + ", ".join(f"{name} {a:.2f}" for name, a, _ in best_devs),
        lost="nothing: fully reproducible", label_differences=differences)
