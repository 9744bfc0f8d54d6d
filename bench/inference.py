"""Encode throughput of every preset and distilled student side by side, and of a student's ONNX int8 export.

Models: the presets (minilm-l6, mpnet-base, minilm-l3, bert-tiny, bert-mini, bert-small) and, per student size,
the best raydistill student trained on the whole corpus (``--all-students``: every distilled student) of the
committed result files (the records scripts/readme_tables.py reads, tracked by git unless ``--uncommitted``,
of kind ``distill`` or ``mutual_tenc``, bi-encoders, whose ``model_dir`` exists on this machine; a missing
directory is skipped with a note, and a directory that is a preset's own, e.g. a Trans-Encoder cycle 0, is counted
once). They are all loaded into one process and timed at one torch thread count (``--threads``, default 2), batch
128, on ``--sentences`` real STS sentences (STS12-16 + STS-B test, a seeded sample), in ``--rounds`` rounds that go
through every model in turn, so that load from other processes falls on all of them; medians over the rounds. Two
ways per model, both fp32:

    sorted   raydistill's ``BiEncoder.encode``: length-sorted batches under inference_mode
    plain    batches in input order, each padded to its longest (bench/train_step.py's ``plain_rate``): what a
             sentence-transformers-style user loop gets from the same weights without sorting

int8: the minilm-l3 preset (or ``--student DIR``) exported as ``raydistill distill`` ships it
(``raydistill.models.export.export_onnx``: ONNX Runtime dynamic int8 for this CPU, sentence-transformers' ONNX
layout) and run by ``load_onnx`` at the same thread count, timed the same two ways (bench/export_speed.py compares
it with the fp32 ONNX file and with torch's own dynamic int8). With ``--quality`` the export's 7-STS average is evaluated (``raydistill.evaluation.evaluate_sts``, what ``raydistill
eval`` runs) and compared with the fp32 model's, taken from its result file when there is one (same evaluator),
else evaluated here too; ~1.5-8 min per minilm-l3 evaluation on two shared cores, depending on their load.

    inference_vs_minilm_l6   minilm-l3 sorted ÷ minilm-l6 plain
    inference_vs_mpnet       minilm-l3 sorted ÷ mpnet-base plain
    inference_int8_vs_fp32   ONNX int8 sorted ÷ torch fp32 sorted of the same model

The speed of an architecture does not depend on its weights, but it does depend on the truncation a checkpoint
carries (``max_length`` in the table): the distilled students are saved with their last stage's ``data.max_length``
(64 for the full-corpus methods, 32 after DistilCSE's NLI stage),
so on STS sentences they run faster than the same architecture at the preset's 256, and their 7-STS scores were
taken at that length too. The headline ratios use the minilm-l3 preset, so that they compare architectures at the presets'
truncation. 7-STS averages in the ``models`` table come from results/baseline-<preset>.json or the student's own
result file (null when there is none); ``--plot FILE`` plots the sorted sentences/s (log scale) against them (the
headline picture, docs/speed_quality.png, is bench/compare_public.py's).

    python bench/inference.py                                    # table + a JSON line
    python bench/inference.py --quality --write results/bench-inference.json [--plot FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import tempfile
import time
from pathlib import Path

import common  # noqa: F401  (environment before torch)

import numpy as np

from common import RESULTS, ROOT, load_average, median, set_threads, sts_sentences, write_record
from limit import token_counts
from train_step import plain_rate

PRESETS = ("minilm-l6", "mpnet-base", "minilm-l3", "bert-tiny", "bert-mini", "bert-small")
DISTILLED_KINDS = ("distill", "mutual_tenc")


# ----------------------------------------------------------------------------------------------------------------
# Which models, and their 7-STS averages


def result_records(uncommitted: bool = False) -> list[dict]:
    """The result files the docs' tables are built from (``_file`` = path under results/); only those git tracks
    unless ``uncommitted`` (a run in progress elsewhere writes its files before they are committed)."""
    import subprocess

    from scripts.readme_tables import load_results

    records = load_results(RESULTS)
    if uncommitted:
        return records
    listed = subprocess.run(["git", "ls-files", "--", str(RESULTS)], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode != 0:
        print("  git ls-files failed: using every result file", flush=True)
        return records
    tracked = {Path(line).relative_to(RESULTS.relative_to(ROOT)).as_posix() for line in listed.stdout.splitlines()}
    skipped = sorted(r["_file"] for r in records if r["_file"] not in tracked)
    if skipped:
        print(f"  {len(skipped)} uncommitted result files left out (--uncommitted takes them): "
              f"{', '.join(skipped[:4])}{' ...' if len(skipped) > 4 else ''}", flush=True)
    return [r for r in records if r["_file"] in tracked]


def baseline_averages(records: list[dict]) -> dict[str, dict]:
    """{preset: {"avg", "file"}} from the bi-encoder baseline results."""
    return {r["model"]: {"avg": r["scores"].get("avg"), "file": r["_file"]} for r in records
            if r["kind"] == "baseline" and r.get("encoder", "bi") == "bi"}


def best_per_size(records: list[dict]) -> list[dict]:
    """The headline's students: per student size, the best raydistill student (7-STS) trained on the whole corpus
    (the runs the front page reports), ahead of every other record, which only fills sizes with no such run."""
    from scripts.readme_tables import _raydistill_students, at_scale

    best: dict[str, dict] = {}
    for record in _raydistill_students(records):
        if at_scale(record) and record.get("model_dir") and Path(record["model_dir"]).is_dir():
            if record["model"] not in best or record["scores"]["avg"] > best[record["model"]]["scores"]["avg"]:
                best[record["model"]] = record
    return list(best.values())


def distilled_students(records: list[dict], known_dirs: dict[Path, str]) -> list[dict]:
    """Distilled bi-encoder students whose ``model_dir`` exists, each once; ``known_dirs``: resolved dir -> name."""
    seen = dict(known_dirs)
    students = []
    for record in records:
        if record["kind"] not in DISTILLED_KINDS or record.get("encoder", "bi") != "bi":
            continue
        name = record["_file"].removesuffix(".json")
        model_dir = record.get("model_dir")
        if not model_dir:
            print(f"  skip {name}: no model_dir (e.g. an ensemble)", flush=True)
            continue
        path = Path(model_dir)
        if not path.is_dir():
            print(f"  skip {name}: model_dir {model_dir} is not on this machine", flush=True)
            continue
        if path.resolve() in seen:
            print(f"  skip {name}: the same weights as {seen[path.resolve()]}", flush=True)
            continue
        seen[path.resolve()] = name
        students.append({"name": name, "label": Path(name).name, "model_dir": path, "kind": "distilled",
                         "method": record.get("method"), "base": record["model"],
                         "sts7_avg": record["scores"].get("avg"),
                         "sts7_source": f"results/{record['_file']}"})
    return students


# ----------------------------------------------------------------------------------------------------------------
# Timing


def sorted_rate(model, texts: list[str], batch: int) -> float:
    """Sentences/s of ``BiEncoder.encode`` (length-sorted batches, inference mode)."""
    started = time.perf_counter()
    model.encode(texts, batch_size=batch)
    return len(texts) / (time.perf_counter() - started)


def measure_rates(models: dict, texts: list[str], batch: int, rounds: int) -> dict[str, dict[str, list[float]]]:
    """{name: {"sorted": [rate per round], "plain": [...]}}; every round goes through all models in turn."""
    for model in models.values():
        model.encode(texts[:batch], batch_size=batch)  # warm-up: first-call allocations, oneDNN/fbgemm kernels
    rates = {name: {"sorted": [], "plain": []} for name in models}
    for round_index in range(rounds):
        for name, model in models.items():
            rates[name]["sorted"].append(sorted_rate(model, texts, batch))
            rates[name]["plain"].append(plain_rate(model, texts, batch))
            print(f"  round {round_index + 1} {name}: sorted {rates[name]['sorted'][-1]:.1f}/s, plain "
                  f"{rates[name]['plain'][-1]:.1f}/s (load {load_average()})", flush=True)
    return rates


# ----------------------------------------------------------------------------------------------------------------
# int8


def int8_quality(int8_model, fp32_model, fp32_entry: dict, batch: int) -> dict:
    """7-STS of the int8 model, and of the fp32 model unless a result file already gives it."""
    from raydistill.evaluation import evaluate_sts

    started = time.perf_counter()
    scores = evaluate_sts(int8_model, batch_size=batch, progress=False)
    out = {"int8_scores": {k: round(v, 2) for k, v in scores.items()},
           "int8_sts7_avg": round(scores["avg"], 2), "int8_eval_s": round(time.perf_counter() - started, 1)}
    print(f"  int8 7-STS avg {scores['avg']:.2f} ({out['int8_eval_s']:.0f} s)", flush=True)
    if fp32_entry.get("sts7_avg") is not None:
        out.update(fp32_sts7_avg=fp32_entry["sts7_avg"], fp32_source=fp32_entry["sts7_source"])
    else:
        fp32_scores = evaluate_sts(fp32_model, batch_size=batch, progress=False)
        out.update(fp32_sts7_avg=round(fp32_scores["avg"], 2), fp32_source="evaluated in this run",
                   fp32_scores={k: round(v, 2) for k, v in fp32_scores.items()})
        fp32_entry.update(sts7_avg=out["fp32_sts7_avg"], sts7_source="evaluated in this run (bench/inference.py)")
    out["sts7_avg_delta"] = round(out["int8_sts7_avg"] - out["fp32_sts7_avg"], 2)
    return out


# ----------------------------------------------------------------------------------------------------------------
# Picture


def plot_speed_quality(rows: list[dict], path: Path, subtitle: str) -> Path | None:
    """Sorted-encode sentences/s (log x) against 7-STS average, one labelled point per model that has one."""
    from raydistill.evaluation.plots import _pyplot, _save

    points = [r for r in rows if r.get("sts7_avg") is not None]
    if not points:
        print("  no model with a 7-STS average: no picture", flush=True)
        return None
    plt = _pyplot()
    colours = {"preset": "tab:blue", "distilled": "tab:orange", "int8": "tab:green"}
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=110)
    for kind, colour in colours.items():
        chosen = [r for r in points if r["kind"] == kind]
        if chosen:
            ax.scatter([r["sentences_per_s"]["sorted"] for r in chosen], [r["sts7_avg"] for r in chosen],
                       color=colour, label=kind, zorder=3)
    above: list[tuple[float, float]] = []  # (log10 speed, 7-STS) of the labels written above their point
    for r in sorted(points, key=lambda r: r["sentences_per_s"]["sorted"]):
        x, y = math.log10(r["sentences_per_s"]["sorted"]), r["sts7_avg"]
        # int8 labels below their point (it sits next to its fp32 model's), and so does a label that would run
        # into the one above a point of about the same score a little to its left
        below = r["kind"] == "int8" or any(abs(y - y0) < 1.0 and 0 <= x - x0 < 0.6 for x0, y0 in above)
        if not below:
            above.append((x, y))
        ax.annotate(r.get("label") or r["name"], (r["sentences_per_s"]["sorted"], y), fontsize=8,
                    textcoords="offset points", xytext=(5, -11 if below else 4))
    ax.set_xscale("log")
    low, high = ax.get_xlim()
    ax.set_xlim(low / 1.3, high * 3)  # room for the labels right of the points
    ax.margins(y=0.12)
    ax.set_xlabel("encode sentences/s (BiEncoder.encode, batch 128, log scale)")
    ax.set_ylabel("7-STS average (Spearman x 100)")
    ax.set_title(f"speed vs quality\n{subtitle}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    return _save(fig, plt, path)


# ----------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--presets", nargs="+", default=list(PRESETS), choices=PRESETS)
    parser.add_argument("--students", action=argparse.BooleanOptionalAction, default=True,
                        help="also time the distilled students of the result files")
    parser.add_argument("--uncommitted", action="store_true",
                        help="also read result files git does not track yet (default: committed ones only)")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--sentences", type=int, default=256,
                        help="mpnet-base encodes ~4-15/s here: 256 x 2 ways x 2 rounds is ~1-4 min of it")
    parser.add_argument("--rounds", type=int, default=2, help="passes over all models; medians")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--int8", action=argparse.BooleanOptionalAction, default=True,
                        help="also time the ONNX int8 export of --student")
    parser.add_argument("--student", default="minilm-l3", help="model to export: a preset name or a directory")
    parser.add_argument("--quality", action="store_true", help="7-STS of the int8 model vs fp32 (~1.5-8 min each)")
    parser.add_argument("--plot", type=Path, default=None, help="also draw the speed-quality picture into FILE")
    parser.add_argument("--write", type=Path, default=None, help=f"e.g. {RESULTS.name}/bench-inference.json")
    parser.add_argument("--all-students", action="store_true",
                        help="every distilled student on this machine, not only the best full-corpus one per size")
    args = parser.parse_args(argv)
    for needed in ("minilm-l3", "minilm-l6", "mpnet-base"):
        if needed not in args.presets:
            parser.error(f"--presets must include {needed} (the headline ratios use it)")
    set_threads(args.threads)
    load_before = load_average()
    started = time.perf_counter()

    from raydistill.models import BiEncoder, resolve_model
    from raydistill.models.export import export_onnx, load_onnx

    records = result_records(args.uncommitted)
    baselines = baseline_averages(records)
    entries = [{"name": name, "model_dir": Path(resolve_model(name)), "kind": "preset",
                "sts7_avg": baselines.get(name, {}).get("avg"),
                "sts7_source": f"results/{baselines[name]['file']}" if name in baselines else None}
               for name in args.presets]
    if args.students:
        chosen = records if args.all_students else best_per_size(records)
        entries += distilled_students(chosen, {e["model_dir"].resolve(): e["name"] for e in entries})
    models = {e["name"]: BiEncoder.from_pretrained(e["model_dir"]) for e in entries}
    for e in entries:
        e["params_m"] = round(sum(p.numel() for p in models[e["name"]].parameters()) / 1e6, 2)
        e["max_length"] = models[e["name"]].max_length

    work = Path(tempfile.mkdtemp(prefix="bench-inference-"))
    int8_info = None
    try:
        if args.int8:
            source = Path(resolve_model(args.student))
            fp32_entry = next((e for e in entries if e["model_dir"].resolve() == source.resolve()), None)
            if fp32_entry is None:  # a directory that is neither a preset nor a distilled result: time it too
                name = str(source.resolve().relative_to(ROOT)) if source.resolve().is_relative_to(ROOT) else str(source)
                fp32_entry = {"name": name, "model_dir": source, "kind": "distilled", "sts7_avg": None,
                              "sts7_source": None}
                models[name] = BiEncoder.from_pretrained(source)
                fp32_entry["params_m"] = round(sum(p.numel() for p in models[name].parameters()) / 1e6, 2)
                fp32_entry["max_length"] = models[name].max_length
                entries.append(fp32_entry)
            # The student as a package ships it: its sentence-transformers directory and the ONNX files.
            export_dir = work / "export"
            BiEncoder.from_pretrained(source).save(export_dir)
            fp32_file, int8_file = export_onnx(export_dir, report=None)
            name = f"{fp32_entry['name']} onnx int8"
            models[name] = load_onnx(export_dir, int8_file["file"], threads=args.threads)
            int8_entry = {"name": name, "label": f"{fp32_entry.get('label', fp32_entry['name'])} onnx int8",
                          "model_dir": None, "kind": "int8", "params_m": fp32_entry["params_m"],
                          "max_length": fp32_entry["max_length"], "sts7_avg": None, "sts7_source": None,
                          "int8_file": int8_file["file"], "int8_file_mb": round(int8_file["bytes"] / 1e6, 1)}
            entries.append(int8_entry)
            int8_info = {"source": str(args.student), "fp32_model": fp32_entry["name"], "file": int8_file["file"],
                         "quantization": int8_file["quantization"],
                         "fp32_file_mb": round(fp32_file["bytes"] / 1e6, 1), "int8_file_mb": int8_entry["int8_file_mb"]}

        texts = sts_sentences(args.sentences)
        print(f"{len(models)} models, {len(texts)} STS sentences, batch {args.batch}, {args.threads} threads, "
              f"load {load_before}", flush=True)
        rates = measure_rates(models, texts, args.batch, args.rounds)
        for e in entries:
            e["sentences_per_s"] = {way: round(median(values), 1) for way, values in rates[e["name"]].items()}
            e["sentences_per_s_all"] = {way: [round(v, 1) for v in values] for way, values in rates[e["name"]].items()}

        if int8_info is not None and args.quality:
            int8_info.update(int8_quality(models[int8_entry["name"]], models[fp32_entry["name"]], fp32_entry,
                                          args.batch))
            int8_entry.update(sts7_avg=int8_info["int8_sts7_avg"], sts7_source="evaluated in this run")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    by_name = {e["name"]: e for e in entries}
    ours = by_name["minilm-l3"]["sentences_per_s"]["sorted"]
    keys = ("name", "label", "kind", "params_m", "max_length", "sentences_per_s", "sts7_avg", "sts7_source",
            "sentences_per_s_all", "int8_file", "int8_file_mb")
    table = [{key: e.get(key) for key in keys if key in e}
             | ({"model_dir": str(e["model_dir"])} if e.get("model_dir") else {}) for e in entries]
    record = {
        "bench": "inference",
        "inference_vs_minilm_l6": round(ours / by_name["minilm-l6"]["sentences_per_s"]["plain"], 3),
        "inference_vs_mpnet": round(ours / by_name["mpnet-base"]["sentences_per_s"]["plain"], 3),
        "batch": args.batch, "threads": args.threads, "rounds": args.rounds,
        "sentences": len(texts), "source": "STS12-16 + STS-B test sentences, seeded sample",
        "mean_tokens": round(float(np.mean(token_counts("minilm-l3", texts, 512))), 2),
        "models": table,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    if int8_info is not None:
        fp32_rate = by_name[int8_info["fp32_model"]]["sentences_per_s"]["sorted"]
        int8_rate = by_name[int8_entry["name"]]["sentences_per_s"]["sorted"]
        record["inference_int8_vs_fp32"] = round(int8_rate / fp32_rate, 3)
        for key in ("int8_sts7_avg", "fp32_sts7_avg", "sts7_avg_delta"):
            if key in int8_info:
                record[key] = int8_info[key]
        record["int8"] = int8_info

    print(f"\nencode, batch {args.batch}, {len(texts)} STS sentences, {args.threads} threads (medians of "
          f"{args.rounds} rounds)")
    print(f"{'model':<56}{'params M':>9}{'max len':>8}{'sorted/s':>10}{'plain/s':>9}{'7-STS':>7}")
    for e in entries:
        avg = f"{e['sts7_avg']:.2f}" if e.get("sts7_avg") is not None else "–"
        print(f"{e['name']:<56}{e['params_m']:>9.1f}{e['max_length']:>8}{e['sentences_per_s']['sorted']:>10.1f}"
              f"{e['sentences_per_s']['plain']:>9.1f}{avg:>7}")
    record = write_record(args.write, record, threads=args.threads, load_before=load_before)
    if args.plot is not None:
        subtitle = (f"batch {args.batch}, {args.threads} threads, {len(texts)} STS sentences, "
                    f"load {record['load_before']}-{record['load_after']}")
        if plot_speed_quality(table, args.plot, subtitle) is not None:
            print(f"wrote {args.plot}")
    print(json.dumps({k: record.get(k) for k in ("inference_vs_minilm_l6", "inference_vs_mpnet",
                                                 "inference_int8_vs_fp32", "int8_sts7_avg", "fp32_sts7_avg",
                                                 "load_before", "load_after")}))
    return record


if __name__ == "__main__":
    main()
