"""Static token embeddings: a sentence vector is the mean of one learned vector per token, no attention, no layers.

The student (Model2Vec, Tulkens & van Dongen 2024; sentence-transformers' ``StaticEmbedding``):

    x = token ids of the text WITHOUT [CLS]/[SEP]            # [B, T]; m = attention mask [B, T]
    h = E[x]                                                 # [B, T, D], E: the table [V, D]
    e = sum_t m_t h_t / max(sum_t m_t, 1e-9)                 # [B, D]  (BiEncoder's mean pooling)

``StaticEmbeddingModel`` is the ``transformer`` of a ``BiEncoder``: it returns ``h`` as ``last_hidden_state``, so
pooling, projection, training, ``encode`` and evaluation are the BiEncoder's own. ``BiEncoder.tokenize`` leaves out
the special tokens for it (``add_special_tokens=False``), as Model2Vec and sentence-transformers do: a [CLS] and a
[SEP] in every sentence would add the same two rows to every mean and pull all sentences together.

Initialisation from a teacher (Model2Vec's distill), over the teacher tokenizer's whole vocabulary:

    g_v = mean_p teacher([CLS] v [SEP])_p                    # [V, H] one 3-token forward per token id v, batched
    z_v = (g_v - mean_v g) @ U                               # [V, D] PCA: U [H, D] = top-D covariance eigenvectors
    E_v = z_v * a / (a + p_v),  p_v = (1/(v+2)) / sum_k 1/(k+2)   # SIF weight, Zipf frequency from the token rank

The special tokens stand where a sentence has them, as Model2Vec (0.10) puts them. (Its earlier versions swapped
them, [SEP] v [CLS]: from mpnet-base that order gave a table scoring 12.4 on 7-STS untrained, against 63.4 for this
one, because its outputs for a few frequent tokens ("the", ".") came out 60-80 times longer than the rest.) The
rank of a token is its id: WordPiece and BPE vocabularies list frequent tokens first, so Zipf's law on the id stands
in for corpus counts (a = 1e-4, Model2Vec's default). PCA centres the table, which removes the direction every token
shares (the "common component" SIF removes). Unlike Model2Vec, no token is removed (its ``[unused*]`` filter): the
table keeps the teacher tokenizer's ids so the tokenizer is used unchanged.

Directory format (``write_static_directory`` / ``read_static_directory``), one set of files for three loaders:

    modules.json       [StaticEmbedding at path ""] (+ Normalize)   sentence-transformers' module chain
    model.safetensors  {"embeddings": [V, D] float32}               Model2Vec's tensor name; sentence-transformers'
                                                                    StaticEmbedding.load reads it too
    tokenizer.json     the teacher's tokenizer, no padding, truncation at max_length
    tokenizer_config.json, special_tokens_map.json, vocab.txt ...   for transformers' AutoTokenizer
    config.json        Model2Vec's config (model_type "model2vec", hidden_dim, normalize, ...)

It is the layout Model2Vec itself saves (its models on the hub load in sentence-transformers this way), so
``SentenceTransformer(dir)``, ``model2vec.StaticModel.from_pretrained(dir)`` and ``BiEncoder.from_pretrained(dir)``
all read the same table. Model2Vec drops [UNK] ids before averaging while sentence-transformers and this module keep
them, so a text with unknown tokens differs there; texts longer than max_length tokens are truncated alike.

``build_static_student(teacher_dir, target, dim)`` writes such a directory; ``registry.resolve_model("static:256",
teacher=...)`` caches it under ``$RAYDISTILL_HOME/models/static-<dim>-<teacher fingerprint>``."""

from __future__ import annotations

import copy
import hashlib
import inspect
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file as load_safetensors
from safetensors.torch import save_file as save_safetensors
from torch import Tensor, nn

from raydistill import __version__
from raydistill.fileio import atomic_write_json, file_sha256
from raydistill.models.model_cache import _transformer_dir, read_json
from raydistill.models.progress import Progress

logger = logging.getLogger(__name__)

STATIC_NAME = "static"
DEFAULT_STATIC_DIM = 256
SIF_COEFFICIENT = 1e-4
INIT_BATCH_SIZE = 512
# What a cached table was built with: another recipe (order of the special tokens, weighting) is a rebuild.
STATIC_RECIPE = "model2vec: mean of teacher([CLS] v [SEP]), PCA, SIF a=1e-4 on Zipf rank"
STATIC_MODULE_TYPE = "sentence_transformers.models.StaticEmbedding"
MODEL2VEC_TENSOR = "embeddings"
# Tokens per text when nothing says otherwise: what Model2Vec's encode truncates at.
DEFAULT_STATIC_MAX_LENGTH = 512

_STATIC_PATTERN = re.compile(r"^static(?::(.*))?$")


# ----------------------------------------------------------------------------------------------------------------
# Names


def static_width(name: str) -> int | None:
    """The width D that ``name`` asks for ("static" -> 256, "static:128" -> 128), None when it is no static name.

    A malformed width ("static:0", "static:abc") raises ValueError, so a typo never reads as "unknown model"."""
    match = _STATIC_PATTERN.match(str(name))
    if match is None:
        return None
    text = match.group(1)
    if text is None:
        return DEFAULT_STATIC_DIM
    if not re.fullmatch(r"[0-9]+", text.strip()) or int(text) < 1:
        raise ValueError(f"student {name!r}: the width after 'static:' must be a positive integer, e.g. "
                         f"static:{DEFAULT_STATIC_DIM} (plain 'static' is {DEFAULT_STATIC_DIM} wide)")
    return int(text)


# ----------------------------------------------------------------------------------------------------------------
# The module


class StaticConfig:
    """The few config fields BiEncoder and the batching helpers read from a transformer's ``config``."""

    model_type = "static"
    max_position_embeddings = None  # no positions: the length limit is the tokenizer's truncation

    def __init__(self, vocab_size: int, hidden_size: int):
        self.vocab_size, self.hidden_size = vocab_size, hidden_size


@dataclass
class StaticOutput:
    last_hidden_state: Tensor  # [B, T, D]


class StaticEmbeddingModel(nn.Module):
    """The table E [V, D] as a BiEncoder ``transformer``: token ids -> their rows, nothing mixed across positions."""

    def __init__(self, weight: Tensor):
        super().__init__()
        if weight.dim() != 2:
            raise ValueError(f"a static embedding table is [vocabulary, width], got shape {tuple(weight.shape)}")
        self.embeddings = nn.Embedding.from_pretrained(weight.detach().clone().float(), freeze=False)  # [V, D]
        self.config = StaticConfig(vocab_size=weight.shape[0], hidden_size=weight.shape[1])

    def get_input_embeddings(self) -> nn.Embedding:
        # batching.bucketed_forward and the CPU learner's sparse-gradient speed-up find the table through this
        return self.embeddings

    def forward(self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                inputs_embeds: Tensor | None = None) -> StaticOutput:
        states = self.embeddings(input_ids) if inputs_embeds is None else inputs_embeds  # [B, T, D]
        return StaticOutput(last_hidden_state=states)


# ----------------------------------------------------------------------------------------------------------------
# Directory format


def _modules(directory: Path) -> list[dict[str, Any]] | None:
    path = Path(directory) / "modules.json"
    if not path.is_file():
        return None
    modules = read_json(path)
    return modules if isinstance(modules, list) and modules and isinstance(modules[0], dict) else None


def is_static_directory(directory: str | Path) -> bool:
    """Whether ``directory`` is a sentence-transformers directory whose first module is a StaticEmbedding."""
    modules = _modules(Path(directory))
    return modules is not None and str(modules[0].get("type", "")).endswith("StaticEmbedding")


def write_static_directory(directory: str | Path, weight: Tensor, tokenizer, *, max_length: int,
                           normalize: bool = False, config: dict[str, Any] | None = None) -> None:
    """Write the table ``weight`` [V, D] and ``tokenizer`` as a static-model directory (the module docstring's format).

    ``config``: extra Model2Vec config fields (how the table was made), over the ones every directory has."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    weight = weight.detach().cpu().float().contiguous()
    if weight.shape[0] != len(tokenizer):
        raise ValueError(f"the table has {weight.shape[0]} rows but the tokenizer {len(tokenizer)} tokens")
    tokenizer.save_pretrained(directory)
    # sentence-transformers and Model2Vec tokenise with the bare tokenizers.Tokenizer of tokenizer.json: it must
    # truncate where this model does and never pad, or their means would count other tokens than ours.
    backend = copy.deepcopy(tokenizer.backend_tokenizer)
    backend.no_padding()
    backend.enable_truncation(max_length)
    backend.save(str(directory / "tokenizer.json"))
    save_safetensors({MODEL2VEC_TENSOR: weight}, str(directory / "model.safetensors"))
    atomic_write_json(directory / "config.json", {
        "model_type": "model2vec", "architectures": ["StaticModel"], "hidden_dim": int(weight.shape[1]),
        "seq_length": int(max_length), "normalize": bool(normalize), **(config or {}),
    })
    modules = [{"idx": 0, "name": "0", "path": "", "type": STATIC_MODULE_TYPE}]
    if normalize:
        (directory / "1_Normalize").mkdir(exist_ok=True)
        modules.append({"idx": 1, "name": "1", "path": "1_Normalize", "type": "sentence_transformers.models.Normalize"})
    atomic_write_json(directory / "modules.json", modules)


def _static_tokenizer(directory: Path):
    """transformers' tokenizer of a static directory; a bare tokenizer.json (a Model2Vec download) is wrapped."""
    from transformers import AutoTokenizer, PretrainedConfig, PreTrainedTokenizerFast

    if (directory / "tokenizer_config.json").is_file():
        # An empty config: config.json here is Model2Vec's, which transformers would warn is no model type it knows.
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True, config=PretrainedConfig())
    else:
        tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(directory / "tokenizer.json"))
    if tokenizer.pad_token is None:  # padding rows are masked out; any token id will do, a real pad token if any
        vocab = tokenizer.get_vocab()
        tokenizer.pad_token = next((t for t in ("[PAD]", "<pad>", "[UNK]", "<unk>") if t in vocab),
                                   tokenizer.convert_ids_to_tokens(0))
    return tokenizer


def read_static_directory(directory: str | Path) -> tuple[StaticEmbeddingModel, Any, int | None, bool]:
    """(module, tokenizer, max_length or None, normalize) of a static directory (``write_static_directory``'s, or
    one that sentence-transformers or Model2Vec wrote)."""
    directory = Path(directory)
    modules = _modules(directory) or []
    kinds = [str(entry.get("type", "")).rsplit(".", 1)[-1] for entry in modules]
    if kinds not in (["StaticEmbedding"], ["StaticEmbedding", "Normalize"]):
        raise ValueError(f"{directory / 'modules.json'}:1: field 'type': module chain {kinds} is not supported; "
                         "raydistill reads StaticEmbedding [, Normalize]")
    module_dir = directory / str(modules[0].get("path", "") or "")
    weights_path = module_dir / "model.safetensors"
    if not weights_path.is_file():
        raise FileNotFoundError(f"{module_dir}: static model without model.safetensors")
    tensors = load_safetensors(str(weights_path))
    if "embedding.weight" in tensors:  # sentence-transformers' own name
        weight = tensors["embedding.weight"]
    elif MODEL2VEC_TENSOR in tensors:
        weight = tensors[MODEL2VEC_TENSOR]
        # Model2Vec's vocabulary-quantised models share rows ("mapping") and scale them per token ("weights")
        if "mapping" in tensors:
            weight = weight[tensors["mapping"].long()]
        if "weights" in tensors:
            weight = weight.float() * tensors["weights"].float()[:, None]
    else:
        raise ValueError(f"{weights_path}: no 'embeddings' nor 'embedding.weight' tensor (has {sorted(tensors)})")
    tokenizer = _static_tokenizer(module_dir)
    if weight.shape[0] != len(tokenizer):
        raise ValueError(f"{weights_path}: the table has {weight.shape[0]} rows but the tokenizer in {module_dir} "
                         f"has {len(tokenizer)} tokens")
    truncation = (read_json(module_dir / "tokenizer.json").get("truncation") or {}) \
        if (module_dir / "tokenizer.json").is_file() else {}
    max_length = truncation.get("max_length") if isinstance(truncation, dict) else None
    return StaticEmbeddingModel(weight.float()), tokenizer, max_length, "Normalize" in kinds


# ----------------------------------------------------------------------------------------------------------------
# Initialisation from a teacher


def directory_fingerprint(directory: str | Path) -> str:
    """SHA-256 (hex) over every file of ``directory`` (relative path, size, content), provenance files left out: the
    teacher identity a cached table is keyed by; the same weights reached through another path share it."""
    directory = Path(directory)
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        rel = path.relative_to(directory).as_posix()
        if rel.startswith(".") or "/." in rel or path.name.lower().startswith("readme") \
                or path.name == "raydistill_model.json":
            continue  # documentation and provenance do not change the teacher's outputs
        digest.update(f"{rel}\0{path.stat().st_size}\0{file_sha256(path)}\n".encode())
    return digest.hexdigest()


@torch.inference_mode()
def teacher_token_vectors(transformer, tokenizer, *, batch_size: int = INIT_BATCH_SIZE,
                          progress: bool = True) -> np.ndarray:
    """g [V, H] float64: the teacher's mean output over the 3-token input [CLS] v [SEP], for every token id v."""
    vocab_size = len(tokenizer)
    ids = torch.arange(vocab_size)  # [V]
    around = tokenizer("A")["input_ids"]  # [CLS] a [SEP], or just [a] for a tokenizer without special tokens
    columns = [ids]
    if len(around) >= 3:
        first, last = around[0], around[-1]
        columns = [torch.full_like(ids, first), ids, torch.full_like(ids, last)]
    inputs = torch.stack(columns, dim=1)  # [V, 3]
    accepts = set(inspect.signature(transformer.forward).parameters)
    device = next(transformer.parameters()).device
    out = np.zeros((vocab_size, transformer.config.hidden_size), dtype=np.float64)
    starts = range(0, vocab_size, batch_size)
    # a minutes-long init must show it is alive: its bar stays, its seconds are whole
    bar = Progress(len(starts), "static init: teacher tokens", progress, leave=True, decimals=0)
    try:
        for start in starts:
            batch = inputs[start:start + batch_size].to(device)  # [b, 3]
            features = {"input_ids": batch, "attention_mask": torch.ones_like(batch)}
            if "token_type_ids" in accepts:
                features["token_type_ids"] = torch.zeros_like(batch)
            states = transformer(**features).last_hidden_state  # [b, 3, H]
            out[start:start + len(batch)] = states.float().mean(dim=1).cpu().numpy()
            bar.update()
    finally:
        bar.close()
    return out


def pca_reduce(vectors: np.ndarray, dim: int) -> np.ndarray:
    """(vectors - mean) @ U [V, dim], U the top-``dim`` eigenvectors of their covariance, each signed so that its
    largest-magnitude entry is positive (the result does not depend on the eigensolver's signs)."""
    vocab_size, width = vectors.shape
    if not 1 <= dim <= min(width, vocab_size):
        raise ValueError(f"a static table of width {dim} cannot come from {vocab_size} teacher vectors of width "
                         f"{width}: PCA keeps at most {min(width, vocab_size)} dimensions")
    centred = vectors - vectors.mean(axis=0, keepdims=True)  # [V, H]
    covariance = centred.T @ centred / max(vocab_size - 1, 1)  # [H, H]
    eigenvalues, eigenvectors = np.linalg.eigh(covariance)  # ascending
    top = eigenvectors[:, np.argsort(eigenvalues)[::-1][:dim]]  # [H, D]
    signs = np.sign(top[np.abs(top).argmax(axis=0), np.arange(dim)])
    return centred @ (top * np.where(signs == 0, 1.0, signs))  # [V, D]


def sif_weights(vocab_size: int, coefficient: float = SIF_COEFFICIENT) -> np.ndarray:
    """a / (a + p_v) [V], p_v the Zipf probability of rank v (= token id): rare tokens keep their vector, frequent
    ones (low ids: punctuation, "the") are shrunk towards 0 so they weigh less in a sentence's mean."""
    inverse_rank = 1.0 / np.arange(2, vocab_size + 2, dtype=np.float64)  # [V]
    probability = inverse_rank / inverse_rank.sum()
    return coefficient / (coefficient + probability)


def static_table(transformer, tokenizer, dim: int, *, batch_size: int = INIT_BATCH_SIZE,
                 progress: bool = True) -> Tensor:
    """E [V, dim] float32 from a teacher transformer and its tokenizer: teacher token vectors, PCA, SIF weights."""
    vectors = teacher_token_vectors(transformer, tokenizer, batch_size=batch_size, progress=progress)  # [V, H]
    reduced = pca_reduce(vectors, dim)  # [V, D]
    weighted = reduced * sif_weights(len(reduced))[:, None]  # [V, D]
    return torch.from_numpy(weighted.astype(np.float32))


def build_static_student(teacher_dir: str | Path, target: str | Path, dim: int, *, teacher: str | None = None,
                         batch_size: int = INIT_BATCH_SIZE, progress: bool = True) -> dict[str, Any]:
    """Write the static student of width ``dim`` initialised from the teacher at ``teacher_dir`` into ``target``;
    returns the provenance metadata (``model_cache.build_cached``'s contract)."""
    from transformers import AutoModel, AutoTokenizer

    teacher_dir = Path(teacher_dir)
    if is_static_directory(teacher_dir):
        raise ValueError(f"{teacher_dir} is a static model: a static student is initialised from a transformer "
                         "teacher's outputs")
    transformer_dir = _transformer_dir(teacher_dir)  # a sentence-transformers teacher's first module's folder
    started = time.perf_counter()
    model = AutoModel.from_pretrained(transformer_dir, local_files_only=True, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(transformer_dir, local_files_only=True)
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"{transformer_dir}: a static model needs a fast (tokenizers) tokenizer, which "
                         "sentence-transformers' StaticEmbedding and Model2Vec read from tokenizer.json")
    table = static_table(model, tokenizer, dim, batch_size=batch_size, progress=progress)  # [V, D]
    limit = tokenizer.model_max_length
    max_length = int(limit) if 0 < limit < 1_000_000 else DEFAULT_STATIC_MAX_LENGTH
    # Model2Vec's distill normalises its outputs by default; the same for users of the exported model
    write_static_directory(target, table, tokenizer, max_length=max_length, normalize=True, config={
        "tokenizer_name": teacher or str(teacher_dir), "apply_pca": dim, "apply_zipf": True,
        "sif_coefficient": SIF_COEFFICIENT,
    })
    seconds = time.perf_counter() - started
    logger.info("Static student %d wide from %s: %d token vectors in %.0f s", dim, teacher_dir, len(table), seconds)
    return {
        "preset": f"{STATIC_NAME}:{dim}", "derived_from": teacher or str(teacher_dir), "source_path": str(teacher_dir),
        "method": STATIC_RECIPE,
        "static": {"dim": dim, "vocab_size": len(table), "teacher_width": int(model.config.hidden_size),
                   "sif_coefficient": SIF_COEFFICIENT, "init_seconds": round(seconds, 1)},
        "raydistill_version": __version__,
    }
