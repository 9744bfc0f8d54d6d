"""AugSBERT, in-domain (Thakur et al., "Augmented SBERT", NAACL 2021, arXiv:2010.08240): a method with a teacher of
its own. A cross-encoder learns the few gold pairs, labels many new pairs recombined from the same sentences, and
the bi-encoder student learns gold and silver pairs alike:

    teacher   c(a, b) = sigmoid(cross(a, b)), fitted to the gold scores / 5 with BCE on both orders
              (an engine stage of the existing tenc-cross method: services.fit)
    silver    each gold sentence with its k nearest gold sentences by the start student's cosine (the paper's
              semantic-search sampling), scored y = (c(a, b) + c(b, a)) / 2
    student   L = mean_i (cos(u_i, v_i) − y_i)²  over gold rows (y = score / 5) and silver rows  (CosineMSELoss)

The worked example of a method with teachers of its own in docs/adding-a-method.md: ``build_rows`` trains the
teacher and labels the rows with the ``StageServices`` the runtime lends, ``own_teachers`` names the teacher for
the checks before Ray starts. The gold pairs are STS-B train without any pair holding an evaluation sentence.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from raydistill.config.job import JobConfig
from raydistill.config.schema import Int, Number, section
from raydistill.data.arrays import ArrayData
from raydistill.methods.base import ExtraSettings, MethodSpec, StageServices
from raydistill.methods.sts_cosine import pair_score_features
from raydistill.objectives import CosineMSELoss


@section
class AugSBERTSettings(ExtraSettings):
    """``extra:`` of AugSBERT: the cross-encoder teacher and how many silver pairs it labels."""

    cross_encoder: str = Field("minilm-l6", description="the teacher, fine-tuned on the gold pairs (a preset or a "
                                                        "model directory)")
    teacher_epochs: Int = Field(1, ge=1, description="passes of the teacher over the gold pairs")
    teacher_lr: Number = Field(1e-4, gt=0, description="the teacher's peak learning rate")
    teacher_batch_size: Int = Field(16, ge=1, description="gold pairs per teacher step")
    silver_per_sentence: Int = Field(2, ge=1, description="k: nearest gold sentences paired with each sentence")


def named_teacher(cfg: JobConfig) -> dict[str, str]:
    return {"extra.cross_encoder": cfg.extra.cross_encoder}


def gold_and_silver_pairs(cfg: JobConfig, services: StageServices) -> ArrayData:
    from raydistill.data.corpus import training_pairs
    from raydistill.methods.tenc_cross import SPEC as CROSS_STAGE, SymmetricCrossScorer
    from raydistill.models import resolve_model

    extra = cfg.extra
    gold = training_pairs(("stsb_train",))[0]
    if cfg.data.max_sentences is not None:
        gold = gold[:cfg.data.max_sentences]
    gold_a = [p.sentence1 for p in gold]
    gold_b = [p.sentence2 for p in gold]
    gold_y = np.array([p.score / 5.0 for p in gold], dtype=np.float32)  # [G]

    # 1. The teacher: a cross-encoder fitted to the gold pairs, one stage of the engine.
    cross_dir = str(resolve_model(extra.cross_encoder))
    teacher_cfg = JobConfig.for_stage(
        "tenc-cross", cross_dir, seed=cfg.seed, run_dir=str(cfg.resolved_run_dir() / "teacher"),
        source=f"{cfg._source or 'augsbert'}: the cross-encoder teacher",
        data={"max_length": 2 * cfg.data.max_length, "shuffle": True},
        train={"batch_size": extra.teacher_batch_size, "lr": extra.teacher_lr, "epochs": extra.teacher_epochs,
               "warmup_ratio": 0.1, "precision": cfg.train.precision},
        resources={"learner": {"num_learners": 0, "threads": cfg.resources.learner.threads}},
        extra={"head": "segment_cosine", "stage": {"gold_pairs": len(gold),
                                                   "teacher": services.model_identity(cross_dir, encoder="cross")}})
    teacher_rows = CROSS_STAGE.training_columns(gold_a, gold_b, gold_y, "clip")  # both orders, target clip(y, 0, 1)
    teacher = services.fit(teacher_cfg, ArrayData(teacher_rows, seed=cfg.seed), init_model=cross_dir,
                           name=f"{cfg.method} teacher").model

    # 2. Silver pairs: each sentence with its k nearest others under the start student, not already a gold pair.
    sentences = list(dict.fromkeys(gold_a + gold_b))
    vectors = SPEC.build_student(cfg).encode(sentences, normalize=True)  # [S, D]
    similarity = vectors @ vectors.T  # [S, S]
    np.fill_diagonal(similarity, -np.inf)
    k = min(extra.silver_per_sentence, len(sentences) - 1)
    nearest = np.argsort(-similarity, axis=1)[:, :k]  # [S, k]
    seen = {frozenset(pair) for pair in zip(gold_a, gold_b)}
    silver = []
    for i, row in enumerate(nearest):
        for j in row:
            pair = frozenset((sentences[i], sentences[j]))
            if pair not in seen:
                seen.add(pair)
                silver.append((sentences[i], sentences[j]))
    silver_y = SymmetricCrossScorer(teacher).score(silver) if silver else np.zeros(0, np.float32)  # [P]

    columns = {"text_a": np.array(gold_a + [a for a, _ in silver], dtype=object),
               "text_b": np.array(gold_b + [b for _, b in silver], dtype=object),
               "score": np.concatenate([gold_y, silver_y]).astype(np.float32)}
    stats = {"gold_pairs": len(gold), "silver_pairs": len(silver),
             "own_teachers": [{"model": extra.cross_encoder, "cached": False}]}
    return ArrayData(columns, seed=cfg.seed, shuffle=cfg.data.shuffle, cache_stats=stats)


SPEC = MethodSpec(
    name="augsbert",
    summary="AugSBERT (Thakur et al., NAACL 2021): a cross-encoder teacher labels recombined pairs for the student",
    views={},
    teacher_views=(),
    needs_teacher=False,
    loss_class=CosineMSELoss,
    batch_to_features=pair_score_features,
    extra_settings=AugSBERTSettings,
    student_sentences_per_row=2,
    dataset="augsbert_pairs",
    build_rows=gold_and_silver_pairs,    # trains the teacher, labels the rows: the method's own
    own_teachers=named_teacher,          # checked (a preset or a directory) before Ray starts
    reads=("stsb_train",),               # its data set's files are checked before Ray starts too
)
