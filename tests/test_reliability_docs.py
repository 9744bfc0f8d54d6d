"""docs/reliability.md is generated from docs/reliability.json, and every row names a test that still exists.

Fails when the committed pair disagrees (the json was updated by a test run but the table was not regenerated, or
the table was edited by hand), when a row's test function was renamed or removed (the row would describe a behaviour
nothing checks any more), when a row's ``e2e`` flag is not its test's mark (the summary would count a case CI does
not run as one it does), or when a case the docs promise is missing or did not pass."""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import reliability_table  # noqa: E402

from tests.reliability_log import merge_rows  # noqa: E402

# Cases the reliability docs promise by name (README's reliability section); each must have a passing row.
PROMISED_CASES = (
    "checkpoint-pickle-refused", "checkpoint-truncated-fallback", "resume-config-changed-before-ray",
    "run-dir-locked", "resave-crash-safe", "sigterm-checkpoint", "nonfinite-grad", "ray-head-lost",
    "driver-kill-exact", "queue-kill-all-ranks", "cache-rows-once",
    "cache-nan-recomputed", "teacher-identity-full", "resume-runtime-settings", "storage-path-change-refused",
    "tune-trial-retried", "rows-file-verified", "cache-disk-full", "sigterm-teacher-pass", "sigterm-main-job",
    "result-not-overwritten", "state-files-durable", "config-nonfinite-refused", "tracking-retries", "node-lost",
    "unsafe-names-refused", "learner-unresponsive",
)


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return reliability_table.load_rows(reliability_table.DEFAULT_JSON)


def test_the_markdown_is_the_rendering_of_the_json(rows):
    committed = reliability_table.DEFAULT_MD.read_text(encoding="utf-8")
    assert committed == reliability_table.render(rows), (
        "docs/reliability.md differs from what docs/reliability.json renders to: run "
        "python scripts/reliability_table.py")


def _test_functions(file: Path) -> set[str]:
    tree = ast.parse(file.read_text(encoding="utf-8"))
    return {node.name for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test")}


def test_every_row_names_a_test_that_exists(rows):
    missing = []
    functions: dict[str, set[str]] = {}
    for row in rows:
        file, _, name = row["test"].partition("::")
        path = ROOT / file
        if not path.is_file():
            missing.append(f"{row['test']} (no file {file})")
            continue
        if file not in functions:
            functions[file] = _test_functions(path)
        function = re.sub(r"\[.*\]$", "", name.split("::")[-1])  # parametrised ids: test_x[case] -> test_x
        if function not in functions[file]:
            missing.append(row["test"])
    assert not missing, "rows of docs/reliability.json name tests that no longer exist: " + ", ".join(missing)


def _carries_e2e(decorators_or_value: list[ast.expr]) -> bool:
    return any(isinstance(node, ast.Attribute) and node.attr == "e2e"
               for expr in decorators_or_value for node in ast.walk(expr))


def _e2e_tests(file: Path) -> set[str]:
    """The test functions of ``file`` that carry pytest's ``e2e`` mark: their own, their class's or the module's
    ``pytestmark``."""
    tree = ast.parse(file.read_text(encoding="utf-8"))

    def pytestmark(body: list[ast.stmt]) -> list[ast.expr]:
        return [node.value for node in body if isinstance(node, ast.Assign)
                and any(isinstance(target, ast.Name) and target.id == "pytestmark" for target in node.targets)]

    found: set[str] = set()

    def visit(body: list[ast.stmt], inherited: bool) -> None:
        inherited = inherited or _carries_e2e(pytestmark(body))
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, inherited or _carries_e2e(node.decorator_list))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if inherited or _carries_e2e(node.decorator_list):
                    found.add(node.name)

    visit(tree.body, False)
    return found


def test_each_rows_e2e_flag_is_its_tests_mark(rows):
    e2e: dict[str, set[str]] = {}
    wrong = []
    for row in rows:
        file, _, name = row["test"].partition("::")
        if file not in e2e:
            e2e[file] = _e2e_tests(ROOT / file)
        if row["e2e"] != (re.sub(r"\[.*\]$", "", name.split("::")[-1]) in e2e[file]):
            wrong.append(f"{row['test']} ({row['case']}): e2e {row['e2e']}")
    assert not wrong, ("rows of docs/reliability.json whose e2e flag is not their test's mark; rerun those tests with "
                       "RAYDISTILL_RELIABILITY_LOG=docs/reliability.json: " + "; ".join(wrong))
    assert any(row["e2e"] for row in rows) and not all(row["e2e"] for row in rows)


def test_the_summary_counts_what_ci_runs_and_lists_the_e2e_cases_apart():
    def row(case: str, e2e: bool, lost_steps: int) -> dict:
        return {"area": "fault", "case": case, "input": "x", "did": "y", "lost": "z", "test": "tests/t.py::t",
                "e2e": e2e, "outcome": "passed", "details": {"lost_steps": lost_steps}}

    lines = reliability_table.summary_lines([row("sigterm", False, 0), row("ray-head-lost", True, 2),
                                             row("node-lost", True, 3)])
    assert lines[0].startswith("- Cases tried by CI (the default test run): 1 in 1 areas (1 passed)")
    assert lines[1].startswith("- Faults survived: 1 of 1 faults")
    assert "steps lost: 0 optimiser steps trained again in total over the 1 faults" in lines[1]
    assert lines[2].startswith("- Whole-job cases checked by `pytest -m e2e` (not run by CI): 2 (2 passed), "
                               "2 of them faults: ray-head-lost; node-lost")


def test_promised_cases_have_a_passing_row(rows):
    outcomes: dict[str, list[str]] = {}
    for row in rows:
        outcomes.setdefault(row["case"], []).append(row.get("outcome", "unknown"))
    problems = [f"{case}: {outcomes.get(case, 'no row')}" for case in PROMISED_CASES
                if outcomes.get(case) is None or any(o != "passed" for o in outcomes[case])]
    assert not problems, "reliability cases without a passing row: " + "; ".join(problems)


def test_the_checks_catch_what_they_name(tmp_path, rows):
    """The two checks above can fail: a stale table and a row of a vanished test are both caught."""
    stale = reliability_table.render(rows).replace("passed", "PASSED", 1)
    assert stale != reliability_table.render(rows)
    json_path, md_path = tmp_path / "r.json", tmp_path / "r.md"
    json_path.write_text(json.dumps({"rows": rows}), encoding="utf-8")
    md_path.write_text(stale, encoding="utf-8")
    assert reliability_table.main(["--json", str(json_path), "--out", str(md_path), "--check"]) == 1
    vanished = dict(rows[0], test=rows[0]["test"].split("::")[0] + "::test_that_was_renamed")
    function = vanished["test"].split("::")[-1]
    assert function not in _test_functions(ROOT / vanished["test"].split("::")[0])


def _row(test: str, case: str, outcome: str = "passed", position: int = 0) -> dict:
    return {"area": "fault", "case": case, "input": "x", "did": "y", "lost": "z", "test": test,
            "position": [1, position], "outcome": outcome}


@pytest.mark.parametrize("outcome, recorded, expected", [
    # A test that failed before recording anything keeps both its cases, failed.
    ("failed", [], [("one", "failed"), ("two", "failed")]),
    # One case recorded (failed) before the assertion that failed: the other stays, failed.
    ("failed", [("two", "failed")], [("one", "failed"), ("two", "failed")]),
    # A passing test that records fewer cases than before renamed or dropped one: the old case goes.
    ("passed", [("one", "passed")], [("one", "passed")]),
    # A failing test that recorded as many rows as before: its new rows replace the old ones.
    ("failed", [("one", "failed"), ("three", "failed")], [("one", "failed"), ("three", "failed")]),
], ids=["failed-nothing-recorded", "failed-one-of-two", "passed-fewer", "failed-as-many"])
def test_merge_rows_shows_a_failed_test_instead_of_dropping_its_rows(tmp_path, outcome, recorded, expected):
    test = "tests/test_reliability_docs.py::test_promised_cases_have_a_passing_row"  # any test defined here
    other = "tests/test_reliability_docs.py::test_the_checks_catch_what_they_name"
    log = tmp_path / "reliability.json"
    merge_rows(log, [_row(test, "one", position=0), _row(test, "two", position=1), _row(other, "kept")], set())
    merge_rows(log, [_row(test, case, result, position=i) for i, (case, result) in enumerate(recorded)],
               {test: outcome})
    rows = json.loads(log.read_text(encoding="utf-8"))["rows"]
    assert sorted((r["case"], r["outcome"]) for r in rows if r["test"] == test) == expected
    assert [(r["case"], r["outcome"]) for r in rows if r["test"] == other] == [("kept", "passed")]


def test_merge_rows_drops_the_rows_of_a_test_that_no_longer_exists(tmp_path):
    """A test renamed or moved to another file: its old rows go instead of describing what nothing checks."""
    log = tmp_path / "reliability.json"
    kept = "tests/test_reliability_docs.py::test_every_row_names_a_test_that_exists"
    merge_rows(log, [_row("tests/test_reliability_docs.py::test_that_was_moved", "moved"), _row(kept, "kept")], set())
    merge_rows(log, [], set())
    assert [row["case"] for row in json.loads(log.read_text(encoding="utf-8"))["rows"]] == ["kept"]
