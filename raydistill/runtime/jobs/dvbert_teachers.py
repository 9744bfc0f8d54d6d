"""DvBERT's interaction-view teachers: K cross-encoders trained on labelled NLI pairs, and their out-of-fold labels.

DvBERT (Cheng, "Dual-View Distilled BERT for Sentence Embedding", SIGIR 2021, arXiv:2104.08675) distils K
interaction-view models into a siamese sentence encoder. The paper's interaction view: K pre-trained models each
read ``[CLS] premise [SEP] hypothesis [SEP]``, map [CLS] through one fully connected layer to a 3-way softmax, are
first trained on the labelled NLI data with cross-entropy, and then relabel the training set; those predictions
are held fixed while the student trains (the student side is ``raydistill.objectives.DvBERTLoss``):

    q_k(a, b) = softmax(head_k(pool(transformer_k(a, b))))         # [3], teacher k, fixed once computed
    teacher_probs(a, b) = (1/K) · Σ_k q_k(a, b)                     # [3]

What differs here from the paper's recipe, each for a measured reason (results/diag-dvbert-teachers.json):

* **Out-of-fold labels.** A classifier that relabels the pairs it was trained on returns near one-hot predictions:
  little dark knowledge, and a held-out accuracy that says nothing. Here each teacher is trained ``folds`` times:
  fold model f on every pair outside fold f, and it labels fold f only. Every pair is then labelled by every one
  of the K teachers (by the fold model that never saw it), so the ensemble mean keeps all K views, and a teacher's
  accuracy over all pairs is held-out accuracy. Splitting the K teachers across folds instead (teacher k trains on
  the other folds and labels fold k) would train each teacher once, but leave each pair with a single teacher's
  label: no ensemble. With a frozen transformer (below) the folds share one encoding pass, so they cost next to
  nothing; fine-tuned, each fold costs (folds − 1)/folds of one training run on all pairs.
* **The head** (``head``, ``pool_pair``). ``cls`` is the paper's [CLS] → FC. The teachers here are derived sentence
  encoders trained with mean pooling; a fresh classifier on [CLS] stays near chance (0.40 held-out accuracy from
  4,000 pairs on frozen minilm-l6 states; 0.45 after 62 fine-tuning steps at lr 1e-4). ``segments`` reads what such
  a checkpoint already knows: each sentence's mean word state *inside the joint encoding* (its words still attend
  to the other sentence), as ``[a; b; |a − b|; a ⊙ b]``. ``aligned`` adds, per hypothesis word, its soft-aligned
  premise summary (ESIM's local inference, averaged over the hypothesis) and how well the hypothesis's words
  are covered by the premise's: 0.58 against 0.52 for ``segments``. ``head_hidden`` > 0 puts a hidden layer in.
* **Frozen transformer** (``finetune: false``, the CPU config). Fine-tuning a 6-layer cross-encoder costs ~3 forward
  passes per pair per epoch; on 2 shared cores 62 steps took ~12 minutes. Frozen, the transformer encodes each
  pair once and only the head trains, for several epochs, in seconds. ``finetune: true`` trains the transformer
  too (the paper's way; the GPU config).
* **Fewer labelled pairs.** The only labelled NLI data available offline is SNLI dev + MultiNLI dev (29,478 pairs,
  raydistill/data/bundled/nli/; 29,316 once the 162 with an evaluation sentence are left out), not SNLI + MultiNLI
  train (≈940k).

A teacher below ``min_accuracy`` held-out accuracy is refused before the student trains (``TeacherAccuracyError``,
naming it and its accuracy): a teacher at chance adds only label smoothing that fades with the annealing. The
trained teachers stay cached either way, under ``$RAYDISTILL_HOME/dvbert-teachers/<name>-<key>/``: ``fold-<f>/``
(``nli_head.pt`` and ``nli_head.json``, the transformer itself when fine-tuned, else the shared ``encoder/``;
``probs.npy``, the predictions of fold f; ``rows.npz``, the rows it trained on and labelled), ``teacher_info.json``
(per-fold and overall held-out accuracy), ``oof-probs.npy``. The key covers the model weights, the NLI pairs and
the training settings, not ``min_accuracy``, which only judges them; a frozen transformer's features are kept
under ``dvbert-teachers/features/`` so other head settings reuse them. With Ray running, the K teachers train in
parallel as Ray tasks with ``resources.teacher`` CPUs/GPUs each.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from raydistill.fileio import atomic_write_json, atomic_writer, replace_directory, staged_directory
from raydistill.methods.dvbert import HEADS, TeacherTraining
from raydistill.config.job import ConfigError
from raydistill.runtime.jobs.dvbert_model import (NLI_LABELS, build_head, build_teacher, load_teacher, pool_pair,
                                                  save_head)

__all__ = [
    "HEADS",
    "NLI_LABELS",
    "TeacherAccuracyError",
    "TeacherTraining",
    "build_teacher",
    "check_teacher_accuracy",
    "ensure_nli_teachers",
    "fold_assignment",
    "load_teacher",
    "nli_pairs",
    "out_of_fold_soft_labels",
    "pool_pair",
    "train_nli_teacher",
]

log = logging.getLogger(__name__)



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
    if max_pairs is not None and max_pairs < len(pairs):
        keep = np.sort(np.random.default_rng(seed).choice(len(pairs), size=max_pairs, replace=False))
        pairs = [pairs[i] for i in keep]
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


def _teacher_key(model: str, training: TeacherTraining, data_fp: str) -> str:
    from raydistill.runtime.teachers.teacher import teacher_identity

    identity = teacher_identity(model, encoder="cross", max_length=training.max_length)
    payload = json.dumps({"model": identity, "training": training.shaping(), "data": data_fp,
                          "format": "nli-teacher-oof-1"}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def teachers_root() -> Path:
    from raydistill.config.job import raydistill_home

    return raydistill_home() / "dvbert-teachers"


# ----------------------------------------------------------------------------------------------------------------
# The teacher model


def _autocast(device: str, precision: str):
    import torch

    return torch.autocast(device, dtype=torch.bfloat16) if precision == "bf16" else nullcontext()


def _bucketed_batches(rows: np.ndarray, lengths: np.ndarray, batch_size: int, rng: np.random.Generator,
                      batches_per_bucket: int = 50) -> list[np.ndarray]:
    """A shuffled epoch as batches of similar length: shuffle, sort each run of ``batches_per_bucket`` batches by
    length, cut it into batches, shuffle the batch order. Padding to the batch's longest pair then wastes little
    (NLI pairs run from ~10 to ~90 tokens) while every batch stays a random draw from a random window."""
    shuffled = rng.permutation(rows)
    span = batch_size * batches_per_bucket
    batches = []
    for start in range(0, len(shuffled), span):
        window = shuffled[start:start + span]
        window = window[np.argsort(-lengths[window], kind="stable")]
        batches.extend(window[i:i + batch_size] for i in range(0, len(window), batch_size))
    batches = [b for b in batches if len(b) == batch_size] or batches  # drop ragged tails unless nothing else
    return [batches[i] for i in rng.permutation(len(batches))]


# Rows between two progress lines of a teacher's encoding pass; a line also comes once this long has passed
# since the last (the training loops' lines come from ``learner_group``'s progress printer, on the same 30 s).
_PROGRESS_EVERY_ROWS = 2048
_PROGRESS_EVERY_S = 30.0


def _encode_rows(teacher, columns: dict[str, np.ndarray], rows: np.ndarray, device: str, precision: str,
                 pooled_only: bool, batch_size: int = 64, progress: str | None = None) -> np.ndarray:
    """Pooled features [len(rows), D] (``pooled_only``) or class probabilities [len(rows), 3], in ``rows`` order,
    float32, eval mode, no autograd, length-sorted batches. ``progress``: a log prefix; the pass then reports its
    rows done, rate and ETA about every ``_PROGRESS_EVERY_ROWS`` rows or ``_PROGRESS_EVERY_S`` seconds, whichever
    comes first (tens of minutes for a whole NLI set on a CPU)."""
    import torch

    from raydistill.models.batching import inference, length_sorted_batches
    from raydistill.runtime.engine.learner_group import _duration

    lengths = [len(columns["text_a"][r]) + len(columns["text_b"][r]) for r in rows]
    out = None
    started, done, reported = time.perf_counter(), 0, 0
    last_line = started
    with inference(teacher), _autocast(device, precision):
        for batch in length_sorted_batches(lengths, batch_size):
            picked = rows[batch]
            features = teacher.tokenize(columns["text_a"][picked].tolist(), columns["text_b"][picked].tolist())
            features = {k: v.to(device) for k, v in features.items()}
            values = teacher.pool(features) if pooled_only else torch.softmax(teacher(features).float(), dim=-1)
            values = values.float().cpu().numpy()
            if out is None:
                out = np.zeros((len(rows), values.shape[1]), dtype=np.float32)
            out[batch] = values
            done += len(batch)
            now = time.perf_counter()
            if progress and (done - reported >= _PROGRESS_EVERY_ROWS or done == len(rows)
                             or now - last_line >= _PROGRESS_EVERY_S):
                reported, last_line = done, now
                seconds = now - started
                rate = done / max(seconds, 1e-9)
                # Longest pairs first: the ETA errs long.
                print(f"{progress} encoded {done}/{len(rows)} pairs ({rate:.1f} pairs/s, {seconds:.0f}s, "
                      f"ETA {_duration((len(rows) - done) / rate)}; longest first)", flush=True)
    return out


# ----------------------------------------------------------------------------------------------------------------
# Training (plain functions: one teacher runs in-process or as one Ray task)


def _fit_head(head, pooled: np.ndarray, gold: np.ndarray, train_rows: np.ndarray, label_rows: np.ndarray,
              cfg: TeacherTraining, device: str, name: str = "dvbert-teacher") -> tuple[np.ndarray, dict[str, Any]]:
    """Train ``head`` on the frozen transformer's features of ``train_rows``; class probabilities of ``label_rows``.

    The head standardises its input by the training rows' mean and spread, then trains with AdamW, linear warm-up
    and decay, cross-entropy on the gold label. Progress lines (``[name] step i/n ... ETA``) come at least every
    30 s while it trains, and at its last step.
    """
    import torch
    import torch.nn.functional as F

    from raydistill.runtime.engine.learner import linear_schedule
    from raydistill.runtime.engine.learner_group import _Progress

    x = torch.as_tensor(pooled, device=device)  # [N, D]
    y = torch.as_tensor(gold, device=device)  # [N]
    train = torch.as_tensor(train_rows, device=device)
    with torch.no_grad():
        head.shift.copy_(x[train].mean(0))
        head.scale.copy_(x[train].std(0) + 1e-6)
    optimizer = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    steps_per_epoch = -(-len(train_rows) // cfg.batch_size)
    total = steps_per_epoch * cfg.epochs
    scheduler = linear_schedule(optimizer, int(cfg.warmup_ratio * total), total)
    generator = torch.Generator().manual_seed(cfg.seed)
    # Steps take milliseconds: the 30 s cadence and the last step, no step-count cadence.
    progress = _Progress(name, total, cfg.epochs, total, 0)
    head.train()
    losses = []
    for epoch in range(cfg.epochs):
        for batch in train[torch.randperm(len(train), generator=generator).to(device)].split(cfg.batch_size):
            loss = F.cross_entropy(head(x[batch]), y[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            losses.append(float(loss.detach()))
            progress.update(len(losses), epoch, {"loss": losses[-1]}, None, {})
    head.eval()
    with torch.no_grad():
        probs = torch.softmax(head(x[torch.as_tensor(label_rows, device=device)]), dim=-1).cpu().numpy()
    return probs.astype(np.float32), {"steps": total, "final_loss": float(np.mean(losses[-50:]))}


def _finetune_fold(teacher, columns: dict[str, np.ndarray], train_rows: np.ndarray, label_rows: np.ndarray,
                   cfg: TeacherTraining, device: str, name: str) -> tuple[np.ndarray, dict[str, Any]]:
    """Fine-tune ``teacher`` (transformer and head) on ``train_rows``; class probabilities of ``label_rows``.

    Cross-entropy on the gold label; AdamW (wd except bias/LayerNorm), linear warm-up then decay, grad clip 1;
    length-bucketed batches. Progress lines (``[name] step i/n (x%) ep e/E loss ... ETA``) every 50 steps and at
    the first step that ends 30 s or more after the last line.
    """
    import torch
    import torch.nn.functional as F

    from raydistill.runtime.engine.learner import build_optimizer, linear_schedule
    from raydistill.runtime.engine.learner_group import _Progress

    lengths = np.array([len(a) + len(b) for a, b in zip(columns["text_a"], columns["text_b"])])
    rng = np.random.default_rng(cfg.seed + 1)
    total_steps = max(1, len(train_rows) // cfg.batch_size) * cfg.epochs
    optimizer = build_optimizer([teacher], lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = linear_schedule(optimizer, int(cfg.warmup_ratio * total_steps), total_steps)
    progress = _Progress(name, total_steps, cfg.epochs, 50, 0)
    teacher.train()
    step, losses = 0, []
    for epoch in range(cfg.epochs):
        for rows in _bucketed_batches(train_rows, lengths, cfg.batch_size, rng):
            features = teacher.tokenize(columns["text_a"][rows].tolist(), columns["text_b"][rows].tolist())
            features = {k: v.to(device) for k, v in features.items()}
            with _autocast(device, cfg.precision):
                logits = teacher(features)  # [B, 3]
            loss = F.cross_entropy(logits.float(), torch.as_tensor(columns["label"][rows], device=device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(teacher.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            step += 1
            losses.append(float(loss.detach()))
            progress.update(step, epoch, {"loss": losses[-1]}, None, {})
    probs = _encode_rows(teacher, columns, label_rows, device, cfg.precision, pooled_only=False)
    return probs, {"steps": step, "final_loss": float(np.mean(losses[-50:])) if losses else None}


def _replace_dir(tmp: Path, final: Path) -> None:
    replace_directory(tmp, final)


def train_nli_teacher(model: str, columns: dict[str, np.ndarray], fold: np.ndarray, out_dir: str,
                      training: dict[str, Any], threads: int = 1, device: str | None = None,
                      features_path: str | None = None) -> dict[str, Any]:
    """Train teacher ``model``'s fold models into ``out_dir``: model f on the pairs outside fold f, labelling fold f.

    ``finetune``: each fold model fine-tunes its own copy of the transformer with the head (a fold already on disk
    is kept). Frozen: the transformer encodes every pair once (features shared by the folds) and only each fold's
    head trains on them; the transformer is saved once, as ``encoder/``, and the features at ``features_path``
    (when given), so head settings can change without encoding the pairs again. Writes per fold ``fold-<f>/``
    (``nli_head.pt``, ``nli_head.json``, ``probs.npy`` = the predictions of fold f's pairs, ``rows.npz`` = the rows it
    trained on and the rows it labelled, ``fold_info.json``), then ``teacher_info.json``. Returns that info.
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
    pooled = None
    if not cfg.finetune:
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
    fold_infos = []
    for f in range(cfg.folds):
        fold_dir = out / f"fold-{f}"
        if cfg.finetune and (fold_dir / "fold_info.json").is_file():
            fold_infos.append(json.loads((fold_dir / "fold_info.json").read_text()))
            continue
        fold_started = time.perf_counter()
        fold_tag = f"dvbert-teacher {name} fold {f + 1}/{cfg.folds}"
        train_rows, label_rows = np.flatnonzero(fold != f), np.flatnonzero(fold == f)
        torch.manual_seed(cfg.seed + f)
        tmp = out / f".fold-{f}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        if cfg.finetune:
            teacher = build_teacher(weights, cfg).to(device)
            probs, stats = _finetune_fold(teacher, columns, train_rows, label_rows, cfg, device, fold_tag)
            teacher.cpu()
            teacher.transformer.save_pretrained(tmp)
            teacher.tokenizer.save_pretrained(tmp)
            save_head(teacher, tmp, ".", cfg)
        else:
            head = build_head(pooled.shape[1], cfg.head_hidden, cfg.dropout).to(device)
            probs, stats = _fit_head(head, pooled, columns["label"], train_rows, label_rows, cfg, device,
                                     f"{fold_tag} head")
            encoder.head = head.cpu()
            save_head(encoder, tmp, "../encoder", cfg)
        accuracy = float((probs.argmax(axis=1) == columns["label"][label_rows]).mean())
        info = {"fold": f, "train_pairs": len(train_rows), "heldout_pairs": len(label_rows),
                "heldout_accuracy": accuracy, **stats, "seconds": round(time.perf_counter() - fold_started, 1)}
        np.save(tmp / "probs.npy", probs)
        np.savez(tmp / "rows.npz", train_rows=train_rows, label_rows=label_rows)
        atomic_write_json(tmp / "fold_info.json", info)
        _replace_dir(tmp, fold_dir)
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


def _run_parallel(fn, calls: list[tuple], resources) -> list[Any]:
    """``fn(*args)`` for each args tuple: as Ray tasks when Ray is up and there is more than one, else in-process."""
    try:
        import ray
    except ImportError:  # pragma: no cover - ray is a dependency
        ray = None
    if ray is not None and ray.is_initialized() and len(calls) > 1:
        options = {"num_cpus": resources.num_cpus, "num_gpus": resources.num_gpus, "max_retries": 0}
        task = ray.remote(fn).options(**options)
        return ray.get([task.remote(*args) for args in calls])
    return [fn(*args) for args in calls]


def _teacher_dir(model: str, training: TeacherTraining, data_fp: str) -> Path:
    return teachers_root() / f"{Path(model.rstrip('/')).name}-{_teacher_key(model, training, data_fp)}"


def _features_path(model: str, training: TeacherTraining, data_fp: str) -> Path:
    """Where the frozen transformer's pooled features of these pairs are kept: they depend on the weights, the
    pooling, the truncation and the precision, not on anything the head's training does."""
    from raydistill.runtime.teachers.teacher import teacher_identity

    identity = teacher_identity(model, encoder="cross", max_length=training.max_length)
    payload = json.dumps({"model": identity, "head": training.head, "precision": training.precision,
                          "data": data_fp, "format": "nli-pooled-1"}, sort_keys=True)
    key = hashlib.sha256(payload.encode()).hexdigest()[:16]
    return teachers_root() / "features" / f"{Path(model.rstrip('/')).name}-{key}.npy"


def ensure_nli_teachers(models: list[str], columns: dict[str, np.ndarray], training: TeacherTraining,
                        resources=None) -> list[dict[str, Any]]:
    """Train the teachers not cached yet (one task per teacher); return one info dict per teacher.

    Each info has ``model``, ``dir``, ``heldout_accuracy`` (out of fold, over all N pairs), ``fold_accuracy``,
    ``oof_probs`` (float32 [N, 3]: pair i predicted by the fold model of fold ``fold[i]``, which never trained on
    it), ``fold`` (int64 [N]), ``cached``, ``seconds``.
    """
    from raydistill.config.job import RoleResources

    resources = resources or RoleResources()
    data_fp = _fingerprint(columns)
    fold = fold_assignment(len(columns["label"]), training.folds, training.seed)
    dirs = [_teacher_dir(m, training, data_fp) for m in models]
    missing = [(m, d) for m, d in zip(models, dirs) if not (d / "teacher_info.json").is_file()]
    if missing:
        print(f"[dvbert] training {len(missing)} NLI cross-encoder teacher(s) ({', '.join(m for m, _ in missing)}) "
              f"on {len(fold)} pairs in {training.folds} folds", flush=True)
        _run_parallel(train_nli_teacher, [(m, columns, fold, str(d), asdict(training), resources.threads, None,
                                           None if training.finetune else str(_features_path(m, training, data_fp)))
                                          for m, d in missing], resources)
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
