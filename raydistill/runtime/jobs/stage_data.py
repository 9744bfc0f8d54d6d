"""The rows a stage trains on, built from what its method declares (``MethodSpec.dataset``).

    data = build_stage_data(stage.cfg, stage.spec)    # .num_rows, .iter_batches(epoch, batch_size, skip_batches)

``corpus``: the unlabeled text of ``data.corpus`` with its views and the teacher's cached vectors (the teacher pass
runs here, through the embedding cache; ``pipeline.build_training_data``). The labelled sets:

| dataset | rows | columns |
|---|---|---|
| nli_triplets | (premise, entailed, contradicted) of SNLI dev + MultiNLI dev | text_anchor, text_positive, text_negative |
| stsb_train | STS-B train pairs | text_a, text_b, score (gold / 5) |
| nli_teacher_labels | the labelled NLI pairs + the cross-encoder teachers' mean out-of-fold class distribution | text_a, text_b, label, teacher_probs |

Every labelled set is read through ``raydistill.data.corpus.training_pairs``: a pair either of whose texts is an
evaluation sentence (``raydistill.data.evaluation_text``) is not trained on. ``data.max_sentences`` keeps a seeded
subset of a labelled set's rows.
"""

from __future__ import annotations

import numpy as np

from raydistill.data.arrays import ArrayData
from raydistill.methods import CORPUS, MethodSpec
from raydistill.methods.dvbert import TeacherTraining, teachers_of
from raydistill.config.job import JobConfig

__all__ = ["build_stage_data", "nli_triplets"]


def build_stage_data(cfg: JobConfig, spec: MethodSpec):
    """``TrainingData`` (the corpus pipeline; needs Ray) or ``ArrayData`` (a labelled set) for ``spec.dataset``."""
    if spec.dataset == CORPUS:
        from raydistill.runtime.teachers.pipeline import build_training_data

        return build_training_data(cfg)
    builders = {"nli_triplets": _triplet_data, "stsb_train": _stsb_train_data,
                "nli_teacher_labels": _teacher_labelled_pairs}
    if spec.dataset not in builders:
        raise ValueError(f"method {spec.name!r} declares dataset {spec.dataset!r}; known: "
                         f"{', '.join([CORPUS, *builders])}")
    return builders[spec.dataset](cfg)


def _subset(num_rows: int, max_rows: int | None, seed: int) -> np.ndarray:
    if max_rows is None or max_rows >= num_rows:
        return np.arange(num_rows)
    return np.sort(np.random.default_rng(seed).choice(num_rows, size=max_rows, replace=False))


def nli_triplets(max_rows: int | None, seed: int) -> dict[str, np.ndarray]:
    """(premise, entailed, contradicted) triplets of SNLI dev + MultiNLI dev (``objectives.build_nli_triplets``: the
    SimCSE recipe on the only labelled NLI data offline), built from the pairs without evaluation text; a seeded
    subset of ``max_rows`` when given."""
    from raydistill.data.corpus import NLI_TRAINING_SETS, training_pairs
    from raydistill.objectives import build_nli_triplets

    # Filtered before the triplets are built, so a premise keeps its other hypotheses when one of them is held out.
    triplets = build_nli_triplets(training_pairs(NLI_TRAINING_SETS)[0])
    columns = np.array(triplets, dtype=object)[_subset(len(triplets), max_rows, seed)]  # [N, 3]
    return {"text_anchor": columns[:, 0], "text_positive": columns[:, 1], "text_negative": columns[:, 2]}


def _triplet_data(cfg: JobConfig) -> ArrayData:
    return ArrayData(nli_triplets(cfg.data.max_sentences, cfg.seed), seed=cfg.seed, shuffle=cfg.data.shuffle)


def _stsb_train_data(cfg: JobConfig) -> ArrayData:
    from raydistill.data.corpus import training_pairs

    pairs = training_pairs(("stsb_train",))[0]
    pairs = [pairs[i] for i in _subset(len(pairs), cfg.data.max_sentences, cfg.seed)]
    return ArrayData({"text_a": np.array([p.sentence1 for p in pairs], dtype=object),
                      "text_b": np.array([p.sentence2 for p in pairs], dtype=object),
                      "score": np.array([p.score / 5.0 for p in pairs], dtype=np.float32)},
                     seed=cfg.seed, shuffle=cfg.data.shuffle)


def _teacher_labelled_pairs(cfg: JobConfig) -> ArrayData:
    """Fine-tune (or reuse) the K NLI cross-encoder teachers in folds, refuse any below
    ``extra.teacher_training.min_accuracy``, and return the student's pairs with the teachers' mean out-of-fold
    class distribution (every pair labelled only by fold models that never trained on it).

    The teachers use every labelled pair shipped (or ``teacher_training.max_pairs``); the student a seeded subset
    of ``data.max_sentences`` of those pairs when set, as each pair has its out-of-fold labels either way."""
    from raydistill.runtime.jobs import dvbert_teachers as dv

    training = TeacherTraining.from_dict({"seed": cfg.seed, **(cfg.extra.get("teacher_training") or {})})
    columns = dv.nli_pairs(training.max_pairs, training.seed)
    infos = dv.ensure_nli_teachers(teachers_of(cfg), columns, training, cfg.resources.teacher)
    dv.check_teacher_accuracy(infos, training.min_accuracy)  # before the student spends a step on them
    soft, stats = dv.out_of_fold_soft_labels(infos, columns["label"])
    columns["teacher_probs"] = soft
    num_pairs = len(columns["label"])
    keep = _subset(num_pairs, cfg.data.max_sentences, cfg.seed)
    columns = {name: values[keep] for name, values in columns.items()}
    cache_stats = {"dvbert_teachers": [{k: info.get(k) for k in ("model", "dir", "heldout_accuracy", "fold_accuracy",
                                                                  "cached", "seconds")} for info in infos],
                   "teacher_pairs": num_pairs, **stats}
    return ArrayData(columns, seed=cfg.seed, shuffle=cfg.data.shuffle, cache_stats=cache_stats)
