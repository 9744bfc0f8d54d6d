"""Pytest plugin: what each bad-input and fault test did, written to docs/reliability.json for docs/reliability.md.

A test module opts in with ``pytest_plugins = ["tests.reliability_log"]`` and records one row per case it tries:

    def test_score_outside_the_scale(reliability, tmp_path):
        ...                                                   # try the bad input for real, assert the behaviour
        reliability.record("data file", "score outside the scale", input="STS line with score 7.5",
                           did="refused the file", message=str(error), lost="nothing: refused before training")

Columns: ``area`` (groups the table: "data file", "CLI", "checkpoint", "fault", ...), ``case``, ``input`` (what was
tried), ``did`` (what the system did, in words: refused, skipped and counted, resumed...), ``message`` (optional:
the exact error or log text the user saw), ``lost`` (work or data lost), plus free-form ``details`` (kept in the
JSON only). The plugin adds the test's node id, ``e2e`` (whether the test carries the ``e2e`` mark, which the
default run and CI deselect, so the summary counts it apart) and its outcome (passed / failed), so a row whose
assertions failed says so in the table instead of describing a behaviour that did not happen.

At the end of the session the rows are merged into the file ``$RAYDISTILL_RELIABILITY_LOG`` names (the committed
log is ``docs/reliability.json``; without the variable nothing is written, so a plain test run never changes a
tracked file): rows of the tests that ran replace their previous rows, rows of tests that did not run are
kept, rows of test files that no longer exist are dropped. A test that failed before recording all its rows (an
assertion before ``record``) does not make its cases vanish from the table: its previous rows whose case it did
not record again stay, marked ``failed``. Paths are made machine-independent (pytest's temp dir
becomes ``<tmp>``, the checkout ``.``), so re-running unchanged tests rewrites the same file.
``python scripts/reliability_table.py`` renders the markdown.
"""

from __future__ import annotations

import ast
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from raydistill.fileio import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
LOG_ENV = "RAYDISTILL_RELIABILITY_LOG"

_OUTCOME = pytest.StashKey[str]()


@dataclass
class _SessionLog:
    rows: list[dict[str, Any]] = field(default_factory=list)
    ran: dict[str, str] = field(default_factory=dict)  # node id -> outcome, of tests that used the fixture
    replacements: list[tuple[str, str]] = field(default_factory=list)


_SESSION_KEY = pytest.StashKey[_SessionLog]()


class Recorder:
    """Collects the rows of one test; handed out by the ``reliability`` fixture."""

    def __init__(self, nodeid: str, position: list[int], session_log: _SessionLog, *, e2e: bool):
        self.nodeid = nodeid
        self.position = position
        self.e2e = e2e
        self._log = session_log
        self.rows: list[dict[str, Any]] = []

    def record(self, area: str, case: str, *, input: str, did: str, lost: str, message: str | None = None,
               **details: Any) -> None:
        row = {"area": area, "case": case, "input": input, "did": did, "lost": lost, "test": self.nodeid,
               "e2e": self.e2e, "position": [*self.position, len(self.rows)]}  # table order: the test file's order
        if message is not None:
            row["message"] = message  # the exact text the user saw (error message, log line), shown as code
        if details:
            row["details"] = details
        self.rows.append(_normalise(row, self._log.replacements))


def _normalise(value: Any, replacements: list[tuple[str, str]]) -> Any:
    if isinstance(value, str):
        for old, new in replacements:
            value = value.replace(old, new)
        # A test's own temp dir (pytest numbers them): <tmp>/test_name0/x -> <tmp>/x, <tmp>/test_name0 -> <tmp>
        value = re.sub(r"<tmp>/[\w.-]*?\d+/", "<tmp>/", value)
        value = re.sub(r"<tmp>/[\w.-]*?\d+(?=[:\s,;)]|$)", "<tmp>", value)
        value = re.sub(r"/tmp/rd-ray-[\w-]+", "<ray temp dir>", value)
        value = re.sub(r"\b\d+ MiB free\b", "N MiB free", value)  # this machine's disk
        return re.sub(r"(\.(?:tmp|old)-)\d+", r"\1<pid>", value)
    if isinstance(value, dict):
        return {k: _normalise(v, replacements) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normalise(v, replacements) for v in value]
    return value


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    report = yield
    if report.when == "call" or (report.when == "setup" and not report.passed):
        item.stash[_OUTCOME] = "passed" if report.passed else ("skipped" if report.skipped else "failed")
    return report


@pytest.fixture
def reliability(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Recorder:
    """Record what the system did with a bad input or a fault; see the module docstring."""
    session_log = request.config.stash.setdefault(_SESSION_KEY, _SessionLog())
    if not session_log.replacements:
        base = str(tmp_path_factory.getbasetemp())
        session_log.replacements = [(base, "<tmp>"), (str(ROOT) + "/", ""), (str(ROOT), "."),
                                    (str(Path.home()) + "/", "~/")]
    # Rows are ordered as the file is: the test's line, then its parameter indices, then the order of recording.
    callspec = getattr(request.node, "callspec", None)
    position = [request.node.location[1], *(callspec.indices.values() if callspec else ())]
    recorder = Recorder(request.node.nodeid, position, session_log,
                        e2e=request.node.get_closest_marker("e2e") is not None)
    session_log.ran[request.node.nodeid] = "failed"  # until the test's outcome is known
    yield recorder
    outcome = request.node.stash.get(_OUTCOME, "failed")
    session_log.ran[request.node.nodeid] = outcome
    for row in recorder.rows:
        row["outcome"] = outcome
    session_log.rows.extend(recorder.rows)


def pytest_sessionfinish(session: pytest.Session) -> None:
    session_log = session.config.stash.get(_SESSION_KEY, None)
    if session_log is None or not session_log.ran:
        return
    if not os.environ.get(LOG_ENV):
        return  # a plain test run writes no tracked file; regenerate docs/reliability.json by naming it
    merge_rows(Path(os.environ[LOG_ENV]), session_log.rows, session_log.ran)


def merge_rows(path: Path, new_rows: list[dict[str, Any]], ran: set[str] | dict[str, str]) -> None:
    """Replace the rows of the tests in ``ran`` by ``new_rows``; keep other tests' rows whose files still exist.

    ``ran``: the node ids of the tests that ran, or a mapping node id -> outcome. A test that failed and recorded
    fewer rows than it has in the log keeps its previous rows of the cases it did not record again, marked
    ``failed``: the table shows the case failing instead of dropping it.
    """
    previous: list[dict[str, Any]] = []
    if path.is_file():
        try:
            previous = json.loads(path.read_text(encoding="utf-8")).get("rows", [])
        except (json.JSONDecodeError, AttributeError):
            previous = []  # a corrupt log is regenerated from this run rather than blocking it
    outcomes = ran if isinstance(ran, dict) else {}
    defined: dict[str, set[str]] = {}
    kept = [row for row in previous if _test_still_defined(row.get("test", ""), defined)
            and (row.get("test") not in ran or _kept_as_failed(row, outcomes, previous, new_rows))]
    kept = [dict(row, outcome="failed") if row.get("test") in ran else row for row in kept]
    rows = sorted(kept + new_rows, key=lambda row: (row["test"].split("::")[0], row.get("position", [0]),
                                                    row["test"]))
    document = {
        "about": "What each bad input and fault tried by the tests did. Written by tests/reliability_log.py at the "
                 "end of a pytest run; rendered by scripts/reliability_table.py into docs/reliability.md.",
        "rows": rows,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(document, indent=2, ensure_ascii=False) + "\n")


def _test_still_defined(test_id: str, defined: dict[str, set[str]]) -> bool:
    """Whether the test a row names still exists: its file, and a test function of that name in it (a row of a
    renamed or moved test would describe a behaviour nothing checks any more)."""
    file, _, name = test_id.partition("::")
    path = ROOT / file
    if not path.is_file():
        return False
    if file not in defined:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        defined[file] = {node.name for node in ast.walk(tree)
                         if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return re.sub(r"\[.*\]$", "", name.split("::")[-1]) in defined[file]


def _kept_as_failed(row: dict[str, Any], outcomes: dict[str, str], previous: list[dict[str, Any]],
                    new_rows: list[dict[str, Any]]) -> bool:
    """Whether ``row``, a previous row of a test that ran again, stays (as failed): the test failed, recorded fewer
    rows than before, and none of its new rows is of this case."""
    test = row.get("test")
    recorded = [new for new in new_rows if new.get("test") == test]
    failed = outcomes.get(test) == "failed" or any(new.get("outcome") == "failed" for new in recorded)
    before = sum(1 for old in previous if old.get("test") == test)
    return failed and len(recorded) < before and all(new.get("case") != row.get("case") for new in recorded)
