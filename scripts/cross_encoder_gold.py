"""Does the Trans-Encoder cross-encoder stage learn at the default CPU scale? 2,000 STS-B train pairs, labels = gold
(score / 5) or the bi-encoder's own cosine, trained by the job's CrossEncoderLearner.fit; prints the best STS-B dev.

    python scripts/cross_encoder_gold.py LR BATCH EPOCHS MODEL gold|bi [MAX_LENGTH] [HEAD]

HEAD: classifier (default, the paper's) | segment_cosine. results/diag-cross-encoder-gold.json and
results/diag-cross-encoder-head.json record the runs docs/trans-encoder.md cites."""
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from raydistill.data.readers import read_pairs
from raydistill.data.registry import dataset_path
from raydistill.runtime.tenc.pairs import PairSet
from raydistill.runtime.tenc.learners import CrossEncoderLearner, BiEncoderLearner
from raydistill.models.registry import resolve_model

lr, batch, epochs, model, label = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
max_length = int(sys.argv[6]) if len(sys.argv) > 6 else 64
head = sys.argv[7] if len(sys.argv) > 7 else "classifier"
rows = list(read_pairs(dataset_path("stsb_train")))[:2000]
ps = PairSet(pair_id=np.arange(len(rows)), sentence1=tuple(r.sentence1 for r in rows),
             sentence2=tuple(r.sentence2 for r in rows), source="inductive", pool_size=len(rows))
if label == "gold":
    labels = np.array([r.score for r in rows], dtype=np.float32) / 5.0
else:
    bi = BiEncoderLearner("m", ps, dict(batch_size=32, lr=5e-5, epochs=1, max_length=32, warmup_ratio=0.0,
                                          weight_decay=0.01, grad_clip=1.0, eval_every=40), threads=1)
    bi.load(str(resolve_model(model)), cycle=0)
    labels = bi.predict_pairs()
train = dict(batch_size=batch, lr=lr, epochs=epochs, max_length=max_length, warmup_ratio=0.1, weight_decay=0.01,
             grad_clip=1.0, eval_every=10**9, max_steps=None, head=head)
cross = CrossEncoderLearner("m", ps, train, threads=1)
cross.load(str(resolve_model(model)), cycle=1)
t = time.time()
out = cross.fit(labels, cycle=1, stage="diag", out_dir=tempfile.mkdtemp())
print("RESULT", sys.argv[1:], "best_dev", round(out["best_dev"], 2), "steps", out["steps"], "wall", round(time.time() - t))
