"""``run_distillation(cfg)``: one distillation job from config to committed result file.

    preflight the config (before Ray or any model starts; a typo costs a second, not a teacher pass)
    → lock the run dir (one job per run dir) and refuse to resume a checkpoint of another config, corpus content or
      learner count (before config.yaml is rewritten, Ray starts or the teacher runs)
    → init Ray (join RAY_ADDRESS / the running session, else a local Ray with resources.num_cpus)
    → per stage: training data (stage 1 of teacher methods: the teacher pass through the embedding cache, hits and
      misses logged) → LearnerGroup.fit, a Ray Train run (dev every train.eval_every steps, checkpoints,
      resume, restarts)
    → 7-STS (+ STS-B dev) of the best checkpoint → results/<method>-<student>-<teacher>.json + MLflow run (a file
      that holds another run dir's record is left alone: this run's goes to ``<name>-<run id>.json``, said so)

MLflow (``Tracker``; a tracking failure never stops training): params = the effective config (flattened) plus the
summary columns, corpus size and teacher-cache counts; metrics = every step's loss parts, lr, sentences/s, STS-B dev
at each evaluation, the final 7-STS; artifacts = the result JSON and plots; the best model as an MLflow model
(``engine.model_logging``), registered as ``tracking.register_model`` when set. Multi-stage methods log their stages
on one step axis (stage 2 continues where stage 1 ended) with ``stage`` as a metric.

SIGTERM or SIGINT stops the job cleanly wherever it is (``stopping``; ``runtime.entry`` says what each part keeps):
the MLflow run ends KILLED and ``JobStopped`` says what was kept and how to resume; the same command with the same
run_dir resumes, training no step twice and sending no cached sentence through the teacher again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable

from raydistill.config.job import ConfigError, JobConfig, model_short_name
from raydistill.cputime import cpu_seconds
from raydistill.methods import METHODS
from raydistill.runtime.engine.stopping import JobStopped, StopOnSignals, raise_if_stop_requested, signal_name

__all__ = ["run_distillation", "result_path_for"]

log = logging.getLogger(__name__)

# Methods trained by a job of their own: method -> jobs/<name>.py.
OTHER_JOBS = {"st-mse": "st_mse"}

# progress(event, info, step): see run_distillation.
ProgressHook = Callable[[str, dict[str, Any], int], None]
# (stage index, number of stages, steps before the stage, best dev before it) -> engine.reporting.Reporter
StageReporter = Callable[[int, int, int, "float | None"], Any]


def _short(name: str | None) -> str:
    return model_short_name(name) if name else "none"


def teacher_label(cfg: JobConfig) -> str | None:
    """The teacher's short name; a method's own teachers (DvBERT's cross-encoders) joined by '+'; None for
    teacherless methods."""
    if cfg.teacher:
        return _short(cfg.teacher)
    spec = METHODS.get(cfg.method)
    if spec is not None and spec.own_teachers is not None:
        return "+".join(_short(t) for t in spec.own_teachers(cfg).values())
    return None


def result_path_for(cfg: JobConfig, results_dir: str | os.PathLike = "results") -> Path:
    """``<results_dir>/<method>-<student>-<teacher>.json`` (no teacher part for teacherless methods)."""
    parts = [cfg.method, _short(cfg.student)] + ([teacher_label(cfg)] if teacher_label(cfg) else [])
    return Path(results_dir) / ("-".join(parts) + ".json")


def _summary_params(cfg: JobConfig) -> dict[str, Any]:
    # The validated values the loss is built with, its defaults included: the columns runs are compared by in
    # MLflow, named alike across methods whose settings call the temperature differently.
    loss = cfg.loss.in_use()
    return {
        "method": cfg.method, "student": cfg.student, "teacher": teacher_label(cfg) or "none", "seed": cfg.seed,
        "lr": cfg.train.lr, "batch_size": cfg.train.batch_size, "epochs": cfg.train.epochs,
        "tau_teacher": next((loss[key] for key in ("tau_teacher", "tau", "temperature") if key in loss), None),
        "tau_student": loss.get("tau_student"), "K": loss.get("queue_size"),
        "config_hash": cfg.config_hash(),
    }


def run_distillation(cfg: JobConfig, *, results_dir: str | os.PathLike | None = None,
                     result_path: str | os.PathLike | None = None, command: str | None = None,
                     evaluate: bool = True, tracker=None, progress: ProgressHook | None = None,
                     stage_reporter: StageReporter | None = None) -> dict[str, Any]:
    """Train ``cfg``'s method end to end and return the result record (also written as JSON to ``result_path``, or
    under ``results_dir``). ``command``: the command line to record (default argv). ``tracker``: an open ``Tracker``
    to log into (a Tune trial's child run; the caller ends it).

    ``progress(event, info, step)``, steps counted over all stages: ``("stage", {stage, method, rows, total_steps,
    step_offset, teacher-cache counts if any}, step_offset)`` once a stage's data is built, ``("step", metrics,
    step)`` per optimiser step, ``("eval", {"stsb_dev", "best_stsb_dev"}, step)`` per dev evaluation, ``("start",
    {"resumed_from", "pid" of rank 0, "world_size"}, step)`` at each (re)start. ``stage_reporter(index, num_stages,
    step_offset, best_before)``: each stage's ``engine.reporting.Reporter`` (None: Train's; a Tune trial's own)."""
    from raydistill.methods import stage_plan
    from raydistill.runtime.engine.preflight import preflight
    from raydistill.runtime.engine.resume import check_resume
    from raydistill.runtime.engine.rundir import RunDirLock

    started, cpu_started = time.time(), cpu_seconds(children=True)
    if cfg.method in OTHER_JOBS:  # a method that another job runs (st-mse: jobs/st_mse.py)
        job = OTHER_JOBS[cfg.method]
        raise cfg._error("method", f"{cfg.method!r} is not trained by this job; run jobs/{job}.py (raydistill run "
                                   f"{job})")
    cfg = preflight(cfg)  # schema, method, models, data files, output dirs: before Ray or any model starts
    stages = stage_plan(cfg)
    run_dir = cfg.resolved_run_dir()
    lock = RunDirLock(run_dir).acquire(report=lambda message: print(f"[{cfg.method}] {message}", flush=True))
    stop = StopOnSignals(cfg.method)
    try:
        _recover_best_dirs(run_dir, stages)
        # Every stage's newest checkpoint must come from this config, corpus content and learner count: checked from
        # the manifests alone, before Ray starts, the teacher runs or config.yaml is rewritten.
        for stage in stages:
            check_resume(stage.run_dir, stage.cfg, max(1, int(stage.cfg.resources.learner.num_learners)))
        return _run_locked(cfg, stages, run_dir, results_dir, result_path, command, evaluate, tracker, progress,
                           started, cpu_started, stop, stage_reporter)
    finally:
        stop.restore()
        lock.release()


def _recover_best_dirs(run_dir: Path, stages) -> None:
    """A job killed between the two renames that swap in a new ``best/`` left only ``.best.old-<pid>``: put it back
    (and sweep the staging leftovers of dead processes) before anything reads ``best/``."""
    from raydistill.fileio import recover_directory

    for folder in dict.fromkeys([run_dir, *(stage.run_dir for stage in stages)]):
        if recover_directory(Path(folder) / "best"):
            print(f"[{stages[0].cfg.method}] restored {Path(folder) / 'best'} from the copy a killed job had moved "
                  "aside", flush=True)


# The job's SIGTERM / SIGINT handlers (``stopping``); the old name stays for callers that stop a LearnerGroup of their
# own. Installed after Ray starts: ``ray.init`` installs a SIGTERM handler of its own (abort at once).
_StopOnSigterm = StopOnSignals


def _explained(exc: JobStopped, cfg: JobConfig, run_dir: Path) -> JobStopped:
    """The stop with what it kept and how to resume (printed too); a stop inside training already says so."""
    if exc.step is not None:
        return exc
    where = exc.where or "between stages"
    kept = exc.kept or "finished stages keep their final checkpoints and are not trained again"
    message = (f"[{cfg.method}] stop requested ({signal_name()}) {where}: {kept}. Run the same command with run_dir "
               f"{run_dir} to resume.")
    print(message, flush=True)
    return JobStopped(message, where=where, kept=kept)


def check_results_dir(result_path: Path) -> None:
    """The result file is written after training: an unwritable results dir must fail now, not in an hour."""
    from raydistill.runtime.engine.rundir import OutputDirError, check_output_dir

    try:
        check_output_dir(result_path.parent, min_free_bytes=0)
    except OutputDirError as exc:
        raise ConfigError(f"results dir: {exc}") from exc


def job_tags(cfg: JobConfig) -> dict[str, str]:
    """The tags of a job's MLflow run and model."""
    return {"method": cfg.method, "student": cfg.student, "teacher": teacher_label(cfg) or "none"}


def open_tracker(cfg: JobConfig, run_dir: Path, tracker) -> tuple[Any, bool]:
    """``(tracker, own)``: the caller's open tracker, or a new MLflow run of the job (``own``: the job ends it),
    said in the run dir line."""
    from raydistill.runtime.engine.tracking import Tracker

    own = tracker is None
    if own:
        tracker = Tracker(cfg.tracking, run_name=cfg.tracking.run_name or run_dir.name, run_dir=run_dir,
                          tags=job_tags(cfg))
    tracking = f"; MLflow {tracker.tracking_uri} run {tracker.run_id}" if tracker.run_id else ""
    print(f"[{cfg.method}] run dir {run_dir}{tracking}", flush=True)
    return tracker, own


def report_teacher_cache(tag: str, stats: dict[str, Any], seconds: float, tracker, step: int) -> None:
    """The teacher pass's cache counts: one line, and MLflow metrics at ``step``."""
    print(f"[{tag}] teacher cache: {stats['hits']} hits, {stats['misses']} misses, "
          f"{stats['teacher_forward_sentences']} sentences through the teacher ({seconds:.1f}s)", flush=True)
    tracker.log_metrics({"teacher_cache_hits": stats["hits"], "teacher_cache_misses": stats["misses"],
                         "teacher_forward_sentences": stats["teacher_forward_sentences"],
                         "teacher_pass_s": seconds}, step=step)


def _run_locked(cfg, stages, run_dir: Path, results_dir, result_path, command, evaluate, tracker, progress,
                started: float, cpu_started: float, stop: StopOnSignals, stage_reporter=None
                ) -> dict[str, Any]:
    from raydistill.evaluation.results import git_sha
    from raydistill.runtime.engine.cluster import check_resources, init_ray, warn_if_outputs_are_ephemeral

    run_dir.mkdir(parents=True, exist_ok=True)
    cfg.to_yaml(run_dir / "config.yaml")
    results_dir = results_dir or "results"
    result_path = Path(result_path) if result_path else result_path_for(cfg, results_dir)
    if evaluate:
        check_results_dir(result_path)
    if command is None:
        from raydistill.evaluation import default_command

        command = default_command()

    init_ray(cfg)
    stop.install()  # from here to the end of the job: the teacher pass, every stage, the evaluation
    check_resources(cfg)
    sha = git_sha()  # cached: the result record written at the end carries the same
    tracker, own_tracker = open_tracker(cfg, run_dir, tracker)
    warn_if_outputs_are_ephemeral({"run dir": run_dir, "results dir": result_path.parent,
                                   "MLflow store": tracker.tracking_uri or ""})
    with tracker if own_tracker else contextlib.nullcontext(tracker):
        tracker.log_params({**_summary_params(cfg), "git_sha": sha,
                            "config": cfg.to_dict(), "stages": ",".join(s.name for s in stages)})
        history, stage_summaries, cache_info, init_model = _train_stages(cfg, stages, run_dir, tracker, own_tracker,
                                                                         progress, stage_reporter)
        final_best = Path(init_model)
        model_dir = run_dir / "best"
        if final_best.resolve() != model_dir.resolve():  # multi-stage: run_dir/best is the final model
            from raydistill.fileio import copy_directory

            copy_directory(final_best, model_dir)

        try:
            raise_if_stop_requested("before the final evaluation")
            # A Ray Tune trial logs into the sweep's run: its model is one candidate, not the one to register.
            register = cfg.tracking.register_model if own_tracker else None
            record = _evaluate_and_record(cfg, stages, stage_summaries, cache_info, history, model_dir, run_dir,
                                          tracker, result_path, command, started, cpu_started, evaluate, register)
        except JobStopped as exc:
            exc.where = exc.where or "during the final evaluation"
            exc.kept = "training is complete (final checkpoints, best model); the next run trains no step again"
            if own_tracker:
                tracker.end("KILLED")
            raise _explained(exc, cfg, run_dir) from None
    return record


def _train_stages(cfg, stages, run_dir: Path, tracker, own_tracker: bool, progress, stage_reporter
                  ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any], str]:
    """Every stage in order, each starting from the previous one's best model: ``(history, stage summaries, the
    first stage's data info, the last stage's best model directory)``. A stop ends the MLflow run it owns KILLED."""
    history: list[dict[str, Any]] = []
    stage_summaries: list[dict[str, Any]] = []
    cache_info: dict[str, Any] = {}
    init_model: str | None = None
    step_offset = 0
    for stage in stages:
        try:
            raise_if_stop_requested(f"before stage {stage.index} ({stage.name})")
            reporter = None
            if stage_reporter is not None:
                earlier = [s["best_stsb_dev"] for s in stage_summaries if s.get("best_stsb_dev") is not None]
                reporter = stage_reporter(stage.index, len(stages), step_offset, max(earlier) if earlier else None)
            summary, data_info = _run_stage(stage, tracker, init_model, step_offset, history, progress, reporter,
                                            resume_hint=f"run the same command with run_dir {run_dir} to resume")
        except JobStopped as exc:
            if own_tracker:
                tracker.end("KILLED")  # stopped from outside, not failed: the run resumes from what it kept
            raise _explained(exc, cfg, run_dir) from None
        if stage.index == 1:
            cache_info = data_info
        stage_summaries.append({k: v for k, v in summary.items() if k != "history"} | {"data": data_info})
        init_model = summary["best_dir"]
        step_offset += summary["total_steps"]
    return history, stage_summaries, cache_info, init_model


def _run_stage(stage, tracker, init_model: str | None, step_offset: int, history: list[dict[str, Any]],
               progress: ProgressHook | None = None, reporter=None, resume_hint: str | None = None,
               ) -> tuple[dict[str, Any], dict[str, Any]]:
    from raydistill.methods import CORPUS
    from raydistill.runtime.engine.learner_group import LearnerGroup
    from raydistill.runtime.jobs.stage_data import build_stage_data

    cfg, spec = stage.cfg, stage.spec
    stage.run_dir.mkdir(parents=True, exist_ok=True)
    data_started = time.perf_counter()
    try:
        data = build_stage_data(cfg, spec)
    except JobStopped as exc:
        if spec.dataset == CORPUS and cfg.data.teacher_views and cfg.teacher:
            exc.where = f"during stage {stage.index} ({stage.name})'s teacher pass"
            exc.kept = (f"the teacher vectors encoded so far are in the teacher cache {cfg.resolved_cache_dir()}; "
                        "the next run sends only the sentences not cached yet through the teacher")
        else:
            exc.where = f"while stage {stage.index} ({stage.name}) prepared its data"
        raise
    data_seconds = time.perf_counter() - data_started
    stats = dict(getattr(data, "cache_stats", {}) or {})
    data_info = {"rows": data.num_rows, "seconds": round(data_seconds, 2), **jsonable(stats)}
    prefix = f"stage{stage.index}." if step_offset or stage.index > 1 or stage.spec.stages else ""
    if "hits" in stats:
        report_teacher_cache(stage.name, stats, data_seconds, tracker, step_offset)
        tracker.log_params({f"{prefix}cache.hits": stats["hits"], f"{prefix}cache.misses": stats["misses"],
                            f"{prefix}cache.teacher_forward_sentences": stats["teacher_forward_sentences"]})
    for i, info in enumerate(stats.get("own_teachers") or ()):  # a method's own teachers (MethodSpec.build_rows)
        tracker.log_params({f"{cfg.method}.teacher{i}.{key}": info.get(key)
                            for key in ("model", "heldout_accuracy", "cached") if key in info})
    tracker.log_params({f"{prefix}corpus_size": data.num_rows, f"{prefix}views": ",".join(cfg.data.views)})
    if stats.get("input"):  # what reading the corpus dropped or kept as is (pipeline docstring)
        tracker.log_params({f"{prefix}input.{key}": value for key, value in stats["input"].items()})

    def on_metrics(metrics: dict[str, float], step: int) -> None:
        row = {"step": step_offset + step, "stage": stage.index, **metrics}
        history.append(row)
        tracker.log_metrics({**metrics, "stage": stage.index}, step=step_offset + step)
        if progress is not None:
            progress("step", metrics, step_offset + step)

    def on_eval(metrics: dict[str, float], step: int) -> None:
        history.append({"step": step_offset + step, "stage": stage.index, **metrics})
        tracker.log_metrics(metrics, step=step_offset + step)
        if progress is not None:
            progress("eval", metrics, step_offset + step)

    group = LearnerGroup(cfg, spec, run_dir=stage.run_dir, init_model=init_model,
                         teacher_dim=getattr(data, "teacher_dim", None), name=stage.name, reporter=reporter,
                         resume_hint=resume_hint)  # the job's run dir: a stage's own is a folder inside it
    length = group.run_length(data)
    total_steps = length.total
    budget = cfg.train.budget_limit()
    steps = (f"a {budget.describe()} budget (steps fixed from the measured step rate)" if length.pending else
             f"{total_steps} steps" + (f" (budget; {length.epochs} epoch(s))" if budget is not None else ""))
    print(f"[{stage.name}] stage {stage.index}: {data.num_rows} rows, {steps} of "
          f"{cfg.train.batch_size} x {group.world_size} learner(s)", flush=True)
    if progress is not None:
        counts = {k: stats[k] for k in ("hits", "misses", "teacher_forward_sentences") if k in stats}
        progress("stage", {"stage": stage.index, "method": stage.name, "rows": data.num_rows,
                           "total_steps": total_steps, "step_offset": step_offset, **counts}, step_offset)
    def on_event(kind: str, info: dict[str, Any], step: int) -> None:
        if kind == "start" and progress is not None:
            progress("start", info, step_offset + step)

    summary = group.fit(data, on_metrics=on_metrics, on_eval=on_eval, on_event=on_event)
    # The driver hears of every runtime.log_every-th step, and a resumed run's earlier steps were logged by the
    # earlier process: the curve's other steps come from the learner's history.
    known = {(r["step"], "loss" in r) for r in history}
    for row in summary["history"]:
        key = (step_offset + row["step"], "loss" in row)
        if key not in known:
            history.append({**row, "step": step_offset + row["step"], "stage": stage.index})
    history.sort(key=lambda r: r["step"])
    return summary, data_info


def _evaluate_and_record(cfg, stages, stage_summaries, cache_info, history, model_dir: Path, run_dir: Path,
                         tracker, result_path: Path, command: str, started: float, cpu_started: float,
                         evaluate: bool, register: str | None = None) -> dict[str, Any]:
    from raydistill.evaluation import STS7, evaluate_sts
    from raydistill.evaluation.sts import sts_predictions
    from raydistill.models import BiEncoder
    from raydistill.evaluation.plots import plot_dev_scatter, plot_learning_curve

    model = BiEncoder.from_pretrained(str(model_dir))
    params_m = sum(p.numel() for p in model.parameters()) / 1e6
    scores: dict[str, float] = {}
    # An earlier stage's best model is a student in its own right (DistilCSE's stage 1 is label-free CKD): its
    # 7-STS goes into the record beside the final one, so one run reports both.
    stage_scores: list[dict[str, float] | None] = [None] * len(stage_summaries)
    if evaluate:
        for index, summary in enumerate(stage_summaries[:-1]):
            print(f"[{cfg.method}] evaluating stage {index + 1}'s best {summary['best_dir']} on 7 STS sets + "
                  "STS-B dev", flush=True)
            stage_model = BiEncoder.from_pretrained(str(summary["best_dir"]))
            stage_scores[index] = evaluate_sts(stage_model, sets=STS7 + ("stsb_dev",), progress=False)
            print(f"[{cfg.method}] stage {index + 1} ({stages[index].name}) 7-STS avg "
                  f"{stage_scores[index]['avg']:.2f}", flush=True)
            del stage_model
        print(f"[{cfg.method}] evaluating {model_dir} on 7 STS sets + STS-B dev", flush=True)
        scores = evaluate_sts(model, sets=STS7 + ("stsb_dev",), progress=False)
        tracker.log_metrics({f"test_{k}": v for k, v in scores.items()}, step=sum(s["total_steps"]
                                                                                  for s in stage_summaries))

    # A restarted learner replays the steps after its checkpoint: keep the last row per (step, kind).
    rows_by_key = {(row["step"], "loss" in row): row for row in history}
    history = [rows_by_key[key] for key in sorted(rows_by_key)]
    plots_dir = run_dir / "plots"
    curve = dev_plot = None
    if history:
        curve = plot_learning_curve(history, plots_dir / "learning_curve.png",
                                    title=f"{cfg.method}: {_short(cfg.student)} ← {teacher_label(cfg) or 'itself'}")
    if evaluate:
        predicted, gold = sts_predictions(model, "stsb_dev")
        dev_plot = plot_dev_scatter(gold, predicted, plots_dir / "stsb_dev_scatter.png",
                                    title=f"STS-B dev, {cfg.method} {_short(cfg.student)}")

    training = _training_record(cfg, stages, stage_summaries, stage_scores, cache_info, history, run_dir)
    record_fields = dict(
        kind="distill", method=cfg.method, model=cfg.student, encoder="bi", teacher=teacher_label(cfg),
        params_m=round(params_m, 3), scores={k: round(v, 2) for k, v in scores.items()},
        training=jsonable(training), wall_s=round(time.time() - started, 1),
        cpu_s=round(cpu_seconds(children=True) - cpu_started + sum(s.get("actor_cpu_s", 0.0) for s in stage_summaries), 1),
        model_dir=str(model_dir), command=command,
    )
    return record_result(cfg, record_fields, scores, tracker, run_dir, result_path, model_dir, (curve, dev_plot),
                         register, step=sum(s["total_steps"] for s in stage_summaries), evaluate=evaluate)


def record_result(cfg: JobConfig, fields: dict[str, Any], scores: dict[str, float], tracker, run_dir: Path,
                  result_path: Path, model_dir: Path, plots, register: str | None, *, step: int,
                  evaluate: bool = True) -> dict[str, Any]:
    """A job's ending: the result file ``fields`` (with ``evaluate``; a file holding another run's record is left
    alone), and in MLflow that file, the ``plots`` and the model. Returns the record with its ``result_path``."""
    from raydistill.evaluation import write_result
    from raydistill.evaluation.results import result_path_of_run
    from raydistill.runtime.engine.model_logging import log_job_model

    if tracker.run_id:
        fields["mlflow_run_id"] = tracker.run_id
    record = fields
    if evaluate:
        result_path = result_path_of_run(result_path, run_dir,
                                         report=lambda message: print(f"[{cfg.method}] {message}", flush=True))
        result_path.parent.mkdir(parents=True, exist_ok=True)
        record = write_result(str(result_path), **fields)
        if not isinstance(record, dict):
            record = json.loads(result_path.read_text())
        print(f"[{cfg.method}] 7-STS avg {scores.get('avg', float('nan')):.2f}, STS-B dev "
              f"{scores.get('stsb_dev', float('nan')):.2f}; wrote {result_path}", flush=True)
        tracker.log_artifact(result_path)
    for plot in plots:
        if plot is not None:
            tracker.log_artifact(plot, "plots")
    log_job_model(tracker, model_dir, register, step=step, tags=job_tags(cfg), prefix=f"[{cfg.method}]")
    return {**record, "result_path": str(result_path) if evaluate else None}


def _training_record(cfg, stages, stage_summaries, stage_scores, cache_info, history, run_dir: Path
                     ) -> dict[str, Any]:
    """The result file's ``training`` section: the run's settings and what each stage measured."""
    from raydistill.runtime.engine.learner_state import dev_selection

    last = stage_summaries[-1]
    first_data = stage_summaries[0]["data"]
    training = {
        **training_settings(cfg, run_dir),
        "sentences": first_data["rows"],
        "steps": sum(s["steps"] for s in stage_summaries),
        "student_projection_init": cfg.student_projection_init,
        "best_step": last["best_step"],
        "best_stsb_dev": round(last["best_stsb_dev"], 2) if last["best_stsb_dev"] is not None else None,
        # what the dev evaluations scored (best_stsb_dev, dev_curve): STS-B dev, or the user's dev pairs
        "selected_on": dev_selection(stages[-1].cfg),
        "budget": cfg.train.budget,
        "restarts": sum(s["restarts"] for s in stage_summaries),
        "resumed_from": stage_summaries[0].get("resumed_from"),
        "teacher_cache": {k: cache_info.get(k) for k in ("hits", "misses", "teacher_forward_sentences")
                          if k in cache_info},
        "stages": [{k: s.get(k) for k in ("steps", "total_steps", "best_step", "best_stsb_dev", "restarts",
                                             "resumed_from", "seconds", "rows", "world_size")}
                   | {"method": stage.name, "lr": stage.cfg.train.lr, "epochs": stage.cfg.train.epochs,
                      "batch_size": stage.cfg.train.batch_size}
                   | ({"scores": {k: round(v, 2) for k, v in stage_score.items()}} if stage_score else {})
                   for s, stage, stage_score in zip(stage_summaries, stages, stage_scores)],
        "cpu_s_note": "driver process, its children and the learner workers; the teacher pool's Ray Data actors "
                      "are not counted (their wall time is training.teacher_pass_s)",
        "teacher_pass_s": first_data.get("seconds"),
        # [step, STS-B dev] of every evaluation, steps counted over all stages: why a run peaked where it did
        "dev_curve": [[int(row["step"]), round(float(row["stsb_dev"]), 2)] for row in history
                      if row.get("stsb_dev") is not None],
    }
    if "teacher_accuracy" in first_data:  # DvBERT: each trained teacher's held-out NLI accuracy
        training["teacher_accuracy"] = first_data["teacher_accuracy"]
    if stages[0].spec.build_rows is not None:  # a method with teachers of its own: what its rows are made of
        training["built_rows"] = {k: v for k, v in first_data.items() if k not in ("rows", "seconds")}
    return training


def training_settings(cfg: JobConfig, run_dir: Path) -> dict[str, Any]:
    """The ``training`` fields of a result file that every job records the same way: its config's settings."""
    return {"corpus": cfg.data.corpus, "views": dict(cfg.data.views), "teacher_views": list(cfg.data.teacher_views),
            "epochs": cfg.train.epochs, "batch_size": cfg.train.batch_size, "lr": cfg.train.lr,
            "max_length": cfg.data.max_length, "precision": cfg.train.precision, "seed": cfg.seed,
            "loss": dict(cfg.loss), "config_hash": cfg.config_hash(), "run_dir": str(run_dir), "transductive": False}


def jsonable(value: Any) -> Any:
    """Plain JSON types (numpy scalars and paths become numbers and strings)."""
    return json.loads(json.dumps(value, default=lambda o: o.item() if hasattr(o, "item") else str(o)))
