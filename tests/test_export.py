"""ONNX export of a bi-encoder (raydistill.models.export) on a tiny random BERT with a Dense projection: the files
sentence-transformers' ONNX layout names, and embeddings that match the torch model's, fp32 and int8, through
raydistill's runner and through sentence-transformers' own ONNX backend (in its side environment)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from raydistill.models import BiEncoder
from raydistill.models.export import FP32_FILE, export_onnx, load_onnx, quantization_target

SENTENCES = [
    "A man is playing a guitar on the street.",
    "Two dogs run through the snow.",
    "A woman slices a tomato in the kitchen.",
    "The children are playing football in a park near the river.",
    "A plane is taking off.",
    "Stocks fell sharply on Monday after the report.",
    "Hi",
    "A very long sentence that goes on " * 12,
]
# Measured on this tiny student: fp32 min cosine 1.0 (max |diff| 3e-7), int8 (avx2 preset) 0.99989; a differently
# seeded student's export scores 0.14-0.24. Real weights lose more in int8 (256 STS sentences, bench/export_speed.py:
# all-MiniLM-L6 0.974 min / 0.992 mean, minilm-l3 0.990 / 0.994), hence the int8 bound's margin for other CPUs' presets.
FP32_MIN_COSINE = 0.9999
INT8_MIN_COSINE = 0.99
# bench/: the side environment sentence-transformers' ONNX backend runs in, and the script that runs it there.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module")
def exported(tiny_bert, tmp_path_factory):
    """A tiny BERT + mean pooling + Dense(32 -> 48, tanh) sentence-transformers directory, exported once."""
    directory = tmp_path_factory.mktemp("onnx_student")
    BiEncoder.from_pretrained(tiny_bert, projection_dim=48).save(directory)
    return directory, export_onnx(directory, report=None)


def test_export_writes_sentence_transformers_onnx_files(exported):
    directory, rows = exported
    target, _ = quantization_target()
    weights = "quint8" if target == "avx2" else "qint8"
    assert [row["file"] for row in rows] == [FP32_FILE, f"onnx/model_{weights}_{target}.onnx"]
    for row in rows:
        assert (directory / row["file"]).stat().st_size == row["bytes"] > 0
    assert rows[0]["quantization"] is None
    assert rows[1]["quantization"]["target"] == target and rows[1]["quantization"]["per_channel"]
    # int8 weights: the embedding tables and Linear weights shrink ~4x; graph metadata does not.
    assert rows[1]["bytes"] < 0.7 * rows[0]["bytes"]

    import onnxruntime

    for row in rows:
        session = onnxruntime.InferenceSession(str(directory / row["file"]), providers=["CPUExecutionProvider"])
        # What sentence-transformers' ONNX backend feeds and reads (optimum's feature-extraction signature).
        assert [i.name for i in session.get_inputs()] == ["input_ids", "attention_mask", "token_type_ids"]
        assert [o.name for o in session.get_outputs()] == ["last_hidden_state"]


def test_onnx_encodes_like_torch(exported):
    directory, rows = exported
    reference = BiEncoder.from_pretrained(directory).encode(SENTENCES)
    fp32 = load_onnx(directory, rows[0]["file"]).encode(SENTENCES)
    int8 = load_onnx(directory, rows[1]["file"]).encode(SENTENCES)
    assert fp32.shape == int8.shape == reference.shape == (len(SENTENCES), 48)
    np.testing.assert_allclose(fp32, reference, rtol=0, atol=1e-4)  # batch and sequence axes are dynamic
    assert cosines(reference, fp32).min() >= FP32_MIN_COSINE
    assert cosines(reference, int8).min() >= INT8_MIN_COSINE
    assert not np.allclose(int8, reference, atol=1e-6)  # the int8 file is quantised, not a copy of fp32


def test_sentence_transformers_loads_the_export(exported, tmp_path):
    """sentence-transformers' own ONNX backend reads these files and gives the vectors its torch backend gives. The
    backend (optimum-onnx) requires transformers < 4.58, raydistill 5, so it runs in the side environment
    bench/export_speed.py times it in (built by pip once, then reused): a subprocess loads the directory with
    ``backend="onnx"`` for each file and saves its vectors. Skipped only when pip cannot reach the package index to
    build that environment."""
    from common import PackageIndexUnreachable, side_environment
    from export_speed import ST_ONNX_ENV, ST_ONNX_PINS, sentence_transformers_encode
    from sentence_transformers import SentenceTransformer

    directory, rows = exported
    try:
        python = side_environment(ST_ONNX_ENV, ST_ONNX_PINS)
    except PackageIndexUnreachable as error:
        pytest.skip(f"sentence-transformers' ONNX backend cannot be installed: {error}")
    backends = {"fp32": rows[0]["file"], "int8": rows[1]["file"]}
    run = sentence_transformers_encode(python, directory, backends, SENTENCES, batch=4, threads=1, rounds=0,
                                       work=tmp_path)
    assert run["versions"]["optimum-onnx"] == "0.1.0" and run["versions"]["transformers"].startswith("4.57.")
    for name, file in backends.items():  # optimum's ONNX Runtime model, on this export's file, not one it made
        assert run["runs"][name]["class"] == "ORTModelForFeatureExtraction"
        assert Path(run["runs"][name]["file"]).resolve() == (directory / file).resolve()
    reference = SentenceTransformer(str(directory), device="cpu").encode(SENTENCES)
    for name, bound in zip(backends, (FP32_MIN_COSINE, INT8_MIN_COSINE)):
        assert run["embeddings"][name].shape == reference.shape == (len(SENTENCES), 48)
        assert cosines(reference, run["embeddings"][name]).min() >= bound, name


@pytest.mark.parametrize(("flags", "machine", "expected"), [
    ({"avx", "avx2", "fma"}, "x86_64", "avx2"),
    ({"avx2", "avx512f", "avx512bw"}, "x86_64", "avx512"),
    ({"avx2", "avx512f", "avx512bw", "avx512_vnni"}, "x86_64", "avx512_vnni"),
    ({"sse4_2"}, "x86_64", "avx2"),
    (set(), "aarch64", "arm64"),
])
def test_quantization_target_follows_cpu_flags(flags, machine, expected):
    assert quantization_target(flags, machine)[0] == expected


def test_export_rejects_a_plain_checkpoint(tiny_bert):
    with pytest.raises(FileNotFoundError, match="modules.json"):
        export_onnx(tiny_bert, report=None)
