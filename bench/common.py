"""What every benchmark shares: offline/thread set-up, the machine record, timing helpers, result files.

A benchmark result is one JSON object in ``results/bench-<name>.json`` with its measured keys (rates and ratios
measured side by side in one run) plus the provenance every number in the docs needs:

    command      the exact command line that produced the file (``python bench/<name>.py ...``)
    git_sha      ``git rev-parse HEAD`` (+ ``-dirty`` when the code differed from it: raydistill.evaluation.git_sha)
    date         ISO 8601, UTC
    machine      CPU model, cores, torch/MKL build, threads, OMP_WAIT_POLICY
    load_before / load_after   the 1-minute load average when the measurement started and ended: the box is
                 shared, and a load above the thread count means the numbers were taken under contention

Import this module before torch: it sets the environment torch, transformers and Ray read at import time.

``side_environment(name, pins)`` gives the Python of a virtual environment in which the exact versions ``pins`` sit in
front of this project's packages: for a library whose own pins clash with the project's (Model2Vec's distillation,
sentence-transformers' ONNX backend). It raises `PackageIndexUnreachable` when pip cannot reach the package index.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any, Callable

# Before torch / transformers / Ray are imported anywhere in the process.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Sleeping rather than spinning OpenMP workers: on two shared cores a spinning pool measured 20-70x slower for
# small ops whenever another process ran (tests/conftest.py). Recorded in every result.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "results"
SIDE_ENVIRONMENTS = Path.home() / ".cache" / "raydistill" / "bench-venvs"


def set_threads(threads: int) -> None:
    """Intra-op threads as the jobs use them; one inter-op thread (the jobs' actors never run ops concurrently)."""
    import torch

    torch.set_num_threads(int(threads))
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # only settable before the first inter-op work; harmless when already fixed
        pass


def add_congen_step_arguments(parser, steps: int = 3, warmup: int = 1, rounds: int = 3) -> None:
    """The sizes of the ConGen step the training benches time (batch 128, K = 65536), as options."""
    parser.add_argument("--student", default="minilm-l3")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--queue-size", type=int, default=65536)
    parser.add_argument("--max-length", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=steps, help="timed steps per round and trainer")
    parser.add_argument("--warmup", type=int, default=warmup, help="untimed steps at the start of every round")
    parser.add_argument("--rounds", type=int, default=rounds)


def comma_names(allowed) -> Callable[[str], list[str]]:
    """An argparse ``type``: ``"a,b"`` as ``["a", "b"]``, each one of ``allowed``."""
    import argparse

    def parse(text: str) -> list[str]:
        names = [name.strip() for name in text.split(",") if name.strip()]
        unknown = [name for name in names if name not in allowed]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown) or 'empty list'}; choose from "
                                             f"{', '.join(allowed)}")
        return names
    return parse


def comma_ints(text: str) -> list[int]:
    """An argparse ``type``: ``"1000,1001"`` as ``[1000, 1001]``."""
    return [int(part) for part in text.split(",") if part.strip()]


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(threads: int) -> dict[str, Any]:
    """The machine a number was measured on. One CPU model name covers kinds with and without bf16 matrix units
    (bf16 ~5x fp32 on one, emulated and far slower on the other) and with and without VNNI (int8 dot products), so
    the record says which this was."""
    import torch

    from raydistill.runtime.teachers.teacher import bf16_support
    from raydistill.ship.package import cpu_instruction_set

    fast_bf16, evidence = bf16_support()
    return {
        "cpu": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "instruction_set": cpu_instruction_set()["summary"],
        "bf16_native": fast_bf16,
        "bf16_evidence": evidence,
        "logical_cpus": os.cpu_count(),
        "threads": int(threads),
        "torch": torch.__version__,
        "blas": "MKL" if torch.backends.mkl.is_available() else "other",
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""),
        "python": platform.python_version(),
    }


def command_line(argv: list[str] | None = None) -> str:
    """``python bench/<file>.py <args>`` as typed from the repository root."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0])
    try:
        script = script.resolve().relative_to(ROOT)
    except ValueError:
        pass
    return shlex.join(["python", str(script), *argv[1:]])


def write_record(path: str | os.PathLike | None, record: dict[str, Any], *, threads: int,
                 load_before: float) -> dict[str, Any]:
    """Add provenance (command, git SHA, date, machine, load) to ``record``; write it when ``path`` is given."""
    from raydistill.evaluation.results import code_provenance
    from raydistill.fileio import atomic_write_text

    full = {
        **record,
        "command": command_line(),
        **code_provenance(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(threads),
        "load_before": load_before,
        "load_after": load_average(),
    }
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(full, indent=2, allow_nan=False) + "\n")
        print(f"wrote {path}")
    return full


def read_record(path: str | os.PathLike) -> dict[str, Any] | None:
    path = Path(path)
    return json.loads(path.read_text()) if path.is_file() else None


def timed(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> list[float]:
    """Seconds per call of ``fn`` over ``repeats`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - started)
    return seconds


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def caption_texts(count: int, seed: int = 0) -> list[str]:
    """``count`` distinct Flickr30k captions in a seeded random order (the ConGen jobs' corpus)."""
    import numpy as np

    from raydistill.data import load_dataset

    seen: dict[str, None] = {}
    for group in load_dataset("flickr_captions"):
        for caption in group.captions:
            seen.setdefault(caption, None)
    texts = list(seen)
    order = np.random.default_rng(seed).permutation(len(texts))[:count]
    return [texts[i] for i in order]


def sts_sentences(count: int, seed: int = 0) -> list[str]:
    """``count`` distinct sentences of STS12-16 and STS-B test in a seeded random order (the encode benchmarks')."""
    import numpy as np

    from raydistill.data import load_dataset

    seen: dict[str, None] = {}
    for name in ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb_test"):
        for pair in load_dataset(name):
            seen.setdefault(pair.sentence1, None)
            seen.setdefault(pair.sentence2, None)
    texts = list(seen)
    return [texts[i] for i in np.random.default_rng(seed).permutation(len(texts))[:count]]


# ----------------------------------------------------------------------------------------------------------------
# Side environments

# What pip prints when the package index cannot be reached at all (no route, no name resolution, refused, timed out),
# as opposed to a pin that does not exist or a wheel that does not install.
_UNREACHABLE = ("NewConnectionError", "Failed to establish a new connection", "Temporary failure in name resolution",
                "Name or service not known", "Network is unreachable", "Connection refused", "ConnectTimeoutError",
                "ReadTimeoutError", "ProxyError", "connection broken by")


class PackageIndexUnreachable(ConnectionError):
    """pip could not reach the package index to install a side environment's pins: the network, not the code."""


def side_environment(name: str, pins: tuple[str, ...] | list[str]) -> Path:
    """The Python of ``SIDE_ENVIRONMENTS/<name>``: a virtual environment with exactly ``pins`` (``package==version``)
    installed, in front of this project's environment for everything else (torch, numpy, onnxruntime, ...).

    Built on first use and again whenever its marker file lists other pins; reused as it is otherwise. The pins go
    into a bare environment with ``--no-deps``, so pip never sees, and never changes, the project's packages; a
    ``.pth`` file then appends the project's site-packages (``site.addsitedir``: after the pins, and its own ``.pth``
    files run, so an editable raydistill imports too). Raises `PackageIndexUnreachable` when the index cannot be
    reached, RuntimeError with pip's message for any other failure.
    """
    venv = SIDE_ENVIRONMENTS / name
    python = venv / "bin" / "python"
    marker = venv / "raydistill-pins.txt"
    pins = list(pins)
    if not (python.is_file() and marker.is_file() and marker.read_text().split() == pins):
        shutil.rmtree(venv, ignore_errors=True)
        print(f"  creating {venv} with {' '.join(pins)}", flush=True)
        base = Path(getattr(sys, "_base_executable", sys.executable))
        subprocess.run([str(base), "-m", "venv", str(venv)], check=True)
        installed = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--retries", "2",
                                    "--disable-pip-version-check", *pins], capture_output=True, text=True)
        if installed.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            unreachable = [line.strip() for line in installed.stderr.splitlines()
                           if any(sign in line for sign in _UNREACHABLE)]
            if unreachable:
                raise PackageIndexUnreachable(f"pip could not reach the package index to build {venv}: "
                                              f"{unreachable[-1][:400]}")
            raise RuntimeError(f"pip install --no-deps {' '.join(pins)} into {venv} failed:\n"
                               f"{installed.stderr[-3000:]}")
        marker.write_text("\n".join(pins) + "\n")
    # Checked on every use, not only at creation: it must name the environment this process runs from.
    layer = f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n"
    (site_packages,) = venv.glob("lib/python*/site-packages")
    pth = site_packages / "zz_raydistill_project.pth"
    if not pth.is_file() or pth.read_text() != layer:
        pth.write_text(layer)
    return python
