"""DvBERT's NLI teachers: fold models that label only pairs they never trained on, the accuracy bar, and the
teachers' held-out accuracy in the job's result file.

Tiny random models (chance-level teachers, seconds per fold) and a few dozen real NLI pairs.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from raydistill.methods import dvbert_teachers as dv
from raydistill.config.job import ConfigError, JobConfig
from raydistill.runtime.engine.preflight import preflight
from raydistill.runtime.jobs.stage_data import ENGINE_SERVICES, EngineServices
from tests.ray_fixtures import ray_session  # noqa: F401 - the session-wide Ray fixture

PAIRS = 36


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("RAYDISTILL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


class InProcessServices(EngineServices):
    """The engine's services with every parallel call in this process: a test's wrapper of a module function is
    what runs (Ray tasks would run the unwrapped function in workers), in call order."""

    def run_parallel(self, fn, calls, resources):
        return [fn(*args) for args in calls]


def small_training(**overrides) -> dv.TeacherTraining:
    return dv.TeacherTraining.from_dict({"epochs": 2, "lr": 1e-3, "batch_size": 6, "max_length": 32, "folds": 3,
                                         "head": "aligned", "finetune": False, **overrides})


def test_fold_assignment_is_balanced_seeded_and_covers_every_pair():
    fold = dv.fold_assignment(100, 3, seed=5)
    assert sorted(np.bincount(fold).tolist()) == [33, 33, 34]
    assert np.array_equal(fold, dv.fold_assignment(100, 3, seed=5))
    assert not np.array_equal(fold, dv.fold_assignment(100, 3, seed=6))


def test_teacher_training_refuses_settings_that_cannot_give_out_of_fold_labels():
    for bad in ({"folds": 1}, {"head": "pooler"}, {"min_accuracy": 1.5}, {"precision": "fp16"}, {"heldout": 0.1},
                {"head_hidden": -1}, {"finetune": "no"}):
        with pytest.raises(ValueError):
            dv.TeacherTraining.from_dict(bad)


@pytest.mark.parametrize("finetune", [False, True], ids=["frozen", "finetuned"])
def test_each_pair_is_labelled_only_by_fold_models_that_did_not_train_on_it(tiny_models, home, monkeypatch,
                                                                            finetune, capsys):
    columns = dv.nli_pairs(PAIRS, seed=3)
    calls = []
    real = dv._fit_fold

    def recording(columns, train_rows, label_rows, *args):
        model, probs, stats = real(columns, train_rows, label_rows, *args)
        calls.append((set(train_rows.tolist()), label_rows.tolist(), probs))
        return model, probs, stats

    monkeypatch.setattr(dv, "_fit_fold", recording)
    # The recording wrapper lives in this process; an earlier test may have left Ray up, and Ray tasks would run
    # the unwrapped function in workers. Fold-for-fold order is also what the assertions below index by.
    in_process = InProcessServices()
    teachers = [str(tiny_models["bert"]), str(tiny_models["mpnet"])]
    training = small_training(finetune=finetune, epochs=1 if finetune else 2)
    infos = dv.ensure_nli_teachers(teachers, columns, training, in_process)

    assert len(calls) == len(teachers) * training.folds
    if not finetune:  # the one long pass of a frozen teacher says how far it is
        assert f"encoded {PAIRS}/{PAIRS} pairs" in capsys.readouterr().out
    fold = dv.fold_assignment(PAIRS, training.folds, training.seed)
    for t, info in enumerate(infos):
        own = calls[t * training.folds:(t + 1) * training.folds]  # in-process: teacher by teacher, fold by fold
        assert sorted(row for c in own for row in c[1]) == list(range(PAIRS))  # each pair labelled once
        for f, (trained_on, labelled_rows, probs) in enumerate(own):
            assert set(labelled_rows) == set(np.flatnonzero(fold == f).tolist())  # model f labels fold f ...
            assert trained_on == set(np.flatnonzero(fold != f).tolist())  # ... and trained on all the others
            np.testing.assert_allclose(info["oof_probs"][labelled_rows], probs)
            saved = np.load(Path(info["dir"]) / f"fold-{f}" / "rows.npz")
            assert set(saved["train_rows"].tolist()) == trained_on
        gold = columns["label"]
        assert info["heldout_accuracy"] == pytest.approx(float((info["oof_probs"].argmax(1) == gold).mean()))
        assert len(info["fold_accuracy"]) == training.folds and not info["cached"]
        saved_info = json.loads((Path(info["dir"]) / "teacher_info.json").read_text())
        assert saved_info["heldout_accuracy"] == pytest.approx(info["heldout_accuracy"])

    soft, stats = dv.out_of_fold_soft_labels(infos, columns["label"])
    np.testing.assert_allclose(soft, (infos[0]["oof_probs"] + infos[1]["oof_probs"]) / 2, rtol=1e-6)
    np.testing.assert_allclose(soft.sum(axis=1), 1.0, rtol=1e-5)
    assert set(stats["teacher_accuracy"]) == set(teachers)

    # A saved fold model reloads and predicts what it predicted when it was trained.
    rows = np.flatnonzero(fold == 1)
    reloaded = dv._encode_rows(dv.load_teacher(Path(infos[0]["dir"]) / "fold-1"), columns, rows, "cpu", "fp32",
                               pooled_only=False)
    np.testing.assert_allclose(reloaded, infos[0]["oof_probs"][rows], atol=1e-4)

    calls.clear()
    again = dv.ensure_nli_teachers(teachers, columns, training, in_process)  # cached: nothing is retrained
    assert calls == [] and all(info["cached"] for info in again)
    np.testing.assert_array_equal(again[1]["oof_probs"], infos[1]["oof_probs"])


def test_a_teacher_below_the_bar_is_refused_by_name_and_accuracy_and_stays_cached(tiny_bert, home):
    columns = dv.nli_pairs(PAIRS, seed=3)
    infos = dv.ensure_nli_teachers([str(tiny_bert)], columns, small_training(folds=2), ENGINE_SERVICES)
    accuracy = infos[0]["heldout_accuracy"]
    with pytest.raises(dv.TeacherAccuracyError) as caught:
        dv.check_teacher_accuracy(infos, min_accuracy=0.99)
    message = str(caught.value)
    assert str(tiny_bert) in message and f"{accuracy:.3f}" in message and "0.99" in message
    assert isinstance(caught.value, ConfigError)  # the job exits with the message, not a traceback
    assert (Path(infos[0]["dir"]) / "teacher_info.json").is_file()
    dv.check_teacher_accuracy(infos, min_accuracy=accuracy)  # at the bar: accepted
    # Judging is not training: another bar reuses the same cached teacher.
    same = dv.ensure_nli_teachers([str(tiny_bert)], columns, small_training(folds=2, min_accuracy=0.1),
                                  ENGINE_SERVICES)
    assert same[0]["cached"] and same[0]["dir"] == infos[0]["dir"]


def dvbert_config(student: Path, teachers: list[Path], root: Path, min_accuracy: float) -> JobConfig:
    return JobConfig.from_dict({
        "method": "dvbert", "student": str(student), "run_dir": str(root / f"run-{min_accuracy}"),
        "data": {"max_sentences": 24, "max_length": 32},
        "train": {"batch_size": 8, "lr": 1e-3, "epochs": 1, "eval_every": 100, "checkpoint_every": 100},
        "extra": {"teachers": [str(t) for t in teachers],
                  "teacher_training": {"epochs": 2, "lr": 1e-3, "batch_size": 8, "max_length": 32, "folds": 2,
                                       "finetune": False, "head": "aligned", "max_pairs": 32,
                                       "min_accuracy": min_accuracy},
                  "stage2": {"train": {"batch_size": 8, "epochs": 1, "max_steps": 3, "eval_every": 100,
                                       "checkpoint_every": 100}}},
        "resources": {"num_cpus": 2, "teacher": {"num_actors": 1, "num_cpus": 1, "threads": 1},
                      "learner": {"num_learners": 0, "num_cpus": 1, "threads": 1}},
        "tracking": {"enabled": False},
    })


def test_dvbert_data_refuses_weak_teachers_and_hands_their_accuracy_to_the_result(tiny_models, home, tmp_path):
    from raydistill.methods import get_method
    from raydistill.runtime.jobs.stage_data import build_stage_data

    teachers = [tiny_models["bert"], tiny_models["mpnet"]]
    strict = preflight(dvbert_config(tiny_models["bert"], teachers, tmp_path, 0.99))
    with pytest.raises(dv.TeacherAccuracyError, match="held-out NLI accuracy"):
        build_stage_data(strict, get_method("dvbert"))

    lenient = preflight(dvbert_config(tiny_models["bert"], teachers, tmp_path, 0.0))
    data = build_stage_data(lenient, get_method("dvbert"))  # the same teachers, from the cache
    assert data.num_rows == 24  # data.max_sentences of the 32 labelled pairs
    stats = data.cache_stats
    assert all(info["cached"] for info in stats["own_teachers"]) and stats["teacher_pairs"] == 32
    assert set(stats["teacher_accuracy"]) == {str(t) for t in teachers}


@pytest.mark.ray
def test_dvbert_job_records_teacher_accuracy_and_refuses_weak_teachers_before_the_student(
        ray_session, tiny_models, home, tmp_path):
    from raydistill.evaluation import validate_result_file
    from raydistill.runtime.jobs.distill import run_distillation

    teachers = [tiny_models["bert"], tiny_models["mpnet"]]
    with pytest.raises(dv.TeacherAccuracyError, match=str(teachers[0])):
        run_distillation(dvbert_config(tiny_models["bert"], teachers, tmp_path, 0.99),
                         result_path=tmp_path / "refused.json")
    assert not (tmp_path / "run-0.99" / "best").exists() and not (tmp_path / "refused.json").exists()

    result_path = tmp_path / "dvbert.json"
    record = run_distillation(dvbert_config(tiny_models["bert"], teachers, tmp_path, 0.0), result_path=result_path,
                              command="pytest tests/test_dvbert_teachers.py")
    validate_result_file(str(result_path))
    # the first stage's best model is scored too (for DistilCSE that is the label-free CKD student); the last
    # stage's scores are the record's own
    first, last = record["training"]["stages"]
    assert set(first["scores"]) >= {"avg", "stsb_dev"} and "scores" not in last
    accuracy = record["training"]["teacher_accuracy"]
    assert set(accuracy) == {str(t) for t in teachers}
    assert all(0.0 <= value <= 1.0 for value in accuracy.values())
    cached = {info["model"]: info["heldout_accuracy"]
              for info in (json.loads(p.read_text()) for p in (home / "dvbert-teachers").glob("*/teacher_info.json"))}
    assert accuracy == {model: pytest.approx(value, abs=1e-4) for model, value in cached.items()}



class _RunsCodeWhenUnpickled:
    """A pickled object whose loading creates a file: what a crafted ``nli_head.pt`` would do, harmlessly."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_fold_head_holding_a_pickled_object_is_refused_without_running_it(tiny_bert, tmp_path, monkeypatch):
    import dataclasses

    import torch

    # torch >= 2.6 already defaults to weights_only=True; this variable turns that default off (as older torch
    # had it), so only an explicit weights_only=True keeps the payload from running.
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    fold_dir, marker = tmp_path / "fold-0", tmp_path / "payload-ran"
    fold_dir.mkdir()
    (fold_dir / "nli_head.json").write_text(json.dumps(
        {"encoder": str(tiny_bert), "labels": list(dv.NLI_LABELS), "training": dataclasses.asdict(small_training())}))
    torch.save({"weight": _RunsCodeWhenUnpickled(marker)}, fold_dir / "nli_head.pt")
    with pytest.raises(Exception, match="(?i)weights.only|unpickl|unsupported global"):
        dv.load_teacher(fold_dir)
    assert not marker.exists()


def test_a_stopped_fine_tuning_fold_continues_where_it_stopped_and_labels_with_its_last_evaluation(
        tiny_bert, tmp_path, monkeypatch):
    """A fold is a stage of the engine: a stop leaves a checkpoint at its step boundary, the next fit of the same
    fold continues from it to the same model as a fold never stopped, and the held-out predictions of the final
    evaluation are the fold's labels (no second pass over the held-out pairs)."""
    import dataclasses

    from raydistill import methods
    from raydistill.methods import nli_teacher
    from raydistill.models import resolve_model
    from raydistill.models.bi_encoder import transformer_directory
    from raydistill.runtime.engine.learner_group import PreemptedError
    from raydistill.runtime.engine.stopping import clear_stop_request, request_stop

    columns = dv.nli_pairs(PAIRS, seed=3)
    cfg = small_training(finetune=True, epochs=2, head="mean")
    weights = transformer_directory(resolve_model(str(tiny_bert)))
    train_rows, label_rows = np.arange(24), np.arange(24, PAIRS)  # 24 rows / batch 6: 4 steps an epoch, 8 in all
    _, whole, stats = dv._fit_fold(columns, train_rows, label_rows, cfg, 0, weights, tmp_path / "whole", "cpu", "whole",
                                   ENGINE_SERVICES)
    assert stats["steps"] == 8

    spec = methods.get_method("nli-teacher")

    def stop_in_step_3(ctx, batch):
        if ctx.step == 2:
            request_stop()
        return nli_teacher.pair_class_features(ctx, batch)

    monkeypatch.setitem(methods.METHODS, "nli-teacher", dataclasses.replace(spec, batch_to_features=stop_in_step_3))
    try:
        with pytest.raises(PreemptedError) as stopped:
            dv._fit_fold(columns, train_rows, label_rows, cfg, 0, weights, tmp_path / "stopped", "cpu", "stopped",
                         ENGINE_SERVICES)
    finally:
        clear_stop_request()
    assert stopped.value.step == 3
    monkeypatch.setitem(methods.METHODS, "nli-teacher", spec)

    passes = []
    real = nli_teacher.NLITeacherStageSpec.heldout_probs
    monkeypatch.setattr(nli_teacher.NLITeacherStageSpec, "heldout_probs",
                        lambda self, *args: passes.append(1) or real(self, *args))
    _, resumed, stats = dv._fit_fold(columns, train_rows, label_rows, cfg, 0, weights, tmp_path / "stopped", "cpu",
                                     "stopped", ENGINE_SERVICES)
    assert stats["steps"] == 8
    assert len(passes) == 2  # the evaluations at the end of epoch 1 and at the last step, nothing after
    np.testing.assert_allclose(resumed, whole, atol=1e-5)
