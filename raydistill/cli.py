"""The `raydistill` command line. Thin: parses, validates, and calls the library.

    raydistill models                      presets and where each resolves on this machine
    raydistill eval --model minilm-l6      7-STS (+ STS-B dev, MRPC AUC) of a bi- or cross-encoder
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import sys
import time


def _cmd_models(args: argparse.Namespace) -> int:
    from raydistill.models.registry import describe_presets

    rows = describe_presets()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    header = ("name", "family", "layers", "hidden", "heads", "params_m", "status")
    widths = {h: max(len(h), *(len(str(r.get(h, ""))) for r in rows)) for h in header[:-1]}
    print("  ".join(h.ljust(widths.get(h, 0)) for h in header))
    for row in rows:
        cells = [str(row.get(h, "")).ljust(widths[h]) for h in header[:-1]]
        print("  ".join(cells + [str(row.get("status", ""))]))
    return 0


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime + children.ru_utime + children.ru_stime


def _cmd_eval(args: argparse.Namespace) -> int:
    import torch

    from raydistill.evaluation import STS7, evaluate_pair_auc, evaluate_sts, format_scores_table, write_result
    from raydistill.models import BiEncoder, CrossEncoder, resolve_model

    if args.threads:
        torch.set_num_threads(args.threads)
    started, cpu_started = time.time(), _cpu_seconds()
    model_dir = resolve_model(args.model)
    if args.encoder == "cross":
        model = CrossEncoder.from_pretrained(str(model_dir), max_length=args.max_length)
    else:
        model = BiEncoder.from_pretrained(str(model_dir), pooling=args.pooling, max_length=args.max_length)
    params_m = sum(p.numel() for p in model.parameters()) / 1e6

    scores = evaluate_sts(model, batch_size=args.batch_size, encoder=args.encoder, progress=not args.quiet)
    extra = {}
    if not args.no_extra:
        extra["mrpc_val_auc"] = evaluate_pair_auc(model, "mrpc_val", encoder=args.encoder)
    row = {"model": args.model, "encoder": args.encoder, "params_m": round(params_m, 2), "scores": scores}
    print(format_scores_table([row]))
    for name, value in extra.items():
        print(f"{name}: {value:.2f}")
    if args.out:
        write_result(
            args.out,
            kind="baseline",
            method="none",
            model=args.model,
            encoder=args.encoder,
            teacher=None,
            params_m=round(params_m, 3),
            scores={k: round(v, 2) for k, v in scores.items()},
            extra={k: round(v, 2) for k, v in extra.items()}
            | {"pooling": getattr(model, "pooling", None), "max_length": model.max_length},
            wall_s=round(time.time() - started, 1),
            cpu_s=round(_cpu_seconds() - cpu_started, 1),
            model_dir=str(model_dir),
        )
        print(f"wrote {args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raydistill", description=__doc__.split("\n\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)

    models = sub.add_parser("models", help="list model presets and where they resolve offline")
    models.add_argument("--json", action="store_true", help="machine-readable output")
    models.set_defaults(func=_cmd_models)

    ev = sub.add_parser("eval", help="evaluate a model on 7-STS, STS-B dev and MRPC")
    ev.add_argument("--model", required=True, help="preset name, local directory or cached hub id")
    ev.add_argument("--encoder", choices=("bi", "cross"), default="bi")
    ev.add_argument("--pooling", choices=("mean", "cls"), default=None, help="default: the checkpoint's own, else mean")
    ev.add_argument("--max-length", type=_positive_int, default=None)
    ev.add_argument("--batch-size", type=_positive_int, default=128)
    ev.add_argument("--threads", type=_positive_int, default=None, help="torch threads (default: torch's)")
    ev.add_argument("--out", default=None, help="write a result JSON (results schema) here")
    ev.add_argument("--no-extra", action="store_true", help="skip MRPC AUC")
    ev.add_argument("--quiet", action="store_true", help="no progress lines")
    ev.set_defaults(func=_cmd_eval)
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from raydistill.models.registry import ModelNotAvailableError

    try:
        return args.func(args)
    except ModelNotAvailableError as err:
        print(f"raydistill: {err}", file=sys.stderr)
        return 2
    except ValueError as err:  # DataError and config errors carry file/line/field already
        if type(err).__name__ in ("DataError", "ConfigError"):
            print(f"raydistill: {err}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
