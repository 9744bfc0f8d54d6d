"""DvBERT's interaction-view teachers: K cross-encoders fine-tuned on labelled NLI pairs, and their soft labels.

DvBERT (Cheng, SIGIR 2021, arXiv 2104.08675) distils *several* interaction-view models (cross-attention BERTs over
the concatenated pair) into a siamese sentence encoder. No code was released; this follows the reconstruction in
../shared/notes/methods.md §5 (marked unverified there): each teacher is a 3-way NLI classifier

    logits_k = head_k(transformer_k("[CLS] premise [SEP] hypothesis [SEP]"))       # [N, 3]
    teacher_probs = (1/K) · Σ_k softmax(logits_k)                                    # [N, 3], frozen

fine-tuned on the gold labels first, from different model families where possible (here ``minilm-l6``, a BERT, and
``bert-small``, an MPNet-architecture model derived from all-mpnet-base-v2), so the teachers' errors differ.

Teachers are expensive on CPU, so each is trained once per (model weights, NLI data, training settings) and kept
under ``$RAYDISTILL_HOME/dvbert-teachers/<name>-<key>/`` (an HF sequence-classification directory plus
``teacher_info.json`` with its held-out NLI accuracy); soft labels are kept next to it per data fingerprint.
When Ray is running the K teachers train in parallel as Ray tasks with ``resources.teacher`` CPUs/GPUs each.

Labelled NLI data available offline: SNLI dev + MultiNLI dev (≈29k pairs; ../shared/README.md). A held-out 5 % is
never trained on by the teachers and gives their accuracy.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["NLI_LABELS", "TeacherTraining", "nli_pairs", "ensure_nli_teachers", "teacher_soft_labels",
           "train_nli_cross_encoder"]

# The student side (teacher annealing, λ·gold + (1−λ)·teachers) is ``raydistill.objectives.DvBERTLoss``.

log = logging.getLogger(__name__)

NLI_LABELS = ("entailment", "neutral", "contradiction")


@dataclass
class TeacherTraining:
    """How each cross-encoder teacher is fine-tuned (Trans-Encoder/SBERT cross-encoder defaults)."""

    epochs: int = 1
    lr: float = 2e-5
    batch_size: int = 32
    max_length: int = 64
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    heldout_fraction: float = 0.05
    seed: int = 1000

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "TeacherTraining":
        d = dict(d or {})
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"extra.teacher_training: unknown field(s) {sorted(unknown)}; allowed: "
                             f"{', '.join(cls.__dataclass_fields__)}")
        return cls(**d)


def nli_pairs(max_pairs: int | None = None, seed: int = 1000) -> dict[str, np.ndarray]:
    """SNLI dev + MultiNLI dev as columns ``text_a`` (premise), ``text_b`` (hypothesis), ``label`` (0/1/2).

    A deterministic random subset of ``max_pairs`` when given (CPU-sized runs).
    """
    from raydistill.data import load_dataset

    pairs = list(load_dataset("snli_dev")) + list(load_dataset("mnli_dev"))
    label_of = {name: i for i, name in enumerate(NLI_LABELS)}
    if max_pairs is not None and max_pairs < len(pairs):
        keep = np.sort(np.random.default_rng(seed).choice(len(pairs), size=max_pairs, replace=False))
        pairs = [pairs[i] for i in keep]
    return {
        "text_a": np.array([p.sentence1 for p in pairs], dtype=object),
        "text_b": np.array([p.sentence2 for p in pairs], dtype=object),
        "label": np.array([label_of[p.label] for p in pairs], dtype=np.int64),
    }


def _fingerprint(columns: dict[str, np.ndarray]) -> str:
    digest = hashlib.sha256()
    for a, b, y in zip(columns["text_a"], columns["text_b"], columns["label"]):
        digest.update(f"{a}\t{b}\t{int(y)}\n".encode())
    return digest.hexdigest()[:16]


def _teacher_key(model: str, training: TeacherTraining, data_fp: str) -> str:
    from raydistill.runtime.teacher import teacher_identity

    identity = teacher_identity(model, encoder="cross", max_length=training.max_length)
    payload = json.dumps({"model": identity, "training": asdict(training), "data": data_fp}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def teachers_root() -> Path:
    from raydistill.runtime.config import raydistill_home

    return raydistill_home() / "dvbert-teachers"


# ----------------------------------------------------------------------------------------------------------------
# Training one teacher (plain function: runs in-process or as a Ray task)


def train_nli_cross_encoder(model: str, columns: dict[str, np.ndarray], out_dir: str, training: dict[str, Any],
                            threads: int = 1, device: str | None = None) -> dict[str, Any]:
    """Fine-tune ``model`` as a 3-way NLI cross-encoder on ``columns``; write it atomically to ``out_dir``.

    Loss: cross-entropy on the gold label; AdamW (wd 0.01 except bias/LayerNorm), linear warm-up 10 % then decay,
    grad clip 1. Returns the info written to ``teacher_info.json`` (held-out accuracy, steps, seconds).
    """
    import torch
    import torch.nn.functional as F

    from raydistill.models import CrossEncoder, resolve_model
    from raydistill.runtime.learner import build_optimizer, linear_schedule

    cfg = TeacherTraining(**training)
    torch.set_num_threads(max(1, int(threads)))
    torch.manual_seed(cfg.seed)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    started = time.perf_counter()

    n = len(columns["label"])
    order = np.random.default_rng(cfg.seed).permutation(n)
    n_heldout = max(1, int(round(cfg.heldout_fraction * n)))
    heldout, train_rows = order[:n_heldout], order[n_heldout:]

    encoder = CrossEncoder.from_pretrained(str(resolve_model(model)), num_labels=len(NLI_LABELS),
                                           max_length=cfg.max_length).to(device)
    encoder.train()
    steps_per_epoch = len(train_rows) // cfg.batch_size
    total_steps = max(1, steps_per_epoch * cfg.epochs)
    optimizer = build_optimizer([encoder], lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = linear_schedule(optimizer, int(cfg.warmup_ratio * total_steps), total_steps)
    rng = np.random.default_rng(cfg.seed + 1)
    step, losses = 0, []
    for _ in range(cfg.epochs):
        epoch_rows = rng.permutation(train_rows)
        for b in range(steps_per_epoch):
            rows = epoch_rows[b * cfg.batch_size:(b + 1) * cfg.batch_size]
            features = encoder.tokenize([(columns["text_a"][i], columns["text_b"][i]) for i in rows])
            features = {k: v.to(device) for k, v in features.items()}
            logits = encoder(features)  # [B, 3]
            gold = torch.as_tensor(columns["label"][rows], device=device)  # [B]
            loss = F.cross_entropy(logits, gold)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(encoder.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            step += 1
            losses.append(float(loss.detach()))
            if step % 100 == 0 or step == total_steps:
                print(f"[dvbert-teacher {model}] step {step}/{total_steps} loss {np.mean(losses[-100:]):.4f}",
                      flush=True)

    heldout_pairs = [(columns["text_a"][i], columns["text_b"][i]) for i in heldout]
    probs = encoder.score(heldout_pairs, batch_size=128, activation="softmax")  # [n_heldout, 3]
    accuracy = float((probs.argmax(axis=1) == columns["label"][heldout]).mean())

    out = Path(out_dir)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    encoder.cpu().save(tmp)
    info = {"model": model, "training": asdict(cfg), "train_pairs": int(len(train_rows)),
            "heldout_pairs": int(n_heldout), "heldout_accuracy": accuracy, "steps": step,
            "final_loss": float(np.mean(losses[-50:])) if losses else None,
            "seconds": round(time.perf_counter() - started, 1)}
    (tmp / "teacher_info.json").write_text(json.dumps(info, indent=2))
    if out.exists():  # another process finished the same teacher first: theirs is as good as ours
        shutil.rmtree(tmp, ignore_errors=True)
        return json.loads((out / "teacher_info.json").read_text())
    os.replace(tmp, out)
    print(f"[dvbert-teacher {model}] held-out NLI accuracy {accuracy:.3f} ({n_heldout} pairs), "
          f"{info['seconds']:.0f}s", flush=True)
    return info


def _score_nli(teacher_dir: str, columns: dict[str, np.ndarray], max_length: int, threads: int = 1,
               batch_size: int = 128) -> np.ndarray:
    import torch

    from raydistill.models import CrossEncoder

    torch.set_num_threads(max(1, int(threads)))
    encoder = CrossEncoder.from_pretrained(teacher_dir, num_labels=len(NLI_LABELS), max_length=max_length)
    if torch.cuda.is_available():
        encoder = encoder.cuda()
    pairs = list(zip(columns["text_a"].tolist(), columns["text_b"].tolist()))
    return encoder.score(pairs, batch_size=batch_size, activation="softmax").astype(np.float32)  # [N, 3]


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


def ensure_nli_teachers(models: list[str], columns: dict[str, np.ndarray], training: TeacherTraining,
                        resources=None) -> list[dict[str, Any]]:
    """Train the teachers not cached yet; return one info dict per model (``dir``, ``heldout_accuracy``, ...)."""
    from raydistill.runtime.config import RoleResources

    resources = resources or RoleResources()
    data_fp = _fingerprint(columns)
    root = teachers_root()
    root.mkdir(parents=True, exist_ok=True)
    dirs = [root / f"{Path(m.rstrip('/')).name}-{_teacher_key(m, training, data_fp)}" for m in models]
    missing = [(m, d) for m, d in zip(models, dirs) if not (d / "teacher_info.json").is_file()]
    if missing:
        print(f"[dvbert] fine-tuning {len(missing)} NLI cross-encoder teacher(s): "
              f"{', '.join(m for m, _ in missing)} on {len(columns['label'])} pairs", flush=True)
        _run_parallel(train_nli_cross_encoder,
                      [(m, columns, str(d), asdict(training), resources.threads) for m, d in missing], resources)
    infos = []
    for model, directory in zip(models, dirs):
        info = json.loads((directory / "teacher_info.json").read_text())
        info.update({"dir": str(directory), "cached": (model, directory) not in missing})
        infos.append(info)
    return infos


def teacher_soft_labels(teacher_infos: list[dict[str, Any]], columns: dict[str, np.ndarray], max_length: int,
                        resources=None) -> tuple[np.ndarray, dict[str, Any]]:
    """Mean of the teachers' softmax over the NLI classes for every pair, float32 [N, 3]; cached per teacher/data.

    Returns (soft labels, stats: per-teacher agreement with the gold labels on these pairs, cache hits).
    """
    from raydistill.runtime.config import RoleResources

    resources = resources or RoleResources()
    data_fp = _fingerprint(columns)
    per_teacher: list[np.ndarray | None] = []
    todo = []
    for info in teacher_infos:
        path = Path(info["dir"]) / f"soft-labels-{data_fp}.npy"
        if path.is_file():
            per_teacher.append(np.load(path))
        else:
            per_teacher.append(None)
            todo.append(len(per_teacher) - 1)
    if todo:
        scored = _run_parallel(_score_nli, [(teacher_infos[i]["dir"], columns, max_length, resources.threads)
                                            for i in todo], resources)
        for i, probs in zip(todo, scored):
            path = Path(teacher_infos[i]["dir"]) / f"soft-labels-{data_fp}.npy"
            tmp = path.with_suffix(f".tmp-{os.getpid()}.npy")
            np.save(tmp, probs)
            os.replace(tmp, path)
            per_teacher[i] = probs
    stacked = np.stack(per_teacher)  # [K, N, 3]
    gold = columns["label"]
    stats = {"teachers": len(teacher_infos), "soft_label_cache_hits": len(teacher_infos) - len(todo),
             "train_agreement": [float((p.argmax(1) == gold).mean()) for p in stacked],
             "ensemble_train_agreement": float((stacked.mean(0).argmax(1) == gold).mean())}
    return stacked.mean(axis=0).astype(np.float32), stats
