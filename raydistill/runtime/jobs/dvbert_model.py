"""DvBERT's interaction-view teacher as a model: a transformer reading ``premise [SEP] hypothesis`` and a 3-way NLI
head on what ``pool_pair`` reads from the joint encoding; how a fold model is saved and loaded back.

    teacher = build_teacher(weights_dir, training)   # teacher(features) -> [B, 3] logits
    teacher = load_teacher(fold_dir)                 # a saved fold model, eval mode

``dvbert_teachers`` trains these (folds, out-of-fold labels, the accuracy bar) and re-exports them; its docstring
says why each head exists. Moved out of dvbert_teachers.py unchanged.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from raydistill.fileio import atomic_write_json
from raydistill.methods.dvbert import TeacherTraining

__all__ = ["NLI_LABELS", "build_teacher", "load_teacher", "build_head", "pool_pair", "pooled_dim", "save_head"]

NLI_LABELS = ("entailment", "neutral", "contradiction")


def pooled_dim(head: str, hidden: int) -> int:
    return {"cls": hidden, "mean": hidden, "segments": 4 * hidden, "aligned": 8 * hidden + len(_COVERAGE)}[head]


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
    import torch

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
    import torch
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

    return NLIHead()


def build_teacher(weights_dir: str | Path, training: TeacherTraining):
    """A transformer reading ``premise [SEP] hypothesis`` plus a new 3-way head; ``teacher(features)`` → [B, 3]."""
    import torch
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
            self.head = build_head(pooled_dim(training.head, self.transformer.config.hidden_size),
                                    training.head_hidden, training.dropout)

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

    return NLITeacher()


def load_teacher(fold_dir: str | Path):
    """A saved fold model (``<teacher dir>/fold-<f>/``), in eval mode: its head, and the transformer it was trained
    with (its own copy when fine-tuned, the teacher's shared ``encoder/`` when the transformer stayed frozen)."""
    import torch

    fold_dir = Path(fold_dir)
    meta = json.loads((fold_dir / "nli_head.json").read_text())
    training = TeacherTraining(**meta["training"])
    teacher = build_teacher((fold_dir / meta["encoder"]).resolve(), training)
    # weights_only: a teacher directory is data, and a pickled object in it must not run code when loaded
    teacher.head.load_state_dict(torch.load(fold_dir / "nli_head.pt", map_location="cpu", weights_only=True))
    return teacher.eval()


def save_head(teacher, fold_dir: Path, encoder: str, training: TeacherTraining) -> None:
    import torch

    fold_dir.mkdir(parents=True, exist_ok=True)
    torch.save(teacher.head.state_dict(), fold_dir / "nli_head.pt")
    atomic_write_json(fold_dir / "nli_head.json",
                      {"encoder": encoder, "labels": list(NLI_LABELS), "training": asdict(training)})
