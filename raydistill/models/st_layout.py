"""A sentence-transformers directory as raydistill reads and writes it: the module chain Transformer -> Pooling
[-> Dense] [-> Normalize].

``read_sentence_transformers_layout(directory)`` returns what a ``BiEncoder`` needs from such a directory (where the
transformer's weights are, the pooling mode, ``max_seq_length``, ``do_lower_case``, the Dense layer and whether a
Normalize module ends the chain), or None for a plain Hugging Face checkpoint (no ``modules.json``); a chain, pooling
mode or activation raydistill cannot reproduce is an error naming the file and the field. ``write_json`` and
``sentence_transformers_config`` gives the file ``BiEncoder.save`` adds. ``raydistill.models.bi_encoder``
re-exports the names other modules import (``transformer_directory``, ``read_sentence_transformers_layout``)."""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file as load_safetensors
from torch import Tensor, nn

from raydistill.models.batching import config_error
from raydistill.models.model_cache import read_json

POOLING_MODES = ("mean", "cls")

# Activation names we accept -> torch class. sentence-transformers stores the class's import path
# ("torch.nn.modules.activation.Tanh") in 2_Dense/config.json and imports it on load.
PROJECTION_ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "identity": nn.Identity, "relu": nn.ReLU,
                                                      "gelu": nn.GELU}

# sentence-transformers' legacy pooling flags (every release up to 6.x reads them) -> our mode name.
LEGACY_POOLING_FLAGS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}


def activation_import_path(name: str) -> str:
    """The `torch.nn....` path sentence-transformers writes for this activation (it refuses non-torch paths)."""
    cls = PROJECTION_ACTIVATIONS[name]
    return f"{cls.__module__}.{cls.__qualname__}"


# ----------------------------------------------------------------------------------------------------------------
# Reading a sentence-transformers directory


@dataclass
class DenseLayer:
    in_features: int
    out_features: int
    bias: bool
    activation: str
    weights: dict[str, Tensor]


@dataclass
class SentenceTransformersLayout:
    """What raydistill reads from an ST directory: modules Transformer -> Pooling [-> Dense] [-> Normalize]."""

    transformer_dir: Path
    pooling: str
    max_seq_length: int | None
    do_lower_case: bool
    dense: DenseLayer | None
    normalize: bool


def read_pooling_mode(config_path: Path) -> str:
    config = read_json(config_path)
    if "pooling_mode" in config:  # sentence-transformers >= 5.x format
        mode = config["pooling_mode"]
        if isinstance(mode, list) and len(mode) == 1:
            mode = mode[0]
        field = "pooling_mode"
    else:  # legacy boolean flags; none set means mean, as sentence-transformers decides
        active = [LEGACY_POOLING_FLAGS[key] for key in LEGACY_POOLING_FLAGS if config.get(key)]
        if len(active) > 1:
            raise config_error(config_path, "pooling_mode_mean_tokens", f"several pooling modes at once ({active})")
        mode = active[0] if active else "mean"
        field = next((key for key in LEGACY_POOLING_FLAGS if config.get(key)), "pooling_mode_mean_tokens")
    if mode not in POOLING_MODES:
        raise config_error(config_path, field,
                           f"pooling mode {mode!r} is not supported; raydistill reads {POOLING_MODES}")
    return mode


def read_dense_layer(dense_dir: Path) -> DenseLayer:
    config_path = dense_dir / "config.json"
    config = read_json(config_path)
    for field in ("in_features", "out_features"):
        if not isinstance(config.get(field), int):
            raise config_error(config_path, field, f"expected an integer, got {config.get(field)!r}")
    # sentence-transformers' Dense defaults to tanh when the key is absent.
    activation_path = config.get("activation_function", "torch.nn.modules.activation.Tanh")
    activation = "identity" if activation_path is None else str(activation_path).rsplit(".", 1)[-1].lower()
    if activation not in PROJECTION_ACTIVATIONS:
        raise config_error(config_path, "activation_function",
                           f"{activation_path!r} is not one of {sorted(PROJECTION_ACTIVATIONS)}")
    if (dense_dir / "model.safetensors").is_file():
        weights = load_safetensors(str(dense_dir / "model.safetensors"))
    elif (dense_dir / "pytorch_model.bin").is_file():
        weights = torch.load(dense_dir / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise FileNotFoundError(f"{dense_dir}: Dense layer without model.safetensors or pytorch_model.bin")
    return DenseLayer(in_features=config["in_features"], out_features=config["out_features"],
                      bias=bool(config.get("bias", True)), activation=activation, weights=weights)


def read_sentence_transformers_layout(directory: Path) -> SentenceTransformersLayout | None:
    """The directory's ST module chain, or None for a plain Hugging Face checkpoint (no modules.json)."""
    modules_path = directory / "modules.json"
    if not modules_path.is_file():
        return None
    modules = read_json(modules_path)
    if not isinstance(modules, list):
        raise ValueError(f"{modules_path}:1: expected a JSON list of modules, got {type(modules).__name__}")
    kinds = [str(entry.get("type", "")).rsplit(".", 1)[-1] for entry in modules]
    if kinds[:2] != ["Transformer", "Pooling"] or kinds[2:] not in ([], ["Dense"], ["Normalize"],
                                                                     ["Dense", "Normalize"]):
        raise config_error(modules_path, "type", f"module chain {kinds} is not supported; raydistill reads "
                                                 "Transformer, Pooling [, Dense] [, Normalize]")
    paths = [directory / str(entry.get("path", "")) for entry in modules]
    transformer_dir, pooling_dir = paths[0], paths[1]

    max_seq_length, do_lower_case = None, False
    st_config_path = transformer_dir / "sentence_bert_config.json"
    if st_config_path.is_file():
        st_config = read_json(st_config_path)
        max_seq_length = st_config.get("max_seq_length")
        if max_seq_length is not None and not (isinstance(max_seq_length, int) and max_seq_length > 1):
            raise config_error(st_config_path, "max_seq_length", f"expected an integer > 1, got {max_seq_length!r}")
        do_lower_case = bool(st_config.get("do_lower_case", False))

    return SentenceTransformersLayout(
        transformer_dir=transformer_dir, pooling=read_pooling_mode(pooling_dir / "config.json"),
        max_seq_length=max_seq_length, do_lower_case=do_lower_case,
        dense=read_dense_layer(paths[2]) if "Dense" in kinds else None, normalize="Normalize" in kinds,
    )


def transformer_directory(directory: Path) -> Path:
    """Where the Hugging Face weights of a checkpoint live (an ST directory may keep them in a subfolder)."""
    layout = read_sentence_transformers_layout(directory)
    return layout.transformer_dir if layout is not None else directory


def sentence_transformers_config() -> dict[str, Any]:
    """config_sentence_transformers.json: cosine similarity, no prompts, and the versions that wrote the files."""
    import transformers

    versions = {"pytorch": torch.__version__, "transformers": transformers.__version__}
    try:
        versions["sentence_transformers"] = importlib.metadata.version("sentence-transformers")
    except importlib.metadata.PackageNotFoundError:  # the field is informational; the directory loads regardless
        versions["sentence_transformers"] = "not installed"
    return {"__version__": versions, "prompts": {}, "default_prompt_name": None, "similarity_fn_name": "cosine"}
