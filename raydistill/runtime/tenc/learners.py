"""The learners of Trans-Encoder's two stages: a bi-encoder and a cross-encoder that label pairs and learn labels.

Contract: a learner holds one model of one family; ``load`` builds a stage's starting model (seeded), ``fit`` trains
it on a stage's label set through the engine's loop and leaves the best dev model in memory and on disk (with its
``stage.json``), ``predict_pairs`` / ``test_predictions`` label and evaluate with the model held, and
``request_stop`` (served beside a running ``fit``) stops ``fit`` at its next step boundary, resumable step for step.

The cycle is in ``runtime.tenc``'s docstring; ``t`` there is the label scaling between cosine and probability
(``objectives.trans_encoder.cosine_to_target``; the authors use the raw cosine). The cross-encoder's labels are the
mean of both pair orders: the authors score one order only, but a cross-encoder is order-sensitive and the
bi-encoder's cosine is not, so one order would hand the bi-encoder a label that depends on which sentence happened to
come first (docs/methods.md, Trans-Encoder).

A stage is a method of the engine (``methods.tenc_bi`` / ``methods.tenc_cross``) trained by ``LearnerGroup.fit`` like
every distillation stage. ``fit`` reads the rows itself from the label set through Ray Data
(``labels.read_training_rows``), checked against the job's pair set, and runs the stage in Train's local mode inside
this actor's process: a one-worker Train run costs 19.4 s to start here, local mode 0.10 s, and the model stays at
hand for labelling (docs/trans-encoder.md, How a stage trains). With ``resources.learners.num_learners: N`` the stage
is a Train run of N data-parallel workers that the actor starts and waits for, then loads the best model from the
stage's ``best/``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from raydistill.methods.tenc_cross import SymmetricCrossScorer
from raydistill.runtime.tenc.pairs import PairSet
from raydistill.runtime.tenc.sections import StageConfig
from raydistill.runtime.tenc.labels import read_training_rows
from raydistill.runtime.tenc.stage_io import encoder_fingerprint, labels_digest, save_model_atomically, stage_seed

__all__ = ["BiEncoderLearner", "CrossEncoderLearner", "StageLearner", "SymmetricCrossScorer", "encoder_fingerprint",
           "labels_digest", "stage_seed"]

# A stage writes a checkpoint only where it stops and where it ends (as the stopped-stage file did before the engine
# trained the stages): a periodic one would cost a model + AdamW write per period for a crash mid-stage only.
_NO_PERIODIC_CHECKPOINT = 1_000_000_000


def _ray_node_id() -> str | None:
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


class StageLearner:
    """One encoder of one family across the cycles: ``load`` -> ``fit`` -> ``predict_pairs`` / ``test_predictions``.

    Args (the rest are the config's, ``actors._learner_settings``):
        family: the family's name (columns ``score_<family>``, paths, progress lines).
        pair_set: the job's unlabeled pairs: what the learner labels, and what a label set must hold row by row.
        train: the stage's settings (a ``config.StageConfig``, or its fields as a dict).
        pooling: bi-encoder pooling (None = the start checkpoint's).
        seed: job seed; each stage derives its own (`stage_seed`).
        threads: torch intra-op threads in this process (Ray gives fractional-CPU actors 1 thread otherwise).
        log_every: steps between progress lines (the engine's, ``runtime.log_every``).
        learners: the stage's Ray Train learners (``resources.learners`` as a dict; None or ``num_learners: 0``:
            Train's local mode in this process, with its threads and device).
    """

    kind = "?"
    method = "?"  # the stage's method (methods.tenc_bi / methods.tenc_cross)

    def __init__(self, family: str, pair_set: PairSet, train: "StageConfig | dict[str, Any]", *, pooling: str | None = None,
                 label_scaling: str = "clip", seed: int = 1000, threads: int | None = 1, device: str | None = None,
                 inference_batch_size: int = 128, dev_set: str = "stsb_dev", log_every: int = 25,
                 data_task_cpus: float = 1.0, learners: dict[str, Any] | None = None):
        if threads:
            torch.set_num_threads(int(threads))
            try:
                torch.set_num_interop_threads(1)
            except RuntimeError:  # only legal before the first inter-op work; harmless afterwards
                pass
        self.family = family
        self.pair_set = pair_set
        self.stage = train if isinstance(train, StageConfig) else StageConfig(**train)
        self.pooling = pooling
        self.label_scaling = label_scaling
        self.seed = int(seed)
        self.threads = int(threads) if threads else None
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.inference_batch_size = int(inference_batch_size)
        self.dev_set = dev_set
        self.log_every = max(1, int(log_every))
        self.data_task_cpus = float(data_task_cpus)
        self.learners = dict(learners or {"num_learners": 0})
        self.precision, why = self._resolve_precision()
        if self.device.type == "cpu" and self.stage.precision != "fp32":
            self._say(f"[{family}/{self.kind}] {self.precision} on CPU ({why})")
        from raydistill.methods import get_method

        self.spec = get_method(self.method)  # the stage as a method of the engine: rows, student, loss, dev score
        self.model: nn.Module | None = None
        self.loaded_from: str | None = None
        self.model_source: str | None = None
        self.cycle = 0

    def _resolve_precision(self) -> tuple[str, str]:
        """``(bf16 | fp32, why)``: CUDA follows ``amp`` (the authors' AMP); a CPU follows ``precision``."""
        if self.device.type == "cuda":
            return ("bf16" if self.stage.amp else "fp32"), "CUDA AMP"
        from raydistill.runtime.teachers.teacher import resolve_precision

        return resolve_precision(self.stage.precision, self.device.type)

    def autocast(self):
        """The autocast context of labelling and evaluation (training: the engine's, from ``train.precision``)."""
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=self.precision == "bf16")

    # ------------------------------------------------------------------------------------------------------------
    # Model

    def load(self, checkpoint: str, *, cycle: int) -> dict[str, Any]:
        """Build this stage's starting model from ``checkpoint``, seeded (the engine draws a cross-encoder's new head
        again from the same seed); returns where it came from and the fingerprint of its shared encoder weights."""
        torch.manual_seed(stage_seed(self.seed, cycle, self.kind, self.family))
        self.model = self._new_model(str(checkpoint)).to(self.device)
        self.loaded_from, self.cycle = str(checkpoint), int(cycle)
        self.model_source = self.loaded_from  # the directory the held model was read from
        return {"init_from": self.loaded_from, "init_fingerprint": encoder_fingerprint(self.model),
                "pooling": getattr(self.model, "pooling", None), "params_m": self.params_m()}

    def params_m(self) -> float:
        return sum(p.numel() for p in self._require_model().parameters()) / 1e6

    def fingerprint(self) -> str:
        return encoder_fingerprint(self._require_model())

    def save(self, out_dir: str) -> str:
        """Save the model held now as the job uses it (its max length and pooling), e.g. a start checkpoint that
        model selection kept; returns the directory."""
        return str(save_model_atomically(self._require_model(), out_dir))

    def _require_model(self) -> nn.Module:
        if self.model is None:
            raise RuntimeError(f"{self.family}/{self.kind}: no model loaded; call load() first")
        return self.model

    def _new_model(self, checkpoint: str) -> nn.Module:
        raise NotImplementedError

    # ------------------------------------------------------------------------------------------------------------
    # Labelling and evaluation

    def predict_pairs(self, pair_set: PairSet | None = None) -> np.ndarray:
        """This model's label for every pair of ``pair_set`` (default: the job's), [N] float32 in pair-set order."""
        raise NotImplementedError

    def scorer(self):
        """What ``raydistill.evaluation`` evaluates: the bi-encoder itself, or the symmetrised cross-encoder."""
        return self.spec.scorer(self._require_model())

    def evaluated_scorer(self) -> tuple[Any, bool]:
        """What the test evaluations score, and whether in the stage's precision: the held model, in it."""
        return self.scorer(), True

    def dev_score(self) -> float:
        """The held model's dev score, computed as the engine scores the stage's model selection."""
        from raydistill.methods.tenc_bi import stage_dev_score

        return stage_dev_score(self.spec, self._require_model(), self.dev_set, self.inference_batch_size,
                               bf16=self.precision == "bf16")

    def test_predictions(self, sets: list[str] | tuple[str, ...]) -> dict[str, np.ndarray]:
        """The model's similarity for every pair of each evaluation set (cosine, or symmetrised cross score), as
        ``evaluated_scorer`` gives it."""
        from raydistill.data import load_dataset
        from raydistill.evaluation import STS_SETS, pair_similarities

        started = time.perf_counter()
        pairs_by_set = {name: load_dataset(STS_SETS.get(name, name)) for name in sets}
        scorer, in_training_precision = self.evaluated_scorer()
        with self.autocast() if in_training_precision else contextlib.nullcontext():
            predictions = pair_similarities(scorer, pairs_by_set, encoder=self.kind,
                                            batch_size=self.inference_batch_size, progress=False)
        self._say(f"test predictions on {', '.join(sets)} in {time.perf_counter() - started:.0f} s")
        return {name: np.asarray(values, dtype=np.float32) for name, values in predictions.items()}

    # ------------------------------------------------------------------------------------------------------------
    # Training

    def training_rows(self, labels_dir: str, target_column: str) -> tuple[list[str], list[str], np.ndarray]:
        """(sentence1, sentence2, label) of every pair of the label set in ``labels_dir``, read here through Ray
        Data, in pair_id order; checked row by row against the job's pair set."""
        rows = read_training_rows(labels_dir, target_column, task_cpus=self.data_task_cpus)
        where = f"{self.family}/{self.kind}: {labels_dir}"
        if len(rows) != len(self.pair_set) or not np.array_equal(rows["pair_id"].to_numpy(), self.pair_set.pair_id):
            raise RuntimeError(f"{where}: the label set's pair_ids do not match the job's pair set ({len(rows)} rows "
                               f"vs {len(self.pair_set)} pairs)")
        labels = rows[target_column].to_numpy(dtype=np.float32)
        if not np.isfinite(labels).all():
            raise ValueError(f"{where}: column {target_column} contains NaN or inf")
        return rows["sentence1"].tolist(), rows["sentence2"].tolist(), labels

    def request_stop(self) -> None:
        """Stop ``fit`` at its next step boundary, with a checkpoint of that boundary in the stage's run dir. Served
        beside a running ``fit`` (the actors' ``control`` concurrency group); the flag, which the engine's loop polls,
        is never cleared: a stopped stage ends the job, and its actors with it."""
        from raydistill.runtime.engine.stopping import request_stop

        request_stop()

    def stage_config(self, cycle: int, stage: str, identity: dict[str, Any], train_dir: str):
        """The stage as an engine job config: the stage settings, the stage's seed, and its learners: Train's local
        mode in this process (the default), or ``learners`` (N Train workers)."""
        from raydistill.config.job import JobConfig

        if int(self.learners.get("num_learners", 0)) > 0:
            learner = dict(self.learners)
        else:  # Train's local mode: the stage runs in this actor's process (module docstring)
            learner = {"num_learners": 0, "num_gpus": 1 if self.device.type == "cuda" else 0,
                       "threads": self.threads or 1, "cpu_speedups": False}
        return JobConfig.for_stage(  # the job records each stage in its MLflow child runs
            self.method, str(self.loaded_from), seed=stage_seed(self.seed, cycle, self.kind, self.family),
            run_dir=str(train_dir), source=f"tenc stage {stage} of cycle {cycle}",
            data={"max_length": self.stage.max_length, "shuffle": True},
            train=[self.stage, {"checkpoint_every": _NO_PERIODIC_CHECKPOINT, "keep_last": 1,
                                "precision": self.precision}],
            resources={"learner": learner}, runtime={"log_every": self.log_every},
            extra={"pooling": self.pooling, "head": self.stage.head, "dev_set": self.dev_set,
                   "eval_batch_size": self.inference_batch_size, "stage": identity})

    def fit(self, labels_dir: str, target_column: str, *, cycle: int, stage: str, out_dir: str,
            train_dir: str | None = None, record: dict[str, Any] | None = None) -> dict[str, Any]:
        """Train on column ``target_column`` of the label set in ``labels_dir``, keep the best dev model (in memory
        afterwards), save it to ``out_dir`` with ``stage.json`` (this summary without the history, plus ``record``).

        Returns a summary: best dev score and step, steps, wall time, the learning history (rows with ``step`` and
        ``loss`` or ``stsb_dev``), where the labels came from and where the model went.

        ``train_dir``: the stage's engine run dir (``checkpoints/``, ``best/``; default ``<out_dir>.training``),
        removed once the model is saved. Stopped (``request_stop``), the summary is ``{"stopped": True, "steps",
        "total_steps", "checkpoint"}`` and the next ``fit`` of the same stage continues from that checkpoint (one of
        other stage settings, e.g. other labels, is set aside and the stage trains from its start).
        """
        from raydistill.data.arrays import ArrayData
        from raydistill.runtime.engine.learner_group import LearnerGroup, PreemptedError
        from raydistill.runtime.jobs.stage_data import keep_stage_checkpoints

        self._require_model()
        train_dir = str(train_dir or Path(out_dir).with_name(f"{Path(out_dir).name}.training"))
        sentence1, sentence2, labels = self.training_rows(labels_dir, target_column)
        columns = self.spec.training_columns(sentence1, sentence2, labels, self.label_scaling)
        identity = {"cycle": cycle, "stage": stage, "family": self.family, "labels_sha": labels_digest(labels),
                    "target_column": target_column, "init_from": self.loaded_from, "job_seed": self.seed,
                    "label_scaling": self.label_scaling}
        cfg = self.stage_config(cycle, stage, identity, train_dir)
        data = ArrayData(columns, seed=cfg.seed, shuffle=True)
        tag = f"cycle {cycle} {stage} {self.family}/{self.kind}"
        group = LearnerGroup(cfg, self.spec, run_dir=train_dir, init_model=self.loaded_from, name=tag,
                             resume_hint="the job's command, run again, resumes the stage")
        total_steps = group.total_steps(data)
        if not keep_stage_checkpoints(cfg, Path(train_dir), tag, max(1, cfg.resources.learner.num_learners)):
            self._say(f"[{tag}] training on {data.num_rows:,} examples, {total_steps} steps "
                      f"(batch {cfg.train.batch_size}, lr {cfg.train.lr}, {cfg.train.epochs} epoch(s))")
        earlier_wall_s = _earlier_wall_s(Path(train_dir))
        started = time.perf_counter()
        try:
            fitted = group.fit(data)
        except PreemptedError as stop:
            _record_wall_s(Path(train_dir), earlier_wall_s + time.perf_counter() - started)
            self._say(f"[{tag}] stop requested: stopped after step {stop.step}/{total_steps}, saved to "
                      f"{stop.checkpoint}")
            return {"family": self.family, "kind": self.kind, "stopped": True, "steps": stop.step,
                    "total_steps": total_steps, "checkpoint": stop.checkpoint}
        if fitted["best_step"] < 0:
            raise RuntimeError(f"[{tag}] no dev evaluation was run ({data.num_rows} examples, {total_steps} steps)")
        # The engine keeps the best dev model in best/; it is the model this actor labels and is evaluated with.
        self.model = model = self._new_model(fitted["best_dir"]).to(self.device).eval()
        summary = {
            "family": self.family, "kind": self.kind, "cycle": cycle, "stage": stage,
            "best_dev": fitted["best_stsb_dev"], "best_step": fitted["best_step"], "steps": fitted["steps"],
            "total_steps": total_steps, "examples": data.num_rows, "wall_s": earlier_wall_s + fitted["seconds"],
            "history": _stage_history(fitted["history"]), "model_dir": str(Path(out_dir)),
            "init_from": self.loaded_from, "fingerprint": encoder_fingerprint(model), "labels_dir": str(labels_dir),
            "target_column": target_column, "labels_sha": identity["labels_sha"],
            "resumed_from": fitted["resumed_from"],
            "num_learners": int(cfg.resources.learner.num_learners),  # 0: local mode, in this actor
            "node_id": _ray_node_id(),  # which node trained the stage (resources.families pins a family)
        }
        stage_record = {**{k: v for k, v in summary.items() if k != "history"}, **(record or {}),
                        "completed": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
        save_model_atomically(model, out_dir, stage_record=stage_record)
        self.model_source = str(out_dir)
        shutil.rmtree(train_dir, ignore_errors=True)  # the stage is whole now; its model directory says so
        self._say(f"[{tag}] done: {summary['steps']} steps in {summary['wall_s']:.0f} s, best dev "
                  f"{summary['best_dev']:.2f} at step {summary['best_step']}")
        return summary

    def _say(self, message: str) -> None:
        print(message, flush=True)


# The wall seconds of a stage's attempts before a stop, beside its checkpoints: a resumed stage reports them all.
_WALL_FILE = "tenc_wall_s.json"


def _earlier_wall_s(train_dir: Path) -> float:
    try:
        return float(json.loads((train_dir / _WALL_FILE).read_text())["wall_s"])
    except (OSError, ValueError, KeyError, TypeError):  # no earlier attempt, or a record lost: this attempt's only
        return 0.0


def _record_wall_s(train_dir: Path, wall_s: float) -> None:
    from raydistill.fileio import atomic_write_json

    atomic_write_json(train_dir / _WALL_FILE, {"wall_s": round(float(wall_s), 3)})


def _stage_history(history: list[dict[str, Any]]) -> list[dict[str, float]]:
    """The engine's history as the job records a stage's: ``{step, loss}`` per step and ``{step, stsb_dev}`` per
    dev evaluation (the MLflow curves and learning-curve plots read these two)."""
    keyed = [(row, "loss" if "loss" in row else "stsb_dev") for row in history]
    return [{"step": int(row["step"]), key: float(row[key])} for row, key in keyed if key in row]


class BiEncoderLearner(StageLearner):
    """The bi-encoder of a family: labels pairs with the cosine; learns cross-encoder labels with cosine MSE."""

    kind = "bi"
    method = "tenc-bi"

    def _new_model(self, checkpoint: str) -> nn.Module:
        from raydistill.methods.tenc_bi import new_bi_encoder

        return new_bi_encoder(checkpoint, self.pooling, self.stage.max_length)

    def evaluated_scorer(self) -> tuple[Any, bool]:
        """The held model's checkpoint as `raydistill eval` scores it: loaded with the checkpoint's own max length
        (a start checkpoint's, not the stage's; a trained one was saved with the stage's), in fp32, so a family's
        start scores here what it scores there."""
        from raydistill.models import BiEncoder

        self._require_model()
        return BiEncoder.from_pretrained(self.model_source, pooling=self.pooling).to(self.device).eval(), False

    def predict_pairs(self, pair_set: PairSet | None = None) -> np.ndarray:
        model = self._require_model()
        pair_set = self.pair_set if pair_set is None else pair_set
        texts = list(dict.fromkeys(pair_set.sentence1 + pair_set.sentence2))
        row = {text: i for i, text in enumerate(texts)}
        with self.autocast():
            embeddings = model.encode(texts, batch_size=self.inference_batch_size, normalize=True)  # [U, D], unit rows
        first = embeddings[[row[t] for t in pair_set.sentence1]]  # [N, D]
        second = embeddings[[row[t] for t in pair_set.sentence2]]  # [N, D]
        cosines = np.einsum("nd,nd->n", first.astype(np.float64), second.astype(np.float64))  # [N]
        return np.clip(cosines, -1.0, 1.0).astype(np.float32)


class CrossEncoderLearner(StageLearner):
    """The cross-encoder of a family: learns scaled bi-encoder cosines with soft BCE on both orders; labels pairs
    with the symmetrised sigmoid score."""

    kind = "cross"
    method = "tenc-cross"

    def _new_model(self, checkpoint: str) -> nn.Module:
        from raydistill.methods.tenc_cross import new_cross_encoder

        # The configured head, not a saved one: a sequential-init stage starts from the previous model's weights.
        return new_cross_encoder(checkpoint, self.stage.max_length, self.stage.head)

    def predict_pairs(self, pair_set: PairSet | None = None) -> np.ndarray:
        with self.autocast():
            pairs = (self.pair_set if pair_set is None else pair_set).pairs()
            return self.scorer().score(pairs, batch_size=self.inference_batch_size)
