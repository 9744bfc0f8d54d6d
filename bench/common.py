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
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import shlex
import statistics
import sys
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
    (bf16 ~5x fp32 on one, emulated and far slower on the other), so the record says which this was."""
    import torch

    from raydistill.runtime.teachers.teacher import bf16_support

    fast_bf16, evidence = bf16_support()
    return {
        "cpu": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
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
