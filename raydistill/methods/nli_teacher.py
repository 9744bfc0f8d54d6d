"""DvBERT's interaction-view teacher as a method of the engine: a cross-encoder fine-tuned on labelled NLI pairs.

    rows      (text_a, text_b, label, idx): the pairs of one teacher fold's training part, in length-bucketed
              batches (the job's ``LengthBucketedArrayData``: NLI pairs run from ~10 to ~90 tokens)
    student   ``build_teacher``: a transformer reading ``premise [SEP] hypothesis`` and a 3-way head on what
              ``pool_pair`` reads from the joint encoding (``extra.teacher_training``: head, head_hidden, dropout,
              max_length), from ``init_model`` (the teacher's transformer directory)
    loss      L = mean_i CE(y_i, softmax(teacher(a_i, b_i)))       (objectives.LogitCrossEntropyLoss)
    dev       accuracy x 100 on the fold's held-out pairs (``extra.heldout``); reported, not used for selection

``methods.nli_head`` is the frozen-transformer variant. DvBERT (``methods.dvbert_teachers``) runs each fold through
``StageServices.fit`` and keeps the LAST step's model: the held-out fold is what it labels, so choosing a step by
its accuracy there would leak the labels into the labelling. Each evaluation writes its predictions beside the
stage's checkpoints (``HELDOUT_PROBS``, with a digest of the head), so the final one doubles as the labelling pass.
The model code lives here because a method builds its student and may not import the runtime:

    teacher = build_teacher(weights_dir, training)   # teacher(features) -> [B, 3] logits
    teacher = load_teacher(fold_dir)                 # a saved fold model, eval mode
"""
from __future__ import annotations

import json
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field, StrictBool

from raydistill.config.job import JobConfig
from raydistill.config.schema import Int, Number, build, section
from raydistill.fileio import atomic_write_json, atomic_writer
from raydistill.methods.base import ExtraSettings, Features, MethodSpec, StepContext
from raydistill.methods.sts_cosine import rows_method
from raydistill.objectives import LogitCrossEntropyLoss
from raydistill.objectives.distilcse_nli import NLI_LABELS

__all__ = ["SPEC", "HELDOUT_PROBS", "NLI_LABELS", "HEADS", "PRECISIONS", "TeacherTraining", "NLITeacherStageSettings",
           "NLITeacherStageSpec", "build_teacher",
           "load_teacher", "build_head", "encode_rows", "head_digest", "pool_pair", "save_head"]

HEADS = ("cls", "mean", "segments", "aligned")
PRECISIONS = ("fp32", "bf16")

# Fields that judge the teachers rather than shape them: not part of the cache key, so changing the bar never
# retrains anything.
_JUDGING_FIELDS = ("min_accuracy",)


@section
class TeacherTraining:
    """How each cross-encoder teacher is fine-tuned and judged (``extra.teacher_training`` of a DvBERT config).

    Defaults: the paper's schedule (1 epoch, Adam lr 2e-5, 10 % warm-up, dropout 0.1) on its [CLS] head
    (raydistill/configs/dvbert.yaml sets what trains on a CPU). Numbers keep the kind they were written in (int or
    float): the shaping settings name the teachers' cache entry."""

    epochs: Int = Field(1, ge=1, description="passes over the teacher's folds")
    lr: Number = Field(2e-5, gt=0, description="peak learning rate (Adam)")
    batch_size: Int = Field(32, ge=1, description="pairs per step")
    max_length: Int = Field(64, ge=1, description="tokens per pair")
    warmup_ratio: Number = Field(0.1, ge=0, lt=1, description="share of the steps spent warming up")
    weight_decay: Number = Field(0.01, ge=0, description="weight decay")
    dropout: Number = Field(0.1, ge=0, lt=1, description="dropout in the head (the transformer keeps its own config's)")
    finetune: StrictBool = Field(True, description="false: the transformer stays frozen, encodes each pair once, "
                                                   "only the head trains")
    head: Literal[HEADS] = Field(
        "cls", description="what the head reads (pool_pair): cls (the paper's), mean, segments, aligned")
    head_hidden: Int = Field(0, ge=0, description="0: one FC layer (the paper's); n: FC(n) -> GELU -> FC")
    folds: Int = Field(2, ge=2, description="each teacher trains this many models; model f labels only fold f (a "
                                            "pair is labelled by a model that did not train on it)")
    max_pairs: Int | None = Field(None, description="labelled NLI pairs (null: every pair shipped, SNLI dev + "
                                                    "MultiNLI dev); at least 2 x folds")
    precision: Literal[PRECISIONS] = Field("fp32", description="bf16: forward and backward under "
                                                                   "torch.autocast(bfloat16); weights stay fp32")
    min_accuracy: Number = Field(0.6, ge=0, le=1, description="refuse a teacher whose held-out accuracy is below this")
    seed: Int = Field(1000, description="seed of the folds and the teachers' initialisation")

    def __post_init__(self) -> None:
        if self.max_pairs is not None and self.max_pairs < 2 * self.folds:
            raise ValueError(f"max_pairs must be null (all pairs) or an integer >= 2 x folds, got {self.max_pairs!r}")

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> TeacherTraining:
        """Checked settings; a problem raises ConfigError (a ValueError) naming ``extra.teacher_training.<key>``."""
        return build(cls, dict(d or {}), prefix="extra.teacher_training.")

    def shaping(self) -> dict[str, Any]:
        """The settings that determine the trained models (the cache key's part)."""
        return {k: v for k, v in asdict(self).items() if k not in _JUDGING_FIELDS}


# Coverage statistics of the "aligned" head, per pair: how well the hypothesis's tokens find a match among the
# premise's (the strongest single cue for entailment) and the two sentences' lengths in tokens / 20.
_COVERAGE = ("hypothesis_mean_best_cos", "hypothesis_min_best_cos", "premise_mean_best_cos",
             "hypothesis_share_matched", "hypothesis_tokens", "premise_tokens")


def pool_pair(hidden, input_ids, attention_mask, special_ids, sep_token_id: int | None, head: str):
    """What the head reads from the joint encoding ``hidden`` [B, T, H] of ``premise [SEP] hypothesis``: [B, D].

    cls: the first token's state. mean: the mean state of the words (no special tokens, no padding). segments:
    ``[a; b; |a − b|; a ⊙ b]`` of the premise's and the hypothesis's mean word states. aligned: segments, then the
    same four-way combination of each hypothesis word with its soft-aligned premise summary (attention over the
    premise words by cosine, ESIM's local inference without the BiLSTMs) averaged over the hypothesis, then
    ``_COVERAGE``.
    """
    from raydistill.models.batching import masked_mean

    if head == "cls":
        return hidden[:, 0]  # [B, H]
    is_word = attention_mask.bool() & ~torch.isin(input_ids, special_ids)  # [B, T]
    if head == "mean":
        return masked_mean(hidden, is_word)  # [B, H]
    after_sep = torch.cumsum((input_ids == sep_token_id).long(), dim=1) > 0  # [B, T]
    premise, hypothesis = is_word & ~after_sep, is_word & after_sep  # [B, T] each
    a, b = masked_mean(hidden, premise), masked_mean(hidden, hypothesis)  # [B, H]
    segments = torch.cat([a, b, (a - b).abs(), a * b], dim=1)  # [B, 4H]
    if head == "segments":
        return segments
    unit = torch.nn.functional.normalize(hidden.float(), dim=-1)  # [B, T, H]
    cos = unit @ unit.transpose(1, 2)  # [B, T, T]: hypothesis position j (rows) against premise position i
    links = hypothesis.unsqueeze(2) & premise.unsqueeze(1)  # [B, T, T]
    cos = cos.masked_fill(~links, -1e4)
    weights = torch.softmax(cos * 20.0, dim=2) * links  # [B, T, T]; a sharp softmax: near the best match
    aligned = (weights @ hidden.float()).to(hidden.dtype)  # [B, T, H]
    local = torch.cat([hidden, aligned, (hidden - aligned).abs(), hidden * aligned], dim=-1)  # [B, T, 4H]
    best_for_hypothesis = cos.max(dim=2).values.clamp(min=-1.0)  # [B, T]
    best_for_premise = cos.max(dim=1).values.clamp(min=-1.0)  # [B, T]
    h_count, p_count = hypothesis.sum(1).clamp(min=1).float(), premise.sum(1).clamp(min=1).float()  # [B]
    coverage = torch.stack([
        (best_for_hypothesis * hypothesis).sum(1) / h_count,
        best_for_hypothesis.masked_fill(~hypothesis, 1.0).min(dim=1).values,
        (best_for_premise * premise).sum(1) / p_count,
        ((best_for_hypothesis > 0.9) & hypothesis).sum(1) / h_count,
        hypothesis.sum(1) / 20.0, premise.sum(1) / 20.0], dim=1).to(hidden.dtype)  # [B, 6]
    return torch.cat([segments, masked_mean(local, hypothesis), coverage], dim=1)  # [B, 8H + 6]


def build_head(in_dim: int, hidden: int, dropout: float):
    """Standardisation (buffers; identity unless fitted) → dropout → [Linear → GELU → dropout] → Linear(→ 3)."""
    from torch import nn

    class NLIHead(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("shift", torch.zeros(in_dim))
            self.register_buffer("scale", torch.ones(in_dim))
            layers: list[nn.Module] = [nn.Dropout(dropout)]
            if hidden:
                layers += [nn.Linear(in_dim, hidden), nn.GELU(), nn.Dropout(dropout)]
            layers.append(nn.Linear(hidden or in_dim, len(NLI_LABELS)))
            self.layers = nn.Sequential(*layers)

        def forward(self, pooled):
            return self.layers((pooled.float() - self.shift) / self.scale)  # [B, 3]

        def save(self, directory) -> None:
            """The head's weights only (the engine's ``best/``); the job writes a fold's ``nli_head.json``."""
            Path(directory).mkdir(parents=True, exist_ok=True)
            torch.save(self.state_dict(), Path(directory) / "nli_head.pt")

    return NLIHead()


def build_teacher(weights_dir: str | Path, training: TeacherTraining):
    """A transformer reading ``premise [SEP] hypothesis`` plus a new 3-way head; ``teacher(features)`` → [B, 3]."""
    from torch import nn
    from transformers import AutoModel, AutoTokenizer

    from raydistill.models.batching import forward_input_names, usable_max_length

    class NLITeacher(nn.Module):
        def __init__(self):
            super().__init__()
            self.transformer = AutoModel.from_pretrained(weights_dir, local_files_only=True, dtype=torch.float32)
            self.tokenizer = AutoTokenizer.from_pretrained(weights_dir, local_files_only=True)
            self.max_length = usable_max_length(self.transformer.config, self.tokenizer, training.max_length,
                                                Path(weights_dir))
            self.input_names = forward_input_names(self.transformer)
            self.head_kind = training.head
            if training.head in ("segments", "aligned") and self.tokenizer.sep_token_id is None:
                raise ValueError(f"head {training.head!r} finds the hypothesis after the separator token; the "
                                 f"tokenizer of {weights_dir} has none")
            self.register_buffer("special_ids", torch.tensor(sorted(set(self.tokenizer.all_special_ids))),
                                 persistent=False)
            hidden = self.transformer.config.hidden_size
            pooled_dim = {"cls": hidden, "mean": hidden, "segments": 4 * hidden, "aligned": 8 * hidden + len(_COVERAGE)}
            self.head = build_head(pooled_dim[training.head], training.head_hidden, training.dropout)

        def tokenize(self, first: list[str], second: list[str]) -> dict[str, Any]:
            return dict(self.tokenizer(first, second, padding=True, truncation="longest_first",
                                       max_length=self.max_length, return_tensors="pt"))

        def pool(self, features: dict[str, Any]):
            inputs = {k: v for k, v in features.items() if k in self.input_names}
            hidden = self.transformer(**inputs).last_hidden_state  # [B, T, H]
            return pool_pair(hidden, features["input_ids"], features["attention_mask"], self.special_ids,
                             self.tokenizer.sep_token_id, self.head_kind)  # [B, D]

        def forward(self, features: dict[str, Any]):
            return self.head(self.pool(features))  # [B, 3]

        def save(self, directory) -> None:
            """A fold directory's model: transformer, tokenizer, head (``load_teacher`` reads it back)."""
            self.transformer.save_pretrained(directory)
            self.tokenizer.save_pretrained(directory)
            save_head(self, Path(directory), ".", training)

    return NLITeacher()


def load_teacher(fold_dir: str | Path):
    """A saved fold model (``<teacher dir>/fold-<f>/``), in eval mode: its head, and the transformer it was trained
    with (its own copy when fine-tuned, the teacher's shared ``encoder/`` when the transformer stayed frozen)."""
    fold_dir = Path(fold_dir)
    meta = json.loads((fold_dir / "nli_head.json").read_text())
    training = TeacherTraining(**meta["training"])
    teacher = build_teacher((fold_dir / meta["encoder"]).resolve(), training)
    # weights_only: a teacher directory is data, and a pickled object in it must not run code when loaded
    teacher.head.load_state_dict(torch.load(fold_dir / "nli_head.pt", map_location="cpu", weights_only=True))
    return teacher.eval()


def save_head(teacher, fold_dir: Path, encoder: str, training: TeacherTraining) -> None:
    fold_dir.mkdir(parents=True, exist_ok=True)
    torch.save(teacher.head.state_dict(), fold_dir / "nli_head.pt")
    atomic_write_json(fold_dir / "nli_head.json",
                      {"encoder": encoder, "labels": list(NLI_LABELS), "training": asdict(training)})


# Rows between two progress lines of a teacher's encoding pass; a line also comes once this long has passed
# since the last (the folds' training lines come from the engine's progress printer, on the same 30 s).
_PROGRESS_EVERY_ROWS = 2048
_PROGRESS_EVERY_S = 30.0


def encode_rows(teacher, columns: dict[str, np.ndarray], rows: np.ndarray, device, precision: str,
                pooled_only: bool, batch_size: int = 64, progress: str | None = None) -> np.ndarray:
    """Pooled features [len(rows), D] (``pooled_only``) or class probabilities [len(rows), 3], in ``rows`` order,
    float32, eval mode, no autograd, length-sorted batches (DvBERT's frozen-feature pass and a fold's held-out
    evaluation). ``progress``: a log prefix; the pass then reports its rows done, rate and ETA about every
    ``_PROGRESS_EVERY_ROWS`` rows or ``_PROGRESS_EVERY_S`` seconds, whichever comes first (tens of minutes for a
    whole NLI set on a CPU)."""
    from raydistill.durations import format_duration
    from raydistill.models.batching import inference, length_sorted_batches

    lengths = [len(columns["text_a"][r]) + len(columns["text_b"][r]) for r in rows]
    out = None
    started, done, reported = time.perf_counter(), 0, 0
    last_line = started
    with inference(teacher), torch.autocast(torch.device(device).type, dtype=torch.bfloat16,
                                            enabled=precision == "bf16"):
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
                      f"ETA {format_duration((len(rows) - done) / rate)}; longest first)", flush=True)
    return out


# ----------------------------------------------------------------------------------------------------------------
# The fold as a stage of the engine

# The held-out predictions of a stage's latest evaluation, beside its checkpoints: ``probs`` [M, 3] float32 and
# ``head`` (``head_digest`` of the model that made them), so the job reuses them only for that very model.
HELDOUT_PROBS = "heldout_probs.npz"


def head_digest(head) -> int:
    """crc32 of the head's weights: every optimiser step changes them, so it names one training step's model."""
    crc = 0
    for tensor in head.state_dict().values():
        crc = zlib.crc32(tensor.detach().cpu().float().contiguous().numpy().tobytes(), crc)
    return crc


@section
class NLITeacherStageSettings(ExtraSettings):
    """``extra:`` of a DvBERT teacher fold (set by the DvBERT job from ``extra.teacher_training``, not by hand)."""

    teacher_training: TeacherTraining = Field(default_factory=TeacherTraining,
                                              description="the teacher's settings: what the student is built with")
    heldout: str | None = Field(None, description="the fold's held-out rows (.npz with label and text_a/text_b or "
                                                  "pooled): the dev evaluation's data")
    eval_batch_size: Int = Field(64, gt=0, description="pairs per forward pass of the dev evaluation")
    stage: dict[str, Any] | None = Field(None, description="which teacher and fold this is (hashed: only the same "
                                                           "fold resumes its checkpoints)")


_HELDOUT: dict[tuple, dict[str, np.ndarray]] = {}


def _heldout(cfg: JobConfig) -> dict[str, np.ndarray]:
    """The fold's held-out rows, read once per version of the file (a stage evaluates several times)."""
    path = cfg.extra.heldout
    if not path:
        raise ValueError(f"{cfg.method}: extra.heldout names no file of held-out rows")
    stat = Path(path).stat()
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    if key not in _HELDOUT:
        _HELDOUT.clear()  # one fold at a time per process: the last one's rows are done with
        with np.load(path) as data:
            _HELDOUT[key] = {name: data[name] for name in data.files}
    return _HELDOUT[key]


def pair_class_features(ctx: StepContext, batch) -> Features:
    """Both sentences in one sequence: the teacher's class logits [B, 3] and the gold classes."""
    features = ctx.student.tokenize([str(a) for a in batch["text_a"]], [str(b) for b in batch["text_b"]])
    features = {name: value.to(ctx.device) for name, value in features.items()}
    return {"logits": ctx.student(features)}, ctx.tensor(batch["label"], dtype=torch.long)


@dataclass(frozen=True)
class NLITeacherStageSpec(MethodSpec):
    """A DvBERT teacher fold; ``dev_score`` is held-out accuracy x 100 (the job keeps the last step's model)."""

    def build_student(self, cfg: JobConfig, *, teacher_dim: int | None = None, init_model: str | None = None):
        if init_model is None:
            raise ValueError(f"{self.name}: a teacher fold starts from the teacher's transformer (init_model)")
        return build_teacher(init_model, cfg.extra.teacher_training)

    def heldout_probs(self, cfg: JobConfig, student) -> np.ndarray:
        rows = _heldout(cfg)
        return encode_rows(student, rows, np.arange(len(rows["label"])), next(student.parameters()).device,
                           cfg.train.precision, pooled_only=False, batch_size=cfg.extra.eval_batch_size)

    def dev_score(self, cfg: JobConfig, student) -> float:
        probs = self.heldout_probs(cfg, student)
        with atomic_writer(Path(cfg.run_dir) / HELDOUT_PROBS) as stream:
            np.savez(stream, probs=probs, head=np.int64(head_digest(student.head)))
        return 100.0 * float((probs.argmax(axis=1) == _heldout(cfg)["label"]).mean())


SPEC = rows_method(
    NLITeacherStageSpec,
    name="nli-teacher",
    summary="DvBERT teacher fold: a cross-encoder fine-tuned with cross-entropy on labelled NLI pairs (run by the "
            "dvbert job)",
    loss_class=LogitCrossEntropyLoss,
    batch_to_features=pair_class_features,
    extra_settings=NLITeacherStageSettings,
    student_sentences_per_row=2,
    dataset="nli_teacher_folds",
    internal=True,
)
