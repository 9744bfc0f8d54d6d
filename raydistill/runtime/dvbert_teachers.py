"""DvBERT's interaction-view teachers: K cross-encoders fine-tuned on labelled NLI pairs, and their out-of-fold labels.

DvBERT (Cheng, "Dual-View Distilled BERT for Sentence Embedding", SIGIR 2021, arXiv:2104.08675) distils K
interaction-view models into a siamese sentence encoder. The paper's interaction view: K pre-trained models each
read ``[CLS] premise [SEP] hypothesis [SEP]``, map [CLS] through one fully connected layer to a 3-way softmax, are
first trained on the labelled NLI data with cross-entropy, and then relabel the training set; those predictions
are held fixed while the student trains (the student side is ``raydistill.objectives.DvBERTLoss``):

    q_k(a, b) = softmax(head_k(transformer_k(a, b)))               # [3], teacher k, frozen once computed
    teacher_probs(a, b) = (1/K) · Σ_k q_k(a, b)                     # [3]

Three things differ here from the paper's recipe, each for a measured reason (results/diag-dvbert-teachers.json):

* **Out-of-fold labels.** A classifier that relabels the pairs it was trained on returns near one-hot predictions:
  little dark knowledge, and a held-out accuracy that says nothing. Here each teacher is trained ``folds`` times,
  model f on every pair outside fold f, and model f labels fold f only. Every pair is then labelled by every one
  of the K teachers (by the copy that never saw it), so the ensemble mean keeps all K views, and the teacher's
  accuracy over all pairs is an honest held-out accuracy. Two folds cost what one teacher on all pairs costs
  (two models on half the pairs each); more folds buy larger training sets at (folds − 1)× the cost. Splitting
  the K teachers across folds instead (teacher k trains on fold k̄, labels fold k) would cost half as much but leave
  each pair with one teacher's label, which is not an ensemble.
* **The head.** ``head: cls`` is the paper's [CLS] → FC. The teachers here are derived sentence encoders trained
  with mean pooling, and a fresh classifier on [CLS] learns next to nothing in the few hundred updates a CPU run
  affords (held-out accuracy at chance, loss ln 3). ``head: segments`` reads what such a checkpoint already
  knows: the mean token state of each sentence *inside the joint encoding* (its tokens still attend to the other
  sentence), combined as ``[a; b; |a − b|; a ⊙ b]`` → FC → softmax. ``head: mean`` is the mean over all tokens.
* **Fewer labelled pairs.** The only labelled NLI data available offline is SNLI dev + MultiNLI dev (≈29.5k
  pairs, raydistill/data/bundled/nli/), not SNLI + MultiNLI train (≈940k).

A teacher below ``min_accuracy`` held-out accuracy is refused before the student trains (``TeacherAccuracyError``,
naming it and its accuracy): a teacher at chance only adds label smoothing that fades with the annealing. The
trained teachers stay cached either way, under ``$RAYDISTILL_HOME/dvbert-teachers/<name>-<key>/`` (``fold-<f>/``:
the transformer, its tokenizer and ``nli_head.pt``; ``teacher_info.json``: per-fold and overall held-out
accuracy; ``oof-probs.npy``: the out-of-fold predictions), keyed by the model weights, the NLI pairs and the
training settings (not ``min_accuracy``, which only judges them). With Ray running, the K × folds models train
in parallel as Ray tasks with ``resources.teacher`` CPUs/GPUs each.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raydistill.runtime.config import ConfigError

__all__ = ["NLI_LABELS", "HEADS", "TeacherTraining", "TeacherAccuracyError", "NLITeacher", "nli_pairs",
           "fold_assignment", "ensure_nli_teachers", "check_teacher_accuracy", "out_of_fold_soft_labels",
           "train_nli_teacher_fold"]

log = logging.getLogger(__name__)

NLI_LABELS = ("entailment", "neutral", "contradiction")
HEADS = ("cls", "mean", "segments")
PRECISIONS = ("fp32", "bf16")

# Fields that judge the teachers rather than shape them: not part of the cache key, so changing the bar never
# retrains anything.
_JUDGING_FIELDS = ("min_accuracy",)


class TeacherAccuracyError(ConfigError):
    """A DvBERT teacher's held-out NLI accuracy is below ``extra.teacher_training.min_accuracy``.

    A ``ConfigError``: the fix is a config field (the teacher training, or the bar), so the job ends with this
    message and exit status 2, not a traceback."""


@dataclass
class TeacherTraining:
    """How each cross-encoder teacher is fine-tuned and judged (``extra.teacher_training`` of a DvBERT config).

    The defaults are the paper's schedule (1 epoch, Adam lr 2e-5, 10 % warm-up, dropout 0.1) on its [CLS] head;
    raydistill/configs/dvbert.yaml sets what trains on a CPU (see its comments and the module docstring).
    """

    epochs: int = 1
    lr: float = 2e-5
    batch_size: int = 32
    max_length: int = 64
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    dropout: float = 0.1          # on the head's input; the transformer keeps its own config's dropout
    head: str = "cls"             # cls (the paper's), mean (all tokens), segments ([a; b; |a-b|; a*b] of the two
                                  # sentences' mean token states)
    folds: int = 2                # each teacher trains `folds` models; model f labels only fold f
    max_pairs: int | None = None  # None: every labelled NLI pair shipped (SNLI dev + MultiNLI dev)
    precision: str = "fp32"       # bf16: forward and backward under torch.autocast(bfloat16); weights stay fp32
    min_accuracy: float = 0.6     # refuse a teacher whose held-out accuracy is below this
    seed: int = 1000

    def __post_init__(self) -> None:
        if self.head not in HEADS:
            raise ValueError(f"head must be one of {', '.join(HEADS)}, got {self.head!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if isinstance(self.folds, bool) or not isinstance(self.folds, int) or self.folds < 2:
            raise ValueError(f"folds must be an integer >= 2 (each pair is labelled by a model that did not train "
                             f"on it), got {self.folds!r}")
        if not (isinstance(self.min_accuracy, (int, float)) and 0.0 <= self.min_accuracy <= 1.0):
            raise ValueError(f"min_accuracy must be a number in [0, 1], got {self.min_accuracy!r}")
        for name in ("epochs", "batch_size", "max_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not (isinstance(self.lr, (int, float)) and self.lr > 0):
            raise ValueError(f"lr must be a number > 0, got {self.lr!r}")
        if self.max_pairs is not None and (isinstance(self.max_pairs, bool) or not isinstance(self.max_pairs, int)
                                           or self.max_pairs < 2 * self.folds):
            raise ValueError(f"max_pairs must be null (all pairs) or an integer >= 2 x folds, got {self.max_pairs!r}")

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "TeacherTraining":
        d = dict(d or {})
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"extra.teacher_training: unknown field(s) {sorted(unknown)}; allowed: "
                             f"{', '.join(cls.__dataclass_fields__)}")
        return cls(**d)

    def shaping(self) -> dict[str, Any]:
        """The settings that determine the trained models (the cache key's part)."""
        return {k: v for k, v in asdict(self).items() if k not in _JUDGING_FIELDS}


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
    from raydistill.runtime.teacher import teacher_identity

    identity = teacher_identity(model, encoder="cross", max_length=training.max_length)
    payload = json.dumps({"model": identity, "training": training.shaping(), "data": data_fp,
                          "format": "nli-teacher-oof-1"}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def teachers_root() -> Path:
    from raydistill.runtime.config import raydistill_home

    return raydistill_home() / "dvbert-teachers"


# ----------------------------------------------------------------------------------------------------------------
# The teacher model


def _torch_modules():
    import torch
    from torch import nn

    return torch, nn


class NLITeacher:
    """A transformer reading both sentences at once plus a 3-way head; ``logits(features)`` → [B, 3].

    Built lazily as a torch module (``NLITeacher.build``) so importing this module does not import torch.
    """

    @staticmethod
    def build(weights_dir: str | Path, head: str, dropout: float = 0.1, max_length: int = 64):
        torch, nn = _torch_modules()
        from transformers import AutoModel, AutoTokenizer

        from raydistill.models.batching import forward_input_names, masked_mean, usable_max_length

        class _NLITeacher(nn.Module):
            def __init__(self):
                super().__init__()
                self.transformer = AutoModel.from_pretrained(weights_dir, local_files_only=True,
                                                             dtype=torch.float32)
                self.tokenizer = AutoTokenizer.from_pretrained(weights_dir, local_files_only=True)
                self.max_length = usable_max_length(self.transformer.config, self.tokenizer, max_length,
                                                    Path(weights_dir))
                self.input_names = forward_input_names(self.transformer)
                self.head_kind = head
                hidden = self.transformer.config.hidden_size
                self.dropout = nn.Dropout(dropout)
                self.classifier = nn.Linear(4 * hidden if head == "segments" else hidden, len(NLI_LABELS))
                specials = sorted(set(self.tokenizer.all_special_ids))
                self.register_buffer("special_ids", torch.tensor(specials), persistent=False)
                if head == "segments" and self.tokenizer.sep_token_id is None:
                    raise ValueError(f"head 'segments' finds the hypothesis after the separator token; the "
                                     f"tokenizer of {weights_dir} has none")

            def tokenize(self, first: list[str], second: list[str]) -> dict[str, Any]:
                return dict(self.tokenizer(first, second, padding=True, truncation="longest_first",
                                           max_length=self.max_length, return_tensors="pt"))

            def forward(self, features: dict[str, Any]):
                inputs = {k: v for k, v in features.items() if k in self.input_names}
                hidden = self.transformer(**inputs).last_hidden_state  # [B, T, H]
                if self.head_kind == "cls":
                    pooled = hidden[:, 0]  # [B, H]
                else:
                    ids, mask = features["input_ids"], features["attention_mask"]
                    is_word = mask.bool() & ~torch.isin(ids, self.special_ids)  # [B, T]
                    if self.head_kind == "mean":
                        pooled = masked_mean(hidden, is_word)  # [B, H]
                    else:
                        after_sep = torch.cumsum((ids == self.tokenizer.sep_token_id).long(), dim=1) > 0  # [B, T]
                        a = masked_mean(hidden, is_word & ~after_sep)  # [B, H] premise tokens
                        b = masked_mean(hidden, is_word & after_sep)  # [B, H] hypothesis tokens
                        pooled = torch.cat([a, b, (a - b).abs(), a * b], dim=1)  # [B, 4H]
                return self.classifier(self.dropout(pooled))  # [B, 3]

            def save(self, directory: Path) -> None:
                directory.mkdir(parents=True, exist_ok=True)
                self.transformer.save_pretrained(directory)
                self.tokenizer.save_pretrained(directory)
                torch.save(self.classifier.state_dict(), directory / "nli_head.pt")
                (directory / "nli_head.json").write_text(json.dumps(
                    {"head": self.head_kind, "labels": list(NLI_LABELS), "max_length": self.max_length}, indent=2))

        return _NLITeacher()

    @staticmethod
    def load(directory: str | Path, dropout: float = 0.1):
        """A saved teacher (``fold-<f>/`` of the cache), in eval mode."""
        torch, _ = _torch_modules()
        directory = Path(directory)
        meta = json.loads((directory / "nli_head.json").read_text())
        teacher = NLITeacher.build(directory, meta["head"], dropout, meta["max_length"])
        teacher.classifier.load_state_dict(torch.load(directory / "nli_head.pt", map_location="cpu"))
        return teacher.eval()


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


def _predict(teacher, columns: dict[str, np.ndarray], rows: np.ndarray, device: str, precision: str,
             batch_size: int = 128) -> np.ndarray:
    """Softmax over the 3 classes for ``rows``, float32 [len(rows), 3], in the order of ``rows``."""
    import torch

    from raydistill.models.batching import inference, length_sorted_batches

    probs = np.zeros((len(rows), len(NLI_LABELS)), dtype=np.float32)
    lengths = [len(columns["text_a"][r]) + len(columns["text_b"][r]) for r in rows]
    with inference(teacher), _autocast(device, precision):
        for batch in length_sorted_batches(lengths, batch_size):
            picked = rows[batch]
            features = teacher.tokenize(columns["text_a"][picked].tolist(), columns["text_b"][picked].tolist())
            features = {k: v.to(device) for k, v in features.items()}
            probs[batch] = torch.softmax(teacher(features).float(), dim=-1).cpu().numpy()
    return probs


# ----------------------------------------------------------------------------------------------------------------
# Training one fold model (plain function: runs in-process or as a Ray task)


def train_nli_teacher_fold(model: str, columns: dict[str, np.ndarray], train_rows: np.ndarray,
                           label_rows: np.ndarray, out_dir: str | None, training: dict[str, Any],
                           threads: int = 1, device: str | None = None) -> dict[str, Any]:
    """Fine-tune ``model`` as a 3-way NLI cross-encoder on ``train_rows``; predict ``label_rows`` (never trained on).

    Loss: cross-entropy on the gold label; AdamW (wd except bias/LayerNorm), linear warm-up then decay, grad clip 1.
    Writes, atomically, ``out_dir`` (the model, ``fold_info.json``, ``probs.npy`` = the predictions for
    ``label_rows`` in their order) unless ``out_dir`` is None. Returns the info plus ``probs``.
    """
    import torch
    import torch.nn.functional as F

    from raydistill.models import resolve_model
    from raydistill.models.bi_encoder import transformer_directory
    from raydistill.runtime.learner import build_optimizer, linear_schedule

    cfg = TeacherTraining(**training)
    torch.set_num_threads(max(1, int(threads)))
    torch.manual_seed(cfg.seed)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    started = time.perf_counter()
    train_rows, label_rows = np.asarray(train_rows), np.asarray(label_rows)

    teacher = NLITeacher.build(transformer_directory(resolve_model(model)), cfg.head, cfg.dropout,
                               cfg.max_length).to(device)
    teacher.train()
    lengths = np.array([len(a) + len(b) for a, b in zip(columns["text_a"], columns["text_b"])])
    rng = np.random.default_rng(cfg.seed + 1)
    steps_per_epoch = max(1, len(train_rows) // cfg.batch_size)
    total_steps = steps_per_epoch * cfg.epochs
    optimizer = build_optimizer([teacher], lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = linear_schedule(optimizer, int(cfg.warmup_ratio * total_steps), total_steps)
    step, losses = 0, []
    for _ in range(cfg.epochs):
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
            if step % 50 == 0 or step == total_steps:
                print(f"[dvbert-teacher {model}] step {step}/{total_steps} loss {np.mean(losses[-50:]):.4f} "
                      f"({time.perf_counter() - started:.0f}s)", flush=True)

    probs = _predict(teacher, columns, label_rows, device, cfg.precision)  # [len(label_rows), 3]
    accuracy = float((probs.argmax(axis=1) == columns["label"][label_rows]).mean())
    info = {"model": model, "training": asdict(cfg), "train_pairs": int(len(train_rows)),
            "heldout_pairs": int(len(label_rows)), "heldout_accuracy": accuracy, "steps": step,
            "final_loss": float(np.mean(losses[-50:])) if losses else None,
            "seconds": round(time.perf_counter() - started, 1)}
    print(f"[dvbert-teacher {model}] held-out NLI accuracy {accuracy:.3f} ({len(label_rows)} pairs), "
          f"{info['seconds']:.0f}s", flush=True)
    if out_dir is not None:
        out = Path(out_dir)
        tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        teacher.cpu().save(tmp)
        np.save(tmp / "probs.npy", probs)
        (tmp / "fold_info.json").write_text(json.dumps(info, indent=2))
        if out.exists():  # another process finished the same fold first: theirs is as good as ours
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            os.replace(tmp, out)
    return {**info, "probs": probs}


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


def ensure_nli_teachers(models: list[str], columns: dict[str, np.ndarray], training: TeacherTraining,
                        resources=None) -> list[dict[str, Any]]:
    """Train the fold models not cached yet; return one info dict per teacher.

    Each info has ``model``, ``dir``, ``heldout_accuracy`` (out-of-fold, over all N pairs), ``fold_accuracy``,
    ``oof_probs`` (float32 [N, 3]: pair i predicted by the model of fold ``fold[i]``, which never trained on it),
    ``fold`` (int64 [N]), ``cached``, ``seconds``.
    """
    from raydistill.runtime.config import RoleResources

    resources = resources or RoleResources()
    data_fp = _fingerprint(columns)
    n = len(columns["label"])
    fold = fold_assignment(n, training.folds, training.seed)
    dirs = [_teacher_dir(m, training, data_fp) for m in models]
    for directory in dirs:
        directory.mkdir(parents=True, exist_ok=True)
    calls, missing = [], []
    for f in range(training.folds):  # fold-major, so parallel tasks spread over the teachers
        for model, directory in zip(models, dirs):
            if not (directory / f"fold-{f}" / "fold_info.json").is_file():
                missing.append((model, f))
                calls.append((model, columns, np.flatnonzero(fold != f), np.flatnonzero(fold == f),
                              str(directory / f"fold-{f}"), asdict(training), resources.threads))
    if calls:
        print(f"[dvbert] fine-tuning {len(calls)} NLI cross-encoder fold model(s) "
              f"({', '.join(f'{m} fold {f}' for m, f in missing)}) on {n} pairs in {training.folds} folds",
              flush=True)
        _run_parallel(train_nli_teacher_fold, calls, resources)
    infos = []
    for model, directory in zip(models, dirs):
        oof = np.zeros((n, len(NLI_LABELS)), dtype=np.float32)
        fold_infos = []
        for f in range(training.folds):
            fold_dir = directory / f"fold-{f}"
            fold_infos.append(json.loads((fold_dir / "fold_info.json").read_text()))
            oof[fold == f] = np.load(fold_dir / "probs.npy")
        accuracy = float((oof.argmax(axis=1) == columns["label"]).mean())
        info = {"model": model, "training": training.shaping(), "pairs": n, "folds": training.folds,
                "heldout_accuracy": accuracy, "fold_accuracy": [fi["heldout_accuracy"] for fi in fold_infos],
                "final_loss": [fi["final_loss"] for fi in fold_infos],
                "steps": sum(fi["steps"] for fi in fold_infos),
                "seconds": round(sum(fi["seconds"] for fi in fold_infos), 1)}
        (directory / "teacher_info.json").write_text(json.dumps(info, indent=2))
        np.save(directory / "oof-probs.npy", oof)
        infos.append({**info, "dir": str(directory), "oof_probs": oof, "fold": fold,
                      "cached": not any(m == model for m, _ in missing)})
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
