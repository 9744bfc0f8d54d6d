"""What the ``jobs/*.py`` scripts share: argument parsing for a distillation job and the user-facing error exit.

A job script stays a few lines (``distill_job_main("congen", __doc__)``); everything it needs to know lives in its
config file. Errors the user can fix (a config field, a data file line, a model that is not installed, a checkpoint
from another config) end the process with one message and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

__all__ = ["USER_ERRORS", "exit_with_user_error", "distill_job_main"]

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def _user_errors() -> tuple[type[BaseException], ...]:
    from raydistill.augment import AugmentationError, WordNetUnavailableError
    from raydistill.data.readers import DataError
    from raydistill.models.registry import ModelNotAvailableError
    from raydistill.runtime.checkpoint import CheckpointError
    from raydistill.runtime.config import ConfigError

    return (ConfigError, DataError, ModelNotAvailableError, CheckpointError, AugmentationError,
            WordNetUnavailableError)


USER_ERRORS = _user_errors()


def exit_with_user_error(exc: BaseException) -> NoReturn:
    kind = {"ConfigError": "config error", "ResourceError": "resource error", "DataError": "data error",
            "ModelNotAvailableError": "model not available"}.get(type(exc).__name__, type(exc).__name__)
    print(f"{kind}: {exc}", file=sys.stderr)
    sys.exit(2)


def distill_job_main(method: str, doc: str | None, argv: list[str] | None = None) -> dict:
    """``python jobs/<method>.py [--config FILE] [--set key=value ...] [--run-dir DIR] [--results-dir DIR]``."""
    from raydistill.runtime.config import JobConfig
    from raydistill.runtime.distill import run_distillation

    parser = argparse.ArgumentParser(description=(doc or method).strip().splitlines()[0])
    parser.add_argument("--config", default=str(PROJECT_ROOT / "configs" / f"{method}.yaml"))
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="any config field, e.g. --set train.lr=1e-4 (repeatable)")
    parser.add_argument("--run-dir", help="checkpoints and best model (a re-run with the same dir resumes)")
    parser.add_argument("--results-dir", default="results", help="where <method>-<student>-<teacher>.json goes")
    args = parser.parse_args(argv)
    overrides = args.overrides + ([f"run_dir={args.run_dir}"] if args.run_dir else [])
    try:
        cfg = JobConfig.from_yaml(args.config, overrides)
        record = run_distillation(cfg, results_dir=args.results_dir)
    except USER_ERRORS as exc:
        exit_with_user_error(exc)
    print(record["result_path"])
    return record
