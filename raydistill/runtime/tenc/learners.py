"""Plain learners of Trans-Encoder's two stages: a bi-encoder and a cross-encoder that label pairs and learn labels.

Trans-Encoder (Liu, Jiao, Massiah, Yilmaz & Havrylov, ICLR 2022, arXiv:2109.13059) alternates two formulations
of one pretrained encoder:

    bi -> cross:  y_i = cos(bi(s1_i), bi(s2_i))                           (in [-1, 1])
                  cross learns  BCEWithLogits(cross(s1, s2), t(y)) and BCEWithLogits(cross(s2, s1), t(y))
    cross -> bi:  y_i = (sigmoid(cross(s1_i, s2_i)) + sigmoid(cross(s2_i, s1_i))) / 2      (in (0, 1))
                  bi learns     MSE(cos(bi(s1), bi(s2)), y)

``t`` is the label scaling between cosine and probability (``objectives.trans_encoder.cosine_to_target``; the
authors use the raw cosine). The cross-encoder's labels are the mean of both pair orders: the authors score one
order only, but a cross-encoder is order-sensitive and the bi-encoder's cosine is not, so one order would hand the
bi-encoder a label that depends on which sentence happened to come first (docs/methods.md, Trans-Encoder).

Each learner is a plain class: it holds one model, labels the job's unlabeled ``PairSet`` with it, trains on the
rows of a stage's label set, which it reads itself from the set's Parquet directory through Ray Data
(``labels.read_training_rows``), selects the best STS-B dev checkpoint inside the stage (dev every
``eval_every`` steps and at each epoch end, as the authors' ``fit`` does), and saves it. The Ray actors of the job
(``job.py``) are these classes behind ``ray.remote`` with resources from the config.
"""

from __future__ import annotations

import datetime as dt
import io
import math
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from raydistill.runtime.tenc.pairs import PairSet
from raydistill.runtime.tenc.labels import read_training_rows
from raydistill.runtime.tenc.stage_io import (StageRun, encoder_fingerprint, encoder_state, labels_digest,
                                              save_model_atomically, stage_seed, stopped_stage_file)

__all__ = [
    "BiEncoderLearner",
    "CrossEncoderLearner",
    "StageLearner",
    "SymmetricCrossScorer",
    "encoder_fingerprint",
    "encoder_state",
    "labels_digest",
    "save_model_atomically",
    "stage_seed",
    "stopped_stage_file",
]


def _ray_node_id() -> str | None:
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


class SymmetricCrossScorer:
    """A cross-encoder seen as an order-free pair scorer: the mean of sigmoid(cross(a, b)) and sigmoid(cross(b, a)).

    It has a ``score(pairs, batch_size)`` method, so ``raydistill.evaluation`` treats it as a cross-encoder; the
    evaluation numbers are then of the same symmetrised score the cross-encoder hands the bi-encoders as labels.
    """

    def __init__(self, cross_encoder):
        self.cross_encoder = cross_encoder

    def score(self, pairs: list[tuple[str, str]], batch_size: int = 64) -> np.ndarray:
        pairs = [(a, b) for a, b in pairs]
        forward = self.cross_encoder.score(pairs, batch_size=batch_size, activation="sigmoid")  # [N]
        backward = self.cross_encoder.score([(b, a) for a, b in pairs], batch_size=batch_size,
                                            activation="sigmoid")  # [N]
        return ((forward.astype(np.float64) + backward.astype(np.float64)) / 2.0).astype(np.float32)


# ----------------------------------------------------------------------------------------------------------------


class StageLearner:
    """One encoder of one family across the cycles: ``load`` -> ``fit`` -> ``predict_pairs`` / ``test_predictions``.

    Args:
        family: the family's name (columns ``score_<family>``, paths, progress lines).
        pair_set: the job's unlabeled pairs: what the learner labels, and what a label set must hold row by row.
        train: the stage's settings (``config.StageConfig`` as a dict): batch_size, lr, epochs, max_steps,
            max_length, warmup_ratio, weight_decay, grad_clip, eval_every, amp, precision, head (cross only).
        pooling: bi-encoder pooling (None = the start checkpoint's).
        label_scaling: the ``cosine_to_target`` mode that maps bi-encoder cosines to cross-encoder targets.
        seed: job seed; each stage derives its own (`stage_seed`).
        threads: torch intra-op threads in this process (Ray gives fractional-CPU actors 1 thread otherwise).
        device: "cpu", "cuda" or None (cuda when available).
        inference_batch_size: batch size of labelling and evaluation passes.
        dev_set: the model-selection set (STS-B dev).
        log_every: steps between progress lines; a line also comes at the first step that ends 30 s or more
            after the last one (``learner_group``'s progress lines, as distillation jobs print them).
        data_task_cpus: CPUs of the Ray Data task that reads a label set (within what the actors leave to Ray Data).
    """

    kind = "?"

    def __init__(self, family: str, pair_set: PairSet, train: dict[str, Any], *, pooling: str | None = None,
                 label_scaling: str = "clip", seed: int = 1000, threads: int | None = 1, device: str | None = None,
                 inference_batch_size: int = 128, dev_set: str = "stsb_dev", log_every: int = 25,
                 data_task_cpus: float = 1.0):
        if threads:
            torch.set_num_threads(int(threads))
            try:
                torch.set_num_interop_threads(1)
            except RuntimeError:  # only legal before the first inter-op work; harmless afterwards
                pass
        self.family = family
        self.pair_set = pair_set
        self.train_cfg = dict(train)
        self.pooling = pooling
        self.label_scaling = label_scaling
        self.seed = int(seed)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.inference_batch_size = int(inference_batch_size)
        self.dev_set = dev_set
        self.log_every = max(1, int(log_every))
        self.data_task_cpus = float(data_task_cpus)
        self.precision, why = self._resolve_precision()
        if self.device.type == "cpu" and self.train_cfg.get("precision", "fp32") != "fp32":
            self._say(f"[{family}/{self.kind}] {self.precision} on CPU ({why})")
        self.model: nn.Module | None = None
        self.loss = self._new_loss()
        self.loaded_from: str | None = None
        self.cycle = 0
        self._stop_requested = threading.Event()  # set by request_stop, from the actor's control thread

    def _resolve_precision(self) -> tuple[str, str]:
        """``(bf16 | fp32, why)``: CUDA follows ``amp`` (the authors' AMP); a CPU follows ``precision``."""
        if self.device.type == "cuda":
            return ("bf16" if self.train_cfg.get("amp", True) else "fp32"), "CUDA AMP"
        from raydistill.runtime.teachers.teacher import resolve_precision

        return resolve_precision(str(self.train_cfg.get("precision", "fp32")), self.device.type)

    def autocast(self):
        """The autocast context of every forward pass of this learner: training, labelling and evaluation."""
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=self.precision == "bf16")

    # ------------------------------------------------------------------------------------------------------------
    # Model

    def load(self, checkpoint: str, *, cycle: int) -> dict[str, Any]:
        """Build this stage's starting model from ``checkpoint`` (seeded: a cross-encoder's new head is drawn here).

        Returns where it came from and the fingerprint of its shared encoder weights.
        """
        torch.manual_seed(stage_seed(self.seed, cycle, self.kind, self.family))
        self.model = self._new_model(str(checkpoint)).to(self.device)
        self.loaded_from, self.cycle = str(checkpoint), int(cycle)
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

    def predict_pairs(self) -> np.ndarray:
        """This model's label for every pair of the pair set, [N] float32 in pair-set order."""
        raise NotImplementedError

    def scorer(self):
        """What ``raydistill.evaluation`` evaluates: the bi-encoder itself, or the symmetrised cross-encoder."""
        raise NotImplementedError

    def dev_score(self) -> float:
        from raydistill.evaluation import evaluate_sts

        with self.autocast():
            return float(evaluate_sts(self.scorer(), sets=(self.dev_set,), encoder=self.kind,
                                      batch_size=self.inference_batch_size, progress=False)[self.dev_set])

    def test_predictions(self, sets: list[str] | tuple[str, ...]) -> dict[str, np.ndarray]:
        """The model's similarity for every pair of each evaluation set (cosine, or symmetrised cross score)."""
        from raydistill.data import load_dataset
        from raydistill.evaluation import STS_SETS, pair_similarities

        started = time.perf_counter()
        pairs_by_set = {name: load_dataset(STS_SETS.get(name, name)) for name in sets}
        with self.autocast():
            predictions = pair_similarities(self.scorer(), pairs_by_set, encoder=self.kind,
                                            batch_size=self.inference_batch_size, progress=False)
        self._say(f"test predictions on {', '.join(sets)} in {time.perf_counter() - started:.0f} s")
        return {name: np.asarray(values, dtype=np.float32) for name, values in predictions.items()}

    # ------------------------------------------------------------------------------------------------------------
    # Training

    def _examples(self, sentence1: list[str], sentence2: list[str],
                  labels: np.ndarray) -> tuple[list[str], list[str], np.ndarray]:
        """(first sentences, second sentences, targets) of the stage's training examples, from its labelled pairs."""
        raise NotImplementedError

    def _batch_loss(self, first: list[str], second: list[str], targets: Tensor) -> Tensor:
        raise NotImplementedError

    def _new_loss(self) -> nn.Module:
        raise NotImplementedError

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
        """Stop ``fit`` at its next step boundary, saving where the stage stands (``stopped_stage_file``). The job's
        actors run this method on their ``control`` concurrency group, so it is served while ``fit`` runs."""
        self._stop_requested.set()

    def fit(self, labels_dir: str, target_column: str, *, cycle: int, stage: str, out_dir: str,
            record: dict[str, Any] | None = None) -> dict[str, Any]:
        """Train on column ``target_column`` of the label set in ``labels_dir``, keep the best dev model, save it to
        ``out_dir`` with ``stage.json`` (this summary without the history, plus ``record``) inside.

        Returns a summary: best dev score and step, steps, wall time, the learning history (rows with ``step`` and
        ``loss`` or ``stsb_dev``), where the labels came from and where the model went. The model in memory
        afterwards is the best one.

        A stop request (``request_stop``) ends the stage at the next step boundary: model, optimizer, schedule,
        step, data-order position, RNG states and the best model so far go to ``stopped_stage_file(out_dir)``, and
        the summary is ``{"stopped": True, "steps", "total_steps", "checkpoint"}``. The next ``fit`` of the same
        stage (same labels, settings and start) continues from that file, step for step as if never stopped.
        """
        from raydistill.runtime.engine.learner import build_optimizer, linear_schedule

        model = self._require_model()
        sentence1, sentence2, labels = self.training_rows(labels_dir, target_column)
        cfg = self.train_cfg
        first, second, targets = self._examples(sentence1, sentence2, labels)
        batch_size = int(cfg["batch_size"])
        total_steps = math.ceil(len(targets) / batch_size) * int(cfg["epochs"])
        if cfg.get("max_steps"):
            total_steps = min(total_steps, int(cfg["max_steps"]))
        optimizer = build_optimizer([model], lr=float(cfg["lr"]), weight_decay=float(cfg["weight_decay"]))
        scheduler = linear_schedule(optimizer, math.ceil(float(cfg["warmup_ratio"]) * total_steps), total_steps)
        rng = np.random.default_rng(stage_seed(self.seed, cycle, self.kind, self.family))
        torch.manual_seed(stage_seed(self.seed, cycle, self.kind, self.family) + 1)
        tag = f"cycle {cycle} {stage} {self.family}/{self.kind}"
        identity = {"cycle": cycle, "stage": stage, "labels_sha": labels_digest(labels), "target_column": target_column,
                    "examples": len(targets), "total_steps": total_steps, "init_from": self.loaded_from,
                    "seed": self.seed, "train": {k: cfg[k] for k in sorted(cfg)}}
        checkpoint = stopped_stage_file(out_dir)
        run = StageRun(model=model, optimizer=optimizer, scheduler=scheduler, rng=rng, total_steps=total_steps,
                        tag=tag)
        self._resume_stopped(run, checkpoint, identity)
        if run.resumed_from is None:
            self._say(f"[{tag}] training on {len(targets):,} examples, {total_steps} steps "
                      f"(batch {batch_size}, lr {cfg['lr']}, {cfg['epochs']} epoch(s))")
        if not self._train(run, first, second, targets, batch_size, int(cfg["epochs"]), int(cfg["eval_every"])):
            return self._stop_stage(run, checkpoint, identity)
        model.eval()
        if run.best_state is None:
            raise RuntimeError(f"[{tag}] no training step was run ({len(targets)} examples, {total_steps} steps)")
        model.load_state_dict(run.best_state)
        wall_s = run.wall_s()
        summary = {
            "family": self.family, "kind": self.kind, "cycle": cycle, "stage": stage,
            "best_dev": run.best_score, "best_step": run.best_step, "steps": run.step, "total_steps": total_steps,
            "examples": len(targets), "wall_s": wall_s, "history": run.history, "model_dir": str(Path(out_dir)),
            "init_from": self.loaded_from, "fingerprint": encoder_fingerprint(model), "labels_dir": str(labels_dir),
            "target_column": target_column, "labels_sha": identity["labels_sha"], "resumed_from": run.resumed_from,
            "node_id": _ray_node_id(),  # which node trained the stage (resources.families pins a family)
        }
        stage_record = {**{k: v for k, v in summary.items() if k != "history"}, **(record or {}),
                        "completed": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
        save_model_atomically(model, out_dir, stage_record=stage_record)
        checkpoint.unlink(missing_ok=True)  # the stage is whole now; its model directory says so
        self._say(f"[{tag}] done: {run.step} steps in {wall_s:.0f} s, best dev {run.best_score:.2f} at step "
                  f"{run.best_step}")
        return summary

    def _train(self, run: StageRun, first: list[str], second: list[str], targets: np.ndarray, batch_size: int,
               epochs: int, eval_every: int) -> bool:
        """Train from ``run``'s position to the end (True) or to a stop request at a step boundary (False)."""
        from raydistill.runtime.engine.learner_group import _Progress

        model, grad_clip = run.model, float(self.train_cfg["grad_clip"])
        progress = _Progress(run.tag, run.total_steps, epochs, self.log_every, run.resumed_from or 0)
        model.train()
        while run.epoch < epochs and run.step < run.total_steps:
            if run.order is None:
                run.order, run.start = run.rng.permutation(len(targets)), 0
            while run.start < len(run.order) and run.step < run.total_steps:
                if self._stop_requested.is_set():
                    return False
                index = run.order[run.start:run.start + batch_size]
                batch_targets = torch.as_tensor(targets[index], dtype=torch.float32, device=self.device)
                with self.autocast():
                    loss = self._batch_loss([first[i] for i in index], [second[i] for i in index], batch_targets)
                loss.backward()
                if grad_clip > 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
                run.optimizer.step()
                run.scheduler.step()
                run.optimizer.zero_grad(set_to_none=True)
                run.start, run.step = run.start + batch_size, run.step + 1
                self._after_step(run, float(loss.detach()), eval_every, progress)
            self._evaluate(run)  # end of each epoch (and of the stage, or where max_steps cut it)
            run.epoch, run.order = run.epoch + 1, None
        return True

    def _after_step(self, run: StageRun, loss_value: float, eval_every: int, progress) -> None:
        if not math.isfinite(loss_value):
            raise FloatingPointError(f"[{run.tag}] loss became {loss_value} at step {run.step}")
        run.history.append({"step": run.step, "loss": loss_value})
        progress.update(run.step, run.epoch, {"loss": loss_value}, None, {})
        if run.step % eval_every == 0 and run.step < run.total_steps:
            self._evaluate(run)

    def _evaluate(self, run: StageRun) -> None:
        """Dev score at this step; the best model so far is kept (a copy on the CPU)."""
        if run.history and run.history[-1].get("step") == run.step and "stsb_dev" in run.history[-1]:
            return  # already evaluated at this step (eval_every landed on an epoch end)
        score = self.dev_score()
        run.history.append({"step": run.step, "stsb_dev": score})
        improved = score > run.best_score
        if improved:
            run.best_score, run.best_step = score, run.step
            run.best_state = {k: v.detach().to("cpu", copy=True) for k, v in run.model.state_dict().items()}
        self._say(f"[{run.tag}] step {run.step}/{run.total_steps} dev {score:.2f}"
                  f"{' (best)' if improved else f' (best {run.best_score:.2f} @ {run.best_step})'}")

    def _stop_stage(self, run: StageRun, checkpoint: Path, identity: dict[str, Any]) -> dict[str, Any]:
        """Save the stage's position at this step boundary (unless no step was trained since the last save)."""
        from raydistill.fileio import atomic_write_bytes

        if run.step > (run.resumed_from or 0):
            state = {"identity": identity, "progress": run.progress(), "model": run.model.state_dict(),
                     "optimizer": run.optimizer.state_dict(), "scheduler": run.scheduler.state_dict(),
                     "rng": run.rng.bit_generator.state, "torch_rng": torch.get_rng_state(),
                     "cuda_rng": torch.cuda.get_rng_state_all() if self.device.type == "cuda" else None}
            buffer = io.BytesIO()
            torch.save(state, buffer)
            checkpoint.parent.mkdir(parents=True, exist_ok=True)  # the stage's first model not saved yet
            atomic_write_bytes(checkpoint, buffer.getvalue())
            self._say(f"[{run.tag}] stop requested: stopped after step {run.step}/{run.total_steps}, saved to "
                      f"{checkpoint}")
        return {"family": self.family, "kind": self.kind, "stopped": True, "steps": run.step,
                "total_steps": run.total_steps, "checkpoint": str(checkpoint) if checkpoint.is_file() else None}

    def _resume_stopped(self, run: StageRun, checkpoint: Path, identity: dict[str, Any]) -> None:
        """Continue from the stage's stopped-stage file when it was written for this very stage."""
        if not checkpoint.is_file():
            return
        try:
            state = torch.load(checkpoint, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - a damaged file costs the stage's progress, never the job
            self._say(f"[{run.tag}] {checkpoint} is unreadable ({exc}); training the stage from its start")
            return
        if state.get("identity") != identity:
            differing = sorted(k for k in identity if state.get("identity", {}).get(k) != identity[k])
            self._say(f"[{run.tag}] {checkpoint} was saved for other stage settings ({', '.join(differing)}); "
                      "training the stage from its start")
            return
        run.model.load_state_dict(state["model"])
        run.optimizer.load_state_dict(state["optimizer"])
        run.scheduler.load_state_dict(state["scheduler"])
        run.rng.bit_generator.state = state["rng"]
        torch.set_rng_state(state["torch_rng"])
        if state.get("cuda_rng") is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        run.restore(state["progress"])
        self._say(f"[{run.tag}] resuming at step {run.step}/{run.total_steps} from {checkpoint} (the stage was "
                  "stopped there)")

    def _say(self, message: str) -> None:
        print(message, file=sys.stdout, flush=True)


class BiEncoderLearner(StageLearner):
    """The bi-encoder of a family: labels pairs with the cosine; learns cross-encoder labels with cosine MSE."""

    kind = "bi"

    def _new_model(self, checkpoint: str) -> nn.Module:
        from raydistill.models import BiEncoder

        return BiEncoder.from_pretrained(checkpoint, pooling=self.pooling, max_length=int(self.train_cfg["max_length"]))

    def scorer(self):
        return self._require_model()

    def predict_pairs(self) -> np.ndarray:
        model = self._require_model()
        texts = list(dict.fromkeys(self.pair_set.sentence1 + self.pair_set.sentence2))
        row = {text: i for i, text in enumerate(texts)}
        with self.autocast():
            embeddings = model.encode(texts, batch_size=self.inference_batch_size, normalize=True)  # [U, D], unit rows
        first = embeddings[[row[t] for t in self.pair_set.sentence1]]  # [N, D]
        second = embeddings[[row[t] for t in self.pair_set.sentence2]]  # [N, D]
        cosines = np.einsum("nd,nd->n", first.astype(np.float64), second.astype(np.float64))  # [N]
        return np.clip(cosines, -1.0, 1.0).astype(np.float32)

    def _examples(self, sentence1: list[str], sentence2: list[str],
                  labels: np.ndarray) -> tuple[list[str], list[str], np.ndarray]:
        # The cosine is symmetric, so one order per pair is all there is to learn.
        return list(sentence1), list(sentence2), np.asarray(labels, dtype=np.float32)

    def _batch_loss(self, first: list[str], second: list[str], targets: Tensor) -> Tensor:
        model = self._require_model()
        first_embeddings = model({k: v.to(self.device) for k, v in model.tokenize(first).items()})  # [B, D]
        second_embeddings = model({k: v.to(self.device) for k, v in model.tokenize(second).items()})  # [B, D]
        return self.loss({"u": first_embeddings, "v": second_embeddings}, targets).loss

    def _new_loss(self) -> nn.Module:
        from raydistill.objectives.trans_encoder import CosineMSELoss

        return CosineMSELoss()


class CrossEncoderLearner(StageLearner):
    """The cross-encoder of a family: learns scaled bi-encoder cosines with soft BCE on both orders; labels pairs
    with the symmetrised sigmoid score."""

    kind = "cross"

    def _new_model(self, checkpoint: str) -> nn.Module:
        from raydistill.models import CrossEncoder

        # The configured head, not a saved one: a sequential-init stage starts from the previous model's weights.
        return CrossEncoder.from_pretrained(checkpoint, num_labels=1, max_length=int(self.train_cfg["max_length"]),
                                            head=self.train_cfg.get("head") or "classifier")

    def scorer(self):
        return SymmetricCrossScorer(self._require_model())

    def predict_pairs(self) -> np.ndarray:
        with self.autocast():
            return self.scorer().score(self.pair_set.pairs(), batch_size=self.inference_batch_size)

    def _examples(self, sentence1: list[str], sentence2: list[str],
                  labels: np.ndarray) -> tuple[list[str], list[str], np.ndarray]:
        from raydistill.objectives.trans_encoder import cosine_to_target

        targets = np.asarray(cosine_to_target(labels, self.label_scaling), dtype=np.float32)  # [N]
        # Both orders with the same target (the authors' bi -> cross stage does this too).
        first = list(sentence1) + list(sentence2)
        second = list(sentence2) + list(sentence1)
        return first, second, np.concatenate([targets, targets])

    def _batch_loss(self, first: list[str], second: list[str], targets: Tensor) -> Tensor:
        model = self._require_model()
        features = {k: v.to(self.device) for k, v in model.tokenize(list(zip(first, second))).items()}
        logits = model(features)  # [B]
        return self.loss({"logits": logits}, targets).loss

    def _new_loss(self) -> nn.Module:
        from raydistill.objectives.trans_encoder import SoftBCELoss

        return SoftBCELoss()
