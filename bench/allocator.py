"""What glibc keeping freed memory does to each library's training step (raydistill.runtime.allocator).

The CPU learner sets malloc to keep freed memory for reuse (``resources.learner.keep_freed_memory``, default on):
on this machine a page fault costs more than the arithmetic done in fresh memory, and a training step allocates the
same large tensors every step. The setting is process-wide, so bench/train_step.py, which runs both libraries in
one process, times sentence-transformers with it too. This bench shows what it is worth to each: raydistill's
ConGen step (minilm-l3, teacher mpnet-base vectors, batch 128 x 2 views, K = 65536, bf16) and
sentence-transformers' MSE distillation step (same student, batch and data, bf16), each in a fresh process with
and without the setting; the four processes alternate for ``--rounds`` rounds.

    allocator_speedup_raydistill   raydistill step seconds without ÷ with
    allocator_speedup_st           sentence-transformers step seconds without ÷ with

    python bench/allocator.py --write results/bench-allocator.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common  # noqa: F401  (environment before torch)

from common import add_congen_step_arguments, load_average, median, set_threads, write_record

LIBRARIES = ("raydistill", "sentence_transformers")


def worker(args) -> dict:
    """One (library, allocator) process: warm-up steps, then ``--steps`` timed steps; prints its JSON line."""
    import train_step

    set_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="bench-allocator-"))
    cfg = train_step.congen_config(args.student, args, work / "run", precision="bf16",
                                   more=(f"resources.learner.keep_freed_memory={str(bool(args.keep)).lower()}",))
    columns = train_step.training_columns(cfg)
    vectors, _ = train_step.teacher_vectors(cfg, list(columns["text_control"]), "cached")
    columns["teacher_control"] = vectors
    if args.worker == "raydistill":
        trainer = train_step.RaydistillTrainer(cfg, columns, args.threads)
    else:
        if args.keep:
            from raydistill.runtime.allocator import keep_freed_memory

            keep_freed_memory()
        trainer = train_step.SentenceTransformersTrainer(args.student, list(columns["text_control"]), vectors, cfg,
                                                         work / "st", bf16=True)
    seconds = trainer.run(args.warmup + args.steps)[args.warmup:]
    return {"step_s_all": [round(s, 4) for s in seconds]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_congen_step_arguments(parser, steps=8, warmup=2)
    parser.add_argument("--worker", choices=LIBRARIES, help=argparse.SUPPRESS)
    parser.add_argument("--keep", type=int, choices=(0, 1), default=1, help=argparse.SUPPRESS)
    parser.add_argument("--write", type=Path, default=None, help="e.g. results/bench-allocator.json")
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)), flush=True)
        return {}

    load_before = load_average()
    started = time.perf_counter()
    shared = ["--student", args.student, "--batch", str(args.batch), "--queue-size", str(args.queue_size),
              "--max-length", str(args.max_length), "--threads", str(args.threads), "--steps", str(args.steps),
              "--warmup", str(args.warmup)]
    steps: dict[str, list[float]] = {f"{lib}_{mode}": [] for lib in LIBRARIES for mode in ("keep", "system")}
    for round_index in range(args.rounds):
        for name in steps:
            library, mode = name.rsplit("_", 1)
            done = subprocess.run([sys.executable, __file__, "--worker", library, "--keep", str(int(mode == "keep")),
                                   *shared], capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"worker {name} failed:\n{done.stderr[-4000:]}")
            steps[name].extend(json.loads(done.stdout.strip().splitlines()[-1])["step_s_all"])
            print(f"  round {round_index + 1} {name}: median step {median(steps[name][-args.steps:]):.3f} s "
                  f"(load {load_average()})", flush=True)
    rates = {name: {"step_s": round(median(s), 4), "step_s_all": s} for name, s in steps.items()}
    record = {
        "bench": "allocator",
        "student": args.student, "teacher_vectors": "mpnet-base (cache)", "precision": "bf16",
        "batch": args.batch, "queue_size": args.queue_size, "threads": args.threads,
        "steps_timed": args.steps * args.rounds,
        "rates": rates,
        "allocator_speedup_raydistill": round(rates["raydistill_system"]["step_s"] / rates["raydistill_keep"]["step_s"],
                                              3),
        "allocator_speedup_st": round(rates["sentence_transformers_system"]["step_s"]
                                      / rates["sentence_transformers_keep"]["step_s"], 3),
        "wall_s": round(time.perf_counter() - started, 1),
    }
    for name, rate in rates.items():
        print(f"{name:<32}{rate['step_s']:>8.3f} s")
    print(f"allocator speed-up: raydistill {record['allocator_speedup_raydistill']:.2f}x, "
          f"sentence-transformers {record['allocator_speedup_st']:.2f}x")
    return write_record(args.write, record, threads=args.threads, load_before=load_before)


if __name__ == "__main__":
    main()
