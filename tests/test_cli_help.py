"""``--help`` is the reference a user reads first: ``raydistill --help`` names every subcommand and job, and every
job's ``--help`` lists every config field with its meaning, generated from the config schema (the sections' field
descriptions, the methods' loss and extra settings, the method registry)."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from raydistill.cli import build_parser
from raydistill.config.job import JobConfig
from raydistill.config.help import config_field_rows, settings_rows
from raydistill.methods import METHODS, job_methods
from raydistill.runtime.entry import JOBS
from raydistill.runtime.tenc import TencConfig

ROOT = Path(__file__).resolve().parents[1]


def test_raydistill_help_lists_every_subcommand_and_job():
    text = build_parser().format_help()
    for command in ("models", "eval", "tune", "run", "ui"):
        assert command in text
    for job, what in JOBS.items():
        assert f"raydistill run {job}" in text and what in text
    assert {p.stem for p in (ROOT / "jobs").glob("*.py")} == set(JOBS), "a job script without a JOBS entry"


@pytest.mark.parametrize("config_cls", [JobConfig, TencConfig], ids=lambda c: c.__name__)
def test_every_config_field_has_a_meaning(config_cls):
    missing = [path for path, meaning in config_field_rows(config_cls) if not meaning]
    assert not missing, f"config fields without Field(description=...): {missing}"


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_setting_has_a_meaning(method):
    spec = METHODS[method]
    rows = settings_rows(spec.loss_settings, "loss.") + settings_rows(spec.extra_settings, "extra.")
    missing = [path for path, _, _, meaning in rows if not meaning]
    assert not missing, f"{method}: settings without Field(description=...): {missing}"


def _row_with_continuation(lines: list[str], path: str) -> str:
    """A field's row and the lines a long description wrapped onto (indented deeper than any field row)."""
    start = next(i for i, line in enumerate(lines) if line.startswith(f"  {path} "))
    rows = [lines[start]]
    for line in lines[start + 1:]:
        if not line.startswith(" " * 8):
            break
        rows.append(line.strip())
    return " ".join(rows)


def _job_help(script: str, capsys, monkeypatch) -> str:
    monkeypatch.setattr("sys.argv", [str(ROOT / "jobs" / script), "--help"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(ROOT / "jobs" / script), run_name="__main__")
    assert exit_info.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("job", list(JOBS))
def test_job_help_lists_every_config_field_with_its_meaning(job, capsys, monkeypatch):
    text = _job_help(f"{job}.py", capsys, monkeypatch)
    assert JOBS[job] in text
    config_cls = TencConfig if job == "mutual_tenc" else JobConfig
    lines = text.splitlines()
    for path, meaning in config_field_rows(config_cls):
        row = next((line for line in lines if line.strip().startswith((f"{path} ", f"{path}.*"))), None)
        assert row is not None, f"{job} --help does not list {path}"
        assert meaning and meaning[:30] in row, f"{job} --help: {path} without its meaning"
    if config_cls is JobConfig and job in METHODS:  # the method's own loss and extra settings, declared or not set
        spec = METHODS[job]
        for path, _, _, meaning in settings_rows(spec.loss_settings, "loss.") + settings_rows(spec.extra_settings,
                                                                                              "extra."):
            row = next((line for line in lines if line.strip().startswith(f"{path} ")), None)
            assert row is not None and meaning[:30] in row, f"{job} --help does not list {path} with its meaning"
        method_row = _row_with_continuation(lines, "method")
        assert all(name in method_row for name in job_methods()), method_row


def test_the_method_list_is_the_registry(capsys, monkeypatch):
    """No hand-written list: every registered method (cosine, ckd, l2, ... as they are added) is named."""
    text = _job_help("distill.py", capsys, monkeypatch)
    method_row = _row_with_continuation(text.splitlines(), "method")
    assert set(job_methods()) >= {"cosine", "ckd", "l2", "congen", "sct", "sct-distill", "distilcse", "dvbert",
                                  "simcse"}
    for name in job_methods():
        assert name in method_row


def test_raydistill_run_passes_the_job_its_arguments(capsys):
    from raydistill.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["run", "congen", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: raydistill run congen")
    assert "default: the shipped congen.yaml" in text.replace("\n", " ").replace("  ", " ") or "congen.yaml" in text
