"""Determinism: the same seed and config give the same pseudo-labels and the same final scores.

Measured here, on this machine, under the real Ray runtime with tiny models:
  * a ConGen job run twice with one seed: the same batches, the same loss at every step, the same final STS-B dev;
  * the same job with the learner on 2 torch threads instead of 1: the same batches, losses equal to float
    rounding, a final score within 0.05;
  * the teacher's vectors on 1 and 2 threads: equal to float rounding (the embedding cache does not key on threads);
  * a Trans-Encoder (mutual) cycle run twice: the same Parquet pseudo-label sets and the same best STS-B dev.
docs/reliability.md says what this covers and what it does not (other machines, GPUs).

The job twice and the Trans-Encoder cycle twice each add one run to a run another test already made (the shared
reference of tests/distill_fixtures.py, the mutual run of tests/test_mutual_tenc.py). The 2-thread job is marked
``e2e``: by default tests/test_learner.py checks the thread count where it acts, in the learner's steps.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.distill_fixtures import distill_runs, teacher_dir  # noqa: F401 - fixtures
from tests.ray_fixtures import ray_session  # noqa: F401 - the session-wide Ray fixture
from tests.test_mutual_tenc import mutual_run  # noqa: F401 - the session's mutual Trans-Encoder run

pytest_plugins = ["tests.reliability_log"]
pytestmark = pytest.mark.ray

SCORE_TOLERANCE = 0.05  # the contract: "the same final scores to ±0.05"


def max_loss_difference(first, second) -> float:
    a, b = first.losses(), second.losses()
    assert a.keys() == b.keys()
    return max(abs(a[step] - b[step]) for step in a)


def test_distillation_twice_with_one_seed_trains_the_same_batches_losses_and_score(distill_runs, reliability):
    reference = distill_runs.reference()
    again = distill_runs.run("again")
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


def test_trans_encoder_twice_with_one_seed_gives_the_same_pseudo_labels(mutual_run, tiny_models, tmp_path,
                                                                        reliability):
    from raydistill.runtime.tenc import read_label_set, run_trans_encoder
    from tests.test_mutual_tenc import mutual_config

    summaries = [mutual_run.summary, run_trans_encoder(mutual_config(tiny_models, tmp_path))]
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
