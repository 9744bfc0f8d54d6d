"""The Trans-Encoder job's orchestration: the family actors, cycle 0, each stage with its label exchange, the
evaluations, and model selection.

`TransEncoderJob` holds one job's resources (`running`: the run dir's lock, the run state, Ray, the MLflow run and
the actors) and does its steps; ``tenc.run_trans_encoder`` calls them in order and has ``tenc_report`` publish what
they recorded. Every step reads and writes the run state (``tenc_state``), so each one skips what a previous run of
the same config already did.

The label exchange: each family's labelling model scores every pair in its actor; the driver averages the scores
and writes the stage's label set once (``tenc_labels``); each learner then reads its own training rows from that
Parquet directory through Ray Data. The driver hands a learner only where its labels are and which column to learn.
A stage is recorded as finished in state.json the moment its learners return, before the next stage's labels.

Stopping (``stopping``): SIGTERM or SIGINT while the learners train asks each learner (``request_stop``, served on
the actors' ``control`` concurrency group while ``fit`` runs) to save its position at the next step boundary
(``tenc_learners.stopped_stage_file``), which the next run continues from; anywhere else (labelling, evaluation)
the job stops at once. Either way the MLflow runs end KILLED and ``JobStopped`` says what was kept and how to resume.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from raydistill.runtime import cluster
from raydistill.runtime.config import ConfigError, RoleResources
from raydistill.runtime.pairs import (
    PAIR_CLASSIFICATION_SOURCES,
    PairSet,
    build_pair_set,
    gold_pair_labels,
)
from raydistill.runtime.tenc_config import (
    STAGE_LABELS,
    STAGE_TRAINED_IN,
    STAGE_TRAINS,
    STAGES,
    STS7,
    TencConfig,
    stage_key,
)
from raydistill.runtime.tenc_labels import (
    combine_labels,
    dev_label_weights,
    label_stats,
    read_label_set,
    write_label_set,
)
from raydistill.runtime.stopping import raise_if_stop_requested
from raydistill.runtime.tenc_state import RunLayout, RunState, now

__all__ = ["FamilyActors", "TransEncoderJob", "say", "scores_from_predictions"]

log = logging.getLogger(__name__)


def say(message: str) -> None:
    """One progress line of the job."""
    print(f"[tenc] {message}", flush=True)


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


class FamilyActors:
    """The bi- and cross-encoder actor of every family, and which model each one holds (so a labeller is reloaded
    only when needed)."""

    def __init__(self, cfg: TencConfig, pair_set_ref, poolings: dict[str, str | None]):
        import ray

        # Imported here, with torch, when actors are made: a config check or --help does not load torch.
        from raydistill.runtime.tenc_learners import (
            BiEncoderLearner,
            CrossEncoderLearner,
        )

        self.actors: dict[tuple[str, str], Any] = {}
        self.holding: dict[tuple[str, str], str | None] = {}
        learner_classes = {"bi": BiEncoderLearner, "cross": CrossEncoderLearner}
        for family in cfg.families:
            for kind in ("bi", "cross"):
                resources: RoleResources = getattr(cfg.resources, kind)
                device = "cuda" if resources.num_gpus > 0 else "cpu"
                # "control": request_stop runs beside a fit in progress (every other method waits its turn).
                actor_class = ray.remote(concurrency_groups={"control": 1})(learner_classes[kind])
                self.actors[(family.name, kind)] = actor_class.options(
                    num_cpus=resources.num_cpus, num_gpus=resources.num_gpus, name=None, max_restarts=0,
                    resources=cfg.resources.families.get(family.name) or None,
                ).remote(
                    family.name, pair_set_ref, dataclasses.asdict(cfg.stage_settings(family, kind)),
                    pooling=poolings.get(family.name), label_scaling=cfg.label_scaling, seed=cfg.seed,
                    threads=resources.threads, device=device, inference_batch_size=resources.batch_size,
                    dev_set=cfg.eval.dev_set, data_task_cpus=cfg.resources.data_task_cpus,
                )
                self.holding[(family.name, kind)] = None

    def actor(self, family: str, kind: str):
        return self.actors[(family, kind)]

    def load(self, family: str, kind: str, checkpoint: str, cycle: int):
        """A ref to (re)load ``checkpoint`` into the actor, seeded for ``cycle``."""
        self.holding[(family, kind)] = str(checkpoint)
        return self.actor(family, kind).load.remote(str(checkpoint), cycle=cycle)

    def ensure_loaded(self, family: str, kind: str, checkpoint: str, cycle: int):
        """A ref to load ``checkpoint`` unless the actor already holds it (None then); for labelling/evaluation."""
        if self.holding[(family, kind)] == str(checkpoint):
            return None
        return self.load(family, kind, checkpoint, cycle)

    def request_stop(self, kind: str) -> None:
        """Ask every family's ``kind`` learner to stop its ``fit`` at the next step boundary."""
        for (family, actor_kind), actor in self.actors.items():
            if actor_kind == kind:
                actor.request_stop.options(concurrency_group="control").remote()

    def kill(self) -> None:
        import ray

        for actor in self.actors.values():
            ray.kill(actor)


class TransEncoderJob:
    """One Trans-Encoder job: `running` holds its resources, `start`, `run_stage` and `select_best` do its work."""

    def __init__(self, cfg: TencConfig):
        self.cfg = cfg.validate()
        self.layout = RunLayout(cfg.resolved_run_dir())
        self.run_dir = self.layout.root
        self.results_dir = cfg.resolved_results_dir()
        self.run_name = cfg.resolved_run_name()
        self.families = [f.name for f in cfg.families]
        self.family_cfg = {f.name: f for f in cfg.families}
        self.started = time.perf_counter()
        self.pair_set: PairSet | None = None
        self.gold_labels: np.ndarray | None = None  # qqp / mrpc: each pair's 0/1 label, for the AUC only
        self.state: RunState | None = None
        self.tracker = None
        self.actors: FamilyActors | None = None
        self.children: dict[tuple[str, str], Any] = {}
        self.step_offsets: dict[tuple[str, str], int] = {}
        self.dev_points_logged: set[tuple[str, str, int]] = set()  # (family, kind, cycle) on the parent run
        self.activity = "while starting"  # what the job does now: what a stop interrupted

    # ------------------------------------------------------------------------------------------------------------
    # Models

    def start_checkpoint(self, kind: str, family: str) -> str:
        from raydistill.models import resolve_model

        f = self.family_cfg[family]
        return str(resolve_model(f.bi if kind == "bi" else f.cross_start))

    def trained_model(self, cycle: int, kind: str, family: str) -> str:
        """The best model of ``kind`` after ``cycle`` (cycle 0 = the start checkpoint)."""
        if cycle == 0:
            return self.start_checkpoint(kind, family)
        return str(self.layout.model_dir(cycle, kind, family))

    def init_checkpoint(self, cycle: int, stage: str, family: str) -> str:
        """Where the model trained in ``stage`` of ``cycle`` starts from (refresh vs sequential)."""
        kind = STAGE_TRAINS[stage]
        if self.cfg.init == "refresh":
            return self.start_checkpoint(kind, family)
        if stage == "bi2cross":  # cross_k from the bi-encoder that labelled its pairs (bi_{k-1}, or the start)
            return self.trained_model(cycle - 1, "bi", family)
        return self.trained_model(cycle, "cross", family)  # bi_k from cross_k's encoder weights

    def model_name(self, family: str, kind: str) -> str:
        """The configured model a family's ``kind`` encoder starts from (what result files call the model)."""
        f = self.family_cfg[family]
        return f.bi if kind == "bi" else f.cross_start

    # ------------------------------------------------------------------------------------------------------------
    # Resources

    @contextlib.contextmanager
    def running(self) -> Iterator[TransEncoderJob]:
        """The job's resources while it runs: the run dir's lock, the run state, Ray, the MLflow run, the actors.

        The pair set is built (and a one-class qqp / mrpc sample refused) before anything is written, and the lock
        is taken before the run state is read or Ray started: two jobs on one run dir would interleave stages and
        overwrite each other's labels and models. On the way out the actors stop, the MLflow runs end (FAILED when
        the body raised), Ray Data's settings are put back and the lock released.
        """
        import ray

        from raydistill.runtime.checkpoint import RunDirLock
        from raydistill.runtime.stopping import JobStopped, StopOnSignals
        from raydistill.runtime.tracking import Tracker

        cfg = self.cfg
        stop = StopOnSignals("tenc")
        self.pair_set = self._build_pair_set()
        lock = RunDirLock(self.run_dir).acquire(report=say)
        restore_data_context = None
        status = "FAILED"
        try:
            pair_set = self.pair_set
            self.state = RunState.open(self.run_dir, cfg, pair_set.fingerprint, len(pair_set),
                                       started=self.started)
            say(f"Trans-Encoder {cfg.mode} distillation: families {', '.join(self.families)}; {len(pair_set):,} "
                f"{cfg.pairs.source} pairs (pool {pair_set.pool_size:,}); {cfg.cycles} cycle(s), init {cfg.init}; "
                f"run dir {self.run_dir}")
            done = list(self.state.stages)
            if done:
                say(f"resuming: {len(done)} completed stage(s) will be skipped ({', '.join(done)})")

            restore_data_context = cluster.init_ray(cfg)
            stop.install()  # after ray.init, whose SIGTERM handler aborts the process; for the rest of the job
            cluster.check_resources(cfg)
            poolings = self._poolings()
            self.tracker = Tracker(cfg.tracking, run_name=self.run_name,
                                   tags={"method": cfg.method, "run_dir": str(self.run_dir),
                                         "resumed": str(bool(done)).lower()})
            self.tracker.log_params(self._params())
            cluster.warn_if_outputs_are_ephemeral({"run dir": self.run_dir, "results dir": self.results_dir,
                                                   "MLflow store": self.tracker.tracking_uri or ""})
            self.actors = FamilyActors(cfg, ray.put(pair_set), poolings)
            yield self
            status = "FINISHED"
        except JobStopped as exc:
            status = "KILLED"  # stopped from outside, not failed: the next run resumes from what was kept
            raise self._stopped(exc) from None
        finally:
            stop.restore()
            if self.actors is not None:
                self.actors.kill()
            for child in self.children.values():
                child.end(status)
            if self.tracker is not None:
                self.tracker.end(status)
            if restore_data_context is not None:
                restore_data_context()
            lock.release()

    def _stopped(self, exc) -> Exception:
        """The stop, saying what was kept and how to resume (printed too)."""
        from raydistill.runtime.stopping import JobStopped, signal_name

        done = list(self.state.stages) if self.state is not None else []
        kept = f"{len(done)} finished stage(s) kept ({', '.join(done)})" if done else "no stage had finished"
        if exc.kept:
            kept += f"; {exc.kept}"
        message = (f"stop requested ({signal_name()}) {exc.where or self.activity}: {kept}. Run the same command "
                   f"with --run-dir {self.run_dir} to resume: finished stages are skipped"
                   + (", the stopped stage continues from its saved step" if exc.kept else "") + ".")
        say(message)
        return JobStopped(message, where=exc.where or self.activity, kept=kept)

    def _build_pair_set(self) -> PairSet:
        cfg = self.cfg
        pair_set = build_pair_set(cfg.pairs.source, cfg.pairs.max_pairs, cfg.pairs_seed())
        if pair_set.source in PAIR_CLASSIFICATION_SOURCES:
            # Kept in the driver for the AUC; the actors get the label-free pair set only.
            self.gold_labels = gold_pair_labels(pair_set)
            if len(np.unique(self.gold_labels)) < 2:  # found now, before anything is written
                raise ConfigError(f"pairs: the {len(pair_set)} {pair_set.source} pairs sampled hold one class "
                                  "only, and the ROC AUC needs both; raise pairs.max_pairs or change pairs.seed")
        return pair_set

    def _poolings(self) -> dict[str, str | None]:
        """Each family's bi-encoder pooling, fixed once: a saved cross-encoder carries none, so a sequential bi
        stage that starts from one must be told the family's pooling."""
        from raydistill.models.bi_encoder import read_sentence_transformers_layout

        poolings = {}
        for f in self.cfg.families:
            if f.pooling:
                poolings[f.name] = f.pooling
                continue
            layout = read_sentence_transformers_layout(Path(self.start_checkpoint("bi", f.name)))
            poolings[f.name] = layout.pooling if layout is not None else "mean"
        return poolings

    # ------------------------------------------------------------------------------------------------------------
    # Cycle 0: the starting bi-encoders label the first pair set and are evaluated as they are

    def start(self) -> None:
        self.activity = "during cycle 0 (labelling, evaluating the starting bi-encoders)"
        key = stage_key(1, "bi2cross")
        if key not in self.state.labels and key not in self.state.stages:
            self._label(1, "bi2cross")
        starts = {f: 0 for f in self.families}
        if self.cfg.eval.test_cycles != "none":
            self.evaluate("bi", starts, name="cycle0")
        else:
            self.evaluate_pair_auc("bi", starts, name="cycle0")
        self._measure_start_dev()
        self.log_dev_curves()

    def _measure_start_dev(self) -> None:
        """The dev score of each starting bi-encoder: the cycle-0 candidate of model selection. Taken from its
        cycle-0 evaluation when there is one, else measured by its actor (as every stage measures its models)."""
        import ray

        start_dev = self.state.data.setdefault("start_dev", {})
        dev_set = self.cfg.eval.dev_set
        for f in self.families:
            scores = self.state.evaluations.get(f"cycle=0/bi/{f}", {}).get("scores", {})
            if f not in start_dev and dev_set in scores:
                start_dev[f] = scores[dev_set]
        todo = [f for f in self.families if f not in start_dev]
        if todo:
            refs = [self.actors.ensure_loaded(f, "bi", self.trained_model(0, "bi", f), 0) for f in todo]
            ray.get([r for r in refs if r is not None])
            for f, score in zip(todo, ray.get([self.actors.actor(f, "bi").dev_score.remote() for f in todo])):
                start_dev[f] = float(score)
        self.state.save()
        say("starting bi-encoders on " + dev_set + ": " + ", ".join(f"{f} {start_dev[f]:.2f}" for f in self.families)
            + " (the cycle-0 candidates of model selection)")

    # ------------------------------------------------------------------------------------------------------------
    # Stages

    def stages(self) -> Iterator[tuple[int, str]]:
        """(cycle, stage) of every stage of the configured cycles, in the order they run."""
        for cycle in range(1, self.cfg.cycles + 1):
            for stage in STAGES:
                yield cycle, stage

    def run_stage(self, cycle: int, stage: str) -> None:
        """Every family's ``kind`` learner trains on the stage's label set (families at the same time), then labels
        the next stage's pairs; with ``eval.test_cycles: all`` the trained models are evaluated."""
        self._train_stage(cycle, stage)
        if self.cfg.eval.test_cycles == "all":  # (skips models a previous run already evaluated)
            self.evaluate(STAGE_TRAINS[stage], {f: cycle for f in self.families}, name=f"cycle{cycle}")

    def _train_stage(self, cycle: int, stage: str) -> None:
        import ray

        key = stage_key(cycle, stage)
        kind = STAGE_TRAINS[stage]
        if key in self.state.stages:
            say(f"[{key}] already complete; reusing its models and labels")
            return
        stage_started = time.perf_counter()
        if key not in self.state.labels:  # a resumed or extended run: the labelling models make them now
            self.activity = f"while labelling the pairs of [{key}]"
            self._label(cycle, stage)
        self.activity = f"while training [{key}]"
        labels_dir = str(self.layout.labels_dir(cycle, stage))
        say(f"[{key}] {', '.join(self.families)} {kind}-encoders learn the "
            f"{'averaged' if self.cfg.mode == 'mutual' else 'own'} {STAGE_LABELS[stage]}-encoder labels, each "
            f"reading its rows from {labels_dir}")

        # This stage's models label the next stage: labels left by an interrupted earlier attempt are stale.
        next_cycle, next_stage = (cycle, "cross2bi") if stage == "bi2cross" else (cycle + 1, "bi2cross")
        if self.state.labels.pop(stage_key(next_cycle, next_stage), None) is not None:
            self.state.save()
        actors = self.actors
        # Always a fresh load, even of the checkpoint the actor holds: the stage's seed draws the new head.
        inits = dict(zip(self.families, ray.get([
            actors.load(f, kind, self.init_checkpoint(cycle, stage, f), cycle) for f in self.families])))
        fit_refs = []
        for f in self.families:
            # Each learner reads its rows from the label set itself; it is told only where and which column.
            target_column = "score" if self.cfg.mode == "mutual" else f"score_{f}"
            out_dir = self.layout.model_dir(cycle, kind, f)
            fit_refs.append(actors.actor(f, kind).fit.remote(labels_dir, target_column, cycle=cycle, stage=stage,
                                                             out_dir=str(out_dir), record=self._stage_record()))
            actors.holding[(f, kind)] = str(out_dir)  # fit leaves the best model in memory
        # The next stage's labels come from the models just trained: queue them on the same actors, so each family
        # labels as soon as its own training ends; the exchange (average, Parquet) waits for all of them.
        label_next = next_cycle <= self.cfg.cycles
        label_refs = [actors.actor(f, kind).predict_pairs.remote() for f in self.families] if label_next else []
        summaries = self._wait_for_fits(cycle, stage, fit_refs)
        for f in self.families:
            summaries[f]["init"] = inits[f]
        # Recorded now, before the next stage's labels: a stop from here on never trains this stage again.
        wall_s = time.perf_counter() - stage_started
        self.state.stages[key] = {
            "completed": now(),
            "wall_s": wall_s,
            "families": {f: {k: v for k, v in s.items() if k != "history"} for f, s in summaries.items()},
        }
        self.state.save()
        say(f"[{key}] complete in {wall_s:.0f} s: "
            + ", ".join(f"{f} {kind} dev {s['best_dev']:.2f} ({s['steps']} steps, {s['wall_s']:.0f} s)"
                        for f, s in summaries.items()))
        self._track_stage(cycle, stage, summaries)
        self.log_dev_curves()
        raise_if_stop_requested(f"after [{key}] finished")  # a stop that came as the learners finished
        if label_refs:
            self.activity = f"while labelling the pairs of [{stage_key(next_cycle, next_stage)}]"
            weights = (self._label_weights(next_cycle, next_stage, {f: float(summaries[f]["best_dev"])
                                                                     for f in self.families})
                       if self._weights_by_dev() else None)
            self._record_labels(next_cycle, next_stage, dict(zip(self.families, ray.get(label_refs))), weights)

    def _stage_record(self) -> dict[str, Any]:
        """What each stage's model directory records besides its summary: which run it belongs to (a damaged
        state.json is rebuilt from these, ``tenc_state``)."""
        return {"config_hash": self.cfg.config_hash(), "pairs_fingerprint": self.pair_set.fingerprint}

    def _wait_for_fits(self, cycle: int, stage: str, fit_refs: list) -> dict[str, dict[str, Any]]:
        """Every family's fit summary. A SIGTERM / SIGINT meanwhile asks the learners to stop at their next step
        boundary and save their position; the stage then ends the job with ``JobStopped``."""
        import ray

        from raydistill.runtime.stopping import JobStopped, signal_name, step_boundaries, stop_requested

        key, kind = stage_key(cycle, stage), STAGE_TRAINS[stage]
        pending, stop_sent = list(fit_refs), False
        with step_boundaries():
            while pending:
                _, pending = ray.wait(pending, num_returns=len(pending), timeout=0.25)
                if stop_requested() and not stop_sent:
                    self.actors.request_stop(kind)
                    stop_sent = True
        summaries = dict(zip(self.families, ray.get(fit_refs)))
        stopped = {f: s for f, s in summaries.items() if s.get("stopped")}
        if stopped:
            where = ", ".join(f"{f} after step {s['steps']}/{s['total_steps']}" for f, s in stopped.items())
            raise JobStopped(f"stop requested ({signal_name()}) while training [{key}]",
                             where=f"while training [{key}]",
                             kept=f"[{key}] stopped at a step boundary ({where}), its position saved in "
                                  f"{self.layout.model_dir(cycle, kind, '<family>')}.stopped.pt")
        return summaries

    # ------------------------------------------------------------------------------------------------------------
    # Label exchange

    def _label(self, cycle: int, stage: str) -> None:
        """Every family's labelling model of ``stage`` labels the pairs; the label set goes to Parquet."""
        import ray

        kind = STAGE_LABELS[stage]
        labeller_cycle = cycle - 1 if stage == "bi2cross" else cycle
        refs = [self.actors.ensure_loaded(f, kind, self.trained_model(labeller_cycle, kind, f), labeller_cycle)
                for f in self.families]
        ray.get([r for r in refs if r is not None])
        say(f"[{stage_key(cycle, stage)}] labelling the pairs with the {kind}-encoders of cycle {labeller_cycle}")
        labels = ray.get([self.actors.actor(f, kind).predict_pairs.remote() for f in self.families])
        weights = (self._label_weights(cycle, stage, self._labeller_dev(labeller_cycle, kind))
                   if self._weights_by_dev() else None)
        self._record_labels(cycle, stage, dict(zip(self.families, labels)), weights)

    def _weights_by_dev(self) -> bool:
        return self.cfg.mode == "mutual" and self.cfg.label_weighting == "dev"

    def _label_weights(self, cycle: int, stage: str, dev: dict[str, float]) -> dict[str, float]:
        """Each family's weight in the stage's mean label, from its labelling model's dev score."""
        weights = dev_label_weights({f: dev[f] for f in self.families}, self.cfg.label_weight_temperature)
        say(f"[{stage_key(cycle, stage)}] label weights from {self.cfg.eval.dev_set}: " + ", ".join(
            f"{f} {weights[f]:.3f} (dev {dev[f]:.2f})" for f in self.families))
        return weights

    def _labeller_dev(self, labeller_cycle: int, kind: str) -> dict[str, float]:
        """Each family's dev score of its ``kind`` model of ``labeller_cycle``: the starting bi-encoder's at cycle 0,
        else the best dev of the stage that trained it (the model the stage handed on)."""
        if labeller_cycle == 0:
            self._measure_start_dev()
            return {f: float(self.state.data["start_dev"][f]) for f in self.families}
        trained_in = self.state.stages[stage_key(labeller_cycle, STAGE_TRAINED_IN[kind])]
        return {f: float(trained_in["families"][f]["best_dev"]) for f in self.families}

    def _record_labels(self, cycle: int, stage: str, per_family: dict[str, np.ndarray],
                       weights: dict[str, float] | None = None) -> None:
        """Write a stage's label set: each family's labels and their mean (weighted by ``weights`` when given),
        which mutual mode trains every family on."""
        per_family = {f: per_family[f] for f in self.families}
        averaged = combine_labels(per_family, weights)
        directory = self.layout.labels_dir(cycle, stage)
        started = time.perf_counter()
        rows = write_label_set(directory, self.pair_set, per_family, averaged,
                               task_cpus=self.cfg.resources.data_task_cpus)
        key = stage_key(cycle, stage)
        stats = label_stats(per_family, averaged)
        self.state.labels[key] = {"path": str(directory), "rows": rows, "written": now(), **stats,
                                  **({"weights": weights} if weights is not None else {})}
        self.state.save()
        say(f"[{key}] wrote {rows:,} labels to {directory} in {time.perf_counter() - started:.1f} s "
            f"(mean {stats['mean']:.3f}, std {stats['std']:.3f}"
            + (f", family agreement (Spearman) {stats['agreement']:.3f})" if "agreement" in stats else ")"))
        if self.tracker is not None:
            self.tracker.log_metrics({f"labels/{stage}/{k}": v for k, v in stats.items()}, step=cycle)

    # ------------------------------------------------------------------------------------------------------------
    # Evaluation: recorded in the run state; tenc_report turns each record into a result file

    def evaluate(self, kind: str, cycles: dict[str, int], name: str) -> None:
        """Test predictions of each family's ``kind`` model of ``cycles[family]`` (families in parallel), and of the
        ensemble of those models (mean of their predictions), recorded as ``name``."""
        import ray

        self.activity = f"while evaluating the {kind}-encoders ({name})"
        self.evaluate_pair_auc(kind, cycles, name)  # before the result files, which carry it
        sets = list(dict.fromkeys(list(self.cfg.eval.test_sets) + [self.cfg.eval.dev_set]))
        todo = [f for f, c in cycles.items() if f"cycle={c}/{kind}/{f}" not in self.state.evaluations]
        if todo:
            refs = [self.actors.ensure_loaded(f, kind, self.trained_model(cycles[f], kind, f), cycles[f])
                    for f in todo]
            ray.get([r for r in refs if r is not None])
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
        ensemble, the mean of their scores) on the job's own pairs against the gold labels. A model's pair scores
        are the labels it handed on when it made some (read from the Parquet), else its actor scores the pairs."""
        import ray

        from raydistill.evaluation import roc_auc
        from raydistill.objectives.trans_encoder import average_pseudo_labels

        if self.gold_labels is None:
            return
        records = self.state.data.setdefault("pair_auc", {})
        todo = [f for f, c in cycles.items() if f"cycle={c}/{kind}/{f}" not in records]
        scores = {f: self._handed_on_scores(kind, cycles[f], f) for f in todo}
        ask = [f for f in todo if scores[f] is None]
        if ask:
            refs = [self.actors.ensure_loaded(f, kind, self.trained_model(cycles[f], kind, f), cycles[f])
                    for f in ask]
            ray.get([r for r in refs if r is not None])
            scores.update(zip(ask, ray.get([self.actors.actor(f, kind).predict_pairs.remote() for f in ask])))
        for f in todo:
            cycle = cycles[f]
            path = self.layout.pair_scores_file(cycle, kind, f)
            path.parent.mkdir(parents=True, exist_ok=True)
            np.save(path, np.asarray(scores[f], dtype=np.float32))
            auc = roc_auc(scores[f], self.gold_labels) * 100.0
            records[f"cycle={cycle}/{kind}/{f}"] = {"auc": auc, "pair_scores": str(path)}
            self.state.save()
            say(f"[cycle {cycle}] {f}/{kind}: {self.cfg.pairs.source} ROC AUC {auc:.2f} on the "
                f"{len(self.pair_set):,} pairs it learned from (transductive)")
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

        Candidates of the bi-encoder: cycles 0..N, cycle 0 being the starting checkpoint (its dev score measured at
        cycle 0), so a run whose training never beats its start keeps the start: ``best/<family>/bi`` is then the
        start checkpoint, saved as the job used it (max length, pooling). Candidates of the cross-encoder: cycles
        1..N. Before cycle 1 there is no cross-encoder, only the checkpoint with a new, untrained head, whose score
        would mean nothing; the report compares the best cross-encoder with the starting bi-encoder instead. Ties go
        to the earlier cycle. Returns {family: {kind: {"cycle", "best_dev", "model_dir"[, "scores"]}}}.
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
                    ref = self.actors.ensure_loaded(f, kind, self.trained_model(0, kind, f), 0)
                    ray.get([r for r in [ref] if r is not None])
                    ray.get(self.actors.actor(f, kind).save.remote(str(self.layout.model_dir(0, kind, f))))
                target = self.layout.best_dir(f, kind)
                tmp = target.with_name(f"{kind}.tmp-{os.getpid()}")
                shutil.rmtree(tmp, ignore_errors=True)
                shutil.copytree(self.layout.model_dir(cycle, kind, f), tmp)
                shutil.rmtree(target, ignore_errors=True)
                os.replace(tmp, target)
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

    # ------------------------------------------------------------------------------------------------------------
    # Tracking: one parent run; a child per family and encoder (stage), metrics per cycle with the cycle as step

    def child(self, family: str, kind: str):
        """The MLflow child run of a family's ``kind`` encoder (started on first use)."""
        if (family, kind) not in self.children:
            stage = STAGE_TRAINED_IN[kind]
            self.children[(family, kind)] = self.tracker.child(
                f"{self.run_name}/{family}/{kind}", tags={"family": family, "encoder": kind, "stage": stage})
            self.children[(family, kind)].log_params({"family": family, "encoder": kind, "stage": stage,
                                                      "model": self.model_name(family, kind)})
        return self.children[(family, kind)]

    def _track_stage(self, cycle: int, stage: str, summaries: dict[str, dict[str, Any]]) -> None:
        from raydistill.runtime.plots import plot_learning_curve

        kind = STAGE_TRAINS[stage]
        for f, s in summaries.items():
            child = self.child(f, kind)
            offset = self.step_offsets.get((f, kind), 0)
            # Every dev evaluation, and the loss at most ~200 times per stage (one MLflow call each).
            loss_rows = [row for row in s["history"] if "loss" in row]
            kept = {id(row) for row in loss_rows[::max(1, len(loss_rows) // 200)] + loss_rows[-1:]}
            for row in s["history"]:
                if "loss" in row and id(row) not in kept:
                    continue
                metrics = {("train/loss" if k == "loss" else "train/stsb_dev"): v
                           for k, v in row.items() if k != "step"}
                child.log_metrics(metrics, step=offset + int(row["step"]))
            self.step_offsets[(f, kind)] = offset + int(s["steps"])
            child.log_metrics({"stsb_dev_best": s["best_dev"], "best_step": s["best_step"], "steps": s["steps"],
                               "stage_wall_s": s["wall_s"]}, step=cycle)
            try:
                png = plot_learning_curve(s["history"], self.layout.plots_dir / f"cycle={cycle}-{stage}-{f}.png",
                                          title=f"cycle {cycle} {stage}: {f} {kind}-encoder")
                child.log_artifact(png, "learning_curves")
            except Exception as exc:  # noqa: BLE001 - a plot must never stop a run
                log.warning("learning-curve plot failed: %s", exc)
        self.tracker.log_metrics({f"stage_wall_s/{stage}": self.state.stages[stage_key(cycle, stage)]["wall_s"]},
                                 step=cycle)

    def log_dev_curves(self) -> None:
        """Parent-run metrics ``dev/<family>/<bi|cross>`` with the cycle as step, so MLflow's chart of the parent
        overlays every family's per-cycle dev curve; each point once per job run (a resumed run logs the stages
        of earlier runs too: it is a new MLflow run)."""
        if self.tracker is None:
            return
        for (f, kind), points in self.state.dev_curves(self.families, self.cfg.cycles).items():
            for cycle, dev in points:
                if (f, kind, cycle) not in self.dev_points_logged:
                    self.tracker.log_metrics({f"dev/{f}/{kind}": dev}, step=cycle)
                    self.dev_points_logged.add((f, kind, cycle))

    def _params(self) -> dict[str, Any]:
        pair_set = self.pair_set
        params = self.cfg.to_dict()
        params["families"] = {f.name: {"bi": f.bi, "cross": f.cross_start, "pooling": f.pooling}
                              for f in self.cfg.families}
        params["pairs"] = dict(params["pairs"], count=len(pair_set), pool_size=pair_set.pool_size,
                               fingerprint=pair_set.fingerprint)
        params["transductive"] = pair_set.transductive
        params["label_scaling"] = self.cfg.label_scaling
        params["label_weighting"] = self.cfg.label_weighting
        return params
