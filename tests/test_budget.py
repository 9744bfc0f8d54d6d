"""Training to a budget (``train.budget``) and choosing the best model on the user's dev pairs (``train.dev_pairs``).

Tiny models in Train's local mode (the loop runs in this process), on the 64 paraphrase rows of conftest: 4 steps of
16 rows an epoch. The dev evaluations score a small pairs file, so every epoch end's evaluation takes milliseconds.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from raydistill.config.job import ConfigError, JobConfig
from raydistill.data.arrays import ArrayData
from raydistill.methods import get_method
from raydistill.runtime.engine import budget as budget_module
from raydistill.runtime.engine import checkpoint as ckpt
from raydistill.runtime.engine.budget import BudgetFactor, RateMeter
from raydistill.runtime.engine.learner_group import LearnerGroup
from tests import distill_fixtures
from tests.conftest import TEACHER_DIM
from tests.test_learner import congen_config

teacher_dir = distill_fixtures.teacher_dir

pytestmark = pytest.mark.usefixtures("one_thread")

# Labelled 0/1 pairs (ROC AUC) and graded pairs (Spearman), from STS-B-like sentences.
LABELLED = [("A man is playing a guitar.", "A man plays the guitar.", 1),
            ("A dog runs on the beach.", "A dog is running along the shore.", 1),
            ("A woman is slicing onions.", "Someone cuts an onion.", 1),
            ("A man is playing a guitar.", "Two cats sleep on a sofa.", 0),
            ("A dog runs on the beach.", "The stock market fell today.", 0),
            ("A woman is slicing onions.", "A plane takes off.", 0)]


def write_pairs(path, rows) -> str:
    path.write_text("".join(f"{a}\t{b}\t{score}\n" for a, b, score in rows))
    return str(path)


def paraphrase_data(paraphrases, teacher_vectors, seed=0) -> ArrayData:
    control, generalize = paraphrases
    return ArrayData({"idx": np.arange(len(control)), "text_control": control, "text_generalize": generalize,
                      "teacher_control": teacher_vectors}, seed=seed)


# ----------------------------------------------------------------------------------------------------------------
# The config field


@pytest.mark.parametrize("given, spelled, steps, seconds", [
    (1500, "1500 steps", 1500, None), ("1500", "1500 steps", 1500, None), ("1500steps", "1500 steps", 1500, None),
    ("1500 steps", "1500 steps", 1500, None), ("30m", "30m", None, 1800.0), ("2h", "2h", None, 7200.0),
    ("90s", "1m30s", None, 90.0), ("1800s", "30m", None, 1800.0)])
def test_a_budget_is_steps_or_wall_time_with_one_spelling(given, spelled, steps, seconds):
    train = JobConfig.from_dict({"method": "congen", "student": "s", "train": {"budget": given}}).train
    assert train.budget == spelled
    assert (train.budget_limit().steps, train.budget_limit().seconds) == (steps, seconds)
    assert train.stop_patience() == 7  # a budget turns early stopping on
    explicit = JobConfig.from_dict({"method": "congen", "student": "s",
                                    "train": {"budget": given, "patience": 3}}).train
    assert explicit.stop_patience() == 3
    assert JobConfig.from_dict({"method": "congen", "student": "s"}).train.stop_patience() is None


@pytest.mark.parametrize("given, words", [
    ("soon", "expected a number of steps (1500, \"1500 steps\") or a wall time"), (0, "must be > 0 steps"),
    ("0 steps", "must be > 0 steps"), (1.5, "expected a number of steps"), (True, "expected a number of steps")])
def test_a_bad_budget_is_refused_naming_the_field(given, words):
    with pytest.raises(ConfigError) as refused:
        JobConfig.from_dict({"method": "congen", "student": "s", "train": {"budget": given}})
    assert "train.budget" in str(refused.value) and words in str(refused.value)


def test_a_budget_and_max_steps_together_are_refused():
    with pytest.raises(ConfigError, match="budget '10 steps' and max_steps 5 both set the length of the run"):
        JobConfig.from_dict({"method": "congen", "student": "s", "train": {"budget": 10, "max_steps": 5}})


def test_no_budget_keeps_the_config_hash_of_runs_made_before_budgets():
    plain = JobConfig.from_dict({"method": "congen", "student": "s"})
    assert plain.config_hash() == JobConfig.from_dict({"method": "congen", "student": "s",
                                                       "train": {"budget": None, "dev_pairs": None}}).config_hash()
    assert plain.config_hash() != JobConfig.from_dict({"method": "congen", "student": "s",
                                                       "train": {"budget": "30m"}}).config_hash()


# ----------------------------------------------------------------------------------------------------------------
# Metrics of the user's pairs


def test_labels_of_0_and_1_are_scored_with_roc_auc_and_graded_scores_with_spearman():
    from sklearn.metrics import roc_auc_score

    from raydistill.evaluation import pair_metric, score_pairs, spearman

    predicted = np.array([0.9, 0.2, 0.7, 0.4, 0.4, 0.1])
    labels = np.array([1, 0, 1, 1, 0, 0])
    assert pair_metric(labels) == "roc_auc"
    assert score_pairs(predicted, labels) == pytest.approx(100 * roc_auc_score(labels, predicted))
    graded = np.array([4.5, 0.5, 3.0, 2.0, 1.0, 0.0])
    assert pair_metric(graded) == "spearman"
    assert score_pairs(predicted, graded) == pytest.approx(spearman(predicted, graded))


def test_the_package_table_names_roc_auc_for_labelled_own_pairs():
    from raydistill.data import Pair
    from raydistill.ship.package import EVAL_PAIRS, Row, format_table, score_model

    class Fixed:  # a "model" whose vectors make the similarities: sentence -> its position on a circle
        def encode(self, texts, batch_size=32, **_):
            angles = np.array([hash(t) % 360 for t in texts], dtype=np.float64) * np.pi / 180
            return np.stack([np.cos(angles), np.sin(angles)], axis=1)

    pairs = [Pair(a, b, float(s), None) for a, b, s in LABELLED]
    scores = score_model(Fixed(), {EVAL_PAIRS: pairs}, 32)
    from raydistill.evaluation import pair_similarities, score_pairs

    sims = pair_similarities(Fixed(), {EVAL_PAIRS: pairs}, encoder="bi")[EVAL_PAIRS]
    assert scores[EVAL_PAIRS] == round(score_pairs(sims, [p.score for p in pairs]), 2)
    row = Row(name="student", kind="student", file=None, bytes=None, scores=scores, scores_source="evaluated",
              sentences_per_s=1.0, sentences_per_cpu_s=1.0, load="")
    speed = {"sentences": 1, "batch_size": 1, "cpu": "cpu", "rounds": 1, "load_before": 0}
    table = format_table([row], margin=0.5, speed=speed, own_metric="roc_auc")
    assert "own pairs AUC" in table.splitlines()[0] and "(own pairs: ROC AUC x 100)" in table


# ----------------------------------------------------------------------------------------------------------------
# Step budgets


def test_a_step_budget_repeats_a_small_corpus_and_its_schedule_ends_at_the_budget(tiny_bert, tiny_teacher,
                                                                                 teacher_vectors, paraphrases,
                                                                                 tmp_path, capsys):
    dev = write_pairs(tmp_path / "dev.tsv", LABELLED)
    cfg = congen_config(tiny_bert, tiny_teacher, tmp_path / "run", budget=10, warmup_ratio=0.2, eval_every=100,
                        checkpoint_every=100, patience=100, dev_pairs=dev)
    data = paraphrase_data(paraphrases, teacher_vectors)
    group = LearnerGroup(cfg, get_method("congen"), run_dir=tmp_path / "run", teacher_dim=TEACHER_DIM)
    length = group.run_length(data)
    assert (length.total, length.epochs, length.pending) == (10, 3, False)  # 4 steps an epoch: 3 epochs for 10
    summary = group.fit(data)
    trained = [row for row in summary["history"] if "loss" in row]
    assert [row["step"] for row in trained] == list(range(1, 11)) and summary["total_steps"] == 10
    # Epoch ends at 4 and 8 (and the last step): the data went round more than twice.
    assert [row["step"] for row in summary["history"] if "stsb_dev" in row] == [4, 8, 10]
    # lr · step/2 for 2 warm-up steps, then lr · (10 - step)/8: the schedule ends at the budget's last step.
    expected = [cfg.train.lr * (s / 2 if s < 2 else (10 - s) / 8) for s in range(10)]
    np.testing.assert_allclose([row["lr"] for row in trained], expected, rtol=1e-6)
    out = capsys.readouterr().out
    assert "budget 0 steps left" in out and "[congen] step 10/10 (100%)" in out


def test_a_budget_stops_early_after_seven_evaluations_without_a_new_best(tiny_bert, tiny_teacher, teacher_vectors,
                                                                        paraphrases, tmp_path, capsys):
    """lr ~0: the dev score never improves on the first evaluation, and the run stops after 7 more."""
    dev = write_pairs(tmp_path / "dev.tsv", LABELLED)
    cfg = congen_config(tiny_bert, tiny_teacher, tmp_path / "run", budget=40, lr=1e-12, eval_every=1,
                        dev_pairs=dev)
    summary = LearnerGroup(cfg, get_method("congen"), run_dir=tmp_path / "run",
                           teacher_dim=TEACHER_DIM).fit(paraphrase_data(paraphrases, teacher_vectors))
    assert summary["steps"] == 8 and summary["best_step"] == 1
    assert "early stop at step 8: 7 evaluations without a new best" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------------------------
# Time budgets


def test_the_rate_meter_skips_the_first_steps_and_fixes_the_total_from_the_measured_rate():
    clock = iter([0.0, 10.0, 10.5] + [10.5 + 0.5 * i for i in range(1, 400)])
    meter = RateMeter(budget_s=1000.0, capacity=100_000, clock=lambda: next(clock))
    decided = [meter.observe(step, seconds_used=10.0 + 0.5 * step) for step in range(0, 300)]
    fixed_at = next(i for i, total in enumerate(decided) if total is not None)
    # The slow first steps (10 s) are not timed; 0.5 s a step from step 2; fixed once 20 steps and 5 % of the budget
    # (50 s) have passed, at 2 steps a second for the time left.
    assert fixed_at == 80
    assert decided[fixed_at] == fixed_at + int(2.0 * (1000.0 - 50.0))


def test_the_rate_meter_times_an_evaluation_and_a_checkpoint_when_they_come_often():
    """0.5 s a step and a 10 s pause (evaluation + checkpoint) every 20 steps: the window spans one pause, so the
    rate is 20 steps per 20 s, not the steps' 2 a second that would overrun the budget by half."""
    now = [0.0]

    def clock():
        return now[0]

    meter = RateMeter(budget_s=200.0, capacity=100_000, clock=clock, pauses=(20, 20))
    decided = None
    for step in range(0, 200):
        decided = meter.observe(step, seconds_used=now[0])
        if decided is not None:
            break
        now[0] += 0.5 + (10.0 if (step + 1) % 20 == 0 else 0.0)  # the step, then the pause after step 20, 40, ...
    assert step == 22  # timed from step 2 (the first two skipped): 20 steps and the pause after step 20
    rate = (step - 2) / (now[0] - 1.0)  # steps per second over the window, pause included
    assert decided == step + int(rate * (200.0 - now[0]))
    assert decided < step + int(2.0 * (200.0 - now[0])) * 0.6


def test_a_time_budget_schedule_is_continuous_and_ends_at_the_fixed_total():
    factor = BudgetFactor(warmup_ratio=0.1)
    before = [factor(step) for step in range(30)]
    factor.fix(total=1000, at_step=30)
    after = [factor(step) for step in range(30, 1001)]
    values = before + after
    assert max(abs(b - a) for a, b in zip(values, values[1:])) < 0.02  # no jump where the total was fixed
    assert factor(100) == pytest.approx(1.0) and factor(1000) == 0.0 and factor(550) == pytest.approx(0.5)


def test_a_time_budget_fixes_a_total_that_a_resumed_run_keeps(tiny_bert, tiny_teacher, teacher_vectors,
                                                              paraphrases, tmp_path, monkeypatch, capsys):
    """The total is fixed once; a run stopped after it was fixed resumes with the checkpoint's total and goes on
    counting the seconds used, without measuring again. The meter's decision is pinned (12 steps; the
    measurement itself is the test above; decided on 3 steps done, fixed after the 4th), so a loaded machine cannot
    change the total."""
    observed: list[int] = []

    def observe(meter, step, seconds_used):
        observed.append(step)
        return 12 if step >= 3 else None

    monkeypatch.setattr(budget_module.RateMeter, "observe", observe)
    dev = write_pairs(tmp_path / "dev.tsv", LABELLED)
    run_dir = tmp_path / "run"
    cfg = congen_config(tiny_bert, tiny_teacher, run_dir, budget="4s", checkpoint_every=2, eval_every=100,
                        patience=100, dev_pairs=dev)
    cfg = cfg.with_overrides(["runtime.log_every=1"])
    data = paraphrase_data(paraphrases, teacher_vectors)
    assert LearnerGroup(cfg, get_method("congen"), run_dir=run_dir).run_length(data).pending
    seen: dict[str, int] = {}

    def crash(metrics, step):
        if metrics.get("total_steps", -1) > 0:
            seen.setdefault("total", int(metrics["total_steps"]))
            if step % 2 == 1 and step > seen.setdefault("fixed_seen_at", step):
                raise KeyboardInterrupt  # after a checkpoint that holds the fixed total

    with pytest.raises(KeyboardInterrupt):
        LearnerGroup(cfg, get_method("congen"), run_dir=run_dir, teacher_dim=TEACHER_DIM).fit(data, on_metrics=crash)
    first = capsys.readouterr().out
    assert first.count("the run's total is") == 1 and "4 steps in" in first and seen["total"] == 12
    measured_steps = list(observed)
    saved = ckpt.latest_checkpoint(run_dir)
    _, state = ckpt.load_checkpoint(saved)
    assert state["learner"]["total_steps"] == seen["total"] and state["learner"]["budget_fixed_at"] >= 1
    saved_seconds = state["learner"]["seconds_used"]
    assert 0 < saved_seconds < 4

    summary = LearnerGroup(cfg, get_method("congen"), run_dir=run_dir, teacher_dim=TEACHER_DIM).fit(data)
    again = capsys.readouterr().out
    assert "the run's total is" not in again and observed == measured_steps  # never measured again
    assert summary["total_steps"] == seen["total"] == summary["steps"]
    _, final = ckpt.load_checkpoint(ckpt.latest_checkpoint(run_dir))
    assert final["learner"]["total_steps"] == seen["total"]
    assert final["learner"]["seconds_used"] > saved_seconds  # the seconds of both processes
    lrs = [row["lr"] for row in summary["history"] if "lr" in row]
    assert lrs[-1] > 0 and math.isclose(final["scheduler"]["_last_lr"][0], 0.0, abs_tol=1e-12)


# ----------------------------------------------------------------------------------------------------------------
# Dev pairs


def test_dev_pairs_choose_the_best_model_and_are_recorded_as_the_selection(tiny_bert, tiny_teacher, teacher_vectors,
                                                                           paraphrases, tmp_path):
    from raydistill.evaluation import pair_similarities, score_pairs
    from raydistill.models import BiEncoder
    from raydistill.runtime.engine.learner_state import BEST_INFO
    from raydistill.ship.package import read_eval_pairs

    dev = write_pairs(tmp_path / "dev.tsv", LABELLED)
    cfg = congen_config(tiny_bert, tiny_teacher, tmp_path / "run", epochs=2, eval_every=2, dev_pairs=dev)
    summary = LearnerGroup(cfg, get_method("congen"), run_dir=tmp_path / "run",
                           teacher_dim=TEACHER_DIM).fit(paraphrase_data(paraphrases, teacher_vectors))
    info = json.loads((tmp_path / "run" / "best" / BEST_INFO).read_text())
    assert info["selected_on"] == {"set": dev, "metric": "roc_auc"}
    pairs = read_eval_pairs(dev)
    best = BiEncoder.from_pretrained(str(tmp_path / "run" / "best"))
    similarities = pair_similarities(best, {"dev": pairs})["dev"]
    assert info["stsb_dev"] == pytest.approx(score_pairs(similarities, [p.score for p in pairs]), abs=1e-6)
    scored = [row["stsb_dev"] for row in summary["history"] if "stsb_dev" in row]
    assert summary["best_stsb_dev"] == max(scored) == info["stsb_dev"]


def test_the_distill_command_sets_the_budget_and_the_dev_pairs(teacher_dir, tmp_path, no_ray_start):
    from raydistill.ship.command import DistillError, plan_distill

    (tmp_path / "corpus.txt").write_text("a dog runs across the field\ntwo people ride bikes downhill\n")
    dev = write_pairs(tmp_path / "dev.tsv", LABELLED)
    plan = plan_distill(teacher=str(teacher_dir), student="layers:1", corpus=str(tmp_path / "corpus.txt"),
                        out=str(tmp_path / "out"), budget="30m", dev_pairs=dev)
    assert plan.cfg.train.budget == "30m" and plan.cfg.train.dev_pairs == dev and plan.budget == "30m"
    from raydistill.ship.recipe import DEFAULT_BUDGET

    default = plan_distill(teacher=str(teacher_dir), student="layers:1", corpus=str(tmp_path / "corpus.txt"),
                           out=str(tmp_path / "out"))
    assert default.cfg.train.budget == default.budget == DEFAULT_BUDGET and default.cfg.train.dev_pairs is None
    assert default.config_hash != plan.config_hash
    # the recipe's epochs: asked for by name, or by --set giving the run's length
    for given in ({"budget": "epochs"}, {"overrides": ["train.epochs=2"]}, {"overrides": ["train.max_steps=9"]}):
        unset = plan_distill(teacher=str(teacher_dir), student="layers:1", corpus=str(tmp_path / "corpus.txt"),
                             out=str(tmp_path / "out"), **given)
        assert unset.cfg.train.budget is None and unset.budget is None, given
    with pytest.raises(DistillError, match="--dev-pairs .*: file not found"):
        plan_distill(teacher=str(teacher_dir), student="layers:1", corpus=str(tmp_path / "corpus.txt"),
                     out=str(tmp_path / "out"), dev_pairs=str(tmp_path / "none.tsv"))


def test_the_distill_command_trains_in_bf16_only_where_the_cpu_multiplies_it(teacher_dir, tmp_path, no_ray_start,
                                                                             monkeypatch):
    """A time budget buys about three times the steps in bf16 on a CPU with bf16 units; elsewhere bf16 is emulated
    and many times slower, so the command trains in fp32 there. A --set of the precision wins."""
    from raydistill.runtime.teachers import teacher
    from raydistill.ship.command import describe_plan, plan_distill

    (tmp_path / "corpus.txt").write_text("a dog runs across the field\ntwo people ride bikes downhill\n")
    plan = lambda **given: plan_distill(teacher=str(teacher_dir), student="layers:1",  # noqa: E731
                                        corpus=str(tmp_path / "corpus.txt"), out=str(tmp_path / "out"), **given)
    monkeypatch.setattr(teacher, "bf16_support", lambda: (True, "test: bf16 units"))
    fast = plan()
    assert fast.cfg.train.precision == "bf16"
    assert "precision bf16 (this CPU multiplies bf16 in hardware)" in describe_plan(fast)
    assert plan(overrides=["train.precision=fp32"]).cfg.train.precision == "fp32"
    monkeypatch.setattr(teacher, "bf16_support", lambda: (False, "test: emulated"))
    assert plan().cfg.train.precision == "fp32"
