"""The same commands on the old training loops and on the one engine: do the numbers and the main job's time hold?

Two comparisons, each the same command run from two checkouts one after the other on this machine:

    main job      ``python jobs/mutual_tenc.py --cycles 2 --run-dir <runs>/tenc-<old|new>-2c`` from ``--old-tree``
                  (a checkout whose Trans-Encoder stages still train in their own loop) and ``--new-tree`` (this
                  one by default): each family's best bi- and cross-encoder (7-STS average), the start, wall time;
                  ``--seeds 1000,1001`` runs both again with ``--set seed=1001`` (run dirs ``...-2c-s1001``), so
                  the difference between the loops can be set beside the difference a seed makes in each
    distillation  ``python jobs/congen.py --set data.corpus=file:<corpus> --set train.precision=bf16 --run-dir
                  <runs>/parity-<old|new> --results-dir <runs>/parity-<old|new>-results`` from ``--distill-old-tree``
                  (a checkout before the one-engine change) and ``--new-tree``: 7-STS average and STS-B dev

Figures (targets: docs/benchmarks.md):

    main_job_wall_ratio        new wall_s / old wall_s (<= 1.10)
    main_job_max_abs_delta     the largest |new - old| of a family's best bi- or cross-encoder 7-STS (<= 0.3)
    distill_abs_delta          |new - old| 7-STS average of the distillation (<= 0.3)

and, with more than one seed (no target: what "seed noise" is here):

    main_job_seed_spread       per loop, family and model, the largest minus the smallest over the seeds
    main_job_<old|new>_seed_spread_max    its largest value per loop
    main_job_mean_abs_delta    the largest |mean over seeds new - mean over seeds old| of a family's best model

A run whose result already exists is read, not run again (the jobs resume and skip finished work the same way), so
a stopped comparison continues. The distillation corpus is 20,000 sentences drawn with seed 0 from the bundled
``mixed`` corpus as the new tree filters it, written once to ``--corpus``; both checkouts read that same file.

    git worktree add /tmp/old-loop 6b15bc3 && git worktree add /tmp/old-distill 56dc409
    python bench/engine_parity.py --old-tree /tmp/old-loop --distill-old-tree /tmp/old-distill \\
        --write results/bench-engine_parity.json

``--distillation-only --precision fp32`` runs only the distillation comparison, in fp32 (a CPU without AVX512-BF16
emulates bf16 many times slower): e.g. a checkout before a refactor against this one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import common  # noqa: F401  (environment before torch)

from common import ROOT, load_average, write_record

RUNS = Path.home() / ".cache" / "raydistill" / "runs"
CORPUS = Path.home() / ".cache" / "raydistill" / "parity" / "mixed-20k.txt"
CORPUS_SENTENCES = 20_000


def tree_sha(tree: Path) -> str:
    """The checkout's commit; a checkout whose code differs from it is refused (its numbers would name no commit).
    Only code counts, as for every result file (``code_provenance``): a bench that wrote its result there is fine."""
    from raydistill.evaluation.results import code_provenance

    sha = code_provenance(str(tree.resolve()))["git_sha"]
    if sha.endswith("-dirty") or len(sha) != 40:
        raise SystemExit(f"{tree}: its code is not a clean commit ({sha}); compare clean commits")
    return sha


RAN: list[str] = []  # the runs this invocation made (the others were read from an earlier one's output)


def run_in(tree: Path, args: list[str], log: Path) -> None:
    """``python <args>`` from ``tree`` with that tree's package first on the path, output to ``log``."""
    RAN.append(f"{tree}: python {' '.join(args)}")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    print(f"[parity] {tree}: python {' '.join(args)} (log: {log})", flush=True)
    with open(log, "a") as stream:
        subprocess.run([sys.executable, *args], cwd=tree, env=env, stdout=stream, stderr=subprocess.STDOUT,
                       check=True)


DEFAULT_SEED = 1000  # the shipped mutual_tenc.yaml's: its runs keep the names of the first comparison
BEST_KEYS = ("best_bi", "best_cross")


def main_job(tree: Path, tag: str, runs: Path, seed: int = DEFAULT_SEED) -> dict:
    run_dir = runs / (f"tenc-{tag}-2c" if seed == DEFAULT_SEED else f"tenc-{tag}-2c-s{seed}")
    summary_path = tree / "results" / "mutual_tenc" / run_dir.name / "summary.json"
    if not summary_path.is_file():
        seed_args = [] if seed == DEFAULT_SEED else ["--set", f"seed={seed}"]
        run_in(tree, ["jobs/mutual_tenc.py", "--cycles", "2", *seed_args, "--run-dir", str(run_dir)],
               runs / f"{run_dir.name}.log")
    summary = json.loads(summary_path.read_text())
    families = {name: {key: family[key] for key in ("start_bi", "best_bi", "best_cross", "best_bi_cycle",
                                                    "best_cross_cycle", "best_bi_stsb_dev", "best_cross_stsb_dev")}
                for name, family in summary["by_family"].items()}
    return {"tree_sha": tree_sha(tree), "summary": str(summary_path), "command": summary["command"],
            "wall_s": summary["wall_s"], "stage_wall_s": summary["stage_wall_s"], "families": families}


def write_corpus(path: Path) -> None:
    """20,000 distinct sentences of the filtered ``mixed`` corpus, seed 0, one per line."""
    import numpy as np

    from raydistill.data.corpus import read_corpus

    texts = list(dict.fromkeys(read_corpus("mixed").texts))
    keep = np.sort(np.random.default_rng(0).choice(len(texts), size=CORPUS_SENTENCES, replace=False))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(texts[i].replace("\n", " ") + "\n" for i in keep))


def distillation(tree: Path, tag: str, runs: Path, corpus: Path, precision: str = "bf16") -> dict:
    name = f"parity-{tag}" if precision == "bf16" else f"parity-{tag}-{precision}"
    results_dir = runs / f"{name}-results"
    result_path = results_dir / "congen-minilm-l3-mpnet-base.json"
    if not result_path.is_file():
        run_in(tree, ["jobs/congen.py", "--set", f"data.corpus=file:{corpus}", "--set", f"train.precision={precision}",
                      "--run-dir", str(runs / name), "--results-dir", str(results_dir)], runs / f"{name}.log")
    record = json.loads(result_path.read_text())
    training = record["training"]
    return {"tree_sha": tree_sha(tree), "result": str(result_path), "command": record.get("command"),
            "avg": record["scores"]["avg"], "stsb_dev": record["scores"].get("stsb_dev"),
            "sentences": training.get("sentences"), "steps": training.get("steps"),
            "best_step": training.get("best_step")}


def seed_figures(by_seed: dict[int, dict[str, dict]]) -> dict:
    """Each loop's spread over the seeds, and the loops' difference of their means, per family and best model."""
    def values(loop: str, family: str, key: str) -> list[float]:
        return [runs[loop]["families"][family][key] for runs in by_seed.values()]

    families = next(iter(by_seed.values()))["old"]["families"]
    spread = {loop: {family: {key: round(max(values(loop, family, key)) - min(values(loop, family, key)), 2)
                              for key in BEST_KEYS} for family in families} for loop in ("old", "new")}
    mean_deltas = {family: {key: round(sum(values("new", family, key)) / len(by_seed)
                                       - sum(values("old", family, key)) / len(by_seed), 2) for key in BEST_KEYS}
                   for family in families}
    return {
        "seeds": sorted(by_seed),
        "main_job_seed_spread": spread,
        **{f"main_job_{loop}_seed_spread_max": max(d[key] for d in spread[loop].values() for key in BEST_KEYS)
           for loop in ("old", "new")},
        "main_job_mean_deltas": mean_deltas,
        "main_job_mean_abs_delta": max(abs(d[key]) for d in mean_deltas.values() for key in BEST_KEYS),
        "main_job_by_seed": {str(seed): {"deltas": {family: {key: round(runs["new"]["families"][family][key]
                                                                       - runs["old"]["families"][family][key], 2)
                                                             for key in BEST_KEYS} for family in families},
                                         "old": runs["old"], "new": runs["new"]}
                             for seed, runs in by_seed.items() if seed != DEFAULT_SEED},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--old-tree", type=Path, help="checkout of the old Trans-Encoder loop")
    parser.add_argument("--distill-old-tree", type=Path, required=True,
                        help="checkout before the one-engine change (the old distillation loop)")
    parser.add_argument("--new-tree", type=Path, default=ROOT)
    parser.add_argument("--runs", type=Path, default=RUNS, help="run dirs, result dirs and logs of the four runs")
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--seeds", default=str(DEFAULT_SEED),
                        help=f"comma-separated job seeds of the main-job comparison (default {DEFAULT_SEED}, the "
                             "shipped config's)")
    parser.add_argument("--distillation-only", action="store_true",
                        help="only the distillation comparison (no main job; --old-tree not needed)")
    parser.add_argument("--precision", choices=("bf16", "fp32"), default="bf16",
                        help="train.precision of the distillation runs (fp32 on a CPU without AVX512-BF16)")
    parser.add_argument("--write", help="result JSON path")
    args = parser.parse_args()
    if args.old_tree is None and not args.distillation_only:
        parser.error("--old-tree is required unless --distillation-only")

    load_before = load_average()
    if not args.corpus.is_file():
        write_corpus(args.corpus)
    distill_old = distillation(args.distill_old_tree, "old", args.runs, args.corpus, args.precision)
    distill_new = distillation(args.new_tree, "new", args.runs, args.corpus, args.precision)
    distill = {
        "distill_abs_delta": round(abs(distill_new["avg"] - distill_old["avg"]), 2),
        "distill_stsb_dev_delta": round(distill_new["stsb_dev"] - distill_old["stsb_dev"], 2),
        "distill": {"old": distill_old, "new": distill_new, "corpus": str(args.corpus),
                    "corpus_sentences": CORPUS_SENTENCES, "precision": args.precision},
    }
    notes = {"ran_here": RAN, "load_note": "load_before/after are this invocation's; runs it only read were measured "
                                           "when they ran (their own files hold their dates)"}
    if args.distillation_only:
        record = write_record(args.write, {**distill, **notes}, threads=2, load_before=load_before)
        print(json.dumps({k: v for k, v in record.items() if not isinstance(v, dict)}, indent=1))
        return
    seeds = [int(seed) for seed in args.seeds.split(",")]
    if DEFAULT_SEED not in seeds:
        raise SystemExit(f"--seeds must include {DEFAULT_SEED}, the shipped config's seed (the wall-time comparison)")
    by_seed = {seed: {"old": main_job(args.old_tree, "old", args.runs, seed),
                      "new": main_job(args.new_tree, "new", args.runs, seed)} for seed in seeds}
    old, new = by_seed[DEFAULT_SEED]["old"], by_seed[DEFAULT_SEED]["new"]
    deltas = {name: {key: round(new["families"][name][key] - family[key], 2)
                     for key in ("start_bi", *BEST_KEYS)}
              for name, family in old["families"].items()}
    record = {
        "main_job_wall_ratio": round(new["wall_s"] / old["wall_s"], 3),
        "main_job_max_abs_delta": max(abs(d[key]) for d in deltas.values() for key in ("best_bi", "best_cross")),
        "main_job_deltas": deltas,
        "main_job": {"old": old, "new": new},
        **(seed_figures(by_seed) if len(seeds) > 1 else {}),
        **distill,
        **notes,
    }
    record = write_record(args.write, record, threads=2, load_before=load_before)
    print(json.dumps({k: v for k, v in record.items() if not isinstance(v, dict)}, indent=1))


if __name__ == "__main__":
    main()
