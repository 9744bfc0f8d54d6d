"""Result files: the committed JSON records behind every number in the README and docs.

`write_result` adds provenance (git commit, UTC date, the exact command), validates against
``raydistill/schemas/result.schema.json`` (JSON Schema draft 2020-12) and writes atomically, so a results/ file is
either complete and valid or absent, never half-written. `format_scores_table` renders rows of such records as a
markdown table.

A run never overwrites another run's record: `result_path_of_run` keeps ``results/<name>.json`` for the run whose
``training.run_dir`` it records (a rerun or resume of that run updates it) and sends any other run to
``results/<name>-<run id>.json`` (``run_id``: 8 hex digits of the run dir's absolute path), saying so."""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import shlex
import subprocess
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

import jsonschema

from raydistill.evaluation.sts import STS7
from raydistill.fileio import atomic_write_text
from raydistill.nested import non_finite_numbers

__all__ = [
    "SCHEMA_PATH", "ResultError", "validate_result", "validate_result_file", "write_result", "result_path_of_run",
    "run_id", "format_scores_table", "git_sha", "code_provenance", "default_command",
]

PACKAGE_DIR = Path(__file__).resolve().parents[1]
PROJECT_DIR = PACKAGE_DIR.parent
SCHEMA_PATH = PACKAGE_DIR / "schemas" / "result.schema.json"


class ResultError(ValueError):
    """A result record that does not satisfy the schema; ``str()`` lists ``"<file>: field '<path>': <problem>"``."""

    def __init__(self, source: str, problems: list[tuple[str, str]]):
        self.source, self.problems = source, problems
        lines = [f"{source}: field '{field}': {problem}" if field else f"{source}: {problem}"
                 for field, problem in problems]
        super().__init__("\n".join(lines))


@lru_cache(maxsize=1)
def _validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def validate_result(record: dict, source: str = "<result>") -> dict:
    """Check `record` against the result schema; raise ResultError listing every problem, else return it."""
    problems = [(".".join(str(part) for part in error.absolute_path), error.message)
                for error in sorted(_validator().iter_errors(record), key=lambda e: list(map(str, e.absolute_path)))]
    # NaN / inf anywhere: the schema's "number" admits them, strict JSON cannot encode them.
    problems.extend((path, f"{number} is not a finite number (JSON cannot hold it; was a score undefined?)")
                    for path, number in non_finite_numbers(record))
    if problems:
        raise ResultError(source, problems)
    return record


def validate_result_file(path: str | os.PathLike) -> dict:
    """Read and validate one result file; return the record. Bad JSON reports its line and column."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ResultError(str(path), [("", "file not found")]) from None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as err:
        raise ResultError(f"{path}:{err.lineno}", [("", f"not valid JSON ({err.msg} at column {err.colno})")]) from None
    if not isinstance(record, dict):
        raise ResultError(str(path), [("", "a result file must hold one JSON object")])
    return validate_result(record, str(path))


@lru_cache(maxsize=4)
def code_provenance(project_dir: str = str(PROJECT_DIR)) -> dict[str, str]:
    """Which code a run used: ``{"git_sha": ...}``, plus ``code_diff_sha256`` when it differs from the commit.

    ``git_sha`` is ``git rev-parse HEAD``, with ``-dirty`` when the code differs from HEAD (a changed or untracked
    file); ``code_diff_sha256`` is then the sha256 of ``git diff HEAD`` of the code and of every untracked code file's
    name and bytes, so two runs of the same uncommitted code carry the same hash. Without a checkout (an installed
    wheel): ``raydistill <version> (installed, no git checkout)``. Only code counts (the package with its configs,
    jobs, bench, scripts): uncommitted results or docs do not make a run irreproducible. Cached: the first call of a
    process, i.e. the code it imported."""
    from raydistill import __version__

    installed = {"git_sha": f"raydistill {__version__} (installed, no git checkout)"}

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=project_dir, capture_output=True, timeout=30, check=False)

    try:
        head = git("rev-parse", "HEAD")
        sha = head.stdout.decode().strip()
        if head.returncode != 0 or not sha:
            return installed
        diff = git("diff", "--binary", "HEAD", "--", *_CODE_PATHS)
        untracked = git("ls-files", "--others", "--exclude-standard", "-z", "--", *_CODE_PATHS)
    except (OSError, subprocess.SubprocessError):
        return installed
    names = sorted(name for name in untracked.stdout.decode(errors="surrogateescape").split("\0") if name)
    if diff.returncode != 0 or (not diff.stdout and not names):
        return {"git_sha": sha}
    digest = hashlib.sha256(diff.stdout)
    for name in names:
        digest.update(b"\0untracked\0" + name.encode(errors="surrogateescape") + b"\0")
        with contextlib.suppress(OSError):
            digest.update((Path(project_dir) / name).read_bytes())
    return {"git_sha": f"{sha}-dirty", "code_diff_sha256": digest.hexdigest()}


def git_sha(project_dir: str = str(PROJECT_DIR)) -> str:
    """``code_provenance(project_dir)["git_sha"]``: the commit, ``-dirty`` when the code differs from it."""
    return code_provenance(project_dir)["git_sha"]


_CODE_PATHS = ("raydistill", "jobs", "bench", "scripts")  # the job configs ship inside raydistill/


def default_command(argv: list[str] | None = None) -> str:
    """The running command as one shell-quoted line that reproduces it from the project directory.

    A console script (``.venv/bin/raydistill``) is written by its name, ``raydistill eval ...``; a Python file
    as ``python <path> ...`` (relative to the working directory when inside it). Other arguments are verbatim."""
    argv = list(sys.argv if argv is None else argv)
    if not argv:
        return ""
    program = argv[0]
    if program.endswith(".py"):
        with contextlib.suppress(ValueError):  # another drive on Windows
            program = os.path.relpath(program) if Path(program).resolve().is_relative_to(Path.cwd()) else program
        head = ["python", program]
    elif program in ("-c", "-m", ""):
        head = ["python", program] if program else ["python"]
    else:
        head = [Path(program).name]
    return shlex.join(head + argv[1:])


def write_result(path: str | os.PathLike, **fields: Any) -> dict:
    """Validate and atomically write one result record; return it.

    ``git_sha``, ``date`` (ISO 8601, UTC) and ``command`` (`default_command`) are filled in unless given, and
    ``code_diff_sha256`` for code that differs from its commit (`code_provenance`). Sorted keys and 2-space indentation
    (stable diffs). Overwrites `path`: pick it with `result_path_of_run`."""
    record = dict(fields)
    if "git_sha" not in record:
        record.update(code_provenance())
    record.setdefault("date", dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    record.setdefault("command", default_command())
    path = Path(path)
    validate_result(record, str(path))
    text = json.dumps(record, indent=2, sort_keys=True, allow_nan=False, ensure_ascii=False) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text)
    return record


def run_id(run_dir: str | os.PathLike) -> str:
    """A short, stable id of a run: 8 hex digits of its run dir's absolute path."""
    return hashlib.sha256(os.path.abspath(os.fspath(run_dir)).encode()).hexdigest()[:8]


def _recorded_run_dir(path: Path) -> str | None:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        recorded = (record.get("training") or {}).get("run_dir")
    except (OSError, ValueError, AttributeError):
        return None
    return os.path.abspath(recorded) if isinstance(recorded, str) and recorded else None


def result_path_of_run(path: str | os.PathLike, run_dir: str | os.PathLike, report=print) -> Path:
    """Where the record of the run in ``run_dir`` goes: ``path`` when it is free or already holds this run's record
    (its ``training.run_dir``), else ``<stem>-<run id>.json`` beside it, with a message through ``report``. A file
    without a recorded run dir (an older record, or one written by hand) counts as another run's."""
    path, own = Path(path), os.path.abspath(os.fspath(run_dir))
    if not path.exists() or _recorded_run_dir(path) == own:
        return path
    other = _recorded_run_dir(path) or "a run that did not record its run dir"
    alternative = path.with_name(f"{path.stem}-{run_id(own)}{path.suffix}")
    if alternative.exists() and _recorded_run_dir(alternative) != own:
        raise ResultError(str(alternative), [("training.run_dir", f"holds the record of another run "
                                              f"({_recorded_run_dir(alternative)}), and {path} that of {other}; "
                                              "move one of them away or pass another result path")])
    report(f"{path} holds the record of {other}, not of this run ({own}); writing {alternative.name} beside it "
           f"instead. To make this run the record, move {alternative.name} over {path.name}")
    return alternative


def format_scores_table(results: list[dict]) -> str:
    """A markdown table of result records: model, encoder, params (M), the seven STS scores, avg.

    An "STS-B dev" column is added when any record has that score. Missing values print as "–"."""
    with_dev = any("stsb_dev" in record.get("scores", {}) for record in results)
    columns = ["model", "encoder", "params (M)", *STS7, "avg"] + (["STS-B dev"] if with_dev else [])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for record in results:
        scores = record.get("scores", {})
        params = record.get("params_m")
        cells = [f"`{record.get('model', '?')}`", record.get("encoder", "bi"),
                 f"{params:.1f}" if isinstance(params, (int, float)) else "–",
                 *(_cell(scores.get(name)) for name in STS7), _cell(scores.get("avg"), bold=True)]
        if with_dev:
            cells.append(_cell(scores.get("stsb_dev")))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(value: Any, bold: bool = False) -> str:
    if not isinstance(value, (int, float)):
        return "–"
    text = f"{value:.2f}"
    return f"**{text}**" if bold else text
