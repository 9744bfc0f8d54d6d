"""CrossEncoder: a transformer that reads both sentences of a pair at once and outputs logits.

    logits = head(transformer("[CLS] a [SEP] b [SEP]"))        # [B, C]; C = num_labels

The head is `AutoModelForSequenceClassification`'s (BERT: pooler dense+tanh on [CLS] -> dropout -> linear;
RoBERTa/MPNet: dense+tanh -> dropout -> linear on <s>). With `num_labels == 1` it is a regression/score head,
as Trans-Encoder (Liu et al., ICLR 2022) trains on soft targets with BCE-with-logits and reads scores as
sigmoid(logit); with 3 labels it is an NLI classifier (a DvBERT-style teacher).

A cross-encoder is order-sensitive and cannot embed single sentences: evaluation must hand it pairs, which is
why it is a separate class rather than a BiEncoder option.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

from raydistill.models.batching import (
    Progress,
    check_texts,
    config_error,
    forward_input_names,
    inference,
    length_sorted_batches,
    read_metadata,
    resolve_checkpoint,
    torch_threads,
    usable_max_length,
    write_metadata,
)
from raydistill.models.bi_encoder import transformer_directory

SCORE_ACTIVATIONS = ("sigmoid", "softmax", None)


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


class CrossEncoder(nn.Module):
    """Pair scorer over `AutoModelForSequenceClassification`; `forward` gives logits [B] (1 label) or [B, C]."""

    def __init__(
        self,
        model: nn.Module,
        tokenizer,
        max_length: int | None = None,
        metadata: dict[str, Any] | None = None,
        source: str | None = None,
    ):
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.source = source
        self.metadata = dict(metadata or {})
        self.max_length = usable_max_length(model.config, tokenizer, max_length, Path(source or "."))
        self.tokenizer.model_max_length = self.max_length
        self.input_names = forward_input_names(model)

    @classmethod
    def from_pretrained(
        cls, name_or_path: str | Path, num_labels: int = 1, max_length: int | None = None
    ) -> CrossEncoder:
        """Load a local checkpoint or registry name; a checkpoint without a classification head gets a new one.

        A checkpoint whose head has a different number of labels is refused rather than silently re-initialised.
        """
        if num_labels < 1:
            raise ValueError(f"num_labels must be >= 1, got {num_labels}")
        directory = resolve_checkpoint(name_or_path)
        # A saved BiEncoder is a valid starting point (Trans-Encoder's sequential init): use its transformer.
        weights_dir = transformer_directory(directory)
        config = AutoConfig.from_pretrained(weights_dir, local_files_only=True)
        has_head = any(name.endswith("ForSequenceClassification") for name in (config.architectures or []))
        if has_head and config.num_labels != num_labels:
            raise config_error(
                weights_dir / "config.json",
                "id2label",
                f"the classification head has {config.num_labels} labels but num_labels={num_labels} was requested",
            )
        model = AutoModelForSequenceClassification.from_pretrained(
            weights_dir, num_labels=num_labels, local_files_only=True, dtype=torch.float32
        )
        tokenizer = AutoTokenizer.from_pretrained(weights_dir, local_files_only=True)
        encoder = cls(model, tokenizer, max_length=max_length, metadata=read_metadata(directory), source=str(directory))
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
        return dict(
            self.tokenizer(
                first,
                second,
                padding=True,
                truncation="longest_first",
                max_length=self.max_length,
                return_tensors="pt",
            )
        )

    def forward(self, features: dict[str, Tensor]) -> Tensor:
        """Logits with gradients: [B] when num_labels == 1 (a score), else [B, C]."""
        inputs = {name: value for name, value in features.items() if name in self.input_names}
        logits = self.model(**inputs).logits  # [B, C]
        return logits.squeeze(-1) if self.num_labels == 1 else logits

    def score(
        self,
        pairs: list[tuple[str, str]],
        batch_size: int = 64,
        activation: str | None = "sigmoid",
        num_threads: int | None = None,
        progress: bool = False,
    ) -> np.ndarray:
        """Scores in input order: [N] (num_labels == 1) or [N, C], float32.

        `activation`: "sigmoid" (a score in (0, 1), per label), "softmax" (a distribution over C >= 2 labels),
        or None (raw logits).
        """
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
        write_metadata(
            directory,
            self.metadata,
            {
                "kind": "cross_encoder",
                "num_labels": self.num_labels,
                "max_length": self.max_length,
                "model_type": self.model.config.model_type,
                "parameters": sum(p.numel() for p in self.parameters()),
                "source": self.source,
            },
        )
