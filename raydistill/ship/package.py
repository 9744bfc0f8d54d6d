"""From a trained student to the directory a user ships: ``package_student`` (the last step of ``raydistill distill``).

Contract: ``package_student(student_dir, out_dir, ...)`` leaves in ``out_dir``

    the student, a sentence-transformers directory   ``SentenceTransformer(out_dir)`` loads it (``BiEncoder.save``)
    onnx/model.onnx                                   the transformer in fp32, sentence-transformers' ONNX layout
    onnx/model_<weights>_<cpu>.onnx                   its dynamic int8 variant for this CPU (raydistill.models.export)
    README.md                                         a sentence-transformers model card (raydistill.ship.card)
    raydistill_package.json                           every number of the card and the table, with provenance

A static student (``BiEncoder.is_static``: a token table, raydistill.models.static_embedding) is packaged without
``onnx/`` (the manifest's ``onnx`` says why: `STATIC_NO_ONNX`): its directory is the Model2Vec layout, which
sentence-transformers (StaticEmbedding) and ``model2vec.StaticModel`` both load; its ``model.static`` records the
table's width, vocabulary and tokenizer.

It returns a `PackageReport` whose ``table`` the command prints last: the teacher, the student and each export with
its quality (7-STS average, STS-B dev and, with ``eval_pairs``, the user's own labelled pairs; Spearman x 100) and
encode speed, all measured in this process on the same sentences at the same thread count. An export more than
``quality_margin`` points below the student on a quality column is marked there and in the card; one whose
sentences per CPU second are not above the torch student's is "not faster here" (``Row.faster_here`` False), and
``raydistill serve`` does not choose it by default.

``out_dir`` is built in a staging sibling and swapped in whole (``fileio.staged_directory``): a failure at any point
leaves the earlier package (or nothing), never a half-written export. A directory that holds anything but an earlier
package is refused (`check_out_dir`), not replaced; the command calls it, and `read_eval_pairs`, before training, so
a bad ``DIR`` or pairs file fails in seconds rather than hours.

Scores reused, not computed again: a preset teacher on the bundled sets has its committed baseline's
(`TEACHER_BASELINES`: the 110M mpnet-base would take ~25 min on two cores; it is still timed); any other teacher, or
data under ``$RAYDISTILL_DATA``, is evaluated once per set content (`score_teacher`); the student's 7-STS and STS-B
dev come from ``student_scores`` when the caller passes the training job's evaluation of this very directory.

Speed is that of the runner ``raydistill serve`` runs (`SPEED_PIPELINE`; bench/export_speed.py also times
sentence-transformers' ONNX backend, another pipeline): ``speed_sentences`` distinct STS sentences, batch
``speed_batch``, ``speed_rounds`` interleaved rounds after an untimed warm-up each (`measure_speed`), medians per wall
second (what a user sees) and per CPU second of this process (the steadier on shared cores), ONNX sessions on torch's
thread count. The manifest's ``speed`` names the pipeline and the CPU's instruction set (`cpu_instruction_set`), on
which int8's gain depends."""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from raydistill.cputime import cpu_seconds
from raydistill.data import BUNDLED_DIR, DATA_ENV, Pair, dataset_path, load_dataset
from raydistill.data.scored_pairs import read_eval_pairs  # re-exported: the command checks the pairs before training
from raydistill.evaluation import (DEV_SET, PAIR_METRIC_NAMES, STS7, STS_SETS, pair_metric, pair_similarities,
                                   score_pairs, spearman)

__all__ = ["PackageError", "PackageReport", "Row", "TEACHER_BASELINES", "QUALITY_COLUMNS", "DEFAULT_MARGIN",
           "MANIFEST_FILE", "STATIC_NO_ONNX", "SPEED_PIPELINE", "NOT_FASTER", "check_out_dir", "read_eval_pairs",
           "package_student", "mark_rows", "mark_speed", "format_table", "cpu_instruction_set"]

MANIFEST_FILE = "raydistill_package.json"
CARD_FILE = "README.md"
EVAL_PAIRS = "eval_pairs"
# Spearman x 100 points. int8 exports of the presets lose 0.06-0.21 on STS-B dev (results/bench-export_speed.json);
# half a point is more than a dynamic-int8 rounding costs and less than what separates two recipes in docs/results.md.
DEFAULT_MARGIN = 0.5
# Column key, header. "avg" is the mean of the seven STS sets; the user's pairs only when given.
QUALITY_COLUMNS = (("avg", "7-STS"), (DEV_SET, "STS-B dev"), (EVAL_PAIRS, "own pairs"))

# results/baseline-<preset>.json "scores" (raydistill eval --model <preset>, the bundled sets, the preset's own
# max_length and pooling). Embedded, not read, because an installed raydistill has no results/ folder.
TEACHER_BASELINES: dict[str, dict[str, float]] = {
    "mpnet-base": {"sts12": 72.63, "sts13": 83.49, "sts14": 78.01, "sts15": 85.65, "sts16": 80.02, "stsb": 83.42,
                   "sickr": 80.48, "avg": 80.53, "stsb_dev": 88.11},
    "minilm-l6": {"sts12": 72.37, "sts13": 80.6, "sts14": 75.6, "sts15": 85.4, "sts16": 78.99, "stsb": 82.03,
                  "sickr": 77.15, "avg": 78.88, "stsb_dev": 86.72},
    "minilm-l3": {"sts12": 67.07, "sts13": 78.33, "sts14": 72.29, "sts15": 82.82, "sts16": 78.74, "stsb": 79.05,
                  "sickr": 69.12, "avg": 75.34, "stsb_dev": 84.21},
    "bert-mini": {"sts12": 65.1, "sts13": 75.9, "sts14": 69.5, "sts15": 79.49, "sts16": 76.35, "stsb": 74.58,
                  "sickr": 68.09, "avg": 72.72, "stsb_dev": 80.62},
    "bert-tiny": {"sts12": 54.65, "sts13": 70.03, "sts14": 61.01, "sts15": 73.27, "sts16": 64.65, "stsb": 62.09,
                  "sickr": 64.39, "avg": 64.3, "stsb_dev": 72.46},
}
SPEED_SETS = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb")
# Why a static student ships without ONNX files. Its whole computation is a row lookup and a mean, so the graph would
# be one Gather; and nothing a user loads it with would run one: sentence-transformers runs its StaticEmbedding module
# in torch under every backend (StaticEmbedding.load takes no backend), and Model2Vec reads model.safetensors.
STATIC_NO_ONNX = ("a static model is a table lookup: ONNX adds nothing here (sentence-transformers runs "
                  "StaticEmbedding in torch under every backend, and Model2Vec reads model.safetensors)")
# What the speed columns time, for the table's footer, the card and the manifest.
SPEED_PIPELINE = ("raydistill's own runner, as raydistill serve runs it: the torch rows through BiEncoder.encode, "
                  "each export through raydistill.models.export.load_onnx (an ONNX Runtime session behind the same "
                  "tokenizer, pooling and projection in Python); sentence-transformers' ONNX backend is another "
                  "pipeline and can be slower or faster on the same files")
# ... and when there is no export to time (a static student): the torch models alone.
TORCH_PIPELINE = "raydistill's own runner, as raydistill serve runs it: BiEncoder.encode in torch"
NOT_FASTER = "not faster here"


class PackageError(ValueError):
    """An output directory package_student must not replace; the message names it and what to do."""


@dataclass
class Row:
    """One line of the table: the teacher, the student or an export of it. ``scores``: Spearman x 100 per STS set,
    ``avg``, ``stsb_dev`` and, when given, ``eval_pairs``; ``marked``: `mark_rows`; ``faster_here``: `mark_speed`."""

    name: str
    kind: str  # "teacher" | "student" | "export"
    file: str | None  # relative to the package directory (the teacher's: its name or path)
    bytes: int | None
    scores: dict[str, float]
    scores_source: str
    sentences_per_s: float
    sentences_per_cpu_s: float
    load: str  # how a user loads it (Python)
    marked: list[str] = field(default_factory=list)
    faster_here: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class PackageReport:
    out_dir: Path
    card_path: Path
    rows: list[Row]
    table: str
    margin: float
    manifest: dict[str, Any]


def check_out_dir(out_dir: str | os.PathLike) -> Path:
    """``out_dir`` if package_student may write it: missing, empty, or an earlier package (it has the manifest)."""
    out = Path(out_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise PackageError(f"{out}: exists and is not a directory; pick another output directory")
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST_FILE).is_file():
        raise PackageError(f"{out}: not empty and not an earlier raydistill package (no {MANIFEST_FILE}); it would "
                           "be replaced whole, so pick a new or empty directory")
    return out


def _bundled_evaluation() -> bool:
    """Whether every set the table scores is read from the bundled copy (not a $RAYDISTILL_DATA one)."""
    return all(dataset_path(STS_SETS[name]).is_relative_to(BUNDLED_DIR) for name in (*STS7, DEV_SET))


def _job_scores(student_scores: tuple[dict[str, float], str] | None) -> tuple[dict[str, float] | None, str]:
    """``(scores, source)`` of the student from its training job when they can stand for scoring it here."""
    scores, source = student_scores or ({}, "")
    wanted = (*STS7, "avg", DEV_SET)
    if not scores or not _bundled_evaluation() or not all(isinstance(scores.get(key), (int, float)) for key in wanted):
        return None, ""
    return {name: float(scores[name]) for name in wanted}, f"{source} (the training job's evaluation)"


def teacher_baseline(teacher: str) -> dict[str, float] | None:
    """The committed scores of a preset teacher, when the evaluation data is the bundled data they were taken on."""
    scores = TEACHER_BASELINES.get(str(teacher))
    return dict(scores) if scores is not None and _bundled_evaluation() else None


def speed_sentences(count: int, seed: int = 0) -> list[str]:
    """``count`` distinct sentences of STS12-16 and STS-B test in a seeded order (bench/common.py's sample)."""
    texts = list(dict.fromkeys(text for name in SPEED_SETS for pair in load_dataset(STS_SETS[name])
                               for text in (pair.sentence1, pair.sentence2)))
    return [texts[i] for i in np.random.default_rng(seed).permutation(len(texts))[:count]]


def measure_speed(models: dict[str, Any], sentences: list[str], *, batch_size: int, rounds: int
                  ) -> dict[str, tuple[float, float]]:
    """{name: (sentences per wall second, per CPU second)}, medians over ``rounds`` interleaved rounds."""
    for model in models.values():
        model.encode(sentences, batch_size=batch_size)  # warm-up: first-call allocations, ONNX Runtime's plans
    wall: dict[str, list[float]] = {name: [] for name in models}
    cpu: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(rounds):
        for name, model in models.items():
            started, cpu_started = time.perf_counter(), cpu_seconds()
            model.encode(sentences, batch_size=batch_size)
            wall[name].append(time.perf_counter() - started)
            cpu[name].append(cpu_seconds() - cpu_started)
    return {name: (len(sentences) / max(float(np.median(wall[name])), 1e-9),
                   len(sentences) / max(float(np.median(cpu[name])), 1e-9)) for name in models}


def evaluation_pairs(eval_pairs: list[Pair] | None, *, sts: bool = True) -> dict[str, Sequence[Pair]]:
    sets: dict[str, Sequence[Pair]] = {name: load_dataset(STS_SETS[name]) for name in (*STS7, DEV_SET)} if sts else {}
    return sets if eval_pairs is None else {**sets, EVAL_PAIRS: eval_pairs}


def score_model(model: Any, sets: dict[str, Sequence[Pair]], batch_size: int) -> dict[str, float]:
    """Spearman x 100 of each set (one encoder pass over all their distinct sentences), and the 7-STS ``avg``; the
    user's own pairs (``EVAL_PAIRS``) with ``pair_metric``'s metric: ROC AUC x 100 of 0/1 labels."""
    similarities = pair_similarities(model, sets, encoder="bi", batch_size=batch_size)
    scores = {name: (score_pairs if name == EVAL_PAIRS else spearman)(
                  similarities[name], np.array([p.score for p in pairs], dtype=np.float64))
              for name, pairs in sets.items()}
    if all(name in scores for name in STS7):
        scores["avg"] = float(np.mean([scores[name] for name in STS7]))
    return {name: round(float(value), 2) for name, value in scores.items()}


def set_digest(pairs: Sequence[Pair]) -> str:
    """sha256 (16 hex) of a pair set's texts and gold scores, in order: a set is the same set wherever it is read."""
    digest = hashlib.sha256()
    for pair in pairs:
        digest.update(f"{pair.sentence1}\0{pair.sentence2}\0{float(pair.score)!r}\n".encode())
    return digest.hexdigest()[:16]


def score_teacher(teacher: str, model: Any, sets: dict[str, Sequence[Pair]], batch_size: int, *,
                  cache_dir: Path | None = None) -> tuple[dict[str, float], list[str]]:
    """``(scores, reused)``: `score_model`'s scores of the teacher, with the sets scored before reused.

    A teacher's score of a set depends only on its weights and the set, so each is kept in ``<cache_dir>/<teacher
    fingerprint (teacher_identity: the files' bytes)>.json`` under the set's `set_digest`; ``reused`` names those."""
    from raydistill.config.job import raydistill_home
    from raydistill.fileio import atomic_write_json
    from raydistill.runtime.teachers.teacher import teacher_identity

    path = (cache_dir or raydistill_home() / "teacher-scores") / f"{teacher_identity(teacher)}.json"
    known: dict[str, float] = json.loads(path.read_text()) if path.is_file() else {}
    digests = {name: set_digest(pairs) for name, pairs in sets.items()}
    missing = {name: pairs for name, pairs in sets.items() if digests[name] not in known}
    if missing:
        measured = score_model(model, missing, batch_size)
        known.update({digests[name]: measured[name] for name in missing})
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, known)
    scores = {name: float(known[digests[name]]) for name in sets}
    if all(name in scores for name in STS7):
        scores["avg"] = round(float(np.mean([scores[name] for name in STS7])), 2)
    return scores, [name for name in sets if name not in missing]


def mark_rows(rows: list[Row], margin: float) -> list[Row]:
    """Set each export's ``marked``: the quality columns where it is more than ``margin`` below the student's."""
    student = next(row for row in rows if row.kind == "student")
    for row in rows:
        pairs = [(key, row.scores.get(key), student.scores.get(key)) for key, _ in QUALITY_COLUMNS]
        # On the two decimals shown, so the table never marks a difference it does not show.
        row.marked = [key for key, mine, reference in pairs if row.kind == "export" and mine is not None
                      and reference is not None and round(reference - mine, 2) > margin]
    return rows


def mark_speed(rows: list[Row]) -> list[Row]:
    """Set each export's ``faster_here``: its sentences per CPU second above the student's on the rates shown (one
    decimal, so the table never calls faster a difference it does not show); CPU seconds disturb least."""
    student = next(row for row in rows if row.kind == "student")
    for row in rows:
        row.faster_here = (round(row.sentences_per_cpu_s, 1) > round(student.sentences_per_cpu_s, 1)
                           if row.kind == "export" else None)
    return rows


# (label, /proc/cpuinfo flags any of which show it). What dynamic int8 and bf16 run on: VNNI has the int8 dot
# product in one instruction (without it, ONNX Runtime's u8 x s8 kernels take three), AVX-512 twice AVX2's width.
_X86_FEATURES = (("AVX2", ("avx2",)), ("AVX-512", ("avx512bw",)), ("VNNI", ("avx512_vnni", "avx512vnni", "avx_vnni")),
                 ("bf16", ("avx512_bf16", "amx_bf16")))
_ARM_FEATURES = (("NEON", ("asimd",)), ("dot product", ("asimddp",)), ("i8mm", ("i8mm",)), ("bf16", ("bf16",)))


def cpu_instruction_set(flags: set[str] | None = None, machine: str | None = None) -> dict[str, Any]:
    """What this CPU's int8 and bf16 speed depends on (``{feature: bool}``, the VNNI flags, export_onnx's
    ``int8_preset``, a ``summary``): an int8 export faster on one CPU can be slower on another of the same name."""
    from raydistill.models.export import cpu_flags, quantization_target

    machine = (machine or platform.machine()).lower()
    flags = cpu_flags() if flags is None else set(flags)
    table = _ARM_FEATURES if machine in ("aarch64", "arm64") else _X86_FEATURES
    features = {label: any(flag in flags for flag in names) for label, names in table}
    summary = (", ".join(label if present else f"no {label}" for label, present in features.items()) if flags
               else f"{machine}: instruction set unknown (no CPU flags readable)")
    return {**features, "vnni": sorted(flag for flag in flags if "vnni" in flag), "machine": machine,
            "int8_preset": quantization_target(flags, machine)[0], "summary": summary}


def format_table(rows: list[Row], *, margin: float, speed: dict[str, Any], own_metric: str | None = None) -> str:
    """The terminal table: a line per row, marks as ``*``, speed against the student's, the margin and how speed
    was taken in the footer. ``own_metric``: the own pairs' ``pair_metric`` ("roc_auc": "own pairs AUC")."""
    columns = [key for key, _ in QUALITY_COLUMNS if any(key in row.scores for row in rows)]
    labels = {**dict(QUALITY_COLUMNS), **({EVAL_PAIRS: "own pairs AUC"} if own_metric == "roc_auc" else {})}
    headers = ["model", "file", "MB", *(labels[key] for key in columns), "sent/s", "sent/CPU-s", "vs student"]
    student = next((row for row in rows if row.kind == "student"), None)
    lines = []
    for row in rows:
        cells = [row.name, row.file or "", f"{row.bytes / 1e6:.1f}" if row.bytes else ""]
        cells += ["" if row.scores.get(key) is None else f"{row.scores[key]:.2f}" + (" *" if key in row.marked else "")
                  for key in columns]
        cells += [f"{row.sentences_per_s:,.1f}", f"{row.sentences_per_cpu_s:,.1f}"]
        ratio = (f"{row.sentences_per_cpu_s / student.sentences_per_cpu_s:.2f}x"
                 if student is not None and student.sentences_per_cpu_s else "")
        cells.append(ratio + (f" {NOT_FASTER}" if row.faster_here is False else ""))
        lines.append(cells)
    widths = [max(len(str(cells[i])) for cells in [headers, *lines]) for i in range(len(headers))]

    def render(cells: list[str]) -> str:
        return "  ".join(str(cell).ljust(width) if i < 2 else str(cell).rjust(width)
                         for i, (cell, width) in enumerate(zip(cells, widths))).rstrip()

    rule = "-" * len(render(headers))
    out = [render(headers), rule, *(render(cells) for cells in lines), rule]
    own_text = f" (own pairs: {PAIR_METRIC_NAMES[own_metric]})" if own_metric and own_metric != "spearman" else ""
    out.append(f"quality: Spearman x 100 of cosine similarity{own_text}; * = more than {margin:g} points below the "
               "student on that column (the margin)")
    out.extend(f"  {row.name}: 7-STS and STS-B dev from {row.scores_source}" for row in rows
               if row.scores_source != "evaluated")
    out.append(f"speed: {speed['sentences']} STS sentences, batch {speed['batch_size']}, {speed['cpu']}, "
               f"median of {speed['rounds']} round(s), load average {speed['load_before']} before")
    notes = [f"CPU instruction set: {speed['instruction_set']['summary']}" if speed.get("instruction_set") else "",
             f"timed through {speed['pipeline']}" if speed.get("pipeline") else "",
             f"vs student: sentences per CPU second over the torch student's; {NOT_FASTER}: an export no faster than "
             "the student on this CPU, which raydistill serve does not choose by default"]
    width = max(len(rule), 100)
    out.extend(textwrap.fill(note, width=width, initial_indent="  ", subsequent_indent="    ")
               for note in notes if note)
    return "\n".join(out)


def _static_info(student: Any) -> dict[str, Any]:
    """What a card says of a static student's table (read back from the saved model: a projection is folded in)."""
    backend = getattr(student.tokenizer, "backend_tokenizer", None)
    return {"kind": "static embedding model", "width": int(student.dim), "vocabulary": len(student.tokenizer),
            "tokenizer": type(backend.model).__name__ if backend is not None else type(student.tokenizer).__name__,
            "loaders": ["sentence_transformers.models.StaticEmbedding", "model2vec.StaticModel"]}


def package_student(student_dir: str | os.PathLike, out_dir: str | os.PathLike, *, teacher: str,
                    corpus_info: dict[str, Any], recipe_info: dict[str, Any], command: str,
                    eval_pairs: str | os.PathLike | None = None,
                    student_scores: tuple[dict[str, float], str] | None = None, quality_margin: float = DEFAULT_MARGIN,
                    progress: Callable[[str], Any] | None = print, teacher_scores_dir: Path | None = None,
                    batch_size: int = 128, speed_sentences_count: int = 256, speed_batch: int = 32,
                    speed_rounds: int = 3) -> PackageReport:
    """Write the package described in the module docstring into ``out_dir`` and return its report.

    Args:
        student_dir: the trained student (a sentence-transformers directory, e.g. a job's ``best/``).
        teacher: the teacher as the recipe named it (a preset or a directory): evaluated, or its baseline's scores.
        corpus_info: ``name`` and ``sentences`` (count) of the training corpus; optional ``description``,
            ``datasets`` (Hugging Face dataset ids for the card's front matter).
        recipe_info: ``methods`` (the card cites their papers), optional ``student`` (the start model: the card's
            ``base_model``), ``stages`` (strings or dicts), ``description``, ``seed``, ``name`` (the card's title).
        command: the exact command line that made the student (the card quotes it).
        eval_pairs: the user's labelled pairs (`read_eval_pairs`), scored for every row.
        student_scores: ``(scores, source file)``: the training job's 7-STS and STS-B dev of ``student_dir``, used
            instead of scoring it again when they cover every set and the sets are the bundled ones.
        quality_margin: Spearman x 100 points an export may fall below the student before it is marked.
        progress: called with one line per step (None: silent).
        teacher_scores_dir: where `score_teacher` keeps a teacher's scores (default: $RAYDISTILL_HOME/teacher-scores).
    """
    import torch

    from raydistill.evaluation.results import code_provenance
    from raydistill.fileio import atomic_write_json, atomic_write_text, staged_directory
    from raydistill.models import BiEncoder, resolve_model
    from raydistill.models.export import cpu_name, export_onnx, load_onnx
    from raydistill.config.job import model_short_name
    from raydistill.ship.card import render_card

    if not (isinstance(quality_margin, (int, float)) and math.isfinite(quality_margin) and quality_margin >= 0):
        raise ValueError(f"quality_margin must be a finite number >= 0 (Spearman x 100 points), got {quality_margin!r}")
    say = progress or (lambda line: None)
    out = check_out_dir(out_dir)
    user_pairs = read_eval_pairs(eval_pairs) if eval_pairs is not None else None
    threads = torch.get_num_threads()
    started = time.perf_counter()

    with staged_directory(out) as staged:
        say(f"package: writing the student to {out} (sentence-transformers directory)")
        student = BiEncoder.from_pretrained(student_dir)
        teacher_model = BiEncoder.from_pretrained(resolve_model(teacher))  # a teacher that is gone fails here, early
        student.save(staged)
        if student.is_static:
            files: list[dict[str, Any]] = []
            say(f"package: no ONNX export: {STATIC_NO_ONNX}")
        else:
            files = export_onnx(staged, report=lambda line: say(f"package: {line}"))

        models = {"teacher": teacher_model, "student": student}
        names = {"teacher": f"teacher {model_short_name(teacher)}", "student": "student (torch fp32)"}
        for row in files:
            models[row["file"]] = load_onnx(staged, row["file"], threads=threads)
            names[row["file"]] = f"onnx int8 ({row['quantization']['target']})" if row["quantization"] else "onnx fp32"

        sentences = speed_sentences(speed_sentences_count)
        load_before = round(os.getloadavg()[0], 2)
        say(f"package: timing {len(models)} models on {len(sentences)} STS sentences, batch {speed_batch}, "
            f"{threads} threads, {speed_rounds} round(s)")
        rates = measure_speed(models, sentences, batch_size=speed_batch, rounds=speed_rounds)

        known = {"teacher": (teacher_baseline(teacher), f"results/baseline-{teacher}.json (committed evaluation "
                                                        "of the preset)"),
                 "student": _job_scores(student_scores)}
        scores: dict[str, dict[str, float]] = {}
        sources: dict[str, str] = {}
        for index, (key, model) in enumerate(models.items(), start=1):
            step = f"package: [{index}/{len(models)}]"
            baseline, source = known.get(key, (None, ""))
            sources[key] = "evaluated" if baseline is None else source
            if baseline is not None:
                say(f"{step} {names[key]}: 7-STS and STS-B dev from {source}")
            sets = evaluation_pairs(user_pairs, sts=baseline is None)
            scores[key] = dict(baseline or {})
            if sets:
                what = ", ".join(filter(None, ["7 STS sets + STS-B dev" if baseline is None else "",
                                               f"{len(user_pairs):,} own pairs" if user_pairs is not None else ""]))
                distinct = len({text for pairs in sets.values() for p in pairs for text in (p.sentence1, p.sentence2)})
                say(f"{step} evaluating {names[key]}: {what} ({distinct:,} sentences, "
                    f"~{distinct / max(rates[key][0], 1e-9) / 60:.1f} min at its timed rate)")
                model_started = time.perf_counter()
                if key == "teacher":
                    measured, reused = score_teacher(teacher, model, sets, batch_size, cache_dir=teacher_scores_dir)
                    if reused:
                        sources[key] = f"evaluated earlier: {', '.join(reused)} (same teacher files, same pairs)"
                else:
                    measured, reused = score_model(model, sets, batch_size), []
                shown = ", ".join(f"{label} {measured[column]:.2f}" for column, label in QUALITY_COLUMNS
                                  if column in measured)
                say(f"{step} {names[key]}: {shown} ({time.perf_counter() - model_started:.0f} s"
                    f"{f'; {len(reused)} of {len(sets)} sets scored by an earlier package' if reused else ''})")
                scores[key].update(measured)

        load = f'from sentence_transformers import SentenceTransformer\nmodel = SentenceTransformer("{out.name}"'
        weights = staged / "model.safetensors"
        places = {"teacher": (model_short_name(teacher), None,
                              f'BiEncoder.from_pretrained("{teacher}")  # raydistill.models'),
                  "student": ("model.safetensors", weights.stat().st_size if weights.is_file() else None, load + ")"),
                  **{row["file"]: (row["file"], row["bytes"],
                                   f'{load}, backend="onnx", model_kwargs={{"file_name": "{row["file"]}"}})')
                     for row in files}}
        rows = [Row(name=names[key], kind=key if key in ("teacher", "student") else "export", file=places[key][0],
                    bytes=places[key][1], scores=scores[key], scores_source=sources[key],
                    sentences_per_s=round(rates[key][0], 1), sentences_per_cpu_s=round(rates[key][1], 1),
                    load=places[key][2])
                for key in models]
        mark_rows(rows, quality_margin)
        mark_speed(rows)
        speed = {"sentences": len(sentences), "batch_size": speed_batch, "rounds": speed_rounds, "threads": threads,
                 "cpu": f"{cpu_name() or platform.machine()}, {threads} thread{'s' if threads != 1 else ''}",
                 "instruction_set": cpu_instruction_set(), "load_before": load_before,
                 **({"pipeline": SPEED_PIPELINE, "runner": "raydistill.models.export.load_onnx"}
                    if any(row.kind == "export" for row in rows) else
                    {"pipeline": TORCH_PIPELINE, "runner": "raydistill.models.BiEncoder.encode"}),
                 "source": "STS12-16 + STS-B test sentences, seed 0"}
        table = format_table(rows, margin=quality_margin, speed=speed,
                             own_metric=pair_metric([pair.score for pair in user_pairs]) if user_pairs else None)

        from sentence_transformers import SentenceTransformer

        architecture = str(SentenceTransformer(str(staged), device="cpu"))  # also: the directory loads
        manifest = {
            "kind": "raydistill_package", "teacher": str(teacher), "student_source": str(student_dir),
            "corpus": corpus_info, "recipe": recipe_info, "command": command,
            "eval_pairs": None if eval_pairs is None else {
                "path": str(eval_pairs), "pairs": len(user_pairs),
                "metric": pair_metric([pair.score for pair in user_pairs])},
            "quality_margin": quality_margin,
            "evaluation_data": ("the copies bundled with raydistill" if _bundled_evaluation()
                                else f"${DATA_ENV} = {os.environ.get(DATA_ENV)}"),
            "rows": [row.to_dict() for row in rows], "files": files,
            "onnx": {"exported": bool(files), "reason": STATIC_NO_ONNX if student.is_static else None},
            "speed": {**speed, "load_after": round(os.getloadavg()[0], 2)},
            "model": {"dim": student.dim, "max_length": student.max_length, "pooling": student.pooling,
                      "parameters": sum(p.numel() for p in student.parameters()), "architecture": architecture,
                      **({"static": _static_info(student)} if student.is_static else {})},
            "wall_s": round(time.perf_counter() - started, 1),
            **code_provenance(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        atomic_write_text(staged / CARD_FILE, render_card(manifest, out_name=out.name))
        atomic_write_json(staged / MANIFEST_FILE, manifest)
    say(f"package: {out} written in {time.perf_counter() - started:.0f} s")
    return PackageReport(out_dir=out, card_path=out / CARD_FILE, rows=rows, table=table, margin=quality_margin,
                         manifest=manifest)
