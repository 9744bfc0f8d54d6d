"""Dynamic int8 quantisation of a BiEncoder for CPU inference, and an export directory that loads back.

What is quantised: the ``nn.Linear`` layers of the transformer (attention Q/K/V and output, the FFN's first
layer, the pooler) and of the projection, with ``torch.ao.quantization.quantize_dynamic``: weights are stored
as int8, one scale per output channel; each call quantises its input activations to uint8 with a scale measured
on that input, runs an int8 GEMM (fbgemm / x86 engine) and returns fp32. Embeddings, LayerNorm, softmax, GELU
and pooling stay fp32. The FFN's second layer (``*.output.dense`` outside attention: 4H -> H) stays fp32 by
default: its inputs are post-GELU activations with a few large outliers, and one per-tensor activation scale
for them costs the most accuracy (measured on minilm-l3, STS-B dev 84.21 fp32: 83.74 with it quantised, 84.10
without; sts12 65.29 vs 66.61, fp32 67.07). As exported, minilm-l3 keeps its 7-STS average within 0.2 points
(75.16 vs 75.34) at ~1.2x the fp32 encode rate on two shared cores; every Linear in int8 runs ~1.35x
(results/bench-inference.json, ``keep_ffn_output_fp32=False``).

Why dynamic int8 on CPU: encoder inference on a CPU is dominated by fp32 GEMMs of the Linear layers, and int8
GEMMs move a quarter of the weight bytes and run with integer SIMD (VNNI where present). Dynamic quantisation
needs no calibration data (activation scales are measured per call) and no retraining, so it applies to any
checkpoint after the fact; static quantisation would need calibration, and fp16/bf16 are not faster on most
CPUs without AMX.

The export directory is the model's sentence-transformers directory (``BiEncoder.save``: config, tokenizer,
pooling, Dense config, ``raydistill_model.json``) with the transformer's fp32 ``model.safetensors`` replaced by
``model_int8.pt``: the quantised model's ``state_dict`` (``torch.save``; int8 packed weights with their scales,
fp32 embeddings and norms). ``raydistill_model.json`` gets a ``quantization`` entry listing the quantised
layers. It is not loadable by ``BiEncoder.from_pretrained`` or sentence-transformers (no fp32 weights); load it
with :func:`load_quantized`, under the same torch (packed int8 weights are an engine format)::

    from raydistill.models.quantize import export_quantized, load_quantized
    export_quantized("runs/congen-minilm-l3-mpnet-base/best", "runs/congen-minilm-l3-int8")
    model = load_quantized("runs/congen-minilm-l3-int8")          # a BiEncoder; .encode(...) as usual
"""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from raydistill.models.batching import METADATA_FILE, read_json, read_metadata
from raydistill.models.bi_encoder import BiEncoder, read_sentence_transformers_layout, write_json

QUANTIZED_WEIGHTS = "model_int8.pt"
# The transformer's fp32 weight files BiEncoder.save writes (save_pretrained), replaced by QUANTIZED_WEIGHTS.
FP32_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def is_ffn_output(name: str) -> bool:
    """The FFN's second Linear (4H -> H) in BERT / RoBERTa / MPNet layers: ``...layer.N.output.dense``."""
    return name.endswith(".output.dense") and not name.endswith("attention.output.dense")


def quantizable_layers(model: nn.Module, keep_ffn_output_fp32: bool = True) -> list[str]:
    """Names of the ``nn.Linear`` modules `quantize_linear` turns into int8 ones."""
    return [name for name, module in model.named_modules()
            if isinstance(module, nn.Linear) and not (keep_ffn_output_fp32 and is_ffn_output(name))]


def quantize_linear(model: BiEncoder, layers: Iterable[str] | None = None) -> BiEncoder:
    """``model`` with the named ``nn.Linear`` layers (default `quantizable_layers`) dynamically quantised to int8.

    Weights per output channel (``per_channel_dynamic_qconfig``), activations per call. Returns a quantised copy
    (``model`` is left as it was), in eval mode, for CPU inference only (quantised layers have no gradients).
    """
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    layers = quantizable_layers(model) if layers is None else list(layers)
    if not layers:
        raise ValueError("quantize_linear: no nn.Linear layer to quantise")
    with warnings.catch_warnings():
        # torch >= 2.10 announces torch.ao.quantization's move to torchao; the eager API still works unchanged.
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quantize_per_tensor.*")
        quantized = quantize_dynamic(model, {name: per_channel_dynamic_qconfig for name in layers},
                                     dtype=torch.qint8, inplace=False)
    return quantized.eval()


def export_quantized(model_dir: str | Path, out_dir: str | Path, *, keep_ffn_output_fp32: bool = True) -> Path:
    """Quantise the bi-encoder at ``model_dir`` (a checkpoint directory or preset name) and write it to ``out_dir``.

    ``out_dir`` is replaced if it exists. Returns ``out_dir``; load it with `load_quantized`.
    """
    out_dir = Path(out_dir)
    model = BiEncoder.from_pretrained(model_dir)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    model.save(out_dir)  # config, tokenizer, pooling, Dense, metadata; the fp32 transformer weights go below
    for name in FP32_WEIGHT_FILES:
        (out_dir / name).unlink(missing_ok=True)
    layers = quantizable_layers(model, keep_ffn_output_fp32)
    fp32_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    quantized = quantize_linear(model, layers)
    torch.save(quantized.state_dict(), out_dir / QUANTIZED_WEIGHTS)

    metadata = read_json(out_dir / METADATA_FILE)
    metadata["quantization"] = {
        "method": "torch.ao.quantization.quantize_dynamic",
        "dtype": "qint8",
        "weights": "per output channel",
        "activations": "dynamic, per call",
        "layers": layers,
        "fp32_layers": [name for name, module in model.named_modules()
                        if isinstance(module, nn.Linear) and name not in set(layers)],
        "weights_file": QUANTIZED_WEIGHTS,
        "source": str(model.source),
        "fp32_param_bytes": fp32_bytes,
        "torch": torch.__version__,
    }
    write_json(out_dir / METADATA_FILE, metadata)
    return out_dir


def load_quantized(directory: str | Path) -> BiEncoder:
    """The int8 BiEncoder written by `export_quantized` (eval mode, CPU)."""
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    directory = Path(directory)
    metadata = read_metadata(directory)
    quantization: dict[str, Any] | None = metadata.get("quantization")
    weights = directory / QUANTIZED_WEIGHTS
    if not quantization or not weights.is_file():
        raise FileNotFoundError(f"{directory}: not an export_quantized directory (no {QUANTIZED_WEIGHTS} or no "
                                f"'quantization' in {METADATA_FILE})")
    layout = read_sentence_transformers_layout(directory)
    if layout is None:
        raise FileNotFoundError(f"{directory}: no modules.json; not an export_quantized directory")
    # The architecture only: every weight comes from the int8 state dict below.
    config = AutoConfig.from_pretrained(layout.transformer_dir, local_files_only=True)
    transformer = AutoModel.from_config(config)
    tokenizer = AutoTokenizer.from_pretrained(layout.transformer_dir, local_files_only=True)
    dense = layout.dense
    model = BiEncoder(
        transformer,
        tokenizer,
        pooling=layout.pooling,
        projection_dim=dense.out_features if dense is not None else None,
        projection_activation=dense.activation if dense is not None else "tanh",
        projection_bias=dense.bias if dense is not None else True,
        max_length=layout.max_seq_length,
        do_lower_case=layout.do_lower_case,
        normalize_in_sentence_transformers=layout.normalize,
        metadata=metadata,
        source=str(directory),
    )
    model = quantize_linear(model, quantization["layers"])
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*TypedStorage is deprecated.*")
        state = torch.load(weights, map_location="cpu", weights_only=True)
    model.load_state_dict(state)
    return model.eval()
