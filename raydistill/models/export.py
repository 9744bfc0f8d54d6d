"""ONNX export of a bi-encoder student, fp32 and dynamic int8, in sentence-transformers' ONNX layout.

``export_onnx(model_dir)`` takes a sentence-transformers directory (what ``BiEncoder.save`` writes) and adds to it

    onnx/model.onnx                   the transformer in fp32: inputs input_ids, attention_mask [, token_type_ids]
                                      (int64, dynamic batch and sequence axes), output last_hidden_state
    onnx/model_<weights>_<cpu>.onnx   the same graph dynamically quantised to int8 for this CPU (``quantize=True``)

and returns one row per file written: ``file`` (relative to ``model_dir``), ``bytes``, ``seconds`` and
``quantization`` (None for fp32, else the settings used and the CPU flags that chose them), ``versions`` (torch,
onnx, onnxscript, onnxruntime). ``report`` gets one line per file. Pooling, the Dense projection and Normalize stay
in the directory's sentence-transformers modules, which run them after the graph, as they do after the torch
transformer.

This is the layout sentence-transformers' own ONNX backend writes and reads (``SentenceTransformer(dir,
backend="onnx", model_kwargs={"file_name": "onnx/model_quint8_avx2.onnx"})``), the file names and the int8
settings its ``export_dynamic_quantized_onnx_model`` presets use: ``arm64``, ``avx2``, ``avx512``,
``avx512_vnni``, picked from the CPU's flags unless ``target`` names one (export on one machine for another).
That backend cannot run beside raydistill (its optimum-onnx requires transformers < 4.58, raydistill requires 5), so
the same two steps are called here directly: ``torch.onnx.export`` and ``onnxruntime.quantization.quantize_dynamic``
with the preset's settings (per-channel symmetric weights, uint8 asymmetric activations measured per call, full
range, attention products included). Where the backend installs (transformers 4.57), it loads these files and
encodes as ``load_onnx`` does (cosine 1.000000).

``load_onnx(model_dir, file_name)`` runs one of these files with ONNX Runtime behind ``BiEncoder``'s tokenizer,
pooling and projection, so an export can be checked and timed where sentence-transformers' backend is missing.
Needs the ``export`` extra (onnx, onnxruntime, onnxscript): ``pip install 'raydistill[export]'``."""

from __future__ import annotations

import contextlib
import logging
import platform
import time
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import torch
from torch import nn

from raydistill.models.bi_encoder import BiEncoder

ONNX_DIR = "onnx"
FP32_FILE = f"{ONNX_DIR}/model.onnx"
EXPORT_EXTRA = "pip install 'raydistill[export]'"
# sentence-transformers' dynamic-quantisation presets: weight type (activations are always uint8 when dynamic).
# avx2 keeps uint8 weights: without VNNI, u8 x s8 products can saturate VPMADDUBSW's int16 sums.
TARGETS = {"arm64": "QInt8", "avx2": "QUInt8", "avx512": "QInt8", "avx512_vnni": "QInt8"}
EXAMPLE_TEXTS = ["A man is playing a guitar.", "Two dogs run through the deep snow near a frozen lake."]


def _cpuinfo(*keys: str) -> str | None:
    """The value of the first /proc/cpuinfo line that starts with one of ``keys`` (None elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    return next((line.split(":", 1)[1] for line in text.splitlines() if line.startswith(keys)), None)


def cpu_flags() -> set[str]:
    """The CPU feature flags Linux lists in /proc/cpuinfo (empty elsewhere)."""
    return set((_cpuinfo("flags", "Features") or "").split())


def cpu_name() -> str | None:
    """The CPU's model name as /proc/cpuinfo gives it (None elsewhere): what a speed figure was measured on."""
    name = _cpuinfo("model name")
    return None if name is None else name.strip()


def quantization_target(flags: set[str] | None = None, machine: str | None = None) -> tuple[str, str]:
    """The int8 preset for this CPU and why: (name, the flags that decided)."""
    machine = (machine or platform.machine()).lower()
    if machine in ("aarch64", "arm64"):
        return "arm64", f"machine {machine}"
    flags = cpu_flags() if flags is None else flags
    if "avx512_vnni" in flags or "avx512vnni" in flags:
        return "avx512_vnni", "avx512_vnni"
    # ONNX Runtime's AVX-512 int8 kernels use the byte/word instructions (AVX512BW), not just AVX512F.
    if "avx512bw" in flags:
        return "avx512", "avx512bw, no avx512_vnni"
    if "avx2" in flags:
        return "avx2", "avx2, no avx512bw/avx512_vnni"
    return "avx2", f"no avx2/avx512 flag on {machine}: the generic uint8 preset"


def _require_onnxruntime():
    try:
        import onnxruntime
    except ImportError as error:
        raise ImportError(f"ONNX export needs onnxruntime, onnx and onnxscript: {EXPORT_EXTRA}") from error
    return onnxruntime


def _require_exporter() -> dict[str, str]:
    """The versions the files are written with. torch's exporter imports onnx and onnxscript only once it runs:
    a missing one fails here, before the model is traced."""
    try:
        import onnx
        import onnxscript
    except ImportError as error:
        raise ImportError(f"ONNX export needs onnxruntime, onnx and onnxscript: {EXPORT_EXTRA}") from error
    return {"torch": torch.__version__, "onnx": onnx.__version__, "onnxscript": onnxscript.__version__,
            "onnxruntime": _require_onnxruntime().__version__}


class _LastHiddenState(nn.Module):
    """The transformer with named tensor inputs and one tensor output, the graph's signature."""

    def __init__(self, transformer: nn.Module):
        super().__init__()
        self.transformer = transformer

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            inputs["token_type_ids"] = token_type_ids
        return self.transformer(**inputs).last_hidden_state


class _DropMessages(logging.Filter):
    def __init__(self, *fragments: str):
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(fragment in record.getMessage() for fragment in self.fragments)


@contextlib.contextmanager
def _quiet_exporter():
    """Without the lines the exporter and the quantiser print on every call that say nothing about this export:
    torchvision's operators it skips, a pytree deprecation, onnxruntime's advice to pre-process image models."""
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")
    hint = _DropMessages("pre-processing before quantization")
    level = registration.level
    registration.setLevel(logging.ERROR)
    logging.getLogger().addFilter(hint)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning, message=".*LeafSpec.*")
            yield
    finally:
        registration.setLevel(level)
        logging.getLogger().removeFilter(hint)


def _export_fp32(model: BiEncoder, path: Path) -> dict[str, Any]:
    features = model.tokenize(EXAMPLE_TEXTS)  # two lengths: batch and sequence must not specialise to 1
    names = [name for name in ("input_ids", "attention_mask", "token_type_ids") if name in features
             and name in model.input_names]
    dynamic = {0: torch.export.Dim.DYNAMIC, 1: torch.export.Dim.DYNAMIC}
    wrapper = _LastHiddenState(model.transformer).eval()
    with torch.no_grad(), _quiet_exporter():
        program = torch.onnx.export(wrapper, (), kwargs={name: features[name] for name in names}, input_names=names,
                                    output_names=["last_hidden_state"], dynamo=True, verbose=False,
                                    dynamic_shapes={name: dynamic for name in names})
    path.parent.mkdir(parents=True, exist_ok=True)
    # One file, as sentence-transformers loads it; a student is far below protobuf's 2 GB limit.
    program.save(str(path), external_data=False)
    return {"inputs": names, "opset": program.model.opset_imports.get("", None)}


def _quantize(source: Path, destination: Path, target: str, reason: str) -> dict[str, Any]:
    _require_onnxruntime()
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # MatMulConstBOnly=False: the attention's activation x activation products are quantised too, as optimum's
    # quantiser (behind sentence-transformers' presets) does; onnxruntime's own default keeps them fp32.
    settings = {"per_channel": True, "reduce_range": False,
                "extra_options": {"WeightSymmetric": True, "ActivationSymmetric": False, "MatMulConstBOnly": False}}
    with _quiet_exporter():
        quantize_dynamic(source, destination, weight_type=getattr(QuantType, TARGETS[target]), **settings)
    return {
        "target": target, "chosen_from": reason, "method": "onnxruntime.quantization.quantize_dynamic",
        "weights": TARGETS[target], "activations": "QUInt8, dynamic (scale per call)",
        "per_channel": settings["per_channel"], "reduce_range": settings["reduce_range"], "weight_symmetric": True,
        "activation_symmetric": False, "operators": "onnxruntime IntegerOps registry (default)",
        "matmul_const_b_only": False,
    }


def export_onnx(model_dir: str | Path, *, quantize: bool = True, target: str | None = None,
                report: Callable[[str], Any] | None = print) -> list[dict[str, Any]]:
    """Write ``onnx/model.onnx`` (and, with ``quantize``, its int8 variant) into ``model_dir``; see the module doc.

    ``target``: one of ``TARGETS`` to quantise for another CPU; None picks this one's (`quantization_target`).
    Existing files of the same names are replaced. ``report=None`` prints nothing."""
    directory = Path(model_dir)
    if not (directory / "modules.json").is_file():
        raise FileNotFoundError(f"{directory}: no modules.json; export_onnx takes a sentence-transformers directory "
                                "(BiEncoder.save writes one)")
    if target is not None and target not in TARGETS:
        raise ValueError(f"target must be one of {sorted(TARGETS)}, got {target!r}")
    versions = _require_exporter()
    say = report or (lambda line: None)
    rows = []

    started = time.perf_counter()
    fp32 = directory / FP32_FILE
    graph = _export_fp32(BiEncoder.from_pretrained(directory), fp32)
    rows.append({"file": FP32_FILE, "bytes": fp32.stat().st_size, "seconds": round(time.perf_counter() - started, 2),
                 "exporter": "torch.onnx.export (dynamo)", **graph, "quantization": None, "versions": versions})
    say(f"{FP32_FILE}: {fp32.stat().st_size / 2**20:.1f} MiB fp32, opset {graph['opset']}, {rows[-1]['seconds']:.1f} s")

    if quantize:
        name, reason = (target, "requested") if target else quantization_target()
        started = time.perf_counter()
        int8_file = f"{ONNX_DIR}/model_{TARGETS[name].lower()}_{name}.onnx"
        config = _quantize(fp32, directory / int8_file, name, reason)
        size = (directory / int8_file).stat().st_size
        rows.append({"file": int8_file, "bytes": size, "seconds": round(time.perf_counter() - started, 2),
                     "exporter": "torch.onnx.export (dynamo)", **graph, "quantization": config, "versions": versions})
        say(f"{int8_file}: {size / 2**20:.1f} MiB int8 for {name} ({reason}), {rows[-1]['seconds']:.1f} s")
    return rows


class OnnxTransformer(nn.Module):
    """An ONNX Runtime session in the place of ``BiEncoder.transformer``: same inputs, ``.last_hidden_state`` out."""

    def __init__(self, path: Path, config: Any, threads: int | None = None):
        super().__init__()
        ort = _require_onnxruntime()
        self.config = config
        options = ort.SessionOptions()
        # The torch thread count, so that both runtimes get the same cores.
        options.intra_op_num_threads = threads or torch.get_num_threads()
        options.inter_op_num_threads = 1
        # Idle workers sleep instead of spinning, as torch's OpenMP pool does here (OMP_WAIT_POLICY=PASSIVE): on
        # shared cores a spinning pool takes the time of the threads it waits for.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.graph_inputs = [graph_input.name for graph_input in self.session.get_inputs()]
        # BiEncoder.device reads its first parameter; a student without a projection has no other.
        self.anchor = nn.Parameter(torch.empty(0), requires_grad=False)

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        given = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        feeds = {name: given[name].cpu().numpy() for name in self.graph_inputs}
        (hidden,) = self.session.run(["last_hidden_state"], feeds)
        return SimpleNamespace(last_hidden_state=torch.from_numpy(hidden))


def load_onnx(model_dir: str | Path, file_name: str = FP32_FILE, threads: int | None = None) -> BiEncoder:
    """The bi-encoder at ``model_dir`` with its transformer run from ``file_name`` by ONNX Runtime (CPU)."""
    directory = Path(model_dir)
    path = directory / file_name
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such ONNX file; write it with export_onnx({str(directory)!r})")
    model = BiEncoder.from_pretrained(directory)
    model.transformer = OnnxTransformer(path, model.transformer.config, threads)
    return model.eval()
