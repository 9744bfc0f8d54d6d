"""The teacher pass against sentence-transformers' ``encode`` of the same model, on the same corpus sentences.

``--sentences`` (default 4,096) distinct sentences of the ``mixed`` corpus (a seeded sample) are embedded by the
``mpnet-base`` teacher (all-mpnet-base-v2, max length 128), all in one run:

    raydistill        ``ensure_teacher_embeddings`` into an empty cache: the real pass (length-ordered blocks, token-
                      budget batches, chunked cache writes) by one teacher in this process with ``--actors ×
                      --threads`` threads, precision ``auto`` (bf16 where the CPU has hardware bf16, else fp32).
                      Timed from the call to the last vector in the cache, model loading included.
    raydistill pool   the same pass through the Ray Data pool the jobs use (``--actors`` teacher actors ×
                      ``--threads`` threads), timed the same way, so Ray worker start-up (a process, torch and
                      transformers imports) is included too: a one-off cost that 4,096 sentences cannot amortise and
                      a corpus pass can (``pool_*`` keys; ``--no-pool`` skips it)
    st                sentence-transformers ``SentenceTransformer.encode`` of the same directory, its defaults
                      (fp32, batch 32, length-sorted), ``--actors × --threads`` torch threads
    st_bf16           the same with the model cast to bf16 (``model.bfloat16()``)

    teacher_vs_st                 raydistill sentences/s ÷ st
    teacher_vs_st_bf16            raydistill sentences/s ÷ st_bf16
    pool_vs_st, pool_vs_st_bf16   the same for raydistill pool
    teacher_bf16_limit_fraction   the pass's achieved FLOP rate ÷ this machine's bf16 matmul limit (bench/limit.py's
                                  GEMMs in bf16 at the same thread count); null when the pass did not run in bf16
    teacher_limit_fraction        the same against the limit of the precision the pass did run in
    teacher_limit_fraction_quiet_fp32   achieved FLOP rate ÷ the quiet-machine fp32 limit of results/bench-limit.json
    bf16_cosine_mean              mean cosine between raydistill's bf16 and fp32 teacher vectors of the same sentences

FLOPs of a forward: ``2·M·n + 4·L·H·n²`` per sentence of ``n`` real tokens (M matmul parameters of the encoder
layers, L layers, H hidden; bench/limit.py), so padding counts as waste. Where the CPU has no hardware bf16 (torch
then emulates it, several times slower than fp32), the two bf16 measurements run on the first ``--bf16-sentences``
(default 256) sentences only, and the record says so.

    python bench/teacher_pass.py --write results/bench-teacher_pass.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import common  # noqa: F401  (environment before torch)

import numpy as np
import torch

from common import RESULTS, load_average, read_record, set_threads, write_record
from limit import encoder_shape, measure_limit, token_counts

TEACHER = "mpnet-base"


def corpus_sample(count: int, seed: int = 0) -> list[str]:
    """``count`` distinct sentences of the ``mixed`` corpus in a seeded random order."""
    from raydistill.data.corpus import read_corpus

    texts = read_corpus("mixed").texts
    return [texts[i] for i in np.random.default_rng(seed).permutation(len(texts))[:count]]


def forward_gflop(texts: list[str], max_length: int) -> float:
    """Forward GFLOPs of the teacher over ``texts`` at their real token counts (module docstring)."""
    shape = encoder_shape(TEACHER)
    counts = np.asarray(token_counts(TEACHER, texts, max_length), dtype=np.float64)
    return float((2.0 * shape.matmul_params * counts + 4.0 * shape.layers * shape.hidden * counts ** 2).sum() / 1e9)


def raydistill_pass(texts: list[str], args, in_process: bool) -> tuple[float, np.ndarray, dict]:
    """Seconds of a full teacher pass into an empty cache, its vectors float32 [N, D] and its stats."""
    from raydistill.config.job import RoleResources
    from raydistill.runtime.teachers.embedding_cache import ensure_teacher_embeddings
    from raydistill.runtime.teachers.teacher import TeacherSpec

    # In-process: one teacher with every thread the pool's actors would share (the module docstring's CPUs).
    actors, threads = (1, args.actors * args.threads) if in_process else (args.actors, args.threads)
    resources = RoleResources(num_actors=actors, num_cpus=1, threads=threads, batch_size=args.batch_size,
                              max_tokens=args.max_tokens, precision=args.precision)
    spec = TeacherSpec(model=TEACHER, max_length=args.max_length, resources=resources)
    with tempfile.TemporaryDirectory() as cache_root:
        started = time.perf_counter()
        vectors, stats = ensure_teacher_embeddings(texts, "bench", spec, cache_root, in_process=in_process)
        seconds = time.perf_counter() - started
    return seconds, vectors, stats


def st_rate(texts: list[str], bf16: bool, threads: int, max_length: int) -> float:
    """Sentences/s of sentence-transformers' ``encode`` (defaults: batch 32, length-sorted) of the teacher."""
    from sentence_transformers import SentenceTransformer

    from raydistill.models import resolve_model

    set_threads(threads)
    model = SentenceTransformer(str(resolve_model(TEACHER)), device="cpu")
    model.max_seq_length = max_length
    if bf16:
        model = model.bfloat16()
    model.encode(texts[:32])  # warm-up: first-call allocations and kernel selection
    started = time.perf_counter()
    model.encode(texts)
    return len(texts) / (time.perf_counter() - started)


def in_process_vectors(texts: list[str], precision: str, args) -> np.ndarray:
    """The teacher's L2-normalised vectors float32 [N, D] of ``texts`` in ``precision``, in this process."""
    from raydistill.runtime.teachers.teacher import TeacherEncoder

    teacher = TeacherEncoder(TEACHER, max_length=args.max_length, threads=args.actors * args.threads,
                             batch_size=args.batch_size, max_tokens=args.max_tokens, precision=precision)
    return teacher.encode(texts)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sentences", type=int, default=4096)
    parser.add_argument("--bf16-sentences", type=int, default=256,
                        help="sentences for the bf16 runs when the CPU emulates bf16 (all of them when it does not)")
    parser.add_argument("--actors", type=int, default=1, help="teacher actors of the Ray Data pool")
    parser.add_argument("--threads", type=int, default=2, help="torch threads per teacher actor")
    parser.add_argument("--batch-size", type=int, default=256, help="most sentences per teacher forward")
    parser.add_argument("--max-tokens", type=int, default=None, help="padded tokens per teacher forward")
    parser.add_argument("--max-length", type=int, default=128, help="teacher truncation (data.teacher_max_length)")
    parser.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"))
    parser.add_argument("--no-pool", action="store_true", help="skip the Ray Data pool pass")
    parser.add_argument("--note", default="", help="free text stored in the record's notes")
    parser.add_argument("--write", type=Path, default=None, help="e.g. results/bench-teacher_pass.json")
    args = parser.parse_args(argv)

    from raydistill.runtime.teachers.teacher import bf16_support

    load_before = load_average()
    cpus = args.actors * args.threads
    texts = corpus_sample(args.sentences)
    native_bf16, bf16_why = bf16_support()
    bf16_texts = texts if native_bf16 else texts[:args.bf16_sentences]
    gflop = forward_gflop(texts, args.max_length)

    pass_s, vectors, stats = raydistill_pass(texts, args, in_process=True)
    teacher_rate = len(texts) / pass_s
    print(f"raydistill teacher pass: {teacher_rate:.1f} sentences/s ({stats['precision']}, {pass_s:.1f} s)")
    pool_rate = None
    if not args.no_pool:
        import ray

        ray.init(num_cpus=cpus + 1, include_dashboard=False, logging_level="ERROR")
        pool_s, _, _ = raydistill_pass(texts, args, in_process=False)
        ray.shutdown()
        pool_rate = len(texts) / pool_s
        print(f"raydistill teacher pass, Ray Data pool: {pool_rate:.1f} sentences/s ({pool_s:.1f} s, start-up "
              "included)")

    st = st_rate(texts, False, cpus, args.max_length)
    print(f"sentence-transformers fp32: {st:.1f} sentences/s")
    st_bf16 = st_rate(bf16_texts, True, cpus, args.max_length)
    print(f"sentence-transformers bf16: {st_bf16:.1f} sentences/s ({len(bf16_texts)} sentences)")
    reference = (vectors[:len(bf16_texts)] if stats["precision"] == "fp32"
                 else in_process_vectors(bf16_texts, "fp32", args))
    cosine = float(np.mean(np.sum(in_process_vectors(bf16_texts, "bf16", args) * reference, axis=1)))
    print(f"bf16 / fp32 cosine: {cosine:.6f}")

    limits = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        sizes = (1024, 2048) if native_bf16 or name == "fp32" else (1024,)
        limits[name] = measure_limit(cpus, repeats=3, sizes=sizes, dtype=dtype)["limit_gflops"]
    achieved = gflop / pass_s
    fraction = achieved / limits[stats["precision"]]
    # A limit measured in the same run is only comparable when the load stayed the same; the committed quiet-machine
    # fp32 limit is the steadier yardstick on a shared box.
    committed = read_record(RESULTS / "bench-limit.json")
    print(f"achieved {achieved:.1f} GFLOP/s; limits {limits} GFLOP/s; fraction {fraction:.3f}")

    notes = [] if not args.note else [args.note]
    if not native_bf16:
        notes.append(f"This CPU has no hardware bf16 ({bf16_why}): torch emulates bf16 products, so precision auto "
                     f"ran the teacher in fp32, teacher_bf16_limit_fraction is null, and the bf16 runs (st_bf16, "
                     f"the cosine) used the first {len(bf16_texts)} sentences only.")
    record = {
        "bench": "teacher_pass",
        "teacher_vs_st": round(teacher_rate / st, 3),
        "teacher_vs_st_bf16": round(teacher_rate / st_bf16, 3),
        "teacher_bf16_limit_fraction": round(fraction, 3) if stats["precision"] == "bf16" else None,
        "bf16_cosine_mean": round(cosine, 6),
        "teacher_limit_fraction": round(fraction, 3),
        "teacher_limit_fraction_quiet_fp32": round(achieved / committed["limit_gflops"], 3) if committed else None,
        "teacher_precision": stats["precision"],
        "native_bf16": native_bf16,
        "teacher_sentences_per_s": round(teacher_rate, 1),
        "teacher_pass_s": round(pass_s, 2),
        "pool_sentences_per_s": None if pool_rate is None else round(pool_rate, 1),
        "pool_vs_st": None if pool_rate is None else round(pool_rate / st, 3),
        "pool_vs_st_bf16": None if pool_rate is None else round(pool_rate / st_bf16, 3),
        "st_sentences_per_s": round(st, 1),
        "st_bf16_sentences_per_s": round(st_bf16, 1),
        "st_bf16_sentences": len(bf16_texts),
        "achieved_gflops": round(achieved, 1),
        "limit_gflops": limits,
        "forward_gflop": round(gflop, 1),
        "teacher": TEACHER,
        "sentences": len(texts),
        "corpus": f"{len(texts)} sentences of the mixed corpus (seeded sample)",
        "settings": {"actors": args.actors, "threads": args.threads, "batch_size": args.batch_size,
                     "max_tokens": args.max_tokens, "max_length": args.max_length, "precision": args.precision,
                     "runner": "in-process" + ("" if args.no_pool else "; pool: ray-data")},
        "notes": notes,
    }
    record = write_record(args.write, record, threads=cpus, load_before=load_before)
    print(json.dumps({k: record[k] for k in ("teacher_vs_st", "teacher_vs_st_bf16", "teacher_bf16_limit_fraction",
                                             "bf16_cosine_mean", "load_before", "load_after")}))
    return record


if __name__ == "__main__":
    main()
