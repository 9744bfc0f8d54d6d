"""DistillLearner in-process: real forward/backward on real sentences with tiny models; checkpoints; LearnerGroup
in Ray Train's local mode (num_learners 0: the loop runs in this process).

Views come from real paraphrase pairs (STS-B train pairs scored >= 4: two human-written sentences that mean the
same), teacher vectors from a second tiny model of another family and width, so the student gets the projection
layer that ConGen adds when widths differ.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from raydistill.runtime.engine import checkpoint as ckpt
from raydistill.config.job import JobConfig
from raydistill.runtime.engine.learner import DistillLearner, build_optimizer, linear_schedule
from raydistill.data.arrays import ArrayData
from raydistill.runtime.engine.learner_group import LearnerGroup
from raydistill.methods import get_method, with_method_defaults
from raydistill.methods.hooks import TeacherQueues
from raydistill.runtime.engine.preflight import preflight
from tests.conftest import TEACHER_DIM

BATCH = 16  # 4 batches of the 64 paraphrase rows (conftest)

pytestmark = pytest.mark.usefixtures("one_thread")


def congen_config(student, teacher, run_dir, **train) -> JobConfig:
    cfg = JobConfig.from_dict({
        "method": "congen", "student": str(student), "teacher": str(teacher), "run_dir": str(run_dir),
        "data": {"max_length": 32},
        "train": {"batch_size": BATCH, "lr": 2e-3, "warmup_ratio": 0.0, "epochs": 1, **train},
        "loss": {"queue_size": 64, "tau_teacher": 0.05, "tau_student": 0.07},
        "tracking": {"enabled": False},
    })
    return preflight(cfg)


def congen_batches(paraphrases, teacher_vectors) -> list[dict[str, np.ndarray]]:
    control, generalize = paraphrases
    return [{"idx": np.arange(i, i + BATCH), "text_control": control[i:i + BATCH],
             "text_generalize": generalize[i:i + BATCH], "teacher_control": teacher_vectors[i:i + BATCH]}
            for i in range(0, len(control), BATCH)]


def mean_loss(learner, batches, rounds) -> float:
    return float(np.mean([learner.train_step(b)["loss"] for _ in range(rounds) for b in batches]))


def test_congen_train_step_reduces_loss_and_projects_to_teacher_width(tiny_bert, tiny_teacher, teacher_vectors,
                                                                       paraphrases, tmp_path):
    cfg = congen_config(tiny_bert, tiny_teacher, tmp_path)
    batches = congen_batches(paraphrases, teacher_vectors)
    learner = DistillLearner(cfg, total_steps=10 * len(batches), teacher_dim=TEACHER_DIM, run_dir=tmp_path)
    assert learner.student.dim == TEACHER_DIM and learner.student.projection is not None

    first = mean_loss(learner, batches, rounds=1)  # the queue (K=64 = 4 batches) is full after this round
    early = mean_loss(learner, batches, rounds=1)
    mean_loss(learner, batches, rounds=6)
    late = mean_loss(learner, batches, rounds=1)
    assert math.isfinite(first)
    # CE(P_T, q) >= H(P_T), the teacher distribution's entropy (constant once the queue holds all 64 vectors), so
    # the loss cannot fall by much more than the student's share. Over seeds 0-5 it falls 4-12 % in 8 rounds (mean
    # 8 %; the dropout masks decide where in that range a seed lands), so at least 3 % is real learning.
    assert late < 0.97 * early, (early, late)
    metrics = learner.train_step(batches[0])
    assert {"loss", "lr", "grad_norm", "sentences_per_s"} <= metrics.keys()
    assert metrics["sentences_per_s"] > 0 and metrics["lr"] > 0


def test_bf16_precision_keeps_fp32_weights_and_follows_the_fp32_losses(tiny_bert, tiny_teacher, teacher_vectors,
                                                                        paraphrases, tmp_path):
    """train.precision=bf16: the student runs under bfloat16 autocast, the loss and the weights stay fp32, and the
    run follows the fp32 run step by step up to bf16 rounding (the same batches, seed and schedule)."""
    batches = congen_batches(paraphrases, teacher_vectors)
    losses = {}
    for precision in ("fp32", "bf16"):
        cfg = congen_config(tiny_bert, tiny_teacher, tmp_path / precision, precision=precision)
        learner = DistillLearner(cfg, total_steps=10 * len(batches), teacher_dim=TEACHER_DIM,
                                 run_dir=tmp_path / precision)
        losses[precision] = np.array([learner.train_step(b)["loss"] for _ in range(3) for b in batches])
        assert all(p.dtype == torch.float32 for p in learner.student.parameters())
    assert np.isfinite(losses["bf16"]).all()
    relative = np.abs(losses["bf16"] - losses["fp32"]) / np.abs(losses["fp32"])
    assert relative.max() < 0.02, relative
    # and bf16 is really on: the two runs are not bit-identical
    assert relative.max() > 0, relative


def test_sct_self_supervised_reduces_loss(tiny_bert, paraphrases, tmp_path):
    """SCT's target moves with the model (the reference is the student itself, dropout on), so its loss is noisy
    step to step. With the paper's temperatures it still falls steadily; the first step is left out because its
    queue holds the random init vectors (K = one batch: real reference vectors from step 2 on). The projector (a
    part of the loss module, not of the saved model) must be trained too."""
    cfg = preflight(JobConfig.from_dict({
        "method": "sct", "student": str(tiny_bert), "run_dir": str(tmp_path),
        "data": {"views": {"a": "none", "b": "caption"}, "max_length": 32},
        "train": {"batch_size": BATCH, "lr": 1e-4, "warmup_ratio": 0.0},
        "loss": {"queue_size": BATCH, "tau_teacher": 0.02, "tau_student": 0.03},
        "tracking": {"enabled": False},
    }))
    a, b = paraphrases
    batches = [{"idx": np.arange(i, i + BATCH), "text_a": a[i:i + BATCH], "text_b": b[i:i + BATCH]}
               for i in range(0, len(a), BATCH)]
    learner = DistillLearner(cfg, total_steps=100, run_dir=tmp_path)
    projector_before = [p.detach().clone() for p in learner.loss_module.projector.parameters()]
    losses = [learner.train_step(batch)["loss"] for _ in range(5) for batch in batches]  # 20 steps
    early, late = np.mean(losses[1:5]), np.mean(losses[-4:])
    assert late < 0.85 * early, losses
    assert any(not torch.equal(before, after.detach())
               for before, after in zip(projector_before, learner.loss_module.projector.parameters()))
    assert not any(name.startswith("projector") for name in learner.student.state_dict())


def test_checkpoint_round_trip_gives_the_identical_next_step(tiny_bert, tiny_teacher, teacher_vectors, paraphrases,
                                                             tmp_path):
    cfg = congen_config(tiny_bert, tiny_teacher, tmp_path)
    batches = congen_batches(paraphrases, teacher_vectors)
    original = DistillLearner(cfg, total_steps=20, teacher_dim=TEACHER_DIM, run_dir=tmp_path)
    for batch in batches[:3]:
        original.train_step(batch)
    path = original.save_checkpoint(epoch=0, batch_in_epoch=3)
    expected = original.train_step(batches[3])

    restored = DistillLearner(cfg, total_steps=20, teacher_dim=TEACHER_DIM, run_dir=tmp_path)
    fresh = restored.train_step(batches[3])  # a learner that did not resume computes something else
    restored = DistillLearner(cfg, total_steps=20, teacher_dim=TEACHER_DIM, run_dir=tmp_path)
    manifest = restored.load_checkpoint(path)
    assert (manifest["step"], manifest["batch_in_epoch"]) == (3, 3)
    got = restored.train_step(batches[3])
    assert got["loss"] == expected["loss"], (got["loss"], expected["loss"])
    assert got["lr"] == expected["lr"]
    assert fresh["loss"] != expected["loss"]
    for name, tensor in original.student.state_dict().items():
        assert torch.equal(tensor, restored.student.state_dict()[name]), name
    for name, tensor in original.loss_module.state_dict().items():  # queue contents included
        assert torch.equal(tensor, restored.loss_module.state_dict()[name]), name


def test_one_seed_gives_identical_steps_and_a_second_thread_changes_only_rounding(tiny_bert, tiny_teacher,
                                                                                 teacher_vectors, paraphrases,
                                                                                 tmp_path):
    """Where determinism is made: a learner's steps depend on the seed and the batches, not on the run; its torch
    thread count (``resources.learner.threads``) moves its losses by float rounding only. (The same job twice and on
    2 threads under Ray Train: tests/test_determinism.py.)"""
    cfg = congen_config(tiny_bert, tiny_teacher, tmp_path)
    batches = congen_batches(paraphrases, teacher_vectors) * 2  # 8 steps: the queue fills and turns over

    def losses(threads: int) -> list[float]:
        learner = DistillLearner(cfg, total_steps=len(batches), teacher_dim=TEACHER_DIM, run_dir=tmp_path,
                                 threads=threads)
        return [learner.train_step(batch)["loss"] for batch in batches]

    try:
        one, again, two = losses(1), losses(1), losses(2)
    finally:
        torch.set_num_threads(1)  # the learner set its own; one_thread restores the session's after the test
    assert one == again
    assert max(abs(a - b) for a, b in zip(one, two)) < 1e-3


def test_checkpoint_of_a_different_config_is_refused(tiny_bert, tiny_teacher, teacher_vectors, paraphrases, tmp_path):
    cfg = congen_config(tiny_bert, tiny_teacher, tmp_path)
    learner = DistillLearner(cfg, total_steps=20, teacher_dim=TEACHER_DIM, run_dir=tmp_path)
    learner.train_step(congen_batches(paraphrases, teacher_vectors)[0])
    path = learner.save_checkpoint(epoch=0, batch_in_epoch=1)

    other = congen_config(tiny_bert, tiny_teacher, tmp_path).with_overrides(["loss.tau_student=0.05"])
    other_learner = DistillLearner(other, total_steps=20, teacher_dim=TEACHER_DIM, run_dir=tmp_path)
    with pytest.raises(ckpt.CheckpointMismatchError, match=r"loss\.tau_student.*0\.07.*0\.05"):
        other_learner.load_checkpoint(path)


def test_a_checkpoint_continued_with_another_learning_rate_or_temperature(tiny_bert, tiny_teacher, teacher_vectors,
                                                                          paraphrases, tmp_path):
    """What a PBT trial does with another trial's checkpoint: keys ``may_differ`` accepts (the learning rate, a
    temperature) may differ; the schedule goes on from the checkpoint's step with the new peak learning rate, and
    the weights and queue are the checkpoint's. A key the checkpoint's state depends on (the queue size) is still
    refused."""
    from raydistill.config.sweep import pbt_mutable

    cfg = congen_config(tiny_bert, tiny_teacher, tmp_path, warmup_ratio=0.1)
    batches = congen_batches(paraphrases, teacher_vectors)
    donor = DistillLearner(cfg, total_steps=20, teacher_dim=TEACHER_DIM, run_dir=tmp_path)
    for batch in batches[:3]:
        donor.train_step(batch)
    path = donor.save_checkpoint(epoch=0, batch_in_epoch=3)

    other = cfg.with_overrides(["train.lr=5e-4", "loss.tau_student=0.05"])
    learner = DistillLearner(other, total_steps=20, teacher_dim=TEACHER_DIM, run_dir=tmp_path)
    with pytest.raises(ckpt.CheckpointMismatchError, match=r"train\.lr"):
        learner.load_checkpoint(path)  # without may_differ: refused, as any other config
    manifest = learner.load_checkpoint(path, may_differ=pbt_mutable)
    assert manifest["step"] == 3 and learner.step == 3
    for name, tensor in donor.loss_module.state_dict().items():  # the queue is the checkpoint's
        assert torch.equal(tensor, learner.loss_module.state_dict()[name]), name
    factor = learner.scheduler.lr_lambdas[0](3)  # past the 2 warm-up steps: (20 - 3) / (20 - 2)
    assert factor == pytest.approx(17 / 18)
    assert [group["lr"] for group in learner.optimizer.param_groups] == pytest.approx([5e-4 * factor] * 2)
    assert learner.train_step(batches[3])["lr"] == pytest.approx(5e-4 * factor)
    assert learner.loss_module.tau_student == 0.05

    bigger_queue = DistillLearner(cfg.with_overrides(["train.lr=5e-4", "loss.queue_size=128"]), total_steps=20,
                                  teacher_dim=TEACHER_DIM, run_dir=tmp_path)
    with pytest.raises(ckpt.CheckpointMismatchError, match=r"loss\.queue_size"):
        bigger_queue.load_checkpoint(path, may_differ=pbt_mutable)


def test_dev_evaluation_saves_a_sentence_transformers_best_model(tiny_bert, tiny_teacher, tmp_path):
    from sentence_transformers import SentenceTransformer

    cfg = congen_config(tiny_bert, tiny_teacher, tmp_path)
    learner = DistillLearner(cfg, total_steps=20, teacher_dim=TEACHER_DIM, run_dir=tmp_path)
    score = learner.evaluate_dev()
    assert -100 <= score <= 100
    assert learner.best_info() == {"best_step": 0, "best_stsb_dev": score}
    st_model = SentenceTransformer(str(tmp_path / "best"), device="cpu")
    texts = ["A man is playing a guitar.", "Two dogs run on the beach."]
    ours = learner.student.encode(texts)
    theirs = st_model.encode(texts, convert_to_numpy=True)
    assert theirs.shape == (2, TEACHER_DIM)
    np.testing.assert_allclose(theirs, ours, atol=1e-5)


def test_optimizer_groups_and_schedule():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    temperature = torch.nn.Module()
    temperature.register_parameter("logit_scale", torch.nn.Parameter(torch.tensor(1.0)))
    optimizer = build_optimizer([model, temperature], lr=1.0, weight_decay=0.01)
    decayed = [p for g in optimizer.param_groups if g["weight_decay"] > 0 for p in g["params"]]
    assert len(decayed) == 1 and decayed[0] is model[0].weight  # not biases, LayerNorm, or the temperature
    schedule = linear_schedule(optimizer, warmup_steps=2, total_steps=6)
    lrs = []
    for _ in range(6):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    assert lrs == pytest.approx([0.0, 0.5, 1.0, 0.75, 0.5, 0.25])


def test_group_in_process_fits_resumes_at_the_end_and_keeps_the_best(tiny_bert, tiny_teacher, teacher_vectors,
                                                                     paraphrases, tmp_path, capsys):
    cfg = congen_config(tiny_bert, tiny_teacher, tmp_path, epochs=2, eval_every=3, checkpoint_every=2, keep_last=2)
    control, generalize = paraphrases
    data = ArrayData({"idx": np.arange(len(control)), "text_control": control, "text_generalize": generalize,
                      "teacher_control": teacher_vectors}, seed=cfg.seed)
    group = LearnerGroup(cfg, get_method("congen"), run_dir=tmp_path, teacher_dim=TEACHER_DIM)
    assert group.total_steps(data) == 8
    seen_steps: list[int] = []
    summary = group.fit(data, on_metrics=lambda m, step: seen_steps.append(step))
    assert seen_steps == list(range(1, 9))
    assert summary["steps"] == 8 and summary["restarts"] == 0 and summary["resumed_from"] is None
    assert 0 <= summary["best_step"] <= 8 and (tmp_path / "best" / "modules.json").is_file()
    evaluated = [row["step"] for row in summary["history"] if "stsb_dev" in row]
    assert evaluated == [3, 4, 6, 8]  # every 3 steps and at each epoch end (4, 8)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-0000006", "step-0000008"]
    out = capsys.readouterr().out
    assert "[congen] step 8/8 (100%)" in out and "dev " in out

    again = LearnerGroup(cfg, get_method("congen"), run_dir=tmp_path, teacher_dim=TEACHER_DIM)
    more_steps: list[int] = []
    summary2 = again.fit(data, on_metrics=lambda m, step: more_steps.append(step))
    assert summary2["resumed_from"] == 8 and more_steps == []  # a finished run is not trained again
    assert summary2["best_stsb_dev"] == summary["best_stsb_dev"]


def test_group_starts_the_queue_from_teacher_vectors_of_sampled_training_rows(tiny_bert, tiny_teacher,
                                                                           teacher_vectors, paraphrases, tmp_path,
                                                                           capsys):
    """loss.queue_init teacher (ConGen's default): before step 1 the queue holds the cached teacher vectors of K
    training rows drawn with the job seed, with those rows' group ids; a resumed run keeps its checkpoint's queue."""
    control, generalize = paraphrases
    groups = np.arange(len(control)) // 2  # pairs of rows share a group, as two captions of one image
    data = ArrayData({"idx": np.arange(len(control)), "group": groups, "text_control": control,
                      "text_generalize": generalize, "teacher_control": teacher_vectors}, seed=0)
    cfg = preflight(congen_config(tiny_bert, tiny_teacher, tmp_path).with_overrides(["loss.queue_size=32"]))
    assert with_method_defaults(cfg).loss["queue_init"] == "teacher"
    group = LearnerGroup(cfg, get_method("congen"), run_dir=tmp_path, teacher_dim=TEACHER_DIM)
    hook, = [hook for hook in group.spec.hooks if isinstance(hook, TeacherQueues)]
    ((rows, row_groups),), _, _ = hook.fresh_start_sample(group.spec, cfg, data, None)  # every worker starts from it
    assert rows.shape == (32, TEACHER_DIM)
    matches = np.argmax(rows @ teacher_vectors.T, axis=1)  # each queue row is one training row's teacher vector
    np.testing.assert_allclose(rows, teacher_vectors[matches], atol=1e-6)
    assert len(set(matches.tolist())) == 32
    assert row_groups.tolist() == groups[matches].tolist()
    group.fit(data)
    assert "queue_init teacher: 1 queue(s) of K=32 start from the teacher vectors of 32 training sentences " \
           "(control view); rows filled [32]" in capsys.readouterr().out
    # A resumed run keeps its checkpoint's queue: nothing is sampled for it.
    LearnerGroup(cfg, get_method("congen"), run_dir=tmp_path, teacher_dim=TEACHER_DIM).fit(data)
    assert "queue_init teacher" not in capsys.readouterr().out


def test_group_fits_a_least_squares_projection_before_the_first_step(tiny_bert, tiny_teacher, teacher_vectors,
                                                                     paraphrases, tmp_path, capsys):
    """student_projection_init least_squares: on a fresh start the group fits the student's new projection to the
    teacher vectors of the data, so step 1 already scores the student in the teacher's space; a resumed run keeps
    its checkpoint's projection."""
    from raydistill.models import BiEncoder

    control, generalize = paraphrases
    data = ArrayData({"idx": np.arange(len(control)), "text_control": control, "text_generalize": generalize,
                      "teacher_control": teacher_vectors}, seed=0)

    def fitted_cosine(cfg) -> float:
        learner = DistillLearner(cfg, total_steps=1, teacher_dim=TEACHER_DIM, run_dir=tmp_path)
        vectors = learner.student.encode(list(control), normalize=True)
        return float(np.mean(np.sum(vectors * teacher_vectors, axis=1)))

    default_cfg = congen_config(tiny_bert, tiny_teacher, tmp_path / "default")
    lsq_cfg = preflight(JobConfig.from_dict({**default_cfg.to_dict(), "student_projection_init": "least_squares",
                                   "run_dir": str(tmp_path / "lsq"), "train": {**default_cfg.to_dict()["train"],
                                                                               "lr": 1e-9}}))
    group = LearnerGroup(lsq_cfg, get_method("congen"), run_dir=tmp_path / "lsq", teacher_dim=TEACHER_DIM)
    group.fit(data)
    out = capsys.readouterr().out
    assert "projection fitted to 64 teacher vectors (control view) by least squares" in out
    # lr ~0: the saved model is the fitted start; its vectors point at the teacher's far better than the default's
    fitted = BiEncoder.from_pretrained(str(tmp_path / "lsq" / "best"))
    lsq_cosine = float(np.mean(np.sum(fitted.encode(list(control), normalize=True) * teacher_vectors, axis=1)))
    assert lsq_cosine > 0.5 and lsq_cosine > fitted_cosine(default_cfg) + 0.3, lsq_cosine

    LearnerGroup(lsq_cfg, get_method("congen"), run_dir=tmp_path / "lsq", teacher_dim=TEACHER_DIM).fit(data)
    assert "projection fitted" not in capsys.readouterr().out  # resumed: the checkpoint's projection stands


def test_group_in_process_resumes_mid_epoch_exactly(tiny_bert, tiny_teacher, teacher_vectors, paraphrases,
                                                    tmp_path):
    """Train's local mode: a run that crashes after step 3 (checkpoint at 2, mid-epoch) and is started again trains
    the uninterrupted run's batches with its losses: data position, RNG, AdamW, schedule and queue come back."""
    control, generalize = paraphrases
    data = ArrayData({"idx": np.arange(len(control)), "text_control": control, "text_generalize": generalize,
                      "teacher_control": teacher_vectors}, seed=7)

    def run(run_dir, crash_after: int | None = None):
        cfg = congen_config(tiny_bert, tiny_teacher, run_dir, epochs=2, eval_every=100, checkpoint_every=2)

        def crash(metrics, step):
            if step == crash_after:
                raise KeyboardInterrupt  # after step 3, before any checkpoint of it
        group = LearnerGroup(cfg, get_method("congen"), run_dir=run_dir, teacher_dim=TEACHER_DIM)
        if crash_after is not None:
            with pytest.raises(KeyboardInterrupt):
                group.fit(data, on_metrics=crash)
            group = LearnerGroup(cfg, get_method("congen"), run_dir=run_dir, teacher_dim=TEACHER_DIM)
        return group.fit(data)

    reference = run(tmp_path / "reference")
    resumed = run(tmp_path / "resumed", crash_after=3)
    assert resumed["resumed_from"] == 2 and reference["resumed_from"] is None

    def per_step(summary, key):
        return [row[key] for row in summary["history"] if "loss" in row]

    assert [row["step"] for row in resumed["history"] if "loss" in row] == list(range(1, 9))
    assert per_step(resumed, "batch_crc32") == per_step(reference, "batch_crc32")
    np.testing.assert_allclose(per_step(resumed, "loss"), per_step(reference, "loss"), atol=1e-5)


def test_a_data_parallel_step_sends_one_control_collective(tiny_bert, tiny_teacher, teacher_vectors, paraphrases,
                                                           tmp_path, monkeypatch):
    """With DDP a step sends one collective of its own (besides DDP's gradient all-reduce, which torch's reducer
    runs): the workers' problems, rank 0's stop / report flags, the loss and every rank's batch crc in one
    all-reduce. One process stands in for the workers (a gloo group of one): the calls are what every rank makes."""
    import torch.distributed as dist

    calls: list[str] = []
    for name in ("all_reduce", "broadcast", "all_gather", "all_gather_object", "barrier", "reduce", "gather"):
        original = getattr(dist, name)
        monkeypatch.setattr(dist, name, lambda *a, _name=name, _original=original, **k: (
            calls.append(_name), _original(*a, **k))[1])
    cfg = congen_config(tiny_bert, tiny_teacher, tmp_path)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        learner = DistillLearner(cfg, total_steps=8, teacher_dim=TEACHER_DIM, run_dir=tmp_path, rank=0, world_size=2)
        assert learner.enable_ddp()
        calls.clear()
        batch = congen_batches(paraphrases, teacher_vectors)[0]
        metrics = learner.train_step(batch, {"stop": True, "report": False})
    finally:
        dist.destroy_process_group()
    assert calls == ["all_reduce"]
    assert learner.signals == {"stop": True, "report": False}
    assert math.isfinite(metrics["loss"]) and len(learner.history[-1]["batch_crc32_by_rank"]) == 2
