"""ConGen + CKD (method ``congen-ckd``): the mix is its two parent losses on one queue, the engine shares that queue
through the existing hook, a ConGen config runs it with ``--set method=congen-ckd``, and it trains end to end."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from raydistill.config.job import ConfigError, JobConfig
from raydistill.objectives import CKDLoss, ConGenCKDLoss, ConGenLoss, InstanceQueue
from raydistill.shipped import shipped_config

B, D, K = 4, 6, 10  # K not a multiple of B: the ring wraps mid-batch
TAU_T, TAU_S, TEMPERATURE = 0.05, 0.07, 0.2


def leaf(rows: int, dim: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, dim, generator=torch.Generator().manual_seed(seed)).requires_grad_()


def grad(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.grad if tensor.grad is not None else torch.zeros_like(tensor)


def step_inputs(step: int) -> dict[str, torch.Tensor]:
    """One batch's features: fresh leaves each call, so each loss gets its own gradients."""
    return {"student_control": leaf(B, D, 100 + step), "student_generalize": leaf(B, D, 200 + step),
            "teacher": leaf(B, D, 300 + step),
            "group": torch.tensor([step, 7, 7, 50 + step])}  # rows 1 and 2 are siblings; group 7 recurs each step


def parents(queue_rows: torch.Tensor, queue_groups: torch.Tensor) -> tuple[ConGenLoss, CKDLoss]:
    congen = ConGenLoss(queue_size=K, tau_teacher=TAU_T, tau_student=TAU_S, dim=D)
    ckd = CKDLoss(queue_size=K, temperature=TEMPERATURE, dim=D)
    for loss in (congen, ckd):
        loss.queue.init_from(queue_rows, queue_groups)
    return congen, ckd


@pytest.mark.parametrize("weight", [0.0, 0.3, 1.0])
def test_the_mix_is_the_weighted_sum_of_its_parents_on_the_same_queue(weight):
    """Step after step (the queue advancing), loss, parts and student gradients are w·CKD + (1−w)·ConGen of the
    parent losses run on their own copies of the queue: at w = 0 ConGen's alone, at w = 1 CKD's alone."""
    queue_rows = torch.randn(K - 3, D, generator=torch.Generator().manual_seed(1))  # partly filled: it grows too
    queue_groups = torch.tensor([7, 1, 2, 3, 7, 5, 6])
    congen, ckd = parents(queue_rows, queue_groups)
    mix = ConGenCKDLoss(queue_size=K, tau_teacher=TAU_T, tau_student=TAU_S, dim=D, ckd_weight=weight,
                        ckd_temperature=TEMPERATURE)
    mix.queue.init_from(queue_rows, queue_groups)

    for step in range(3):
        mixed_in, congen_in, ckd_in = step_inputs(step), step_inputs(step), step_inputs(step)
        out = mix(mixed_in)
        congen_out = congen(congen_in)
        ckd_out = ckd({"student": ckd_in["student_control"], "teacher": ckd_in["teacher"],
                       "group": ckd_in["group"]})
        expected = weight * ckd_out.loss + (1 - weight) * congen_out.loss
        torch.testing.assert_close(out.loss, expected.detach())
        assert out.parts["ckd"] == pytest.approx(float(ckd_out.loss.detach()), rel=1e-6)
        assert out.parts["congen"] == pytest.approx(float(congen_out.loss.detach()), rel=1e-6)
        assert out.parts["con"] == pytest.approx(congen_out.parts["con"], rel=1e-6)
        assert out.parts["scale"] == pytest.approx(1 / TEMPERATURE, rel=1e-6)

        for loss in (out.loss, ckd_out.loss, congen_out.loss):
            loss.backward()
        for name in ("student_control", "student_generalize"):
            expected_grad = weight * grad(ckd_in[name]) + (1 - weight) * grad(congen_in[name])
            torch.testing.assert_close(grad(mixed_in[name]), expected_grad, rtol=1e-5, atol=1e-7)
        assert mixed_in["teacher"].grad is None  # the teacher side is a constant

        # One enqueue per step, the same as each parent's: the same rows, groups and fill.
        torch.testing.assert_close(mix.queue.ordered(), congen.queue.ordered())
        torch.testing.assert_close(mix.queue.ordered(), ckd.queue.ordered())
        assert mix.queue.row_groups().tolist() == ckd.queue.row_groups().tolist()
        assert len(mix.queue) == min(K, K - 3 + (step + 1) * B)


def test_gradients_reach_the_student_and_the_learned_scale_only():
    mix = ConGenCKDLoss(queue_size=K, dim=D, queue_init="random")
    features = step_inputs(0)
    mix(features).loss.backward()
    for name in ("student_control", "student_generalize"):
        assert features[name].grad is not None and float(features[name].grad.abs().sum()) > 0
    assert features["teacher"].grad is None
    assert [name for name, p in mix.named_parameters() if p.requires_grad] == ["ckd.scale.log_scale"]
    assert float(mix.ckd.scale.log_scale.grad) != 0.0

    at_one = ConGenCKDLoss(queue_size=K, dim=D, queue_init="random", ckd_weight=1.0)
    features = step_inputs(0)
    at_one(features).loss.backward()
    # CKD reads the control view only: at w = 1 the generalisation view learns nothing.
    assert float(grad(features["student_generalize"]).abs().sum()) == 0


def test_one_queue_in_the_state_and_for_the_engine():
    """The two terms read the loss's one ``queue``: a checkpoint holds it once, the TeacherQueues hook finds it, and
    the runtime's shared-queue mirror replaces it (no engine code knows this method)."""
    from raydistill.methods import get_method
    from raydistill.methods.hooks import TeacherQueues

    mix = ConGenCKDLoss(queue_size=K, dim=D)
    assert sorted(name for name in mix.state_dict() if name.endswith("embeddings")) == ["queue.embeddings"]
    spec = get_method("congen-ckd")
    hook, = [hook for hook in spec.hooks if isinstance(hook, TeacherQueues)]
    assert hook.queues(mix) == [mix.queue]

    cfg = JobConfig.from_yaml(shipped_config("congen"), ["method=congen-ckd", "loss.queue_size=16"])
    mirror = InstanceQueue(16, D)
    built = spec.build_loss(cfg, student_dim=D, teacher_dim=D, queues=[mirror])
    assert built.queue is mirror and hook.queues(built) == [mirror]
    built(step_inputs(0)).loss.backward()
    assert len(mirror) == B  # the mirror advanced once
    mix.load_state_dict(ConGenCKDLoss(queue_size=K, dim=D).state_dict())


def test_a_bad_mix_weight_is_refused():
    with pytest.raises(ValueError, match="ckd_weight must be in \\[0, 1\\]"):
        ConGenCKDLoss(queue_size=K, dim=D, ckd_weight=1.5)


# ------------------------------------------------------------------------------------------------------------------
# The method and its config


def test_the_congen_config_runs_the_mix_with_one_override():
    from raydistill.methods import validate_method

    cfg = validate_method(JobConfig.from_yaml(shipped_config("congen"), ["method=congen-ckd"]))
    assert cfg.method == "congen-ckd"
    assert cfg.loss.in_use() == {"ckd_weight": 0.5, "queue_size": 16384, "queue_init": "teacher",
                                 "tau_teacher": 0.05, "tau_student": 0.07,
                                 "ckd_temperature": round(math.exp(-1.0), 6), "ckd_learnable_temperature": True}
    assert dict(cfg.data.views) == {"control": "none", "generalize": "delete:0.1"}
    weighted = validate_method(JobConfig.from_yaml(shipped_config("congen"),
                                                   ["method=congen-ckd", "loss.ckd_weight=0.25"]))
    assert weighted.loss.ckd_weight == 0.25


@pytest.mark.parametrize("override, field, pattern", [
    ("loss.ckd_weight=1.5", "loss.ckd_weight", r"1\.5 must be in \[0, 1\]"),
    ("loss.ckd_temperature=1.0", "loss.ckd_temperature", r"cannot start at its clamp bound"),
    ("loss.temperature=0.1", "loss.temperature", r"unknown field for the congen-ckd loss"),
])
def test_a_bad_loss_setting_is_refused_naming_the_field(override, field, pattern):
    from raydistill.methods import validate_method

    with pytest.raises(ConfigError, match=rf"field '{field}'.*{pattern}"):
        validate_method(JobConfig.from_yaml(shipped_config("congen"), ["method=congen-ckd", override]))


def test_the_method_trains_end_to_end_in_process(one_thread, tiny_bert, tiny_teacher, teacher_vectors, paraphrases,
                                                 tmp_path, capsys):
    """The learner group of the engine, one learner in this process: the queue starts from teacher vectors (the
    TeacherQueues hook), both terms are logged, the loss is finite and the student learns."""
    from raydistill.data.arrays import ArrayData
    from raydistill.methods import get_method
    from raydistill.runtime.engine.learner_group import LearnerGroup
    from raydistill.runtime.engine.preflight import preflight
    from tests.conftest import TEACHER_DIM

    cfg = preflight(JobConfig.from_dict({
        "method": "congen-ckd", "student": str(tiny_bert), "teacher": str(tiny_teacher), "run_dir": str(tmp_path),
        "data": {"max_length": 32},
        "train": {"batch_size": 16, "lr": 2e-3, "warmup_ratio": 0.0, "epochs": 3, "eval_every": 1000,
                  "checkpoint_every": 1000},
        "loss": {"queue_size": 32},
        "tracking": {"enabled": False},
    }))
    control, generalize = paraphrases
    data = ArrayData({"idx": np.arange(len(control)), "text_control": control, "text_generalize": generalize,
                      "teacher_control": teacher_vectors}, seed=cfg.seed)
    summary = LearnerGroup(cfg, get_method("congen-ckd"), run_dir=tmp_path, teacher_dim=TEACHER_DIM).fit(data)
    assert "queue_init teacher: 1 queue(s) of K=32" in capsys.readouterr().out
    rows = [row for row in summary["history"] if "loss" in row]
    assert summary["steps"] == len(rows) == 12
    assert all(math.isfinite(row["loss"]) and {"loss_ckd", "loss_congen"} <= row.keys() for row in rows)
    for row in rows:
        assert row["loss"] == pytest.approx(0.5 * row["loss_ckd"] + 0.5 * row["loss_congen"], rel=1e-5)
    # The first epoch's mean loss against the last's (the same 4 batches): it fell 3-7 % over seeds 0-3 and 1000.
    first, last = np.mean([r["loss"] for r in rows[:4]]), np.mean([r["loss"] for r in rows[-4:]])
    assert last < first, (first, last)
