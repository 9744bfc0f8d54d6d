"""``preflight(cfg)``: everything a distillation job checks before Ray, an actor or a model starts.

``JobConfig.validate`` (the schema) and ``raydistill.methods.validate_method`` (the method's rules) are pure.
Preflight adds what touches the machine, for the job and each later stage:

* the models named (student, teacher, a method's own teachers) are presets or local directories, never a download;
* the run and cache directories are writable, and the cache's filesystem has room for what the teacher pass will
  add (``check_cache_space``);
* every data file the job will read parses (the corpus, the labelled sets, the evaluation sets), and a ``caption``
  view has caption groups to show. A bad line is a ``ConfigError`` naming the file, line and field; what was read
  stays cached in the process for the pipeline and the final evaluation.

A typo therefore costs a second, not a teacher pass. Cluster resources are checked once Ray is up.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from raydistill.methods import CORPUS, METHODS, stage_plan, validate_method
from raydistill.config.job import ConfigError, JobConfig, _suggest
from raydistill.runtime.teachers.pipeline import EVALUATION_SETS, SOURCE_SETS, has_caption_groups, read_training_corpus

__all__ = ["preflight", "check_model", "check_models", "check_output_dirs", "check_inputs", "check_job_inputs",
           "check_cache_space", "teacher_cache_bytes"]

# Registry data sets behind each labelled ``MethodSpec.dataset``.
_LABELLED_SETS = {"nli_triplets": ("snli_dev", "mnli_dev"), "stsb_train": ("stsb_train",)}


def preflight(cfg: JobConfig) -> JobConfig:
    """``cfg`` with its method's defaults, checked against schema, method, models, directories and data files;
    ``ConfigError`` names the field (and, for bad data, the file and line) before anything starts."""
    cfg = validate_method(cfg)
    for stage in stage_plan(cfg):  # each later stage's config is validated when planned
        check_models(stage.cfg)
        check_output_dirs(stage.cfg)
        check_inputs(stage.cfg)
        check_cache_space(stage.cfg)
    return cfg


def check_model(cfg: Any, field_name: str, name: str) -> None:
    """``name`` is a preset, a local directory, or an ``org/name`` already in the local Hugging Face cache."""
    if not isinstance(name, str) or not name:
        raise cfg._error(field_name, "must name a model preset or a local directory")
    if Path(name).expanduser().is_dir():
        return
    from raydistill.models.registry import PRESETS, ModelNotAvailableError, find_preset, resolve_model

    if find_preset(name) is not None:
        return  # resolved (maybe derived, once) when the model is loaded, not while checking
    if name.startswith((".", "/", "~")) or name.count("/") != 1:
        if "/" in name or name.startswith((".", "~")):
            raise cfg._error(field_name, f"model directory not found: {name}")
        raise cfg._error(field_name, f"unknown model preset {name!r}{_suggest(name, PRESETS)}; presets: "
                                     f"{', '.join(sorted(PRESETS))} (or a local model directory)")
    try:  # "org/name": only usable when the local Hugging Face cache holds it (never downloaded)
        resolve_model(name)
    except ModelNotAvailableError as exc:
        raise cfg._error(field_name, str(exc)) from None


def check_models(cfg: JobConfig) -> None:
    check_model(cfg, "student", cfg.student)
    if cfg.teacher is not None:
        check_model(cfg, "teacher", cfg.teacher)
    spec = METHODS.get(cfg.method)
    if spec is not None and spec.own_teachers is not None:
        for field_name, teacher in spec.own_teachers(cfg).items():
            check_model(cfg, field_name, teacher)


def _dataset_of(cfg: JobConfig) -> str:
    """What ``cfg``'s method trains on; a method outside the registry (sentence-transformers' recipe) reads the
    corpus."""
    spec = METHODS.get(cfg.method)
    return spec.dataset if spec is not None else CORPUS


def check_output_dirs(cfg: JobConfig) -> None:
    from raydistill.runtime.engine.rundir import MIN_FREE_BYTES, OutputDirError, check_output_dir

    checks = [("run_dir", cfg.resolved_run_dir(), MIN_FREE_BYTES)]
    if cfg.data.teacher_views:
        # A corpus job's cache is sized from its corpus (check_cache_space); other jobs ask the usual minimum.
        checks.append(("cache_dir", cfg.resolved_cache_dir(), 0 if _dataset_of(cfg) == CORPUS else MIN_FREE_BYTES))
    for path, directory, min_free in checks:
        try:
            check_output_dir(directory, min_free_bytes=min_free)
        except OutputDirError as exc:
            raise cfg._error(path, str(exc)) from exc


# What the estimate of the cache's size is multiplied by, plus a fixed allowance (part headers, teacher.json).
_CACHE_MARGIN = 1.25
_CACHE_SLACK_BYTES = 2**20
# Assumed when the teacher's width cannot be read without building the model (a hub id).
_UNKNOWN_TEACHER_WIDTH = 1024


def check_cache_space(cfg: JobConfig) -> None:
    """The cache dir's filesystem has room for this job's teacher pass and rows file (``teacher_cache_bytes``)."""
    if not cfg.data.teacher_views or _dataset_of(cfg) != CORPUS:
        return
    from raydistill.runtime.teachers.cache_store import _megabytes as _mib

    needed, how = teacher_cache_bytes(cfg)
    existing = cfg.resolved_cache_dir()
    while not existing.exists():
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    if free < needed:
        raise cfg._error("cache_dir", f"{cfg.resolved_cache_dir()}: {_mib(free)} free on its filesystem, and this "
                                      f"job's teacher cache needs about {_mib(needed)} ({how}). Free space there or "
                                      "set cache_dir to a larger disk")


def teacher_cache_bytes(cfg: JobConfig) -> tuple[int, str]:
    """``(bytes, how)``: what ``cfg``'s teacher pass and rows file add to its cache dir: (sentences, de-duplicated
    and capped, x teacher views x a cached row, less what the same teacher's caches hold, plus the rows file) x
    ``_CACHE_MARGIN``."""
    from raydistill.runtime.teachers.cache_store import _megabytes as _mib, cache_row_bytes

    corpus = read_training_corpus(cfg.data.corpus, cfg.data.evaluation_set_split)
    texts = corpus.texts if corpus.is_pairs else list(dict.fromkeys(corpus.texts))
    rows = len(texts) if cfg.data.max_sentences is None else min(len(texts), cfg.data.max_sentences)
    width = teacher_width(cfg.teacher)
    row_bytes = cache_row_bytes(width or _UNKNOWN_TEACHER_WIDTH)
    views = len(cfg.data.teacher_views)
    cached = _cached_teacher_bytes(cfg)
    vectors = max(0, rows * views * row_bytes - cached)
    sample = texts[:10_000]  # the mean length of a text: a sample is enough for an estimate
    text_bytes = sum(len(t.encode("utf-8")) for t in sample) / max(1, len(sample))
    rows_file = int(rows * (16 + len(cfg.data.views) * (4 + text_bytes)))
    needed = int((vectors + rows_file) * _CACHE_MARGIN) + _CACHE_SLACK_BYTES
    width_text = f"{width}-wide" if width else f"assumed {_UNKNOWN_TEACHER_WIDTH}-wide"
    how = (f"{rows} sentences x {views} teacher views x {row_bytes} bytes a cached vector ({width_text} teacher)"
           + (f", less {_mib(cached)} already cached" if cached else "")
           + f", plus a rows file of ~{_mib(rows_file)}, plus {int((_CACHE_MARGIN - 1) * 100)}%")
    return needed, how


def teacher_width(model: str | None) -> int | None:
    """Width of the teacher's sentence vectors, read from its files without loading it (None when unknown)."""
    if model is None:
        return None
    directory = Path(model).expanduser()
    if not directory.is_dir():
        from raydistill.models.registry import find_preset

        preset = find_preset(model)
        return preset.hidden if preset is not None else None
    try:
        modules = json.loads((directory / "modules.json").read_text()) if (directory / "modules.json").is_file() else []
        dense = [m for m in modules if "Dense" in str(m.get("type", ""))]
        if dense:
            return int(json.loads((directory / dense[-1]["path"] / "config.json").read_text())["out_features"])
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return None
    width = config.get("hidden_size") or config.get("d_model") or config.get("dim")
    return int(width) if width else None


def _cached_teacher_bytes(cfg: JobConfig) -> int:
    """Bytes of cached vectors already under the cache dir for this teacher model and max length (the most of any
    one cache; its ``teacher.json`` names them), so a rerun on a nearly full disk asks only for what is missing."""
    most = 0
    for description in cfg.resolved_cache_dir().glob("*/teacher.json"):
        try:
            described = json.loads(description.read_text())
        except (OSError, ValueError):
            continue
        if described.get("model") == cfg.teacher and described.get("max_length") == cfg.data.teacher_max_length:
            most = max(most, sum(_size(part) for part in description.parent.glob("part-*")))
    return most


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:  # removed meanwhile
        return 0


def check_input_files(cfg: JobConfig) -> None:
    """The files the config names exist and are of a readable kind (before any of them is parsed)."""
    from raydistill.augment import parse_spec
    from raydistill.data.corpus import corpus_spec_problem

    if cfg.data.corpus.startswith("file:"):
        problem = corpus_spec_problem(cfg.data.corpus)
        if problem:
            raise cfg._error("data.corpus", problem)
    for view, spec in cfg.data.views.items():
        if spec in ("none", "caption", "pair"):
            continue
        parsed = parse_spec(spec)
        if parsed.kind == "paired" and not Path(parsed.path).expanduser().is_file():
            raise cfg._error(f"data.views.{view}", f"paraphrase file not found: {parsed.path}")


def check_job_inputs(cfg: JobConfig) -> dict[str, Any]:
    """Read and validate every data file the job will read; raises ``DataError`` (or ``ConfigError`` for a view
    the corpus cannot give). Returns ``{"datasets": [...], "corpus_file": path or None}``."""
    from raydistill.data import load_dataset

    reads_corpus = _dataset_of(cfg) == CORPUS
    spec = METHODS.get(cfg.method)
    names: list[str] = list(spec.reads if spec is not None and spec.reads
                            else _LABELLED_SETS.get(_dataset_of(cfg), ()))
    corpus_file = None
    if reads_corpus:
        if cfg.data.corpus.startswith("file:") or cfg.data.corpus == "mixed":
            if cfg.data.corpus.startswith("file:"):
                from raydistill.data.corpus import parse_corpus_spec

                corpus_file = str(parse_corpus_spec(cfg.data.corpus).path)
            read_training_corpus(cfg.data.corpus, cfg.data.evaluation_set_split)
        else:
            names += [name for source in cfg.data.corpus.split("+") for name in SOURCE_SETS.get(source, ())]
    names += EVALUATION_SETS
    for name in dict.fromkeys(names):
        load_dataset(name)
    if reads_corpus:
        caption_views = [view for view, view_spec in cfg.data.views.items() if view_spec == "caption"]
        if caption_views and not has_caption_groups(cfg.data.corpus, cfg.data.evaluation_set_split):
            raise cfg._error(f"data.views.{caption_views[0]}",
                             f"'caption' shows another caption of the same image, and corpus {cfg.data.corpus!r} has "
                             "no caption groups: every view would be the sentence itself. Use a corpus with captions "
                             "(flickr) or another view (e.g. delete:0.1, or pair with a pairs file)")
    return {"datasets": list(dict.fromkeys(names)), "corpus_file": corpus_file}


def check_inputs(cfg: JobConfig) -> None:
    """``check_job_inputs`` with a ``DataError`` turned into a ``ConfigError`` that names the field or the file."""
    from raydistill.data import DATA_ENV, DataError

    check_input_files(cfg)
    try:
        check_job_inputs(cfg)
    except DataError as exc:
        corpus = cfg.data.corpus
        if corpus.startswith("file:"):
            from raydistill.data.corpus import parse_corpus_spec

            corpus_path = parse_corpus_spec(corpus).path.resolve()
            if Path(exc.path).resolve().is_relative_to(corpus_path):
                raise cfg._error("data.corpus", f"bad training data: {exc}") from exc
        elif exc.path == corpus:  # a named corpus with nothing to train on (raydistill.data.corpus)
            raise cfg._error("data.corpus", f"bad training data: {exc}") from exc
        override = os.environ.get(DATA_ENV)
        where = f" (${DATA_ENV}={override})" if override else ""
        raise ConfigError(f"a data set this job reads is bad{where}: {exc}") from exc
