"""Cosine-similarity regression on STS-B train (Reimers & Gurevych, "Sentence-BERT", EMNLP 2019), DvBERT's last
stage: the cosine of the two sentence vectors regresses the gold score scaled to [0, 1].

    L = mean_i (cos(u_i, v_i) − y_i / 5)²

Rows: the ``stsb_train`` set (sentence pairs with their gold scores).
"""

from typing import Any

from raydistill.methods.base import Features, MethodSpec, StepContext
from raydistill.objectives import CosineMSELoss


def rows_method(spec_class: type[MethodSpec] = MethodSpec, **fields: Any) -> MethodSpec:
    """A method trained on rows of its own (a labelled set, or rows it builds): no corpus views, no teacher vectors
    of the job's teacher."""
    return spec_class(views={}, teacher_views=(), needs_teacher=False, **fields)


def pair_score_features(ctx: StepContext, batch) -> Features:
    u, v = ctx.encode_views(batch["text_a"], batch["text_b"])
    return {"u": u, "v": v}, ctx.tensor(batch["score"])


SPEC = rows_method(
    name="sts-cosine",
    summary="cosine-similarity regression on STS-B train (SBERT; DvBERT's last stage)",
    loss_class=CosineMSELoss,
    batch_to_features=pair_score_features,
    student_sentences_per_row=2,
    dataset="stsb_train",
    internal=True,
)
