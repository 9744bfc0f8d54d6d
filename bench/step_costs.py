"""The costs the ConGen CPU step was rid of, each timed against what replaced it, side by side in one run.

What profiling the bf16 step (torch.profiler, minilm-l3, batch 128 x 2 views, K = 65536) pointed at, reduced to
the operation itself at the step's shapes (2 threads, medians):

    fresh_vs_reused_copy     bf16 → fp32 copy of the [384, 65536] logits into a new tensor ÷ into a reused one
                             (``functional.Workspace``): the price of page-faulting fresh memory
    fresh_vs_reused_grad     a zero-filled new [30522, 384] embedding gradient ÷ zeroing one reused buffer
                             (``speedups.use_reused_embedding_grad``)
    torch_vs_fast_dropout    ``F.dropout`` forward + backward on a [128, 24, 384] bf16 tensor ÷ ``fast_dropout``
    bmm_vs_vecdot_rowdot     row dot products of a [4, 65536] chunk as a batched GEMV ÷ ``linalg.vecdot``
    fp32_vs_bf16_teacher     the teacher's [128, 768] × [768, 65536] logits in fp32 ÷ in bf16 against the queue's
                             bf16 copy (what ``train.precision: bf16`` now does)

    python bench/step_costs.py --write results/bench-step_costs.json
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import common  # noqa: F401  (environment before torch)

import torch
import torch.nn.functional as F

from common import load_average, median, set_threads, timed, write_record


def ms(fn, repeats: int) -> float:
    return round(1000 * median(timed(fn, repeats=repeats, warmup=2)), 3)


def main(argv: list[str] | None = None) -> dict:
    from raydistill.models.speedups import fast_dropout

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--write", type=Path, default=None, help="e.g. results/bench-step_costs.json")
    args = parser.parse_args(argv)
    set_threads(args.threads)
    load_before = load_average()
    started = time.perf_counter()
    generator = torch.Generator().manual_seed(0)
    r = args.repeats

    logits = torch.randn(384, 65536, generator=generator).bfloat16()
    reused = torch.empty(384, 65536)
    vocab_grad = torch.empty(30522, 384)
    hidden = torch.randn(128, 24, 384, generator=generator).bfloat16().requires_grad_()
    upstream = torch.ones_like(hidden)
    chunk, targets = torch.randn(4, 65536, generator=generator), torch.rand(4, 65536, generator=generator)
    queue = F.normalize(torch.randn(65536, 768, generator=generator), dim=1)
    queue_bf16 = queue.bfloat16()
    teacher = F.normalize(torch.randn(128, 768, generator=generator), dim=1) / 0.05

    def dropout_step(fn):
        hidden.grad = None
        fn(hidden).backward(upstream)

    times = {
        "copy_fresh_ms": ms(lambda: logits.float(), r),
        "copy_reused_ms": ms(lambda: reused.copy_(logits), r),
        "grad_fresh_ms": ms(lambda: torch.zeros(30522, 384), r),
        "grad_reused_ms": ms(lambda: vocab_grad.zero_(), r),
        "dropout_torch_ms": ms(lambda: dropout_step(lambda x: F.dropout(x, 0.1, training=True)), r),
        "dropout_fast_ms": ms(lambda: dropout_step(lambda x: fast_dropout(x, 0.1)), r),
        "rowdot_bmm_ms": ms(lambda: torch.bmm(chunk.unsqueeze(1), targets.unsqueeze(2)), 10 * r),
        "rowdot_vecdot_ms": ms(lambda: torch.linalg.vecdot(chunk, targets, dim=1), 10 * r),
        "teacher_fp32_ms": ms(lambda: teacher @ queue.T, r),
        "teacher_bf16_ms": ms(lambda: teacher.bfloat16() @ queue_bf16.T, r),
    }
    ratios = {
        "fresh_vs_reused_copy": times["copy_fresh_ms"] / times["copy_reused_ms"],
        "fresh_vs_reused_grad": times["grad_fresh_ms"] / times["grad_reused_ms"],
        "torch_vs_fast_dropout": times["dropout_torch_ms"] / times["dropout_fast_ms"],
        "bmm_vs_vecdot_rowdot": times["rowdot_bmm_ms"] / times["rowdot_vecdot_ms"],
        "fp32_vs_bf16_teacher": times["teacher_fp32_ms"] / times["teacher_bf16_ms"],
    }
    ratios = {key: round(value, 2) for key, value in ratios.items()}
    for key, value in times.items():
        print(f"{key:<22}{value:>10.3f} ms")
    print(", ".join(f"{key} {value:g}x" for key, value in ratios.items()))
    record = {"bench": "step_costs", **ratios, "times_ms": times, "repeats": r,
              "wall_s": round(time.perf_counter() - started, 1)}
    return write_record(args.write, record, threads=args.threads, load_before=load_before)


if __name__ == "__main__":
    main()
