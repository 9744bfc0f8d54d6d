"""How a ConGen training step scales with the queue size K and with the batch, and a learner's peak memory at K = 65536.

(a) Step time. One raydistill ConGen step exactly as bench/train_step.py times it (``RaydistillTrainer``: the job's
    ``DistillLearner.train_step`` on congen.yaml with student minilm-l3 + Dense(384 → 768, tanh), AdamW,
    grad clip, LR schedule, the queue loss; batches from ``ArrayData.iter_batches``), with random unit teacher
    vectors (train_step's ``--teacher-vectors random``: their values do not change the cost, and no teacher is
    loaded). Each step encodes 2 views × B captions (max_length 32) and scores 3·B query rows against the K × 768
    queue forward and 2·B backward, so the loss grows linearly in K and the whole step linearly in B:

        step_s_by_queue_size   K = 1024, 4096, 16384, 65536, 131072 at B = 128
        step_s_by_batch        B = 32, 64, 128, 256 at K = 16384

    A fresh learner per point; ``--warmup`` untimed steps (1), then ``--steps`` timed ones (3); medians. The fit
    ``step_s ≈ a + b·K`` over the queue points is reported as ``queue_ms_per_1k`` (b per 1024 rows) and
    ``step_s_without_queue`` (a).

(b) Peak memory. The same step loop at congen.yaml's own batch (64) and K = 65536 runs in a child process
    (``python bench/scaling.py --child ...``); its peak resident set is ``ru_maxrss`` of the ``struct rusage``
    that ``os.wait4`` returns for that child (what ``resource.getrusage(RUSAGE_CHILDREN)`` would give for it
    alone): interpreter, torch, student, AdamW state, the K × 768 fp32 queue (``queue_mb``), activations and the
    [3B, K] logits. It runs before the step sweep, while this process is small: Linux carries the spawning
    process's resident peak into the child's ru_maxrss. The child also reports its own ``VmHWM`` and resident
    memory after set-up and after the steps (/proc/self/status).

    python bench/scaling.py --quick                                  # ~1 min check, nothing written
    python bench/scaling.py --write results/bench-scaling.json       # ~5-10 min; also draws docs/scaling.png
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common  # noqa: F401  (environment before torch)

import numpy as np

from common import RESULTS, ROOT, load_average, median, set_threads, write_record
from train_step import CONFIG, RaydistillTrainer, congen_config, teacher_vectors, training_columns

STUDENT = "minilm-l3"
TEACHER_DIM = 768
QUEUE_SIZES = (1024, 4096, 16384, 65536, 131072)
BATCHES = (32, 64, 128, 256)
RSS_QUEUE_SIZE = 65536
PLOT = ROOT / "docs" / "scaling.png"


def step_seconds(batch: int, queue_size: int, args, work: Path) -> list[float]:
    """Timed step seconds of a fresh ConGen learner at (batch, K), after ``args.warmup`` untimed steps."""
    sizes = argparse.Namespace(batch=batch, queue_size=queue_size, warmup=args.warmup, steps=args.steps,
                               max_length=args.max_length, threads=args.threads)
    cfg = congen_config(STUDENT, sizes, work / f"run-b{batch}-k{queue_size}")
    columns = training_columns(cfg)
    columns["teacher_control"], _ = teacher_vectors(cfg, list(columns["text_control"]), "random")
    trainer = RaydistillTrainer(cfg, columns, args.threads)
    try:
        return trainer.run(args.warmup + args.steps)[args.warmup:]
    finally:
        del trainer
        gc.collect()


def sweep(points: list[tuple[int, int]], args, work: Path) -> dict[tuple[int, int], list[float]]:
    out = {}
    for batch, queue_size in points:
        out[(batch, queue_size)] = step_seconds(batch, queue_size, args, work)
        print(f"  B = {batch:>3}, K = {queue_size:>6}: median step {median(out[(batch, queue_size)]):.2f} s "
              f"(load {load_average()})", flush=True)
    return out


# ----------------------------------------------------------------------------------------------------------------
# Peak memory


def default_batch() -> int:
    from raydistill.config.job import JobConfig

    return JobConfig.from_yaml(CONFIG).train.batch_size


def proc_status_mb(field: str) -> float:
    """``VmRSS`` (resident now) or ``VmHWM`` (resident peak of this process image) from /proc/self/status, MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return round(int(line.split()[1]) / 1024, 1)
    raise KeyError(field)


def child(args) -> None:
    """The learner step loop whose peak memory the parent reads; prints one JSON line."""
    work = Path(tempfile.mkdtemp(prefix="bench-scaling-child-"))
    try:
        sizes = argparse.Namespace(batch=args.batch_rss, queue_size=args.queue_size_rss, warmup=0,
                                   steps=args.steps_rss, max_length=args.max_length, threads=args.threads)
        cfg = congen_config(STUDENT, sizes, work / "run")
        columns = training_columns(cfg)
        columns["teacher_control"], _ = teacher_vectors(cfg, list(columns["text_control"]), "random")
        trainer = RaydistillTrainer(cfg, columns, args.threads)
        setup = {"rss_after_setup_mb": proc_status_mb("VmRSS"), "hwm_after_setup_mb": proc_status_mb("VmHWM")}
        seconds = trainer.run(args.steps_rss)
        print(json.dumps({**setup, "rss_after_steps_mb": proc_status_mb("VmRSS"), "hwm_mb": proc_status_mb("VmHWM"),
                          "step_s": [round(s, 3) for s in seconds]}))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def peak_rss(args) -> dict:
    """Run `child` in a subprocess; its ru_maxrss (Linux: KiB) from os.wait4, and what it printed.

    Linux carries a process's high-water mark across ``exec``: the child's ru_maxrss is at least what the parent
    had resident when it was spawned. So this runs first, while the parent holds only its imports
    (``parent_rss_at_spawn_mb``), and the child's own ``VmHWM`` (its image alone) is reported beside it.
    """
    parent_rss = proc_status_mb("VmRSS")
    command = [sys.executable, str(Path(__file__).resolve()), "--child", "--threads", str(args.threads),
               "--max-length", str(args.max_length), "--batch-rss", str(args.batch_rss),
               "--queue-size-rss", str(args.queue_size_rss), "--steps-rss", str(args.steps_rss)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    output = process.stdout.read()
    process.stdout.close()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)  # reaped here; Popen must not wait for it again
    if process.returncode != 0:
        raise RuntimeError(f"peak-memory child failed with exit code {process.returncode}: {output[-2000:]}")
    report = json.loads(output.strip().splitlines()[-1])
    peak = round(usage.ru_maxrss / 1024, 1)
    if peak <= parent_rss:
        print(f"  warning: ru_maxrss {peak} MB is not above the parent's {parent_rss} MB at spawn: it may be the "
              f"parent's; the child's own peak (VmHWM) is {report['hwm_mb']} MB", flush=True)
    return {"peak_rss_mb": peak, **report, "parent_rss_at_spawn_mb": parent_rss,
            "batch": args.batch_rss, "queue_size": args.queue_size_rss, "steps": args.steps_rss,
            "queue_mb": round(args.queue_size_rss * TEACHER_DIM * 4 / 2**20, 1)}


# ----------------------------------------------------------------------------------------------------------------
# Picture


def plot_scaling(by_queue: dict[int, float], by_batch: dict[int, float], path: Path, subtitle: str) -> Path:
    from raydistill.evaluation.plots import _pyplot, _save

    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4), dpi=110)
    ks, batches = sorted(by_queue), sorted(by_batch)
    left.plot(ks, [by_queue[k] for k in ks], marker="o")
    left.set_xscale("log", base=2)
    left.set_xlabel("queue size K (batch 128)")
    left.set_ylabel("seconds per ConGen step")
    left.set_title("step time vs queue size")
    right.plot(batches, [by_batch[b] for b in batches], marker="o", color="tab:orange", label="step s")
    right.set_xscale("log", base=2)
    right.set_xlabel("batch B (K = 16384)")
    right.set_ylabel("seconds per ConGen step")
    right.set_title("step time vs batch")
    rate = right.twinx()
    rate.plot(batches, [2 * b / by_batch[b] for b in batches], marker="s", linestyle="--", color="tab:green")
    rate.set_ylabel("student sentences/s (2 views × B)", color="tab:green")
    for ax, ticks in ((left, ks), (right, batches)):
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
    rate.set_ylim(bottom=0)
    fig.suptitle(f"ConGen step, minilm-l3 student, 768-d random teacher vectors; {subtitle}", fontsize=9)
    fig.tight_layout()
    return _save(fig, plt, path)


# ----------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queue-sizes", type=int, nargs="+", default=list(QUEUE_SIZES))
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    parser.add_argument("--queue-batch", type=int, default=128, help="batch of the queue-size sweep")
    parser.add_argument("--batch-queue-size", type=int, default=16384, help="K of the batch sweep")
    parser.add_argument("--max-length", type=int, default=32, help="student truncation (congen.yaml: 32)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per point; medians")
    parser.add_argument("--batch-rss", type=int, default=None, help="batch of the memory run (default: the config's)")
    parser.add_argument("--queue-size-rss", type=int, default=RSS_QUEUE_SIZE)
    parser.add_argument("--steps-rss", type=int, default=4)
    parser.add_argument("--quick", action="store_true",
                        help="~1 min check: K 1024 and 16384, B 32 and 128, 1 timed step, 2 memory-run steps")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--plot", type=Path, default=PLOT, help="picture drawn when --write is given")
    parser.add_argument("--write", type=Path, default=None, help=f"e.g. {RESULTS.name}/bench-scaling.json")
    args = parser.parse_args(argv)
    if args.batch_rss is None:
        args.batch_rss = default_batch()
    set_threads(args.threads)
    if args.child:
        child(args)
        return None
    if args.quick:
        args.queue_sizes, args.batches, args.steps, args.steps_rss = [1024, 16384], [32, 128], 1, 2
    load_before = load_average()
    started = time.perf_counter()
    print(f"ConGen step of {STUDENT}, {args.threads} threads, load {load_before}", flush=True)

    # Memory first, while this process is small (see peak_rss).
    print(f"peak memory: step loop at B = {args.batch_rss}, K = {args.queue_size_rss} in a child process", flush=True)
    memory = peak_rss(args)
    work = Path(tempfile.mkdtemp(prefix="bench-scaling-"))
    try:
        queue_points = [(args.queue_batch, k) for k in args.queue_sizes]
        batch_points = [(b, args.batch_queue_size) for b in args.batches]
        seconds = sweep(list(dict.fromkeys(queue_points + batch_points)), args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    by_queue = {k: median(seconds[(b, k)]) for b, k in queue_points}
    by_batch = {b: median(seconds[(b, k)]) for b, k in batch_points}
    record = {
        "bench": "scaling",
        "student": STUDENT, "teacher_dim": TEACHER_DIM, "teacher_vectors": "random unit vectors",
        "step_s_by_queue_size": {str(k): round(s, 3) for k, s in by_queue.items()},
        "step_s_by_batch": {str(b): round(s, 3) for b, s in by_batch.items()},
        "peak_rss_mb": memory["peak_rss_mb"],
        "queue_batch": args.queue_batch, "batch_queue_size": args.batch_queue_size,
        "max_length": args.max_length, "threads": args.threads, "warmup": args.warmup, "steps": args.steps,
        "sentences_per_s_by_batch": {str(b): round(2 * b / s, 1) for b, s in by_batch.items()},
        "step_s_all": {f"B{b}-K{k}": [round(s, 3) for s in values] for (b, k), values in seconds.items()},
        "memory": memory,
    }
    if len(by_queue) >= 2:
        slope, intercept = np.polyfit(list(by_queue), list(by_queue.values()), 1)
        record["queue_ms_per_1k"] = round(1000 * slope * 1024, 2)
        record["step_s_without_queue"] = round(float(intercept), 3)
    record["wall_s"] = round(time.perf_counter() - started, 1)

    print(f"\nConGen step, {STUDENT}, 2 views, {args.threads} threads (median of {args.steps})")
    print("  K (B = %d):  " % args.queue_batch + ", ".join(f"{k}: {s:.2f} s" for k, s in by_queue.items()))
    print("  B (K = %d): " % args.batch_queue_size + ", ".join(f"{b}: {s:.2f} s" for b, s in by_batch.items()))
    if "queue_ms_per_1k" in record:
        print(f"  fit: {record['step_s_without_queue']:.2f} s + {record['queue_ms_per_1k']:.1f} ms per 1024 queue rows")
    print(f"  peak RSS of the learner step loop (B = {memory['batch']}, K = {memory['queue_size']}): "
          f"{memory['peak_rss_mb']:.0f} MB (child's own VmHWM {memory['hwm_mb']:.0f} MB; resident "
          f"{memory['rss_after_setup_mb']:.0f} MB after set-up, {memory['rss_after_steps_mb']:.0f} MB after the steps; "
          f"queue {memory['queue_mb']:.0f} MB)")
    record = write_record(args.write, record, threads=args.threads, load_before=load_before)
    if args.write is not None:
        subtitle = f"{args.threads} threads, load {record['load_before']}-{record['load_after']}"
        print(f"wrote {plot_scaling(by_queue, by_batch, args.plot, subtitle)}")
    print(json.dumps({k: record.get(k) for k in ("step_s_by_queue_size", "step_s_by_batch", "peak_rss_mb",
                                                 "load_before", "load_after")}))
    return record


if __name__ == "__main__":
    main()
