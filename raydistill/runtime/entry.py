"""The jobs: argument parsing, ``--help`` and the user-facing error exit, shared by ``jobs/*.py`` and ``raydistill run``.

A job script stays a few lines (``distill_job_main("congen", __doc__)``); everything it needs to know lives in its
config file, by default the one shipped in the package (``raydistill/configs/<job>.yaml``), so the same job runs
from a checkout (``python jobs/congen.py``) and from an installed wheel (``raydistill run congen``). ``--help``
lists every config field with its value in that default config and its meaning. Errors the user can fix (a config
field, a data file line, a model that is not installed, a checkpoint from another config) end the process with one
message and exit status 2, never a traceback; so does a learner or cluster that stops answering (the message says
how to resume). A job stopped by SIGTERM or SIGINT (Ctrl-C) keeps what it did (training: a checkpoint at the next
step boundary; the teacher pass: the vectors encoded so far; Trans-Encoder: every finished stage and the running
stage at its next step), says how to resume, and exits with 128 + the signal: 143 for SIGTERM, 130 for SIGINT.
Every job that trains a student takes ``--register NAME`` (``tracking.register_model``): its best student, logged as
an MLflow model at the end, becomes a new version of the registered model NAME.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

__all__ = ["USER_ERRORS", "JOBS", "exit_with_user_error", "distill_job_main", "st_mse_job_main", "tenc_job_main",
           "teacher_pass_job_main", "add_register_option", "register_overrides",
           "run_job"]

# Job name -> what it does (one line; ``raydistill --help`` and ``raydistill run --help`` print these). Each job's
# default config is the shipped ``configs/<name>.yaml``.
JOBS = {
    "mutual_tenc": "Trans-Encoder self- or mutual distillation of bi- and cross-encoders (the main job)",
    "congen": "ConGen: distil a teacher's similarity distribution over an instance queue into a student",
    "sct": "SCT: self-supervised contrastive tension, or distillation with sct-distill.yaml",
    "distilcse": "DistilCSE: CKD distillation on unlabeled text, then supervised SimCSE on NLI triplets",
    "dvbert": "DvBERT: NLI cross-encoder teachers, a teacher-annealed siamese student, then STS-B",
    "simcse": "unsupervised SimCSE: the no-teacher baseline every distilled student must beat",
    "distill": "any method of raydistill.methods, from --config (a YAML file, or a shipped name such as cosine)",
    "teacher_pass": "only the teacher pass of a config: its corpus through the teacher into the cache, once",
    "st_mse": "sentence-transformers' own distillation recipe (MSELoss to the teacher's vectors): the library baseline",
}


def _user_errors() -> tuple[type[BaseException], ...]:
    from raydistill.augment import AugmentationError, WordNetUnavailableError
    from raydistill.data.formats import DataError
    from raydistill.models.registry import ModelNotAvailableError
    from raydistill.runtime.engine.checkpoint import CheckpointError
    from raydistill.fileio import UnsafeLockFileError, UnsafeNameError
    from raydistill.config.job import ConfigError
    from raydistill.runtime.teachers.embedding_cache import CacheDiskFullError, NonFiniteTeacherVectorsError
    from raydistill.runtime.engine.learner_group import LearnerUnresponsiveError
    from raydistill.runtime.teachers.pipeline import RowsFileError

    return (ConfigError, DataError, ModelNotAvailableError, CheckpointError, AugmentationError,
            WordNetUnavailableError, LearnerUnresponsiveError, CacheDiskFullError, NonFiniteTeacherVectorsError,
            RowsFileError, UnsafeNameError, UnsafeLockFileError)


USER_ERRORS = _user_errors()


def exit_stopped(exc: BaseException) -> NoReturn:
    """A job stopped by SIGTERM / SIGINT: its message (what was kept, how to resume), then 128 + the signal."""
    from raydistill.runtime.engine.stopping import exit_status

    print(f"stopped: {exc}", file=sys.stderr)
    sys.exit(exit_status())


def exit_with_user_error(exc: BaseException) -> NoReturn:
    kind = {"ConfigError": "config error", "ResourceError": "resource error", "DataError": "data error",
            "ModelNotAvailableError": "model not available", "LearnerUnresponsiveError": "cluster error",
            }.get(type(exc).__name__, type(exc).__name__)
    print(f"{kind}: {exc}", file=sys.stderr)
    sys.exit(2)


def _run_or_exit(run):
    """``run()``, or the user-facing exit: a user error (status 2) or a stop (128 + the signal)."""
    from raydistill.runtime.engine.stopping import JobStopped

    try:
        return run()
    except USER_ERRORS as exc:
        exit_with_user_error(exc)
    except JobStopped as exc:
        exit_stopped(exc)


def _shipped_for(job: str) -> list[str]:
    """The shipped configs a job can run: its own and its variants (congen-gpu, sct-distill, self_tenc, ...)."""
    from raydistill.shipped import shipped_config_names

    stems = {"mutual_tenc": ("mutual_tenc", "self_tenc")}.get(job, (job,))
    return [name for name in shipped_config_names() if name.startswith(stems)]


def _job_parser(job: str, doc: str | None, prog: str | None, config_cls: type) -> argparse.ArgumentParser:
    """The options every job shares; ``--help`` ends with the config fields of the default config."""
    from raydistill.config.help import config_fields_help
    from raydistill.shipped import shipped_config

    default = shipped_config(job)
    try:
        values = config_cls.from_yaml(default).to_dict() if default.is_file() else {}
    except Exception:  # noqa: BLE001 - a broken default config must still leave --help readable
        values = {}
    usage = "\n".join(line for line in (doc or "").strip().splitlines()[1:]).strip()
    where = f"value in the default config, {default.name}" if default.is_file() else "what --config names"
    epilog = (f"{usage}\n\n" if usage else "") + (
        f"config fields ({where}; override any with --set KEY=VALUE):\n" + config_fields_help(config_cls, values))
    parser = argparse.ArgumentParser(prog=prog, description=JOBS.get(job) or (doc or job).strip().splitlines()[0],
                                     epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    if default.is_file():
        parser.add_argument("--config", default=str(default), metavar="FILE|NAME",
                            help=f"a YAML job config, or the name of a shipped one ({', '.join(_shipped_for(job))}); "
                                 f"default: the shipped {default.name}")
    else:  # a job for any method: the config says which
        parser.add_argument("--config", required=True, metavar="FILE|NAME",
                            help="a YAML job config, or the name of a shipped one (raydistill/configs/)")
    example = "cross.lr=3e-5" if job == "mutual_tenc" else "train.lr=1e-4"
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help=f"any config field below, e.g. --set {example} (repeatable)")
    return parser


def add_register_option(parser: argparse.ArgumentParser) -> None:
    """``--register NAME``, of every job that trains a student: its best student becomes a new version of that
    registered MLflow model (the config field ``tracking.register_model``, ``engine.model_logging``)."""
    parser.add_argument("--register", metavar="NAME",
                        help="register the best student in the MLflow Model Registry as a new version of NAME "
                             "(serve it with: mlflow models serve -m models:/NAME/<version> --env-manager local); "
                             "sets tracking.register_model")


def register_overrides(name: str | None) -> list[str]:
    """The ``--set`` that ``--register NAME`` stands for (quoted: a name such as 2024 or null stays a name)."""
    import json

    return [] if name is None else [f"tracking.register_model={json.dumps(name)}"]


def distill_job_main(method: str, doc: str | None, argv: list[str] | None = None, prog: str | None = None,
                     runner=None, run_dir_help: str = "checkpoints and best model (a re-run with the same dir resumes)"
                     ) -> dict:
    """``python jobs/<method>.py [--config FILE] [--set key=value ...] [--run-dir DIR] [--results-dir DIR]``.

    ``runner(cfg, results_dir=...)`` trains and records the job (default ``run_distillation``)."""
    from raydistill.config.job import JobConfig
    from raydistill.runtime.jobs.distill import run_distillation
    from raydistill.shipped import resolve_config

    runner = runner or run_distillation

    parser = _job_parser(method, doc, prog, JobConfig)
    parser.add_argument("--run-dir", help=run_dir_help)
    parser.add_argument("--results-dir", default="results", help="where <method>-<student>-<teacher>.json goes")
    add_register_option(parser)
    args = parser.parse_args(argv)
    overrides = args.overrides + ([f"run_dir={args.run_dir}"] if args.run_dir else []) + \
        register_overrides(args.register)
    record = _run_or_exit(lambda: runner(JobConfig.from_yaml(resolve_config(args.config), overrides),
                                         results_dir=args.results_dir))
    print(record["result_path"])
    return record


def teacher_pass_job_main(doc: str | None, argv: list[str] | None = None, prog: str | None = None) -> dict:
    """``python jobs/teacher_pass.py --config NAME``: fill the teacher cache a config's jobs read, train nothing."""
    import json

    from raydistill.config.job import JobConfig
    from raydistill.runtime.jobs.teacher_pass import run_teacher_pass
    from raydistill.shipped import resolve_config

    args = _job_parser("teacher_pass", doc, prog, JobConfig).parse_args(argv)
    try:
        stats = run_teacher_pass(JobConfig.from_yaml(resolve_config(args.config), args.overrides))
    except USER_ERRORS as exc:
        exit_with_user_error(exc)
    print(json.dumps({k: v for k, v in stats.items() if k != "views"}))
    return stats


def st_mse_job_main(doc: str | None, argv: list[str] | None = None, prog: str | None = None) -> dict:
    """``python jobs/st_mse.py``: the distillation jobs' options, trained by sentence-transformers' recipe."""
    from raydistill.runtime.jobs.st_mse import run_st_mse

    return distill_job_main("st_mse", doc, argv, prog, runner=run_st_mse,
                            run_dir_help="the final model, plots and config (no checkpoints: a re-run starts again)")


def _max_length_overrides(text: str) -> list[str]:
    """``32`` -> bi 32, cross 64 (a pair is two sentences); ``32,80`` -> bi 32, cross 80."""
    parts = [p for p in text.split(",") if p.strip()]
    try:
        lengths = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--max-length: expected N or BI,CROSS, got {text!r}") from None
    if len(lengths) not in (1, 2) or min(lengths) <= 0:
        raise argparse.ArgumentTypeError(f"--max-length: expected N or BI,CROSS (positive), got {text!r}")
    bi, cross = (lengths[0], 2 * lengths[0]) if len(lengths) == 1 else lengths
    return [f"bi.max_length={bi}", f"cross.max_length={cross}"]


def self_mode_overrides(mode: str | None, user_overrides: list[str]) -> list[str]:
    """What ``--mode self`` adds: mean label weighting and no teacher (each family learns only its own labels:
    nothing to weigh, no shared labels for a teacher; the shipped default would be refused). An explicit ``--set``
    of either is left to validation."""
    if mode != "self":
        return []
    given = {o.split("=", 1)[0].strip() for o in user_overrides}
    return [setting for setting in ("label_weighting=mean", "teacher=null") if setting.split("=")[0] not in given]


def tenc_job_main(doc: str | None, argv: list[str] | None = None, prog: str | None = None) -> dict:
    """``python jobs/mutual_tenc.py [--config FILE] [--set key=value ...] [--mode] [--pairs N] [--cycles N] ...``."""
    from raydistill.runtime.tenc import TencConfig, run_trans_encoder
    from raydistill.shipped import resolve_config

    parser = _job_parser("mutual_tenc", doc, prog, TencConfig)
    parser.add_argument("--mode", choices=("mutual", "self"), help="average the families' labels, or each its own")
    parser.add_argument("--pairs", type=int, metavar="N", help="seeded subsample of N unlabeled pairs")
    parser.add_argument("--cycles", type=int, metavar="N", help="bi->cross->bi cycles")
    parser.add_argument("--max-length", type=_max_length_overrides, metavar="N|BI,CROSS",
                        help="token limit of the bi-encoder (cross-encoder: twice that, or give both)")
    parser.add_argument("--init", choices=("refresh", "sequential"), help="start each stage from the original "
                        "checkpoint (refresh) or from the previous stage's weights (sequential)")
    parser.add_argument("--run-dir", help="labels, models and state (a re-run with the same dir resumes)")
    add_register_option(parser)
    args = parser.parse_args(argv)

    overrides = list(args.overrides)
    for key, value in (("mode", args.mode), ("pairs.max_pairs", args.pairs), ("cycles", args.cycles),
                       ("init", args.init), ("run_dir", args.run_dir)):
        if value is not None:
            overrides.append(f"{key}={value}")
    overrides += args.max_length or []
    overrides += register_overrides(args.register)
    overrides += self_mode_overrides(args.mode, args.overrides)
    summary = _run_or_exit(lambda: run_trans_encoder(TencConfig.from_yaml(resolve_config(args.config), overrides)))
    print(summary.get("results_dir") or summary["run_dir"])
    return summary


def run_job(job: str, argv: list[str] | None = None, prog: str | None = None) -> dict:
    """Run one of ``JOBS`` with its command-line arguments (``raydistill run <job> ...``)."""
    own = {"mutual_tenc": tenc_job_main, "st_mse": st_mse_job_main, "teacher_pass": teacher_pass_job_main}.get(job)
    return own(None, argv, prog) if own is not None else distill_job_main(job, None, argv, prog)
