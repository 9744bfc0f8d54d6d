"""Encode speed and STS-B dev quality of a student exported to ONNX (fp32, dynamic int8) beside torch fp32 and int8,
through raydistill's own runner and through sentence-transformers' ONNX backend, the pipeline a user loads it with.

For each model (``--models``, default the minilm-l6 preset, all-MiniLM-L6-v2 at 22M parameters, and minilm-l3,
derived from it offline): ``BiEncoder.save`` writes it to a temporary sentence-transformers directory and
``raydistill.models.export.export_onnx`` adds ``onnx/model.onnx`` and the int8 file for this CPU's preset. The same
files are then timed through two pipelines, each against its own torch model:

raydistill's runner (``pipelines.raydistill``, and each model's top-level keys): what ``raydistill distill``'s
package table times and ``raydistill serve`` runs. Four encoders run the same ``BiEncoder.encode`` (tokenizer,
length-sorted batches, pooling, projection in Python), so only the transformer's runtime differs:

    torch_fp32   the torch model
    onnx_fp32    onnx/model.onnx in ONNX Runtime (``load_onnx``)
    onnx_int8    onnx/model_<weights>_<cpu>.onnx in ONNX Runtime
    torch_int8   torch's own dynamic int8 (``torch.ao.quantization.quantize_dynamic`` of the ``nn.Linear`` layers,
                 per-channel weights, the FFN output kept fp32; `torch_int8` below): the format raydistill shipped
                 before the ONNX files replaced it, which only the torch that wrote it can load; timed here so that
                 the replacement stays justified (docs/benchmarks.md, "Exports")

sentence-transformers' ONNX backend (``pipelines.sentence_transformers``): ``SentenceTransformer(dir,
backend="onnx", model_kwargs={"file_name": FILE})``, optimum's ``ORTModelForFeatureExtraction`` behind
sentence-transformers' own tokenization and modules, against ``SentenceTransformer(dir)`` (backend torch) in the
same process. That backend needs optimum-onnx, which requires transformers < 4.58 where raydistill runs 5, so it runs
in a side environment (bench/common.py ``side_environment``, ``ST_ONNX_PINS`` in front of the project's torch,
onnxruntime and numpy), in a subprocess fed the same sentences, batch, thread count and rounds; its sessions get the
runner's settings (``--threads`` intra-op threads, one inter-op thread, no spinning), so only the pipeline differs.
``--no-sentence-transformers`` leaves this pipeline out (no side environment, no network).

Speed: ``--sentences`` real STS sentences (bench/common.py ``sts_sentences``), batch ``--batch``, at ``--threads``
threads for both torch and ONNX Runtime (idle workers of both sleep rather than spin), ``--rounds`` rounds that go
through every encoder of a pipeline in turn (load from other processes falls on all of them). Two rates, medians over
rounds: sentences per wall second, what a user sees, and sentences per CPU second of the timing process
(raydistill.cputime; ``time.process_time`` in the side process, the same count), the work each runtime does, which
other processes on shared cores disturb far less; each pipeline's ``vs_torch`` (``vs_torch_fp32`` at a model's top
level) holds the ratios of both to that pipeline's own torch model, the numbers to compare across machines.
``faster_here``: per pipeline and export, whether that ratio per CPU second is above 1.0 on this CPU; an export that
is not is "not faster here" (a package does not serve it by default: raydistill.ship.package). ``instruction_set``
says what the CPU has (AVX2, AVX-512, VNNI, bf16, the int8 preset; raydistill.ship.package ``cpu_instruction_set``):
int8's gain depends on it. Agreement: the cosine of each encoder's embeddings with raydistill's torch fp32 over the
same sentences (min and mean), for both pipelines. Quality: ``evaluate_sts`` on ``stsb_dev`` (Spearman x 100)
through raydistill's runner, skipped with ``--no-quality`` (sentence-transformers runs the same files: the cosines
show they agree).

    python bench/export_speed.py --write results/bench-export_speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from common import (load_average, median, set_threads, side_environment,  # first: environment before torch
                    sts_sentences, write_record)

import numpy as np

from raydistill.cputime import cpu_seconds

# sentence-transformers' ONNX backend beside the project's packages: what `pip install --dry-run` resolves for
# optimum-onnx[onnxruntime]==0.1.0 (optimum ~= 2.1.0, transformers < 4.58), a sentence-transformers that accepts that
# transformers (the project's 6.x requires >= 5), and the project's own datasets (which sentence-transformers imports
# when it is there) held to the huggingface_hub < 1.0 that transformers 4.57 requires, with what that datasets needs.
ST_ONNX_PINS = ("optimum-onnx==0.1.0", "optimum==2.1.0", "transformers==4.57.6", "tokenizers==0.22.2",
                "huggingface_hub==0.36.2", "sentence-transformers==5.7.0", "datasets==5.0.1", "fsspec==2026.6.0",
                "httpx==0.29.0", "httpcore==1.0.9")
ST_ONNX_ENV = "st-onnx"  # under common.SIDE_ENVIRONMENTS

# Run by the side environment's Python: argv[1] is a JSON job (`sentence_transformers_encode`). Prints one line
# "RESULT {json}" and saves each backend's vectors of the sentences as <out>/<name>.npy.
_ST_SCRIPT = """
import json, os, sys, time
job = json.load(open(sys.argv[1]))
import numpy as np, torch
torch.set_num_threads(job["threads"])
torch.set_num_interop_threads(1)
import onnxruntime, optimum, optimum.onnxruntime, sentence_transformers, tokenizers, transformers
from importlib.metadata import version
from sentence_transformers import SentenceTransformer

def session_options():
    # raydistill's runner's settings (raydistill.models.export.OnnxTransformer): only the pipeline differs.
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = job["threads"]
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options

models, runs, load_s = {}, {}, {}
for name, file in job["backends"].items():
    started = time.perf_counter()
    if file is None:
        models[name] = SentenceTransformer(job["directory"], device="cpu")
    else:
        # export=False: a missing file is an error, not a fresh export of the torch weights by optimum.
        models[name] = SentenceTransformer(job["directory"], backend="onnx", device="cpu", model_kwargs={
            "file_name": file, "export": False, "provider": "CPUExecutionProvider",
            "session_options": session_options()})
    load_s[name] = round(time.perf_counter() - started, 2)
    transformer = models[name][0].auto_model
    runs[name] = {"class": type(transformer).__name__,
                  "file": str(transformer.path) if hasattr(transformer, "path") else None}
sentences = job["sentences"]

def encode(model):
    return model.encode(sentences, batch_size=job["batch"], convert_to_numpy=True, show_progress_bar=False)

for name, model in models.items():  # the warm-up pass; its vectors are the ones the caller checks
    np.save(os.path.join(job["out"], name + ".npy"), encode(model))
wall = {name: [] for name in models}
cpu = {name: [] for name in models}
for _ in range(job["rounds"]):
    for name, model in models.items():
        started, cpu_started = time.perf_counter(), time.process_time()
        encode(model)
        wall[name].append(time.perf_counter() - started)
        cpu[name].append(time.process_time() - cpu_started)
print("RESULT " + json.dumps({
    "wall_s": wall, "cpu_s": cpu, "load_s": load_s, "runs": runs, "python": sys.executable,
    "versions": {name: version(name) for name in ("sentence-transformers", "optimum", "optimum-onnx", "transformers",
                                                  "tokenizers", "huggingface_hub", "torch", "onnxruntime")}}))
"""


def sentence_transformers_encode(python: str | os.PathLike, directory: str | os.PathLike,
                                 backends: dict[str, str | None], sentences: list[str], *, batch: int, threads: int,
                                 rounds: int, work: str | os.PathLike) -> dict:
    """Encode ``sentences`` with sentence-transformers run by ``python`` (the side environment), per backend
    (``{name: None}`` for the torch model, ``{name: "onnx/<file>"}`` for ONNX Runtime through its ONNX backend): after
    one untimed pass, ``rounds`` interleaved timed ones. Returns ``embeddings`` ({name: [N, D] array} of the untimed
    pass), ``wall_s`` and ``cpu_s`` ({name: seconds per round}), ``load_s``, ``runs`` ({name: {"class", "file"}}:
    what ran each, an ORTModel and the ONNX file its session read for an ONNX backend), ``versions`` and ``python``.
    Raises RuntimeError with the side process's error when any backend fails to load or encode, a missing file
    included (sentence-transformers would otherwise export the torch weights itself)."""
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    job = work / "job.json"
    job.write_text(json.dumps({"directory": str(directory), "backends": backends, "sentences": list(sentences),
                               "batch": batch, "threads": threads, "rounds": rounds, "out": str(work)}))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TQDM_DISABLE": "1"}
    done = subprocess.run([str(python), "-c", _ST_SCRIPT, str(job)], env=env, cwd=work, capture_output=True,
                          text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"sentence-transformers with {python} failed (exit {done.returncode}):\n"
                           f"{done.stderr[-4000:]}")
    result = json.loads(lines[-1].removeprefix("RESULT "))
    result["embeddings"] = {name: np.load(work / f"{name}.npy") for name in backends}
    return result


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


def faster_here(cpu_ratios: dict[str, float]) -> dict[str, bool]:
    """Per ONNX export: more sentences per CPU second than its pipeline's torch model on this CPU."""
    return {name: ratio > 1.0 for name, ratio in cpu_ratios.items() if name.startswith("onnx_")}


def sentence_transformers_rows(python: Path, directory: Path, rows: list[dict], sentences: list[str], args,
                               reference: np.ndarray) -> dict:
    """The sentence-transformers pipeline's record of one model (module doc), its vectors checked against
    ``reference`` (raydistill's torch fp32 of the same sentences)."""
    backends = {"torch": None, "onnx_fp32": rows[0]["file"], "onnx_int8": rows[1]["file"]}
    run = sentence_transformers_encode(python, directory, backends, sentences, batch=args.batch,
                                       threads=args.threads, rounds=args.rounds,
                                       work=directory.parent / f"{directory.name}-sentence-transformers")
    rates = {name: round(len(sentences) / median(values), 1) for name, values in run["wall_s"].items()}
    cpu_rates = {name: round(len(sentences) / median(values), 1) for name, values in run["cpu_s"].items()}
    cpu_ratios = {name: round(cpu_rates[name] / cpu_rates["torch"], 3) for name in backends}
    return {
        "what": "SentenceTransformer(dir, backend='onnx', model_kwargs={'file_name': FILE}) against "
                "SentenceTransformer(dir) (torch), in the side environment",
        "files": backends,
        "runs": run["runs"],
        "versions": run["versions"],
        "pins": list(ST_ONNX_PINS),
        "session": {"intra_op_threads": args.threads, "inter_op_threads": 1, "spinning": False},
        "load_s": run["load_s"],
        "sentences_per_s": rates,
        "sentences_per_cpu_s": cpu_rates,
        "wall_s_per_round": {name: [round(value, 2) for value in values] for name, values in run["wall_s"].items()},
        "vs_torch": {"wall": {name: round(rates[name] / rates["torch"], 3) for name in backends}, "cpu": cpu_ratios},
        "faster_here": faster_here(cpu_ratios),
        "cosine_vs_torch_fp32": {
            name: {"min": round(float(c.min()), 5), "mean": round(float(c.mean()), 5)}
            for name in backends for c in [cosines(reference, run["embeddings"][name])]
        },
    }


def measure(preset: str, args, work: Path, st_python: Path | None) -> dict:
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
    result["pipelines"] = {"raydistill": {
        "what": "raydistill's runner: BiEncoder.encode, the transformer in torch or in ONNX Runtime "
                "(raydistill.models.export.load_onnx), tokenizer, pooling and projection in Python",
        "sentences_per_s": rates, "sentences_per_cpu_s": cpu_rates,
        "vs_torch": result["vs_torch_fp32"], "faster_here": faster_here(result["vs_torch_fp32"]["cpu"])}}
    if args.quality:
        result["stsb_dev_spearman"] = {
            name: round(evaluate_sts(model, sets=["stsb_dev"], batch_size=args.batch, progress=False)["stsb_dev"], 2)
            for name, model in models.items()
        }
    print(f"{preset}, raydistill's runner: sentences/s {rates}; per CPU s {cpu_rates}; "
          f"STS-B dev {result.get('stsb_dev_spearman')}", flush=True)
    if st_python is not None:
        st = sentence_transformers_rows(st_python, work / preset, rows, sentences, args, embeddings["torch_fp32"])
        result["pipelines"]["sentence_transformers"] = st
        print(f"{preset}, sentence-transformers: sentences/s {st['sentences_per_s']}; per CPU s "
              f"{st['sentences_per_cpu_s']}", flush=True)
    for pipeline, record in result["pipelines"].items():
        print(f"  {pipeline}: per CPU s vs its torch " + ", ".join(
            f"{name} {record['vs_torch']['cpu'][name]:.2f}x" + ("" if faster else " (not faster here)")
            for name, faster in record["faster_here"].items()), flush=True)
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["minilm-l6", "minilm-l3"])
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-sentence-transformers", dest="sentence_transformers", action="store_false",
                        help="time raydistill's runner only, without sentence-transformers' ONNX backend (whose side "
                             "environment pip builds on first use)")
    parser.add_argument("--no-quality", dest="quality", action="store_false")
    parser.add_argument("--write", help="result file (results/bench-export_speed.json)")
    args = parser.parse_args(argv)
    from raydistill.ship.package import cpu_instruction_set

    set_threads(args.threads)
    st_python = side_environment(ST_ONNX_ENV, ST_ONNX_PINS) if args.sentence_transformers else None
    instruction_set = cpu_instruction_set()
    print(f"CPU instruction set: {instruction_set['summary']} (int8 preset {instruction_set['int8_preset']})",
          flush=True)
    load_before = load_average()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="export_speed-") as work:
        models = [measure(preset, args, Path(work), st_python) for preset in args.models]
    first = models[0]
    record = {
        "bench": "export_speed",
        # Headlines, on the first model, per CPU second (the steadier rate on shared cores): what the ONNX files
        # buy over the torch model and over torch's int8.
        "onnx_fp32_vs_torch_fp32": first["vs_torch_fp32"]["cpu"]["onnx_fp32"],
        "onnx_int8_vs_torch_fp32": first["vs_torch_fp32"]["cpu"]["onnx_int8"],
        "onnx_int8_vs_torch_int8": round(first["sentences_per_cpu_s"]["onnx_int8"]
                                         / first["sentences_per_cpu_s"]["torch_int8"], 3),
        # The same two ratios through sentence-transformers' ONNX backend, against its own torch backend.
        **({"st_onnx_fp32_vs_st_torch": first["pipelines"]["sentence_transformers"]["vs_torch"]["cpu"]["onnx_fp32"],
            "st_onnx_int8_vs_st_torch": first["pipelines"]["sentence_transformers"]["vs_torch"]["cpu"]["onnx_int8"]}
           if "sentence_transformers" in first["pipelines"] else {}),
        "faster_here": {model["preset"]: {pipeline: timed["faster_here"]
                                          for pipeline, timed in model["pipelines"].items()} for model in models},
        "instruction_set": instruction_set,
        "pipelines": list(models[0]["pipelines"]),
        "batch": args.batch, "threads": args.threads, "rounds": args.rounds, "sentences": args.sentences,
        "source": "sts_sentences (STS12-16 + STS-B test, seed 0)",
        "models": models,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    return write_record(args.write, record, threads=args.threads, load_before=load_before)


if __name__ == "__main__":
    main()
