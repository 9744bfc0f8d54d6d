"""How much of what cutting the teacher lost a distilled student wins back, on domains no recipe was chosen on.

Contract: for each domain, a seeded split of a labelled pair set into halves A and B. The sentences of A, less
every sentence of B, are the unlabelled corpus. From B: ``--test-pairs`` test pairs, then ``--dev-pairs`` dev pairs
that share no sentence with them (when B holds fewer, 60 % test and 40 % dev). Then `raydistill distill --teacher
minilm-l6 --student layers:3 --corpus A --dev-pairs DEV` trains, to distill's default budget unless ``--budget``
says otherwise (``raydistill.ship.command.train_student``: the command's cut, recipe and training, without its
packaging), and the start (the layer cut before training), the student (its best checkpoint by the domain's dev)
and the teacher are scored on the test pairs, which nothing chose on: ROC AUC x 100 of the cosine, as the labels are
0/1. The record gives each score, ``recovered`` = (student - start) / (teacher - start), the run's training
(steps, epochs, the dev curve, seconds) and the split's sizes; ``--seeds`` repeats each domain per seed (the split
stays the same, the training seed changes) and gives the mean and spread.

Domains (the data the package ships; no recipe was chosen on either, both are apart from STS and captions):

    qqp    QQP dev: 10,000 question pairs of a question-answer site, duplicate or not; the closest to a user's own
           corpus of questions. It is also Trans-Encoder's QQP evaluation set, so the corpus keeps its sentences by
           ``data.evaluation_set_split=qqp_dev`` (every other evaluation set is still removed) and the test pairs
           share no sentence with it.
    mrpc   MRPC train: 3,576 newswire sentence pairs, paraphrase or not: another genre and another kind of pair.
           Its sentences are one of the ``mixed`` corpus's sources, which the recipes were trained on (as
           unlabelled text, never as pairs to choose by); the student here starts from the cut and sees only half A.
    mnli   MultiNLI dev (matched + mismatched): premise and hypothesis from five genres (fiction, government,
           letters, telephone speech, travel...), entailment (1) or contradiction (0), neutral left out. Also one
           of ``mixed``'s sources as unlabelled text; no label-free recipe read its labels.

``recovered`` is left out (None) when the teacher beats the start by less than ``MIN_GAP`` points on the test pairs:
the cut lost too little there for a share of it to say anything (the record keeps ``cut_lost``).

    python bench/domain.py --write results/bench-domain.json                 # both domains, one seed each
    python bench/domain.py --domains qqp --seeds 1000,1001,1002 --budget 30m --write results/bench-domain.json

Runs live in ``--work`` (default ``~/.cache/raydistill/bench-domain``): the same command again resumes each
training from its checkpoints and reuses finished ones (distill's own resume).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

from common import comma_ints, comma_names, load_average, write_record  # before torch

from raydistill.data.readers import Pair
from raydistill.data.registry import load_dataset

DOMAINS = {"qqp": ("qqp_dev",), "mrpc": ("mrpc_train",), "mnli": ("mnli_dev",)}
SPLIT_OF = {"qqp": "qqp_dev"}  # the evaluation set a domain's corpus is a training split of
# A pair's 0/1 label: QQP and MRPC carry it; MultiNLI's entailment is 1, contradiction 0, neutral left out.
NLI_LABELS = {"entailment": 1.0, "contradiction": 0.0}
# Below this gap between teacher and start (AUC points) the cut lost too little for a share of it to mean anything.
MIN_GAP = 1.0


def binary_label(label) -> float | None:
    """The pair's 0/1 label, or None for a pair the domain leaves out (an NLI neutral)."""
    if isinstance(label, str):
        return NLI_LABELS.get(label)
    return float(label)
TEACHER, STUDENT = "minilm-l6", "layers:3"


def split_domain(pairs: list[Pair], *, seed: int, test_pairs: int, dev_pairs: int
                 ) -> tuple[list[str], list[Pair], list[Pair]]:
    """``(corpus, dev, test)`` of one domain (module docstring): nothing of B in the corpus, dev and test disjoint."""
    labelled = ((p.sentence1, p.sentence2, binary_label(p.label)) for p in pairs)
    pairs = list(dict.fromkeys(pair for pair in labelled if pair[2] is not None))
    random.Random(seed).shuffle(pairs)
    half_a, half_b = pairs[:len(pairs) // 2], pairs[len(pairs) // 2:]
    in_b = {text for first, second, _ in half_b for text in (first, second)}
    corpus = list(dict.fromkeys(text for first, second, _ in half_a for text in (first, second) if text not in in_b))
    if len(half_b) < test_pairs + dev_pairs:
        test_pairs = round(0.6 * len(half_b))
        dev_pairs = len(half_b) - test_pairs
    test = [Pair(first, second, score) for first, second, score in half_b[:test_pairs]]
    in_test = {text for p in test for text in (p.sentence1, p.sentence2)}
    dev = [Pair(first, second, score) for first, second, score in half_b[test_pairs:]
           if first not in in_test and second not in in_test][:dev_pairs]
    return corpus, dev, test


def write_domain_files(name: str, work: Path, *, seed: int, test_pairs: int, dev_pairs: int) -> dict:
    """The corpus (a sentence a line) and the dev/test pairs (JSON Lines) of domain ``name`` under ``work/name``."""
    pairs = [pair for dataset in DOMAINS[name] for pair in load_dataset(dataset)]
    corpus, dev, test = split_domain(pairs, seed=seed, test_pairs=test_pairs, dev_pairs=dev_pairs)
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "corpus.txt").write_text("".join(f"{text}\n" for text in corpus), encoding="utf-8")
    for part, rows in (("dev", dev), ("test", test)):
        (folder / f"{part}.jsonl").write_text(
            "".join(json.dumps({"sentence1": p.sentence1, "sentence2": p.sentence2, "score": p.score}) + "\n"
                    for p in rows), encoding="utf-8")
    positives = sum(p.score == 1 for p in test) / max(len(test), 1)
    return {"source": list(DOMAINS[name]), "pairs": len(pairs), "corpus_sentences": len(corpus),
            "dev_pairs": len(dev), "test_pairs": len(test), "test_positive_share": round(positives, 3),
            "split_seed": seed, "files": {part: str(folder / f"{part}{ext}") for part, ext in
                                          (("corpus", ".txt"), ("dev", ".jsonl"), ("test", ".jsonl"))}}


def test_auc(model_dir: str | Path, test: list[Pair]) -> float:
    """ROC AUC x 100 of the model's cosine on the test pairs, evaluated as `raydistill eval` loads a model."""
    from raydistill.evaluation.metrics import score_pairs
    from raydistill.evaluation.sts import pair_similarities
    from raydistill.models import BiEncoder

    model = BiEncoder.from_pretrained(str(model_dir))
    similarities = pair_similarities(model, {"test": test})["test"]
    return round(float(score_pairs(similarities, [p.score for p in test])), 2)


def train_on_domain(name: str, files: dict, out: Path, *, seed: int, budget: str | None) -> dict:
    """distill's cut and training on the domain's corpus with its dev pairs; the job's result record."""
    from raydistill.ship.command import plan_distill, train_student

    overrides = [f"data.evaluation_set_split={SPLIT_OF[name]}"] if name in SPLIT_OF else []
    plan = plan_distill(teacher=TEACHER, student=STUDENT, corpus=files["corpus"], out=str(out),
                        dev_pairs=files["dev"], budget=budget, seed=seed, overrides=overrides)
    record = train_student(plan)
    return {"plan": plan, "record": record}


def run_domain(name: str, work: Path, *, seeds: list[int], budget: str | None, test_pairs: int,
               dev_pairs: int) -> dict:
    from raydistill.data.scored_pairs import read_eval_pairs

    split = write_domain_files(name, work, seed=0, test_pairs=test_pairs, dev_pairs=dev_pairs)
    test = read_eval_pairs(split["files"]["test"])
    runs = []
    teacher = start = None
    for seed in seeds:
        started = time.perf_counter()
        trained = train_on_domain(name, split["files"], work / name / f"student-s{seed}", seed=seed, budget=budget)
        plan, record = trained["plan"], trained["record"]
        if teacher is None:
            from raydistill.models import resolve_model

            teacher = test_auc(resolve_model(TEACHER), test)
            start = test_auc(plan.start_dir, test)
        student = test_auc(record["model_dir"], test)
        training = record.get("training") or {}
        runs.append({
            "seed": seed, "student": student,
            "recovered": round((student - start) / (teacher - start), 4) if teacher - start >= MIN_GAP else None,
            "method": plan.recipe.method, "recipe": plan.recipe.to_dict(), "budget": plan.budget,
            "sentences": training.get("sentences"), "steps": training.get("steps"),
            "planned_steps": sum(stage.get("total_steps") or 0 for stage in training.get("stages") or []),
            "best_step": training.get("best_step"), "selected_on": training.get("selected_on"),
            "dev_curve": training.get("dev_curve"),
            "train_seconds": round(sum(stage.get("seconds") or 0 for stage in training.get("stages") or []), 1),
            "teacher_pass_s": training.get("teacher_pass_s"),
            "seconds_this_run": round(time.perf_counter() - started, 1),
            "sts7": (record.get("scores") or {}).get("avg"), "model_dir": record.get("model_dir"),
            "precision": training.get("precision"),
        })
        print(f"domain {name} seed {seed}: start {start:.2f}  student {student:.2f}  teacher {teacher:.2f}  "
              f"recovered {runs[-1]['recovered']}", flush=True)
    recovered = [run["recovered"] for run in runs if run["recovered"] is not None]
    return {"split": split, "teacher": teacher, "start": start, "runs": runs,
            "cut_lost": round(teacher - start, 2),
            "student_mean": round(statistics.mean(run["student"] for run in runs), 2),
            "recovered_mean": round(statistics.mean(recovered), 4) if recovered else None,
            "recovered_spread": round(max(recovered) - min(recovered), 4) if len(recovered) > 1 else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--domains", type=comma_names(DOMAINS), default=list(DOMAINS),
                        help=f"comma-separated, of {', '.join(DOMAINS)}")
    parser.add_argument("--seeds", type=comma_ints, default=[1000], help="training seeds, comma-separated")
    parser.add_argument("--budget", default=None, help="distill's --budget (default: distill's own default)")
    parser.add_argument("--test-pairs", type=int, default=2000)
    parser.add_argument("--dev-pairs", type=int, default=2000)
    parser.add_argument("--work", default=str(Path.home() / ".cache" / "raydistill" / "bench-domain"))
    parser.add_argument("--write", help="result file (e.g. results/bench-domain.json)")
    args = parser.parse_args(argv)
    load_before = load_average()
    from raydistill.ship.recipe import DEFAULT_BUDGET

    results = {name: run_domain(name, Path(args.work), seeds=args.seeds, budget=args.budget, test_pairs=args.test_pairs,
                                dev_pairs=args.dev_pairs) for name in args.domains}
    record = {"teacher": TEACHER, "student": STUDENT, "budget": args.budget or DEFAULT_BUDGET,
              "target_recovered": 0.6, "domains": results}
    write_record(args.write, record, threads=2, load_before=load_before)
    for name, result in results.items():
        print(f"{name}: start {result['start']}  student {result['student_mean']}  teacher {result['teacher']}  "
              f"recovered {result['recovered_mean']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
