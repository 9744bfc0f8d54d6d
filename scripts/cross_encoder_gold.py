"""Does the Trans-Encoder cross-encoder stage learn at the default CPU scale? STS-B train pairs labelled with the gold
score (score / 5) or with the bi-encoder's own cosine, trained by the job's CrossEncoderLearner.fit; prints the best
STS-B dev.

    python scripts/cross_encoder_gold.py LR BATCH EPOCHS MODEL gold|bi [MAX_LENGTH] [HEAD]

HEAD: classifier (default, the paper's) | segment_cosine. results/diag-cross-encoder-gold.json and
results/diag-cross-encoder-head.json record the runs docs/trans-encoder.md cites (2,000 pairs, the default).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("lr", type=float)
    parser.add_argument("batch", type=int)
    parser.add_argument("epochs", type=int)
    parser.add_argument("model", help="a preset name or a model directory: the start of both encoders")
    parser.add_argument("labels", choices=("gold", "bi"),
                        help="gold: STS-B's score / 5; bi: the cosine of MODEL as a bi-encoder")
    parser.add_argument("max_length", type=int, nargs="?", default=64)
    parser.add_argument("head", nargs="?", default="classifier", choices=("classifier", "segment_cosine"))
    parser.add_argument("--pairs", type=int, default=2000, help="the first N STS-B train pairs (default 2000)")
    args = parser.parse_args(argv)

    # Imported after parsing, so --help answers without loading torch and Ray.
    import numpy as np

    from raydistill.data.readers import read_pairs
    from raydistill.data.registry import dataset_path
    from raydistill.models.registry import resolve_model
    from raydistill.runtime.tenc.labels import write_label_set
    from raydistill.runtime.tenc.learners import BiEncoderLearner, CrossEncoderLearner
    from raydistill.runtime.tenc.pairs import PairSet

    rows = list(read_pairs(dataset_path("stsb_train")))[:args.pairs]
    pair_set = PairSet(pair_id=np.arange(len(rows)), sentence1=tuple(r.sentence1 for r in rows),
                       sentence2=tuple(r.sentence2 for r in rows), source="inductive", pool_size=len(rows))
    start = str(resolve_model(args.model))
    if args.labels == "gold":
        labels = np.array([r.score for r in rows], dtype=np.float32) / 5.0
    else:
        bi = BiEncoderLearner("m", pair_set, dict(batch_size=32, lr=5e-5, epochs=1, max_length=32, warmup_ratio=0.0,
                                                  weight_decay=0.01, grad_clip=1.0, eval_every=40), threads=1)
        bi.load(start, cycle=0)
        labels = bi.predict_pairs()
    train = dict(batch_size=args.batch, lr=args.lr, epochs=args.epochs, max_length=args.max_length, warmup_ratio=0.1,
                 weight_decay=0.01, grad_clip=1.0, eval_every=10**9, max_steps=None, head=args.head)
    cross = CrossEncoderLearner("m", pair_set, train, threads=1)
    cross.load(start, cycle=1)
    with tempfile.TemporaryDirectory(prefix="cross-encoder-gold-") as work:
        labels_dir = Path(work) / "labels"
        write_label_set(labels_dir, pair_set, {"m": labels}, labels)
        started = time.time()
        out = cross.fit(str(labels_dir), "score", cycle=1, stage="diag", out_dir=str(Path(work) / "cross"))
    print("RESULT", (argv if argv is not None else sys.argv[1:]), "best_dev", round(out["best_dev"], 2),
          "steps", out["steps"], "wall", round(time.time() - started))
    return 0


if __name__ == "__main__":
    sys.exit(main())
