"""What bf16 products do to ConGen's target distribution P_T (``train.precision: bf16``).

With bf16, ConGen multiplies the teacher's batch against a bf16 copy of the queue (one GEMM with the student's rows):
fp32 accumulation, the [B, K] result rounded to bf16, then the softmax in fp32. This measures the change that
makes to P_T on real teacher vectors: mpnet-base embeddings of the ConGen job's Flickr30k captions (the shipped
congen.yaml's corpus, from the jobs' teacher cache), B = 128 batch rows against a queue of the next K captions'
vectors, at the temperatures ConGen uses:

    logit_abs_diff_mean / _max      |z_fp32 − z_bf16|, z = t·qᵀ / τ_T
    kl_mean / kl_max                KL(P_T fp32 ‖ P_T bf16) per row, nats
    entropy_mean                    H(P_T fp32) per row, nats (the scale the KL is small against)

    python bench/precision.py --write results/bench-precision.json
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import common  # noqa: F401  (environment before torch)

import torch
import torch.nn.functional as F

from common import load_average, set_threads, write_record


def teacher_rows(count: int, teacher: str) -> torch.Tensor:
    """L2-normalised ``teacher`` vectors of the first ``count`` control captions of congen.yaml's corpus,
    from the jobs' teacher cache (what is missing is encoded once and cached)."""
    from train_step import CONFIG, teacher_vectors

    from raydistill.config.job import JobConfig
    from raydistill.runtime.teachers.pipeline import load_training_texts

    cfg = JobConfig.from_yaml(CONFIG, overrides=[f"teacher={teacher}", "tracking.enabled=false"])
    texts = [row["text_control"] for row in load_training_texts(cfg.data, cfg.seed)][:count]
    if len(texts) < count:
        raise ValueError(f"the corpus has {len(texts)} captions, fewer than batch + queue = {count}")
    vectors, _ = teacher_vectors(cfg, texts, "cached")
    return F.normalize(torch.as_tensor(vectors, dtype=torch.float32), dim=1)


def compare(teacher: torch.Tensor, queue: torch.Tensor, tau: float) -> dict[str, float]:
    logits32 = (teacher / tau) @ queue.T  # [B, K]
    logits16 = ((teacher / tau).bfloat16() @ queue.bfloat16().T).float()
    log_p32, log_p16 = logits32.log_softmax(dim=1), logits16.log_softmax(dim=1)
    kl = (log_p32.exp() * (log_p32 - log_p16)).sum(dim=1)
    difference = (logits32 - logits16).abs()
    return {"logit_abs_diff_mean": round(difference.mean().item(), 5),
            "logit_abs_diff_max": round(difference.max().item(), 4),
            "kl_mean": float(f"{kl.mean().item():.3g}"), "kl_max": float(f"{kl.max().item():.3g}"),
            "entropy_mean": round(-(log_p32.exp() * log_p32).sum(dim=1).mean().item(), 3)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--teacher", default="mpnet-base")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--queue-size", type=int, default=4096, help="congen.yaml's K")
    parser.add_argument("--taus", type=float, nargs="+", default=[0.05, 0.07])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--write", type=Path, default=None, help="e.g. results/bench-precision.json")
    args = parser.parse_args(argv)
    set_threads(args.threads)
    load_before = load_average()
    started = time.perf_counter()
    rows = teacher_rows(args.batch + args.queue_size, args.teacher)
    teacher, queue = rows[:args.batch], rows[args.batch:]
    by_tau = {f"{tau:g}": compare(teacher, queue, tau) for tau in args.taus}
    for tau, figures in by_tau.items():
        print(f"tau_T {tau}: " + ", ".join(f"{key} {value:g}" for key, value in figures.items()))
    headline = by_tau[f"{args.taus[0]:g}"]
    record = {"bench": "precision", "teacher": args.teacher, "batch": args.batch, "queue_size": args.queue_size,
              "by_tau_teacher": by_tau, "bf16_target_kl_mean": headline["kl_mean"],
              "bf16_target_entropy_mean": headline["entropy_mean"], "wall_s": round(time.perf_counter() - started, 1)}
    return write_record(args.write, record, threads=args.threads, load_before=load_before)


if __name__ == "__main__":
    main()
