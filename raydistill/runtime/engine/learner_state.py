"""What of a ``DistillLearner`` outlives a step: its best dev model and its checkpoints (``LearnerState``).

``LearnerState`` is the mix-in of ``DistillLearner`` that evaluates the method's dev score (``MethodSpec.dev_score``:
STS-B dev of the cosine by default; the user's own pairs instead when ``train.dev_pairs`` names a file: ROC AUC x 100
of 0/1 labels, else Spearman x 100 of the cosine; on rank 0; a new best is written to ``<run_dir>/best``
atomically, with ``BEST_INFO``, which names the set and metric it was chosen on), decides early stopping
(``train.patience`` evaluations without a new best; with a budget 7 unless set), and turns the learner into
checkpoint state and back: student, loss module (queues), optimiser, LR schedule, step, best dev, history, a time
budget's fixed total and seconds used, and the python / numpy / torch RNG, as tensors and plain lists only (checkpoints
are loaded with ``torch.load(weights_only=True)``). It uses the learner's ``cfg``, ``spec``, ``student``,
``loss_module``, ``optimizer``, ``scheduler``, ``step``, ``best`` (a ``BestDev``), ``history``, ``total_steps``,
``device``, ``rank`` and ``run_dir``, which ``DistillLearner.__init__`` sets.
"""

from __future__ import annotations

import json
import math
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raydistill.runtime.engine import checkpoint as ckpt

__all__ = ["BEST_INFO", "BestDev", "LearnerState", "dev_selection", "seed_everything"]

BEST_INFO = "raydistill_best.json"


def dev_selection(cfg, pairs: list | None = None) -> dict[str, str]:
    """What the dev evaluations score: ``{"set", "metric"}`` (STS-B dev and Spearman unless ``train.dev_pairs``, whose
    ``pairs`` are read unless given)."""
    if not cfg.train.dev_pairs:
        return {"set": "stsb_dev", "metric": "spearman"}
    from raydistill.data.scored_pairs import read_eval_pairs
    from raydistill.evaluation import pair_metric

    pairs = read_eval_pairs(cfg.train.dev_pairs) if pairs is None else pairs
    return {"set": str(cfg.train.dev_pairs), "metric": pair_metric([p.score for p in pairs])}


@dataclass
class BestDev:
    """The best STS-B dev so far, its step, and the evaluations since without a new best (early stopping)."""

    score: float = -math.inf
    step: int = -1
    evals_without_improvement: int = 0


class LearnerState:
    """The best dev model and the checkpoints of a ``DistillLearner`` (its mix-in; see the module docstring)."""

    def evaluate_dev(self, save_best: bool = True) -> float:
        """The method's dev score (``MethodSpec.dev_score``: STS-B dev Spearman x 100 of the cosine unless the method
        says otherwise); on rank 0 a new best is saved to ``<run_dir>/best``."""
        if self.rank != 0:
            return float("nan")
        score = self._dev_pairs_score() if self.cfg.train.dev_pairs else float(self.spec.dev_score(self.cfg,
                                                                                                  self.student))
        improved = score > self.best.score
        if improved:
            self.best = BestDev(score=score, step=self.step, evals_without_improvement=0)
            if save_best:
                self.save_best()
        else:
            self.best.evals_without_improvement += 1
        self.history.append({"step": self.step, "stsb_dev": score, "best_stsb_dev": self.best.score})
        return score

    def _dev_pairs(self) -> list:
        pairs = getattr(self, "_dev_pairs_read", None)
        if pairs is None:  # read once per learner; the file was checked before the run started
            from raydistill.data.scored_pairs import read_eval_pairs

            pairs = self._dev_pairs_read = read_eval_pairs(self.cfg.train.dev_pairs)
        return pairs

    def _dev_pairs_score(self) -> float:
        """``train.dev_pairs`` scored x 100: ROC AUC of 0/1 labels, else Spearman, of the student's similarities."""
        from raydistill.evaluation import pair_similarities, score_pairs

        pairs = self._dev_pairs()
        similarities = pair_similarities(self.student, {"dev_pairs": pairs})["dev_pairs"]
        return float(score_pairs(similarities, np.array([p.score for p in pairs], dtype=np.float64)))

    def should_stop_now(self) -> bool:
        """Early stopping: ``train.patience`` dev evaluations in a row without a new best (with a budget, 7 unless
        ``train.patience`` says otherwise)."""
        patience = self.cfg.train.stop_patience()
        return bool(patience) and self.best.evals_without_improvement >= patience

    def save_best(self) -> Path:
        """Write the student to ``<run_dir>/best`` atomically (tmp dir + rename), with its step and dev score."""
        from raydistill.fileio import atomic_write_json, staged_directory

        best = self.run_dir / "best"
        # a crash between the swap's two renames is undone at the next start (recover_directory)
        with staged_directory(best) as tmp:
            self.student.save(tmp)
            selected_on = dev_selection(self.cfg, self._dev_pairs() if self.cfg.train.dev_pairs else None)
            atomic_write_json(tmp / BEST_INFO, {
                "step": self.best.step, "stsb_dev": self.best.score, "method": self.spec.name,
                "config_hash": self.cfg.config_hash(), "selected_on": selected_on})
        return best

    def best_info(self) -> dict[str, Any]:
        return {"best_step": self.best.step, "best_stsb_dev": self.best.score}

    # ------------------------------------------------------------------------------------------------------------
    # Checkpoints

    def state_dict(self) -> dict[str, Any]:
        # Tensors and plain lists only: checkpoints are loaded with torch.load(weights_only=True), which refuses
        # pickled numpy or python objects.
        rng = _rng_state()
        if torch.cuda.is_available() and self.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.device)
        return {
            "student": self.student.state_dict(),
            "loss": self.loss_module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": rng,
            "learner": {"step": self.step, "best": vars(self.best).copy(), "history": self.history,
                        "total_steps": self.total_steps, "seconds_used": float(self.seconds_used),
                        # a time budget's total, once fixed, and its step (-1: not fixed, or no time budget)
                        "budget_fixed_at": -1 if self.total_pending or self.budget_factor is None
                        else self.budget_factor.fixed_at},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.student.load_state_dict(state["student"])
        self.loss_module.load_state_dict(state["loss"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        learner = state["learner"]
        self.step = int(learner["step"])
        self.best = BestDev(**learner["best"])
        self.history = list(learner.get("history", []))
        self.seconds_used = float(learner.get("seconds_used", 0.0))
        if self.budget_factor is not None and int(learner.get("budget_fixed_at", -1)) >= 0:
            # The total this run fixed before it stopped: kept, never measured again.
            self.fix_total(int(learner["total_steps"]), at_step=int(learner["budget_fixed_at"]))
        rng = state.get("rng")
        if rng is not None:
            _set_rng_state(rng)
            if "cuda" in rng and self.device.type == "cuda":
                torch.cuda.set_rng_state(rng["cuda"], self.device)
            if self.rank:
                # The saved RNG belongs to rank 0; other ranks keep distinct dropout masks.
                seed_everything(self.cfg.seed + 7919 * self.rank + self.step)

    def save_checkpoint(self, epoch: int, batch_in_epoch: int, extra: dict[str, Any] | None = None,
                        run_dir: str | os.PathLike | None = None) -> str | None:
        """Atomic checkpoint of everything the next step depends on (rank 0 writes; others return None)."""
        if self.rank != 0:
            return None
        bad = [name for name, tensor in self.student.state_dict().items()
               if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())]
        if bad:
            # Never let a resume start from broken weights; the previous checkpoints stay the newest.
            raise FloatingPointError(f"{self.spec.name}: not checkpointing step {self.step}: non-finite student "
                                     f"weights in {', '.join(bad[:5])}")
        path = ckpt.save_checkpoint(run_dir or self.run_dir, step=self.step, epoch=epoch,
                                    batch_in_epoch=batch_in_epoch, config=self.cfg, state=self.state_dict(),
                                    keep_last=self.cfg.train.keep_last, extra=extra)
        return str(path)

    def load_checkpoint(self, path: str | os.PathLike, may_differ=None) -> dict[str, Any]:
        """Restore from ``path``; refuses a checkpoint written by a different config, unless only keys
        ``may_differ(key)`` accepts differ (a PBT trial continuing another trial's checkpoint: its learning rate
        replaces the checkpoint's). Returns its manifest."""
        manifest, state = ckpt.load_checkpoint(path, config=self.cfg, map_location=self.device, may_differ=may_differ)
        self.load_state_dict(state)
        written_lr = (manifest.get("config") or {}).get("train", {}).get("lr", self.cfg.train.lr)
        if float(written_lr) != float(self.cfg.train.lr):
            self._restart_schedule_at(float(self.cfg.train.lr))
        # best/ may be newer than the checkpoint (a new best after the last checkpoint, then a crash): keep its score,
        # or a replayed evaluation that is better than the checkpoint's best but worse than best/ would overwrite it.
        info_path = self.run_dir / "best" / BEST_INFO
        if info_path.is_file():
            info = json.loads(info_path.read_text())
            if info.get("config_hash") == self.cfg.config_hash() and info.get("stsb_dev", -math.inf) > self.best.score:
                self.best = BestDev(score=float(info["stsb_dev"]), step=int(info["step"]),
                                  evals_without_improvement=self.best.evals_without_improvement)
        return manifest

    def _restart_schedule_at(self, lr: float) -> None:
        """Peak learning rate ``lr`` for the restored optimiser: the schedule goes on from its step with the new peak,
        as if the run had been started with it."""
        self.scheduler.base_lrs = [lr] * len(self.optimizer.param_groups)
        for group, factor in zip(self.optimizer.param_groups, self.scheduler.lr_lambdas):
            group["initial_lr"] = lr
            group["lr"] = lr * factor(self.scheduler.last_epoch)
        self.scheduler._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def get_history(self) -> list[dict[str, Any]]:
        return list(self.history)


def _rng_state() -> dict[str, Any]:
    """python / numpy / torch RNG states as tensors and plain lists (loadable with weights_only=True)."""
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    return {"python": [int(version), torch.tensor(internal, dtype=torch.int64), gauss],
            "numpy": {"name": str(name), "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                      "has_gauss": int(has_gauss), "cached_gaussian": float(cached_gaussian)},
            "torch": torch.get_rng_state()}


def _set_rng_state(rng: dict[str, Any]) -> None:
    version, internal, gauss = rng["python"]
    random.setstate((int(version), tuple(int(v) for v in internal.tolist()), gauss))
    numpy_state = rng["numpy"]
    np.random.set_state((numpy_state["name"], numpy_state["keys"].numpy().astype(np.uint32), numpy_state["pos"],
                         numpy_state["has_gauss"], numpy_state["cached_gaussian"]))
    torch.set_rng_state(rng["torch"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
