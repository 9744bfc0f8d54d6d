"""DistilCSE stage 2: supervised SimCSE on NLI triplets (anchor, entailed hypothesis, contradicted hypothesis).

Papers: Tianyu Gao, Xingcheng Yao, Danqi Chen. "SimCSE: Simple Contrastive Learning of Sentence Embeddings",
EMNLP 2021, arXiv:2104.08821 (the supervised loss with hard negatives, §4). DistilCSE (Gao, Wu et al.,
arXiv:2112.05638) fine-tunes its CKD student with it (``my_finetune_nli/nli_finetune.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from raydistill.objectives.base import LossOutput, check_same_rows, take, take_optional
from raydistill.objectives.ckd import LearnableScale
from raydistill.objectives.functional import soft_cross_entropy

__all__ = ["NLI_LABELS", "SupervisedSimCSELoss", "build_nli_triplets", "load_nli_triplets"]

NLI_LABELS = ("entailment", "neutral", "contradiction")


class SupervisedSimCSELoss(nn.Module):
    r"""Supervised SimCSE (Gao, Yao & Chen, EMNLP 2021, arXiv:2104.08821, Eq. 5), with hard negatives: for anchors
    a, entailed hypotheses p (positives) and contradicted hypotheses n (hard negatives), all L2-normalised, each
    anchor classifies its own positive among every positive and hard negative of the batch:

        L = −1/B Σ_i log( e^{s·a_i·p_i} / Σ_j (e^{s·a_i·p_j} + e^{s·a_i·n_j}) ),    s = 1/τ

    features:
        ``"anchor"``    [B, d]  with grad
        ``"positive"``  [B, d]  with grad (the same encoder: gradients flow through every side)
        ``"negative"``  [B, d]  optional; without it the loss is in-batch InfoNCE on (anchor, positive) pairs
    labels: unused (the positive of anchor i is positive i).
    parts: ``infonce``, ``scale``.

    Deviations: DistilCSE learns s (init 20, unbounded; ``learnable_temperature=True`` learns it clamped to
    [1, 100]); SimCSE keeps τ = 0.05 fixed, the default. DistilCSE all-gathers across GPUs; the runtime's learners
    use their own batch (B per learner, as SimCSE on one GPU).
    """

    def __init__(self, tau: float = 0.05, learnable_temperature: bool = False, max_scale: float = 100.0):
        super().__init__()
        self.scale = LearnableScale(tau, learnable_temperature, min_scale=1.0, max_scale=max_scale)

    def forward(self, features: dict[str, Tensor], labels: Tensor | None = None) -> LossOutput:
        anchor = take(features, "anchor", "SupervisedSimCSELoss")
        positive = take(features, "positive", "SupervisedSimCSELoss")
        negative = take_optional(features, "negative", "SupervisedSimCSELoss")
        sides = {"anchor": anchor, "positive": positive} | ({"negative": negative} if negative is not None else {})
        batch = check_same_rows("SupervisedSimCSELoss", **sides)
        scale = self.scale()
        queries = F.normalize(anchor, dim=1) * scale  # [B, d]
        logits = [queries @ F.normalize(positive, dim=1).T]  # [B, B]
        targets: list[Tensor | None] = [torch.eye(batch, dtype=logits[0].dtype, device=logits[0].device)]
        if negative is not None:
            logits.append(queries @ F.normalize(negative, dim=1).T)  # [B, B], hard negatives
            targets.append(None)
        loss = soft_cross_entropy(logits, targets).mean()
        return LossOutput(loss, {"infonce": float(loss.detach()), "scale": float(scale.detach())})


def _field(record: Any, names: tuple[str, ...], index: int) -> Any:
    for name in names:
        if isinstance(record, Mapping):
            if name in record:
                return record[name]
        elif hasattr(record, name):
            return getattr(record, name)
    raise ValueError(f"NLI record {index}: field '{names[0]}' missing (also looked for {list(names[1:])}); "
                     f"got {record!r:.200}")


def build_nli_triplets(records: Iterable[Any]) -> list[tuple[str, str, str]]:
    """(premise, entailed hypothesis, contradicted hypothesis) triplets from labelled NLI pairs.

    ``records``: ``raydistill.data`` ``Pair`` objects (sentence1 = premise, sentence2 = hypothesis, label) or
    mappings with ``premise``/``hypothesis``/``label`` (or ``sentence1``/``sentence2``/``label``); labels are
    the strings of ``NLI_LABELS``. SimCSE builds one triplet per (premise, entailment) with a contradiction of
    the same premise; here every entailed hypothesis of a premise is paired with that premise's contradictions
    in turn (cycled when there are fewer), in input order. Premises without both labels give nothing; neutral
    pairs are not used. Deterministic: the same records give the same triplets.
    """
    by_premise: dict[str, dict[str, list[str]]] = {}
    for index, record in enumerate(records):
        premise = _field(record, ("premise", "sentence1"), index)
        hypothesis = _field(record, ("hypothesis", "sentence2"), index)
        label = _field(record, ("label",), index)
        if label not in NLI_LABELS:
            raise ValueError(f"NLI record {index}: field 'label': {label!r} is not one of {list(NLI_LABELS)}")
        for name, text in (("premise", premise), ("hypothesis", hypothesis)):
            if not isinstance(text, str) or not text.strip():
                raise ValueError(f"NLI record {index}: field '{name}': must be a non-empty string, got {text!r}")
        by_premise.setdefault(premise, {}).setdefault(label, []).append(hypothesis)
    triplets = []
    for premise, hypotheses in by_premise.items():
        entailed, contradicted = hypotheses.get("entailment", []), hypotheses.get("contradiction", [])
        if contradicted:
            triplets.extend((premise, positive, contradicted[i % len(contradicted)])
                            for i, positive in enumerate(entailed))
    return triplets


def load_nli_triplets(names: tuple[str, ...] = ("snli_dev", "mnli_dev")) -> list[tuple[str, str, str]]:
    """Triplets of the named labelled NLI sets of ``raydistill.data`` (SNLI/MNLI train are not reachable offline;
    their dev sets are the only labelled NLI pairs here), built from their pairs less every pair that holds an
    evaluation sentence (``raydistill.data.corpus.training_pairs``), so no caller can train on a scored sentence.
    Filtered before the triplets are built: a premise keeps its other hypotheses when one of them is held out."""
    from raydistill.data.corpus import training_pairs

    return build_nli_triplets(training_pairs(names)[0])
