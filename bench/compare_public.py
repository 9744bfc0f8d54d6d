"""7-STS and encode speed of raydistill's students beside what a user would pick instead, measured on one machine.

Contract: one run writes ``--write`` (results/bench-compare_public.json): one row per model with its 7-STS average
(and the seven scores), where that number comes from, and its sentences/s, every rate measured in this run, in one
process, on the same sentences at the same thread count; then it draws docs/speed_quality.png from the rows it wrote.
``--plot-only`` redraws the picture from the committed file without measuring anything.

Rows (teacher: ``mpnet-base``, all-mpnet-base-v2 from its weight wheel):

    teacher      mpnet-base itself
    public       all-MiniLM-L6-v2 (``minilm-l6``), the small encoder most users take as it is
    raydistill   per student size (minilm-l3, bert-mini, bert-tiny), the committed students distilled from
                 mpnet-base on the whole ``mixed`` corpus that README's best-student table reports: the best STS-B
                 dev label-free and the best with NLI labels (``labels``: none / NLI; never chosen by a test set)
                 and the static student (``--student static``: a token table initialised as Model2Vec does, then
                 distilled), its best committed run by STS-B dev, with its corpus when not the whole ``mixed``
    st-mse       sentence-transformers' own distillation recipe (``jobs/st_mse.py``: MSELoss to the teacher's
                 vectors, same student, corpus and teacher), per size
    model2vec    Model2Vec's distillation of the same teacher directory (``model2vec.distill.distill``, its
                 defaults: every vocabulary token through the teacher, PCA to 256 dims, SIF weighting), made in this
                 run, offline, and evaluated here
    tokenlearn   Model2Vec's corpus-trained variant: not run (``skipped`` in the record says why: it needs the
                 teacher's vectors of the corpus, and this run's own teacher rate gives how long that pass takes here)

Quality. 7-STS = Spearman x 100 of the cosine on STS12-16, STS-B test and SICK-R test, averaged
(``raydistill.evaluation.evaluate_sts``). Teacher, all-MiniLM-L6-v2, the raydistill and st-mse students: from their
committed result files (``sts7_source``; only files git tracks). For each, ``evaluator_changes`` lists the files of
the evaluator and of the evaluation sets that differ between the commit that wrote it and this checkout (empty: the
same code and data), and a student trained on a ``mixed`` corpus larger than today's carries ``corpus_note``: it
predates the punctuation-blind evaluation-text filter (docs/data.md). Model2Vec: evaluated in this run by the same
``evaluate_sts`` through `StaticEncoder`.

Speed. The trained students' weights are not kept with the repository, and speed does not depend on weight values:
each student row is timed on a stand-in of the same shape (``speed_model``): its size's preset (minilm-l3 /
bert-mini / bert-tiny, the architectures the students were trained from) with the projection head the student has
(Linear(H -> P) + tanh, P from the result file's parameter count) and the truncation its checkpoint carries (the
``max_length`` bench/inference.py recorded when the checkpoint was on the machine, else the training
``max_length``). Transformer rows encode with ``BiEncoder.encode`` (length-sorted batches, inference mode, fp32),
Model2Vec with its own ``StaticModel.encode`` (in this process, no multiprocessing). ``--sentences`` STS sentences
(bench/common.py ``sts_sentences``), batch ``--batch``, ``--threads`` torch threads (the tokenizers' Rust threads are
their default, the machine's cores, for every row alike), ``--rounds`` rounds that go through every model in turn so
that load from other processes falls on all of them; in each round a model encodes the sample again until
``--min-seconds`` have passed (a static model encodes 256 sentences in milliseconds). Two rates, medians over the
rounds: sentences per wall second (what a user sees on an idle machine) and per CPU second of this process
(raydistill.cputime), which other processes on shared cores disturb far less: the picture's axis and the ratios
(``vs_teacher.speed_cpu``) the docs quote use it.

Model2Vec's environment. ``model2vec`` itself (StaticModel, encode) installs into the project's environment without
changing any installed version; its ``[distill]`` extra pins ``transformers<5.4`` (the project runs 5.24). By default
(``--m2v-env pinned``) the distillation runs in a virtual environment of its own (bench/common.py
``side_environment``), created on first use under ``~/.cache/raydistill/bench-venvs/``: the exact versions of
``M2V_PINS`` (what ``pip install model2vec[distill]`` resolves to), installed there with ``--no-deps`` before a
``.pth`` file layers the project's environment under them for everything else (torch, numpy, scikit-learn); the
record's ``model2vec`` entry gives the versions the distillation saw. It writes the static model to ``--m2v-dir``
(kept, under ``~/.cache/raydistill/compare_public/``), which this process loads with the project's ``model2vec``.
``--m2v-env project`` distils with the project's Python instead (model2vec and skeletoken installed beside
transformers 5.24, without the extra's pin), and ``--m2v-check-project`` does both and records the largest difference
between the two embedding tables.

    python bench/compare_public.py --write results/bench-compare_public.json
    python bench/compare_public.py --plot-only     # redraw docs/speed_quality.png from the committed file
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import (RESULTS, ROOT, load_average, median, set_threads, side_environment,  # before torch
                    sts_sentences, write_record)

import numpy as np

TEACHER = "mpnet-base"
SIZES = ("minilm-l3", "bert-mini", "bert-tiny")
RECORD = RESULTS / "bench-compare_public.json"
PLOT = ROOT / "docs" / "speed_quality.png"
# What `pip install model2vec[distill]==0.10.0` resolves to beside the project's packages (pip --dry-run).
M2V_PINS = ("model2vec==0.10.0", "skeletoken==0.6.1", "transformers==5.3.0", "tokenizers==0.22.2",
            "huggingface_hub==1.33.0", "httpx==0.28.1", "httpcore==1.0.9")
M2V_VENV_NAME = "model2vec-distill"  # under common.SIDE_ENVIRONMENTS
M2V_DIR = Path.home() / ".cache" / "raydistill" / "compare_public" / "model2vec-mpnet-base"
# The code and data a 7-STS number depends on: a committed score was computed by the same evaluator when none of
# these differ between the commit that wrote it and this checkout.
EVALUATOR_PATHS = ("raydistill/evaluation/sts.py", "raydistill/evaluation/metrics.py", "raydistill/data/readers.py",
                   "raydistill/data/registry.py", "raydistill/data/bundled")


# ----------------------------------------------------------------------------------------------------------------
# Model2Vec


class StaticEncoder:
    """A Model2Vec ``StaticModel`` behind the ``encode(texts, batch_size=...) -> [N, D]`` interface that
    ``evaluate_sts`` and the benches call: in this process (no multiprocessing pool), no progress bar."""

    def __init__(self, model):
        self.model = model

    @classmethod
    def load(cls, path: str | os.PathLike) -> "StaticEncoder":
        from model2vec import StaticModel

        path = Path(path)
        if not (path / "config.json").is_file():  # a name would send StaticModel to the Hugging Face hub
            raise FileNotFoundError(f"{path}: not a saved Model2Vec model (no config.json)")
        return cls(StaticModel.from_pretrained(str(path)))

    def encode(self, texts, batch_size: int = 128) -> np.ndarray:
        return self.model.encode(list(texts), batch_size=batch_size, show_progress_bar=False,
                                 use_multiprocessing=False)

    def parameters_m(self) -> float:
        return round(self.model.embedding.size / 1e6, 2)


# Run by the distillation environment's Python: argv = teacher directory, output directory, threads.
_DISTIL_SCRIPT = """
import json, sys, time
import torch
torch.set_num_threads(int(sys.argv[3]))
import huggingface_hub, model2vec, tokenizers, transformers
from model2vec.distill import distill
started, cpu_started = time.perf_counter(), time.process_time()
model = distill(sys.argv[1], device="cpu")
seconds, cpu = time.perf_counter() - started, time.process_time() - cpu_started
model.save_pretrained(sys.argv[2])
print("RESULT " + json.dumps({"distill_s": round(seconds, 1), "distill_cpu_s": round(cpu, 1),
      "versions": {m.__name__: m.__version__ for m in (model2vec, transformers, tokenizers, huggingface_hub, torch)},
      "python": sys.executable, "dim": int(model.embedding.shape[1]), "vocabulary": int(model.embedding.shape[0])}))
"""


def pinned_environment() -> Path:
    """The Python of the distillation environment (``M2V_PINS`` in front of the project's packages)."""
    return side_environment(M2V_VENV_NAME, M2V_PINS)


def distil(python: str | Path, teacher_dir: Path, out_dir: Path, threads: int) -> dict:
    """Model2Vec's distillation of ``teacher_dir`` by ``python`` into ``out_dir``; its timings and versions."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TQDM_DISABLE": "1"}
    done = subprocess.run([str(python), "-c", _DISTIL_SCRIPT, str(teacher_dir), str(out_dir), str(threads)],
                          env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"Model2Vec distillation with {python} failed:\n{done.stderr[-3000:]}")
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


# ----------------------------------------------------------------------------------------------------------------
# Committed quality numbers


def evaluator_changes(sha: str | None) -> list[str] | None:
    """Files of ``EVALUATOR_PATHS`` that differ between commit ``sha`` and this checkout (None: unknown commit)."""
    if not sha:
        return None
    done = subprocess.run(["git", "diff", "--name-only", sha.removesuffix("-dirty"), "--", *EVALUATOR_PATHS],
                          cwd=ROOT, capture_output=True, text=True)
    return sorted(done.stdout.split()) if done.returncode == 0 else None


# Run with a raydistill package on PYTHONPATH: the pairs of each evaluation set (argv), hashed.
_FINGERPRINT_SCRIPT = """
import hashlib, json, sys
from raydistill.data import load_dataset
out = {}
for name in sys.argv[1:]:
    digest, pairs = hashlib.sha256(), load_dataset(name)
    for p in pairs:
        digest.update(json.dumps([p.sentence1, p.sentence2, float(p.score)]).encode())
    out[name] = [len(pairs), digest.hexdigest()]
print("RESULT " + json.dumps(out))
"""


def evaluation_sets(sha: str | None, work: Path) -> dict | None:
    """{set: [pairs, sha256 of its pairs]} as the package at commit ``sha`` reads them (None: this checkout);
    ``git archive`` writes that commit's package to ``work``, read-only for the repository."""
    from raydistill.evaluation.sts import STS_SETS

    root = ROOT
    if sha is not None:
        root = work / sha
        if not root.is_dir():
            root.mkdir(parents=True)
            archive = subprocess.run(["git", "archive", sha.removesuffix("-dirty"), "raydistill"], cwd=ROOT,
                                     capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-c", _FINGERPRINT_SCRIPT, *dict.fromkeys(STS_SETS.values())], cwd=root,
                          env=env, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"  could not read the evaluation sets at {sha}: {done.stderr[-500:]}", flush=True)
        return None
    return json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])


def mixed_corpus_size() -> int:
    from raydistill.data.corpus import mixed_corpus_counts

    return mixed_corpus_counts()["total"]


def corpus_note(trained_on: int, corpus_now: int) -> str:
    return (f"trained on {trained_on:,} mixed sentences, before the punctuation-blind evaluation-text filter (the "
            f"corpus is {corpus_now:,} now); not rerun")


def tokenlearn_skipped(teacher: dict, corpus_now: int) -> str:
    """Why the corpus-trained Model2Vec was not run, from the teacher's rates in this run."""
    cpu_hours, half_hour = corpus_now / teacher["cpu"] / 3600, int(teacher["cpu"] * 1800)
    return (f"needs the teacher's vectors of the corpus it trains on: mpnet-base encodes {teacher['cpu']:.1f} "
            f"sentences per CPU second in this run ({teacher['wall']:.1f} per wall second under the run's load), so "
            f"the {corpus_now:,}-sentence mixed corpus is ~{cpu_hours:.1f} CPU hours of teacher time here, and the "
            f"~{half_hour:,} sentences 30 CPU minutes buy are {half_hour / 1e4:.1f} % of the ~1M texts Model2Vec's "
            "own corpus-trained (POTION) models learn from: a result on them would not stand for tokenlearn")


def committed_rows(records: list[dict], corpus_now: int, work: Path) -> list[dict]:
    """The rows whose 7-STS comes from a committed result file, each with its provenance checks: the evaluator's
    files changed since the commit that wrote it and, when some did, whether that commit's package reads the same
    evaluation pairs as this checkout (``evaluation_sets_same``)."""
    from raydistill.models import resolve_model
    from scripts.readme_tables import (LABELLED_STAGES, STS7, _dev, _label_free_students, _raydistill_students,
                                       at_scale)

    now = evaluation_sets(None, work)

    def row(record: dict, scores: dict | None = None, **fields) -> dict:
        scores = record["scores"] if scores is None else scores
        missing = [name for name in STS7 if name not in scores]
        if missing or abs(np.mean([scores[name] for name in STS7]) - scores["avg"]) > 0.01:
            raise ValueError(f"results/{record['_file']}: not a 7-STS average of {', '.join(STS7)}")
        out = {**fields, "sts7_avg": scores["avg"], "sts7": {name: scores[name] for name in STS7},
               "sts7_source": f"results/{record['_file']}", "result_git_sha": record.get("git_sha"),
               "evaluator_changes": evaluator_changes(record.get("git_sha"))}
        if out["evaluator_changes"]:
            then = evaluation_sets(record["git_sha"], work)
            out["evaluation_sets_same"] = None if then is None or now is None else then == now
        trained_on = (record.get("training") or {}).get("sentences")
        if trained_on and (record.get("training") or {}).get("corpus") == "mixed" and trained_on != corpus_now:
            out["corpus_note"] = corpus_note(trained_on, corpus_now)
        return out

    baselines = {r["model"]: r for r in records if r["kind"] == "baseline" and r.get("encoder", "bi") == "bi"}
    teacher_dim = json.loads((Path(resolve_model(TEACHER)) / "config.json").read_text())["hidden_size"]
    rows = [row(baselines[TEACHER], name=TEACHER, label="all-mpnet-base-v2 (teacher)", family="teacher",
                speed_model={"preset": TEACHER}),
            row(baselines["minilm-l6"], name="minilm-l6", label="all-MiniLM-L6-v2", family="public",
                speed_model={"preset": "minilm-l6"})]
    scale = [r for r in records if at_scale(r) and r.get("teacher") == TEACHER]
    for size in SIZES:
        # What README's best-student table picks: by STS-B dev, label-free and with NLI labels apart.
        label_free = [(method, scores, r) for method, scores, r in _label_free_students(scale, size)]
        supervised = [(r.get("method", "?"), r["scores"], r) for r in _raydistill_students(scale)
                      if r["model"] == size and any(stage.get("method") in LABELLED_STAGES
                                                    for stage in (r.get("training") or {}).get("stages") or [])]
        library = [(r.get("method", "?"), r["scores"], r) for r in scale
                   if r["model"] == size and r.get("method") == "st-mse"]
        for family, labels, found in (("raydistill", "none", label_free), ("raydistill", "NLI", supervised),
                                      ("st-mse", "none", library)):
            if not found:
                print(f"  no committed {family} student of {size} ({labels} labels) from {TEACHER} on the whole "
                      "corpus", flush=True)
                continue
            method, scores, best = max(found, key=lambda item: _dev(item[1]))
            suffix = " + NLI" if labels == "NLI" else ""
            rows.append(row(best, scores, name=f"{family} {size}{suffix.replace(' + ', ' ').lower()}",
                            label=f"{method} {size}{suffix}", family=family, method=method, labels=labels,
                            speed_model=stand_in(best, size, teacher_dim)))
    # The static student (a token table, raydistill.models.static_embedding): its best label-free run from the
    # teacher by STS-B dev, on whatever corpus it had (said in corpus_note when not the whole mixed corpus).
    static = [r for r in records if str(r.get("model", "")).startswith("static") and r.get("teacher") == TEACHER
              and r.get("kind") != "baseline"]
    if static:
        best = max(static, key=lambda r: _dev(r["scores"]))
        training = best.get("training") or {}
        out = row(best, name="raydistill static", label=f"{best.get('method', '?')} static", family="raydistill",
                  method=best.get("method"), labels="none",
                  speed_model={"static_student": best["model"], "projection_dim": teacher_dim,
                               "note": f"{best['model']} from {TEACHER} with its linear head into {teacher_dim} dims "
                                       "folded into the table, as the trained student saves; speed does not depend "
                                       "on the weights"})
        if not at_scale(best):
            out["corpus_note"] = (f"trained on {training.get('sentences')} sentences of {training.get('corpus')}, "
                                  "not the whole mixed corpus")
        rows.append(out)
    return rows


def static_stand_in(spec: dict, work: Path):
    """A static student of the trained one's shape: its table from the teacher, the head folded in by ``save``."""
    from raydistill.models import BiEncoder, resolve_model

    initial = BiEncoder.from_pretrained(str(resolve_model(spec["static_student"], teacher=TEACHER)),
                                        projection_dim=spec["projection_dim"], projection_activation="identity")
    initial.save(work / "static-stand-in")
    return BiEncoder.from_pretrained(str(work / "static-stand-in"))


def stand_in(record: dict, size: str, teacher_dim: int) -> dict:
    """The model a student's speed is measured on: its preset, its projection head, its checkpoint's truncation."""
    from raydistill.models import BiEncoder

    preset = BiEncoder.from_pretrained(size)
    hidden = preset.transformer.config.hidden_size
    extra = round(record["params_m"] * 1e6) - sum(p.numel() for p in preset.parameters())
    projection = None
    if abs(extra) > 1000:  # params_m is rounded to 1,000 parameters: more is a head
        # Students get a projection into the teacher's space (Linear(H -> d_T) with bias) when they are narrower.
        projection = teacher_dim
        if abs(teacher_dim * (hidden + 1) - extra) > 1000:
            raise ValueError(f"results/{record['_file']}: {record['params_m']} M parameters is neither {size} nor "
                             f"{size} + Linear({hidden} -> {teacher_dim})")
    max_length, length_source = (record.get("training") or {}).get("max_length"), "training max_length"
    inference = RESULTS / "bench-inference.json"
    if inference.is_file():
        for model in json.loads(inference.read_text()).get("models", []):
            if model.get("sts7_source") == f"results/{record['_file']}" and model.get("max_length"):
                max_length, length_source = model["max_length"], "its checkpoint (results/bench-inference.json)"
    return {"preset": size, "projection_dim": projection, "max_length": max_length, "max_length_from": length_source,
            "note": f"same shape as the trained student: the {size} preset"
                    + (f" + Linear({hidden} -> {projection}) + tanh" if projection else "")
                    + f", max_length {max_length}; speed does not depend on the weights"}


# ----------------------------------------------------------------------------------------------------------------
# Timing


def rates_once(model, texts: list[str], batch: int, min_seconds: float) -> tuple[float, float]:
    """(sentences per wall second, per CPU second) of encoding ``texts`` again until ``min_seconds`` have passed."""
    from raydistill.cputime import cpu_seconds

    done, started, cpu_started = 0, time.perf_counter(), cpu_seconds()
    while True:
        model.encode(texts, batch_size=batch)
        done += len(texts)
        elapsed = time.perf_counter() - started
        if elapsed >= min_seconds:
            return done / elapsed, done / max(cpu_seconds() - cpu_started, 1e-9)


def measure(models: dict, texts: list[str], batch: int, rounds: int, min_seconds: float) -> dict[str, dict]:
    for model in models.values():
        model.encode(texts[:batch], batch_size=batch)  # warm-up: first-call allocations, kernels, tokenizer caches
    rates = {name: {"wall": [], "cpu": []} for name in models}
    for round_index in range(rounds):
        for name, model in models.items():
            wall, cpu = rates_once(model, texts, batch, min_seconds)
            rates[name]["wall"].append(wall)
            rates[name]["cpu"].append(cpu)
            print(f"  round {round_index + 1} {name}: {wall:.1f}/s, {cpu:.1f}/CPU s (load {load_average()})",
                  flush=True)
    return rates


# ----------------------------------------------------------------------------------------------------------------
# Picture

FAMILY_STYLE = {"teacher": ("tab:blue", "s"), "public": ("tab:blue", "o"), "raydistill": ("tab:orange", "o"),
                "st-mse": ("tab:purple", "v"), "model2vec": ("tab:green", "D")}
FAMILY_LEGEND = {"teacher": "teacher (all-mpnet-base-v2)", "public": "all-MiniLM-L6-v2",
                 "raydistill": "raydistill students", "st-mse": "sentence-transformers MSE recipe",
                 "model2vec": "Model2Vec (static)"}


STALE_MARK = " †"


def point_labels(record: dict) -> dict[str, str]:
    """Each row's label in the picture. A student whose result file a rerun replaced since keeps the point that was
    measured, marked, as docs/benchmarks.md footnotes it: the picture never passes an old score off as the file's."""
    from scripts.readme_tables import result_file_changed_since

    return {r["name"]: r["label"] + (STALE_MARK if result_file_changed_since(r) else "") for r in record["models"]}


def plot(record: dict, path: Path) -> Path | None:
    """Sentences per CPU second (log x) against the 7-STS average, one labelled point per row with both."""
    from raydistill.evaluation.plots import _save

    drawn = draw(record)
    if drawn is None:
        return None
    plt, fig, _, _ = drawn
    return _save(fig, plt, path)


def draw(record: dict):
    """``(pyplot, figure, axes, label boxes)`` of the picture, or None when no row has both numbers."""
    from raydistill.evaluation.plots import _pyplot

    rows = [r for r in record["models"] if r.get("sts7_avg") is not None and r.get("sentences_per_s")]
    if not rows:
        return None
    labels = point_labels(record)
    stale = any(label.endswith(STALE_MARK) for label in labels.values())
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    for family, (colour, marker) in FAMILY_STYLE.items():
        chosen = [r for r in rows if r["family"] == family]
        if chosen:
            ax.scatter([r["sentences_per_s"]["cpu"] for r in chosen], [r["sts7_avg"] for r in chosen],
                       color=colour, marker=marker, label=FAMILY_LEGEND[family], zorder=3)
    ax.set_xscale("log")
    low, high = ax.get_xlim()
    ax.set_xlim(low / 1.3, high * 4)  # room for the labels right of the points
    ax.margins(y=0.1)
    ax.set_xlabel(f"encode sentences per CPU second (batch {record['batch']}, {record['threads']} threads, log scale)")
    ax.set_ylabel("7-STS average (Spearman x 100)")
    ax.set_title("speed vs quality: raydistill's students and the alternatives, teacher all-mpnet-base-v2\n"
                 f"{record['sentences']} STS sentences, {record['machine']['cpu']}, load "
                 f"{record['load_before']}-{record['load_after']}"
                 + (f"\n† 7-STS of the run measured on {record.get('date', '?')[:10]}; its result file was rerun since "
                    "(docs/benchmarks.md)" if stale else ""), fontsize=9)
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    boxes = _place_labels(fig, ax, [((r["sentences_per_s"]["cpu"], r["sts7_avg"]), labels[r["name"]]) for r in rows])
    ax.grid(True, which="both", alpha=0.3)
    return plt, fig, ax, boxes


# Where a label may go beside its point (offset in points, horizontal alignment), in the order tried.
LABEL_SPOTS = (((5, 4), "left"), ((5, -10), "left"), ((-5, 4), "right"), ((-5, -10), "right"), ((5, 12), "left"),
               ((5, -18), "left"))


def _place_labels(fig, ax, points: list[tuple[tuple[float, float], str]]) -> list:
    """Each label at the first spot beside its point where it overlaps no label placed before it, no point and
    nothing outside the axes (else at the first spot); points from the highest score down, as read. Returns the
    labels' boxes (display coordinates)."""
    renderer = fig.canvas.get_renderer()
    markers = [ax.transData.transform(xy) for xy, _ in points]
    frame = ax.get_window_extent(renderer)
    taken = []
    for xy, text in sorted(points, key=lambda p: -p[0][1]):
        for offset, align in LABEL_SPOTS:
            note = ax.annotate(text, xy, fontsize=7.5, textcoords="offset points", xytext=offset, ha=align)
            box = note.get_window_extent(renderer).padded(1)
            inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
            if inside and not any(box.overlaps(other) for other in taken) and not any(
                    box.contains(mx, my) for mx, my in markers):
                break
            note.remove()
        else:  # no free spot: the first one
            offset, align = LABEL_SPOTS[0]
            note = ax.annotate(text, xy, fontsize=7.5, textcoords="offset points", xytext=offset, ha=align)
            box = note.get_window_extent(renderer).padded(1)
        taken.append(box)
    return taken


# ----------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="passes over all models; medians")
    parser.add_argument("--min-seconds", type=float, default=1.0, help="least time one model encodes per round")
    parser.add_argument("--m2v-env", choices=("pinned", "project"), default="pinned",
                        help="where Model2Vec distils: its own pinned environment, or this one")
    parser.add_argument("--m2v-check-project", action="store_true",
                        help="also distil in this environment and record the difference between the two tables")
    parser.add_argument("--m2v-dir", type=Path, default=M2V_DIR, help="where the distilled static model is kept")
    parser.add_argument("--uncommitted", action="store_true", help="also read result files git does not track")
    parser.add_argument("--write", type=Path, default=None, help=f"e.g. {RESULTS.name}/{RECORD.name}")
    parser.add_argument("--plot", type=Path, default=PLOT, help="picture drawn from the record when it is written")
    parser.add_argument("--plot-only", action="store_true", help=f"redraw --plot from {RECORD.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    if args.plot_only:
        record = json.loads(RECORD.read_text())
        print(f"wrote {plot(record, args.plot)}")
        return None
    import importlib.util

    if importlib.util.find_spec("model2vec") is None:  # needed to load the distilled table: say so before distilling
        parser.error("model2vec is not installed in this environment: pip install -e '.[compare]' (it loads the "
                     "static model the pinned environment distils)")
    set_threads(args.threads)
    load_before = load_average()
    started = time.perf_counter()

    from inference import result_records

    from raydistill.evaluation import evaluate_sts
    from raydistill.models import BiEncoder, resolve_model

    teacher_dir = Path(resolve_model(TEACHER))
    corpus_now = mixed_corpus_size()
    work = Path(tempfile.mkdtemp(prefix="compare_public-"))
    try:
        rows = committed_rows(result_records(args.uncommitted), corpus_now, work / "evaluation-sets")
        m2v_dir = args.m2v_dir
        shutil.rmtree(m2v_dir, ignore_errors=True)
        python = pinned_environment() if args.m2v_env == "pinned" else Path(sys.executable)
        print(f"Model2Vec distillation of {teacher_dir} with {python}", flush=True)
        m2v = {"environment": args.m2v_env, **distil(python, teacher_dir, m2v_dir, args.threads),
               "pins": list(M2V_PINS) if args.m2v_env == "pinned" else None}
        print(f"  {m2v['distill_s']} s, versions {m2v['versions']}", flush=True)
        static = StaticEncoder.load(m2v_dir)
        if args.m2v_check_project:
            other_env = "project" if args.m2v_env == "pinned" else "pinned"
            other_python = Path(sys.executable) if other_env == "project" else pinned_environment()
            other = distil(other_python, teacher_dir, work / "model2vec-other", args.threads)
            table = np.asarray(static.model.embedding, dtype=np.float32)
            other_table = np.asarray(StaticEncoder.load(work / "model2vec-other").model.embedding, dtype=np.float32)
            m2v["check"] = {"environment": other_env, "versions": other["versions"],
                            "distill_s": other["distill_s"], "same_shape": table.shape == other_table.shape,
                            "max_abs_difference": (float(np.abs(table - other_table).max())
                                                   if table.shape == other_table.shape else None)}
            print(f"  check in the {other_env} environment: {m2v['check']}", flush=True)
        m2v_started = time.perf_counter()
        scores = evaluate_sts(static, sets=list(rows[0]["sts7"]), batch_size=args.batch, progress=False)
        m2v["eval_s"] = round(time.perf_counter() - m2v_started, 1)
        rows.append({"name": "model2vec mpnet-base", "label": "Model2Vec (mpnet-base, 256-d)", "family": "model2vec",
                     "sts7_avg": round(scores["avg"], 2),
                     "sts7": {k: round(v, 2) for k, v in scores.items() if k != "avg"},
                     "sts7_source": "evaluated in this run (raydistill.evaluation.evaluate_sts)",
                     "speed_model": {"static": True, "dim": m2v["dim"], "vocabulary": m2v["vocabulary"]}})
        print(f"  Model2Vec 7-STS {scores['avg']:.2f} ({m2v['eval_s']} s)", flush=True)

        models: dict = {}
        for r in rows:
            spec = r["speed_model"]
            if spec.get("static"):
                models[r["name"]] = static
            elif spec.get("static_student"):
                models[r["name"]] = static_stand_in(spec, work)
            else:
                models[r["name"]] = BiEncoder.from_pretrained(spec["preset"], projection_dim=spec.get("projection_dim"),
                                                              max_length=spec.get("max_length"))
            model = models[r["name"]]
            r["params_m"] = (model.parameters_m() if isinstance(model, StaticEncoder)
                             else round(sum(p.numel() for p in model.parameters()) / 1e6, 2))
            r["max_length"] = None if isinstance(model, StaticEncoder) else model.max_length
        texts = sts_sentences(args.sentences)
        print(f"{len(models)} models, {len(texts)} STS sentences, batch {args.batch}, {args.threads} threads, "
              f"load {load_before}", flush=True)
        rates = measure(models, texts, args.batch, args.rounds, args.min_seconds)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    for r in rows:
        r["sentences_per_s"] = {way: round(median(values), 1) for way, values in rates[r["name"]].items()}
        r["sentences_per_s_all"] = {way: [round(v, 1) for v in values] for way, values in rates[r["name"]].items()}
    teacher_rate = rows[0]["sentences_per_s"]["wall"]
    for r in rows:
        r["vs_teacher"] = {"speed": round(r["sentences_per_s"]["wall"] / teacher_rate, 2),
                           "speed_cpu": round(r["sentences_per_s"]["cpu"] / rows[0]["sentences_per_s"]["cpu"], 2),
                           "sts7": round(r["sts7_avg"] - rows[0]["sts7_avg"], 2)}
    record = {
        "bench": "compare_public",
        "teacher": TEACHER,
        "batch": args.batch, "threads": args.threads, "rounds": args.rounds, "min_seconds": args.min_seconds,
        "sentences": len(texts), "source": "sts_sentences (STS12-16 + STS-B test, seed 0)",
        "models": rows,
        "model2vec": m2v,
        "skipped": {"tokenlearn": tokenlearn_skipped(rows[0]["sentences_per_s"], corpus_now)},
        "wall_s": round(time.perf_counter() - started, 1),
    }
    print(f"\n{'model':<24}{'params M':>9}{'max len':>8}{'sent/s':>9}{'/CPU s':>9}{'7-STS':>7}  source")
    for r in rows:
        print(f"{r['name']:<24}{r['params_m']:>9.2f}{str(r['max_length']):>8}{r['sentences_per_s']['wall']:>9.1f}"
              f"{r['sentences_per_s']['cpu']:>9.1f}{r['sts7_avg']:>7.2f}  {r['sts7_source']}")
    record = write_record(args.write, record, threads=args.threads, load_before=load_before)
    if args.write is not None and plot(record, args.plot) is not None:
        print(f"wrote {args.plot}")
    return record


if __name__ == "__main__":
    main()
