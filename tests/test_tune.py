"""`raydistill tune` end to end on tiny random models: real local Ray Tune, ASHA, the teacher cache, MLflow (sqlite).

One sweep of four ConGen trials (a grid over the learning rate, run one at a time so ASHA's decisions are fixed),
each trial in Train's local mode in its own (reused) process (``num_learners: 0``):

    lr 1e-3   learns a little                       -> first at every rung, never stopped; its process is SIGKILLed
                                                       at its first checkpoint and Tune restarts it from there
    lr 0.5    wrecks the tiny student (dev ~3 vs ~34) -> below the rung's median at the first evaluation: stopped
    lr 3e-4   learns a little                       -> runs on (or is stopped at a later rung)
    lr 1e6    NaN loss at step 2                    -> the learner raises FloatingPointError: trial failed

Evaluations reach Tune with ``ray.tune.report`` and their checkpoints live in the sweep's Tune storage. The driver
is interrupted (SIGINT, as Ctrl-C) at the third trial's first evaluation (at its second, ASHA's rung would stop it:
it is below the first trial's best), and the sweep is continued with `raydistill tune --resume`: the trial must come
back from its newest checkpoint. Most tests below check the result of that one interrupted-and-resumed sweep.

The same four trials run again on Ray Train workers (the default, ``num_learners: 1``; ``worker_sweep``),
interrupted at the third trial's first evaluation and resumed: reports and checkpoints travel otherwise there
(``ray.train.report`` forwarded by ``EvalReportsToTune``; Train checkpoints in the sweep's Tune storage), and ASHA,
the NaN trial, the MLflow child runs and the best trial's export are checked on both sweeps (``each_sweep``).

Two trials side by side on two CPUs are marked ``e2e`` (``pytest -m e2e``): by default the CPU arithmetic that lets
them (a CPU held back for Ray Data only when a trial can miss the shared teacher pass) is checked where it is made,
by the trial-concurrency tests below.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from raydistill.cli import main as cli_main
from raydistill.methods import job_methods
from raydistill.runtime.engine.preflight import preflight
from tests.ray_fixtures import ray_session  # noqa: F401 - the session-wide Ray fixture

pytest_plugins = ["tests.reliability_log"]

ROWS, BATCH, EVAL_EVERY = 128, 16, 2  # 8 steps, dev evaluations at steps 2, 4, 6, 8
LRS = [1e-3, 0.5, 3e-4, 1e6]

try:
    from ray.tune import Callback
except ImportError:  # pragma: no cover - ray[tune] is a dependency
    Callback = object


class InterruptAt(Callback):
    """Sends the driver SIGINT (Ctrl-C) when the trial with learning rate ``lr`` reports step ``step``; disarmed
    afterwards, also when Tune restores it with the rest of the run config on resume."""

    armed = True

    def __init__(self, lr: float, step: int):
        self.lr, self.step = lr, step

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if InterruptAt.armed and trial.config.get("train.lr") == self.lr and result.get("step", 0) >= self.step:
            InterruptAt.armed = False
            os.kill(os.getpid(), signal.SIGINT)


class KillTrialProcessAt(Callback):
    """SIGKILLs the process of the trial with learning rate ``lr`` (as the OOM killer would) when Tune has registered
    its first checkpoint; the trial is then held in ``ray.tune.report``, so the checkpoint is its newest. Disarmed
    afterwards."""

    armed = True
    killed: dict = {}

    def __init__(self, lr: float):
        self.lr = lr

    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info):
        if KillTrialProcessAt.armed and trial.config.get("train.lr") == self.lr:
            KillTrialProcessAt.armed = False
            KillTrialProcessAt.killed = {"pid": trial.last_result["pid"], "step": trial.last_result["step"]}
            os.kill(trial.last_result["pid"], signal.SIGKILL)


class RecordResults(Callback):
    """Keeps every result Tune received, per learning rate, in the driver."""

    results: dict[float, list[dict]] = {}

    def on_trial_result(self, iteration, trials, trial, result, **info):
        RecordResults.results.setdefault(trial.config.get("train.lr"), []).append(dict(result))


class RecordCheckpoints(Callback):
    """The manifest of every checkpoint Tune persisted, per trial, read when Tune registered it (the sweep's end
    deletes those of finished trials)."""

    manifests: dict[str, list[dict]] = {}

    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info):
        manifest = json.loads((Path(checkpoint.path) / "manifest.json").read_text())
        RecordCheckpoints.manifests.setdefault(trial.trial_id, []).append(manifest)


@pytest.fixture(autouse=True)
def one_thread(one_thread):
    yield


def write_space(path, student, teacher, root, lrs=LRS, tau_teacher=None, num_learners=1, scheduler=None,
                concurrent=1, eval_every=EVAL_EVERY, keep_checkpoints=4):
    space = {
        "student": "tiny",
        "description": "test space",
        "search": {"num_samples": 1, "algorithm": "random", "seed": 0, "max_concurrent_trials": concurrent},
        "scheduler": scheduler or {"grace_evals": 1, "reduction_factor": 2},
        "resources_per_trial": {"num_cpus": 1, "num_gpus": 0, "num_learners": num_learners,
                                "keep_checkpoints": keep_checkpoints},
        "methods": {"congen": {
            "base": {
                "cache_dir": str(root / "embeddings"),
                "data": {"corpus": "flickr", "max_sentences": ROWS, "max_length": 32, "teacher_max_length": 32},
                "train": {"batch_size": BATCH, "lr": 1e-3, "epochs": 1, "eval_every": eval_every,
                          "checkpoint_every": 1, "keep_last": 1},
                "loss": {"queue_size": 64, "tau_teacher": 0.05, "tau_student": 0.07},
                "resources": {"num_cpus": 2, "teacher": {"num_actors": 1, "num_cpus": 1, "threads": 1,
                                                         "batch_size": 64}},
                "tracking": {"tracking_uri": f"sqlite:///{root / 'mlflow.db'}"},
            },
            "space": {"train.lr": {"grid": lrs},
                      **({"loss.tau_teacher": {"choice": tau_teacher}} if tau_teacher else {})},
        }},
    }
    path.write_text(yaml.safe_dump(space, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, ray_session, tiny_bert, tiny_teacher):  # noqa: F811 - the fixture
    from raydistill.runtime.tune import plan_sweep, run_sweep

    root = tmp_path_factory.mktemp("tune")
    space = write_space(root / "tiny.yaml", tiny_bert, tiny_teacher, root, num_learners=0)
    plan = plan_sweep(str(tiny_bert), "congen", str(tiny_teacher), space_file=space, sweep_dir=root / "sweep",
                      experiment="test-tune", evaluate_sets=("sts13",), results_dir=root / "results",
                      command="pytest tests/test_tune.py")
    InterruptAt.armed = KillTrialProcessAt.armed = True
    RecordResults.results, KillTrialProcessAt.killed = {}, {}
    first = run_sweep(plan, callbacks=[InterruptAt(lr=LRS[2], step=EVAL_EVERY), RecordResults(),
                                       KillTrialProcessAt(lr=1e-3)], verbose=0)
    interrupted = [row for row in first["trials"] if row["status"] == "interrupted"]
    stored = {row["trial_id"]: sorted(p.name for p in plan.tune_dir.joinpath(row["trial_id"]).glob("checkpoint_*"))
              for row in interrupted}
    code = cli_main(["tune", "--resume", "--sweep-dir", str(root / "sweep")])
    final = json.loads((root / "sweep" / "summary.json").read_text())
    return {"root": root, "plan": plan, "first": first, "final": final, "resume_code": code, "stored": stored,
            "results": RecordResults.results, "killed": dict(KillTrialProcessAt.killed)}


def by_lr(summary):
    return {row["params"]["train.lr"]: row for row in summary["trials"]}


@pytest.fixture(scope="module")
def worker_sweep(tmp_path_factory, ray_session, tiny_bert, tiny_teacher):  # noqa: F811 - the fixture
    """The same four trials on Ray Train workers (``num_learners: 1``, the default), interrupted at the third
    trial's first evaluation and resumed; no trial process is killed (what Tune does with a lost trial is the same
    with workers)."""
    from raydistill.runtime.tune import plan_sweep, run_sweep

    root = tmp_path_factory.mktemp("tune-workers")
    space = write_space(root / "tiny.yaml", tiny_bert, tiny_teacher, root, num_learners=1)
    plan = plan_sweep(str(tiny_bert), "congen", str(tiny_teacher), space_file=space, sweep_dir=root / "sweep",
                      experiment="test-tune-workers", evaluate_sets=("sts13",), results_dir=root / "results",
                      command="pytest tests/test_tune.py")
    InterruptAt.armed = True
    RecordResults.results = {}
    first = run_sweep(plan, callbacks=[InterruptAt(lr=LRS[2], step=EVAL_EVERY), RecordResults()], verbose=0)
    stored = {row["trial_id"]: sorted(plan.train_storage(row["trial_id"]).rglob("step-*"))
              for row in first["trials"] if row["status"] == "interrupted"}
    # What each interrupted trial recorded of itself before --resume: shown when an assert below fails.
    states = {row["trial_id"]: json.loads((Path(row["run_dir"]) / "trial.json").read_text())
              for row in first["trials"] if row["status"] == "interrupted"}
    code = cli_main(["tune", "--resume", "--sweep-dir", str(root / "sweep")])
    final = json.loads((root / "sweep" / "summary.json").read_text())
    return {"root": root, "plan": plan, "first": first, "final": final, "resume_code": code, "stored": stored,
            "results": RecordResults.results, "interrupted_states": states}


def trial_errors(sweep) -> str:
    """The failed trials' errors, and what the interrupted ones recorded before --resume: an assert's message."""
    failed = {row["params"]["train.lr"]: row["error"] for row in sweep["final"]["trials"] if row["status"] == "failed"}
    return f"failed trials: {failed}; interrupted trials before --resume: {sweep.get('interrupted_states')}"


@pytest.fixture(scope="module", params=["sweep", "worker_sweep"])
def each_sweep(request):
    """Both sweeps, for what holds whether trials train in Train's local mode or on Train workers."""
    return request.getfixturevalue(request.param)


@pytest.mark.ray
def test_interrupted_sweep_resumes_and_keeps_finished_trials(sweep):
    first, final = sweep["first"], sweep["final"]
    assert first["ended_by"] == "interrupted"
    done_before = {row["trial_id"]: row for row in first["trials"] if row["status"] in ("finished", "stopped_early")}
    assert sorted(row["params"]["train.lr"] for row in done_before.values()) == sorted(LRS[:2])
    assert [row["params"]["train.lr"] for row in first["trials"] if row["status"] == "interrupted"] == [LRS[2]]
    assert sweep["resume_code"] == 0
    assert final["ended_by"] == "completed"
    assert final["trials_total"] == len(LRS) and final["counts"]["interrupted"] == 0
    assert sorted(by_lr(final)) == sorted(LRS)
    for row in final["trials"]:
        if row["trial_id"] in done_before:  # kept, not run again
            before = done_before[row["trial_id"]]
            assert (row["status"], row["attempts"], row["reports"]) == (before["status"], before["attempts"],
                                                                         before["reports"])
    # Running when interrupted: each evaluation's checkpoint went to Tune, into the sweep's Tune storage (what a
    # restore on another node reads), not into its run dir, and the resumed attempt continued from the newest of
    # them, not from step 0.
    restarted = by_lr(final)[LRS[2]]
    assert restarted["attempts"] == 2 and 1 <= restarted["resumed_from"] < ROWS // BATCH
    assert sweep["stored"][restarted["trial_id"]], "no checkpoint in the sweep's Tune storage"
    assert not list((sweep["root"] / "sweep" / "trials" / restarted["trial_id"]).rglob("step-*"))
    assert not sweep["plan"].train_storage(restarted["trial_id"]).exists()  # no Train workers, no Train storage
    assert restarted["status"] in ("finished", "stopped_early")
    assert len(final["teacher_passes"]) == 2  # one per driver run


@pytest.mark.ray
def test_a_trial_whose_process_was_killed_is_retried_from_its_checkpoint(sweep, reliability):
    """The first trial's process is SIGKILLed at its first checkpoint (as the OOM killer would): Tune restarts it
    from that checkpoint (``max_trial_failures``), while the NaN trial, which failed by its own error, is not run
    again. Every evaluation reached Tune once the trial was back."""
    killed, retried = sweep["killed"], by_lr(sweep["first"])[1e-3]
    reliability.record(
        "fault", "tune-trial-retried",
        input=f"a local-mode trial's process SIGKILLed (pid {killed.get('pid')}) after its first checkpoint "
              f"(step {killed.get('step')} of {ROWS // BATCH}), resources_per_trial.max_failures 2",
        did=f"Tune restarted the trial from that checkpoint (attempt {retried['attempts']} resumed from step "
            f"{retried['resumed_from']}) and it ended {retried['status']} at step {retried['last_step']}; the trial "
            "with a NaN loss (its own error) was not run again",
        lost=f"{(killed.get('step') or 0) - (retried['resumed_from'] or 0)} step(s): the trial came back from the "
             "checkpoint of the step it was killed at", test_part="retry-after-trial-kill")
    assert killed and retried["attempts"] == 2 and retried["resumed_from"] == killed["step"] == EVAL_EVERY
    assert retried["status"] == "finished" and retried["last_step"] == ROWS // BATCH
    steps = [r["step"] for r in sweep["results"][1e-3]]
    assert sorted(set(steps)) == list(range(EVAL_EVERY, ROWS // BATCH + 1, EVAL_EVERY))
    nan_trial = by_lr(sweep["final"])[1e6]
    assert nan_trial["attempts"] == 1 and not nan_trial["lost"]  # its own error: Tune's retries refused at once
    assert not sweep["plan"].train_storage(retried["trial_id"]).exists()  # no Train workers, no Train storage


@pytest.mark.ray
def test_trials_on_train_workers_report_through_ray_train_and_resume_from_train_checkpoints(worker_sweep):
    """``num_learners: 1``: what Tune ranks a trial by is rank 0's ``ray.train.report`` of each evaluation (with the
    path of the Train checkpoint reported with it, in the sweep's Tune storage), except the last, which the trial
    reports itself once its model is written: every evaluation of the uninterrupted first trial, in order, each
    with the best dev score so far. The trial interrupted at its first evaluation comes back on ``--resume`` from
    its newest Train checkpoint there, not from step 0 and not from its run dir."""
    plan, first = worker_sweep["plan"], by_lr(worker_sweep["first"])
    results = worker_sweep["results"][1e-3]
    from_train = [r for r in results if "checkpoint_path" in r]
    assert [r["step"] for r in from_train] == list(range(EVAL_EVERY, ROWS // BATCH, EVAL_EVERY))
    assert all(r["checkpoint_path"].startswith(str(plan.train_storage(first[1e-3]["trial_id"])))
               for r in from_train)
    assert all(r["best_stsb_dev"] == max(x["stsb_dev"] for x in from_train[:i + 1]) for i, r in enumerate(from_train))
    assert results[-1]["step"] == ROWS // BATCH and "checkpoint_path" not in results[-1]

    assert worker_sweep["first"]["ended_by"] == "interrupted" and first[LRS[2]]["status"] == "interrupted"
    restarted = by_lr(worker_sweep["final"])[LRS[2]]
    assert worker_sweep["stored"][restarted["trial_id"]], "no Train checkpoint in the sweep's Tune storage"
    assert restarted["attempts"] == 2 and 1 <= restarted["resumed_from"] < ROWS // BATCH, trial_errors(worker_sweep)
    assert restarted["status"] in ("finished", "stopped_early")
    assert not list((worker_sweep["root"] / "sweep" / "trials" / restarted["trial_id"]).rglob("step-*"))
    assert all(r["checkpoint_path"].startswith(str(plan.train_storage(restarted["trial_id"])))
               for r in worker_sweep["results"][LRS[2]] if "checkpoint_path" in r)


@pytest.mark.ray
def test_asha_stops_the_wrecked_trial_early_and_the_nan_trial_fails(each_sweep):
    sweep = each_sweep
    rows = by_lr(sweep["final"])
    assert rows[0.5]["status"] == "stopped_early"
    assert rows[0.5]["last_step"] < rows[0.5]["total_steps"] == ROWS // BATCH
    assert rows[1e-3]["status"] == "finished" and rows[1e-3]["last_step"] == ROWS // BATCH
    assert rows[1e6]["status"] == "failed" and "loss is nan" in rows[1e6]["error"]
    assert sweep["final"]["counts"]["failed"] == 1 and sweep["final"]["counts"]["stopped_early"] >= 1, \
        trial_errors(sweep)
    assert rows[1e-3]["best_stsb_dev"] > rows[0.5]["best_stsb_dev"]


@pytest.mark.ray
def test_time_budget_ends_the_sweep_and_says_so(tmp_path, ray_session, tiny_bert, tiny_teacher):  # noqa: F811
    """--time-budget: Tune stops the sweep when the budget is spent; trials not run are not reported as run, and
    the summary says the budget, not an interruption, ended it."""
    from raydistill.runtime.tune import plan_sweep, run_sweep

    space = write_space(tmp_path / "tiny.yaml", tiny_bert, tiny_teacher, tmp_path, lrs=[1e-3, 2e-3, 3e-3, 4e-3])
    plan = plan_sweep(str(tiny_bert), "congen", str(tiny_teacher), space_file=space, sweep_dir=tmp_path / "sweep",
                      settings={"time_budget_s": 1}, experiment="test-tune-budget", evaluate_sets=(),
                      results_dir=tmp_path / "results", command="pytest tests/test_tune.py")
    summary = run_sweep(plan, verbose=0)
    assert summary["ended_by"] == "time_budget"
    done = summary["counts"]["finished"] + summary["counts"]["stopped_early"]
    assert done < 4  # four trials of several seconds each cannot all finish in one second


@pytest.mark.ray
def test_teacher_encodes_the_corpus_once_per_sweep(each_sweep):
    sweep = each_sweep
    first_pass, resumed_pass = sweep["final"]["teacher_passes"]
    assert (first_pass["misses"], first_pass["teacher_forward_sentences"]) == (ROWS, ROWS)
    assert (resumed_pass["hits"], resumed_pass["teacher_forward_sentences"]) == (ROWS, 0)
    assert sweep["final"]["teacher_forward_sentences"] == {"driver": ROWS, "trials": 0, "total": ROWS}
    for row in sweep["final"]["trials"]:
        if row["status"] != "failed" or row["reports"]:
            assert row["teacher_cache_hits"] >= ROWS  # every trial read its vectors from the cache


@pytest.mark.ray
def test_mlflow_has_one_parent_run_and_a_child_run_per_trial(each_sweep):
    from mlflow import MlflowClient

    sweep = each_sweep
    final = sweep["final"]
    client = MlflowClient(tracking_uri=final["mlflow"]["tracking_uri"])
    parent = client.get_run(final["mlflow"]["parent_run_id"])
    assert parent.info.status == "FINISHED"
    assert parent.data.metrics["teacher_forward_sentences_total"] == ROWS
    assert parent.data.metrics["trials_failed"] == 1 and "space.train.lr" in parent.data.params, trial_errors(sweep)
    children = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert len(children) == len(LRS)
    expected = {"finished": "FINISHED", "stopped_early": "KILLED", "failed": "FAILED"}
    rows = {row["mlflow_run_id"]: row for row in final["trials"]}
    for child in children:
        row = rows[child.info.run_id]
        assert child.info.status == expected[row["status"]], row
        assert child.data.tags["raydistill.trial_status"] == row["status"]
        assert float(child.data.params["tune.train.lr"]) == row["params"]["train.lr"]
        assert child.data.params["K"] == "64"  # the trial's full config is there too
        if row["status"] != "failed":
            # A restarted trial may log the evaluation of a step it repeats after its checkpoint again, and keeps
            # what its first attempt logged beyond the checkpoint it came back from: steps, not entries, must cover
            # the run.
            steps = {point.step for point in client.get_metric_history(child.info.run_id, "stsb_dev")}
            # Every evaluation up to the last one Tune decided on is there. Tune stops a trial after that report
            # while its worker trains on, so a stopped trial may have trained (and logged) a step or two more.
            reported = {result["step"] for result in sweep["results"][row["params"]["train.lr"]]}
            assert set(range(EVAL_EVERY, max(reported) + 1, EVAL_EVERY)) <= steps
            assert steps <= set(range(EVAL_EVERY, row["last_step"] + 1, EVAL_EVERY))
            if row["status"] == "finished":
                assert max(steps) == row["last_step"] == row["total_steps"]
            assert len(client.get_metric_history(child.info.run_id, "loss")) >= row["last_step"]


@pytest.mark.ray
def test_best_trial_is_exported_as_a_model_and_a_job_config(each_sweep):
    from raydistill.config.job import JobConfig
    from raydistill.models import BiEncoder

    final = each_sweep["final"]
    best = final["best"]
    ranked = [row for row in final["trials"] if row["status"] != "failed"]
    assert best["trial_id"] == ranked[0]["trial_id"]
    assert best["best_stsb_dev"] == max(row["best_stsb_dev"] for row in ranked)
    model = BiEncoder.from_pretrained(best["model_dir"])
    assert model.encode(["a dog runs"], normalize=True).shape == (1, 48)  # projected to the teacher's width
    assert os.path.isfile(os.path.join(best["model_dir"], "modules.json"))
    cfg = preflight(JobConfig.from_yaml(best["config_path"]))
    assert cfg.train.lr == best["params"]["train.lr"] and cfg.run_dir is None
    assert cfg.resources.learner.num_learners == 0 and cfg.data.max_sentences == ROWS
    assert set(best["scores"]) == {"sts13"}  # evaluate_sets of the plan


def test_cli_rejects_bad_arguments_at_parse_time(capsys):
    for argv, message in [
        (["tune", "--student", "bert-mni"], "bert-mini"),
        (["tune", "--student", "bert-mini", "--queue-size", "1024,-5"], "queue size K must be a positive integer"),
        (["tune", "--student", "bert-mini", "--tau-teacher", "0"], "expected a number > 0"),
        (["tune", "--student", "bert-mini", "--tau-student", "0.05,-0.1"], "expected a number > 0"),
        (["tune", "--student", "bert-mini", "--method", "congenn"],
         f"unknown method 'congenn'; choose from {', '.join(job_methods())}"),
        (["tune", "--student", "bert-mini", "--time-budget", "soon"], "duration"),
    ]:
        with pytest.raises(SystemExit) as exc:
            cli_main(argv)
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert message in err, (argv, err)
    with pytest.raises(SystemExit):
        cli_main(["tune", "--student", "nope"])
    assert "minilm-l6, mpnet-base, minilm-l3, bert-tiny, bert-mini, bert-small" in capsys.readouterr().err


def test_list_shows_every_space_file(capsys):
    assert cli_main(["tune", "--list"]) == 0
    out = capsys.readouterr().out
    for name in ("bert-tiny", "bert-mini", "bert-small", "minilm-l3", "default"):
        assert f"  {name} " in out
    assert "congen (4 keys)" in out


def test_space_errors_name_file_line_and_field(tmp_path, tiny_bert, tiny_teacher):
    from raydistill.runtime.tune import SpaceError, plan_sweep

    space = write_space(tmp_path / "bad.yaml", tiny_bert, tiny_teacher, tmp_path, lrs=[1e-3],
                        tau_teacher=[0.05, 0.0])
    line = next(i for i, text in enumerate(space.read_text().splitlines(), 1) if "loss.tau_teacher" in text)
    with pytest.raises(SpaceError, match=rf"bad.yaml:{line}: field 'methods.congen.space.loss.tau_teacher': "
                                         r"loss.tau_teacher=0.0: .*> 0"):
        plan_sweep(str(tiny_bert), "congen", str(tiny_teacher), space_file=space, sweep_dir=tmp_path / "s")
    # Values given on the command line are checked the same way.
    space = write_space(tmp_path / "ok.yaml", tiny_bert, tiny_teacher, tmp_path, lrs=[1e-3])
    with pytest.raises(SpaceError, match=r"command-line search values: loss.queue_size=8: .*smaller than "
                                         r"train.batch_size"):
        plan_sweep(str(tiny_bert), "congen", str(tiny_teacher), space_file=space, sweep_dir=tmp_path / "s",
                   param_values={"loss.queue_size": [64, 8]})
    # A default point of every shipped space file is a valid job.
    plan = plan_sweep("bert-mini", "congen", space_file=None, sweep_dir=tmp_path / "s2")
    assert plan.start_from == [{"train.lr": 3e-4, "loss.queue_size": 16384, "loss.tau_teacher": 0.05,
                                "loss.tau_student": 0.07}]
    assert plan.teacher == "mpnet-base" and plan.algorithm in ("random", "optuna")


def test_a_trial_that_raised_while_its_sweep_was_interrupted_continues_on_resume(tmp_path, tiny_bert, tiny_teacher):
    """A trial running when the driver was interrupted may record an error while Tune tears it down (its Train
    workers and actors gone under it). The summary says it was interrupted: --resume continues it instead of refusing
    it as a trial whose own code fails. A trial that failed by itself stays failed."""
    from raydistill.runtime.tune import plan_sweep
    from raydistill.runtime.tune.sweep import _reopen_interrupted_trials
    from raydistill.runtime.tune.trial import TrialState

    space = write_space(tmp_path / "ok.yaml", tiny_bert, tiny_teacher, tmp_path, lrs=[1e-3, 1e6])
    plan = plan_sweep(str(tiny_bert), "congen", str(tiny_teacher), space_file=space, sweep_dir=tmp_path / "s")
    rows = [{"trial_id": "torn", "status": "interrupted"}, {"trial_id": "nan", "status": "failed"}]
    for row in rows:
        plan.trial_dir(row["trial_id"]).mkdir(parents=True)
        TrialState(trial_id=row["trial_id"], attempts=1, status="failed", error="RuntimeError: x").save(
            plan.trial_dir(row["trial_id"]))
    (tmp_path / "s" / "summary.json").write_text(json.dumps({"trials": rows}))
    _reopen_interrupted_trials(plan)
    torn, nan = (TrialState.load(plan.trial_dir(t), t) for t in ("torn", "nan"))
    assert (torn.status, torn.error, torn.attempts) == ("interrupted", None, 1)
    assert (nan.status, nan.error) == ("failed", "RuntimeError: x")


@pytest.mark.parametrize("cpus_per_trial, cluster_cpus, requested, data_cpus, expected", [
    (1.0, 2, None, 1.0, 1),     # a trial's own teacher pass may need Ray Data: one trial, one CPU left for it
    (1.0, 2, None, 0.0, 2),     # trials only read the shared teacher pass's cache: every CPU trains
    (0.5, 2, None, 1.0, 2),     # half a CPU each: two at a time, still one CPU unreserved
    (0.5, 2, 1, 0.0, 1),        # an explicit max_concurrent_trials below the cap wins
    (1.0, 16, None, 1.0, 15),   # a bigger node: every CPU but one
    (4.0, 64, 32, 1.0, 15),     # a cap above what fits is lowered
])
def test_trial_concurrency_leaves_ray_data_the_cpus_it_needs(cpus_per_trial, cluster_cpus, requested, data_cpus,
                                                             expected):
    from raydistill.runtime.tune import SweepSettings, trial_concurrency

    settings = SweepSettings(num_cpus=cpus_per_trial, max_concurrent_trials=requested)
    concurrency = trial_concurrency(settings, cluster_cpus, data_cpus=data_cpus)
    assert concurrency == expected
    assert concurrency * cpus_per_trial + data_cpus <= cluster_cpus


def test_a_cpu_is_held_back_only_when_a_trial_can_miss_the_shared_teacher_pass(tmp_path, tiny_bert, tiny_teacher):
    from raydistill.runtime.tune import plan_sweep, trial_data_cpus

    space = write_space(tmp_path / "tiny.yaml", tiny_bert, tiny_teacher, tmp_path)
    plan = plan_sweep(str(tiny_bert), "congen", str(tiny_teacher), space_file=space, sweep_dir=tmp_path / "s")
    assert trial_data_cpus(plan) == 0.0  # lr only: every trial hits the cache
    plan.params["data.max_sentences"] = {"choice": [64, 128]}  # other sentences: a trial's own teacher pass
    assert trial_data_cpus(plan) == 1.0


@pytest.mark.ray
@pytest.mark.e2e
def test_two_trials_train_at_once_on_two_cpus(tmp_path, ray_session, tiny_bert, tiny_teacher):  # noqa: F811
    """No CPU held back on 2 CPUs: two 1-CPU trials run side by side and both finish (a Ray Data task left without a
    CPU would wait until the time budget ends the sweep)."""
    from raydistill.runtime.tune import plan_sweep, run_sweep

    space = write_space(tmp_path / "tiny.yaml", tiny_bert, tiny_teacher, tmp_path, lrs=[1e-3, 2e-3])
    spec = yaml.safe_load(space.read_text())
    spec["search"]["max_concurrent_trials"] = 2
    space.write_text(yaml.safe_dump(spec, sort_keys=False))
    plan = plan_sweep(str(tiny_bert), "congen", str(tiny_teacher), space_file=space, sweep_dir=tmp_path / "sweep",
                      settings={"time_budget_s": 600}, experiment="test-tune-side-by-side", evaluate_sets=(),
                      results_dir=tmp_path / "results", command="pytest tests/test_tune.py")
    summary = run_sweep(plan, verbose=0)
    assert summary["concurrent_trials"] == 2
    assert summary["ended_by"] == "completed"
    assert summary["counts"]["finished"] + summary["counts"]["stopped_early"] == 2


def _wait_until(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, f"gave up after {timeout_s:.0f}s waiting for {what}"
        time.sleep(0.05)
    return value


def _gone(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.ray
def test_a_sweep_whose_driver_was_killed_resumes_each_trial_from_its_checkpoint(tmp_path, ray_session,  # noqa: F811
                                                                                 tiny_bert, tiny_teacher,
                                                                                 reliability):
    """``raydistill tune`` as its own process, SIGKILLed once the trial has a checkpoint in the sweep's Tune
    storage (no summary, no clean-up: what a lost driver node leaves); ``--resume`` then continues the trial from
    its newest checkpoint, losing at most one evaluation interval."""
    import ray

    from raydistill.runtime.tune import resume_sweep
    from raydistill.runtime.tune.trial import TrialState

    space = write_space(tmp_path / "tiny.yaml", tiny_bert, tiny_teacher, tmp_path, lrs=[1e-3], num_learners=0)
    sweep_dir = tmp_path / "sweep"
    log = (tmp_path / "driver.log").open("w")
    # The driver joins the session's Ray (a Ray start is ~9 s); its trial processes belong to its job and die with it.
    driver = subprocess.Popen(
        [sys.executable, "-m", "raydistill.cli", "tune", "--student", str(tiny_bert), "--teacher", str(tiny_teacher),
         "--space", str(space), "--sweep-dir", str(sweep_dir), "--no-evaluate", "--results-dir",
         str(tmp_path / "results"), "--experiment", "test-tune-driver-kill"],
        env={**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address, "OMP_NUM_THREADS": "1"},
        stdout=log, stderr=subprocess.STDOUT)
    try:
        checkpoint = _wait_until(lambda: sorted(sweep_dir.glob("tune/*/checkpoint_*")), 180,
                                 f"a trial checkpoint (driver log: {tmp_path / 'driver.log'})")[0]
        driver.send_signal(signal.SIGKILL)
    finally:
        driver.kill()
        driver.wait()
        log.close()
    trial_id = checkpoint.parent.name
    run_dir = sweep_dir / "trials" / trial_id
    pid = TrialState.load(run_dir, trial_id).pid
    _wait_until(lambda: _gone(pid), 60, f"trial process {pid} to die with its driver")
    before = TrialState.load(run_dir, trial_id)  # what the trial had trained when it died
    assert not (sweep_dir / "summary.json").exists() and before.status == "running"
    summary = resume_sweep(sweep_dir, verbose=0)
    row = summary["trials"][0]
    reliability.record(
        "fault", "tune-trial-retried",
        input=f"the sweep driver (raydistill tune) SIGKILLed with its one local-mode trial at step {before.last_step} "
              f"of {ROWS // BATCH} (a checkpoint in Tune's storage); then raydistill tune --resume",
        did=f"--resume continued trial {trial_id} from step {row['resumed_from']} (attempt {row['attempts']}); "
            f"it ended {row['status']} at step {row['last_step']}, the sweep {summary['ended_by']}",
        lost=f"{before.last_step - (row['resumed_from'] or 0)} step(s) (an evaluation interval is {EVAL_EVERY})",
        test_part="resume-after-driver-kill")
    assert summary["ended_by"] == "completed" and row["trial_id"] == trial_id and row["attempts"] == 2
    assert row["resumed_from"] and before.last_step - row["resumed_from"] <= EVAL_EVERY
    assert row["status"] == "finished" and row["last_step"] == ROWS // BATCH


def test_a_second_driver_on_a_sweep_in_use_is_refused(tmp_path, tiny_bert, tiny_teacher, capsys, reliability):
    """A second ``--resume`` (or sweep) on a sweep directory whose driver runs is refused before Ray starts, naming
    the holder; a symlink planted as the lock file is not followed."""
    from raydistill.runtime.tune import SpaceError, plan_sweep, resume_sweep, run_sweep
    from raydistill.runtime.tune.sweep import SWEEP_LOCK, SweepLockedError

    space = write_space(tmp_path / "tiny.yaml", tiny_bert, tiny_teacher, tmp_path, num_learners=0)
    plan = plan_sweep(str(tiny_bert), "congen", str(tiny_teacher), space_file=space, sweep_dir=tmp_path / "sweep",
                      evaluate_sets=())
    plan.save()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom raydistill.runtime.tune.sweep import SweepLock\n"
         "with SweepLock(sys.argv[1]):\n    print('locked', flush=True)\n    time.sleep(120)", plan.sweep_dir],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(SweepLockedError) as resumed:
            resume_sweep(plan.sweep_dir, verbose=0)
        with pytest.raises(SweepLockedError):
            run_sweep(plan, verbose=0)  # a new sweep on the same directory
        code = cli_main(["tune", "--resume", "--sweep-dir", plan.sweep_dir])
        cli_error = capsys.readouterr().err.strip()
    finally:
        holder.kill()
        holder.wait()
    lock = Path(plan.sweep_dir) / SWEEP_LOCK
    lock.unlink()
    target = tmp_path / "elsewhere"
    lock.symlink_to(target)
    with pytest.raises(SpaceError, match="not a symlink") as linked:
        resume_sweep(plan.sweep_dir, verbose=0)
    reliability.record(
        "fault", "tune-trial-retried",
        input="raydistill tune --resume on a sweep directory whose lock another live driver holds (pid "
              f"{holder.pid}); then the lock file replaced by a symlink",
        did=f"refused before Ray started, naming the holder (exit code {code}); the symlink was not followed",
        lost="nothing: the running sweep is untouched", message=f"{cli_error} / {linked.value}",
        test_part="second-resume-refused")
    assert f"pid {holder.pid}" in str(resumed.value) and "in use by another sweep driver" in str(resumed.value)
    assert code == 2 and f"pid {holder.pid}" in cli_error
    assert not target.exists()


@pytest.mark.ray
def test_pbt_continues_the_weak_trial_from_the_strong_trials_checkpoint(tmp_path, ray_session,  # noqa: F811
                                                                        tiny_bert, tiny_teacher):
    """``scheduler: pbt`` with local-mode trials: every evaluation reaches Tune with its checkpoint, in the sweep's
    Tune storage; the trial whose learning rate wrecks the student (0.5) is restarted by PBT from the good trial's
    checkpoint with a perturbed learning rate, and so ends with at least the good trial's dev score at that step
    (on its own it stays near 3, far below).

    Synchronous PBT: the two trials are compared at the same step however their start-ups interleave. Asynchronous
    PBT compares a trial only with trials that are still running and have reported; on two loaded cores the good
    trial can finish its 8 steps before the other reports once, and then nothing is continued."""
    from raydistill.runtime.tune import plan_sweep, run_sweep

    space = write_space(tmp_path / "tiny.yaml", tiny_bert, tiny_teacher, tmp_path, lrs=[1e-3, 0.5], num_learners=0,
                        scheduler={"name": "pbt", "perturbation_evals": 3, "quantile_fraction": 0.5,
                                   "synchronous": True}, concurrent=2,
                        # an evaluation a second: every checkpoint is kept, so the donor's outlives the restart
                        eval_every=1, keep_checkpoints=ROWS // BATCH)
    plan = plan_sweep(str(tiny_bert), "congen", str(tiny_teacher), space_file=space, sweep_dir=tmp_path / "sweep",
                      experiment="test-tune-pbt", evaluate_sets=(), results_dir=tmp_path / "results",
                      command="pytest tests/test_tune.py")
    assert plan.pbt_mutations() == {"train.lr": [1e-3, 0.5]}
    RecordResults.results, RecordCheckpoints.manifests = {}, {}
    summary = run_sweep(plan, callbacks=[RecordResults(), RecordCheckpoints()], verbose=0)
    assert summary["ended_by"] == "completed" and summary["scheduler"]["name"] == "PBT"
    assert summary["scheduler"]["synchronous"] is True
    rows = {row["trial_id"]: row for row in summary["trials"]}
    assert [row["status"] for row in rows.values()] == ["finished", "finished"]
    continuing = [row for row in rows.values() if row["continued"]]
    assert continuing, f"PBT never continued a trial from another's checkpoint: {summary['trials']}"
    trial = continuing[0]
    first = trial["continued"][0]
    donor = rows[first["from_trial"]]
    assert donor["trial_id"] != trial["trial_id"] and first["step"] >= 1
    # Evaluations went to Tune with their checkpoints, persisted in the sweep's Tune storage (no Train storage); the
    # sweep's end deleted them, as the trials are finished.
    # A trial that took over another's run writes its checkpoints as its own from then on.
    for trial_id, row in rows.items():
        written_by = {m["extra"]["trial_id"] for m in RecordCheckpoints.manifests[trial_id]}
        assert written_by == {trial_id}, (trial_id, written_by)
        assert not list(plan.tune_dir.joinpath(trial_id).glob("checkpoint_*"))
        assert not plan.train_storage(trial_id).exists()
    donor_dev_then = max(r["best_stsb_dev"] for r in RecordResults.results[1e-3] if r["step"] <= first["step"])
    assert trial["best_stsb_dev"] >= donor_dev_then - 1e-6
    assert trial["best_stsb_dev"] > 10, "the wrecked trial's own level; it did not take over the good run"
    assert trial["last_step"] == ROWS // BATCH and trial["attempts"] >= 2


def test_pbt_is_refused_where_it_cannot_work(tmp_path, tiny_bert, tiny_teacher):
    """Before Ray starts: PBT needs local-mode trials (Tune must hold the checkpoints), a searched value it may
    change in a running trial, and a searcher that does not model finished trials."""
    from raydistill.runtime.tune import SpaceError, plan_sweep

    space = write_space(tmp_path / "tiny.yaml", tiny_bert, tiny_teacher, tmp_path, scheduler={"name": "pbt"})

    def plan(**settings):
        return plan_sweep(str(tiny_bert), "congen", str(tiny_teacher), space_file=space, settings=settings,
                          sweep_dir=tmp_path / "sweep", evaluate_sets=())

    with pytest.raises(SpaceError, match="num_learners: 0"):
        plan()
    with pytest.raises(SpaceError, match="optuna"):
        plan(num_learners=0, algorithm="optuna")
    assert plan(num_learners=0).algorithm == "random"
    data = yaml.safe_load(space.read_text())
    data["methods"]["congen"]["space"] = {"loss.queue_size": {"choice": [32, 64]}}  # the checkpoint holds the queue
    space.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(SpaceError, match="none of the searched keys"):
        plan(num_learners=0)


def test_a_trial_that_would_take_every_cpu_is_refused_before_it_starts():
    from raydistill.runtime.tune import SpaceError, SweepSettings, trial_concurrency

    with pytest.raises(SpaceError, match="--cpus-per-trial 1 or less"):
        trial_concurrency(SweepSettings(num_cpus=2.0), 2)
