"""Dynamic int8 export of a bi-encoder (raydistill.models.quantize) on a tiny random BERT with a Dense projection."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from raydistill.models import BiEncoder
from raydistill.models.quantize import QUANTIZED_WEIGHTS, export_quantized, load_quantized, quantize_linear

SENTENCES = [
    "A man is playing a guitar on the street.",
    "Two dogs run through the snow.",
    "A woman slices a tomato in the kitchen.",
    "The children are playing football in a park near the river.",
    "A plane is taking off.",
    "Stocks fell sharply on Monday after the report.",
]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module")
def tiny_student(tiny_bert, tmp_path_factory):
    """A saved sentence-transformers directory: tiny BERT + mean pooling + Dense(32 -> 48, tanh)."""
    directory = tmp_path_factory.mktemp("tiny_student")
    BiEncoder.from_pretrained(tiny_bert, projection_dim=48).save(directory)
    return directory


def test_quantized_encodes_like_fp32(tiny_student):
    fp32 = BiEncoder.from_pretrained(tiny_student)
    int8 = quantize_linear(fp32)
    assert isinstance(fp32.transformer.encoder.layer[0].attention.self.query, torch.nn.Linear)  # original untouched
    assert type(int8.transformer.encoder.layer[0].attention.self.query).__module__.startswith("torch.ao.nn.quantized")
    assert type(int8.projection).__module__.startswith("torch.ao.nn.quantized")
    assert type(int8.transformer.encoder.layer[0].output.dense) is torch.nn.Linear  # the FFN output stays fp32
    reference, approx = fp32.encode(SENTENCES), int8.encode(SENTENCES)
    assert approx.shape == reference.shape == (len(SENTENCES), 48)
    assert cosines(reference, approx).min() >= 0.99


def test_export_loads_back(tiny_student, tmp_path):
    out = export_quantized(tiny_student, tmp_path / "int8")
    assert (out / QUANTIZED_WEIGHTS).is_file()
    assert not (out / "model.safetensors").exists()  # the fp32 transformer weights are not shipped
    quantization = json.loads((out / "raydistill_model.json").read_text())["quantization"]
    assert quantization["dtype"] == "qint8" and quantization["layers"]
    assert any(name.endswith("output.dense") and "attention" not in name for name in quantization["fp32_layers"])

    loaded = load_quantized(out)
    in_memory = quantize_linear(BiEncoder.from_pretrained(tiny_student))
    reference = BiEncoder.from_pretrained(tiny_student).encode(SENTENCES)
    embeddings = loaded.encode(SENTENCES)
    np.testing.assert_allclose(embeddings, in_memory.encode(SENTENCES), rtol=0, atol=1e-6)
    assert cosines(reference, embeddings).min() >= 0.99
    assert loaded.dim == 48 and loaded.pooling == "mean" and loaded.max_length == in_memory.max_length


def test_load_rejects_plain_directory(tiny_student):
    with pytest.raises(FileNotFoundError, match="export_quantized"):
        load_quantized(tiny_student)
