"""Regenerate the tables of README.md and docs/{results,trans-encoder,benchmarks,cluster}.md from committed files.

Every number in those pages comes from a file under results/ (or, for the config comparison, from the shipped job
configs); this script is the only writer of the regions between `<!-- table:NAME -->` and `<!-- /table:NAME -->`.
Run it after committing new results:

    python scripts/readme_tables.py            # rewrite the pages in place
    python scripts/readme_tables.py --check    # exit 1 if a page is stale (used by the tests)
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEEDS_FILE = ROOT / "results" / "bench-seeds.json"  # bench/seeds.py: the seed noise of each published recipe
CURVES_FILE = ROOT / "results" / "bench-curves.json"  # bench/curves.py: what more epochs buy each published recipe
sys.path.insert(0, str(ROOT))  # this checkout's package, installed or not

from raydistill.nested import flatten  # noqa: E402

STS7 = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr")


# Result files a rerun superseded (results/history/<why>/<their old path>): listed in docs/results.md's history,
# never on the front page or in the current tables. Their commands need the commit they record.
HISTORY_DIR = "history"


def load_results(results_dir: Path = ROOT / "results", history: bool = False) -> list[dict]:
    """Every result record under ``results_dir`` (``_file``: its path from there); ``history``: only those under
    results/history/, else every other one."""
    records = []
    for path in sorted(results_dir.rglob("*.json")):
        if path.name.startswith("bench-") or path.name.startswith("reliability"):
            continue
        if (path.relative_to(results_dir).parts[0] == HISTORY_DIR) != history:
            continue
        record = json.loads(path.read_text())
        if "kind" not in record or "scores" not in record:
            continue  # summaries and other non-result JSON beside the result files
        record["_file"] = str(path.relative_to(results_dir))
        records.append(record)
    return records


# The scale the front page reports: runs on the whole bundled `mixed` corpus (docs/data.md). Runs on the few-thousand
# caption samples of earlier configs stay listed as history in docs/results.md, never on the front page.
SCALE_CORPUS = "mixed"
SCALE_MIN_SENTENCES = 250_000


def at_scale(record: dict) -> bool:
    training = record.get("training") or {}
    return training.get("corpus") == SCALE_CORPUS and (training.get("sentences") or 0) >= SCALE_MIN_SENTENCES


# The whole ``mixed`` corpus before the punctuation-blind evaluation-text filter (269,672 sentences; 269,340 after,
# docs/data.md). A run on it that has no rerun yet is marked wherever it appears.
BEFORE_FILTER_SENTENCES = 269_672


def before_filter(record: dict) -> bool:
    training = record.get("training") or {}
    return training.get("corpus") == SCALE_CORPUS and training.get("sentences") == BEFORE_FILTER_SENTENCES


def _filter_mark(record: dict) -> str:
    """What a cell about ``record`` appends when the run predates the evaluation-text filter."""
    return " (before the filter)" if before_filter(record) else ""


def _file_cell(record: dict) -> str:
    """The result-file link of a table row, marked when the run predates the evaluation-text filter."""
    return f"[{record['_file']}](results/{record['_file']}){_filter_mark(record)}"


def scale_records(records: list[dict]) -> list[dict]:
    """The baselines and every run trained on the whole ``mixed`` corpus."""
    return [r for r in records if r["kind"] == "baseline" or at_scale(r)]


def history_records(records: list[dict]) -> list[dict]:
    """The baselines and every run trained on a smaller sample (the 6,000-caption runs)."""
    return [r for r in records if r["kind"] == "baseline" or not at_scale(r)]


def _score_row(record: dict) -> str:
    scores = record["scores"]
    cells = [f"{scores[name]:.2f}" for name in STS7] + [f"**{scores['avg']:.2f}**"]
    dev = scores.get("stsb_dev")
    return " | ".join(
        [
            f"`{record['model']}`",
            record.get("encoder", "bi"),
            f"{record['params_m']:.1f}",
            *cells,
            f"{dev:.2f}" if dev is not None else "–",
            f"[{record['_file']}](results/{record['_file']})",
        ]
    )


def baselines_table(records: list[dict]) -> str:
    rows = [r for r in records if r["kind"] == "baseline"]
    rows.sort(key=lambda r: -r["scores"]["avg"])
    header = "| model | enc | params (M) | " + " | ".join(STS7) + " | avg | STS-B dev | result file |"
    rule = "|" + "---|" * (len(STS7) + 6)
    return "\n".join([header, rule] + [f"| {_score_row(r)} |" for r in rows])


# The seed papers' 7-STS averages for the nearest model size (their setups: real pretrained small BERTs, ~1M NLI
# sentences, back-translated views); shown beside ours, never mixed into our numbers.
PAPER_REFERENCE = {
    ("congen", "bert-mini"): "ConGen BERT-Mini 78.09",
    ("congen", "minilm-l3"): "ConGen MiniLM-L3 78.22",
    ("sct-distill", "bert-mini"): "SCT-distill BERT-Mini 77.58",
    ("sct-distill", "minilm-l3"): "SCT-distill BERT-Mini 77.58",
    ("distilcse", "minilm-l3"): "DistilCSE 14M 82.84",
    ("distilcse", "bert-mini"): "DistilCSE 14M 82.84",
    ("dvbert", "minilm-l3"): "DvBERT base 74.63 (six sets)",
}


def _minutes(seconds) -> str:
    return f"{seconds / 60:.0f}" if isinstance(seconds, (int, float)) else "–"


DEFAULT_SEED = 1000  # the configs' seed; other seeds are marked in the method cell


def _seed_from_command(command: str) -> int | None:
    """The ``--set seed=N`` of a run recorded before result files carried ``training.seed``."""
    match = re.search(r"--set seed=(\d+)", command)
    return int(match.group(1)) if match else None


def _text_and_views(training: dict) -> str:
    """The training text and its augmented views (``none`` views, the sentence itself, left out)."""
    views = [v for v in (training.get("views") or {}).values() if v and v != "none"]
    first = [training.get("corpus") or "–"] + views
    # stages that bring their own labelled data (their ``rows``): DistilCSE's NLI triplets, DvBERT's NLI pairs
    # and STS-B train; DvBERT's first stage reads NLI pairs, not the corpus
    labelled = {"simcse-sup": "NLI triplets", "dvbert": "NLI pairs", "sts-cosine": "STS-B train"}
    stages = training.get("stages") or []
    if stages and stages[0].get("method") in labelled:
        first = []
    parts = [" · ".join(first)] if first else []
    parts += [f"{labelled[s['method']]} ({s.get('rows')})" for s in stages if s.get("method") in labelled]
    return " → ".join(parts)


def _projection_init(record: dict, baselines: dict[str, dict]) -> str | None:
    """A non-default ``student_projection_init`` of a run whose student got a projection head (it has more
    parameters than the student's baseline; a same-width teacher adds none), e.g. "least-squares"; else None."""
    projection_init = record.get("training", {}).get("student_projection_init") or "default"
    start = baselines.get(record["model"])
    has_head = start is None or record["params_m"] > start["params_m"] + 1e-3
    return projection_init.replace("_", "-") if projection_init != "default" and has_head else None


def _simcse_averages(records: list[dict]) -> dict[str, list[float]]:
    """Student -> the 7-STS averages of its unsupervised SimCSE runs (one per seed)."""
    averages: dict[str, list[float]] = {}
    for r in records:
        if r["kind"] == "distill" and r.get("method") == "simcse":
            averages.setdefault(r["model"], []).append(r["scores"]["avg"])
    return averages


def distill_table(records: list[dict]) -> str:
    teachers = {r["model"]: r for r in records if r["kind"] == "baseline"}
    rows = [r for r in records if r["kind"] == "distill"]
    rows.sort(key=lambda r: (r.get("teacher") or "", r["model"], -r["scores"]["avg"]))
    # the unsupervised SimCSE baseline of each student (same text and schedule): every distilled student must beat it
    simcse = {model: max(scores) for model, scores in _simcse_averages(records).items()}
    header = ("| method | student | teacher | text · views | lr | params (M) | " + " | ".join(STS7)
              + " | avg | before | % of teacher | vs SimCSE | minutes | seed paper | result file |")
    rule = "|" + "---|" * (len(STS7) + 13)
    lines = [header, rule]
    for r in rows:
        scores = r["scores"]
        teacher = teachers.get(r.get("teacher") or "")
        retention = f"{100 * scores['avg'] / teacher['scores']['avg']:.1f}" if teacher else "–"
        start = teachers.get(r["model"])  # the student's own baseline: the derived checkpoint before training
        before = f"{start['scores']['avg']:.2f}" if start else "–"
        cells = [f"{scores[name]:.2f}" for name in STS7] + [f"**{scores['avg']:.2f}**"]
        baseline = simcse.get(r["model"])
        vs_simcse = "–" if baseline is None or r.get("method") == "simcse" else f"{scores['avg'] - baseline:+.2f}"
        method = r.get("method", "?")
        head = _projection_init(r, teachers)
        if head:
            method += f" ({head} projection init)"
        if r.get("training", {}).get("precision", "fp32") != "fp32":
            method += f" ({r['training']['precision']})"
        seed = r.get("training", {}).get("seed") or _seed_from_command(r.get("command", ""))
        if seed not in (None, DEFAULT_SEED):
            method += f" (seed {seed})"
        lines.append("| " + " | ".join([
            method, f"`{r['model']}`", f"`{r.get('teacher') or '–'}`", _text_and_views(r.get("training", {})),
            f"{r.get('training', {}).get('lr', '–'):g}" if "lr" in r.get("training", {}) else "–",
            f"{r['params_m']:.1f}", *cells, before,
            retention, vs_simcse, _minutes(r.get("wall_s")), PAPER_REFERENCE.get((r.get("method"), r["model"]), "–"),
            _file_cell(r)]) + " |")
    return "\n".join(lines)


# Retention targets: the best distilled student of each size as a share of its teacher's 7-STS average (the seed
# papers' own retention: ConGen 99.1 % at 17M, 99.0 % at 11M; SCT 97.5 % at 4M).
RETENTION_TARGETS = {"minilm-l3": 99.5, "bert-mini": 99.0, "bert-tiny": 97.5}


# Methods that are baselines to beat, not raydistill's students: never "the best distilled" of a size.
BASELINE_METHODS = {"st-mse"}
# Stages trained on gold STS similarity labels (DvBERT's STS-B-train stage): a student that learned the task from its
# labels is not a distilled one, so it is listed with every run but never ranked as the best distilled student.
STS_LABEL_STAGES = {"sts-cosine"}


def _dev(scores: dict) -> float:
    """What every "best" run is chosen by: STS-B dev, never a test set's score (no dev score: never chosen)."""
    value = scores.get("stsb_dev")
    return float("-inf") if value is None else value


def _raydistill_students(records: list[dict]) -> list[dict]:
    return [r for r in records if r["kind"] in ("distill", "tune") and r.get("method") not in BASELINE_METHODS
            and not any(stage.get("method") in STS_LABEL_STAGES for stage in r.get("training", {}).get("stages") or [])]


def targets_table(records: list[dict]) -> str:
    """Per student and bi-encoder teacher: the best distillation run against the retention target and SimCSE."""
    teachers = {r["model"]: r for r in records if r["kind"] == "baseline"}
    distilled = [r for r in _raydistill_students(records) if r.get("teacher") in teachers
                 and r["model"] in RETENTION_TARGETS]
    simcse = _simcse_averages(records)
    best: dict[tuple[str, str], dict] = {}
    for r in distilled:
        key = (r["model"], r["teacher"])
        if key not in best or _dev(r["scores"]) > _dev(best[key]["scores"]):
            best[key] = r
    order = list(RETENTION_TARGETS)
    lines = ["| student | params (M) | before | teacher (7-STS) | best distilled | avg | % of teacher | target "
             "| SimCSE | vs SimCSE | result file |", "|" + "---|" * 11]
    for (student, teacher), r in sorted(best.items(), key=lambda kv: (order.index(kv[0][0]), kv[0][1])):
        teacher_avg = teachers[teacher]["scores"]["avg"]
        retention = 100 * r["scores"]["avg"] / teacher_avg
        target = RETENTION_TARGETS[student]
        start = teachers.get(student)
        seeds = simcse.get(student, [])
        head = _projection_init(r, teachers)
        method = r.get("method", "?") + (" (tuned)" if r["kind"] == "tune" else "") + (f", {head} head" if head else "")
        lines.append("| " + " | ".join([
            f"`{student}`", f"{r['params_m']:.1f}", f"{start['scores']['avg']:.2f}" if start else "–",
            f"`{teacher}` ({teacher_avg:.2f})", method, f"**{r['scores']['avg']:.2f}**", f"{retention:.1f}",
            f"≥ {target:g} ({'met' if retention >= target else 'missed'})",
            " / ".join(f"{v:.2f}" for v in sorted(seeds)) or "–",
            f"{r['scores']['avg'] - max(seeds):+.2f}" if seeds else "–",
            f"[{r['_file']}](results/{r['_file']})"]) + " |")
    return "\n".join(lines)


SEARCHED = ("train.lr", "loss.queue_size", "loss.tau_teacher", "loss.tau_student")  # the lr | K | τ_T | τ_S columns


def _searched_values(params: dict) -> list[str]:
    return [f"{params[key]:g}" if key in params else "–" for key in SEARCHED]


def tune_table(records: list[dict]) -> str:
    """The committed sweeps: the untuned default (start_from) trial and the tuned best, with their searched values."""
    rows = [r for r in records if r["kind"] == "tune"]
    rows.sort(key=lambda r: (r.get("training", {}).get("sweep", ""), "tuned" in r["_file"]))
    lines = ["| sweep | trial | lr | K | τ_T | τ_S | trials | best STS-B dev | " + " | ".join(STS7)
             + " | avg | result file |", "|" + "---|" * (len(STS7) + 10)]
    for r in rows:
        training = r.get("training", {})
        params = training.get("params", {})
        which = "tuned (best dev)" if "tuned" in r["_file"] else "default (start_from)"
        cells = [f"{r['scores'][name]:.2f}" for name in STS7] + [f"**{r['scores']['avg']:.2f}**"]
        lines.append("| " + " | ".join([
            training.get("sweep", "?"), which,
            *_searched_values(params), str(training.get("trials", "–")),
            f"{training.get('best_stsb_dev', float('nan')):.2f}", *cells,
            f"[{r['_file']}](results/{r['_file']})"]) + " |")
    return "\n".join(lines)


def tune_trials_table(records: list[dict], results_dir: Path = ROOT / "results") -> str:
    """Every trial of each committed sweep (results/tune/<sweep>-summary.json, the sweep's summary.json): the values
    tried, how ASHA ended it, and its best STS-B dev — the evidence for "the default is (not) at the optimum"."""
    lines = ["| sweep | trial | lr | K | τ_T | τ_S | status | steps | best STS-B dev |", "|" + "---|" * 9]
    for path in sorted((results_dir / "tune").glob("*-summary.json")):
        summary = json.loads(path.read_text())
        for row in summary["trials"]:
            params = row["params"]
            dev = row.get("best_stsb_dev")
            trial = row["trial_id"] + (" (start_from)" if row.get("start_point") else "")
            lines.append("| " + " | ".join([
                f"[{summary['sweep']}](results/tune/{path.name})", trial,
                *_searched_values(params),
                row["status"].replace("_", " "), f"{row.get('last_step') or 0}/{row.get('total_steps') or '?'}",
                f"{dev:.2f}" if dev is not None else "–"]) + " |")
    return "\n".join(lines)


def cross_head(record: dict) -> str:
    """The cross-encoder head a Trans-Encoder run trained (runs from before ``cross.head`` existed: classifier)."""
    return (record.get("training", {}).get("cross") or {}).get("head") or "classifier"


def tenc_table(records: list[dict]) -> str:
    """One block per Trans-Encoder run: each family's bi/cross encoder at start (cycle 0) and at its best-dev cycle,
    and the ensembles of the families. Runs with the configs' current cross head (segment_cosine) first."""
    rows = [r for r in records if r["kind"] == "mutual_tenc" and "pair_auc" not in r.get("extra", {})]
    rows.sort(key=lambda r: (cross_head(r) != "segment_cosine", r.get("extra", {}).get("run_name", ""),
                             r.get("extra", {}).get("family") == "ensemble",
                             r.get("extra", {}).get("family", ""), r.get("encoder", "bi"),
                             r.get("training", {}).get("cycle") or 0))
    header = ("| run | mode | cross head | pairs | family | enc | cycle | " + " | ".join(STS7)
              + " | avg | STS-B dev | result file |")
    rule = "|" + "---|" * (len(STS7) + 10)
    lines = [header, rule]
    for r in rows:
        extra, training, scores = r.get("extra", {}), r.get("training", {}), r["scores"]
        cycle = training.get("cycle")
        dev = scores.get("stsb_dev")
        lines.append("| " + " | ".join([
            extra.get("run_name", "–"), training.get("mode", "–"), cross_head(r),
            f"{training.get('pairs', '–')} {'transd.' if training.get('transductive') else 'induct.'}",
            extra.get("family", "–"), r.get("encoder", "bi"), "best" if cycle is None else str(cycle),
            *[f"{scores[name]:.2f}" for name in STS7], f"**{scores['avg']:.2f}**",
            f"{dev:.2f}" if dev is not None else "–", f"[{r['_file']}](results/{r['_file']})"]) + " |")
    return "\n".join(lines)


def tenc_pair_auc_table(records: list[dict]) -> str:
    """Trans-Encoder runs on pair-classification sets (QQP, MRPC): each model's ROC AUC x 100 on the run's own pairs
    (transductive) or on held-out pairs of the other half of a split (inductive), beside its 7-STS average and STS-B
    dev, which picks the best models."""
    rows = [r for r in records if r["kind"] == "mutual_tenc" and "pair_auc" in r.get("extra", {})]
    rows.sort(key=lambda r: (r["extra"].get("run_name", ""), r["extra"].get("family") == "ensemble",
                             r["extra"].get("family", ""), r.get("encoder", "bi"),
                             r.get("training", {}).get("cycle") or 0))
    lines = ["| run | set | pairs | family | enc | cycle | ROC AUC | 7-STS avg | STS-B dev | result file |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        extra, training, scores = r["extra"], r.get("training", {}), r["scores"]
        cycle = training.get("cycle")
        lines.append("| " + " | ".join([
            extra.get("run_name", "–"), extra["pair_auc"].get("source", "–"),
            f"{extra['pair_auc'].get('pairs', '–')} {'held-out' if extra['pair_auc'].get('held_out') else 'transd.'}",
            extra.get("family", "–"), r.get("encoder", "bi"), "best" if not isinstance(cycle, int) else str(cycle),
            f"**{extra['pair_auc']['auc']:.2f}**", f"{scores['avg']:.2f}",
            f"{scores['stsb_dev']:.2f}" if scores.get("stsb_dev") is not None else "–",
            f"[{r['_file']}](results/{r['_file']})"]) + " |")
    return "\n".join(lines)


def _families_label(families: dict) -> str:
    """A run's families as its result files record them: ``bert-tiny (bi lr 0.0005, epochs 3) + bert-small``."""
    parts = []
    for name, family in families.items():
        own = [f"{kind} " + ", ".join(f"{k} {v}" for k, v in family[f"{kind}_stage"].items())
               for kind in ("bi", "cross") if family.get(f"{kind}_stage")]
        parts.append(name + (f" ({'; '.join(own)})" if own else ""))
    return " + ".join(parts)


def _pairs_label(training: dict) -> str:
    """``6000 transductive (trained on the unlabeled test pairs)`` or ``6000 inductive (no evaluation sentence)``:
    how many pairs, and whether the models trained on the unlabeled pairs they are then scored on."""
    source = training.get("pairs_source") or "transductive"
    what = {"transductive": "transductive (trained on the unlabeled test pairs)",
            "inductive": "inductive (no evaluation sentence)"}.get(source, source)
    return f"{training.get('pairs', '?')} {what}"


def _keep_best_by_dev(slots: dict[tuple[str, str], dict], record: dict) -> None:
    """Put a Trans-Encoder record in its ``(family, start|bi|cross)`` slots where its STS-B dev beats the record held:
    cycle 0 is the start and a bi-encoder candidate, later cycles their encoder's. Fed in cycle order, a tie keeps
    the earlier cycle (the job's selection)."""
    family, cycle = record["extra"]["family"], (record.get("training") or {}).get("cycle") or 0
    for slot in ([(family, "start"), (family, "bi")] if cycle == 0 else [(family, record.get("encoder", "bi"))]):
        best = slots.get(slot)
        if best is None or record["scores"].get("stsb_dev", -1e9) > best["scores"].get("stsb_dev", -1e9):
            slots[slot] = record


def tenc_compare_table(records: list[dict]) -> str:
    """Self vs mutual, per family, on the STS pair sets: the 7-STS average of the starting bi-encoder and of each
    run's best-dev bi- and cross-encoder, with the cycle it came from. A self run and a mutual run are twins when
    they share pairs, cross-encoder head and families (with the families' own stage settings). Selection is the
    job's: STS-B dev over cycles 0..N for the bi-encoder (0 = the start, kept when no trained cycle beats it), 1..N
    for the cross-encoder; ties go to the earlier cycle. Twins also ran the same number of cycles. Runs on other pair
    sets (QQP, MRPC) are left out: their scores are AUCs."""
    from raydistill.runtime.tenc.pairs import PAIR_CLASSIFICATION_SOURCES

    # (pairs, cross head, families, cycles) -> mode -> (family, enc|start) -> record
    runs: dict[tuple[str, str, str, int], dict[str, dict[tuple[str, str], dict]]] = {}
    in_run_order: dict[str, dict] = {}  # the families of a group as its first record lists them
    tenc = [r for r in records if r["kind"] == "mutual_tenc" and r.get("extra", {}).get("family") != "ensemble"
            and r.get("training", {}).get("pairs_source") not in PAIR_CLASSIFICATION_SOURCES]
    for r in sorted(tenc, key=lambda r: r.get("training", {}).get("cycle") or 0):  # ties: the earlier cycle
        training = r.get("training", {})
        key = (_pairs_label(training), cross_head(r), json.dumps(training.get("families"), sort_keys=True),
               int(training.get("cycles") or 0))
        in_run_order.setdefault(key[2], training.get("families") or {})
        _keep_best_by_dev(runs.setdefault(key, {}).setdefault(training.get("mode", "?"), {}), r)
    lines = ["| cross head | run families | family | pairs | cycles | start bi | self: best bi (cycle) | "
             "mutual: best bi (cycle) | self: best cross (cycle) | mutual: best cross (cycle) |",
             "|---|---|---|---|---|---|---|---|---|---|"]

    def cell(record: dict | None) -> str:
        if record is None:
            return "–"
        return f"{record['scores']['avg']:.2f} ({record['training'].get('cycle')})"

    order = sorted(runs, key=lambda key: (key[1] != "segment_cosine", key[1], key[0].split()[1:],
                                          int(key[0].split()[0]) if key[0].split()[0].isdigit() else 0, key[2],
                                          key[3]))
    for pairs, head, families_json, cycles in order:
        own = {mode: runs[(pairs, head, families_json, cycles)].get(mode, {}) for mode in ("self", "mutual")}
        run_families = in_run_order[families_json]
        for family in run_families:
            start = own["self"].get((family, "start")) or own["mutual"].get((family, "start"))
            if start is None:
                continue
            lines.append(f"| {head} | {_families_label(run_families)} | {family} | {pairs} | {cycles} | "
                         f"{start['scores']['avg']:.2f} | "
                         + " | ".join(cell(own[mode].get((family, enc))) for enc in ("bi", "cross")
                                      for mode in ("self", "mutual")) + " |")
    return "\n".join(lines)


# The benchmark figures (bench/*.py, docs/benchmarks.md): key, the file that measures it, what it is, the target.
BENCH_FIGURES = (
    ("limit_gflops", "bench-limit.json", "fp32 matmul rate torch reaches here (GFLOP/s, jobs' thread count)", "–"),
    ("train_step_vs_st", "bench-train_step.json",
     "ConGen training step (bf16), student sentences/s ÷ sentence-transformers' MSE distillation at its faster "
     "precision (fp32 or bf16)", "≥ 1.3"),
    ("train_step_bf16_limit_fraction", "bench-train_step.json",
     "the same step's sentences/s ÷ the limit of the precision it runs in: encoder fwd + bwd FLOPs at the real token "
     "count against the bf16 matmul peak measured in the run", "≥ 0.277 (must not fall)"),
    ("train_step_limit_fraction", "bench-train_step.json",
     "the same rate ÷ the fp32 matmul limit (bench/limit.py): above 1 because the step runs in bf16", "–"),
    ("cpu_speedups_speedup", "bench-train_step.json",
     "the same step without the CPU learner's model changes (torch dropout, a new dense embedding gradient) ÷ with",
     "–"),
    ("bucketing_speedup", "bench-train_step.json",
     "the same step without length-bucketed sub-batches (one padded forward) ÷ with", "–"),
    ("bf16_target_kl_mean", "bench-precision.json",
     "KL(P_T fp32 ‖ P_T from bf16 products) per row, nats, τ_T 0.05, mpnet-base caption vectors (P_T's entropy: 3.7)",
     "–"),
    ("queue_actor_share", "bench-queue_actor.json",
     "ConGen step (batch 128, K = 65536) time in shared-queue-actor traffic ÷ step time", "–"),
    ("shared_vs_local_step", "bench-queue_actor.json",
     "the same step through the shared queue actor ÷ with a learner-local queue", "–"),
    ("inference_vs_minilm_l6", "bench-inference.json",
     "encode sentences/s, minilm-l3 (raydistill, length-sorted) ÷ minilm-l6 encoded the plain way", "≥ 2.5"),
    ("inference_vs_mpnet", "bench-inference.json",
     "encode sentences/s, minilm-l3 (raydistill, length-sorted) ÷ mpnet-base encoded the plain way", "≥ 12"),
    ("inference_int8_vs_fp32", "bench-inference.json",
     "encode sentences/s, minilm-l3 int8 dynamic export ÷ fp32 (7-STS within 0.3: see the file)", "–"),
    ("teacher_vs_st", "bench-teacher_pass.json",
     "mpnet-base teacher pass into an empty cache (one teacher in-process, model load included, bf16 where the CPU "
     "has it) sentences/s ÷ sentence-transformers' encode (fp32 defaults), same 4,096 mixed sentences", "≥ 3"),
    ("teacher_vs_st_bf16", "bench-teacher_pass.json",
     "the same pass ÷ sentence-transformers' encode with the model cast to bf16", "≥ 1.15"),
    ("teacher_bf16_limit_fraction", "bench-teacher_pass.json",
     "the pass's FLOP rate (real tokens) ÷ the bf16 matmul limit measured in the same run", "≥ 0.6"),
    ("bf16_cosine_mean", "bench-teacher_pass.json", "mean cosine of bf16 against fp32 teacher vectors", "≥ 0.999"),
    ("pool_vs_st_bf16", "bench-teacher_pass.json",
     "the teacher pass through the jobs' Ray Data pool (Ray worker start-up included) ÷ sentence-transformers' bf16 "
     "encode", "–"),
    ("sweep_teacher_passes_per_view", "bench-sweep.json",
     "teacher forward sentences of an 8-trial Tune sweep ÷ (corpus × teacher views)", "= 1"),
    ("sweep_vs_cache_bound", "bench-sweep.json",
     "sweep wall time ÷ (teacher pass once + 8 × student-only run)", "≤ 1"),
    ("mutual_parallel_efficiency", "bench-mutual.json",
     "Trans-Encoder cycle, one family's wall time ÷ two families' (one core each)", "–"),
    ("exchange_share", "bench-mutual.json", "label exchange share of a two-family Trans-Encoder cycle", "–"),
    ("queue_ms_per_1k", "bench-scaling.json",
     "ConGen step (minilm-l3, batch 128) cost of 1024 more queue entries, ms (linear fit over K = 1k … 131k)", "–"),
    ("step_s_without_queue", "bench-scaling.json", "the same step's intercept at K = 0, s", "–"),
    ("peak_rss_mb", "bench-scaling.json", "peak resident memory of a ConGen learner step loop (batch 64, K = 65536), MB",
     "–"),
    ("loss_queue_share", "bench-objectives.json", "ConGen loss + queue share of a step (K = 65536)", "≤ 0.10"),
    ("rss_300k_over_30k", "bench-memory.json",
     "peak RSS of a ConGen job's process tree (driver + Ray + workers), 300k training rows ÷ 30k", "≤ 1.3"),
    ("main_job_wall_ratio", "bench-engine_parity.json",
     "the main job, 2 cycles: wall time with its stages on the one engine ÷ on their former loop, same machine, "
     "one after the other", "≤ 1.10"),
    ("main_job_max_abs_delta", "bench-engine_parity.json",
     "the same two runs: the largest difference (engine − former loop, either sign) of a family's best bi- or "
     "cross-encoder 7-STS", "≤ 0.3"),
    ("main_job_new_seed_spread_max", "bench-engine_parity.json",
     "the main job at 2 cycles on the engine, job seeds 1000 and 1001: the largest difference a seed makes to a "
     "family's best bi- or cross-encoder 7-STS (what seed noise is here)", "–"),
    ("main_job_old_seed_spread_max", "bench-engine_parity.json",
     "the same on the former loop", "–"),
    ("main_job_mean_abs_delta", "bench-engine_parity.json",
     "the largest difference (engine − former loop) of a family's best model, each the mean over the two seeds",
     "≤ 0.3"),
    ("distill_abs_delta", "bench-engine_parity.json",
     "ConGen minilm-l3 ← mpnet-base on 20,000 mixed sentences: the difference (engine − the loop before it, either "
     "sign) of the 7-STS average",
     "≤ 0.3"),
    ("distill_abs_delta", "bench-engine_parity-fp32.json",
     "the same ConGen run in fp32 on a CPU without AVX512-BF16: this tree against the checkout before the method "
     "hooks (92e73f6), one after the other", "≤ 0.05"),
    ("train_step_vs_st", "bench-train_step-avx2-before.json",
     "ConGen training step in fp32 on a CPU without AVX512-BF16, student sentences/s ÷ sentence-transformers' MSE "
     "distillation: the checkout before the method hooks", "≥ 1.3"),
    ("train_step_vs_st", "bench-train_step-avx2.json",
     "the same step from this tree, run right after", "≥ 1.3, not below the row above"),
    ("rss_300k_over_30k", "bench-memory-avx2.json",
     "the memory ratio above, rerun on a CPU without AVX512-BF16 from this tree", "≤ 1.3"),
    ("sweep_teacher_passes_per_view", "bench-sweep-avx2.json",
     "the sweep's teacher passes above, rerun on a CPU without AVX512-BF16 from this tree", "= 1"),
    ("sweep_vs_cache_bound", "bench-sweep-avx2.json",
     "the sweep's wall-time bound above, rerun on a CPU without AVX512-BF16 from this tree", "≤ 1"),
)


def load_bench(results_dir: Path = ROOT / "results") -> dict[str, dict]:
    return {path.name: json.loads(path.read_text()) for path in sorted(results_dir.glob("bench-*.json"))}


def bench_table(records: list[dict], bench: dict[str, dict] | None = None) -> str:
    """One row per benchmark figure whose file exists: value, target, the load it was measured under, command."""
    bench = load_bench() if bench is None else bench
    lines = ["| figure | value | target | what | load (1 min) | command |", "|---|---|---|---|---|---|"]
    for key, name, what, target in BENCH_FIGURES:
        record = bench.get(name)
        if not record or not isinstance(record.get(key), (int, float)):
            continue
        load = record.get("load_before")
        lines.append(f"| `{key}` | **{record[key]:g}** | {target} | {what} | "
                     f"{load if load is not None else '–'} | [`{record.get('command', '?')}`](results/{name}) |")
    return "\n".join(lines)


def _encode_rates(results_dir: Path = ROOT / "results") -> dict[str, float]:
    """Preset -> encode sentences/s from bench/inference.py, every model encoded the same way (length-sorted)."""
    path = results_dir / "bench-inference.json"
    if not path.is_file():
        return {}
    record = json.loads(path.read_text())
    return {m["name"]: m["sentences_per_s"]["sorted"] for m in record.get("models", [])
            if m.get("kind") == "preset" and m.get("sentences_per_s", {}).get("sorted")}


FRONT_PAGE_SIZES = ("minilm-l3", "bert-mini", "bert-tiny")


def _speed_model_cell(row: dict) -> str:
    spec = row.get("speed_model") or {}
    if spec.get("static") or spec.get("preset") == row.get("name"):
        return "itself"
    if spec.get("static_student"):  # the teacher's token table, its head folded in as the trained student saves
        return f"`{spec['static_student']}` from the teacher, Linear(→{spec['projection_dim']}) folded in (same shape)"
    head = f" + Linear(→{spec['projection_dim']})" if spec.get("projection_dim") else ""
    return f"`{spec.get('preset')}`{head}, max_length {spec.get('max_length')} (same shape)"


def result_file_changed_since(row: dict) -> bool:
    """Whether a bench row's 7-STS came from a result file that a rerun has replaced (or moved) since: the file
    holds another run's git sha than the row recorded, or is gone."""
    source = row.get("sts7_source") or ""
    if not source.startswith("results/") or not row.get("result_git_sha"):
        return False
    path = ROOT / source
    return not path.is_file() or json.loads(path.read_text()).get("git_sha") != row["result_git_sha"]


def compare_public_table(records: list[dict], record: dict | None = None) -> str:
    """raydistill's best students beside the teacher, all-MiniLM-L6-v2, sentence-transformers' MSE recipe and
    Model2Vec (results/bench-compare_public.json, bench/compare_public.py): 7-STS, where it comes from, sentences/s
    measured side by side in one run; then where each alternative stands against raydistill's student of its size,
    or the one nearest to it in speed."""
    if record is None:
        path = ROOT / "results" / "bench-compare_public.json"
        if not path.is_file():
            return "No comparison yet: run `python bench/compare_public.py --write results/bench-compare_public.json`."
        record = json.loads(path.read_text())
    rows = record["models"]
    for r in rows:  # a student whose file a rerun replaced since: its row keeps what was measured, and says so
        if result_file_changed_since(r):
            r["corpus_note"] = ("7-STS of the run this file held when measured; the file changed since (rerun, or "
                                "moved to results/history/before-filter/ with its rebuilt start: docs/results.md's "
                                "history)")
    notes = list(dict.fromkeys(r["corpus_note"] for r in rows if r.get("corpus_note")))
    lines = ["| model | params (M) | 7-STS | 7-STS from | sentences / CPU s | × teacher's | sentences / s (wall) "
             "| 7-STS − teacher | speed measured on |", "|" + "---|" * 9]
    for r in rows:
        mark = " " + "†" * (notes.index(r["corpus_note"]) + 1) if r.get("corpus_note") else ""
        source = r["sts7_source"]
        source = f"[{Path(source).name}]({source})" if source.startswith("results/") else source
        lines.append("| " + " | ".join([
            r["label"], f"{r['params_m']:.1f}", f"**{r['sts7_avg']:.2f}**{mark}", source,
            f"{r['sentences_per_s']['cpu']:,.1f}", f"{r['vs_teacher']['speed_cpu']:g} ×",
            f"{r['sentences_per_s']['wall']:,.1f}", f"{r['vs_teacher']['sts7']:+.2f}",
            _speed_model_cell(r)]) + " |")
    lines.append("")
    lines += [f"{'†' * (i + 1)} {note}." for i, note in enumerate(notes)]
    if record.get("command"):
        lines.append(f"Measured by [`{record['command']}`](results/bench-compare_public.json) "
                     f"({record.get('date', '?')[:10]}, {record['machine']['cpu']}, {record['threads']} threads, "
                     f"batch {record['batch']}, {record['sentences']} STS sentences, load {record['load_before']} "
                     f"→ {record['load_after']}).")
    lines.append("")
    ours = [r for r in rows if r["family"] == "raydistill"]
    for r in rows:
        if r["family"] == "raydistill" or not ours:
            continue
        size = (r.get("speed_model") or {}).get("preset")
        same_size = [o for o in ours if (o.get("speed_model") or {}).get("preset") == size]
        peer = same_size[0] if same_size else min(ours, key=lambda o: abs(
            math.log(o["sentences_per_s"]["cpu"] / r["sentences_per_s"]["cpu"])))
        speed = r["sentences_per_s"]["cpu"] / peer["sentences_per_s"]["cpu"]
        points = r["sts7_avg"] - peer["sts7_avg"]
        faster = speed if speed >= 1 else 1 / speed
        times = f"{faster:.0f}" if faster >= 10 else f"{faster:.1f}"
        # within 5 %: the rounds' spread, not a difference
        pace = (f"about as fast as {peer['label']}" if faster < 1.05 else
                f"{times} × {'faster' if speed >= 1 else 'slower'} than {peer['label']}")
        lines.append(f"- {r['label']}: {pace} (per CPU second), {abs(points):.2f} points "
                     f"{'lower' if points < 0 else 'higher'} ({r['sts7_avg']:.2f} against {peer['sts7_avg']:.2f})")
    m2v = record.get("model2vec") or {}
    if m2v.get("distill_s") is not None:
        lines.append(f"\nModel2Vec's distillation in this run: {m2v['distill_s']:,.0f} s "
                     f"({m2v['distill_cpu_s']:,.0f} CPU s), {m2v['vocabulary']:,} vocabulary tokens "
                     f"through the teacher, {m2v['dim']} dimensions, environment {m2v['environment']}.")
    return "\n".join(lines).rstrip()


def seed_spreads(path: Path = SEEDS_FILE) -> dict[str, dict]:
    """Per student size, the 7-STS seed spread bench/seeds.py measured (``{"spread", "std", "n", ...}``); empty when
    the file is absent. It is measured at a smaller scale than the published runs, and every cell that uses it says
    so."""
    if not path.is_file():
        return {}
    return {size: entry["sts7"] for size, entry in json.loads(path.read_text())["sizes"].items()}


def _spread_cell(spreads: dict[str, dict], student: str) -> str:
    spread = spreads.get(student)
    return f"±{spread['spread'] / 2:.2f} (n={spread['n']})" if spread else "not measured"


def margin_verdict(value: float, bar: float, spread: float | None) -> str:
    """``+0.13 (met)``, ``-0.92 (missed)``, or ``+0.13 (within noise)`` when the margin is no larger than the
    measured seed spread (max - min over seeds) of that student."""
    margin = value - bar
    if spread is not None and abs(margin) <= spread:
        return f"{margin:+.2f} (within noise)"
    return f"{margin:+.2f} ({'met' if margin >= 0 else 'missed'})"


def domain_table(records: list[dict] | None = None, results_dir: Path = ROOT / "results") -> str:
    """bench/domain.py's runs (results/bench-domain*.json): per domain, the start (the cut), the student and the
    teacher on the held-out test pairs, and the share of what the cut lost that the student won back, against the
    60 % target, with the training it took and the machine."""
    files = sorted(results_dir.glob("bench-domain*.json"))
    if not files:
        return "Not run yet: `python bench/domain.py --write results/bench-domain.json`."
    lines = ["| domain | corpus / dev / test | start (cut) | student | teacher | recovered | target | training "
             "| machine | result file |", "|" + "---|" * 10]
    for path in files:
        record = json.loads(path.read_text())
        target = record.get("target_recovered", 0.6)
        for name, domain in record["domains"].items():
            split, runs = domain["split"], domain["runs"]
            recovered, spread = domain["recovered_mean"], domain.get("recovered_spread")
            gap = domain["teacher"] - domain["start"]
            if gap < 1.0:  # bench/domain.py MIN_GAP: a share of a loss this small says nothing
                recovered = None
            seeds = f", {len(runs)} seeds, spread {100 * spread:.0f} pts" if spread is not None else ", 1 seed"
            verdict = (f"none to recover: the teacher is {gap:+.2f} over the cut" if recovered is None else
                       f"≥ {100 * target:.0f} %: {'met' if recovered >= target else 'missed'}")
            run = runs[0]
            curve = run.get("dev_curve") or []
            stopped = " (stopped early)" if run["steps"] < run["planned_steps"] else ""
            training = (f"{run['method']}, {run.get('precision') or 'fp32'}, budget {run['budget']}: "
                        f"{run['steps']} of {run['planned_steps']} steps{stopped}, best at {run['best_step']}, "
                        f"{len(curve)} dev evaluations, {run['train_seconds'] / 60:.0f} min")
            lines.append("| " + " | ".join([
                f"{name} ({', '.join(split['source'])})",
                f"{split['corpus_sentences']:,} sentences / {split['dev_pairs']:,} / {split['test_pairs']:,} pairs",
                f"{domain['start']:.2f}", f"**{domain['student_mean']:.2f}**", f"{domain['teacher']:.2f}",
                f"**{100 * recovered:.0f} %**{seeds}" if recovered is not None else "–", verdict, training,
                _cpu_cell(record), f"[{path.name}](results/{path.name})"]) + " |")
    return "\n".join(lines)


def _cpu_cell(record: dict) -> str:
    machine = record.get("machine") or {}
    bf16 = {True: ", bf16 units", False: ", no bf16 units"}.get(machine.get("bf16_native"), "")
    load = (f", load {record['load_before']:g} → {record['load_after']:g}"
            if record.get("load_before") is not None and record.get("load_after") is not None else "")
    return (f"{machine.get('cpu', '?')}{bf16}, {machine.get('threads', '?')} threads{load}, "
            f"{record.get('date', '?')[:10]}")


def seeds_table(records: list[dict] | None = None, path: Path = SEEDS_FILE) -> str:
    """bench/seeds.py's run: per size, each seed's 7-STS and STS-B dev, their mean and spread, beside the published
    run of that recipe on the whole corpus."""
    if not path.is_file():
        return "Not run yet: `python bench/seeds.py --write results/bench-seeds.json`."
    record = json.loads(path.read_text())
    lines = ["| student (recipe) | 7-STS per seed | mean | spread (max − min) | STS-B dev per seed | dev spread "
             "| published run, whole corpus: 7-STS / dev |", "|" + "---|" * 7]
    for size, entry in record["sizes"].items():
        runs, published = entry["runs"], entry["published"]
        lines.append("| " + " | ".join([
            f"`{size}` ({runs[0]['method']}, {runs[0]['epochs']} epoch{'s' if runs[0]['epochs'] != 1 else ''})",
            " / ".join(f"{run['sts7']:.2f}" for run in runs), f"{entry['sts7']['mean']:.2f}",
            f"**{entry['sts7']['spread']:.2f}**", " / ".join(f"{run['stsb_dev']:.2f}" for run in runs),
            f"{entry['stsb_dev']['spread']:.2f}",
            f"{published['sts7']:.2f} / {published['stsb_dev']:.2f} ([file](results/{published['file']}))"]) + " |")
    lines.append(f"\n{record['corpus']}; precision {record['precision']}; seeds {', '.join(map(str, record['seeds']))}"
                 f"; {_cpu_cell(record)}.")
    return "\n".join(lines)


def curves_table(records: list[dict] | None = None, path: Path = CURVES_FILE) -> str:
    """bench/curves.py's runs: per size, how far it has trained, its best-dev point and its last point, beside the
    published run of the same recipe (fewer epochs, its own LR schedule)."""
    if not path.is_file():
        return "Not run yet: `python bench/curves.py train --size bert-tiny --epochs 10`, then `score`."
    record = json.loads(path.read_text())
    published = {row["student"]: row for row in _published_label_free(records or [])}
    lines = ["| student (recipe) | trained: epochs of planned (CPU-hours) | best STS-B dev: epoch, dev / 7-STS | "
             "last point: epoch, dev / 7-STS | epochs since the best dev | published run: epochs, dev / 7-STS |",
             "|" + "---|" * 6]
    for size, curve in record["curves"].items():
        points = curve["points"]
        if not points:
            continue
        best, last = curve["best_dev"], points[-1]
        row = published.get(size)
        lines.append("| " + " | ".join([
            f"`{size}` ({curve['method']}, batch {curve['batch_size']}, lr {curve['lr']:g}, {curve['precision']})",
            f"{last['epoch']:g} of {curve['epochs_planned']} ({last['cpu_hours']:.1f})",
            f"{best['epoch']:g}: {best['stsb_dev']:.2f} / {best['sts7']:.2f}",
            f"{last['epoch']:g}: {last['stsb_dev']:.2f} / {last['sts7']:.2f}",
            f"{last['epoch'] - best['epoch']:.2f}",
            f"{row['epochs']}: {row['stsb_dev']:.2f} / {row['sts7']:.2f}" if row else "–"]) + " |")
    lines.append(f"\nOne run per size on all of `mixed`, seed {record['seed']}, its LR schedule spanning the planned "
                 f"epochs; a point per quarter epoch. {_cpu_cell(record)}.")
    return "\n".join(lines)


def _published_label_free(records: list[dict]) -> list[dict]:
    """The best label-free student of each size on the front page: its epochs, STS-B dev and 7-STS."""
    rows = []
    for student in FRONT_PAGE_SIZES:
        found = _best_label_free(scale_records(records), student)
        if found:
            _, scores, record = found
            rows.append({"student": student, "epochs": (record.get("training") or {}).get("epochs", "?"),
                         "stsb_dev": scores["stsb_dev"], "sts7": scores["avg"]})
    return rows


RECIPE_LEVERS_DIR = ROOT / "results" / "levers"


def recipe_levers_table(records: list[dict] | None = None, levers_dir: Path = RECIPE_LEVERS_DIR,
                        seeds_path: Path = SEEDS_FILE) -> str:
    """Each recipe lever screened by bench/seeds.py ``--set`` (results/levers/): its STS-B dev (what chooses) and
    7-STS beside the unchanged recipe's seed mean and spread on the same sample; a dev change no larger than that
    spread is "within noise"."""
    files = sorted(levers_dir.glob("*.json")) if levers_dir.is_dir() else []
    if not files:
        return "No lever screened yet: `python bench/seeds.py --sizes SIZE --seeds 1000 --set KEY=VALUE --write " \
               "results/levers/bench-lever-NAME.json`."
    baseline = json.loads(seeds_path.read_text())["sizes"] if seeds_path.is_file() else {}
    lines = ["| student | change to its recipe | STS-B dev | vs the recipe's seed mean (dev spread) | 7-STS "
             "| verdict on dev | result file |", "|" + "---|" * 7]
    for path in files:
        record = json.loads(path.read_text())
        for size, entry in record["sizes"].items():
            base = baseline.get(size)
            dev = entry["stsb_dev"]["mean"]
            if base:
                delta, spread = dev - base["stsb_dev"]["mean"], base["stsb_dev"]["spread"]
                versus = f"{delta:+.2f} ({base['stsb_dev']['mean']:.2f} ± {spread / 2:.2f})"
                verdict = ("within noise" if abs(delta) <= spread else "better" if delta > 0 else "worse")
            else:
                versus, verdict = "no seed baseline", "–"
            lines.append("| " + " | ".join([
                f"`{size}`", ", ".join(f"`{change}`" for change in record.get("changes") or []) or "none",
                f"{dev:.2f}", versus, f"{entry['sts7']['mean']:.2f}", verdict,
                f"[{path.name}](results/levers/{path.name})"]) + " |")
    return "\n".join(lines)


def best_students_table(records: list[dict], rates: dict[str, float] | None = None,
                        spreads: dict[str, dict] | None = None) -> str:
    """The front page's table: per student size, the run on the whole corpus with the best STS-B dev (any method,
    any bi-encoder teacher), once label-free and once with NLI labels (DistilCSE's second stage), with its 7-STS
    average, its share of that teacher's average and how much faster it encodes than the teacher. A label-free
    row may be the first stage of an NLI run: that stage's own scores, recorded in the run's file."""
    rates = _encode_rates() if rates is None else rates
    spreads = seed_spreads() if spreads is None else spreads
    records = scale_records(records)
    teachers = {r["model"]: r for r in records if r["kind"] == "baseline"}
    lines = ["| student | params (M) | 7-STS before | labels | best by STS-B dev (method ← teacher) | STS-B dev "
             "| 7-STS | seed noise † | % of teacher | encodes × faster than teacher | result file |",
             "|" + "---|" * 11]
    for student in FRONT_PAGE_SIZES:
        start = teachers.get(student)
        runs = [r for r in _raydistill_students(records) if r["model"] == student and r.get("teacher") in teachers]
        label_free = [(method, scores, r) for method, scores, r in _label_free_students(records, student)
                      if r.get("teacher") in teachers]
        supervised = [(r.get("method", "?"), r["scores"], r) for r in runs
                      if any(stage.get("method") in LABELLED_STAGES
                             for stage in r.get("training", {}).get("stages") or [])]
        for labels, found in (("none", label_free), ("NLI", supervised)):
            if not found:
                lines.append(f"| `{student}` | – | {start['scores']['avg']:.2f} | {labels} | not run on the whole "
                             "corpus yet | – | – | – | – | – | – |" if start else
                             f"| `{student}` | – | – | {labels} | not run yet | – | – | – | – | – | – |")
                continue
            method, scores, best = max(found, key=lambda item: _dev(item[1]))
            teacher = teachers[best["teacher"]]
            speed = (f"{rates[student] / rates[best['teacher']]:.1f} ×"
                     if student in rates and best["teacher"] in rates else "–")
            lines.append("| " + " | ".join([
                f"`{student}`", f"{best['params_m']:.1f}", f"{start['scores']['avg']:.2f}" if start else "–", labels,
                f"{method} ← `{best['teacher']}` ({teacher['scores']['avg']:.2f})", f"{scores['stsb_dev']:.2f}",
                f"**{scores['avg']:.2f}**", _spread_cell(spreads, student) if labels == "none" else "not measured",
                f"{100 * scores['avg'] / teacher['scores']['avg']:.1f}", speed, _file_cell(best)]) + " |")
    return "\n".join(lines)


PUBLISHED_MODELS = ROOT / "results" / "published" / "small-models-mteb.json"


def public_models_table(records: list[dict], published: dict | None = None) -> str:
    """Public small encoders' published 7-STS scores (results/published/, MTEB) beside this project's best student
    of each size (by STS-B dev, label-free and with NLI labels, on the whole corpus, scored by raydistill's own
    evaluator), sorted by the 7-set average."""
    published = json.loads(PUBLISHED_MODELS.read_text()) if published is None else published
    rows = []
    for model in published["models"]:
        scores = model["scores"]
        rows.append((sum(scores[name] for name in STS7) / len(STS7), [
            model["model"] + (" (static)" if model["static"] else ""), f"{model['params_m']:.1f}", "–",
            *[f"{scores[name]:.2f}" for name in STS7], "published (MTEB; SICK-R on all of SICK)"]))
    records = scale_records(records)
    teachers = {r["model"]: r for r in records if r["kind"] == "baseline"}
    for student in FRONT_PAGE_SIZES:
        runs = [r for r in _raydistill_students(records) if r["model"] == student and r.get("teacher") in teachers]
        label_free = [(m, sc, r) for m, sc, r in _label_free_students(records, student) if r.get("teacher") in teachers]
        supervised = [(r.get("method", "?"), r["scores"], r) for r in runs
                      if any(stage.get("method") in LABELLED_STAGES
                             for stage in r.get("training", {}).get("stages") or [])]
        for labels, found in (("none", label_free), ("NLI", supervised)):
            if not found:
                continue
            method, scores, r = max(found, key=lambda item: _dev(item[1]))
            rows.append((scores["avg"], [
                f"raydistill `{student}` ({method} ← `{r['teacher']}`)", f"{r['params_m']:.1f}", labels,
                *[f"{scores[name]:.2f}" for name in STS7], f"[{r['_file']}](../results/{r['_file']})"]))
    lines = ["| model | params (M) | labels | " + " | ".join(STS7) + " | avg | source |", "|" + "---|" * 12]
    for avg, cells in sorted(rows, key=lambda row: -row[0]):
        lines.append("| " + " | ".join(cells[:10] + [f"**{avg:.2f}**", cells[10]]) + " |")
    return "\n".join(lines)


# Targets of the runs at scale (7-STS average, teacher mpnet-base, the whole mixed corpus): the best label-free
# student of each size, and margins over its start, SimCSE on the same corpus and sentence-transformers' MSE recipe.
SCALE_TEACHER = "mpnet-base"
SCALE_TARGETS = {"minilm-l3": 78.0, "bert-mini": 76.5, "bert-tiny": 72.0}
# Stages that learn from labels (NLI triplets, NLI teacher labels, STS-B scores): a run with one is not label-free,
# but its label-free first stage is (DistilCSE's CKD), and the job records that stage's 7-STS.
LABELLED_STAGES = {"simcse-sup", "dvbert", "sts-cosine"}


def _label_free_students(records: list[dict], student: str) -> list[tuple[str, dict, dict]]:
    """``(method, scores, record)`` of every label-free student of ``student`` distilled from the scale teacher: the
    run's scores, or those of the label-free stage before its first labelled one."""
    found = []
    for r in records:
        if (r["kind"] not in ("distill", "tune") or r["model"] != student or r.get("teacher") != SCALE_TEACHER
                or r.get("method") in BASELINE_METHODS):
            continue
        stages = r.get("training", {}).get("stages") or []
        labelled = [i for i, stage in enumerate(stages) if stage.get("method") in LABELLED_STAGES]
        if not labelled:
            found.append((r.get("method", "?"), r["scores"], r))
        elif labelled[0] > 0 and (stages[labelled[0] - 1].get("scores") or {}).get("avg") is not None:
            first = stages[labelled[0] - 1]
            label = "ckd" if r.get("method") == "distilcse" else first.get("method", "?")
            found.append((f"{label} ({r.get('method')} stage {labelled[0]})", first["scores"], r))
    return found


def _best_label_free(records: list[dict], student: str) -> tuple[str, dict, dict] | None:
    """``(method, scores, record)`` of the label-free student of ``student`` with the best STS-B dev, else None."""
    found = _label_free_students(records, student)
    return max(found, key=lambda item: _dev(item[1])) if found else None


def scale_targets_table(records: list[dict], spreads: dict[str, dict] | None = None) -> str:
    """Per student size, trained on the whole mixed corpus from mpnet-base: the best label-free student against its
    target, its start, SimCSE on the same corpus and sentence-transformers' MSE recipe; DistilCSE beside it. A
    margin no larger than the size's measured seed spread is "within noise", not met or missed."""
    spreads = seed_spreads() if spreads is None else spreads
    records = scale_records(records)
    baselines = {r["model"]: r for r in records if r["kind"] == "baseline"}

    def best_of(method: str, student: str) -> dict | None:
        runs = [r for r in records if r["kind"] == "distill" and r["model"] == student and r.get("method") == method]
        return max(runs, key=lambda r: _dev(r["scores"])) if runs else None

    def check(value: float | None, bar: float | None) -> str:
        if value is None or bar is None:
            return "–"
        return margin_verdict(value, bar, (spreads.get(student) or {}).get("spread"))

    def comparison_cell(run: dict | None) -> str:
        # a comparison run on the unfiltered corpus says so in its own cell: the row's link is another file
        return f"{run['scores']['avg']:.2f}{_filter_mark(run)}" if run else "not run yet"

    lines = ["| student | start | best label-free (method) | target | vs start + 2 | SimCSE | vs SimCSE "
             "| st-mse | vs st-mse + 0.5 | DistilCSE (+ NLI) vs target | result file |", "|" + "---|" * 11]
    for student, target in SCALE_TARGETS.items():
        start = baselines.get(student, {}).get("scores", {}).get("avg")
        label_free = _best_label_free(records, student)
        simcse, st_mse, distilcse = (best_of(m, student) for m in ("simcse", "st-mse", "distilcse"))
        if label_free:
            method, scores, record = label_free
            avg = scores["avg"]
            best_cell, target_cell = f"**{avg:.2f}** ({method})", f"≥ {target:g}: {check(avg, target)}"
            link = _file_cell(record)
        else:
            avg, best_cell, target_cell, link = None, "not run yet", f"≥ {target:g}", "–"
        simcse_avg = simcse["scores"]["avg"] if simcse else None
        st_avg = st_mse["scores"]["avg"] if st_mse else None
        lines.append("| " + " | ".join([
            f"`{student}`", f"{start:.2f}" if start is not None else "–", best_cell,
            target_cell,
            check(avg, start + 2.0 if start is not None else None),
            comparison_cell(simcse), check(avg, simcse_avg),
            comparison_cell(st_mse),
            check(avg, st_avg + 0.5 if st_avg is not None else None),
            (f"{distilcse['scores']['avg']:.2f}: {check(distilcse['scores']['avg'], target)}" if distilcse
             else "not run yet"), link]) + " |")
    return "\n".join(lines)


def dev_curves_table(records: list[dict]) -> str:
    """Runs on the whole corpus, per stage: STS-B dev at the start (the student's baseline), at the stage's first
    evaluation, at its best and at its end (``training.dev_curve``): where each run peaked and whether it passed its
    start on dev."""
    records = scale_records(records)
    baselines = {r["model"]: r for r in records if r["kind"] == "baseline"}
    lines = ["| method (stage) | student | start | first eval (step) | best (step) | last (step) | evaluations "
             "| result file |", "|" + "---|" * 8]
    runs = [r for r in records if r["kind"] == "distill" and (r.get("training") or {}).get("dev_curve")]
    for r in sorted(runs, key=lambda r: (r["model"], r.get("method", ""))):
        training = r["training"]
        start = baselines.get(r["model"], {}).get("scores", {}).get("stsb_dev")
        stages = training.get("stages") or [{"method": r.get("method"), "total_steps": training.get("steps")}]
        offset = 0
        for stage in stages:
            end = offset + int(stage.get("total_steps") or stage.get("steps") or 0)
            curve = [(step, dev) for step, dev in training["dev_curve"] if offset < step <= end]
            offset = end
            if not curve:
                continue
            best = max(curve, key=lambda point: point[1])
            method = r.get("method", "?") if len(stages) == 1 else f"{r.get('method', '?')} ({stage.get('method')})"
            lines.append("| " + " | ".join([
                method, f"`{r['model']}`", f"{start:.2f}" if start is not None else "–",
                f"{curve[0][1]:.2f} ({curve[0][0]})", f"**{best[1]:.2f}** ({best[0]})", f"{curve[-1][1]:.2f} ({curve[-1][0]})",
                str(len(curve)), f"[{r['_file']}](results/{r['_file']})"]) + " |")
    return "\n".join(lines)


# The main job's default before its teacher labeller: the inductive-against-transductive comparison was run on it.
BEFORE_TEACHER = ["teacher=null", "cycles=3"]


def _main_job_runs(records: list[dict], changes: list[str] = ()) -> tuple[list[str],
                                                                          dict[str, dict[tuple[str, str], dict]]]:
    """The runs of the shipped main-job config, with ``changes`` (its mode, families, teacher and cycles; any pair
    source but the paraphrase ones): the families' names, and per run name its ``(family, start|bi|cross)`` slots,
    each the best STS-B dev."""
    from raydistill.runtime.tenc import TencConfig
    from raydistill.runtime.tenc.pairs import PAIR_CLASSIFICATION_SOURCES

    shipped = TencConfig.from_yaml(ROOT / "raydistill" / "configs" / "mutual_tenc.yaml", list(changes))
    families = {family.name: family.recorded() for family in shipped.families}
    runs: dict[str, dict[tuple[str, str], dict]] = {}
    for r in sorted(records, key=lambda r: (r.get("training") or {}).get("cycle") or 0):  # ties: the earlier cycle
        training = r.get("training") or {}
        if (r["kind"] != "mutual_tenc" or r.get("extra", {}).get("family") == "ensemble"
                or training.get("mode") != shipped.mode or training.get("families") != families
                or training.get("cycles") != shipped.cycles or training.get("teacher") != shipped.teacher
                or training.get("pairs_source") in PAIR_CLASSIFICATION_SOURCES):
            continue
        _keep_best_by_dev(runs.setdefault(r["extra"]["run_name"], {}), r)
    return list(families), runs


def _pairs_source(slots: dict[tuple[str, str], dict]) -> str:
    return next(iter(slots.values()))["training"].get("pairs_source") or "transductive"


def tenc_main_table(records: list[dict]) -> str:
    """The main job's outcome: every run of the shipped config (one row group per pair source, transductive first),
    per family: the start, and the bi- and cross-encoder the job keeps (the best STS-B dev over the cycles; the test
    sets never choose), each as 7-STS with its STS-B dev and cycle. Self against mutual and the runs of earlier
    defaults: docs/trans-encoder.md."""
    families, runs = _main_job_runs(records)
    bars = _main_job_bars(records)
    # What a seed moves the main job's kept models by (bench/engine_parity.py: two seeds, 2 cycles)
    parity = ROOT / "results" / "bench-engine_parity.json"
    spread = json.loads(parity.read_text())["main_job_new_seed_spread_max"] if parity.is_file() else None
    # No link to the run: its directory name carries a config hash, which the front page never shows.
    lines = ["| pairs | family | start bi | best bi (cycle) | best cross (cycle) | STS-B dev: start / bi / cross | "
             "bar: the best student of its size | best bi − bar |", "|---|---|---|---|---|---|---|---|"]

    def score(record: dict) -> str:
        return f"{record['scores']['avg']:.2f}"

    def pairs_order(name: str) -> tuple:
        source = _pairs_source(runs[name])
        return (source != "transductive", source, name)

    for name in sorted(runs, key=pairs_order):
        slots = runs[name]
        for family in families:
            start, bi, cross = (slots.get((family, kind)) for kind in ("start", "bi", "cross"))
            if start is None or bi is None or cross is None:
                continue
            dev = " / ".join(f"{r['scores']['stsb_dev']:.2f}" for r in (start, bi, cross))
            bar, what = bars[family]
            lines.append(f"| {_pairs_label(start['training'])} | {family} | {score(start)} | "
                         f"**{score(bi)}** ({bi['training'].get('cycle') or 0}) | "
                         f"**{score(cross)}** ({cross['training'].get('cycle')}) | {dev} | {bar:.2f} ({what}) | "
                         f"{margin_verdict(bi['scores']['avg'], bar, spread)} |")
    return "\n".join(lines)


# What a family of a size no committed student has must beat: the 3-layer cut of all-MiniLM-L6-v2, untrained.
UNTRAINED_CUT = "minilm-l3"


def _main_job_bars(records: list[dict]) -> dict[str, tuple[float, str]]:
    """Per main-job family, the 7-STS its kept bi-encoder is set against: the best label-free student of its size
    (by STS-B dev, as README's students table), or, for a size with none, the untrained 3-layer cut."""
    from raydistill.runtime.tenc import TencConfig

    shipped = TencConfig.from_yaml(ROOT / "raydistill" / "configs" / "mutual_tenc.yaml")
    baselines = {r["model"]: r for r in scale_records(records) if r["kind"] == "baseline"}
    bars = {}
    for family in shipped.families:
        found = _best_label_free(scale_records(records), family.bi)
        if found:
            method, scores, _ = found
            bars[family.name] = (scores["avg"], f"{family.bi}, {method.split(' ')[0]}")
        else:
            bars[family.name] = (baselines[UNTRAINED_CUT]["scores"]["avg"], f"no {family.bi} student: the untrained "
                                                                             f"{UNTRAINED_CUT} cut")
    return bars


def tenc_inductive_table(records: list[dict]) -> str:
    """What training on the test pairs buys the main job: per family and kept model (best STS-B dev), the 7-STS of
    the transductive and the inductive run of the shipped config and their difference, with each one's STS-B dev.
    Where more than one run of a source is committed, the latest. Measured on the default before its teacher
    labeller (``BEFORE_TEACHER``)."""
    families, runs = _main_job_runs(records, BEFORE_TEACHER)
    latest: dict[str, dict[tuple[str, str], dict]] = {}
    for name, slots in runs.items():
        source = _pairs_source(slots)
        newest = max(r.get("date") or "" for r in slots.values())
        if source not in latest or newest > max(r.get("date") or "" for r in latest[source].values()):
            latest[source] = slots
    if not {"transductive", "inductive"} <= set(latest):
        return "Not both runs yet: `python jobs/mutual_tenc.py` and `python jobs/mutual_tenc.py --set pairs.source=inductive`."
    lines = ["| family | model kept | transductive: 7-STS (dev) | inductive: 7-STS (dev) | inductive − transductive |",
             "|---|---|---|---|---|"]
    for family in families:
        for kind in ("bi", "cross"):
            trans, induct = latest["transductive"].get((family, kind)), latest["inductive"].get((family, kind))
            if trans is None or induct is None:
                continue
            cells = [f"{r['scores']['avg']:.2f} ({r['scores']['stsb_dev']:.2f})" for r in (trans, induct)]
            lines.append(f"| {family} | {kind}-encoder | {cells[0]} | {cells[1]} | "
                         f"{induct['scores']['avg'] - trans['scores']['avg']:+.2f} |")
    return "\n".join(lines)


LEVERS_DIR = ROOT / "results" / "mutual_tenc" / "levers"
LEVERS_REFERENCE = "bf16"  # the screen every other one changes one thing of
_NOT_A_CHANGE = ("cycles", "run_dir", "run_name", "results_dir", "eval.", "resources.", "tracking.", "stop_after_stage")


def _lever_change(config: dict, reference: dict) -> str:
    """The config fields in which a screen differs from its reference, as ``key: value``."""
    flat, base = flatten(config), flatten(reference)
    changed = []
    for key in sorted(set(flat) | set(base)):
        if key.startswith(_NOT_A_CHANGE) or flat.get(key) == base.get(key):
            continue
        changed.append(f"{key}: {flat.get(key)}")
    if config.get("families") != reference.get("families"):
        changed = [c for c in changed if not c.startswith("families")]
        changed.insert(0, "families: " + ", ".join(
            f"{f['name']} (bi {f['bi']}, cross {f.get('cross') or f['bi']})" for f in config["families"]))
    return "; ".join(changed) or "(the reference)"


def _lever_differences(config: dict, reference: dict) -> int:
    flat, base = flatten(config), flatten(reference)
    return sum(1 for key in set(flat) | set(base) if not key.startswith(_NOT_A_CHANGE) and flat.get(key) != base.get(key))


def tenc_levers_table(records: list[dict] | None = None, levers_dir: Path = LEVERS_DIR) -> str:
    """One row per screen and family: the Trans-Encoder levers, one change at a time, from each screen's
    summary.json (1 cycle, STS-B dev only). A screen is set against its nearest reference: the bf16 screen, or a
    committed run of the main job (its cycle 1), whichever config differs from the screen's in fewest fields."""
    summaries = {p.parent.name: json.loads(p.read_text(encoding="utf-8"))
                 for p in sorted(levers_dir.glob("*/summary.json"))}
    if summaries.get(LEVERS_REFERENCE, {}).get("config") is None:
        raise SystemExit(f"{levers_dir / LEVERS_REFERENCE / 'summary.json'}: the reference screen, or its config, is "
                         "missing; rerun its command")
    main_runs = {p.parent.name: json.loads(p.read_text(encoding="utf-8"))
                 for p in sorted(levers_dir.parent.glob("tenc-*/summary.json"))}
    main_runs = {name: run for name, run in main_runs.items() if run.get("config")}
    lines = ["| screen | change against its reference | family | start bi dev | trained bi dev, cycle 1 | "
             "best bi dev (cycle) | Δ best − start | cross dev, cycle 1 | stage wall, cycle 1 (s) |",
             "|---|---|---|---|---|---|---|---|---|"]

    def rows(link: str, change: str, summary: dict, cycles: int) -> None:
        wall = sum(v for k, v in summary["stage_wall_s"].items() if int(k.split("/")[0].split("=")[1]) <= cycles)
        for family, row in summary["by_family"].items():
            start = row["start_bi_stsb_dev"]
            by_cycle = summary["stsb_dev_by_cycle"][family]
            best_cycle = max(range(cycles + 1), key=lambda c: (by_cycle["bi"][str(c)], -c))
            best = by_cycle["bi"][str(best_cycle)]
            lines.append(f"| {link} | {change} | {family} | {start:.2f} | {by_cycle['bi']['1']:.2f} | "
                         f"{best:.2f} ({best_cycle}) | {best - start:+.2f} | {by_cycle['cross']['1']:.2f} | "
                         f"{wall:.0f} |")

    shown_references = set()
    for name, summary in sorted(summaries.items(), key=lambda item: (item[0] != LEVERS_REFERENCE, item[0])):
        if "stsb_dev_by_cycle" not in summary:
            raise SystemExit(f"{levers_dir / name / 'summary.json'}: no per-cycle dev recorded; rerun its command")
        link = f"[{name}](../results/mutual_tenc/levers/{name}/summary.json)"
        if name == LEVERS_REFERENCE:
            rows(link, "bf16 autocast (bi.precision, cross.precision) over the shipped fp32 config", summary, 1)
            continue
        candidates = {LEVERS_REFERENCE: summaries[LEVERS_REFERENCE], **main_runs}
        reference = min(candidates, key=lambda ref: (_lever_differences(summary["config"], candidates[ref]["config"]),
                                                     ref != LEVERS_REFERENCE))
        if reference != LEVERS_REFERENCE and reference not in shown_references:
            shown_references.add(reference)
            rows(f"[main job, cycle 1](../results/mutual_tenc/{reference}/summary.json)",
                 "(the reference: the shipped default's committed run)", main_runs[reference], 1)
        against = "" if reference == LEVERS_REFERENCE else " (against the main job's run)"
        rows(link, _lever_change(summary["config"], candidates[reference]["config"]) + against, summary, 1)
    return "\n".join(lines)


def tenc_stage_screen_table(records: list[dict] | None = None, levers_dir: Path = LEVERS_DIR) -> str:
    """One row per setting of each per-family stage screen (``scripts/tenc_stage_screen.py``), from its
    ``screen.json``: the family's start bi- or cross-encoder trained on one cycle's labels of a committed run,
    chosen by STS-B dev."""
    lines = ["| screen | family | encoder | labels | lr | epochs | steps | STS-B dev | 7-STS avg | train (s) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for path in sorted(levers_dir.glob("*/screen.json")):
        screen = json.loads(path.read_text(encoding="utf-8"))
        chosen = screen["chosen_by_dev"]
        link = f"[{path.parent.name}](../results/mutual_tenc/levers/{path.parent.name}/screen.json)"
        labels = f"{screen['source_run']}, cycle {screen['cycle']}"
        for row in screen["rows"]:
            mark = "**" if (row["lr"], row["epochs"]) == (chosen["lr"], chosen["epochs"]) else ""
            lines.append(f"| {link} | {screen['family']} | {screen.get('kind', 'bi')} | {labels} | {row['lr']:g} | "
                         f"{row['epochs']} | "
                         f"{row['steps']} | {mark}{row['stsb_dev']:.2f}{mark} | {row['sts7_avg']:.2f} | "
                         f"{row['train_s']:.0f} |")
    return "\n".join(lines)


def _effective_config(path: Path) -> dict:
    """A shipped config as the job sees it: the file over the dataclass defaults."""
    from raydistill.config.job import JobConfig
    from raydistill.runtime.tenc import TencConfig

    return (TencConfig if "tenc" in path.name else JobConfig).from_yaml(path).to_dict()


def gpu_configs_table(records: list[dict] | None = None) -> str:
    """What each shipped ``<job>-gpu.yaml`` changes against the CPU config of the same job, ``resources`` (and the
    run directory, which only keeps the two runs apart) aside; both read as the job reads them, defaults filled in."""
    configs = ROOT / "raydistill" / "configs"
    lines = ["| GPU config | CPU config | fields that differ, besides `resources` (CPU → GPU) |", "|---|---|---|"]
    for gpu in sorted(configs.glob("*-gpu.yaml")):
        cpu = configs / gpu.name.replace("-gpu", "")
        if not cpu.is_file():
            continue
        a, b = flatten(_effective_config(cpu)), flatten(_effective_config(gpu))
        keys = sorted(k for k in a.keys() | b.keys()
                      if not k.startswith("resources.") and k != "run_dir" and a.get(k) != b.get(k))

        def show(value) -> str:
            if isinstance(value, list) and value and all(isinstance(v, dict) and "name" in v for v in value):
                value = [v["name"] for v in value]  # model families: their names say which models
            return json.dumps(value) if isinstance(value, (list, dict, type(None), bool)) else str(value)

        changes = "; ".join(f"`{k}` {show(a.get(k))} → {show(b.get(k))}" for k in keys)
        lines.append(f"| `{gpu.name}` | `{cpu.name}` | {changes or 'none'} |")
    return "\n".join(lines)


# The committed output of the main job, else of a ConGen job: what the front page shows a job printing.
JOB_LOGS = ("docs/mutual_tenc-run.log", "docs/congen-run.log")



# The quick start's committed run: the manifest `raydistill distill` wrote into its --out directory, kept without the
# model (results/distill/<out>/raydistill_package.json).
QUICKSTART_MANIFEST = ROOT / "results" / "distill" / "minilm-l6-l3" / "raydistill_package.json"


def quickstart_session(records: list[dict] | None = None, manifest_path: Path = QUICKSTART_MANIFEST) -> str:
    """The quick start's terminal session, from the committed run: its command, the recipe line it printed, and the
    table it ended with (``raydistill.ship.package.format_table`` of the rows its manifest holds)."""
    from raydistill.ship.package import Row, format_table
    from raydistill.ship.recipe import Recipe

    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    recipe = Recipe.from_dict(manifest["recipe"]["recipe"])
    command = manifest["command"].removeprefix("raydistill ")
    if "--budget" not in command and manifest["recipe"].get("budget", "epochs") == "epochs":
        # trained for the recipe's epochs, which today's command spells so (its default is a time budget)
        command += " --budget epochs"
    table = format_table([Row(**row) for row in manifest["rows"]], margin=manifest["quality_margin"],
                         speed=manifest["speed"])
    # The footnotes on the margin and on where each score came from are left to the linked manifest, for space.
    table = "\n".join(line for line in table.splitlines() if not line.startswith(("quality:", "  ")))
    return "\n".join(["```text", f"$ .venv/bin/raydistill {command}",
                      f"[distill] {recipe.headline()}", "...",
                      table, "```"])


def reliability_summary(records: list[dict] | None = None) -> str:
    """Cases tried, faults survived, steps lost, from docs/reliability.json (scripts/reliability_table.py)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from reliability_table import summary_lines

    rows = json.loads((ROOT / "docs" / "reliability.json").read_text())["rows"]
    return "\n".join(summary_lines(rows))


def provenance_summary(records: list[dict], results_dir: Path = ROOT / "results") -> str:
    """What the committed result files say about the code that wrote them: a clean commit, a commit plus the hash of
    the code's diff from it (``-dirty`` with ``code_diff_sha256``), or, in files written before result files recorded
    that hash, ``-dirty`` alone: a change from that commit that nothing identifies."""
    every = load_results(results_dir) + load_results(results_dir, history=True)
    dirty = [r for r in every if str(r.get("git_sha", "")).endswith("-dirty")]
    unhashed = sorted((r for r in dirty if not r.get("code_diff_sha256")), key=lambda r: r.get("date") or "")
    hashed = len(dirty) - len(unhashed)
    line = (f"Of {len(every)} committed result files, {len(every) - len(dirty)} were written from a clean commit and "
            f"{hashed} from a commit plus a code change they identify by its hash (`code_diff_sha256`).")
    if unhashed:
        front = {r["_file"] for r in unhashed} & set(_front_page_files(records))
        line += (f" {len(unhashed)}, the last dated {unhashed[-1].get('date', '?')[:10]}, carry `-dirty` without a "
                 "hash: written before result files recorded one, from a tree whose code differed from that commit "
                 "by a change nothing identifies; their numbers stand as measured, and their commands may not "
                 "reproduce them. " + ("None of them is on the front page." if not front else
                                      f"On the front page: {', '.join(sorted(front))}."))
    return line


def _front_page_files(records: list[dict]) -> list[str]:
    """The result files README's tables link (``results/<file>``)."""
    readme = "\n".join(make(records) for make in PAGES["README.md"].values())
    return re.findall(r"\]\(results/([^)]+\.json)\)", readme)


# Which tables live in which page. README keeps the front-page table; the long ones have their own pages.
PAGES = {
    "README.md": {"best_students": best_students_table, "scale_targets": scale_targets_table,
                  "tenc_main": tenc_main_table, "reliability_summary": reliability_summary,
                  "quickstart": quickstart_session},
    "docs/results.md": {"provenance": provenance_summary, "dev_curves": dev_curves_table, "baselines": baselines_table,
                        "public_models": public_models_table,
                        "distill": lambda records: distill_table(scale_records(records)),
                        "distill_history": lambda records: distill_table(history_records(records)
                                                                         + superseded_starts()),
                        "distill_superseded": lambda records: superseded_table(),
                        "targets": targets_table, "seeds": seeds_table, "recipe_levers": recipe_levers_table,
                        "curves": curves_table,
                        "tune": tune_table, "tune_trials": tune_trials_table},
    "docs/trans-encoder.md": {"tenc": tenc_table, "tenc_compare": tenc_compare_table,
                              "tenc_inductive": tenc_inductive_table,
                              "tenc_pair_auc": tenc_pair_auc_table, "tenc_levers": tenc_levers_table,
                              "tenc_stage_screen": tenc_stage_screen_table},
    "docs/benchmarks.md": {"bench": bench_table, "compare_public": compare_public_table, "domain": domain_table},
    "docs/cluster.md": {"gpu_configs": gpu_configs_table},
}


def superseded_starts(results_dir: Path = ROOT / "results") -> list[dict]:
    """The baselines of start models that no longer exist (results/history/): listed after the current ones, they
    are the "before" of runs made from those starts (distill_table keeps the last baseline of a model)."""
    return [r for r in load_results(results_dir, history=True) if r["kind"] == "baseline"]


def superseded_table(results_dir: Path = ROOT / "results") -> str:
    """The runs a rerun superseded (results/history/), each beside the baseline of the start it had then."""
    runs = [r for r in load_results(results_dir, history=True) if r["kind"] != "baseline"]
    if not runs:
        return "No run has been superseded."
    current = [r for r in load_results(results_dir) if r["kind"] == "baseline"]
    return distill_table(current + superseded_starts(results_dir) + runs)


def _link_prefix(page: str) -> str:
    """Links to results/ are written from the repository root; a page under docs/ needs ../ in front."""
    return "../" * page.count("/")


def render(text: str, records: list[dict], tables: dict | None = None, page: str = "README.md") -> str:
    prefix = _link_prefix(page)
    for name, make in (tables if tables is not None else PAGES[page]).items():
        pattern = re.compile(rf"(<!-- table:{name} -->\n).*?(<!-- /table:{name} -->)", re.S)
        body = make(records)
        if prefix:
            body = body.replace("](results/", f"]({prefix}results/")
        text = pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if a page is not what the results say")
    args = parser.parse_args()
    records = load_results()
    stale = []
    for page, tables in PAGES.items():
        path = ROOT / page
        current = path.read_text()
        missing = [name for name in tables if f"<!-- table:{name} -->" not in current]
        if missing:
            print(f"{page}: no region for table(s) {', '.join(missing)}", file=sys.stderr)
            return 1
        updated = render(current, records, tables, page)
        if updated != current:
            stale.append(page)
            if not args.check:
                path.write_text(updated)
    if args.check and stale:
        print(f"stale tables in {', '.join(stale)}: run python scripts/readme_tables.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
