"""What a Ray Tune sweep of N trials costs with the teacher-embedding cache, against N separate runs.

``raydistill tune`` (raydistill/runtime/tune/__init__.py) runs the teacher pass once in the driver, through the Parquet
embedding cache, and every trial finds its teacher vectors cached. This bench runs one sweep of N = 8 trials of a
small ConGen job from an EMPTY cache (its own temporary cache and MLflow store), then one single run of the same job
with the cache warm, and reports:

    sweep_teacher_passes_per_view   teacher forward sentences of the whole sweep (driver + trials, counted by a
                                    forward hook inside the teacher) ÷ (corpus rows × teacher views); must be 1.0
    sweep_vs_cache_bound            sweep wall ÷ (teacher pass + N × single student-only run); ≤ 1 is the target
                                    (trials run concurrently where CPUs allow; ASHA is off so every trial runs its
                                    whole schedule, and the saving is the cache's alone)
    sweep_vs_separate_runs          sweep wall ÷ N × (teacher pass + single student-only run): what N independent
                                    jobs without a shared cache would cost

Ray is started before the clock (with the dashboard, as ``raydistill tune`` starts it), so neither side pays its
start-up. Trials of 1 CPU and 1 thread: two at a time on 2 cores, nothing held back (``tune.trial_concurrency``: the
trials read the cache). The sweep runs once per ``--learners-per-trial`` value, each from its own empty cache:

    0   Train's local mode in the trial process, reused by the next trial (the headline: short trials)
    1   one Ray Train worker per trial (the default of ``raydistill tune``): every trial also pays Train's start-up
        (controller, worker group, process group), which the bound does not contain; reported under
        ``by_learners_per_trial``

The single run uses the job's own resources (Train's local mode, 2 threads), as a user would run it.

    python bench/sweep.py                                # prints the summary and the JSON
    python bench/sweep.py --write results/bench-sweep.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import common  # noqa: F401  (environment before torch)

from common import RESULTS, load_average, write_record


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--student", default="bert-tiny")
    parser.add_argument("--teacher", default="minilm-l6", help="the cost ratio, not the teacher, is measured")
    parser.add_argument("--sentences", type=int, default=1024, help="corpus rows (Flickr captions)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--cpus-per-trial", type=float, default=1.0)
    parser.add_argument("--learners-per-trial", default="0,1",
                        help="comma-separated; one sweep per value, the first is the headline")
    parser.add_argument("--tracking-uri", default=None,
                        help="MLflow store for the sweep's runs (default: a temporary sqlite file, deleted after)")
    parser.add_argument("--write", type=Path, default=None, help=f"e.g. {RESULTS.name}/bench-sweep.json")
    args = parser.parse_args(argv)
    load_before = load_average()

    from raydistill.runtime import tune
    from raydistill.runtime.engine.cluster import init_ray
    from raydistill.runtime.jobs.distill import run_distillation
    from raydistill.methods import with_method_defaults

    modes = [int(value) for value in args.learners_per_trial.split(",")]
    work = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    sweeps: dict[int, dict] = {}
    try:
        tracking_uri = args.tracking_uri or f"sqlite:///{work / 'mlflow.db'}"
        for learners in modes:
            cache = work / f"embeddings-{learners}"  # each sweep starts from an empty cache
            overrides = [f"data.max_sentences={args.sentences}", f"train.batch_size={args.batch}", "train.epochs=1",
                         "train.eval_every=1000", "train.checkpoint_every=1000", f"cache_dir={cache}"]
            plan = tune.plan_sweep(
                args.student, "congen", args.teacher, overrides=overrides, sweep_dir=work / f"sweep-{learners}",
                settings={"num_samples": args.trials, "algorithm": "random", "seed": 0, "grace_evals": 10_000,
                          "num_cpus": args.cpus_per_trial, "num_learners": learners, "time_budget_s": None},
                tracking_uri=tracking_uri, evaluate_sets=(), command=common.command_line())
            base = plan.base()
            init_ray(base, dashboard=True)
            started = time.perf_counter()
            summary = tune.run_sweep(plan, verbose=0)
            sweeps[learners] = {"summary": summary, "sweep_s": time.perf_counter() - started, "cache": cache,
                                "plan": plan}
            print(f"learners per trial {learners}: sweep {sweeps[learners]['sweep_s']:.0f} s", flush=True)
        headline = sweeps[modes[0]]
        plan = headline["plan"]
        rows = headline["summary"]["teacher_passes"][0]["sentences"]
        views = len(with_method_defaults(plan.base()).data.teacher_views) or 1

        # One normal job of the same config (the space's start point), cache now warm: the student-only cost.
        single_dir = work / "single"
        single = with_method_defaults(plan.export_config(dict(plan.start_from[0]) if plan.start_from else {})
                                      .with_overrides([f"run_dir={single_dir}", f"cache_dir={headline['cache']}",
                                                       f"tracking.tracking_uri={tracking_uri}"]))
        started = time.perf_counter()
        record = run_distillation(single.validate(), evaluate=False, results_dir=work / "results")
        single_s = time.perf_counter() - started
        single_teacher = record["training"]["teacher_cache"].get("teacher_forward_sentences", 0)
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)

    def measured(sweep: dict) -> dict:
        """One sweep against the bounds, each with its own teacher pass."""
        summary, sweep_s = sweep["summary"], sweep["sweep_s"]
        teacher_s = sum(p["seconds"] for p in summary["teacher_passes"])
        forward = summary["teacher_forward_sentences"]
        return {"sweep_teacher_passes_per_view": round(forward["total"] / (rows * views), 4),
                "sweep_vs_cache_bound": round(sweep_s / (teacher_s + args.trials * single_s), 3),
                "sweep_vs_separate_runs": round(sweep_s / (args.trials * (teacher_s + single_s)), 3),
                "concurrent_trials": summary["concurrent_trials"], "teacher_forward_sentences": forward,
                "teacher_pass_s": round(teacher_s, 1), "sweep_s": round(sweep_s, 1),
                "trial_status": summary["counts"], "ended_by": summary["ended_by"]}

    by_mode = {str(learners): measured(sweep) for learners, sweep in sweeps.items()}
    result = {
        "bench": "sweep", **by_mode[str(modes[0])], "learners_per_trial": modes[0],
        "trials": args.trials, "student": args.student, "teacher": args.teacher, "method": "congen",
        "corpus_rows": rows, "teacher_views": views, "batch": args.batch, "cpus_per_trial": args.cpus_per_trial,
        "single_run_teacher_forward_sentences": single_teacher, "single_run_s": round(single_s, 1),
        "by_learners_per_trial": by_mode,
    }
    forward = result["teacher_forward_sentences"]
    print(f"sweep of {args.trials} trials: {result['sweep_s']:.0f} s; teacher pass {result['teacher_pass_s']:.0f} s "
          f"once ({forward['total']} sentences through the teacher for {rows} rows x {views} view(s); trials "
          f"{forward['trials']}); single run {single_s:.0f} s")
    print(f"sweep / (teacher + N x single) = {result['sweep_vs_cache_bound']:.2f}; sweep / N separate runs = "
          f"{result['sweep_vs_separate_runs']:.2f}")
    for learners, row in result["by_learners_per_trial"].items():
        print(f"  learners per trial {learners}: sweep {row['sweep_s']:.0f} s, vs cache bound "
              f"{row['sweep_vs_cache_bound']:.2f}")
    result = write_record(args.write, result, threads=1, load_before=load_before)
    print(json.dumps({k: result[k] for k in ("sweep_teacher_passes_per_view", "sweep_vs_cache_bound",
                                             "sweep_vs_separate_runs", "load_before", "load_after")}))
    return result


if __name__ == "__main__":
    main()
