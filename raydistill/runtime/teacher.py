"""The frozen teacher: a plain encoder class, its thin Ray actor, and the Ray Data callable that embeds a dataset.

``TeacherEncoder`` knows nothing of Ray: it loads a bi- or cross-encoder once, freezes it (eval mode, no grad,
``torch.inference_mode``), pins its torch thread count, and returns numpy (cheaper to ship between Ray processes than
torch tensors, and zero-copy on ``ray.get``; ../shared/notes/ray.md §0). Every row that goes through the teacher's
transformer is counted by a forward hook, so "the second epoch did no teacher work" is a measured fact rather than
an assumption about the cache.

``teacher_identity()`` names what determines the teacher's outputs (weights, tokenizer and pooling files, pooling,
max length, encoder type, normalisation), independent of where the model directory lives. The embedding cache is
keyed by it, which fixes the stale-cache bug of the ConGen/SCT code (fixed cache file names reused across teachers,
../shared/notes/methods.md §4.6, §1.7).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from raydistill.runtime.config import JobConfig, RoleResources

__all__ = ["TeacherSpec", "TeacherEncoder", "TeacherActor", "TeacherEmbed", "teacher_identity"]

# Bumped when the way embeddings are computed changes (e.g. normalisation), so old caches are not reused.
_EMBEDDING_FORMAT = 1
_FINGERPRINT_BYTES = 1 << 20


@dataclass
class TeacherSpec:
    """What to load as the teacher and how to run it; built from a JobConfig by ``from_config``."""

    model: str
    encoder: str = "bi"  # "bi" (sentence embeddings) | "cross" (pair scores)
    pooling: str | None = None
    max_length: int = 128
    resources: RoleResources = field(default_factory=RoleResources)

    @classmethod
    def from_config(cls, cfg: JobConfig) -> "TeacherSpec":
        if cfg.teacher is None:
            raise ValueError(f"method {cfg.method!r} asks for teacher embeddings but the config has no 'teacher'")
        return cls(model=cfg.teacher, encoder=str(cfg.extra.get("teacher_encoder", "bi")), pooling=cfg.teacher_pooling,
                   max_length=cfg.data.teacher_max_length, resources=cfg.resources.teacher)

    @classmethod
    def coerce(cls, value: "TeacherSpec | JobConfig | dict[str, Any]") -> "TeacherSpec":
        if isinstance(value, TeacherSpec):
            return value
        if isinstance(value, JobConfig):
            return cls.from_config(value)
        if isinstance(value, dict):
            value = dict(value)
            resources = value.pop("resources", None) or {}
            if isinstance(resources, dict):
                resources = RoleResources(**resources)
            return cls(resources=resources, **value)
        raise TypeError(f"expected TeacherSpec, JobConfig or dict, got {type(value).__name__}")

    def encoder_kwargs(self) -> dict[str, Any]:
        """Constructor kwargs of TeacherEncoder / TeacherEmbed."""
        return {"model": self.model, "encoder": self.encoder, "pooling": self.pooling, "max_length": self.max_length,
                "threads": self.resources.threads, "batch_size": self.resources.batch_size}

    def identity(self) -> str:
        return teacher_identity(self.model, encoder=self.encoder, pooling=self.pooling, max_length=self.max_length)

    def describe(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("resources")
        return d


def _resolve(model: str) -> Path:
    from raydistill.models.registry import resolve_model

    return Path(resolve_model(model))


def teacher_identity(model: str, *, encoder: str = "bi", pooling: str | None = None, max_length: int = 128) -> str:
    """``<encoder>-<16 hex>``: a fingerprint of everything that determines the teacher's outputs.

    Small files (configs, tokenizer, pooling/dense module configs) are hashed whole; weight files by name, size and
    their first and last MiB, which tells any two real checkpoints apart without reading gigabytes on every run.
    The directory's location is not part of it, so the same weights reached through another path share a cache.
    """
    model_dir = _resolve(model)
    digest = hashlib.sha256()
    digest.update(json.dumps({"encoder": encoder, "pooling": pooling, "max_length": int(max_length),
                              "normalized": encoder == "bi", "format": _EMBEDDING_FORMAT}, sort_keys=True).encode())
    for path in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        rel = path.relative_to(model_dir).as_posix()
        if rel.startswith(".") or "/." in rel or path.name.lower().startswith("readme") \
                or path.name == "raydistill_model.json":
            continue  # documentation and provenance metadata do not change the outputs
        size = path.stat().st_size
        digest.update(f"{rel}\0{size}\0".encode())
        with path.open("rb") as fh:
            if size <= 2 * _FINGERPRINT_BYTES:
                digest.update(fh.read())
            else:
                digest.update(fh.read(_FINGERPRINT_BYTES))
                fh.seek(-_FINGERPRINT_BYTES, os.SEEK_END)
                digest.update(fh.read(_FINGERPRINT_BYTES))
    return f"{encoder}-{digest.hexdigest()[:16]}"


def _head_labels(model_dir: Path) -> int:
    """Labels of a cross-encoder checkpoint's trained classification head (1 when it has none yet)."""
    config_path = model_dir / "config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    has_head = any(str(a).endswith("ForSequenceClassification") for a in config.get("architectures") or [])
    return int(len(config.get("id2label") or {}) or config.get("num_labels") or 1) if has_head else 1


class TeacherEncoder:
    """A frozen bi- or cross-encoder that returns numpy; usable in-process or inside any Ray actor.

    ``forward_rows`` counts the rows that actually went through the transformer (a forward hook, not a guess from the
    inputs), so callers can prove that cached work was not redone.
    """

    def __init__(self, model: str, encoder: str = "bi", pooling: str | None = None, max_length: int = 128,
                 threads: int = 1, batch_size: int = 128, num_labels: int | None = None, device: str | None = None):
        if encoder not in ("bi", "cross"):
            raise ValueError(f"encoder must be 'bi' or 'cross', got {encoder!r}")
        # Ray gives every actor OMP_NUM_THREADS = its CPU share (1 when fractional); the config decides instead.
        # Threads are set per call (encode/score num_threads), not process-wide, so an in-process teacher leaves
        # the caller's torch settings alone.
        self.model_name, self.encoder, self.pooling, self.max_length = model, encoder, pooling, int(max_length)
        self.threads, self.batch_size = int(threads), int(batch_size)
        self.model_dir = _resolve(model)
        if encoder == "bi":
            from raydistill.models import BiEncoder

            self.model = BiEncoder.from_pretrained(str(self.model_dir), pooling=pooling, max_length=self.max_length)
        else:
            from raydistill.models import CrossEncoder

            self.model = CrossEncoder.from_pretrained(str(self.model_dir), num_labels=num_labels or
                                                      _head_labels(self.model_dir), max_length=self.max_length)
        if device is None:
            # A Ray actor without num_gpus sees no CUDA device (Ray empties CUDA_VISIBLE_DEVICES), so this picks the
            # GPU exactly when the config gave the teacher one.
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = device
        self.model.to(device).eval().requires_grad_(False)
        self.forward_rows = 0
        self._hook = self._core_module().register_forward_hook(self._count_rows)
        self._identity: str | None = None

    def _core_module(self):
        # The transformers model inside the wrapper: every teacher row passes through its __call__ exactly once.
        from transformers import PreTrainedModel

        for module in self.model.modules():
            if isinstance(module, PreTrainedModel):
                return module
        return self.model

    def _count_rows(self, module, inputs, output) -> None:
        first = output[0] if isinstance(output, (tuple, list)) or hasattr(output, "keys") else output
        self.forward_rows += int(first.shape[0])

    @property
    def dim(self) -> int:
        return int(self.model.dim)

    def encode(self, texts: list[str]) -> np.ndarray:
        """L2-normalised sentence embeddings, float32 [N, D], in input order."""
        if self.encoder != "bi":
            raise TypeError("encode() needs a bi-encoder teacher; this one is a cross-encoder (use score())")
        texts = [str(t) for t in texts]
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        embeddings = self.model.encode(texts, batch_size=self.batch_size, normalize=True, num_threads=self.threads)
        return np.ascontiguousarray(embeddings, dtype=np.float32)

    def score(self, pairs: list[tuple[str, str]], activation: str | None = "auto") -> np.ndarray:
        """Cross-encoder scores [N] (one label) or probabilities [N, C]; 'auto' = sigmoid for 1 label, softmax else."""
        if self.encoder != "cross":
            raise TypeError("score() needs a cross-encoder teacher; this one is a bi-encoder (use encode())")
        if activation == "auto":
            activation = "sigmoid" if self.model.num_labels == 1 else "softmax"
        pairs = [(str(a), str(b)) for a, b in pairs]
        scores = self.model.score(pairs, batch_size=self.batch_size, activation=activation, num_threads=self.threads)
        return np.asarray(scores, dtype=np.float32)

    def identity(self) -> str:
        if self._identity is None:
            self._identity = teacher_identity(str(self.model_dir), encoder=self.encoder, pooling=self.pooling,
                                              max_length=self.max_length)
        return self._identity

    def ping(self) -> int:
        return self.forward_rows


class TeacherActor:
    """Handle to a TeacherEncoder in its own Ray actor; resources come from the config (``RoleResources``).

    ``async_*`` methods return ObjectRefs (OpenRLHF convention), the others block.
    """

    def __init__(self, spec: TeacherSpec, name: str | None = None):
        import ray

        options: dict[str, Any] = {"num_cpus": spec.resources.num_cpus, "num_gpus": spec.resources.num_gpus}
        if name:
            options["name"] = name
        self.spec = spec
        self.actor = ray.remote(TeacherEncoder).options(**options).remote(**spec.encoder_kwargs())

    def async_encode(self, texts: list[str]):
        return self.actor.encode.remote(list(texts))

    def async_score(self, pairs: list[tuple[str, str]], activation: str | None = "auto"):
        return self.actor.score.remote(list(pairs), activation)

    def encode(self, texts: list[str], timeout: float | None = None) -> np.ndarray:
        import ray

        return ray.get(self.async_encode(texts), timeout=timeout)

    def score(self, pairs, activation: str | None = "auto", timeout: float | None = None) -> np.ndarray:
        import ray

        return ray.get(self.async_score(pairs, activation), timeout=timeout)

    def forward_rows(self, timeout: float | None = None) -> int:
        import ray

        return ray.get(self.actor.ping.remote(), timeout=timeout)

    def kill(self) -> None:
        import ray

        ray.kill(self.actor)


class TeacherEmbed:
    """Callable class for ``Dataset.map_batches(TeacherEmbed, compute=ActorPoolStrategy(size=n))``.

    Input batch: ``{"idx": int64[B], "text": str[B]}``. Output: ``idx``, ``embedding`` float32[B, D] and
    ``teacher_forward_rows``: the rows this batch sent through the transformer, reported on the batch's first row and
    0 elsewhere, so that the column's sum over the dataset is the pool's total teacher work.
    """

    def __init__(self, text_column: str = "text", **encoder_kwargs):
        self.text_column = text_column
        self.teacher = TeacherEncoder(**encoder_kwargs)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows_before = self.teacher.forward_rows
        embeddings = self.teacher.encode(list(batch[self.text_column]))
        forward_rows = np.zeros(len(embeddings), dtype=np.int64)
        if len(forward_rows):
            forward_rows[0] = self.teacher.forward_rows - rows_before
        return {"idx": np.asarray(batch["idx"], dtype=np.int64), "embedding": embeddings,
                "teacher_forward_rows": forward_rows}
