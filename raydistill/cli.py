"""The `raydistill` command line. Thin: parses, validates, and calls the library.

    raydistill models                      presets and where each resolves on this machine
    raydistill eval --model minilm-l6      7-STS (+ STS-B dev, MRPC AUC) of a bi- or cross-encoder
    raydistill tune --student bert-mini    Ray Tune search of lr, temperatures and queue size (docs/tune.md)
    raydistill run congen [--set ...]      a distillation job on its shipped config (= python jobs/congen.py)
    raydistill distill --teacher minilm-l6 --student layers:3 --corpus FILE [--out DIR]
                                           teacher + your text -> a student to ship: the best recipe for its size,
                                           trained, evaluated and packaged (docs/distill.md)
    raydistill ui                          the MLflow UI on the runs' store, with links to each training-runs view
    raydistill serve DIR                   a packaged student over HTTP on Ray Serve (docs/cluster.md)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

from raydistill.cputime import cpu_seconds
from raydistill.argtypes import non_negative_float as _non_negative_float, non_negative_int as _non_negative_int
from raydistill.argtypes import positive_float as _positive_float, positive_int as _positive_int


def _cmd_models(args: argparse.Namespace) -> int:
    from raydistill.models.registry import describe_presets

    rows = describe_presets()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    header = ("name", "family", "layers", "hidden", "heads", "params_m", "status")
    widths = {h: max(len(h), *(len(str(r.get(h, ""))) for r in rows)) for h in header[:-1]}
    for row in [dict(zip(header, header)), *rows]:  # the status column last, unpadded
        print("  ".join(str(row.get(h, "")).ljust(widths.get(h, 0)) for h in header))
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    import torch

    from raydistill.evaluation import evaluate_pair_auc, evaluate_sts, format_scores_table, write_result
    from raydistill.models import BiEncoder, CrossEncoder, resolve_model

    if args.threads:
        torch.set_num_threads(args.threads)
    started, cpu_started = time.time(), cpu_seconds(children=True)
    model_dir = resolve_model(args.model)
    model = (CrossEncoder.from_pretrained(str(model_dir), max_length=args.max_length) if args.encoder == "cross"
             else BiEncoder.from_pretrained(str(model_dir), pooling=args.pooling, max_length=args.max_length))
    params_m = sum(p.numel() for p in model.parameters()) / 1e6

    scores = evaluate_sts(model, batch_size=args.batch_size, encoder=args.encoder, progress=not args.quiet)
    extra = {} if args.no_extra else {"mrpc_val_auc": evaluate_pair_auc(model, "mrpc_val", encoder=args.encoder)}
    row = {"model": args.model, "encoder": args.encoder, "params_m": round(params_m, 2), "scores": scores}
    print(format_scores_table([row]))
    for name, value in extra.items():
        print(f"{name}: {value:.2f}")
    if args.out:
        write_result(args.out, kind="baseline", method="none", model=args.model, encoder=args.encoder, teacher=None,
                     params_m=round(params_m, 3), scores={k: round(v, 2) for k, v in scores.items()},
                     extra={k: round(v, 2) for k, v in extra.items()}
                     | {"pooling": getattr(model, "pooling", None), "max_length": model.max_length},
                     wall_s=round(time.time() - started, 1), cpu_s=round(cpu_seconds(children=True) - cpu_started, 1),
                     model_dir=str(model_dir))
        print(f"wrote {args.out}")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from raydistill.runtime.entry import run_job

    run_job(args.job, args.job_args, prog=f"raydistill run {args.job}")
    return 0


def _cmd_ui(args: argparse.Namespace) -> int:
    """Starts ``mlflow ui`` on the store the jobs write to and prints the link to each experiment's training runs:
    MLflow 3's UI otherwise opens an experiment on its GenAI pages, where no training run shows."""
    import shutil

    from raydistill.runtime.engine.tracking import resolve_tracking_uri, training_runs_url

    uri = resolve_tracking_uri(args.store)
    url = f"http://{args.host}:{args.port}"
    if args.store is None and uri.startswith("sqlite:///") and not os.path.exists(uri[len("sqlite:///"):]):
        print(f"raydistill ui: no MLflow store at {uri} (run a job here first, or pass --store URI)", file=sys.stderr)
        return 2
    try:
        from mlflow import MlflowClient

        experiments = MlflowClient(tracking_uri=uri).search_experiments()
    except Exception as err:  # noqa: BLE001 - the UI can still start; the links are a convenience
        print(f"raydistill ui: could not list the experiments of {uri}: {err}", file=sys.stderr)
        experiments = []
    print(f"MLflow UI on {uri}: {url}")
    for experiment in experiments:
        print(f"  {experiment.name}: {training_runs_url(url, experiment.experiment_id)}")
    if args.no_serve:
        return 0
    mlflow = shutil.which("mlflow") or os.path.join(os.path.dirname(sys.executable), "mlflow")
    command = [mlflow, "ui", "--backend-store-uri", uri, "--host", args.host, "--port", str(args.port)]
    sys.stdout.flush()  # the links before the server's own log, also when stdout is a file
    os.execv(mlflow, command)  # the server replaces this process: Ctrl-C and kill reach it, nothing is orphaned


def _cmd_tune(args: argparse.Namespace) -> int:
    from raydistill.config.job import ConfigError

    try:
        return _run_tune(args)
    except ConfigError as err:  # space-file, config and resource errors name their file, line and field
        print(f"raydistill tune: {err}", file=sys.stderr)
        return 2


def _run_tune(args: argparse.Namespace) -> int:
    from raydistill.runtime import tune

    if args.list:
        spaces = tune.list_spaces()
        print(f"search spaces in {tune.spaces_dir()} (a student without its own file uses default.yaml):")
        for space in spaces:
            methods = ", ".join(f"{name} ({len(section.params)} keys)" for name, section in space.methods.items())
            print(f"  {space.name:<12} {methods}")
            if space.description:
                print(f"  {'':<12} {space.description.splitlines()[0]}")
        return 0
    if args.resume and (args.sweep_dir or args.student):
        sweep_dir = args.sweep_dir or tune.default_sweep_dir(
            args.method, args.student, args.teacher or ("mpnet-base" if tune.uses_teacher(args.method) else None))
        summary = tune.resume_sweep(sweep_dir)
    elif args.resume or not args.student:
        args.parser.error("--student is required (or --list, or --resume with --student / --sweep-dir)")
    else:
        settings = {"num_samples": args.num_samples, "time_budget_s": args.time_budget, "algorithm": args.search,
                    "seed": args.seed, "max_concurrent_trials": args.max_concurrent,
                    "scheduler": args.scheduler, "grace_evals": args.grace_evals,
                    "reduction_factor": args.reduction_factor, "perturbation_evals": args.perturbation_evals,
                    "synchronous": args.pbt_synchronous,
                    "num_cpus": args.cpus_per_trial, "num_gpus": args.gpus_per_trial,
                    "threads": args.threads_per_trial, "num_learners": args.learners_per_trial,
                    "max_trial_failures": args.max_trial_failures}
        values = {"train.lr": args.lr, "loss.queue_size": args.queue_size, "loss.tau_teacher": args.tau_teacher,
                  "loss.tau_student": args.tau_student}
        from raydistill.evaluation import STS7
        from raydistill.shipped import resolve_config

        plan = tune.plan_sweep(args.student, args.method, args.teacher, space_file=args.space,
                               config_path=resolve_config(args.config) if args.config else None,
                               overrides=args.overrides, settings=settings,
                               param_values={k: v for k, v in values.items() if v}, sweep_dir=args.sweep_dir,
                               tracking_uri=args.mlflow_uri, experiment=args.experiment,
                               evaluate_sets=() if args.no_evaluate else STS7 + ("stsb_dev",),
                               results_dir=args.results_dir)
        if args.dry_run:
            print(json.dumps(plan.to_dict(), indent=2))
            return 0
        summary = tune.run_sweep(plan)
    print(tune.format_trials_table(summary))
    best = summary.get("best")
    if best:
        print(f"best: trial {best['trial_id']} STS-B dev {best['best_stsb_dev']}; model {best.get('model_dir')}; "
              f"config {best.get('config_path')}")
    print(f"summary: {summary['sweep_dir']}/summary.json; teacher forward sentences: "
          f"{summary['teacher_forward_sentences']}")
    if summary["ended_by"] == "interrupted":
        print(f"interrupted; continue with: {summary['resume_command']}")
        return 130
    return 0


def _add_tune_parser(sub) -> None:
    tu = sub.add_parser("tune", help="Ray Tune search of a method's lr, temperatures and queue size for a student",
                        description="Ray Tune sweep (ASHA or PBT on STS-B dev) for one student; see docs/tune.md.")
    tu.add_argument("--student", type=_student, help="preset (raydistill models) or a local model directory")
    tu.add_argument("--method", type=_method, default="congen", help="distillation method (default congen)")
    tu.add_argument("--teacher", default=None, help="default mpnet-base for methods with a teacher")
    tu.add_argument("--list", action="store_true", help="list the shipped search spaces and exit")
    tu.add_argument("--space", help="search-space file (default: the shipped tune_spaces/<student>.yaml, else "
                                    "default.yaml)")
    tu.add_argument("--config", help="base job config, a file or a shipped name (default: the shipped "
                                     "configs/<method>.yaml when it exists)")
    tu.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a base-config field, e.g. train.epochs=1 (repeatable)")
    tu.add_argument("--num-samples", type=_positive_int, help="trials to run (default: the space file's)")
    tu.add_argument("--time-budget", type=_duration, help="stop the sweep after this long: 3600, 90m, 3h")
    tu.add_argument("--search", choices=("auto", "random", "optuna"),
                    help="auto (default): optuna TPE when installed, else random")
    tu.add_argument("--seed", type=int, help="search seed")
    tu.add_argument("--cpus-per-trial", type=_positive_float)
    tu.add_argument("--gpus-per-trial", type=_non_negative_float)
    tu.add_argument("--threads-per-trial", type=_positive_int, help="torch threads (default: the trial's CPUs)")
    tu.add_argument("--learners-per-trial", type=_non_negative_int,
                    help="Ray Train workers per trial (default 1); 0: each trial trains in its own process, which "
                         "saves the worker group's start-up on short trials")
    tu.add_argument("--max-trial-failures", type=_non_negative_int,
                    help="times a trial whose process was lost (OOM kill, node loss, preemption) is restarted from "
                         "its newest checkpoint (default 2; a trial whose own code raised is not retried)")
    tu.add_argument("--max-concurrent", type=_positive_int, help="trials at once (default: as resources allow)")
    tu.add_argument("--scheduler", choices=("asha", "pbt"),
                    help="asha (default): stop weak trials early; pbt: weak trials continue a strong trial's "
                         "checkpoint with perturbed lr / temperatures (needs --learners-per-trial 0)")
    tu.add_argument("--perturbation-evals", type=_positive_int,
                    help="PBT: dev evaluations between a trial's exploit/explore decisions (default 2)")
    tu.add_argument("--pbt-synchronous", action="store_true", default=None,
                    help="PBT: trials wait for each other at every decision point (compared at one step)")
    tu.add_argument("--grace-evals", type=_positive_int, help="ASHA: dev evaluations before a trial can stop")
    tu.add_argument("--reduction-factor", type=_reduction_factor, help="ASHA reduction factor (> 1)")
    tu.add_argument("--lr", type=_positive_floats, metavar="A,B,..", help="learning rates to choose from")
    tu.add_argument("--queue-size", "-K", type=_queue_sizes, metavar="K1,K2,..", help="queue sizes to choose from")
    tu.add_argument("--tau-teacher", type=_positive_floats, metavar="T1,T2,..", help="teacher temperatures")
    tu.add_argument("--tau-student", type=_positive_floats, metavar="T1,T2,..", help="student temperatures")
    tu.add_argument("--sweep-dir", help="default runs/tune/<method>-<student>-<teacher>")
    tu.add_argument("--resume", action="store_true", help="continue an interrupted sweep (finished trials kept)")
    tu.add_argument("--mlflow-uri", help="default: the config's, $MLFLOW_TRACKING_URI, sqlite:///$PWD/mlflow.db")
    tu.add_argument("--experiment", help="MLflow experiment (default raydistill-tune)")
    tu.add_argument("--results-dir", default="results", help="where results/tune/<sweep>-{tuned,default}.json go")
    tu.add_argument("--no-evaluate", action="store_true",
                    help="skip the 7-STS evaluation of the best and the default (start_from) trial")
    tu.add_argument("--dry-run", action="store_true", help="check everything, print the plan, start nothing")
    tu.set_defaults(func=_cmd_tune, parser=tu)


def _cmd_distill(args: argparse.Namespace) -> int:
    from raydistill.ship.command import run_command

    keys = ("teacher", "student", "corpus", "out", "labels", "max_sentences", "eval_pairs", "dev_pairs", "budget",
            "register", "seed", "overrides")
    return run_command({key: getattr(args, key) for key in keys}, argv=args.argv)


def _add_distill_parser(sub) -> None:
    from raydistill.ship.recipe import DEFAULT_BUDGET, recipes_help

    di = sub.add_parser(
        "distill", help="teacher + your text -> a student to ship: the best committed recipe for its size, trained, "
                        "evaluated, exported and packaged",
        description="Distil TEACHER into a STUDENT on your corpus with the recipe the committed results show is best "
                    "for the student's size (label-free unless --labels nli), then write to --out a "
                    "sentence-transformers model, its ONNX exports and a model card, and print how teacher, student "
                    "and exports score and how fast they encode. The same command again resumes. docs/distill.md.",
        epilog=recipes_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    di.add_argument("--teacher", required=True, help="a preset (raydistill models) or a local sentence-transformers "
                                                     "/ Hugging Face model directory")
    di.add_argument("--student", required=True,
                    help="a preset, a local model directory, or a shape cut from the teacher: layers:N, "
                         "layers:N,hidden:H (whole heads), layers:N,hidden:H,ffn:F; or a static token table built "
                         "from the teacher: static (256 wide), static:N (no ONNX exports)")
    di.add_argument("--corpus", required=True, help="your text: a .txt (a sentence a line), JSON Lines, CSV/TSV, "
                                                    "Parquet or datasets directory (FILE#column picks the column), "
                                                    "or a bundled corpus: mixed, flickr, nli, flickr+nli")
    di.add_argument("--out", help="output directory (default ./distilled-<teacher>-<student>); the same --out again "
                                  "resumes")
    di.add_argument("--labels", default="none", metavar="none|nli",
                    help="none (default): label-free, your text only; nli: then DistilCSE's supervised stage on the "
                         "bundled NLI triplets")
    di.add_argument("--max-sentences", type=_positive_int, metavar="N", help="a seeded sample of N corpus sentences")
    di.add_argument("--eval-pairs", metavar="FILE", help="your own scored sentence pairs, evaluated beside STS-B in "
                                                         "the report and model card (a test set: never chooses)")
    di.add_argument("--dev-pairs", metavar="FILE",
                    help="scored pairs of your domain (same format as --eval-pairs, none of them in it) that choose "
                         "the best checkpoint and stop training early, instead of STS-B dev")
    di.add_argument("--budget", metavar="TIME|STEPS|epochs",
                    help=f"how long to train: wall time (90s, 30m, 2h) or steps (2000, '2000 steps'), the corpus "
                         f"repeating as the budget needs, early stopping on; default {DEFAULT_BUDGET} (unless --set "
                         f"gives train.epochs or train.max_steps); 'epochs': the recipe's epochs")
    di.add_argument("--register", metavar="NAME", help="register the model under NAME in the MLflow Model Registry")
    di.add_argument("--seed", type=int, help="seed of sampling, shuffling and initialisation (default: the recipe's)")
    di.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="experts: any job config field on top of the recipe, e.g. train.precision=bf16 (repeatable; "
                         "raydistill run distilcse --help lists them)")

    def one_line_error(message: str):  # a bad option is one line, as every other refusal of this command
        di.exit(2, f"raydistill distill: {message} (raydistill distill --help)\n")

    di.error = one_line_error
    di.set_defaults(func=_cmd_distill)


def _add_run_parser(sub) -> None:
    from raydistill.runtime.entry import JOBS

    jobs = "\n".join(f"  {name:<12} {what}" for name, what in JOBS.items())
    run = sub.add_parser("run", help="run a distillation job on its shipped config (raydistill run JOB --help)",
                         description="Run a job from the installed package, the same as python jobs/JOB.py from "
                                     "a checkout. Arguments after JOB go to the job: raydistill run JOB --help "
                                     "lists them and every config field.",
                         epilog=f"jobs:\n{jobs}", formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("job", choices=list(JOBS), metavar="JOB", help=", ".join(JOBS))
    run.add_argument("job_args", nargs=argparse.REMAINDER, metavar="...", help="the job's own arguments")
    run.set_defaults(func=_cmd_run)


def build_parser() -> argparse.ArgumentParser:
    from raydistill.runtime.entry import JOBS

    jobs = "\n".join(f"  raydistill run {name:<12} {what}" for name, what in JOBS.items())
    parser = argparse.ArgumentParser(
        prog="raydistill", description=__doc__.split("\n\n")[0],
        epilog=f"jobs (also python jobs/<job>.py in a checkout; add --help for their options and config fields):\n"
               f"{jobs}", formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)

    models = sub.add_parser("models", help="list model presets and where they resolve offline")
    models.add_argument("--json", action="store_true", help="machine-readable output")
    models.set_defaults(func=_cmd_models)

    ev = sub.add_parser("eval", help="evaluate a model on 7-STS, STS-B dev and MRPC")
    ev.add_argument("--model", required=True, help="preset name, local directory or cached hub id")
    ev.add_argument("--encoder", choices=("bi", "cross"), default="bi")
    ev.add_argument("--pooling", choices=("mean", "cls"), default=None, help="default: the checkpoint's own, else mean")
    ev.add_argument("--max-length", type=_positive_int, default=None)
    ev.add_argument("--batch-size", type=_positive_int, default=128)
    ev.add_argument("--threads", type=_positive_int, default=None, help="torch threads (default: torch's)")
    ev.add_argument("--out", default=None, help="write a result JSON (results schema) here")
    ev.add_argument("--no-extra", action="store_true", help="skip MRPC AUC")
    ev.add_argument("--quiet", action="store_true", help="no progress lines")
    ev.set_defaults(func=_cmd_eval)

    _add_tune_parser(sub)
    _add_run_parser(sub)
    _add_distill_parser(sub)

    ui = sub.add_parser("ui", help="start the MLflow UI on the jobs' store and print each experiment's runs link",
                        description="Start `mlflow ui` on the store the jobs write to. Prints, per experiment, the "
                                    "link that opens its training runs (MLflow 3 otherwise opens its GenAI pages).")
    ui.add_argument("--store", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else "
                                    "sqlite:///$PWD/mlflow.db, as the jobs use)")
    ui.add_argument("--host", default="127.0.0.1")
    ui.add_argument("--port", type=_positive_int, default=5000)
    ui.add_argument("--no-serve", action="store_true", help="print the links only")
    ui.set_defaults(func=_cmd_ui)

    from raydistill.ship.serve import add_arguments as add_serve_arguments, run as run_serve

    srv = sub.add_parser("serve", help="serve a student over HTTP with Ray Serve, batching concurrent requests",
                         description="Serve DIR (what raydistill distill wrote) over HTTP on the Ray cluster in "
                                     "RAY_ADDRESS, else on a local Ray, until Ctrl-C. Request format, replicas and "
                                     "the measured cost: docs/cluster.md, Serving a student.")
    add_serve_arguments(srv).set_defaults(func=run_serve)
    return parser


def _reduction_factor(text: str) -> float:
    value = _positive_float(text)
    if value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number > 1, got {text}")
    return value


def _positive_floats(text: str) -> list[float]:
    return [_positive_float(part.strip()) for part in text.split(",") if part.strip()] or [_positive_float(text)]


def _queue_sizes(text: str) -> list[int]:
    sizes = []
    for part in (p.strip() for p in text.split(",")):
        try:
            sizes.append(_positive_int(part))
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"queue size K must be a positive integer, got {part!r}") from None
    return sizes


def _duration(text: str) -> float:
    from raydistill.runtime.tune import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _student(text: str) -> str:
    from raydistill.config.schema import suggest
    from raydistill.models.registry import PRESETS, find_preset
    from raydistill.models.static_embedding import static_width

    if os.path.isdir(os.path.expanduser(text)):
        return text
    try:
        static_width(text)  # "static:abc" is refused here, saying what a static width is
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if find_preset(text) is not None:
        return text
    raise argparse.ArgumentTypeError(f"unknown student {text!r}{suggest(text, PRESETS)}: not a preset "
                                     f"({', '.join(PRESETS)}) nor a model directory")


def _method(text: str) -> str:
    from raydistill.methods import job_methods

    if text not in job_methods():
        raise argparse.ArgumentTypeError(f"unknown method {text!r}; choose from {', '.join(job_methods())}")
    return text


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    args = build_parser().parse_args(argv)
    if args.command == "distill":  # the command line as given, for the model card and the result record
        given = list(sys.argv[1:] if argv is None else argv)
        args.argv = given[given.index("distill") + 1:] if "distill" in given else given
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from raydistill.models.registry import ModelNotAvailableError

    try:
        return args.func(args)
    except (ModelNotAvailableError, ValueError) as err:  # DataError and config errors carry file/line/field already
        if isinstance(err, ValueError) and type(err).__name__ not in ("DataError", "ConfigError"):
            raise
        print(f"raydistill: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
