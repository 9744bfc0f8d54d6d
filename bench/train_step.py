"""A raydistill ConGen training step against sentence-transformers' own distillation, and encode speed of the students.

Training (per student, ``minilm-l3`` and ``bert-mini``; teacher ``mpnet-base``, 768-d):

* raydistill: ``DistillLearner.train_step`` of the ConGen job (congen.yaml with batch 128 and K = 65536),
  fed the numpy batches the job's pipeline yields (``ArrayData.iter_batches``: the same contract as
  ``TrainingData``), student + Dense(→768, tanh), AdamW, grad clip, LR schedule, the queue loss. Each step encodes two
  views per row (the caption and another caption of its image), so a step is 2 × 128 student sentences.
* sentence-transformers: ``SentenceTransformerTrainer`` + ``losses.MSELoss`` (its distillation recipe,
  ``examples/.../model_distillation``): the same student modules (Transformer with the same max_seq_length, mean
  Pooling, Dense(→768, tanh)), batch 128 of the same control captions, labels = the same teacher vectors, same
  lr, warm-up, weight decay, grad clip, same process and torch threads. One view: 128 student sentences per step.

Both use teacher vectors PRECOMPUTED once: the real mpnet-base embeddings of the control captions, read from (or
added to) the job's Parquet teacher cache (``EmbeddingCache`` under ``$RAYDISTILL_HOME/embeddings``), so a rerun
does no teacher pass; ``--teacher-vectors random`` uses random unit vectors instead (same cost for both sides).

Precision (``--precision``, default bf16): raydistill's ``train.precision``. With bf16 the student's forward and
backward run under bfloat16 autocast and ConGen's products against the queue in bf16 (softmaxes, weights and queue
in fp32), which this CPU's AVX512-BF16 runs 2-4x faster than fp32;
then raydistill is also timed in fp32 and sentence-transformers in both fp32 and bf16 (its Trainer's ``bf16=True``,
CPU autocast), and ``train_step_vs_st`` is taken against sentence-transformers' FASTER precision, never against a
slower baseline than its users can have. The headline limit fraction is the one against the limit of the precision
the step runs in: ``train_step_bf16_limit_fraction``, the rate against the bf16 matmul peak measured in the run
(target: it does not fall); ``train_step_limit_fraction`` is the same rate against the fp32 matmul limit.

Ablations (``--ablation``, default the headline student): the same raydistill step without length-bucketed
sub-batches (``bucketing_speedup``) and without the CPU learner's model changes (``resources.learner.cpu_speedups:
false``: torch's dropout, a new dense embedding gradient every step; ``cpu_speedups_speedup``).

Rates are measured from the end of one step to the end of the next (data, tokenising, forward, loss, backward,
optimiser, schedule all included), after warm-up steps; medians. Every trainer runs in a fresh process of its own
(``--worker``; sharing one process let one library's freed memory slow the other), and the trainers alternate for
``--rounds`` rounds so that load from other processes falls on all of them. ``sentences`` = student sentences
through forward and backward (what the machine limit of bench/limit.py is per); rows = training examples.

    train_step_vs_st          raydistill sentences/s ÷ sentence-transformers sentences/s   (minilm-l3; target ≥ 1.3)
    train_step_bf16_limit_fraction  raydistill sentences/s ÷ the bf16 limit's sentences/s at the real token count
    train_step_limit_fraction       the same against the fp32 limit

The ConGen loss at K = 65536, D = 768 multiplies 3·B query rows by the K×D queue forward and 2·B backward, about
64 GFLOP per step on top of the encoder; its share is reported (``loss_gemm_s``) and the limit fraction is also
given with those FLOPs counted as necessary work (``limit_fraction_with_loss``).

Inference (``--inference``, default on): encode throughput, batch 128, real STS sentences (STS12-16 + STS-B test,
a seeded sample), fp32, torch threads as above:

    minilm-l3, raydistill    BiEncoder.encode (length-sorted batches, inference_mode)
    minilm-l6 / mpnet-base   sentence-transformers' SentenceTransformer.encode, as its users call it
                             (it sorts by length too), and "plain": batches in input order, padded to their longest

    inference_vs_minilm_l6 / inference_vs_mpnet = minilm-l3 (raydistill) ÷ the sentence-transformers encode rate
    (the "_plain" variants: ÷ the input-order rate). The speed of an architecture does not depend on its weights:
    the minilm-l3 preset stands in for the distilled minilm-l3 student.

    python bench/train_step.py                                     # prints a table and the JSON
    python bench/train_step.py --write results/bench-train_step.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common  # noqa: F401  (environment before torch)

import numpy as np
import torch

from common import RESULTS, ROOT, load_average, median, read_record, set_threads, sts_sentences, write_record
from limit import encoder_shape, measure_limit, token_counts

TEACHER = "mpnet-base"
from raydistill.shipped import shipped_config  # noqa: E402

CONFIG = shipped_config("congen")


# ----------------------------------------------------------------------------------------------------------------
# Data and teacher vectors


def congen_config(student: str, args, run_dir: Path, bucket_tokens: int | None = None, precision: str = "fp32",
                  more: tuple[str, ...] = ()):
    """congen.yaml at the bench's sizes (batch, K, corpus slice, train.precision), tracking off; ``more``:
    further ``--set`` overrides."""
    from raydistill.config.job import JobConfig
    from raydistill.runtime.engine.preflight import preflight

    overrides = [f"student={student}", f"teacher={TEACHER}", f"train.batch_size={args.batch}",
                 f"loss.queue_size={args.queue_size}", f"data.max_sentences={args.batch * (args.warmup + args.steps)}",
                 f"data.max_length={args.max_length}", "tracking.enabled=false", f"run_dir={run_dir}",
                 f"resources.learner.threads={args.threads}", f"resources.teacher.threads={args.threads}",
                 f"train.precision={precision}"]
    if bucket_tokens is not None:
        overrides.append(f"extra.bucket_tokens={bucket_tokens}")
    overrides.extend(more)
    return preflight(JobConfig.from_yaml(CONFIG, overrides=overrides))


def training_columns(cfg) -> dict[str, np.ndarray]:
    """The job's rows (control caption, another caption of the image) for ``cfg.data``, as numpy columns."""
    from raydistill.runtime.teachers.pipeline import load_training_texts

    rows = load_training_texts(cfg.data, cfg.seed)
    return {"idx": np.arange(len(rows)),
            **{f"text_{view}": np.array([r[f"text_{view}"] for r in rows], dtype=object) for view in cfg.data.views}}


def teacher_vectors(cfg, texts: list[str], mode: str) -> tuple[np.ndarray, dict]:
    """Teacher vectors [N, 768] of ``texts``: the job's teacher cache, encoding only what it lacks; or random."""
    if mode == "random":
        vectors = np.random.default_rng(0).standard_normal((len(texts), 768)).astype(np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True), {"source": "random unit vectors"}
    from raydistill.runtime.teachers.embedding_cache import EmbeddingCache
    from raydistill.runtime.teachers.teacher import TeacherEncoder, TeacherSpec

    spec = TeacherSpec.from_config(cfg)
    cache = EmbeddingCache(cfg.resolved_cache_dir(), spec.identity(), description=spec.describe())
    hits, vectors = cache.lookup(texts)
    started = time.perf_counter()
    missing = [texts[i] for i in np.flatnonzero(~hits)]
    if missing:
        print(f"teacher {spec.model}: encoding {len(missing)} captions once (cached for later runs)", flush=True)
        encoded = TeacherEncoder(**spec.encoder_kwargs()).encode(missing)
        cache.append(missing, encoded, view="control")
        if vectors.shape[1] == 0:
            vectors = np.zeros((len(texts), encoded.shape[1]), dtype=np.float32)
        vectors[~hits] = encoded
    return vectors, {"source": f"{spec.model} (teacher cache {cache.dir})", "cache_hits": int(hits.sum()),
                     "teacher_encoded": len(missing), "teacher_pass_s": round(time.perf_counter() - started, 1)}


# ----------------------------------------------------------------------------------------------------------------
# The two trainers


class RaydistillTrainer:
    """The ConGen job's learner, stepped over the bench batches; ``run(n)`` returns n step times (seconds)."""

    def __init__(self, cfg, columns: dict[str, np.ndarray], threads: int, shared_actors: dict[str, list] | None = None):
        from raydistill.runtime.engine.learner import DistillLearner
        from raydistill.data.arrays import ArrayData

        self.data = ArrayData(columns, seed=cfg.seed)
        self.batch = cfg.train.batch_size
        self.learner = DistillLearner(cfg, total_steps=10_000, teacher_dim=columns["teacher_control"].shape[1],
                                      threads=threads, shared_actors=shared_actors)
        self.epoch = 0

    def run(self, steps: int) -> list[float]:
        seconds: list[float] = []
        while len(seconds) < steps:
            last = time.perf_counter()
            for batch in self.data.iter_batches(self.epoch, self.batch):
                self.learner.train_step(batch)
                now = time.perf_counter()
                seconds.append(now - last)
                last = now
                if len(seconds) == steps:
                    break
            self.epoch += 1
        return seconds


class SentenceTransformersTrainer:
    """sentence-transformers' trainer with MSELoss to the teacher vectors; each ``run(n)`` is one ``train()`` of
    n steps (the model carries on from the previous run; its optimiser and schedule start again)."""

    def __init__(self, student: str, texts: list[str], vectors: np.ndarray, cfg, out_dir: Path, bf16: bool = False):
        from datasets import Dataset
        from sentence_transformers import SentenceTransformer, models

        from raydistill.models import resolve_model
        from raydistill.models.bi_encoder import transformer_directory

        word = models.Transformer(str(transformer_directory(Path(resolve_model(student)))),
                                  max_seq_length=cfg.data.max_length)
        width = word.get_word_embedding_dimension()
        modules = [word, models.Pooling(width, pooling_mode="mean")]
        if width != vectors.shape[1]:  # the same Dense(→ teacher width, tanh) the ConGen student carries
            modules.append(models.Dense(width, vectors.shape[1], activation_function=torch.nn.Tanh()))
        self.model = SentenceTransformer(modules=modules, device="cpu")
        self.dataset = Dataset.from_dict({"sentence": list(texts), "label": [v.tolist() for v in vectors]})
        self.cfg, self.out_dir, self.bf16 = cfg, out_dir, bf16

    def run(self, steps: int) -> list[float]:
        from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments, losses
        from transformers import TrainerCallback

        ends: list[float] = []

        class StepClock(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                ends.append(time.perf_counter())

            def on_step_end(self, args, state, control, **kwargs):
                ends.append(time.perf_counter())

        train = self.cfg.train
        arguments = SentenceTransformerTrainingArguments(
            output_dir=str(self.out_dir), per_device_train_batch_size=train.batch_size, max_steps=steps,
            # warmup_steps as a float is a ratio of the steps (transformers 5; warmup_ratio is deprecated)
            learning_rate=train.lr, warmup_steps=float(train.warmup_ratio), weight_decay=train.weight_decay,
            max_grad_norm=train.grad_clip, seed=self.cfg.seed, dataloader_drop_last=True, report_to="none",
            save_strategy="no", logging_strategy="no", eval_strategy="no", disable_tqdm=True, use_cpu=True,
            bf16=self.bf16)  # bf16: the Trainer's CPU autocast, as a user who asks for mixed precision gets
        trainer = SentenceTransformerTrainer(model=self.model, args=arguments, train_dataset=self.dataset,
                                             loss=losses.MSELoss(self.model), callbacks=[StepClock()])
        trainer.train()
        return list(np.diff(ends))


def loss_gemm_seconds(batch: int, queue_size: int, dim: int, repeats: int = 3) -> float:
    """The ConGen loss's unavoidable products alone: [3B, D]·[D, K] forward and [2B, K]·[K, D] backward."""
    from common import timed

    generator = torch.Generator().manual_seed(0)
    queue = torch.randn(queue_size, dim, generator=generator)
    queries = torch.randn(3 * batch, dim, generator=generator)
    grads = torch.randn(2 * batch, queue_size, generator=generator)
    return median(timed(lambda: (queries @ queue.T, grads @ queue), repeats=repeats, warmup=1))


def trainer_names(student: str, args) -> list[str]:
    """The trainers timed for ``student``: both libraries, at both precisions with bf16, plus the ablations."""
    names = ["raydistill", "sentence_transformers"]
    if args.precision == "bf16":  # both libraries at both precisions: the ratio is taken against ST's faster one
        names += ["raydistill_fp32", "sentence_transformers_bf16"]
    if student in args.ablation:
        names += ["raydistill_unbucketed", "raydistill_no_cpu_speedups"]
    return names


def make_trainer(name: str, student: str, args, columns: dict[str, np.ndarray], work: Path):
    """One of ``trainer_names``, over the bench's rows and teacher vectors (``columns["teacher_control"]``)."""
    precision = "fp32" if name == "raydistill_fp32" else args.precision
    if name.startswith("raydistill"):
        more = ("resources.learner.cpu_speedups=false",) if name == "raydistill_no_cpu_speedups" else ()
        cfg = congen_config(student, args, work / f"run-{name}", precision=precision,
                            bucket_tokens=0 if name == "raydistill_unbucketed" else None, more=more)
        return RaydistillTrainer(cfg, columns, args.threads)
    cfg = congen_config(student, args, work / f"run-{name}", precision=precision)
    return SentenceTransformersTrainer(student, list(columns["text_control"]), columns["teacher_control"], cfg,
                                       work / name, bf16=name.endswith("_bf16"))


def run_worker(args) -> dict:
    """``--worker NAME``: one trainer in this fresh process, ``--warmup`` + ``--steps`` steps; step seconds."""
    work = Path(tempfile.mkdtemp(prefix="bench-train-step-"))
    try:
        cfg = congen_config(args.worker_student, args, work / "run", precision=args.precision)
        columns = training_columns(cfg)
        columns["teacher_control"], _ = teacher_vectors(cfg, list(columns["text_control"]), args.teacher_vectors)
        trainer = make_trainer(args.worker, args.worker_student, args, columns, work)
        return {"step_s": trainer.run(args.warmup + args.steps)[args.warmup:]}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure_training(student: str, args, teacher_mode: str, limit_gflops: float, work: Path) -> dict:
    """Every trainer of ``student`` in a FRESH process per round (``--worker``), the trainers alternating round
    by round. One process for all of them measured wrong: after the raydistill trainers' 100 MB tensors had come
    and gone, sentence-transformers' bf16 step took 0.63 s (f177d0d's file, whose 1.04x was against it) where it
    takes 0.38 s in a process of its own (results/bench-train_step.json)."""
    cfg = congen_config(student, args, work / f"run-{student}", precision=args.precision)
    columns = training_columns(cfg)
    _, teacher_info = teacher_vectors(cfg, list(columns["text_control"]), teacher_mode)  # fills the cache once
    trainers = trainer_names(student, args)
    step_seconds: dict[str, list[float]] = {name: [] for name in trainers}
    passed = [f"--{key.replace('_', '-')}={getattr(args, key)}" for key in
              ("batch", "queue_size", "max_length", "threads", "steps", "warmup", "teacher_vectors", "precision")]
    for round_index in range(args.rounds):
        for name in trainers:
            done = subprocess.run([sys.executable, __file__, "--worker", name, "--worker-student", student, *passed],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"{student} {name} worker failed:\n{done.stderr[-4000:]}")
            seconds = json.loads(done.stdout.strip().splitlines()[-1])["step_s"]
            step_seconds[name].extend(seconds)
            print(f"  [{student}] round {round_index + 1} {name}: median step {median(seconds):.2f} s "
                  f"(load {load_average()})", flush=True)

    sentences_per_step = {name: (2 if name.startswith("raydistill") else 1) * args.batch for name in trainers}
    rates = {name: {"step_s": round(median(s), 3), "rows_per_s": round(args.batch / median(s), 2),
                    "sentences_per_s": round(sentences_per_step[name] / median(s), 2),
                    "step_s_all": [round(x, 3) for x in s]}
             for name, s in step_seconds.items()}
    texts = list(columns["text_control"]) + list(columns["text_generalize"])
    counts = token_counts(student, texts, args.max_length)
    shape = encoder_shape(student)
    projection = 768 if shape.hidden != 768 else 0
    sentence_flops = shape.mean_sentence_flops(counts, projection)
    limit_rate = limit_gflops * 1e9 / sentence_flops
    loss_flops = 2.0 * 5 * args.batch * args.queue_size * 768  # 3B + 2B query rows against the K x D queue
    step_flops = 2 * args.batch * sentence_flops + loss_flops
    ours = rates["raydistill"]
    # sentence-transformers at its faster precision on this machine (fp32, or bf16 autocast where it was timed)
    theirs_name = max((name for name in rates if name.startswith("sentence_transformers")),
                      key=lambda name: rates[name]["sentences_per_s"])
    theirs = rates[theirs_name]
    out = {
        "precision": args.precision,
        "st_compared": theirs_name,
        "rates": rates,
        "teacher": teacher_info,
        "mean_tokens": round(float(np.mean(counts)), 2),
        "train_gflop_per_sentence": round(sentence_flops / 1e9, 4),
        "limit_sentences_per_s": round(limit_rate, 1),
        "loss_gflop_per_step": round(loss_flops / 1e9, 1),
        "loss_gemm_s": round(loss_gemm_seconds(args.batch, args.queue_size, 768), 3),
        "train_step_vs_st": round(ours["sentences_per_s"] / theirs["sentences_per_s"], 3),
        "train_step_rows_vs_st": round(ours["rows_per_s"] / theirs["rows_per_s"], 3),
        **({"train_step_vs_st_fp32_both": round(rates["raydistill_fp32"]["sentences_per_s"]
                                                / rates["sentence_transformers"]["sentences_per_s"], 3),
            "train_step_vs_st_bf16_both": round(ours["sentences_per_s"]
                                                / rates["sentence_transformers_bf16"]["sentences_per_s"], 3),
            "bf16_speedup": round(rates["raydistill_fp32"]["step_s"] / ours["step_s"], 3)}
           if "raydistill_fp32" in rates else {}),
        "train_step_limit_fraction": round(ours["sentences_per_s"] / limit_rate, 3),
        "st_limit_fraction": round(theirs["sentences_per_s"] / limit_rate, 3),
        "limit_fraction_with_loss": round(step_flops / (limit_gflops * 1e9) / ours["step_s"], 3),
    }
    if "raydistill_unbucketed" in rates:
        out["bucketing_speedup"] = round(rates["raydistill_unbucketed"]["step_s"] / ours["step_s"], 3)
        out["cpu_speedups_speedup"] = round(rates["raydistill_no_cpu_speedups"]["step_s"] / ours["step_s"], 3)
    return out


# ----------------------------------------------------------------------------------------------------------------
# Inference


def plain_rate(model, texts: list[str], batch: int) -> float:
    """Sentences/s of batches in input order, each padded to its longest (no sorting), fp32, inference mode."""
    from raydistill.models.batching import inference

    started = time.perf_counter()
    with inference(model):
        for start in range(0, len(texts), batch):
            model(model.tokenize(texts[start:start + batch]))
    return len(texts) / (time.perf_counter() - started)


def measure_inference(args) -> dict:
    from sentence_transformers import SentenceTransformer

    from raydistill.models import BiEncoder, resolve_model

    texts = sts_sentences(args.inference_sentences)
    warm = texts[: args.batch]
    rates: dict[str, float] = {}
    student = BiEncoder.from_pretrained("minilm-l3")
    student.encode(warm, batch_size=args.batch)
    for _ in range(args.inference_repeats):
        started = time.perf_counter()
        student.encode(texts, batch_size=args.batch)
        rates["minilm-l3 raydistill"] = max(rates.get("minilm-l3 raydistill", 0.0),
                                            len(texts) / (time.perf_counter() - started))
    rates["minilm-l3 plain"] = plain_rate(student, texts, args.batch)
    for name in ("minilm-l6", "mpnet-base"):
        st_model = SentenceTransformer(str(resolve_model(name)), device="cpu")
        st_model.encode(warm, batch_size=args.batch)
        started = time.perf_counter()
        st_model.encode(texts, batch_size=args.batch, convert_to_numpy=True)
        rates[f"{name} sentence-transformers"] = len(texts) / (time.perf_counter() - started)
        del st_model
        rates[f"{name} plain"] = plain_rate(BiEncoder.from_pretrained(name), texts, args.batch)
        print(f"  inference {name}: ST {rates[f'{name} sentence-transformers']:.1f}/s, plain "
              f"{rates[f'{name} plain']:.1f}/s (load {load_average()})", flush=True)
    ours = rates["minilm-l3 raydistill"]
    return {
        "sentences": len(texts),
        "source": "STS12-16 + STS-B test sentences, seeded sample",
        "mean_tokens": round(float(np.mean(token_counts("minilm-l3", texts, 512))), 2),
        "sentences_per_s": {k: round(v, 1) for k, v in rates.items()},
        "inference_vs_minilm_l6": round(ours / rates["minilm-l6 sentence-transformers"], 3),
        "inference_vs_mpnet": round(ours / rates["mpnet-base sentence-transformers"], 3),
        "inference_vs_minilm_l6_plain": round(ours / rates["minilm-l6 plain"], 3),
        "inference_vs_mpnet_plain": round(ours / rates["mpnet-base plain"], 3),
    }


# ----------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--students", nargs="+", default=["minilm-l3", "bert-mini"])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--queue-size", type=int, default=65536)
    parser.add_argument("--max-length", type=int, default=32, help="student truncation (congen.yaml: 32)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4, help="timed steps per round and trainer")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps at the start of every round (a fresh "
                                                               "process: kernels for new shapes, first allocations)")
    parser.add_argument("--rounds", type=int, default=3, help="the trainers alternate this many times")
    parser.add_argument("--teacher-vectors", choices=("cached", "random"), default="cached")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="bf16",
                        help="raydistill's train.precision; with bf16 both libraries are also timed at the other")
    parser.add_argument("--ablation", nargs="*", default=["minilm-l3"],
                        help="students also timed without length-bucketed sub-batches (extra.bucket_tokens=0)")
    parser.add_argument("--inference", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--inference-sentences", type=int, default=768)
    parser.add_argument("--inference-repeats", type=int, default=2)
    parser.add_argument("--limit", type=Path, default=RESULTS / "bench-limit.json",
                        help="limit_gflops from this bench/limit.py result; measured here when absent")
    parser.add_argument("--write", type=Path, default=None, help=f"e.g. {RESULTS.name}/bench-train_step.json")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # one trainer, in a fresh process
    parser.add_argument("--worker-student", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    set_threads(args.threads)
    if args.worker:
        print(json.dumps(run_worker(args)), flush=True)
        return {}
    load_before = load_average()
    started = time.perf_counter()

    limit_record = read_record(args.limit) if args.limit else None
    if limit_record and limit_record.get("threads") == args.threads:
        limit_gflops, limit_source = float(limit_record["limit_gflops"]), str(args.limit.relative_to(ROOT)
                                                                              if args.limit.is_absolute() else args.limit)
    else:
        limit_gflops, limit_source = measure_limit(args.threads)["limit_gflops"], "measured in this run"
    print(f"limit {limit_gflops:.1f} GFLOP/s ({limit_source}); load {load_before}", flush=True)

    # The same GEMM as the limit's best shape, now: how much of the machine this run actually had.
    gemm_during_run = [measure_limit(args.threads, repeats=3, sizes=(2048,))["limit_gflops"]]
    work = Path(tempfile.mkdtemp(prefix="bench-train-step-"))
    try:
        students = {s: measure_training(s, args, args.teacher_vectors, limit_gflops, work) for s in args.students}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    gemm_during_run.append(measure_limit(args.threads, repeats=3, sizes=(2048,))["limit_gflops"])
    # The limit is fp32 (bench/limit.py, the machine limit); a bf16 step is also judged against bf16's own peak.
    bf16_gflops = measure_limit(args.threads, repeats=3, sizes=(2048,), dtype=torch.bfloat16)["limit_gflops"]
    for figures in students.values():
        figures["train_step_bf16_limit_fraction"] = round(
            figures["train_step_limit_fraction"] * limit_gflops / bf16_gflops, 3)
    inference = measure_inference(args) if args.inference else None

    headline = students[args.students[0]]
    record = {
        "bench": "train_step",
        "limit_gflops": limit_gflops,
        "limit_source": limit_source,
        "gemm_gflops_during_run": gemm_during_run,
        "bf16_gemm_gflops": bf16_gflops,
        "precision": args.precision,
        "train_step_bf16_limit_fraction": headline["train_step_bf16_limit_fraction"],
        "train_step_vs_st": headline["train_step_vs_st"],
        "train_step_limit_fraction": headline["train_step_limit_fraction"],
        **{key: headline[key] for key in ("bucketing_speedup", "cpu_speedups_speedup") if key in headline},
        "headline_student": args.students[0],
        "teacher": TEACHER,
        "batch": args.batch, "queue_size": args.queue_size, "max_length": args.max_length, "threads": args.threads,
        "steps_timed": args.steps * args.rounds, "teacher_vectors": args.teacher_vectors,
        "students": students,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    if inference is not None:
        record.update({k: inference[k] for k in ("inference_vs_minilm_l6", "inference_vs_mpnet")})
        record["inference"] = inference

    print(f"\nConGen step, batch {args.batch} x 2 views, K = {args.queue_size}, {args.threads} threads "
          f"(limit {limit_gflops:.1f} GFLOP/s)")
    print(f"{'student':<11}{'trainer':<24}{'step s':>8}{'sent/s':>9}{'rows/s':>9}")
    for name, s in students.items():
        for trainer, r in s["rates"].items():
            print(f"{name:<11}{trainer:<24}{r['step_s']:>8.2f}{r['sentences_per_s']:>9.1f}{r['rows_per_s']:>9.1f}")
        print(f"{'':<11}vs ST {s['train_step_vs_st']:.2f}x (rows {s['train_step_rows_vs_st']:.2f}x), limit fraction "
              f"{s['train_step_limit_fraction']:.2f} ({s['limit_fraction_with_loss']:.2f} counting the loss GEMMs; "
              f"sentence-transformers {s['st_limit_fraction']:.2f})")
    if inference is not None:
        print("\nencode, batch 128, STS sentences: " + ", ".join(f"{k} {v:.0f}/s"
                                                                for k, v in inference["sentences_per_s"].items()))
    record = write_record(args.write, record, threads=args.threads, load_before=load_before)
    print(json.dumps({k: record.get(k) for k in ("train_step_vs_st", "train_step_limit_fraction",
                                                 "inference_vs_minilm_l6", "inference_vs_mpnet", "load_before",
                                                 "load_after")}))
    return record


if __name__ == "__main__":
    main()
