"""DvBERT's interaction-view teachers: K cross-encoders trained on labelled NLI pairs, and their out-of-fold labels.

DvBERT (Cheng, "Dual-View Distilled BERT for Sentence Embedding", SIGIR 2021, arXiv:2104.08675) distils K
interaction-view models into a siamese sentence encoder: K pre-trained models each read ``[CLS] premise [SEP]
hypothesis [SEP]``, map [CLS] through one fully connected layer to a 3-way softmax, are trained on the labelled NLI
data with cross-entropy, then relabel the training set; those predictions stay fixed while the student trains (the
student side is ``raydistill.objectives.DvBERTLoss``):

    q_k(a, b) = softmax(head_k(pool(transformer_k(a, b))))         # [3], teacher k, fixed once computed
    teacher_probs(a, b) = (1/K) · Σ_k q_k(a, b)                     # [3]

What differs from the paper's recipe, each for a measured reason (results/diag-dvbert-teachers.json):

* **Out-of-fold labels.** A classifier relabelling its own training pairs returns near one-hot predictions (little
  dark knowledge) and a meaningless held-out accuracy. Each teacher is trained ``folds`` times: fold model f on the
  pairs outside fold f, labelling fold f only. Every pair is then labelled by all K teachers (each by a fold model
  that never saw it), so the ensemble keeps all K views and a teacher's accuracy over all pairs is held-out
  accuracy. (Dealing the K teachers over the folds would train each once but leave each pair one teacher's label.)
  Frozen (below), the folds share one encoding pass; fine-tuned, each costs (folds − 1)/folds of a full run.
* **The head** (``head``, ``pool_pair``). ``cls`` is the paper's [CLS] → FC, but on these mean-pooling sentence
  encoders a fresh classifier on [CLS] stays near chance (0.40 held-out accuracy from 4,000 pairs on frozen
  minilm-l6 states; 0.45 after 62 fine-tuning steps at lr 1e-4). ``segments`` reads each sentence's mean word state
  *inside the joint encoding*; ``aligned`` adds ESIM-style soft alignment and coverage: 0.58 against 0.52.
* **Frozen transformer** (``finetune: false``, the CPU config): fine-tuning a 6-layer cross-encoder took ~12 minutes
  for 62 steps on 2 shared cores; frozen, each pair is encoded once and only the head trains, in seconds.
* **Fewer labelled pairs.** Offline there is only SNLI dev + MultiNLI dev (29,316 pairs without those holding an
  evaluation sentence, raydistill/data/bundled/nli/), not SNLI + MultiNLI train (≈940k).

**One training loop.** Each fold model trains as a stage of the engine (``StageServices.fit``, Train's local mode):
method ``nli-head`` or ``nli-teacher`` (grad clip 1), held-out fold accuracy as ``dev``, checkpoints in
``.fold-<f>.training/`` (a stopped fine-tuning fold continues), batches drawn from ``(seed + fold, epoch)``. The fold
keeps its LAST step's model: best-dev selection would pick the step by the very labels it then predicts.

A teacher below ``min_accuracy`` held-out accuracy is refused before the student trains (``TeacherAccuracyError``):
a teacher at chance adds only label smoothing that fades with the annealing. Trained teachers stay cached either
way, under ``$RAYDISTILL_HOME/dvbert-teachers/<name>-<key>/`` (layout: ``train_nli_teacher``), keyed by the model
weights, the NLI pairs and the training settings but not ``min_accuracy``, which only judges them; a frozen
transformer's features are kept under ``dvbert-teachers/features/``. With Ray running, the K teachers train in
parallel as Ray tasks with ``resources.teacher`` each. This module is the DvBERT method's own-teacher half
(``methods.dvbert`` ``build_rows``): it uses only what the runtime lends a method, so it sits below the Ray layer.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import zlib
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from raydistill.config.job import ConfigError
from raydistill.data.arrays import seeded_subset
from raydistill.fileio import atomic_write_json, atomic_writer, replace_directory, staged_directory
from raydistill.methods.base import StageServices
from raydistill.methods.nli_teacher import (NLI_LABELS, TeacherTraining, build_head, build_teacher, load_teacher,
                                            save_head)
from raydistill.methods.nli_teacher import encode_rows as _encode_rows

__all__ = ["NLI_LABELS", "TeacherAccuracyError", "TeacherTraining", "build_teacher", "check_teacher_accuracy",
           "ensure_nli_teachers", "fold_assignment", "load_teacher", "nli_pairs", "out_of_fold_soft_labels",
           "train_nli_teacher"]

class TeacherAccuracyError(ConfigError):
    """A DvBERT teacher's held-out NLI accuracy is below ``extra.teacher_training.min_accuracy``.

    A ``ConfigError``: the fix is a config field (the teacher training, or the bar), so the job ends with this
    message and exit status 2, not a traceback."""


def nli_pairs(max_pairs: int | None = None, seed: int = 1000) -> dict[str, np.ndarray]:
    """SNLI dev + MultiNLI dev, less the pairs with an evaluation sentence (``data.corpus.training_pairs``), as
    columns ``text_a`` (premise), ``text_b`` (hypothesis), ``label`` (0/1/2).

    A deterministic random subset of ``max_pairs`` when given (CPU-sized runs).
    """
    from raydistill.data.corpus import NLI_TRAINING_SETS, training_pairs

    pairs = list(training_pairs(NLI_TRAINING_SETS)[0])
    label_of = {name: i for i, name in enumerate(NLI_LABELS)}
    pairs = [pairs[i] for i in seeded_subset(len(pairs), max_pairs, seed)]
    return {
        "text_a": np.array([p.sentence1 for p in pairs], dtype=object),
        "text_b": np.array([p.sentence2 for p in pairs], dtype=object),
        "label": np.array([label_of[p.label] for p in pairs], dtype=np.int64),
    }


def fold_assignment(num_pairs: int, folds: int, seed: int) -> np.ndarray:
    """The fold of each pair, int64 [N]: a seeded shuffle dealt round-robin, so fold sizes differ by at most one."""
    fold = np.empty(num_pairs, dtype=np.int64)
    fold[np.random.default_rng(seed).permutation(num_pairs)] = np.arange(num_pairs) % folds
    return fold


def _fingerprint(columns: dict[str, np.ndarray]) -> str:
    digest = hashlib.sha256()
    for a, b, y in zip(columns["text_a"], columns["text_b"], columns["label"]):
        digest.update(f"{a}\t{b}\t{int(y)}\n".encode())
    return digest.hexdigest()[:16]


def _cache_key(model: str, max_length: int, services: StageServices, **fields: Any) -> str:
    """16 hex digits of sha256 over ``model``'s identity (read as a cross-encoder) and ``fields``."""
    identity = services.model_identity(model, encoder="cross", max_length=max_length)
    return hashlib.sha256(json.dumps({"model": identity, **fields}, sort_keys=True).encode()).hexdigest()[:16]


def teachers_root() -> Path:
    from raydistill.config.job import raydistill_home

    return raydistill_home() / "dvbert-teachers"


# ----------------------------------------------------------------------------------------------------------------
# The teacher model


# ----------------------------------------------------------------------------------------------------------------
# Training (plain functions: one teacher runs in-process or as one Ray task)

# A step count no fold reaches: a head fold (seconds) checkpoints only where it stops and ends and evaluates only at
# epoch ends; a fine-tuned fold (hours on a CPU) also checkpoints every ``_FINETUNE_CHECKPOINT_EVERY`` steps.
_PAST_THE_END = 1_000_000_000
_FINETUNE_CHECKPOINT_EVERY = 500
# Progress lines of a fine-tuned fold every this many steps (and every 30 s); a head fold's steps take
# milliseconds, so it prints on the 30 s cadence and at its last step only.
_FINETUNE_LOG_EVERY = 50


def _stage_config(cfg: TeacherTraining, fold: int, weights: Path, train_dir: Path, heldout: Path,
                  identity: dict[str, Any], threads: int, device: str):
    """Fold ``fold`` as an engine job config: the teacher's settings, the fold's seed, Train's local mode. The
    engine evaluates at each epoch end and at the last step (``eval_every`` past the end): held-out accuracy,
    reported in the progress lines, not used to pick a model."""
    from raydistill.config.job import JobConfig

    return JobConfig.for_stage(
        "nli-teacher" if cfg.finetune else "nli-head", str(weights), seed=cfg.seed + fold, run_dir=str(train_dir),
        source=f"dvbert teacher fold {fold + 1}/{cfg.folds}",  # the DvBERT job records the teachers itself
        data={"max_length": cfg.max_length, "shuffle": True},
        train={"batch_size": cfg.batch_size, "lr": cfg.lr, "epochs": cfg.epochs,
               "warmup_ratio": cfg.warmup_ratio, "weight_decay": cfg.weight_decay,
               # as the loops this replaced: the fine-tuning clipped at 1, the head loop never clipped
               "grad_clip": 1.0 if cfg.finetune else 0.0, "eval_every": _PAST_THE_END,
               "checkpoint_every": _FINETUNE_CHECKPOINT_EVERY if cfg.finetune else _PAST_THE_END,
               "keep_last": 1, "precision": cfg.precision if cfg.finetune else "fp32"},
        resources={"learner": {"num_learners": 0, "num_gpus": 1 if device == "cuda" else 0,
                               "threads": max(1, int(threads)), "cpu_speedups": False}},
        runtime={"log_every": _FINETUNE_LOG_EVERY if cfg.finetune else _PAST_THE_END},
        extra={"teacher_training": asdict(cfg), "heldout": str(heldout), "stage": identity})


def _fit_fold(columns: dict[str, np.ndarray], train_rows: np.ndarray, label_rows: np.ndarray, cfg: TeacherTraining,
              fold: int, weights: Path, train_dir: Path, device: str, name: str, services: StageServices,
              threads: int = 1, pooled: np.ndarray | None = None):
    """Train fold model ``fold`` on ``train_rows`` through the engine (``services.fit``, checkpoints in
    ``train_dir``); ``(model, probs of label_rows, stats)``. Frozen (``pooled`` [N, D], the transformer's features):
    a head (``methods.nli_head``) drawn from the fold's seed and standardised by the training rows' mean and spread.
    Fine-tuned: the whole teacher (``methods.nli_teacher``)."""
    import torch

    from raydistill.data.arrays import ArrayData, LengthBucketedArrayData
    from raydistill.methods import get_method
    from raydistill.methods.nli_head import START_HEAD
    from raydistill.methods.nli_teacher import HELDOUT_PROBS, head_digest

    identity = {"fold": fold, "train_rows": zlib.crc32(np.ascontiguousarray(train_rows, dtype=np.int64).tobytes()),
                "weights": str(weights)}
    heldout = train_dir.parent / f"{train_dir.name}-heldout.npz"
    stage_cfg = _stage_config(cfg, fold, weights, train_dir, heldout, identity, threads, device)
    gold = columns["label"]
    torch.manual_seed(cfg.seed + fold)
    if pooled is not None:
        start = train_dir.parent / f"{train_dir.name}-start"
        head = build_head(pooled.shape[1], cfg.head_hidden, cfg.dropout)
        with torch.no_grad():
            x = torch.as_tensor(pooled[train_rows])
            head.shift.copy_(x.mean(0))
            head.scale.copy_(x.std(0) + 1e-6)
        start.mkdir(parents=True, exist_ok=True)
        torch.save(head.state_dict(), start / START_HEAD)
        with atomic_writer(heldout) as stream:
            np.savez(stream, pooled=pooled[label_rows], label=gold[label_rows])
        data = ArrayData({"pooled": pooled[train_rows], "label": gold[train_rows], "idx": train_rows},
                         seed=stage_cfg.seed, shuffle=True)
        init_model = str(start)
    else:
        with atomic_writer(heldout) as stream:
            np.savez(stream, text_a=np.asarray(columns["text_a"][label_rows], dtype=str),
                     text_b=np.asarray(columns["text_b"][label_rows], dtype=str), label=gold[label_rows])
        lengths = np.array([len(a) + len(b) for a, b in zip(columns["text_a"][train_rows],
                                                              columns["text_b"][train_rows])])
        data = LengthBucketedArrayData({name_: columns[name_][train_rows] for name_ in ("text_a", "text_b", "label")}
                                       | {"idx": train_rows}, lengths, seed=stage_cfg.seed)
        init_model = str(weights)
    # The last step's model (the loops this replaced kept it too; methods.nli_teacher says why not the best dev).
    fitted = services.fit(stage_cfg, data, init_model=init_model, name=name)
    model = fitted.model.to(device).eval()
    probs = None
    saved = train_dir / HELDOUT_PROBS
    if pooled is None and saved.is_file():
        with np.load(saved) as kept:  # the final evaluation's predictions, if they are this model's
            if int(kept["head"]) == head_digest(model.head):
                probs = kept["probs"].astype(np.float32)
    if probs is None:
        probs = get_method(stage_cfg.method).heldout_probs(stage_cfg, model)
    losses = [row["loss"] for row in fitted.history if "loss" in row]
    stats = {"steps": int(fitted.steps), "final_loss": float(np.mean(losses[-50:])) if losses else None}
    model.cpu()
    return model, probs, stats


def _frozen_features(weights: Path, columns: dict[str, np.ndarray], cfg: TeacherTraining, device: str, name: str,
                     out: Path, features_path: str | None):
    """The frozen teacher (seeded) and its pooled features of every pair [N, D] (read from ``features_path``, else
    encoded and written there); the transformer is saved once as ``out/encoder``, for the fold heads to point at."""
    import torch

    started = time.perf_counter()
    torch.manual_seed(cfg.seed)
    encoder = build_teacher(weights, cfg).to(device)
    if features_path and Path(features_path).is_file():
        pooled = np.load(features_path)  # [N, D]
    else:
        pooled = _encode_rows(encoder, columns, np.arange(len(columns["label"])), device, cfg.precision,
                              pooled_only=True, progress=f"[dvbert-teacher {name}]")  # [N, D]
        print(f"[dvbert-teacher {name}] encoded {len(pooled)} pairs with the frozen transformer "
              f"({time.perf_counter() - started:.0f}s)", flush=True)
        if features_path:
            Path(features_path).parent.mkdir(parents=True, exist_ok=True)
            with atomic_writer(features_path) as stream:
                np.save(stream, pooled)
    if not (out / "encoder").is_dir():
        with staged_directory(out / "encoder") as tmp:
            encoder.transformer.save_pretrained(tmp)
            encoder.tokenizer.save_pretrained(tmp)
    return encoder, pooled


def train_nli_teacher(model: str, columns: dict[str, np.ndarray], fold: np.ndarray, out_dir: str,
                      training: dict[str, Any], services: StageServices, threads: int = 1, device: str | None = None,
                      features_path: str | None = None) -> dict[str, Any]:
    """Train teacher ``model``'s fold models into ``out_dir``: model f on the pairs outside fold f, labelling fold f.

    ``finetune``: each fold model fine-tunes its own copy of the transformer (a fold already on disk is kept).
    Frozen: the transformer encodes every pair once and only each fold's head trains; the transformer is saved once
    as ``encoder/`` and the features at ``features_path`` (when given), so other head settings reuse them. Writes per
    fold ``fold-<f>/`` (``nli_head.pt``, ``nli_head.json``, ``probs.npy`` = the predictions of fold f's pairs,
    ``rows.npz`` = the rows it trained on and labelled, ``fold_info.json``), then ``teacher_info.json``, returned.
    """
    import torch

    from raydistill.models import resolve_model
    from raydistill.models.bi_encoder import transformer_directory

    cfg = TeacherTraining(**training)
    torch.set_num_threads(max(1, int(threads)))
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = Path(model.rstrip("/")).name
    weights = transformer_directory(resolve_model(model))
    started = time.perf_counter()
    encoder, pooled = None, None
    if not cfg.finetune:
        encoder, pooled = _frozen_features(weights, columns, cfg, device, name, out, features_path)
    fold_infos = []
    for f in range(cfg.folds):
        fold_dir = out / f"fold-{f}"
        if cfg.finetune and (fold_dir / "fold_info.json").is_file():
            fold_infos.append(json.loads((fold_dir / "fold_info.json").read_text()))
            continue
        fold_started = time.perf_counter()
        fold_tag = f"dvbert-teacher {name} fold {f + 1}/{cfg.folds}"
        train_rows, label_rows = np.flatnonzero(fold != f), np.flatnonzero(fold == f)
        train_dir = out / f".fold-{f}.training"
        tmp = out / f".fold-{f}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        fold_model, probs, stats = _fit_fold(columns, train_rows, label_rows, cfg, f, weights, train_dir, device,
                                             fold_tag if cfg.finetune else f"{fold_tag} head", services, threads,
                                             pooled)
        if cfg.finetune:
            fold_model.save(tmp)
        else:
            encoder.head = fold_model
            save_head(encoder, tmp, "../encoder", cfg)
        accuracy = float((probs.argmax(axis=1) == columns["label"][label_rows]).mean())
        info = {"fold": f, "train_pairs": len(train_rows), "heldout_pairs": len(label_rows),
                "heldout_accuracy": accuracy, **stats, "seconds": round(time.perf_counter() - fold_started, 1)}
        np.save(tmp / "probs.npy", probs)
        np.savez(tmp / "rows.npz", train_rows=train_rows, label_rows=label_rows)
        atomic_write_json(tmp / "fold_info.json", info)
        replace_directory(tmp, fold_dir)
        # the fold is whole now: its engine run dir, start head and held-out rows go
        for leftover in (train_dir, out / f"{train_dir.name}-start"):
            shutil.rmtree(leftover, ignore_errors=True)
        (out / f"{train_dir.name}-heldout.npz").unlink(missing_ok=True)
        fold_infos.append(info)
        print(f"[dvbert-teacher {name}] fold {f + 1}/{cfg.folds}: held-out NLI accuracy {accuracy:.3f} "
              f"({len(label_rows)} pairs)", flush=True)

    oof = np.zeros((len(fold), len(NLI_LABELS)), dtype=np.float32)
    for f in range(cfg.folds):
        oof[fold == f] = np.load(out / f"fold-{f}" / "probs.npy")
    accuracy = float((oof.argmax(axis=1) == columns["label"]).mean())
    info = {"model": model, "training": cfg.shaping(), "pairs": len(fold), "folds": cfg.folds,
            "heldout_accuracy": accuracy, "fold_accuracy": [fi["heldout_accuracy"] for fi in fold_infos],
            "final_loss": [fi["final_loss"] for fi in fold_infos], "steps": sum(fi["steps"] for fi in fold_infos),
            "seconds": round(time.perf_counter() - started, 1)}
    with atomic_writer(out / "oof-probs.npy") as stream:
        np.save(stream, oof)
    atomic_write_json(out / "teacher_info.json", info)  # last: marks it complete
    print(f"[dvbert-teacher {name}] out-of-fold NLI accuracy {accuracy:.3f} over {len(fold)} pairs, "
          f"{info['seconds']:.0f}s", flush=True)
    return info


# ----------------------------------------------------------------------------------------------------------------
# Orchestration


def _features_path(model: str, training: TeacherTraining, data_fp: str, services: StageServices) -> Path:
    """Where the frozen transformer's pooled features of these pairs are kept: they depend on the weights, the
    pooling, the truncation and the precision, not on anything the head's training does."""
    key = _cache_key(model, training.max_length, services, head=training.head, precision=training.precision,
                     data=data_fp, format="nli-pooled-1")
    return teachers_root() / "features" / f"{Path(model.rstrip('/')).name}-{key}.npy"


def ensure_nli_teachers(models: list[str], columns: dict[str, np.ndarray], training: TeacherTraining,
                        services: StageServices, resources=None) -> list[dict[str, Any]]:
    """Train the teachers not cached yet (one task per teacher); return one info dict per teacher.

    Each info has ``model``, ``dir``, ``heldout_accuracy`` (out of fold, over all N pairs), ``fold_accuracy``,
    ``oof_probs`` (float32 [N, 3]: pair i predicted by the fold model of fold ``fold[i]``, which never trained on
    it), ``fold`` (int64 [N]), ``cached``, ``seconds``.
    """
    from raydistill.config.job import RoleResources

    resources = resources or RoleResources()
    data_fp = _fingerprint(columns)
    fold = fold_assignment(len(columns["label"]), training.folds, training.seed)
    keys = [_cache_key(m, training.max_length, services, training=training.shaping(), data=data_fp,
                       format="nli-teacher-oof-2") for m in models]
    dirs = [teachers_root() / f"{Path(m.rstrip('/')).name}-{key}" for m, key in zip(models, keys)]
    missing = [(m, d) for m, d in zip(models, dirs) if not (d / "teacher_info.json").is_file()]
    if missing:
        print(f"[dvbert] training {len(missing)} NLI cross-encoder teacher(s) ({', '.join(m for m, _ in missing)}) "
              f"on {len(fold)} pairs in {training.folds} folds", flush=True)
        services.run_parallel(train_nli_teacher, [
            (m, columns, fold, str(d), asdict(training), services, resources.threads, None,
             None if training.finetune else str(_features_path(m, training, data_fp, services))) for m, d in missing],
            resources)
    infos = []
    for model, directory in zip(models, dirs):
        info = json.loads((directory / "teacher_info.json").read_text())
        infos.append({**info, "dir": str(directory), "oof_probs": np.load(directory / "oof-probs.npy"),
                      "fold": fold, "cached": all(model != m for m, _ in missing)})
    return infos


def check_teacher_accuracy(infos: list[dict[str, Any]], min_accuracy: float) -> None:
    """Raise ``TeacherAccuracyError`` naming every teacher whose held-out accuracy is below ``min_accuracy``."""
    weak = [info for info in infos if info["heldout_accuracy"] < min_accuracy]
    if weak:
        listed = "; ".join(f"{info['model']}: held-out NLI accuracy {info['heldout_accuracy']:.3f} "
                           f"(cached in {info['dir']})" for info in weak)
        raise TeacherAccuracyError(
            f"DvBERT teacher(s) below extra.teacher_training.min_accuracy = {min_accuracy}: {listed}. A teacher "
            f"this weak adds only label smoothing to the student. Train it longer or at another lr "
            f"(extra.teacher_training.epochs / lr / head), or lower min_accuracy to accept it; the trained "
            f"teachers stay cached, so rerunning with a lower min_accuracy does not retrain them.")


def out_of_fold_soft_labels(infos: list[dict[str, Any]], gold: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
    """Mean of the teachers' out-of-fold class distributions, float32 [N, 3], and stats about them."""
    stacked = np.stack([info["oof_probs"] for info in infos])  # [K, N, 3]
    mean = stacked.mean(axis=0).astype(np.float32)
    stats = {"teachers": len(infos),
             "teacher_accuracy": {info["model"]: round(info["heldout_accuracy"], 4) for info in infos},
             "ensemble_accuracy": round(float((mean.argmax(axis=1) == gold).mean()), 4),
             "teacher_agreement": round(float((stacked.argmax(axis=2) == stacked[0].argmax(axis=1)).all(0).mean()),
                                        4),
             "mean_max_prob": round(float(mean.max(axis=1).mean()), 4)}
    return mean, stats
