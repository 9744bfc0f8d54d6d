"""Result files: the schema is a valid draft 2020-12 schema, every committed results/*.json satisfies it, and
write_result writes only valid, complete files."""

from __future__ import annotations

import json
import math
import re
import shlex
import sys
from pathlib import Path

import jsonschema
import pytest

from raydistill.evaluation import (
    SCHEMA_PATH,
    STS7,
    ResultError,
    default_command,
    format_scores_table,
    validate_result,
    validate_result_file,
    write_result,
)

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"
# bench-*.json are timing records, diag-*.json diagnostic experiments, tune/*-summary.json sweeps' trial tables, a
# Trans-Encoder run's summary.json its per-family outcome, mutual_tenc/targets.json the targets drawn from them and
# a lever's screen.json a per-family stage screen (scripts/tenc_stage_screen.py), each with its own layout
# (scripts/readme_tables.py skips them too); raydistill_package.json is the manifest `raydistill distill` writes
# beside a packaged model (the quick start's run). results/published/ holds other projects' published scores, not runs.
NOT_RESULT_FILES = ("summary.json", "targets.json", "screen.json", "raydistill_package.json")
RESULT_FILES = sorted(p for p in RESULTS_DIR.glob("**/*.json")
                      if not p.name.startswith(("bench-", "diag-")) and not p.name.endswith("-summary.json")
                      and p.name not in NOT_RESULT_FILES and "published" not in p.relative_to(RESULTS_DIR).parts)


def scores(**overrides) -> dict:
    values = {"sts12": 72.37, "sts13": 80.6, "sts14": 75.6, "sts15": 85.4, "sts16": 78.99, "stsb": 82.03,
              "sickr": 77.15}
    values["avg"] = round(sum(values.values()) / 7, 2)
    values.update(overrides)
    return values


def record(**overrides) -> dict:
    fields = {"kind": "baseline", "model": "minilm-l6", "encoder": "bi", "params_m": 22.7, "scores": scores()}
    fields.update(overrides)
    return fields


def test_schema_is_a_valid_draft_2020_12_schema():
    schema = json.loads(SCHEMA_PATH.read_text())
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)
    assert set(schema["properties"]["scores"]["required"]) == set(STS7) | {"avg"}


@pytest.mark.parametrize("path", RESULT_FILES, ids=[p.name for p in RESULT_FILES])
def test_committed_result_file_is_valid(path):
    result = validate_result_file(path)
    # avg is what the README shows: it must be the mean of the seven scores in the same file.
    assert result["scores"]["avg"] == pytest.approx(sum(result["scores"][name] for name in STS7) / 7, abs=0.01)
    # which code made it: a commit (with the diff's hash when the tree differed), never a bare "unknown"
    assert result["git_sha"] != "unknown"
    if result["git_sha"].endswith("-dirty"):
        assert re.fullmatch(r"[0-9a-f]{40}-dirty", result["git_sha"])


def test_write_result_fills_provenance_and_writes_a_valid_sorted_file(tmp_path):
    path = tmp_path / "sub" / "baseline-minilm-l6.json"
    written = write_result(path, **record(extra={"mrpc_val_auc": 76.3}))
    assert validate_result_file(path) == written
    text = path.read_text()
    assert text.endswith("}\n")
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    assert written["command"] == default_command()
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", written["git_sha"]) or "no git checkout" in written["git_sha"]
    assert written["git_sha"].endswith("-dirty") == ("code_diff_sha256" in written)
    assert written["date"].endswith("+00:00")
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind


def test_provenance_names_the_commit_and_hashes_uncommitted_code(tmp_path):
    """A clean checkout records its commit; changed or untracked code records ``-dirty`` and a hash that tells one
    uncommitted state from another; no checkout at all (an installed wheel) says so instead of "unknown"."""
    import subprocess

    from raydistill.evaluation.results import code_provenance

    def git(*args):
        subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    git("init", "-q")
    (tmp_path / "raydistill").mkdir()
    (tmp_path / "raydistill" / "a.py").write_text("x = 1\n")
    (tmp_path / "README.md").write_text("docs\n")
    git("add", "-A")
    git("commit", "-q", "-m", "c")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    states = {}

    def provenance():
        code_provenance.cache_clear()
        return code_provenance(str(tmp_path))

    states["clean"] = provenance()
    (tmp_path / "README.md").write_text("more docs\n")  # not code: still the commit
    states["docs"] = provenance()
    (tmp_path / "raydistill" / "a.py").write_text("x = 2\n")
    states["edited"] = provenance()
    (tmp_path / "raydistill" / "a.py").write_text("x = 3\n")
    states["edited again"] = provenance()
    (tmp_path / "raydistill" / "a.py").write_text("x = 1\n")
    (tmp_path / "raydistill" / "new.py").write_text("y = 1\n")
    states["untracked"] = provenance()
    code_provenance.cache_clear()
    outside = tmp_path / "no-checkout"
    outside.mkdir()
    # GIT_CEILING_DIRECTORIES keeps git from finding the checkout above.
    import os

    os.environ["GIT_CEILING_DIRECTORIES"] = str(tmp_path)
    try:
        states["installed"] = code_provenance(str(outside))
    finally:
        del os.environ["GIT_CEILING_DIRECTORIES"]
        code_provenance.cache_clear()
    assert states["clean"] == states["docs"] == {"git_sha": head}
    for name in ("edited", "edited again", "untracked"):
        assert states[name]["git_sha"] == f"{head}-dirty"
        assert re.fullmatch(r"[0-9a-f]{64}", states[name]["code_diff_sha256"])
    hashes = {states[name]["code_diff_sha256"] for name in ("edited", "edited again", "untracked")}
    assert len(hashes) == 3
    assert states["installed"]["git_sha"].startswith("raydistill ") and "no git checkout" in states["installed"]["git_sha"]
    written = write_result(tmp_path / "r.json", **record(git_sha=states["edited"]["git_sha"],
                                                        code_diff_sha256=states["edited"]["code_diff_sha256"]))
    assert validate_result_file(tmp_path / "r.json") == written


def test_explicit_provenance_is_kept(tmp_path):
    path = tmp_path / "r.json"
    written = write_result(path, **record(command="raydistill eval --model x", git_sha="abc", date="2025-01-01"))
    assert (written["command"], written["git_sha"], written["date"]) == ("raydistill eval --model x", "abc",
                                                                        "2025-01-01")


@pytest.mark.parametrize("bad, field, message", [
    (record(scores=scores(avg="78.9")), "scores.avg", "'78.9' is not of type 'number'"),
    ({k: v for k, v in record().items() if k != "params_m"}, "", "'params_m' is a required property"),
    (record(scores={k: v for k, v in scores().items() if k != "sickr"}), "scores", "'sickr' is a required property"),
    (record(kind="baseline-ish"), "kind", "is not one of"),
    (record(encoder="dual"), "encoder", "is not one of"),
    (record(scores=scores(stsb=math.nan)), "scores.stsb", "not a finite number"),
])
def test_invalid_records_are_rejected_and_nothing_is_written(tmp_path, bad, field, message):
    path = tmp_path / "r.json"
    path.write_text("previous content\n")
    with pytest.raises(ResultError) as caught:
        write_result(path, **bad)
    text = str(caught.value)
    expected_prefix = f"{path}: field '{field}': " if field else f"{path}: "
    assert any(line.startswith(expected_prefix) and message in line for line in text.splitlines()), text
    assert path.read_text() == "previous content\n"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_validate_result_file_reports_bad_json_with_its_line(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{\n  "kind": "baseline",\n  "model": oops\n}\n')
    with pytest.raises(ResultError, match=r"broken\.json:3: not valid JSON"):
        validate_result_file(path)
    with pytest.raises(ResultError, match="file not found"):
        validate_result_file(tmp_path / "missing.json")


def test_validate_result_lists_every_problem():
    bad = record(params_m="22", scores=scores(sts12=None))
    with pytest.raises(ResultError) as caught:
        validate_result(bad, "x.json")
    lines = str(caught.value).splitlines()
    assert any(line.startswith("x.json: field 'params_m': ") for line in lines)
    assert any(line.startswith("x.json: field 'scores.sts12': ") for line in lines)
    assert any("'command' is a required property" in line for line in lines)


def test_default_command_is_shell_quoted(tmp_path):
    assert default_command(["/x/.venv/bin/raydistill", "eval", "--model", "my model"]) == \
        "raydistill eval --model 'my model'"
    assert shlex.split(default_command(["jobs/congen.py", "--set", "a.b=c d"])) == \
        ["python", "jobs/congen.py", "--set", "a.b=c d"]
    current = shlex.split(default_command())
    assert current[len(current) - len(sys.argv) + 1:] == sys.argv[1:]


def test_format_scores_table():
    rows = [record(), record(model="student", params_m=6.4, scores={"sts12": 60.0, "stsb_dev": 80.123})]
    table = format_scores_table(rows).splitlines()
    assert table[0] == ("| model | encoder | params (M) | sts12 | sts13 | sts14 | sts15 | sts16 | stsb | sickr | avg "
                        "| STS-B dev |")
    assert table[1] == "|" + "---|" * 12
    assert table[2] == ("| `minilm-l6` | bi | 22.7 | 72.37 | 80.60 | 75.60 | 85.40 | 78.99 | 82.03 | 77.15 | **78.88** "
                        "| – |")
    assert table[3] == "| `student` | bi | 6.4 | 60.00 | – | – | – | – | – | – | – | 80.12 |"
    assert len(format_scores_table([record()]).splitlines()[0].split("|")) == 13  # no dev column without dev scores
