"""What a Trans-Encoder stage leaves behind and reads back, apart from the learners that train it.

    encoder_state / encoder_fingerprint   the weights a family's bi- and cross-encoder share, and their sha256
    labels_digest                         which labels a learner trained on (sha256 of the float32 vector)
    stage_seed                            a distinct, reproducible seed per (cycle, encoder kind, family)
    save_model_atomically                 a stage's model directory (with its ``stage.json``): complete or absent

The orchestration (``job.py``), the learners (``learners.py``) and the tests read these; ``learners`` re-exports
them. A stage stopped mid-way keeps its position in the engine's checkpoints (``state.RunLayout.training_dir``).
"""

from __future__ import annotations

import hashlib
import os
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from raydistill.runtime.tenc.state import STAGE_RECORD, json_default

__all__ = ["encoder_fingerprint", "encoder_state", "labels_digest", "save_model_atomically", "stage_seed"]


def encoder_state(model: nn.Module) -> dict[str, Tensor]:
    """The weights a bi- and a cross-encoder of one family have in common, to check which weights a stage started
    from: ``embeddings.*`` and ``encoder.*`` of the base model. Heads differ by design (pooling vs. a classification
    head; BERT's pooler belongs to the cross-encoder's head)."""
    from raydistill.models import BiEncoder, CrossEncoder

    if isinstance(model, BiEncoder):
        base = model.transformer
    elif isinstance(model, CrossEncoder):
        base = model.model.base_model
    else:
        raise TypeError(f"expected a BiEncoder or CrossEncoder, got {type(model).__name__}")
    return {name: param for name, param in base.state_dict().items()
            if name.startswith(("embeddings.", "encoder.")) and not name.endswith("position_ids")}


def encoder_fingerprint(model: nn.Module) -> str:
    """sha256 (16 hex chars) of `encoder_state`: equal iff the two models' shared weights are bit-identical."""
    digest = hashlib.sha256()
    for name, tensor in sorted(encoder_state(model).items()):
        digest.update(name.encode())
        digest.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def labels_digest(labels: np.ndarray) -> str:
    """sha256 (16 hex chars) of a label vector as float32: which labels a learner actually trained on."""
    return hashlib.sha256(np.ascontiguousarray(labels, dtype=np.float32).tobytes()).hexdigest()[:16]


def stage_seed(seed: int, cycle: int, kind: str, family: str) -> int:
    """A distinct, reproducible seed per (cycle, encoder kind, family): the new head, dropout and shuffling."""
    return (int(seed) * 1_000_003 + cycle * 7919 + (0 if kind == "bi" else 104_729)
            + zlib.crc32(family.encode())) % (2**31 - 1)


def save_model_atomically(model: nn.Module, directory: str | os.PathLike,
                          stage_record: dict[str, Any] | None = None) -> Path:
    """``model.save`` (and ``stage_record`` as ``stage.json``) into a staged directory swapped in whole
    (``fileio.staged_directory``; it also replaces the model of a stage re-run after a crash between saving and
    recording it): a stage's model directory is complete or absent."""
    from raydistill.fileio import atomic_write_json, staged_directory

    with staged_directory(directory) as tmp:
        model.save(tmp)
        if stage_record is not None:
            atomic_write_json(tmp / STAGE_RECORD, stage_record, default=json_default)
    return Path(directory)
