"""This machine's limit: the dense fp32 matmul rate torch reaches, and from it the least time a training sentence costs.

1. ``limit_gflops``: torch fp32 ``A @ B`` on square n×n matrices (n = 1024, 2048, 4096) and on the students' own
   shapes (tokens × hidden × 4·hidden, the FFN product of a batch of 128 captions), at the thread count the jobs use
   (``resources.learner.threads`` of congen.yaml: 2). Median over repeats per shape; the limit is the best
   shape's median. 2·m·k·n FLOPs per product.

2. Lowest time per training sentence for a student (its forward + backward at the batch's real token count):

       FLOPs(sentence of n tokens) = 6 · M · n  +  12 · L · H · n²  +  6 · H · P

   M = the encoder's matmul parameters (the weights of every nn.Linear in the transformer layers: Q, K, V, output
   and the two FFN matrices; embeddings, LayerNorms and biases do no matmul), L layers, H hidden, P the projection
   width (ConGen's Dense H → teacher dim; 0 without). 2·M·n is the forward of the linear layers, and the backward
   costs twice the forward (the gradient to the inputs and the gradient to the weights), hence 6 (Kaplan et al.
   2020, "Scaling laws", §2.1). Self-attention adds per layer QKᵀ and A·V, 2·n·H multiply-adds each per token, i.e.
   4·n²·H FLOPs forward per sentence, ×3 with the backward: 12·L·H·n². n is the sentence's own token count
   (special tokens included, padding excluded), so padding is counted as waste, not as work.

       lowest seconds per sentence = mean FLOPs(sentence) / (limit_gflops · 1e9)

   Everything else a step does (tokenising, the loss and its queue, the optimiser, Python) is overhead against this
   limit; the train-step bench reports the ConGen loss's own GEMMs separately.

    python bench/limit.py                                   # table + JSON line
    python bench/limit.py --write results/bench-limit.json
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import common  # noqa: F401  (environment before torch)

import torch

from common import RESULTS, caption_texts, load_average, median, set_threads, timed, write_record

STUDENTS = ("minilm-l3", "bert-mini", "minilm-l6", "mpnet-base")
SQUARE_SIZES = (1024, 2048, 4096)


@dataclass(frozen=True)
class EncoderShape:
    name: str
    layers: int
    hidden: int
    matmul_params: int  # M: weights of the encoder layers' nn.Linear modules

    def sentence_flops(self, tokens: int, projection_dim: int = 0) -> float:
        """Forward + backward FLOPs of one sentence of ``tokens`` real tokens (module docstring)."""
        n = float(tokens)
        return 6.0 * self.matmul_params * n + 12.0 * self.layers * self.hidden * n * n + 6.0 * self.hidden * projection_dim

    def mean_sentence_flops(self, token_counts: list[int], projection_dim: int = 0) -> float:
        return sum(self.sentence_flops(n, projection_dim) for n in token_counts) / max(1, len(token_counts))


def encoder_shape(model: str) -> EncoderShape:
    """Layer count, width and matmul parameters of a preset or checkpoint, built on the meta device (no weights)."""
    from transformers import AutoConfig, AutoModel

    from raydistill.models import resolve_model
    from raydistill.models.bi_encoder import transformer_directory

    directory = transformer_directory(Path(resolve_model(model)))
    config = AutoConfig.from_pretrained(directory, local_files_only=True)
    with torch.device("meta"):
        transformer = AutoModel.from_config(config)
    layers = transformer.encoder.layer
    matmul = sum(m.in_features * m.out_features for m in layers.modules() if isinstance(m, torch.nn.Linear))
    return EncoderShape(model, int(config.num_hidden_layers), int(config.hidden_size), int(matmul))


def token_counts(model: str, texts: list[str], max_length: int) -> list[int]:
    """Real tokens per text (special tokens included) under the model's tokenizer, truncated at ``max_length``."""
    from transformers import AutoTokenizer

    from raydistill.models import resolve_model
    from raydistill.models.bi_encoder import transformer_directory

    tokenizer = AutoTokenizer.from_pretrained(transformer_directory(Path(resolve_model(model))), local_files_only=True)
    encoded = tokenizer(texts, truncation=True, max_length=max_length)
    return [len(ids) for ids in encoded["input_ids"]]


def gemm_gflops(m: int, k: int, n: int, repeats: int, dtype: torch.dtype = torch.float32) -> float:
    """Median GFLOP/s of ``[m, k] @ [k, n]`` in ``dtype`` (default fp32) on the current thread count."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=generator).to(dtype)
    b = torch.randn(k, n, generator=generator).to(dtype)
    out = torch.empty(m, n, dtype=dtype)
    seconds = timed(lambda: torch.matmul(a, b, out=out), repeats=repeats, warmup=2)
    return 2.0 * m * k * n / median(seconds) / 1e9


def measure_limit(threads: int, repeats: int = 5, sizes: tuple[int, ...] = SQUARE_SIZES,
                  extra_shapes: tuple[tuple[int, int, int], ...] = (), dtype: torch.dtype = torch.float32) -> dict:
    """``{"limit_gflops": best median, "gemm_gflops": {shape: rate}}`` at ``threads`` intra-op threads."""
    set_threads(threads)
    rates = {}
    for size in sizes:
        rates[f"{size}x{size}x{size}"] = round(gemm_gflops(size, size, size, repeats, dtype), 1)
    for m, k, n in extra_shapes:
        rates[f"{m}x{k}x{n}"] = round(gemm_gflops(m, k, n, repeats, dtype), 1)
    return {"limit_gflops": max(rates.values()), "gemm_gflops": rates}


def student_limits(limit_gflops: float, students: tuple[str, ...], texts: list[str], max_length: int,
                   projection_dim: int) -> dict:
    """Per student: shape, mean real tokens, FLOPs per training sentence, lowest ms/sentence, most sentences/s."""
    out = {}
    for student in students:
        shape = encoder_shape(student)
        counts = token_counts(student, texts, max_length)
        projection = projection_dim if projection_dim and projection_dim != shape.hidden else 0
        flops = shape.mean_sentence_flops(counts, projection)
        seconds = flops / (limit_gflops * 1e9)
        out[student] = {
            **{k: v for k, v in asdict(shape).items() if k != "name"},
            "projection_dim": projection,
            "mean_tokens": round(sum(counts) / len(counts), 2),
            "max_tokens": max(counts),
            "train_gflop_per_sentence": round(flops / 1e9, 4),
            "limit_ms_per_sentence": round(seconds * 1e3, 4),
            "limit_sentences_per_s": round(1.0 / seconds, 1),
        }
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2, help="torch threads (congen.yaml learner: 2)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sentences", type=int, default=2048, help="captions whose real token counts are used")
    parser.add_argument("--max-length", type=int, default=32, help="student truncation (congen.yaml: 32)")
    parser.add_argument("--projection-dim", type=int, default=768, help="ConGen's Dense to the teacher (mpnet: 768)")
    parser.add_argument("--students", nargs="+", default=list(STUDENTS))
    parser.add_argument("--write", type=Path, default=None, help=f"e.g. {RESULTS.name}/bench-limit.json")
    args = parser.parse_args(argv)

    load_before = load_average()
    texts = caption_texts(args.sentences)
    mean_tokens = sum(token_counts("minilm-l3", texts, args.max_length)) / len(texts)
    tokens_per_batch = int(round(128 * mean_tokens))
    # The students' FFN products on a batch of 128 captions: what a training step actually multiplies.
    shapes = ((tokens_per_batch, 384, 1536), (tokens_per_batch, 1536, 384), (tokens_per_batch, 256, 1024))
    limit = measure_limit(args.threads, args.repeats, extra_shapes=shapes)
    students = student_limits(limit["limit_gflops"], tuple(args.students), texts, args.max_length, args.projection_dim)

    print(f"fp32 matmul on {args.threads} threads (median of {args.repeats}):")
    for shape, rate in limit["gemm_gflops"].items():
        print(f"  {shape:<18}{rate:>8.1f} GFLOP/s")
    print(f"limit_gflops = {limit['limit_gflops']:.1f}")
    print(f"\n{'student':<12}{'M (matmul)':>12}{'tokens':>8}{'GFLOP/sent':>12}{'ms/sent':>9}{'sent/s':>9}")
    for name, s in students.items():
        print(f"{name:<12}{s['matmul_params'] / 1e6:>11.2f}M{s['mean_tokens']:>8.1f}"
              f"{s['train_gflop_per_sentence']:>12.3f}{s['limit_ms_per_sentence']:>9.3f}{s['limit_sentences_per_s']:>9.0f}")
    record = {
        "bench": "limit",
        "limit_gflops": limit["limit_gflops"],
        "gemm_gflops": limit["gemm_gflops"],
        "threads": args.threads,
        "corpus": f"{args.sentences} Flickr30k captions, max_length {args.max_length}",
        "flops_formula": "6*M*n + 12*L*H*n^2 + 6*H*P per sentence of n real tokens (M matmul params, L layers, "
                         "H hidden, P projection width)",
        "students": students,
    }
    record = write_record(args.write, record, threads=args.threads, load_before=load_before)
    print(json.dumps({k: record[k] for k in ("limit_gflops", "load_before", "load_after")}))
    return record


if __name__ == "__main__":
    main()
