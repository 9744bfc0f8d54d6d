"""The rows a stage trains on, built from what its method declares (``MethodSpec.dataset``).

    data = build_stage_data(stage.cfg, stage.spec)    # .num_rows, .iter_batches(epoch, batch_size, skip_batches)

``corpus``: the unlabeled text of ``data.corpus`` with its views and the teacher's cached vectors (the teacher pass
runs here, through the embedding cache; ``pipeline.build_training_data``). The labelled sets:

| dataset | rows | columns |
|---|---|---|
| nli_triplets | (premise, entailed, contradicted) of SNLI dev + MultiNLI dev | text_anchor, text_positive, text_negative |
| stsb_train | STS-B train pairs | text_a, text_b, score (gold / 5) |

A method with teachers of its own builds its rows itself (``MethodSpec.build_rows``, e.g. DvBERT's) with the
``StageServices`` lent here (``ENGINE_SERVICES``). Every labelled set is read through
``raydistill.data.corpus.training_pairs``, which drops evaluation sentences; ``data.max_sentences`` keeps a seeded
subset of a labelled set's rows.
"""

from __future__ import annotations

import numpy as np

import shutil
from pathlib import Path
from typing import Any, Callable

from raydistill.config.job import JobConfig
from raydistill.data.arrays import ArrayData, seeded_subset
from raydistill.methods import CORPUS, MethodSpec
from raydistill.methods.base import FittedStage

__all__ = ["build_stage_data", "nli_triplets", "EngineServices", "ENGINE_SERVICES", "keep_stage_checkpoints"]


class EngineServices:
    """``methods.base.StageServices`` on the engine: what a method with teachers of its own may ask of the runtime;
    stateless, so it pickles into the Ray tasks a method starts with ``run_parallel``."""

    def fit(self, cfg: JobConfig, data: Any, *, init_model: str | None = None, name: str | None = None) -> FittedStage:
        from raydistill.runtime.engine import checkpoint as ckpt
        from raydistill.runtime.engine.learner_group import LearnerGroup

        run_dir = cfg.resolved_run_dir()
        keep_stage_checkpoints(cfg, run_dir, name or cfg.method, world_size=1)
        group = LearnerGroup(cfg, run_dir=run_dir, init_model=init_model, name=name or cfg.method)
        fitted = group.fit(data)
        final, _ = ckpt.latest_good_checkpoint(run_dir)
        _, state = ckpt.load_checkpoint(final, config=cfg, map_location="cpu")
        model = group.spec.build_student(cfg, init_model=init_model)
        model.load_state_dict(state["student"])
        return FittedStage(model=model.eval(), steps=int(fitted["steps"]), history=list(fitted["history"]),
                           run_dir=run_dir)

    def run_parallel(self, fn: Callable[..., Any], calls: list[tuple], resources: Any) -> list[Any]:
        import ray

        if ray.is_initialized() and len(calls) > 1:
            options = {"num_cpus": resources.num_cpus, "num_gpus": resources.num_gpus, "max_retries": 0}
            task = ray.remote(fn).options(**options)
            return ray.get([task.remote(*args) for args in calls])
        return [fn(*args) for args in calls]

    def model_identity(self, model: str, *, encoder: str = "bi", max_length: int = 128) -> str:
        from raydistill.runtime.teachers.teacher import teacher_identity

        return teacher_identity(model, encoder=encoder, max_length=max_length)


ENGINE_SERVICES = EngineServices()


def keep_stage_checkpoints(cfg: JobConfig, run_dir: Path, tag: str, world_size: int) -> bool:
    """Whether ``run_dir`` holds a checkpoint of these very settings, which a stopped stage continues from; anything
    else there (another stage's checkpoint, a best model without a checkpoint) is removed so the stage starts clean."""
    from raydistill.runtime.engine.checkpoint import CheckpointError
    from raydistill.runtime.engine.resume import check_resume

    if not run_dir.exists():
        return False
    try:
        if check_resume(run_dir, cfg, world_size) is not None:
            return True
    except CheckpointError as exc:
        print(f"[{tag}] {run_dir} holds a checkpoint of other stage settings ({exc}); training the stage from its "
              "start", flush=True)
    shutil.rmtree(run_dir)
    return False


def build_stage_data(cfg: JobConfig, spec: MethodSpec):
    """``TrainingData`` (the corpus pipeline; needs Ray) or ``ArrayData`` (a labelled set, or the rows a method with
    teachers of its own builds) for ``spec.dataset``."""
    if spec.build_rows is not None:
        return spec.build_rows(cfg, ENGINE_SERVICES)
    if spec.dataset == CORPUS:
        from raydistill.runtime.teachers.pipeline import build_training_data

        return build_training_data(cfg)
    builders = {"nli_triplets": lambda cfg: ArrayData(nli_triplets(cfg.data.max_sentences, cfg.seed), seed=cfg.seed,
                                                      shuffle=cfg.data.shuffle),
                "stsb_train": _stsb_train_data}
    if spec.dataset not in builders:
        raise ValueError(f"method {spec.name!r} declares dataset {spec.dataset!r}; known: "
                         f"{', '.join([CORPUS, *builders])}")
    return builders[spec.dataset](cfg)


def nli_triplets(max_rows: int | None, seed: int) -> dict[str, np.ndarray]:
    """(premise, entailed, contradicted) triplets of SNLI dev + MultiNLI dev (``objectives.build_nli_triplets``: the
    SimCSE recipe on the only labelled NLI data offline; ``objectives.load_nli_triplets`` drops evaluation text); a seeded
    subset of ``max_rows`` when given."""
    from raydistill.data.corpus import NLI_TRAINING_SETS
    from raydistill.objectives import load_nli_triplets

    triplets = load_nli_triplets(NLI_TRAINING_SETS)
    columns = np.array(triplets, dtype=object)[seeded_subset(len(triplets), max_rows, seed)]  # [N, 3]
    return {"text_anchor": columns[:, 0], "text_positive": columns[:, 1], "text_negative": columns[:, 2]}


def _stsb_train_data(cfg: JobConfig) -> ArrayData:
    from raydistill.data.corpus import training_pairs

    pairs = training_pairs(("stsb_train",))[0]
    pairs = [pairs[i] for i in seeded_subset(len(pairs), cfg.data.max_sentences, cfg.seed)]
    return ArrayData({"text_a": np.array([p.sentence1 for p in pairs], dtype=object),
                      "text_b": np.array([p.sentence2 for p in pairs], dtype=object),
                      "score": np.array([p.score / 5.0 for p in pairs], dtype=np.float32)},
                     seed=cfg.seed, shuffle=cfg.data.shuffle)
