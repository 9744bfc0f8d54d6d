"""Peak resident memory of a ConGen job, driver + Ray workers, as the training corpus grows: 30k, 100k, 300k rows.

Each size runs the ConGen job (``run_distillation`` on congen.yaml: student minilm-l3 + Dense(384 → 768), teacher
mpnet-base, views control = the sentence and generalize = ``delete:0.1``, one learner actor) in a child process
for ``--steps`` optimiser steps, without the final 7-STS evaluation. This process samples the resident memory of
the child's whole process tree every 0.2 s (the driver, the local Ray it starts: GCS, raylet, the learner and
Ray Data workers) and keeps the peak of the sum and of the driver alone.

What grows with the corpus is what the job keeps per row: the texts of each view while the driver builds the rows
(then they are in the memory-mapped rows file, whose pages every process that reads them maps), the embedding
cache's index (~100 bytes a sentence). The teacher's vectors are not among them: batches read their rows' vectors
from the memory-mapped cache. To keep the teacher out of the measurement, the
bench fills a fresh cache per size, with random unit vectors of that size's sentences under mpnet-base's identity,
so the job's teacher pass finds every sentence cached (it loads no teacher) and the cache is as large as a real
job's. The corpus is ``mixed`` (269,672 sentences) plus, to reach 300,000,
shuffled-word variants of its sentences: each size trains on a corpus file of exactly that many sentences (the
first N lines of one file), so a smaller run never reads the larger corpus.

    rss_300k_over_30k    peak RSS (driver + workers) at 300k rows / at 30k rows; the target is ≤ 1.3
    peak_anonymous_rss_mb  the same tree's RSS less its file-backed and shared pages (memory maps, the object store)

    python bench/memory.py --quick                                 # 3k / 10k / 30k rows, nothing written
    python bench/memory.py --write results/bench-memory.json       # ~15-25 min here
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common  # noqa: F401  (environment before torch)

import numpy as np

from common import ROOT, load_average, write_record

SIZES = (30_000, 100_000, 300_000)
QUICK_SIZES = (3_000, 10_000, 30_000)
TEACHER = "mpnet-base"
TEACHER_DIM = 768


def write_corpus(path: Path, rows: int, seed: int = 0) -> int:
    """``rows`` distinct sentences, one a line: the mixed corpus, then shuffled-word variants of its sentences."""
    from raydistill.data.corpus import read_corpus

    texts = list(dict.fromkeys(read_corpus("mixed").texts))
    seen = set(texts)
    rng = np.random.default_rng(seed)
    source = 0
    while len(texts) < rows:
        words = texts[source % len(seen)].split()
        variant = " ".join(words[i] for i in rng.permutation(len(words)))
        source += 1
        if variant not in seen:
            seen.add(variant)
            texts.append(variant)
    path.write_text("\n".join(texts[:rows]) + "\n")
    return rows


def corpus_of(corpus: Path, rows: int) -> Path:
    """The first ``rows`` sentences of ``corpus``, as a file of their own (written once)."""
    path = corpus.with_name(f"corpus-{rows}.txt")
    if not path.is_file():
        lines = corpus.read_text().splitlines()[:rows]
        path.write_text("\n".join(lines) + "\n")
    return path


def job_overrides(work: Path, corpus: Path, rows: int, steps: int) -> list[str]:
    return [f"teacher={TEACHER}", f"data.corpus=file:{corpus_of(corpus, rows)}", "data.max_sentences=null",
            "data.views={control: none, generalize: 'delete:0.1'}", "data.teacher_views=[control]",
            f"train.max_steps={steps}", "train.eval_every=100000", "train.checkpoint_every=100000",
            f"run_dir={work / f'run-{rows}'}", f"cache_dir={work / f'embeddings-{rows}'}", "tracking.enabled=false",
            "resources.learner.num_learners=1", "resources.learner.num_cpus=1", "resources.learner.threads=1",
            "resources.teacher.threads=1"]


def fill_teacher_cache(work: Path, corpus: Path, rows: int, steps: int) -> str:
    """Random unit vectors for every sentence of this size's corpus, in a cache of its own, under the job's teacher
    identity: the pass hits them all, and the cache holds what a real job's would."""
    from raydistill.config.job import JobConfig
    from raydistill.runtime.teachers.embedding_cache import EmbeddingCache
    from raydistill.runtime.engine.preflight import preflight
    from raydistill.runtime.teachers.teacher import TeacherSpec
    from raydistill.shipped import shipped_config

    cfg = preflight(JobConfig.from_yaml(shipped_config("congen"), job_overrides(work, corpus, rows, steps)))
    spec = TeacherSpec.from_config(cfg)
    cache = EmbeddingCache(cfg.resolved_cache_dir(), spec.identity(), description=spec.describe())
    texts = corpus_of(corpus, rows).read_text().splitlines()
    rng = np.random.default_rng(1)
    for start in range(0, len(texts), 50_000):
        chunk = texts[start:start + 50_000]
        vectors = rng.standard_normal((len(chunk), TEACHER_DIM)).astype(np.float32)
        cache.append(chunk, vectors / np.linalg.norm(vectors, axis=1, keepdims=True), view="control")
    return str(cache.dir)


def run_child(rows: int, work: Path, corpus: Path, steps: int) -> None:
    """The job itself (in the child process)."""
    from raydistill.config.job import JobConfig
    from raydistill.runtime.jobs.distill import run_distillation
    from raydistill.shipped import shipped_config

    cfg = JobConfig.from_yaml(shipped_config("congen"), job_overrides(work, corpus, rows, steps))
    record = run_distillation(cfg, result_path=work / f"result-{rows}.json", evaluate=False,
                              command="python bench/memory.py")
    training = record["training"]
    print(json.dumps({"rows": training["sentences"], "steps": training["steps"],
                      "teacher_cache": training.get("teacher_cache")}), flush=True)


def measure(rows: int, work: Path, corpus: Path, steps: int) -> dict:
    """Run one size in a child; sample its process tree's RSS; return the peaks (MiB) and what the job reported."""
    import psutil

    command = [sys.executable, str(Path(__file__).resolve()), "--child", str(rows), "--work", str(work),
               "--corpus", str(corpus), "--steps", str(steps)]
    log_path = work / f"child-{rows}.log"
    started = time.perf_counter()
    with open(log_path, "w") as log:
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        root = psutil.Process(child.pid)
        peak_total = peak_driver = peak_anonymous = 0
        while child.poll() is None:
            try:
                tree = [root, *root.children(recursive=True)]
                total = anonymous = 0
                for process in tree:
                    try:
                        memory = process.memory_info()
                    except psutil.Error:  # exited between listing and reading
                        continue
                    total += memory.rss
                    anonymous += memory.rss - memory.shared
                peak_total = max(peak_total, total)
                peak_anonymous = max(peak_anonymous, anonymous)
                peak_driver = max(peak_driver, root.memory_info().rss)
            except psutil.Error:
                pass
            time.sleep(0.2)
    if child.returncode != 0:
        raise SystemExit(f"the {rows}-row job failed (exit {child.returncode}); see {log_path}:\n"
                         + log_path.read_text()[-3000:])
    report = json.loads(log_path.read_text().strip().splitlines()[-1])
    return {"rows": rows, "trained_rows": report["rows"], "steps": report["steps"],
            "teacher_cache": report["teacher_cache"], "peak_rss_mb": round(peak_total / 2**20, 1),
            "peak_driver_rss_mb": round(peak_driver / 2**20, 1),
            "peak_anonymous_rss_mb": round(peak_anonymous / 2**20, 1), "seconds": round(time.perf_counter() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3k / 10k / 30k rows, nothing written")
    parser.add_argument("--steps", type=int, default=20, help="optimiser steps per size")
    parser.add_argument("--write", type=Path, default=None, help="e.g. results/bench-memory.json")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--corpus", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        run_child(args.child, args.work, args.corpus, args.steps)
        return 0

    sizes = QUICK_SIZES if args.quick else SIZES
    load_before = load_average()
    work = Path(tempfile.mkdtemp(prefix="bench-memory-"))
    try:
        corpus = work / "corpus.txt"
        write_corpus(corpus, max(sizes))
        runs = []
        for rows in sizes:
            cache_dir = fill_teacher_cache(work, corpus, rows, args.steps)
            runs.append(measure(rows, work, corpus, args.steps))
            print(json.dumps(runs[-1]), flush=True)
        smallest, largest = runs[0], runs[-1]
        record = {
            "bench": "memory",
            "what": "peak RSS of a ConGen job's process tree (driver + local Ray + learner and Ray Data workers) "
                    "by training rows; teacher vectors read per batch from the memory-mapped cache",
            "student": "minilm-l3", "teacher": TEACHER, "teacher_dim": TEACHER_DIM, "steps": args.steps,
            "teacher_cache": f"per size, random unit vectors of its corpus under {TEACHER}'s identity "
                             f"({Path(cache_dir).name})",
            "runs": runs,
            f"rss_{largest['rows'] // 1000}k_over_{smallest['rows'] // 1000}k": round(
                largest["peak_rss_mb"] / smallest["peak_rss_mb"], 3),
            "driver_rss_ratio": round(largest["peak_driver_rss_mb"] / smallest["peak_driver_rss_mb"], 3),
        }
        write_record(None if args.quick else args.write, record, threads=1, load_before=load_before)
        print(json.dumps({k: v for k, v in record.items() if k != "runs"}, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
