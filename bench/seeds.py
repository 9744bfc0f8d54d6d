"""The seed noise of each published student: its label-free recipe trained again with other seeds, at a smaller scale.

Contract: for each student size (``--sizes``: minilm-l3, bert-mini, bert-tiny), `raydistill distill`'s label-free
recipe for that size (``raydistill.ship.command.plan_distill`` and ``train_student``: the command's recipe and
training, no packaging), from ``mpnet-base``, on one fixed sample of ``--sentences`` sentences of the bundled
``mixed`` corpus (drawn once with seed 0 and written to a file, so every seed trains on the same text, as the
published runs on the whole corpus do; the seeds change initialisation, shuffling and augmentation only), for the
recipe's epochs (``--budget epochs``), once per seed of ``--seeds``. Each run's 7-STS average and STS-B dev are
recorded, with per size their mean, standard deviation and spread (max - min). The published runs train on the
whole corpus (269k sentences, 13 times this sample); the spread here stands in for theirs, which three seeds at
that scale would take days of this machine to measure. ``--precision auto`` (the default) leaves it to `raydistill
distill`'s own rule: bf16 where the CPU multiplies bf16 in hardware (the published runs' precision), fp32 elsewhere.

    python bench/seeds.py --write results/bench-seeds.json
    python bench/seeds.py --sizes bert-tiny --seeds 1000,1001,1002,1003,1004

A recipe lever is screened the same way, one change at a time against that spread: ``--set KEY=VALUE`` (repeatable,
any job config field, as `raydistill distill --set`) changes the recipe, and the run dirs and record say so:

    python bench/seeds.py --sizes minilm-l3 --seeds 1000 --set loss.queue_size=65536 \
        --write results/levers/bench-lever-minilm-l3-queue65536.json

Runs live in ``--work`` (default ``~/.cache/raydistill/bench-seeds``): the same command again resumes each
training from its checkpoints and reuses finished ones.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from common import comma_ints, comma_names, load_average, write_record  # before torch

TEACHER = "mpnet-base"
SIZES = ("minilm-l3", "bert-mini", "bert-tiny")


def write_sample(work: Path, sentences: int) -> Path:
    """A fixed, seeded sample of ``mixed`` as a text file (a sentence a line)."""
    import numpy as np

    from raydistill.data.corpus import read_corpus

    path = work / f"mixed-sample-{sentences}.txt"
    if not path.is_file():
        texts = list(dict.fromkeys(read_corpus("mixed").texts))
        chosen = np.sort(np.random.default_rng(0).choice(len(texts), size=min(sentences, len(texts)), replace=False))
        work.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{texts[i]}\n" for i in chosen), encoding="utf-8")
    return path


def train_seed(size: str, corpus: Path, out: Path, *, seed: int, precision: str, changes: list[str] = ()) -> dict:
    """One seed of the size's recipe; ``precision`` auto: the command's choice for this CPU."""
    from raydistill.ship.command import plan_distill, train_student

    plan = plan_distill(teacher=TEACHER, student=size, corpus=str(corpus), out=str(out), seed=seed, budget="epochs",
                        overrides=[*([f"train.precision={precision}"] if precision != "auto" else []), *changes])
    started = time.perf_counter()
    record = train_student(plan)
    scores = record.get("scores") or {}
    training = record.get("training") or {}
    return {"seed": seed, "sts7": scores.get("avg"), "stsb_dev": scores.get("stsb_dev"),
            "method": plan.recipe.method, "epochs": plan.cfg.train.epochs, "steps": training.get("steps"),
            "precision": plan.cfg.train.precision,
            "best_step": training.get("best_step"), "seconds_this_run": round(time.perf_counter() - started, 1),
            "published": {"file": plan.recipe.source, "stsb_dev": plan.recipe.stsb_dev, "sts7": plan.recipe.sts7}}


def spread(values: list[float]) -> dict:
    return {"mean": round(statistics.mean(values), 2),
            "std": round(statistics.stdev(values), 2) if len(values) > 1 else None,
            "spread": round(max(values) - min(values), 2), "n": len(values)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=comma_names(SIZES), default=list(SIZES), help="comma-separated")
    parser.add_argument("--seeds", type=comma_ints, default=[1000, 1001, 1002], help="comma-separated")
    parser.add_argument("--sentences", type=int, default=20000)
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto")
    parser.add_argument("--set", dest="changes", action="append", default=[], metavar="KEY=VALUE",
                        help="a change to the recipe (a lever), as raydistill distill --set; repeatable")
    parser.add_argument("--work", default=str(Path.home() / ".cache" / "raydistill" / "bench-seeds"))
    parser.add_argument("--write", help="result file (e.g. results/bench-seeds.json)")
    args = parser.parse_args(argv)
    sizes, seeds = args.sizes, args.seeds
    load_before = load_average()
    work = Path(args.work)
    corpus = write_sample(work, args.sentences)
    results = {}
    for size in sizes:
        label = "".join(f"-{change.replace('=', '').replace('.', '_')}" for change in args.changes)
        runs = [train_seed(size, corpus, work / f"{size}{label}-s{seed}", seed=seed,
                           precision=args.precision, changes=args.changes) for seed in seeds]
        results[size] = {"runs": runs, "sts7": spread([run["sts7"] for run in runs]),
                         "stsb_dev": spread([run["stsb_dev"] for run in runs]), "published": runs[0]["published"]}
        print(f"{size}: 7-STS {results[size]['sts7']}, STS-B dev {results[size]['stsb_dev']}", flush=True)
    record = {"teacher": TEACHER, "corpus": f"mixed, a fixed sample of {args.sentences:,} sentences (seed 0)",
              "precision": ", ".join(sorted({run["precision"] for entry in results.values()
                                              for run in entry["runs"]})), "seeds": seeds, "changes": args.changes, "sizes": results}
    write_record(args.write, record, threads=2, load_before=load_before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
