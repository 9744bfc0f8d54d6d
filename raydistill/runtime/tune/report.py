"""The end of a sweep: ``summary.json``'s trials table, the best trial's model and job config exported, the STS
scores of the best and the default trial, the MLflow runs' final state, and the table the command prints.

Ray Tune, the evaluation and the models are imported where they are used: they import Ray, numpy and torch.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from raydistill.fileio import atomic_write_text, copy_directory
from raydistill.runtime.engine.tracking import Tracker
from raydistill.runtime.tune.plan import SweepPlan
from raydistill.runtime.tune.trial import METRIC, TrialState, plain_value

__all__ = ["summarize", "prune_checkpoints", "finish_trial_runs", "export_best", "evaluate_best_and_default",
           "log_summary", "format_trials_table"]


def summarize(plan: SweepPlan, teacher_pass: dict[str, Any], started: float) -> dict[str, Any]:
    """The content of ``summary.json``: one row per trial (Tune's status with the trial's own ``trial.json``), best
    first; the counts, what ended the sweep and the teacher passes."""
    from ray.tune import ExperimentAnalysis
    from ray.tune.experiment import Trial

    analysis = ExperimentAnalysis(str(plan.tune_dir))
    start_points = [_canonical(p) for p in plan.start_from]
    rows = []
    for trial in sorted(analysis.trials, key=lambda t: t.trial_id):
        run_dir = plan.trial_dir(trial.trial_id)
        state = TrialState.load(run_dir, trial.trial_id)
        params = state.params or {k: plain_value(v) for k, v in (trial.config or {}).items()}
        if trial.status == Trial.ERROR:
            status = "failed"
        elif trial.status == Trial.TERMINATED:
            status = "finished" if state.status == "finished" else "stopped_early"
        else:
            status = "interrupted"
        error = state.error
        if status == "failed" and not error:
            tune_error = trial.get_error()
            error = str(tune_error).strip().splitlines()[-1][:2000] if tune_error else "unknown error"
        best_dir = run_dir / "best"
        # A failed trial whose process was lost (its own code raised nothing) continues on --resume: see prune
        lost = status == "failed" and state.status in ("running", "lost", "interrupted")
        best_dev = None if state.best_stsb_dev is None else round(float(state.best_stsb_dev), 4)
        rows.append({
            "trial_id": trial.trial_id, "params": params, "status": status, "tune_status": trial.status,
            "stopped_early": status == "stopped_early", "lost": lost, "best_stsb_dev": best_dev,
            "best_step": state.best_step, "last_step": state.last_step, "total_steps": state.total_steps,
            "reports": state.reports, "attempts": state.attempts, "resumed_from": state.resumed_from,
            "continued": state.continued,
            "teacher_forward_sentences": state.teacher_forward_sentences,
            "teacher_cache_hits": state.teacher_cache_hits, "error": error if status == "failed" else None,
            "start_point": _canonical(params) in start_points, "run_dir": str(run_dir),
            "best_dir": str(best_dir) if (best_dir / "modules.json").is_file() else None,
            "mlflow_run_id": state.mlflow_run_id,
        })
    rows.sort(key=lambda r: (r["best_stsb_dev"] is None, -(r["best_stsb_dev"] or 0.0), r["trial_id"]))
    counts = {status: sum(r["status"] == status for r in rows)
              for status in ("finished", "stopped_early", "failed", "interrupted")}
    settings = plan.sweep_settings
    elapsed = time.time() - started
    out_of_time = bool(settings.time_budget_s and elapsed >= settings.time_budget_s)
    if counts["interrupted"] or (len(rows) < plan.expected_trials() and not out_of_time):
        ended_by = "interrupted"
    else:
        ended_by = "time_budget" if out_of_time else "completed"
    passes = teacher_pass["passes"]
    driver_forward = sum(p["teacher_forward_sentences"] for p in passes)
    trial_forward = sum(r["teacher_forward_sentences"] for r in rows)
    return {
        "sweep": plan.name, "sweep_dir": plan.sweep_dir, "student": plan.student, "method": plan.method,
        "teacher": plan.teacher, "space_file": plan.space_file, "search_algorithm": plan.algorithm,
        "scheduler": {"name": settings.scheduler.upper(), "metric": METRIC, "time_attr": "step"}
        | plan.scheduler_settings(),
        "settings": plan.settings, "space": plan.params, "start_from": plan.start_from,
        "ended_by": ended_by, "trials_expected": plan.expected_trials(), "trials_total": len(rows),
        "trials": rows, "counts": counts,
        "teacher_forward_sentences": {"driver": driver_forward, "trials": trial_forward,
                                      "total": driver_forward + trial_forward},
        "teacher_passes": passes,
        "mlflow": {"tracking_uri": plan.tracking_uri, "experiment": plan.experiment,
                   "parent_run_id": plan.parent_run_id},
        "best": None, "default": None,
        "resume_command": f"raydistill tune --resume --sweep-dir {plan.sweep_dir}",
    }


def _canonical(params: dict[str, Any]) -> str:
    return json.dumps({k: float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v
                       for k, v in sorted(params.items())}, sort_keys=True)


def prune_checkpoints(plan: SweepPlan, summary: dict[str, Any]) -> None:
    """Step checkpoints of trials that Tune will not run again (a queue of 131072 x 768 is 400 MB each): their Train
    runs' storage in the sweep's Tune directory, the checkpoints a local-mode trial reported to Tune, and any in their
    run dirs; only an interrupted trial, or a failed one whose process was lost (``lost``), needs its own to continue
    on --resume. Every trial keeps its best model."""
    for row in summary["trials"]:
        if row["status"] != "interrupted" and not row.get("lost"):
            for root in Path(row["run_dir"]).rglob("checkpoints"):
                shutil.rmtree(root, ignore_errors=True)
            shutil.rmtree(plan.train_storage(row["trial_id"]), ignore_errors=True)
            for reported in (plan.tune_dir / row["trial_id"]).glob("checkpoint_*"):
                shutil.rmtree(reported, ignore_errors=True)


def finish_trial_runs(plan: SweepPlan, summary: dict[str, Any]) -> None:
    """Give every trial's MLflow run its final status (a trial stopped inside tune.report may not have)."""
    status_of = {"finished": "FINISHED", "stopped_early": "KILLED", "failed": "FAILED", "interrupted": "KILLED"}
    for row in summary["trials"]:
        if not row["mlflow_run_id"] or not plan.tracking_enabled:
            continue
        child = Tracker(plan.tracking(), run_id=row["mlflow_run_id"],
                        tags={"raydistill.trial_status": row["status"]})
        if row["best_stsb_dev"] is not None:
            child.log_metrics({"trial_best_stsb_dev": row["best_stsb_dev"]}, step=row["last_step"] or 0)
        if row["error"]:
            child.set_tags({"raydistill.error": row["error"][:500]})
        child.end(status_of[row["status"]])


def export_best(plan: SweepPlan, summary: dict[str, Any]) -> None:
    """Copy the best trial's model to ``<sweep>/best/model`` and write its job config to ``<sweep>/best/config.yaml``."""
    candidates = [r for r in summary["trials"] if r["status"] != "failed" and r["best_dir"]]
    for label, pick in (("best", candidates[:1]), ("default", [r for r in candidates if r["start_point"]][:1])):
        if pick:
            summary[label] = {k: pick[0][k] for k in ("trial_id", "params", "best_stsb_dev", "best_step", "status")}
    if not summary["best"]:
        print("[tune] no trial produced a model; nothing to export", flush=True)
        return
    best = candidates[0]
    out = Path(plan.sweep_dir) / "best"
    out.mkdir(parents=True, exist_ok=True)
    model_dir = copy_directory(best["best_dir"], out / "model")
    cfg = plan.export_config(best["params"])
    header = (f"# Tuned by `raydistill tune` (sweep {plan.name}, trial {best['trial_id']}, best STS-B dev "
              f"{best['best_stsb_dev']} at step {best['best_step']}).\n"
              f"# Searched values: {json.dumps(best['params'])}\n"
              f"# Train it as a normal job: python jobs/{plan.method}.py --config {out / 'config.yaml'}\n")
    atomic_write_text(out / "config.yaml", header + cfg.to_yaml())
    summary["best"].update(model_dir=str(model_dir), config_path=str(out / "config.yaml"))
    print(f"[tune] best trial {best['trial_id']}: STS-B dev {best['best_stsb_dev']} with {best['params']}; model "
          f"{model_dir}, config {out / 'config.yaml'}", flush=True)


def evaluate_best_and_default(plan: SweepPlan, summary: dict[str, Any]) -> None:
    """STS scores of the best and the start_from (default-setting) trial's models; result files for the 7 sets."""
    if not plan.evaluate_sets:
        return
    from raydistill.evaluation import STS7, evaluate_sts, write_result
    from raydistill.models import BiEncoder

    results_dir = Path(plan.results_dir or "results").resolve() / "tune"
    for label in ("best", "default"):
        entry = summary.get(label)
        if not entry:
            continue
        row = next(r for r in summary["trials"] if r["trial_id"] == entry["trial_id"])
        model_dir = entry.get("model_dir") or row["best_dir"]
        started = time.time()
        model = BiEncoder.from_pretrained(str(model_dir))
        scores = evaluate_sts(model, sets=tuple(plan.evaluate_sets), progress=False)
        entry["scores"] = {k: round(float(v), 2) for k, v in scores.items()}
        print(f"[tune] {label} trial {entry['trial_id']}: " + ", ".join(f"{k} {v:.2f}" for k, v in
                                                                          entry["scores"].items()), flush=True)
        if not set(STS7) <= set(scores):
            continue
        path = results_dir / f"{plan.name}-{'tuned' if label == 'best' else 'default'}.json"
        write_result(str(path), kind="tune", method=plan.method, model=plan.student, encoder="bi",
                     teacher=plan.teacher, params_m=round(sum(p.numel() for p in model.parameters()) / 1e6, 3),
                     scores=entry["scores"], wall_s=round(time.time() - started, 1), model_dir=str(model_dir),
                     command=plan.command or "raydistill tune",
                     training={"sweep": plan.name, "trial_id": entry["trial_id"], "params": entry["params"],
                               "trial_status": entry["status"], "best_stsb_dev": entry["best_stsb_dev"],
                               "best_step": entry["best_step"], "search_algorithm": plan.algorithm,
                               "trials": summary["trials_total"], "base_config_hash": plan.base().config_hash(),
                               "transductive": False},
                     **({"mlflow_run_id": row["mlflow_run_id"]} if row["mlflow_run_id"] else {}))
        entry["result_path"] = str(path)


def log_summary(parent, plan: SweepPlan, summary: dict[str, Any]) -> None:
    """The sweep's outcome on its MLflow parent run: counts, best and default scores, the best config and model."""
    counts = summary["counts"]
    metrics = {"trials_total": summary["trials_total"], "trials_finished": counts["finished"],
               "trials_stopped_early": counts["stopped_early"], "trials_failed": counts["failed"],
               "trials_interrupted": counts["interrupted"],
               "teacher_forward_sentences_total": summary["teacher_forward_sentences"]["total"],
               "teacher_forward_sentences_trials": summary["teacher_forward_sentences"]["trials"]}
    for label in ("best", "default"):
        entry = summary.get(label) or {}
        if entry.get("best_stsb_dev") is not None:
            metrics[f"{label}_stsb_dev"] = entry["best_stsb_dev"]
        for key, value in (entry.get("scores") or {}).items():
            metrics[f"{label}_test_{key}"] = value
    parent.log_metrics(metrics)
    parent.set_tags({"raydistill.ended_by": summary["ended_by"]})
    if summary.get("best"):
        parent.log_params({f"best.{k}": v for k, v in summary["best"]["params"].items()}
                          | {"best.trial_id": summary["best"]["trial_id"]})
        parent.log_artifact(summary["best"]["config_path"], "best")
        parent.log_artifacts(summary["best"]["model_dir"], "best/model")
    parent.log_artifact(Path(plan.sweep_dir) / "summary.json")


def format_trials_table(summary: dict[str, Any]) -> str:
    """The trials as a fixed-width table (best first), for the command line."""
    keys = list(summary.get("space", {}))
    header = ["trial", "status", "best dev", "step"] + [k.split(".")[-1] for k in keys]
    rows = [header]
    for row in summary["trials"]:
        dev = "-" if row["best_stsb_dev"] is None else f"{row['best_stsb_dev']:.2f}"
        step = f"{row['last_step']}/{row['total_steps'] or '?'}"
        rows.append([row["trial_id"] + ("*" if row["start_point"] else ""), row["status"], dev, step]
                    + [f"{v:.3g}" if isinstance(v, float) else "-" if v is None else str(v)
                       for v in map(row["params"].get, keys)])
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(header))]
    lines = ["  ".join(str(cell).ljust(width) for cell, width in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)
