"""Resume safety of the learner and the in-process LearnerGroup: non-finite gradients or teacher vectors stop the
run at the step that meets them, with no checkpoint of broken weights; a damaged newest checkpoint makes the resume
fall back to the previous one, saying so; a stop request (SIGTERM) checkpoints at the next step boundary. The
Ray-level versions (a real SIGTERM to a training job, a frozen learner actor) are in tests/test_faults.py.

On Ray Train workers, a learner's error ends the run once, without a restart: by default with a NaN teacher vector
in one of two workers' batches (both workers stop at that step). A diverged run (NaN loss) on one worker is marked
``e2e``: by default a NaN loss that fails its run without a retry is tests/test_tune.py's diverging trial
(``test_asha_stops_the_wrecked_trial_early_and_the_nan_trial_fails``), and a worker's error without a restart is the
two-worker test here."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
import torch

from raydistill.runtime.engine import checkpoint as ckpt
from raydistill.runtime.engine.learner import DistillLearner
from raydistill.data.arrays import ArrayData
from raydistill.runtime.engine.learner_group import LearnerGroup, PreemptedError
from raydistill.methods import get_method

# The tiny ConGen set-up of the learner tests (fixtures in conftest.py), not a copy of it.
from tests import ray_fixtures
from tests.distill_fixtures import quick_train_polls
from tests.test_learner import BATCH, TEACHER_DIM, congen_config

pytest_plugins = ["tests.reliability_log"]
ray_session = ray_fixtures.ray_session  # the session-wide Ray fixture, seen by this module's tests
pytestmark = pytest.mark.usefixtures("one_thread")


def congen_data(cfg, paraphrases, teacher_vectors) -> ArrayData:
    control, generalize = paraphrases
    return ArrayData({"idx": np.arange(len(control)), "text_control": control, "text_generalize": generalize,
                      "teacher_control": teacher_vectors}, seed=cfg.seed)


def first_batch(paraphrases, teacher_vectors) -> dict[str, np.ndarray]:
    control, generalize = paraphrases
    return {"idx": np.arange(BATCH), "text_control": control[:BATCH], "text_generalize": generalize[:BATCH],
            "teacher_control": np.array(teacher_vectors[:BATCH])}


def test_nonfinite_gradient_or_teacher_vector_stops_the_run_without_a_broken_checkpoint(
        tiny_bert, tiny_teacher, teacher_vectors, paraphrases, tmp_path, reliability):
    cfg = congen_config(tiny_bert, tiny_teacher, tmp_path)
    learner = DistillLearner(cfg, total_steps=10, teacher_dim=TEACHER_DIM, run_dir=tmp_path)
    batch = first_batch(paraphrases, teacher_vectors)
    learner.train_step(batch)
    learner.save_checkpoint(epoch=0, batch_in_epoch=1)
    before = {name: tensor.clone() for name, tensor in learner.student.state_dict().items()}
    messages = {}

    # 1. A finite loss whose backward pass overflows: one weight's gradient becomes inf (then NaN after clipping).
    weight = next(p for name, p in learner.student.named_parameters() if name.endswith("query.weight"))
    hook = weight.register_hook(lambda grad: torch.full_like(grad, float("inf")))
    with pytest.raises(FloatingPointError) as caught:
        learner.train_step(batch)
    hook.remove()
    messages["grad"] = str(caught.value)
    assert "gradient norm is" in messages["grad"] and "at step 2" in messages["grad"]
    assert "query.weight" in messages["grad"] and "the weights were not updated" in messages["grad"]
    after = learner.student.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before), "the optimiser stepped on bad gradients"
    assert learner.step == 1

    # 2. A NaN gradient.
    hook = weight.register_hook(lambda grad: torch.full_like(grad, float("nan")))
    with pytest.raises(FloatingPointError, match="gradient norm is nan at step 2"):
        learner.train_step(batch)
    hook.remove()

    # 3. A NaN teacher vector in the batch (a corrupt cache row).
    poisoned = dict(batch, teacher_control=batch["teacher_control"].copy())
    poisoned["teacher_control"][3, 7] = np.nan
    with pytest.raises(FloatingPointError) as caught:
        learner.train_step(poisoned)
    messages["teacher"] = str(caught.value)
    assert messages["teacher"].startswith("congen: non-finite teacher vectors in column teacher_control at step 2 "
                                          "(1 of 16 rows, first at row 3)")

    # 4. Weights that did become non-finite are never checkpointed; the last good checkpoint stays the newest.
    with torch.no_grad():
        weight.view(-1)[0] = float("nan")
    with pytest.raises(FloatingPointError, match="not checkpointing step 1: non-finite student weights in .*query"):
        learner.save_checkpoint(epoch=0, batch_in_epoch=1)
    _, state = ckpt.load_checkpoint(ckpt.latest_checkpoint(tmp_path), config=cfg)
    assert all(bool(torch.isfinite(t).all()) for t in state["student"].values() if t.is_floating_point())
    reliability.record(
        "training", "nonfinite-grad",
        input="an inf gradient on one weight (finite loss); a NaN gradient; a NaN in one teacher vector of a batch; "
              "a NaN weight at checkpoint time",
        did="each stopped the run with FloatingPointError naming the step (and the parameter or rows); the "
            "optimiser did not step, so the weights stayed finite; a checkpoint of non-finite weights was refused, "
            "leaving the previous one the newest",
        message=messages["grad"] + " / " + messages["teacher"],
        lost="the run stops at that step; the last checkpoint is finite and resumable")


def test_group_resume_falls_back_past_a_damaged_checkpoint_and_says_so(tiny_bert, tiny_teacher, teacher_vectors,
                                                                       paraphrases, tmp_path, capsys):
    cfg = congen_config(tiny_bert, tiny_teacher, tmp_path, checkpoint_every=1, keep_last=3, eval_every=100)
    data = congen_data(cfg, paraphrases, teacher_vectors)
    first = LearnerGroup(cfg, get_method("congen"), run_dir=tmp_path, teacher_dim=TEACHER_DIM)
    stop_after = {"step": 4}

    def stop_at(metrics, step):
        if step == stop_after["step"]:
            raise KeyboardInterrupt  # a crash after step 4, before its checkpoint

    with pytest.raises(KeyboardInterrupt):
        first.fit(data, on_metrics=stop_at)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-0000001", "step-0000002", "step-0000003"]
    damaged = ckpt.checkpoint_root(tmp_path) / "step-0000003" / "optimizer.pt"
    damaged.write_bytes(damaged.read_bytes()[:100])
    capsys.readouterr()

    again = LearnerGroup(cfg, get_method("congen"), run_dir=tmp_path, teacher_dim=TEACHER_DIM)
    steps: list[int] = []
    summary = again.fit(data, on_metrics=lambda metrics, step: steps.append(step))
    out = capsys.readouterr().out
    assert f"[congen] checkpoint damaged: {damaged}: truncated: 100 bytes" in out
    assert "falling back to the previous good checkpoint step-0000002" in out
    assert summary["resumed_from"] == 2 and steps == [3, 4]


def test_stop_request_checkpoints_at_the_next_step_boundary(tiny_bert, tiny_teacher, teacher_vectors, paraphrases,
                                                            tmp_path, capsys):
    """The in-process path of SIGTERM: the handler run_distillation installs only calls request_stop."""
    from raydistill.runtime.jobs.distill import _StopOnSigterm

    cfg = congen_config(tiny_bert, tiny_teacher, tmp_path, checkpoint_every=100, eval_every=100)
    data = congen_data(cfg, paraphrases, teacher_vectors)
    group = LearnerGroup(cfg, get_method("congen"), run_dir=tmp_path, teacher_dim=TEACHER_DIM)
    sigterm = _StopOnSigterm()
    sigterm.install()
    try:
        def terminate_at_step_2(metrics, step):
            if step == 2:
                os.kill(os.getpid(), signal.SIGTERM)

        with pytest.raises(PreemptedError) as caught:
            group.fit(data, on_metrics=terminate_at_step_2)
    finally:
        sigterm.restore()
    assert caught.value.step == 2
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-0000002"]
    assert ckpt.read_manifest(ckpt.latest_checkpoint(tmp_path))["extra"]["preempted"] is True
    assert "stop requested (SIGTERM): stopped after step 2 with checkpoint step-0000002" in capsys.readouterr().out

    steps: list[int] = []
    summary = LearnerGroup(cfg, get_method("congen"), run_dir=tmp_path, teacher_dim=TEACHER_DIM).fit(
        data, on_metrics=lambda metrics, step: steps.append(step))
    assert summary["resumed_from"] == 2 and steps == [3, 4]  # no step redone


@pytest.mark.ray
@pytest.mark.e2e
def test_a_diverged_run_on_a_train_worker_fails_once_without_a_restart(ray_session, tiny_bert,
                                                                       tiny_teacher, teacher_vectors, paraphrases,
                                                                       tmp_path):
    """A NaN loss on a Ray Train worker ends the run with the learner's FloatingPointError: the worker returns it and
    the driver raises it, so Train's FailureConfig does not restart the worker group to diverge again."""
    cfg = congen_config(tiny_bert, tiny_teacher, tmp_path, lr=1e6, eval_every=100)
    cfg = cfg.with_overrides(["resources.learner.num_learners=1", "resources.learner.num_cpus=1",
                              "resources.learner.threads=1"])
    data = congen_data(cfg, paraphrases, teacher_vectors)
    starts: list[int] = []
    group = LearnerGroup(cfg, get_method("congen"), run_dir=tmp_path, teacher_dim=TEACHER_DIM)
    with pytest.raises(FloatingPointError, match=r"loss is (nan|inf) at step"), quick_train_polls():
        group.fit(data, on_event=lambda kind, info, step: starts.append(step) if kind == "start" else None)
    assert starts == [0]  # one start of the worker group: no restart


@pytest.mark.ray
def test_a_bad_batch_on_one_of_two_workers_stops_both_at_the_same_step(ray_session, tiny_bert,
                                                                       tiny_teacher, teacher_vectors, paraphrases,
                                                                       tmp_path):
    """Only one worker's batch holds a NaN teacher vector: the workers agree before DDP's collectives, so both stop
    at that step with the error of the worker that met it. (Measured before the workers agreed: the worker that
    met it raised alone, the other waited in DDP's collective, and the run had not ended after 10 minutes.)"""
    cfg = congen_config(tiny_bert, tiny_teacher, tmp_path, eval_every=100)
    # A random queue start: the poisoned row must reach one worker's batch only, not every worker's queue.
    cfg = cfg.with_overrides(["resources.learner.num_learners=2", "resources.learner.num_cpus=0.5",
                              "resources.learner.threads=1", "loss.queue_init=random"])
    poisoned = np.array(teacher_vectors, dtype=np.float32, copy=True)
    poisoned[5, 0] = np.nan
    data = congen_data(cfg, paraphrases, poisoned)
    starts: list[int] = []
    group = LearnerGroup(cfg, get_method("congen"), run_dir=tmp_path, teacher_dim=TEACHER_DIM)
    with pytest.raises(FloatingPointError, match=r"worker [01]: congen: non-finite teacher vectors in column "
                                                 r"teacher_control at step [12] \(1 of 16 rows"), quick_train_polls():
        group.fit(data, on_event=lambda kind, info, step: starts.append(step) if kind == "start" else None)
    assert starts == [0]
