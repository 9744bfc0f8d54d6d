"""The frozen teacher: a plain encoder class and the Ray Data callable that embeds a dataset in an actor pool.

``TeacherEncoder`` knows nothing of Ray: it loads a bi- or cross-encoder once, freezes it, pins its torch thread
count, and returns numpy (cheaper to ship between Ray processes, zero-copy on ``ray.get``; docs/runtime.md). Every
row that goes through the teacher's transformer is counted by a forward hook, so "the second epoch did no teacher
work" is a measured fact rather than an assumption about the cache. The bi-encoder pass batches by a padded-token
budget, in bf16 on hardware with fast bf16 matrix products (``precision: auto``: ``resolve_precision``).

``teacher_identity()`` names what determines the teacher's outputs, independent of where the model directory lives.
The embedding cache is keyed by it, which fixes the stale-cache bug of the ConGen/SCT code (docs/methods.md). A large
file's SHA-256 is remembered by path, size and mtime in ``$RAYDISTILL_HOME/file-hashes.json``, so a rerun does not
read gigabytes again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from raydistill.fileio import atomic_write_json, file_sha256
from raydistill.config.job import JobConfig, RoleResources, raydistill_home

__all__ = ["TeacherSpec", "TeacherEncoder", "TeacherEmbed", "teacher_identity", "resolve_precision",
           "bf16_support", "PRECISIONS"]

log = logging.getLogger(__name__)

# Bumped when the way embeddings are computed changes (e.g. normalisation), so old caches are not reused.
_EMBEDDING_FORMAT = 1
# Files up to this size are fed to the identity whole; larger ones (weights) by their remembered SHA-256.
_WHOLE_FILE_BYTES = 2 << 20
_HASH_MEMO_FILE = "file-hashes.json"

PRECISIONS = ("auto", "fp32", "bf16")
# Padded tokens per teacher forward when the config gives none. mpnet-base on 2 busy CPU cores, 192 mixed-corpus
# sentences, two rounds: 1024 tokens 6.5 / 7.9 sentences/s, 4096 tokens 5.0 / 5.5, sentence-transformers 5.1 / 4.7
# (the activations of a 1024-token batch stay in cache; larger products gain nothing more on CPU).
DEFAULT_TEACHER_MAX_TOKENS = 1024


@functools.lru_cache(maxsize=1)
def bf16_support() -> tuple[bool, str]:
    """``(fast, why)``: whether this CPU multiplies bf16 matrices in hardware (oneDNN or the CPU flags say so).
    Without AVX512-BF16 or AMX torch emulates them (measured 0.6 GFLOP/s against 72 for fp32 on a 2-core EPYC)."""
    import torch

    checks = []
    for name, probe in (("amx_tile", getattr(torch.cpu, "_is_amx_tile_supported", None)),
                        ("avx512_bf16", getattr(torch.cpu, "_is_avx512_bf16_supported", None)),
                        ("mkldnn_bf16", getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None))):
        try:
            if probe is not None and probe():
                return True, f"torch reports {name}"
        except (RuntimeError, AttributeError):
            continue
        checks.append(name)
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            flags = next((line.split(":", 1)[1].split() for line in cpuinfo if line.startswith("flags")), [])
    except OSError:
        flags = []
    for flag in ("amx_bf16", "avx512_bf16"):
        if flag in flags:
            return True, f"/proc/cpuinfo has {flag}"
    capability = torch.backends.cpu.get_cpu_capability()
    return False, f"no AVX512-BF16 or AMX (torch CPU capability {capability}; {', '.join(checks)} all false)"


def resolve_precision(requested: str, device: str = "cpu") -> tuple[str, str]:
    """``(precision, why)`` for a teacher asked for ``requested``: ``auto`` is bf16 on CUDA and on a CPU with hardware
    bf16 (``bf16_support``), else fp32; an explicit value is kept (warned when bf16 is emulated: many times slower)."""
    if requested not in PRECISIONS:
        raise ValueError(f"teacher precision must be one of {', '.join(PRECISIONS)}, got {requested!r}")
    if device.startswith("cuda"):
        return ("bf16" if requested == "auto" else requested), "CUDA device"
    fast, why = bf16_support()
    if requested == "auto":
        return ("bf16" if fast else "fp32"), why
    if requested == "bf16" and not fast:
        log.warning("teacher precision bf16 was asked for on a CPU without hardware bf16 (%s): expect a pass many "
                    "times slower than fp32", why)
    return requested, why


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
        return cls(model=cfg.teacher, encoder=cfg.extra.teacher_encoder, pooling=cfg.teacher_pooling,
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

    def precision(self) -> tuple[str, str]:
        """``(bf16 | fp32, why)``, decided once here (the driver) so that the cache identity and every pool actor
        agree; a cross-encoder teacher always runs in fp32."""
        if self.encoder != "bi":
            return "fp32", "cross-encoder teachers run in fp32"
        device = "cuda" if self.resources.num_gpus else "cpu"
        return resolve_precision(getattr(self.resources, "precision", "auto"), device)

    def encoder_kwargs(self) -> dict[str, Any]:
        """Constructor kwargs of TeacherEncoder / TeacherEmbed (the precision resolved: ``bf16`` or ``fp32``)."""
        return {"model": self.model, "encoder": self.encoder, "pooling": self.pooling, "max_length": self.max_length,
                "threads": self.resources.threads, "batch_size": self.resources.batch_size,
                "max_tokens": getattr(self.resources, "max_tokens", None), "precision": self.precision()[0]}

    def identity(self) -> str:
        return teacher_identity(self.model, encoder=self.encoder, pooling=self.pooling, max_length=self.max_length,
                                precision=self.precision()[0])

    def describe(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("resources")
        return d


def _resolve(model: str) -> Path:
    from raydistill.models.registry import resolve_model

    return Path(resolve_model(model))


def teacher_identity(model: str, *, encoder: str = "bi", pooling: str | None = None, max_length: int = 128,
                     precision: str = "fp32") -> str:
    """``<encoder>-<16 hex>``: a fingerprint of everything that determines the teacher's outputs: every file's
    content (weights by ``remembered_file_sha256``), not the directory's location (other paths share a cache).
    bf16 (third or fourth decimal off fp32) gets its own cache; ``fp32`` is left out, so older caches stay valid."""
    model_dir = _resolve(model)
    digest = hashlib.sha256()
    described = {"encoder": encoder, "pooling": pooling, "max_length": int(max_length), "normalized": encoder == "bi",
                 "format": _EMBEDDING_FORMAT}
    if precision != "fp32":
        described["precision"] = precision
    digest.update(json.dumps(described, sort_keys=True).encode())
    for path in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        rel = path.relative_to(model_dir).as_posix()
        if rel.startswith(".") or "/." in rel or path.name.lower().startswith("readme") \
                or path.name == "raydistill_model.json":
            continue  # documentation and provenance metadata do not change the outputs
        size = path.stat().st_size
        digest.update(f"{rel}\0{size}\0".encode())
        if size <= _WHOLE_FILE_BYTES:
            digest.update(path.read_bytes())
        else:
            digest.update(f"sha256:{remembered_file_sha256(path)}".encode())
    return f"{encoder}-{digest.hexdigest()[:16]}"


_SHA256_MEMO: dict[str, dict[str, Any]] = {}  # this process's view of the memo file


def remembered_file_sha256(path: Path) -> str:
    """SHA-256 of every byte of ``path``, remembered by (resolved path, size, mtime) in ``$RAYDISTILL_HOME/
    file-hashes.json``: a teacher's weights are read once, not at every job. A file replaced or rewritten gets a new
    size or modification time and is hashed again."""
    path = Path(path).resolve()
    stat = path.stat()
    state = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    memo_path = raydistill_home() / _HASH_MEMO_FILE
    entry = _SHA256_MEMO.get(str(path))
    if entry is None or {k: entry.get(k) for k in state} != state:
        _SHA256_MEMO.update(_read_hash_memo(memo_path))
        entry = _SHA256_MEMO.get(str(path))
    if entry is not None and {k: entry.get(k) for k in state} == state:
        return entry["sha256"]
    _SHA256_MEMO[str(path)] = {**state, "sha256": file_sha256(path)}
    _write_hash_memo(memo_path, str(path), _SHA256_MEMO[str(path)])
    return _SHA256_MEMO[str(path)]["sha256"]


def _read_hash_memo(memo_path: Path) -> dict[str, dict[str, Any]]:
    try:
        memo = json.loads(memo_path.read_text())
    except (OSError, ValueError):
        return {}  # none yet, or unreadable: hashing again is always correct
    return memo if isinstance(memo, dict) else {}


def _write_hash_memo(memo_path: Path, key: str, entry: dict[str, Any]) -> None:
    """Add one entry to the memo file (re-read first: other processes add theirs), dropping files that are gone."""
    memo = {path: value for path, value in _read_hash_memo(memo_path).items() if Path(path).exists()}
    memo[key] = entry
    try:
        memo_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(memo_path, memo, sort_keys=True)
    except OSError as exc:  # a read-only home: the hash is only recomputed next time
        log.debug("could not remember the hash of %s in %s: %s", key, memo_path, exc)


def _head_labels(model_dir: Path) -> int:
    """Labels of a cross-encoder checkpoint's trained classification head (1 when it has none yet)."""
    config_path = model_dir / "config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    has_head = any(str(a).endswith("ForSequenceClassification") for a in config.get("architectures") or [])
    return int(len(config.get("id2label") or {}) or config.get("num_labels") or 1) if has_head else 1


def token_batches(lengths: list[int], max_tokens: int, max_sentences: int | None = None) -> list[list[int]]:
    """Indices grouped for the forward pass, longest first, each group at most ``max_tokens`` padded tokens and
    ``max_sentences`` inputs (the config's ``batch_size``: it bounds activations of very short inputs on CPU)."""
    from raydistill.models.batching import token_budget_batches

    groups = token_budget_batches(lengths, max_tokens)
    if not max_sentences:
        return groups
    return [group[start:start + max_sentences] for group in groups for start in range(0, len(group), max_sentences)]


class TeacherEncoder:
    """A frozen bi- or cross-encoder that returns numpy, in-process or in any Ray actor. ``forward_rows`` counts the
    rows that went through the transformer (a forward hook), so callers can prove cached work was not redone."""

    def __init__(self, model: str, encoder: str = "bi", pooling: str | None = None, max_length: int = 128,
                 threads: int = 1, batch_size: int = 128, num_labels: int | None = None, device: str | None = None,
                 precision: str = "fp32", max_tokens: int | None = None):
        if encoder not in ("bi", "cross"):
            raise ValueError(f"encoder must be 'bi' or 'cross', got {encoder!r}")
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1 or None, got {max_tokens}")
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
        import torch

        if device is None:
            # A Ray actor without num_gpus sees no CUDA device (Ray empties CUDA_VISIBLE_DEVICES), so this picks the
            # GPU exactly when the config gave the teacher one.
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = device
        self.precision, why = ("fp32", "cross-encoder") if encoder != "bi" else resolve_precision(precision, device)
        self.max_tokens = int(max_tokens or DEFAULT_TEACHER_MAX_TOKENS)
        self.model.to(device).eval().requires_grad_(False)
        if self.precision == "bf16":
            # Weights cast once: autocast would re-cast every weight matrix on every forward of a frozen model.
            self.model.to(torch.bfloat16)
        log.info("teacher %s: %s on %s (%s), batches of at most %d padded tokens / %d sentences, %d threads",
                 Path(str(model)).name, self.precision, device, why, self.max_tokens, self.batch_size, self.threads)
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
        """L2-normalised sentence embeddings, float32 [N, D], in input order; run in ``token_batches`` of texts
        tokenised once, so a batch pads only to its own longest sentence."""
        import torch
        import torch.nn.functional as F

        from raydistill.models.batching import inference, torch_threads

        if self.encoder != "bi":
            raise TypeError("encode() needs a bi-encoder teacher; this one is a cross-encoder (use score())")
        texts = [str(t) for t in texts]
        embeddings = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return embeddings
        token_ids = self._token_ids(texts)
        with torch_threads(self.threads), inference(self.model):
            for batch in token_batches([len(ids) for ids in token_ids], self.max_tokens, self.batch_size):
                features = self._padded([token_ids[i] for i in batch])  # [b, T] each
                vectors = self.model(features)  # [b, D] in the model's dtype
                embeddings[batch] = F.normalize(vectors.to(torch.float32), p=2, dim=-1).cpu().numpy()
        return embeddings

    def _token_ids(self, texts: list[str]) -> list[list[int]]:
        """Token ids per text (special tokens included), truncated to ``max_length``, unpadded."""
        model = self.model
        if model.do_lower_case:
            texts = [text.lower() for text in texts]
        return model.tokenizer(texts, truncation=True, max_length=self.max_length, padding=False,
                               return_attention_mask=False, return_token_type_ids=False)["input_ids"]

    def _padded(self, token_ids: list[list[int]]) -> dict[str, Any]:
        """``input_ids`` and ``attention_mask`` int64 [b, T], padded (on the tokenizer's side) to the longest."""
        import torch

        tokenizer = self.model.tokenizer
        longest = max(len(ids) for ids in token_ids)
        input_ids = np.full((len(token_ids), longest), tokenizer.pad_token_id or 0, dtype=np.int64)
        attention_mask = np.zeros((len(token_ids), longest), dtype=np.int64)
        left = tokenizer.padding_side == "left"
        for row, ids in enumerate(token_ids):
            span = slice(longest - len(ids), longest) if left else slice(0, len(ids))
            input_ids[row, span] = ids
            attention_mask[row, span] = 1
        features = {"input_ids": torch.from_numpy(input_ids), "attention_mask": torch.from_numpy(attention_mask)}
        if "token_type_ids" in self.model.input_names:
            features["token_type_ids"] = torch.zeros_like(features["input_ids"])
        return {name: value.to(self.device) for name, value in features.items()}

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
                                              max_length=self.max_length, precision=self.precision)
        return self._identity


class TeacherEmbed:
    """Callable class for ``Dataset.map_batches(TeacherEmbed, compute=ActorPoolStrategy(size=n))``: ``{"idx",
    "text"}`` batches to ``idx``, ``embedding`` float32[B, D] and ``teacher_forward_rows`` (the batch's transformer
    rows on its first row, 0 elsewhere: the column's sum is the pool's total teacher work)."""

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
