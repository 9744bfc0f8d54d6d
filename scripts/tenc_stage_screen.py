"""Screen one family's bi- or cross-encoder stage settings on a label set a Trans-Encoder run has already written.

    python scripts/tenc_stage_screen.py --run-dir runs/<run> --cycle 2 --family bert-tiny \
        --settings 5e-5,1 2e-4,1 5e-5,5 2e-4,3 5e-4,3 --write results/mutual_tenc/levers/<name>/screen.json
    python scripts/tenc_stage_screen.py --run-dir runs/<run> --cycle 2 --family bert-small --kind cross \
        --settings 1e-4,1 2e-4,1 1e-4,2

Each setting (``lr,epochs``) trains the family's starting encoder of that kind on the run's labels for it
(bi: ``cycle=<k>/stage=cross2bi``, cross: ``cycle=<k>/stage=bi2cross``; the column the job trains on, ``score``)
with the run's own stage settings otherwise (batch, length, precision, head, seed), exactly as the job's learner
does (``BiEncoderLearner.fit`` / ``CrossEncoderLearner.fit``, best STS-B dev kept), then scores the result on STS-B
dev and the seven STS test sets. A family's ``bi_stage`` / ``cross_stage`` is chosen by the dev column; the 7-STS
column shows whether dev's choice carries to the test sets. A stage is seconds to minutes here, where a whole job
is half an hour, so this is how a per-family setting is found.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEV_SET = "stsb_dev"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run-dir", type=Path, required=True, help="a Trans-Encoder run dir (its state.json)")
    parser.add_argument("--cycle", type=int, required=True, help="whose labels to learn")
    parser.add_argument("--kind", choices=("bi", "cross"), default="bi", help="which encoder of the family")
    parser.add_argument("--family", required=True)
    parser.add_argument("--settings", nargs="+", required=True, metavar="LR,EPOCHS")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--write", type=Path, default=None)
    args = parser.parse_args(argv)

    import ray

    from raydistill.evaluation import evaluate_sts
    from raydistill.evaluation.sts import STS7
    from raydistill.evaluation.results import code_provenance, default_command
    from raydistill.runtime.tenc.pairs import build_pair_set
    from raydistill.runtime.tenc.config import TencConfig, stage_key
    from raydistill.runtime.tenc.learners import BiEncoderLearner, CrossEncoderLearner
    from raydistill.runtime.tenc.state import now

    state_path = args.run_dir / "state.json"
    if not state_path.is_file():
        raise SystemExit(f"{state_path}: not found; --run-dir must be a Trans-Encoder run dir")
    state = json.loads(state_path.read_text())
    cfg = TencConfig.from_dict(state["config"]).validate()
    family = next((f for f in cfg.families if f.name == args.family), None)
    if family is None:
        raise SystemExit(f"{state_path}: no family {args.family!r} (families: {', '.join(f.name for f in cfg.families)})")
    stage = "cross2bi" if args.kind == "bi" else "bi2cross"
    labels_dir = args.run_dir / "labels" / stage_key(args.cycle, stage)
    if not labels_dir.is_dir():
        raise SystemExit(f"{labels_dir}: not found; that run has not labelled cycle {args.cycle}'s {stage} stage")
    pair_set = build_pair_set(cfg.pairs.source, cfg.pairs.max_pairs, cfg.pairs_seed())
    shared = cfg.stage_settings(family, args.kind)
    learner_class = BiEncoderLearner if args.kind == "bi" else CrossEncoderLearner
    start = family.bi if args.kind == "bi" else family.cross_start

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")  # the label set is read through Ray Data
    rows = []
    for setting in args.settings:
        lr, epochs = setting.split(",")
        train = dict(vars(shared), lr=float(lr), epochs=int(epochs))
        learner = learner_class(family.name, pair_set, train, pooling=family.pooling, seed=cfg.seed,
                                threads=args.threads, label_scaling=cfg.label_scaling, dev_set=DEV_SET)
        learner.load(start, cycle=args.cycle)
        started = time.perf_counter()
        fit = learner.fit(str(labels_dir), "score", cycle=args.cycle, stage=stage,
                          out_dir=str(args.run_dir / "screen" / f"{family.name}-{args.kind}-lr{lr}-ep{epochs}"))
        train_s = time.perf_counter() - started
        with learner.autocast():
            scores = evaluate_sts(learner.scorer(), sets=STS7 + (DEV_SET,), encoder=args.kind, batch_size=128,
                                  progress=False)
        row = {"lr": float(lr), "epochs": int(epochs), "steps": fit.get("steps"), "best_step": fit.get("best_step"),
               "stsb_dev": round(float(scores[DEV_SET]), 2),
               "sts7_avg": round(float(scores["avg"]), 2),
               "scores": {name: round(float(scores[name]), 2) for name in STS7}, "train_s": round(train_s, 1)}
        print(f"{family.name} {args.kind} lr {lr} epochs {epochs}: STS-B dev {row['stsb_dev']}, "
              f"7-STS {row['sts7_avg']} ({row['train_s']} s)", flush=True)
        rows.append(row)
    ray.shutdown()

    chosen = max(rows, key=lambda r: r["stsb_dev"])
    record = {"screen": f"tenc_{args.kind}_stage", "family": family.name, "kind": args.kind, args.kind: start,
              "cycle": args.cycle, "labels": str(labels_dir), "source_run": state.get("run_name", args.run_dir.name),
              f"shared_{args.kind}_stage": {"lr": shared.lr, "epochs": shared.epochs, "batch_size": shared.batch_size,
                                            "max_length": shared.max_length, "precision": shared.precision},
              "rows": rows, "chosen_by_dev": {"lr": chosen["lr"], "epochs": chosen["epochs"]},
              "command": default_command(), **code_provenance(), "date": now()}
    if args.write:
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {args.write}")
    return record


if __name__ == "__main__":
    main()
