"""Encode speed and STS-B dev quality of a student exported to ONNX (fp32, dynamic int8) beside torch fp32 and int8.

For each model (``--models``, default the minilm-l6 preset, all-MiniLM-L6-v2 at 22M parameters, and minilm-l3,
derived from it offline): ``BiEncoder.save`` writes it to a temporary sentence-transformers directory and
``raydistill.models.export.export_onnx`` adds ``onnx/model.onnx`` and the int8 file for this CPU's preset. Four
encoders then run the same ``BiEncoder.encode`` (tokenizer, length-sorted batches, pooling, projection), so only the
transformer's runtime differs:

    torch_fp32   the torch model
    onnx_fp32    onnx/model.onnx in ONNX Runtime (``load_onnx``)
    onnx_int8    onnx/model_<weights>_<cpu>.onnx in ONNX Runtime
    torch_int8   torch's own dynamic int8 (``torch.ao.quantization.quantize_dynamic`` of the ``nn.Linear`` layers,
                 per-channel weights, the FFN output kept fp32; `torch_int8` below): the format raydistill shipped
                 before the ONNX files replaced it, which only the torch that wrote it can load; timed here so that
                 the replacement stays justified (docs/benchmarks.md, "Exports")

Speed: ``--sentences`` real STS sentences (bench/common.py ``sts_sentences``), batch ``--batch``, at ``--threads``
threads for both torch and ONNX Runtime (idle workers of both sleep rather than spin), ``--rounds`` rounds that go
through every encoder in turn (load from other processes falls on all of them). Two rates, medians over rounds:
sentences per wall second, what a user sees, and sentences per CPU second of this process (raydistill.cputime),
the work each runtime does, which other processes on shared cores disturb far less; ``vs_torch_fp32`` holds the
ratios of both, the numbers to compare across machines. Agreement: the cosine of each encoder's embeddings with torch fp32's over
the same sentences (min and mean). Quality: ``evaluate_sts`` on ``stsb_dev`` (Spearman x 100), skipped with
``--no-quality``.

    python bench/export_speed.py --write results/bench-export_speed.json
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from common import load_average, median, set_threads, sts_sentences, write_record  # first: environment before torch

import numpy as np

from raydistill.cputime import cpu_seconds


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def torch_int8(model):
    """A copy of ``model`` with its ``nn.Linear`` layers in torch dynamic int8 (weights per output channel,
    activations per call), except the FFN's second layer (``layer.N.output.dense``): its post-GELU inputs have the
    outliers one per-tensor activation scale handles worst (minilm-l3 STS-B dev 84.21 fp32, 83.74 with it in int8,
    84.10 without)."""
    import warnings

    import torch
    from torch import nn
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    layers = {name: per_channel_dynamic_qconfig for name, module in model.named_modules()
              if isinstance(module, nn.Linear)
              and not (name.endswith(".output.dense") and not name.endswith("attention.output.dense"))}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)  # torch.ao.quantization's move to torchao
        return quantize_dynamic(model, layers, dtype=torch.qint8, inplace=False).eval()


def encoders(preset: str, directory: Path, threads: int) -> tuple[dict, list[dict]]:
    from raydistill.models import BiEncoder
    from raydistill.models.export import export_onnx, load_onnx

    torch_fp32 = BiEncoder.from_pretrained(preset)
    torch_fp32.save(directory)
    rows = export_onnx(directory)
    models = {
        "torch_fp32": torch_fp32,
        "onnx_fp32": load_onnx(directory, rows[0]["file"], threads=threads),
        "onnx_int8": load_onnx(directory, rows[1]["file"], threads=threads),
        "torch_int8": torch_int8(torch_fp32),
    }
    return models, rows


def measure(preset: str, args, work: Path) -> dict:
    from raydistill.evaluation import evaluate_sts

    models, rows = encoders(preset, work / preset, args.threads)
    sentences = sts_sentences(args.sentences)
    embeddings = {name: model.encode(sentences, batch_size=args.batch) for name, model in models.items()}  # warm-up
    seconds: dict[str, list[float]] = {name: [] for name in models}
    cpu: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, model in models.items():
            started, cpu_started = time.perf_counter(), cpu_seconds()
            model.encode(sentences, batch_size=args.batch)
            seconds[name].append(time.perf_counter() - started)
            cpu[name].append(cpu_seconds() - cpu_started)
    rates = {name: round(args.sentences / median(values), 1) for name, values in seconds.items()}
    cpu_rates = {name: round(args.sentences / median(values), 1) for name, values in cpu.items()}
    result = {
        "preset": preset,
        "parameters": sum(p.numel() for p in models["torch_fp32"].parameters()),
        "max_length": models["torch_fp32"].max_length,
        "files": rows,
        "sentences_per_s": rates,
        "sentences_per_cpu_s": cpu_rates,
        "wall_s_per_round": {name: [round(value, 2) for value in values] for name, values in seconds.items()},
        "vs_torch_fp32": {
            "wall": {name: round(rates[name] / rates["torch_fp32"], 3) for name in models},
            "cpu": {name: round(cpu_rates[name] / cpu_rates["torch_fp32"], 3) for name in models},
        },
        "cosine_vs_torch_fp32": {
            name: {"min": round(float(c.min()), 5), "mean": round(float(c.mean()), 5)}
            for name in models for c in [cosines(embeddings["torch_fp32"], embeddings[name])]
        },
    }
    if args.quality:
        result["stsb_dev_spearman"] = {
            name: round(evaluate_sts(model, sets=["stsb_dev"], batch_size=args.batch, progress=False)["stsb_dev"], 2)
            for name, model in models.items()
        }
    print(f"{preset}: sentences/s {rates}; per CPU s {cpu_rates}; STS-B dev {result.get('stsb_dev_spearman')}")
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["minilm-l6", "minilm-l3"])
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-quality", dest="quality", action="store_false")
    parser.add_argument("--write", help="result file (results/bench-export_speed.json)")
    args = parser.parse_args(argv)
    set_threads(args.threads)
    load_before = load_average()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="export_speed-") as work:
        models = [measure(preset, args, Path(work)) for preset in args.models]
    first = models[0]
    record = {
        "bench": "export_speed",
        # Headlines, on the first model, per CPU second (the steadier rate on shared cores): what the ONNX files
        # buy over the torch model and over torch's int8.
        "onnx_fp32_vs_torch_fp32": first["vs_torch_fp32"]["cpu"]["onnx_fp32"],
        "onnx_int8_vs_torch_fp32": first["vs_torch_fp32"]["cpu"]["onnx_int8"],
        "onnx_int8_vs_torch_int8": round(first["sentences_per_cpu_s"]["onnx_int8"]
                                         / first["sentences_per_cpu_s"]["torch_int8"], 3),
        "batch": args.batch, "threads": args.threads, "rounds": args.rounds, "sentences": args.sentences,
        "source": "sts_sentences (STS12-16 + STS-B test, seed 0)",
        "models": models,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    return write_record(args.write, record, threads=args.threads, load_before=load_before)


if __name__ == "__main__":
    main()
