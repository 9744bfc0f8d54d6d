"""Bad command-line arguments are rejected before Ray or any model starts, with the allowed values.

Covers the `raydistill` console script and the jobs/*.py entry points (`--set key=value` overrides included). The
entry points run in this process (runpy / `cli.main`), with Ray's start turned into a test failure, so that a bad
argument that slipped through validation fails the test instead of starting a job; two cases also run as real
subprocesses to check the exit status and that no traceback is printed. Each case is recorded for
docs/reliability.md.
"""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

import pytest

pytest_plugins = ["tests.reliability_log"]

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ("bert-mini", "bert-small", "bert-tiny", "minilm-l3", "minilm-l6", "mpnet-base")
LOST = "nothing: rejected before Ray or any model starts"



def run_job(script: str, args: list[str], monkeypatch, capsys) -> str:
    """Run jobs/<script> in this process; return what it printed on exit (its sys.exit message or argparse's)."""
    monkeypatch.setattr(sys, "argv", [str(ROOT / "jobs" / script), *args])
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(str(ROOT / "jobs" / script), run_name="__main__")
    code = exited.value.code
    stderr = capsys.readouterr().err
    assert code == 2, f"expected argparse's exit status 2, got {code!r}; stderr: {stderr}"
    return stderr.strip().splitlines()[-1]


JOB_CASES = [
    # (case, script, arguments, words the message must contain)
    ("negative queue size K", "congen.py", ["--set", "loss.queue_size=-1"],
     ["field 'loss.queue_size': -1 must be >= 0"]),
    ("temperature tau = 0", "congen.py", ["--set", "loss.tau_teacher=0"],
     ["field 'loss.tau_teacher': temperature must be a number > 0, got 0"]),
    ("negative temperature", "sct.py", ["--set", "loss.tau_student=-0.5"],
     ["field 'loss.tau_student': temperature must be a number > 0, got -0.5"]),
    ("queue smaller than the batch", "congen.py", ["--set", "loss.queue_size=16"],
     ["K=16 is smaller than train.batch_size=128", "use 0 for no queue"]),
    ("queue smaller than the batch", "distilcse.py", ["--set", "loss.queue_size=8"],
     ["K=8 is smaller than train.batch_size=128"]),
    ("unknown student preset", "congen.py", ["--set", "student=bert-tiyn"],
     ["field 'student': unknown model preset 'bert-tiyn' (did you mean 'bert-tiny'?); presets: " + ", ".join(PRESETS)]),
    ("unknown student preset", "dvbert.py", ["--set", "student=nope"], ["presets: " + ", ".join(PRESETS)]),
    ("missing config file", "congen.py", ["--config", str(ROOT / "raydistill" / "configs" / "congen.yml")],
     ["config file not found", "did you mean", "congen.yaml"]),
    ("misspelled config key", "congen.py", ["--set", "train.bach_size=32"],
     ["field 'train.bach_size': unknown field (did you mean 'batch_size'?); allowed in train:"]),
    ("negative batch size", "congen.py", ["--set", "train.batch_size=-3"],
     ["field 'train.batch_size': must be > 0, got -3"]),
    ("training file that does not exist", "congen.py", ["--set", "data.corpus=file:/no/such/corpus.jsonl"],
     ["field 'data.corpus': training file not found: /no/such/corpus.jsonl"]),
    ("negative pair count", "mutual_tenc.py", ["--pairs", "-5"], ["field 'pairs.max_pairs': must be > 0, got -5"]),
    ("non-positive batch size (Trans-Encoder)", "mutual_tenc.py", ["--set", "bi.batch_size=0"],
     ["field 'bi.batch_size': must be > 0, got 0"]),
    ("unknown mode", "mutual_tenc.py", ["--mode", "both"],
     ["argument --mode: invalid choice: 'both' (choose from", "mutual", "self"]),
    ("bad max length", "mutual_tenc.py", ["--max-length", "0"], ["--max-length: expected N or BI,CROSS (positive)"]),
    ("missing config file (Trans-Encoder)", "mutual_tenc.py", ["--config", "nope.yaml"],
     ["config file not found: nope.yaml"]),
]


@pytest.mark.parametrize("case, script, args, words", JOB_CASES,
                         ids=[f"{c[1].removesuffix('.py')}-{c[0].replace(' ', '-')}" for c in JOB_CASES])
def test_job_entry_point_rejects(case, script, args, words, monkeypatch, capsys, no_ray_start, tmp_path,
                                 reliability):
    monkeypatch.chdir(tmp_path)  # default run dirs and results land here, if the job ever got that far
    message = run_job(script, args, monkeypatch, capsys)
    for word in words:
        assert word in message, message
    assert not (tmp_path / "runs").exists() and not (tmp_path / "results").exists()
    reliability.record("CLI", case, input=f"python jobs/{script} {' '.join(args)}".replace(str(ROOT) + "/", ""),
                       did="exited with the message below", message=message, lost=LOST)


CLI_CASES = [
    # (case, arguments, exit status, words the message must contain)
    ("unknown model preset", ["eval", "--model", "bert-tiyn"], 2,
     ["Model 'bert-tiyn' is not available offline: unknown name", *PRESETS]),
    ("model directory that does not exist", ["eval", "--model", "./no/such/model"], 2,
     ["directory no/such/model does not exist", "minilm-l6"]),
    ("negative batch size", ["eval", "--model", "minilm-l6", "--batch-size", "-1"], 2,
     ["argument --batch-size: expected a positive integer, got -1"]),
    ("unknown encoder kind", ["eval", "--model", "minilm-l6", "--encoder", "tri"], 2,
     ["argument --encoder: invalid choice: 'tri' (choose from", "bi", "cross"]),
    ("unknown pooling", ["eval", "--model", "minilm-l6", "--pooling", "max"], 2,
     ["argument --pooling: invalid choice: 'max' (choose from", "mean", "cls"]),
    ("missing --model", ["eval"], 2, ["the following arguments are required: --model"]),
    ("unknown subcommand", ["evaluate"], 2, ["argument command: invalid choice: 'evaluate' (choose from", "eval",
                                             "models"]),
]


@pytest.mark.parametrize("case, args, status, words", CLI_CASES, ids=[c[0].replace(" ", "-") for c in CLI_CASES])
def test_raydistill_cli_rejects(case, args, status, words, capsys, no_ray_start, reliability):
    from raydistill import cli

    try:
        code = cli.main(args)
    except SystemExit as exited:  # argparse
        code = exited.code
    err = capsys.readouterr().err
    assert code == status, err
    for word in words:
        assert word in err, err
    lines = err.strip().splitlines()
    if lines[0].startswith("usage:"):  # argparse: the usage block, then the error on the last line
        message = lines[-1]
    elif len(lines) > 2:  # the unknown-model message goes on with every preset and its pip package
        message = f"{lines[0]} {lines[1]} [then {len(lines) - 2} lines: each preset and the package it needs]"
    else:
        message = " ".join(lines)
    reliability.record("CLI", case, input="raydistill " + " ".join(args), did=f"exited with status {status}",
                       message=message, lost=LOST)


@pytest.mark.parametrize("command, expected_status, words", [
    ([sys.executable, str(ROOT / "jobs" / "congen.py"), "--set", "loss.tau_student=0"], 2,
     "config error: --set field 'loss.tau_student': temperature must be a number > 0, got 0"),
    ([sys.executable, "-m", "raydistill.cli", "eval", "--model", "bert-tiyn"], 2,
     "raydistill: Model 'bert-tiyn' is not available offline: unknown name."),
], ids=["job-script", "raydistill-console"])
def test_a_real_process_exits_with_the_message_and_no_traceback(command, expected_status, words, tmp_path,
                                                                reliability):
    proc = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == expected_status, proc.stderr
    assert words in proc.stderr
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    assert not (tmp_path / "runs").exists()
    shown = " ".join(part.replace(sys.executable, "python").replace(str(ROOT) + "/", "") for part in command)
    reliability.record("CLI", "a real process: exit status and no traceback", input=shown,
                       did=f"exit status {expected_status}; stderr has the message and no traceback",
                       message=proc.stderr.strip().splitlines()[0], lost=LOST)
