"""``run_st_mse(cfg)``: sentence-transformers' own distillation recipe, as the baseline a user would pick instead.

The recipe is that of sentence-transformers' distillation example (``examples/sentence_transformer/training/
distillation/model_distillation.py``): the student learns, with ``losses.MSELoss``, to output the teacher's
embedding of the same sentence. The training runs in sentence-transformers, unchanged (a ``SentenceTransformer``
student, a ``datasets.Dataset`` of ``sentence`` and ``label``, ``SentenceTransformerTrainer``: ``st_mse_recipe``), so
what is measured is the library, not a re-implementation of it.

When the student is narrower than the teacher (``loss.reduction``):

    pca    (default, the example's choice) PCA of the teacher's vectors (sklearn, fitted on the first
           ``loss.pca_sentences`` training rows) becomes a ``Dense(d_t -> d_s)`` without bias or activation,
           appended to the teacher: the targets are the teacher's vectors through that layer, d_s wide
    dense  the student gets a ``Dense(d_s -> d_t)`` (sentence-transformers' default tanh), saved with it, and
           regresses the teacher's vectors themselves

A student as wide as the teacher regresses the teacher's vectors with neither (``training.reduction: none``).

The teacher's vectors come from raydistill's teacher cache under the same teacher spec as the distillation jobs
(``TeacherSpec.from_config``), so the baseline reuses the teacher pass a distillation run already paid for and trains
on the very rows it trained on (``load_training_texts``). They are what sentence-transformers' ``encode`` computes
for the shipped teachers (their pooling, then L2 normalisation, at the same token limit; in fp32 equal to float
rounding); a teacher without a Normalize module would give sentence-transformers unnormalised vectors, and this job
still regresses the normalised ones.

The job ends as the distillation jobs do, except that the student scored is the one training ends with: the 7 STS
sets and STS-B dev, ``results/st-mse-<student>-<teacher>.json`` (with ``training.reduction``), and MLflow (config,
teacher-cache counts, the loss every ``runtime.log_every`` steps, scores, plots and the final model, registered as
``tracking.register_model`` when set). The job keeps no checkpoints: a stopped run starts again (the teacher pass
stays cached).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import time
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from raydistill.config.help import register_method
from raydistill.config.job import ConfigError, JobConfig
from raydistill.config.schema import Int, MethodSettings, section
from raydistill.methods.base import LossSettings
from raydistill.runtime.jobs.st_mse_recipe import (
    build_student,
    embedding_dimension,
    target_mse,
    teacher_targets,
    train_student,
)

__all__ = ["METHOD", "StMseLossSettings", "run_st_mse", "with_st_mse_defaults"]

METHOD = "st-mse"


@section
class StMseLossSettings(LossSettings):
    """``loss:`` of st-mse: how the teacher's vectors meet the student's width."""

    reduction: Literal["pca", "dense"] = Field("pca", description="pca: the teacher's vectors reduced to the "
                                                                  "student's width; dense: a Dense layer on the "
                                                                  "student up to the teacher's")
    # The example fits its PCA on 40,000 sentences (20k NLI + 20k Wikipedia).
    pca_sentences: Int = Field(40000, ge=1, description="teacher vectors the PCA is fitted on")


@section
class StMseExtraSettings(MethodSettings):
    """``extra:`` of st-mse (``runtime.log_every`` sets the steps between loss logs)."""

    # The teacher pass reads it, as every method's: sentence-transformers' MSE recipe regresses sentence vectors,
    # which only a bi-encoder teacher has.
    teacher_encoder: Literal["bi"] = Field("bi", description="bi: the teacher embeds sentences (the only kind the "
                                                             "MSE recipe regresses)")


register_method(METHOD, "sentence-transformers' MSE example (run by its own command)", StMseLossSettings,
                StMseExtraSettings, internal=True)
# Rows on which the student's distance to its targets is measured before and after training.
_TARGET_CHECK_ROWS = 1024
_INSTALL_HINT = "pip install 'raydistill[st-mse]'"


# ----------------------------------------------------------------------------------------------------------------
# Config


def with_st_mse_defaults(cfg: JobConfig) -> JobConfig:
    """``cfg`` with the recipe's view, teacher view and ``loss`` defaults filled in where left unset (what is
    hashed, logged and recorded)."""
    data = cfg.to_dict()
    if cfg.teacher and not data["data"]["teacher_views"]:
        data["data"]["teacher_views"] = list(data["data"]["views"])
    data["loss"] = StMseLossSettings.from_config(dict(cfg.loss), source=cfg._source, lines=cfg._lines,
                                                 prefix="loss.", owner=METHOD).in_use()
    if data == cfg.to_dict() and isinstance(cfg.loss, StMseLossSettings):
        return cfg
    return JobConfig.from_dict(data, source=cfg._source, lines=cfg._lines)


def preflight_st_mse(cfg: JobConfig) -> JobConfig:
    """``cfg`` with the recipe's defaults, checked before any model loads or Ray starts: the schema, the recipe's
    own rules, then the models, data files and output directories it will use."""
    from raydistill.runtime.engine.preflight import check_inputs, check_models, check_output_dirs

    cfg = with_st_mse_defaults(cfg)
    if cfg.method != METHOD:
        raise ConfigError(f"field 'method': run_st_mse runs {METHOD!r}, got {cfg.method!r}")
    cfg = cfg.validate()
    _validate(cfg)
    check_models(cfg)
    check_output_dirs(cfg)
    check_inputs(cfg)
    return cfg


def _validate(cfg: JobConfig) -> None:
    """The recipe's own rules (pure, like ``JobConfig.validate``)."""
    err = cfg._error
    if not cfg.teacher:
        raise err("teacher", f"method {METHOD!r} regresses the teacher's vectors: set teacher (e.g. mpnet-base)")
    missing = [module for module in ("sentence_transformers", "accelerate", "sklearn", "datasets")
               if importlib.util.find_spec(module) is None]
    if missing:
        raise err("method", f"{METHOD!r} trains with sentence-transformers' trainer, which needs "
                            f"{', '.join(missing)}: {_INSTALL_HINT}")
    views = dict(cfg.data.views)
    if len(views) != 1 or next(iter(views.values())) != "none":
        raise err("data.views", f"{METHOD} trains on the sentence itself: one view with spec none, e.g. {{a: none}} "
                                f"(got {views})")
    if list(cfg.data.teacher_views) not in ([], list(views)):
        raise err("data.teacher_views", f"{METHOD} reads the teacher's vectors of its one view {list(views)}")
    if cfg.student_projection_init != "default":
        raise err("student_projection_init", f"{METHOD} builds its Dense layer as sentence-transformers does; "
                                             "leave this at default")
    if not cfg.data.shuffle:
        raise err("data.shuffle", "sentence-transformers' trainer always shuffles the training rows")
    if cfg.resources.learner.num_learners != 0:
        raise err("resources.learner.num_learners", f"{METHOD} trains in this process with sentence-transformers' "
                                                    "trainer; set 0")


# ----------------------------------------------------------------------------------------------------------------
# The job


def run_st_mse(cfg: JobConfig, *, results_dir: str | os.PathLike | None = None,
               result_path: str | os.PathLike | None = None, command: str | None = None, tracker=None,
               teacher_in_process: bool = False) -> dict[str, Any]:
    """Train ``cfg``'s student with sentence-transformers' MSE recipe, evaluate it, write the result file
    (``st-mse-<student>-<teacher>.json``) and return its record plus ``result_path``. The other arguments are
    ``run_distillation``'s; ``teacher_in_process``: encode cache misses in this process, not the Ray Data pool."""
    from raydistill.runtime.engine.rundir import RunDirLock
    from raydistill.cputime import cpu_seconds

    started, cpu_started = time.time(), cpu_seconds(children=True)
    cfg = preflight_st_mse(cfg)
    run_dir = cfg.resolved_run_dir()
    lock = RunDirLock(run_dir).acquire(report=lambda message: print(f"[{METHOD}] {message}", flush=True))
    try:
        return _run_locked(cfg, run_dir, results_dir, result_path, command, tracker, teacher_in_process,
                           started, cpu_started)
    finally:
        lock.release()


def _run_locked(cfg: JobConfig, run_dir: Path, results_dir, result_path, command, tracker,
                teacher_in_process: bool, started: float, cpu_started: float) -> dict[str, Any]:
    from raydistill.evaluation import default_command
    from raydistill.evaluation.results import git_sha
    from raydistill.runtime.jobs.distill import (check_results_dir, open_tracker, report_teacher_cache,
                                                 result_path_for, teacher_label)

    run_dir.mkdir(parents=True, exist_ok=True)
    cfg.to_yaml(run_dir / "config.yaml")
    result_path = Path(result_path) if result_path else result_path_for(cfg, results_dir or "results")
    check_results_dir(result_path)
    command = command if command is not None else default_command()
    sha = git_sha()

    texts, input_stats = _training_texts(cfg)
    vectors, cache_stats, teacher_pass_s = _teacher_vectors(cfg, texts, teacher_in_process)

    tracker, own_tracker = open_tracker(cfg, run_dir, tracker)
    with tracker if own_tracker else contextlib.nullcontext(tracker):
        tracker.log_params({"method": METHOD, "student": cfg.student, "teacher": teacher_label(cfg),
                            "seed": cfg.seed, "lr": cfg.train.lr, "batch_size": cfg.train.batch_size,
                            "epochs": cfg.train.epochs, "reduction": cfg.loss.reduction,
                            "config_hash": cfg.config_hash(), "git_sha": sha, "config": cfg.to_dict(),
                            "corpus_size": len(texts), "cache.hits": cache_stats["hits"],
                            "cache.misses": cache_stats["misses"],
                            "cache.teacher_forward_sentences": cache_stats["teacher_forward_sentences"],
                            **{f"input.{k}": v for k, v in input_stats.items()}})
        report_teacher_cache(METHOD, cache_stats, teacher_pass_s, tracker, 0)
        # A tracker passed in is a caller's run (a sweep's): it decides what gets registered.
        register = cfg.tracking.register_model if own_tracker else None
        record = _train_evaluate_record(cfg, run_dir, texts, vectors, cache_stats, teacher_pass_s, tracker,
                                        result_path, command, started, cpu_started, register)
    return record


def _training_texts(cfg: JobConfig) -> tuple[list[str], dict[str, int]]:
    """The rows the distillation jobs train on for this ``data`` section and seed (``load_training_texts``)."""
    from raydistill.runtime.teachers.pipeline import load_training_texts

    input_stats: dict[str, int] = {}
    rows = load_training_texts(cfg.data, cfg.seed, stats=input_stats)
    if not rows:
        raise ConfigError(f"field 'data.corpus': {cfg.data.corpus!r} gave no training sentences")
    (view,) = cfg.data.views  # validated: one view, the sentence itself
    return [str(row[f"text_{view}"]) for row in rows], input_stats


def _teacher_vectors(cfg: JobConfig, texts: list[str], in_process: bool
                     ) -> tuple[np.ndarray, dict[str, Any], float]:
    """The teacher's vectors of ``texts`` from the cache the distillation jobs fill, misses encoded as they do
    (a Ray Data pool of teacher actors), or with ``in_process`` by one teacher here."""
    from raydistill.runtime.teachers.embedding_cache import EmbeddingCache, ensure_teacher_embeddings
    from raydistill.runtime.teachers.teacher import TeacherSpec

    started = time.perf_counter()
    spec, cache_root = TeacherSpec.from_config(cfg), cfg.resolved_cache_dir()
    # A Ray start costs tens of seconds here: with every vector cached there is nothing for its pool to do.
    all_cached = bool(EmbeddingCache(cache_root, spec.identity()).lookup(texts)[0].all())
    ray_started_here = False
    if not (in_process or all_cached):
        import ray

        from raydistill.runtime.engine.cluster import init_ray

        ray_started_here = not ray.is_initialized()
        init_ray(cfg)
    try:
        vectors, stats = ensure_teacher_embeddings(texts, next(iter(cfg.data.views)), spec, cache_root,
                                                   in_process=in_process or all_cached)
    finally:
        if ray_started_here:
            import ray

            ray.shutdown()  # training runs in this process: the cores go to it, not to idle Ray workers
    return vectors, stats, time.perf_counter() - started


def _train_evaluate_record(cfg: JobConfig, run_dir: Path, texts: list[str], vectors: np.ndarray,
                           cache_stats: dict[str, Any], teacher_pass_s: float, tracker, result_path: Path,
                           command: str, started: float, cpu_started: float, register: str | None = None
                           ) -> dict[str, Any]:
    """Train with sentence-transformers' trainer, evaluate the best model, write the result file and the MLflow run."""
    import sentence_transformers

    from raydistill.evaluation import STS7, evaluate_sts
    from raydistill.evaluation.sts import sts_predictions
    from raydistill.models import BiEncoder
    from raydistill.models.batching import torch_threads
    from raydistill.cputime import cpu_seconds
    from raydistill.runtime.jobs.distill import jsonable, record_result, teacher_label
    from raydistill.evaluation.plots import plot_dev_scatter, plot_learning_curve

    reduction = cfg.loss.reduction
    teacher_dim = vectors.shape[1]
    history: list[dict[str, Any]] = []
    with torch_threads(cfg.resources.learner.threads):
        student = build_student(cfg, teacher_dim if reduction == "dense" else None)
        student_dim = embedding_dimension(student)
        backbone_dim = embedding_dimension(student[0])
        targets, target_info = teacher_targets(vectors, backbone_dim, reduction, cfg.loss.pca_sentences)
        if targets.shape[1] != student_dim:  # a bug here would otherwise surface as a shape error mid-training
            raise RuntimeError(f"targets are {targets.shape[1]}-d but the student outputs {student_dim}-d")
        if "pca_explained_variance" in target_info:
            print(f"[{METHOD}] PCA of {target_info['pca_fit_sentences']} teacher vectors: {teacher_dim} -> "
                  f"{student_dim} dimensions keep {100 * target_info['pca_explained_variance']:.1f} % of the "
                  "variance", flush=True)
        check = min(len(texts), _TARGET_CHECK_ROWS)
        mse_before = target_mse(student, texts[:check], targets[:check], cfg.train.batch_size)
        print(f"[{METHOD}] {len(texts)} rows, reduction {target_info['reduction']}, student {student_dim}-d; "
              f"sentence-transformers {sentence_transformers.__version__} SentenceTransformerTrainer + MSELoss",
              flush=True)
        steps, train_s = train_student(student, texts, targets, cfg, run_dir, tracker, history)
        mse_after = target_mse(student, texts[:check], targets[:check], cfg.train.batch_size)
        model_dir = run_dir / "final"
        student.save(str(model_dir), create_model_card=False)

        model = BiEncoder.from_pretrained(str(model_dir))
        params_m = sum(p.numel() for p in model.parameters()) / 1e6
        print(f"[{METHOD}] evaluating {model_dir} on 7 STS sets + STS-B dev", flush=True)
        scores = evaluate_sts(model, sets=STS7 + ("stsb_dev",), progress=False)
        predicted, gold = sts_predictions(model, "stsb_dev")
    tracker.log_metrics({"target_mse_before": mse_before, "target_mse_after": mse_after,
                         **{f"test_{k}": v for k, v in scores.items()}}, step=steps)

    plots_dir = run_dir / "plots"
    curve = (plot_learning_curve(history, plots_dir / "learning_curve.png",
                                 title=f"{METHOD}: {Path(cfg.student).name} ← {teacher_label(cfg)}")
             if history else None)
    dev_plot = plot_dev_scatter(gold, predicted, plots_dir / "stsb_dev_scatter.png",
                                title=f"STS-B dev, {METHOD} {Path(cfg.student).name}")
    training = _training_record(cfg, run_dir, texts, history, target_info, cache_stats, steps=steps, check=check,
                                mse_before=mse_before, mse_after=mse_after, teacher_pass_s=teacher_pass_s,
                                train_s=train_s)
    record_fields = {
        "kind": "distill", "method": METHOD, "model": cfg.student, "encoder": "bi", "teacher": teacher_label(cfg),
        "params_m": round(params_m, 3), "scores": {k: round(v, 2) for k, v in scores.items()},
        "training": jsonable(training), "wall_s": round(time.time() - started, 1),
        "cpu_s": round(cpu_seconds(children=True) - cpu_started, 1), "model_dir": str(model_dir), "command": command,
    }
    return record_result(cfg, record_fields, scores, tracker, run_dir, result_path, model_dir, (curve, dev_plot),
                         register, step=steps)


def _training_record(cfg: JobConfig, run_dir: Path, texts: list[str], history: list[dict[str, Any]],
                     target_info: dict[str, Any], cache_stats: dict[str, Any], *, steps: int, check: int,
                     mse_before: float, mse_after: float, teacher_pass_s: float, train_s: float) -> dict[str, Any]:
    """The result file's ``training`` section: the recipe's settings and what training measured."""
    import sentence_transformers

    from raydistill.runtime.jobs.distill import training_settings

    return {
        **training_settings(cfg, run_dir),
        "sentences": len(texts),
        "steps": steps,
        "teacher_max_length": cfg.data.teacher_max_length,
        "threads": cfg.resources.learner.threads,
        **target_info,
        "target_mse_rows": check,
        "target_mse_before": mse_before,
        "target_mse_after": mse_after,
        "final_loss": history[-1]["loss"] if history else None,
        "teacher_cache": {k: cache_stats.get(k) for k in ("hits", "misses", "teacher_forward_sentences")},
        "teacher_pass_s": round(teacher_pass_s, 1),
        "train_s": round(train_s, 1),
        "trainer": f"sentence-transformers {sentence_transformers.__version__} SentenceTransformerTrainer, "
                   "losses.MSELoss",
        "selection": "final weights (no dev-based selection)",
    }
