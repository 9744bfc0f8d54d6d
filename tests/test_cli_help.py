"""``--help`` is the reference a user reads first: ``raydistill --help`` names every subcommand and job, and every
job's ``--help`` lists every config field with a one-line meaning (generated from the config dataclasses)."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from raydistill.cli import build_parser
from raydistill.runtime.config import JobConfig
from raydistill.runtime.config_help import MAPPING_MEANINGS, config_field_rows
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
    assert not missing, f"config fields without a comment in their dataclass or a FIELD_MEANINGS entry: {missing}"


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
    for key, meaning in MAPPING_MEANINGS.items():  # the loss/extra keys the job's own default config sets
        if f"    {key} = " in text:
            assert meaning in text


def test_raydistill_run_passes_the_job_its_arguments(capsys):
    from raydistill.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["run", "congen", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: raydistill run congen")
    assert "default: the shipped congen.yaml" in text.replace("\n", " ").replace("  ", " ") or "congen.yaml" in text
