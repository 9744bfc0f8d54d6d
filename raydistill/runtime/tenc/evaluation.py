"""The Trans-Encoder job's evaluation and model selection (``JobEvaluation``), recorded in the run state.

``JobEvaluation``, the mix-in of ``TransEncoderJob``, measures the trained models: test predictions on the STS sets
(``evaluate``; an ensemble is the mean of its members' predictions), the pair AUC for qqp / mrpc
(``evaluate_pair_auc``), each start bi-encoder's dev score, and ``select_best``. Every result goes into the run
state as it is made, so a resumed job skips what is recorded. It uses the job's ``cfg``, ``state``, ``actors``,
``layout``, ``families``, ``pair_set``, ``auc_pairs``, ``gold_labels``, ``tracker``, ``activity`` and ``trained_model``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from raydistill.fileio import copy_directory
from raydistill.runtime.tenc.actors import say
from raydistill.runtime.tenc.config import STAGE_TRAINED_IN, STS7, stage_key
from raydistill.runtime.tenc.labels import read_label_set

__all__ = ["JobEvaluation", "scores_from_predictions"]


def scores_from_predictions(predictions: dict[str, np.ndarray]) -> dict[str, float]:
    """Spearman x 100 of each set's predictions against its gold scores, and ``avg`` over the seven STS sets."""
    from raydistill.data import load_dataset
    from raydistill.evaluation import STS_SETS, spearman

    scores = {}
    for name, predicted in predictions.items():
        gold = np.array([p.score for p in load_dataset(STS_SETS.get(name, name))], dtype=np.float64)
        scores[name] = float(spearman(np.asarray(predicted, dtype=np.float64), gold))
    if all(name in scores for name in STS7):
        scores["avg"] = float(np.mean([scores[name] for name in STS7]))
    return scores


class JobEvaluation:
    """Evaluation and model selection of a ``TransEncoderJob`` (its mix-in; see the module docstring)."""

    def _hold(self, kind: str, cycles: dict[str, int]) -> None:
        """Load each family's ``kind`` model of ``cycles[family]`` into its actor, unless the actor holds it."""
        import ray

        refs = [self.actors.ensure_loaded(f, kind, self.trained_model(c, kind, f), c) for f, c in cycles.items()]
        ray.get([r for r in refs if r is not None])

    def _measure_start_dev(self) -> None:
        """The dev score of each starting bi-encoder: the cycle-0 candidate of model selection, measured by its
        actor as every stage measures its models (the stage's length and precision), so that selection compares
        like with like; the cycle-0 evaluation scores the start as `raydistill eval` does, for the report."""
        import ray

        start_dev = self.state.data.setdefault("start_dev", {})
        dev_set = self.cfg.eval.dev_set
        todo = [f for f in self.families if f not in start_dev]
        if todo:
            self._hold("bi", dict.fromkeys(todo, 0))
            for f, score in zip(todo, ray.get([self.actors.actor(f, "bi").dev_score.remote() for f in todo])):
                start_dev[f] = float(score)
        self.state.save()
        say("starting bi-encoders on " + dev_set + ": " + ", ".join(f"{f} {start_dev[f]:.2f}" for f in self.families)
            + " (the cycle-0 candidates of model selection)")

    def evaluate(self, kind: str, cycles: dict[str, int], name: str) -> None:
        """Test predictions of each family's ``kind`` model of ``cycles[family]`` (families in parallel), and of the
        ensemble of those models (mean of their predictions), recorded as ``name``."""
        import ray

        self.activity = f"while evaluating the {kind}-encoders ({name})"
        self.evaluate_pair_auc(kind, cycles, name)  # before the result files, which carry it
        sets = list(dict.fromkeys(list(self.cfg.eval.test_sets) + [self.cfg.eval.dev_set]))
        todo = [f for f, c in cycles.items() if f"cycle={c}/{kind}/{f}" not in self.state.evaluations]
        if todo:
            self._hold(kind, {f: cycles[f] for f in todo})
            say(f"evaluating the {kind}-encoders " + ", ".join(f"{f} (cycle {cycles[f]})" for f in todo)
                + f" on {', '.join(sets)}")
            started = time.perf_counter()
            results = ray.get([self.actors.actor(f, kind).test_predictions.remote(sets) for f in todo])
            params = ray.get([self.actors.actor(f, kind).params_m.remote() for f in todo])
            for f, predictions, params_m in zip(todo, results, params):
                cycle = cycles[f]
                path = self.layout.eval_file(cycle, kind, f)
                path.parent.mkdir(parents=True, exist_ok=True)
                np.savez(path, **predictions)
                scores = scores_from_predictions(predictions)
                self.state.evaluations[f"cycle={cycle}/{kind}/{f}"] = {
                    "scores": scores, "predictions": str(path), "params_m": params_m,
                    "wall_s": time.perf_counter() - started}
                self.state.save()
                say(f"[cycle {cycle}] {f}/{kind}: 7-STS avg {scores.get('avg', float('nan')):.2f}, "
                    f"{self.cfg.eval.dev_set} {scores.get(self.cfg.eval.dev_set, float('nan')):.2f} "
                    f"(evaluated in {time.perf_counter() - started:.0f} s)")
        recorded = self.state.evaluations.get(f"{name}/{kind}/ensemble", {})
        if len(cycles) > 1 and recorded.get("members") != dict(cycles):
            self._evaluate_ensemble(kind, cycles, name)

    def _evaluate_ensemble(self, kind: str, cycles: dict[str, int], name: str) -> None:
        from raydistill.objectives.trans_encoder import average_pseudo_labels

        keys = [f"cycle={c}/{kind}/{f}" for f, c in cycles.items()]
        per_family = []
        for key in keys:
            with np.load(self.state.evaluations[key]["predictions"]) as archive:
                per_family.append({set_name: archive[set_name] for set_name in archive.files})
        averaged = {set_name: np.asarray(average_pseudo_labels([p[set_name] for p in per_family]))
                    for set_name in per_family[0]}
        scores = scores_from_predictions(averaged)
        params_m = sum(self.state.evaluations[k]["params_m"] for k in keys)
        self.state.evaluations[f"{name}/{kind}/ensemble"] = {"scores": scores, "params_m": params_m,
                                                             "members": dict(cycles)}
        self.state.save()
        say(f"[{name}] ensemble of the {kind}-encoders: 7-STS avg {scores.get('avg', float('nan')):.2f}")

    def evaluate_pair_auc(self, kind: str, cycles: dict[str, int], name: str) -> None:
        """qqp / mrpc sources: ROC AUC x 100 of each family's ``kind`` model of ``cycles[family]`` (and of their
        ensemble, the mean of their scores) on ``auc_pairs`` (the job's own pairs, or the held-out half's) against
        the gold labels. On the job's own pairs a model's scores are the labels it handed on when it made some (read
        from the Parquet); otherwise its actor scores the pairs."""
        import ray

        from raydistill.evaluation import roc_auc
        from raydistill.objectives.trans_encoder import average_pseudo_labels

        if self.gold_labels is None:
            return
        held_out = self.auc_pairs is not self.pair_set
        records = self.state.data.setdefault("pair_auc", {})
        todo = [f for f, c in cycles.items() if f"cycle={c}/{kind}/{f}" not in records]
        scores = {f: None if held_out else self._handed_on_scores(kind, cycles[f], f) for f in todo}
        ask = [f for f in todo if scores[f] is None]
        if ask:
            self._hold(kind, {f: cycles[f] for f in ask})
            pairs_ref = ray.put(self.auc_pairs) if held_out else None
            scores.update(zip(ask, ray.get([self.actors.actor(f, kind).predict_pairs.remote(pairs_ref)
                                            for f in ask])))
        for f in todo:
            cycle = cycles[f]
            path = self.layout.pair_scores_file(cycle, kind, f)
            path.parent.mkdir(parents=True, exist_ok=True)
            np.save(path, np.asarray(scores[f], dtype=np.float32))
            auc = roc_auc(scores[f], self.gold_labels) * 100.0
            records[f"cycle={cycle}/{kind}/{f}"] = {"auc": auc, "pair_scores": str(path)}
            self.state.save()
            on = (f"{len(self.auc_pairs):,} held-out pairs it never saw (inductive)" if held_out
                  else f"{len(self.pair_set):,} pairs it learned from (transductive)")
            say(f"[cycle {cycle}] {f}/{kind}: {self.cfg.pairs.source} ROC AUC {auc:.2f} on the {on}")
            if self.tracker is not None:
                self.tracker.log_metrics({f"pair_auc/{f}/{kind}": auc}, step=cycle)
        ensemble_key = f"{name}/{kind}/ensemble"
        if len(cycles) > 1 and records.get(ensemble_key, {}).get("members") != dict(cycles):
            mean = average_pseudo_labels([np.load(records[f"cycle={c}/{kind}/{f}"]["pair_scores"])
                                          for f, c in cycles.items()])
            records[ensemble_key] = {"auc": roc_auc(mean, self.gold_labels) * 100.0, "members": dict(cycles)}
            self.state.save()

    def _handed_on_scores(self, kind: str, cycle: int, family: str) -> np.ndarray | None:
        """The labels that ``family``'s ``kind`` model of ``cycle`` gave the pairs, if it labelled a stage: the
        bi-encoder of cycle k labels cycle k+1's bi2cross stage, the cross-encoder of cycle k cycle k's cross2bi."""
        labelled_cycle, stage = (cycle + 1, "bi2cross") if kind == "bi" else (cycle, "cross2bi")
        if stage_key(labelled_cycle, stage) not in self.state.labels:
            return None
        directory = self.layout.labels_dir(labelled_cycle, stage)
        frame = read_label_set(directory, columns=[f"score_{family}"])
        if not np.array_equal(frame["pair_id"].to_numpy(), self.pair_set.pair_id):
            raise RuntimeError(f"{directory}: the label set's pair_ids do not match the job's pair set "
                               f"({len(frame)} rows vs {len(self.pair_set)} pairs)")
        return frame[f"score_{family}"].to_numpy(dtype=np.float32)

    # ------------------------------------------------------------------------------------------------------------
    # Model selection

    def select_best(self) -> dict[str, dict[str, Any]]:
        """Best bi- and cross-encoder of each family by the dev set, copied to ``best/<family>/<kind>`` and evaluated.

        Bi-encoder candidates: cycles 0..N, 0 being the start checkpoint (a run that never beats it keeps it, saved as
        the job used it: max length, pooling). Cross-encoder: cycles 1..N (before cycle 1 there is only an untrained
        head; the report compares the best cross-encoder with the start bi-encoder instead). Ties go to the earlier
        cycle. Returns {family: {kind: {"cycle", "best_dev", "model_dir"[, "scores"]}}}.
        """
        import ray

        self.activity = "while selecting the best models"
        best: dict[str, dict[str, Any]] = {f: {} for f in self.families}
        for kind in ("bi", "cross"):
            stage = STAGE_TRAINED_IN[kind]
            for f in self.families:
                candidates = [(self.state.stages[stage_key(c, stage)]["families"][f]["best_dev"], c)
                              for c in range(1, self.cfg.cycles + 1)]
                if kind == "bi":
                    candidates.insert(0, (self.state.data["start_dev"][f], 0))
                dev, cycle = max(candidates, key=lambda item: (item[0], -item[1]))  # ties: the earlier cycle
                if cycle == 0 and not self.layout.model_dir(0, kind, f).is_dir():
                    self._hold(kind, {f: 0})
                    ray.get(self.actors.actor(f, kind).save.remote(str(self.layout.model_dir(0, kind, f))))
                target = copy_directory(self.layout.model_dir(cycle, kind, f), self.layout.best_dir(f, kind))
                best[f][kind] = {"cycle": cycle, "best_dev": dev, "model_dir": str(target)}
            chosen = {f: best[f][kind]["cycle"] for f in self.families}
            if self.cfg.eval.test_cycles != "none":
                # Already evaluated with test_cycles "all" (and cycle 0 always); then only the ensemble is new.
                self.evaluate(kind, chosen, name="best")
                for f in self.families:
                    best[f][kind]["scores"] = self.state.evaluations[f"cycle={chosen[f]}/{kind}/{f}"]["scores"]
            else:
                self.evaluate_pair_auc(kind, chosen, name="best")
        return best
