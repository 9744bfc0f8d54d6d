"""CrossEncoder: a transformer that reads both sentences of a pair at once and outputs logits.

    logits = head(transformer("[CLS] a [SEP] b [SEP]"))        # [B, C]; C = num_labels

The head is `AutoModelForSequenceClassification`'s (BERT: pooler dense+tanh on [CLS] -> dropout -> linear;
RoBERTa/MPNet: dense+tanh -> dropout -> linear on <s>). With `num_labels == 1` it is a regression/score head,
as Trans-Encoder (Liu et al., ICLR 2022) trains on soft targets with BCE-with-logits and reads scores as
sigmoid(logit); with 3 labels it is an NLI classifier (a DvBERT-style teacher).

A second head, ``head="segment_cosine"`` (1 label only), scores a pair by the cosine of its two sentences' mean
token states *inside the joint encoding*:

    h = transformer("[CLS] a [SEP] b [SEP]")                   # [B, T, H]; a's tokens also attend to b's
    logits = scale · cos(mean(h[a]), mean(h[b])) + bias        # [B]; specials excluded from both means

It starts as a function of what a mean-pooled bi-encoder checkpoint already knows, where a new classification
head on [CLS] starts from nothing. On 2,000 gold STS-B train pairs and 250 updates a minilm-l3 cross-encoder
reaches STS-B dev 80.2 with it against 40.8 with the classifier head (results/diag-cross-encoder-head.json).
It is raydistill's, not the Trans-Encoder paper's (which uses the classifier head); the choice is recorded in the
saved directory's raydistill_model.json and restored by ``from_pretrained``. Other tools (sentence-transformers'
CrossEncoder, HF pipelines) would read the directory's untrained classifier head instead: load such a
cross-encoder with raydistill.

A cross-encoder is order-sensitive and cannot embed single sentences: evaluation must hand it pairs, which is
why it is a separate class rather than a BiEncoder option."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from torch import Tensor, nn
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

from raydistill.models.batching import (
    check_texts, config_error, forward_input_names, inference, length_sorted_batches, masked_mean,
    read_metadata, resolve_checkpoint, torch_threads, usable_max_length, write_metadata,
)
from raydistill.models.bi_encoder import transformer_directory
from raydistill.models.progress import Progress

SCORE_ACTIVATIONS = ("sigmoid", "softmax", None)
HEADS = ("classifier", "segment_cosine")


def check_pairs(pairs) -> tuple[list[str], list[str]]:
    """(first sentences, second sentences), or a TypeError naming the first malformed pair."""
    if isinstance(pairs, (str, bytes)):
        raise TypeError("pairs must be a list of (sentence_a, sentence_b) tuples, got a string")
    first, second = [], []
    for index, pair in enumerate(pairs):
        if isinstance(pair, str) or len(pair) != 2:
            raise TypeError(f"pairs[{index}] must be a (sentence_a, sentence_b) pair, got {pair!r}")
        check_texts(list(pair), what=f"pairs[{index}]")
        first.append(pair[0])
        second.append(pair[1])
    return first, second


class SegmentCosineHead(nn.Module):
    """logits = scale · cos(mean of sentence a's token states, mean of sentence b's) + bias, on a joint encoding.

    Segments are found from the tokenizer's separator token, so it works for BERT ([CLS] a [SEP] b [SEP]) and for
    MPNet / RoBERTa (<s> a </s></s> b </s>) alike; special tokens and padding count in neither mean.
    The start values map cosines 0 … 1 to sigmoid scores 0.08 … 0.92: close to the clip-scaled cosine targets
    the cross-encoder is trained on, so training starts from the bi-encoder-like scorer, not from noise."""

    def __init__(self, special_ids: list[int], sep_token_id: int, scale: float = 5.0, bias: float = -2.5):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(float(scale)))
        self.bias = nn.Parameter(torch.tensor(float(bias)))
        self.register_buffer("special_ids", torch.tensor(sorted(set(special_ids))), persistent=False)
        self.sep_token_id = int(sep_token_id)

    def forward(self, hidden: Tensor, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        is_word = attention_mask.bool() & ~torch.isin(input_ids, self.special_ids)  # [B, T]
        after_first_sep = torch.cumsum((input_ids == self.sep_token_id).long(), dim=1) > 0  # [B, T]
        first_mean = masked_mean(hidden, is_word & ~after_first_sep)  # [B, H]
        second_mean = masked_mean(hidden, is_word & after_first_sep)  # [B, H]
        cosines = nn.functional.cosine_similarity(first_mean.float(), second_mean.float(), dim=-1)  # [B]
        return self.scale * cosines + self.bias


class CrossEncoder(nn.Module):
    """Pair scorer over `AutoModelForSequenceClassification`; `forward` gives logits [B] (1 label) or [B, C]."""

    def __init__(self, model: nn.Module, tokenizer, max_length: int | None = None,
                 metadata: dict[str, Any] | None = None, source: str | None = None, head: str = "classifier",
                 head_state: dict[str, float] | None = None):
        super().__init__()
        if head not in HEADS:
            raise ValueError(f"head must be one of {HEADS}, got {head!r}")
        self.model, self.tokenizer, self.source = model, tokenizer, source
        self.metadata = dict(metadata or {})
        self.max_length = usable_max_length(model.config, tokenizer, max_length, Path(source or "."))
        self.tokenizer.model_max_length = self.max_length
        self.input_names = forward_input_names(model)
        self.head = head
        self.segment_head: SegmentCosineHead | None = None
        if head == "segment_cosine":
            if model.config.num_labels != 1:
                raise ValueError(f"head='segment_cosine' gives one score per pair; num_labels is "
                                 f"{model.config.num_labels}")
            if tokenizer.sep_token_id is None:
                raise ValueError(f"head='segment_cosine' finds the second sentence after the separator token, but "
                                 f"the tokenizer of {source} has none")
            self.segment_head = SegmentCosineHead(tokenizer.all_special_ids, tokenizer.sep_token_id,
                                                  **(head_state or {}))

    @classmethod
    def from_pretrained(
        cls, name_or_path: str | Path, num_labels: int = 1, max_length: int | None = None, head: str | None = None
    ) -> CrossEncoder:
        """Load a local checkpoint or registry name; a checkpoint without a classification head gets a new one.

        A checkpoint whose head has a different number of labels is refused rather than silently re-initialised.
        ``head``: "classifier" or "segment_cosine"; None = the saved cross-encoder's own head (classifier for
        any other checkpoint). A saved segment-cosine head keeps its learned scale and bias only when loaded as one."""
        if num_labels < 1:
            raise ValueError(f"num_labels must be >= 1, got {num_labels}")
        directory = resolve_checkpoint(name_or_path)
        # A saved BiEncoder is a valid starting point (Trans-Encoder's sequential init): use its transformer.
        weights_dir = transformer_directory(directory)
        config = AutoConfig.from_pretrained(weights_dir, local_files_only=True)
        has_head = any(name.endswith("ForSequenceClassification") for name in (config.architectures or []))
        if has_head and config.num_labels != num_labels:
            raise config_error(weights_dir / "config.json", "id2label", f"the classification head has "
                               f"{config.num_labels} labels but num_labels={num_labels} was requested")
        with _quiet_load_report(not has_head):
            model = AutoModelForSequenceClassification.from_pretrained(weights_dir, num_labels=num_labels,
                                                                       local_files_only=True, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(weights_dir, local_files_only=True)
        metadata = read_metadata(directory)
        saved = metadata.get("encoder", {})
        if saved.get("kind") != "cross_encoder":  # e.g. a saved BiEncoder (sequential init): no head to restore
            saved = {}
        saved_head = saved.get("head", "classifier")
        head = head or saved_head
        head_state = saved.get("head_state") if head == saved_head == "segment_cosine" else None
        encoder = cls(model, tokenizer, max_length=max_length, metadata=metadata, source=str(directory),
                      head=head, head_state=head_state)
        return encoder.eval()  # as Hugging Face's from_pretrained: inference-ready; training code calls .train()

    @property
    def num_labels(self) -> int:
        return self.model.config.num_labels

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def tokenize(self, pairs: list[tuple[str, str]]) -> dict[str, Tensor]:
        """Both sentences in one sequence, padded to the longest pair; truncation trims the longer sentence first."""
        first, second = check_pairs(pairs)
        return dict(self.tokenizer(first, second, padding=True, truncation="longest_first", max_length=self.max_length,
                                   return_tensors="pt"))

    def forward(self, features: dict[str, Tensor]) -> Tensor:
        """Logits with gradients: [B] when num_labels == 1 (a score), else [B, C]."""
        inputs = {name: value for name, value in features.items() if name in self.input_names}
        if self.segment_head is not None:
            hidden = self.model.base_model(**inputs).last_hidden_state  # [B, T, H]
            return self.segment_head(hidden, features["input_ids"], features["attention_mask"])  # [B]
        logits = self.model(**inputs).logits  # [B, C]
        return logits.squeeze(-1) if self.num_labels == 1 else logits

    def score(self, pairs: list[tuple[str, str]], batch_size: int = 64, activation: str | None = "sigmoid",
              num_threads: int | None = None, progress: bool = False) -> np.ndarray:
        """Scores in input order: [N] (num_labels == 1) or [N, C], float32.

        `activation`: "sigmoid" (a score in (0, 1), per label), "softmax" (a distribution over C >= 2 labels),
        or None (raw logits)."""
        if activation not in SCORE_ACTIVATIONS:
            raise ValueError(f"activation must be one of {SCORE_ACTIVATIONS}, got {activation!r}")
        if activation == "softmax" and self.num_labels == 1:
            raise ValueError("softmax over a single logit is always 1; use activation='sigmoid' or None")
        first, second = check_pairs(pairs)
        shape = (len(first),) if self.num_labels == 1 else (len(first), self.num_labels)
        scores = np.zeros(shape, dtype=np.float32)
        batches = length_sorted_batches([len(a) + len(b) for a, b in zip(first, second)], batch_size)
        bar = Progress(len(batches), "score", progress)
        device = self.device
        try:
            with torch_threads(num_threads), inference(self):
                for batch in batches:
                    features = self.tokenize([(first[i], second[i]) for i in batch])
                    features = {name: value.to(device) for name, value in features.items()}
                    logits = self.forward(features).float()  # [b] or [b, C]
                    if activation == "sigmoid":
                        logits = torch.sigmoid(logits)
                    elif activation == "softmax":
                        logits = torch.softmax(logits, dim=-1)
                    scores[batch] = logits.cpu().numpy()
                    bar.update()
        finally:
            bar.close()
        return scores

    def save(self, path: str | Path) -> None:
        """A standard Hugging Face sequence-classification directory (+ tokenizer, + raydistill_model.json)."""
        directory = Path(path)
        directory.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)
        write_metadata(directory, self.metadata, {
            "kind": "cross_encoder", "num_labels": self.num_labels, "head": self.head,
            **({"head_state": {"scale": self.segment_head.scale.item(), "bias": self.segment_head.bias.item()}}
               if self.segment_head is not None else {}),
            "max_length": self.max_length, "model_type": self.model.config.model_type,
            "parameters": sum(p.numel() for p in self.parameters()), "source": self.source,
        })


@contextmanager
def _quiet_load_report(quiet: bool) -> Iterator[None]:
    """Without transformers' load report while ``quiet``: a checkpoint without a classification head gets a new one
    on purpose, and the report of its missing weights (and of a pretraining pooler left unused) would ask every job
    that builds a cross-encoder from a sentence encoder to act on something intended. Errors still surface."""
    logger = logging.getLogger("transformers.modeling_utils")
    previous = logger.level
    if quiet:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(previous)

