"""The Trans-Encoder job's orchestration: cycle 0, each stage with its label exchange, and the job's resources.

`TransEncoderJob` holds one job's resources (`running`: the run dir's lock, the run state, Ray, the MLflow run and
the actors) and does its steps; ``tenc.run_trans_encoder`` calls them in order and has ``report`` publish what
they recorded. Every step reads and writes the run state (``state``), so each one skips what a previous run of
the same config already did. The family actors are ``actors.FamilyActors``; the evaluations and model selection
are ``evaluation.JobEvaluation``, the job's mix-in.

The label exchange: each family's labelling model scores every pair in its actor; the driver averages the scores
and writes the stage's label set once (``labels``), and hands a learner only where its labels are and which column
to learn. A stage is recorded as finished in state.json the moment its learners return, before the next labels.

Stopping (``stopping``): SIGTERM or SIGINT while the learners train asks each learner to stop at the next step
boundary (``request_stop``), which the next run continues from; anywhere else (labelling, evaluation) the job stops
at once. Either way the MLflow runs end KILLED and ``JobStopped`` says what was kept and how to resume.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from raydistill.runtime.engine import cluster
from raydistill.config.job import ConfigError
from raydistill.runtime.tenc.pairs import (PAIR_CLASSIFICATION_SOURCES, PairSet, build_pair_set, gold_pair_labels,
                                         split_held_out)
from raydistill.runtime.tenc.config import (STAGE_LABELS, STAGE_TRAINED_IN, STAGE_TRAINS, STAGES, TEACHER_LABELLER,
                                          TencConfig, stage_key)
from raydistill.runtime.tenc.labels import combine_labels, dev_label_weights, label_stats, write_label_set
from raydistill.runtime.engine.stopping import raise_if_stop_requested
from raydistill.runtime.tenc.actors import FamilyActors, frozen_labels, say
from raydistill.runtime.tenc.evaluation import JobEvaluation
from raydistill.runtime.tenc.state import RunLayout, RunState, now

__all__ = ["TransEncoderJob"]

log = logging.getLogger(__name__)


class TransEncoderJob(JobEvaluation):
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
        self.auc_pairs: PairSet | None = None  # qqp / mrpc: the pairs the AUC is measured on
        self.gold_labels: np.ndarray | None = None  # their 0/1 labels, for the AUC only
        self.state: RunState | None = None
        self.tracker = None
        self.actors: FamilyActors | None = None
        self.pair_set_ref = None  # the pair set in Ray's object store, for the actors and the teacher's task
        self.teacher: dict[str, Any] | None = None  # teacher's labels, dev and fingerprint, once computed
        self.children: dict[tuple[str, str], Any] = {}
        self.step_offsets: dict[tuple[str, str], int] = {}
        self.dev_points_logged: set[tuple[str, str, int]] = set()  # (family, kind, cycle) on the parent run
        self.activity = "while starting"  # what the job does now: what a stop interrupted

    # ------------------------------------------------------------------------------------------------------------
    # Models

    def start_checkpoint(self, kind: str, family: str) -> str:
        from raydistill.models import resolve_model

        return str(resolve_model(self.model_name(family, kind)))

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

        The pair set is built (a one-class qqp / mrpc sample refused) before anything is written, and the lock taken
        before the run state is read or Ray started: two jobs on one run dir would overwrite each other's stages.
        """
        import ray

        from raydistill.runtime.engine.rundir import RunDirLock
        from raydistill.runtime.engine.stopping import JobStopped, StopOnSignals
        from raydistill.runtime.engine.tracking import Tracker

        cfg = self.cfg
        stop = StopOnSignals("tenc")
        pair_set = self.pair_set = self._build_pair_set()
        lock = RunDirLock(self.run_dir).acquire(report=say)
        restore_data_context, status = None, "FAILED"
        try:
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
            self.tracker = Tracker(cfg.tracking, run_name=self.run_name, run_dir=self.run_dir,
                                   tags={"method": cfg.method, "run_dir": str(self.run_dir),
                                         "resumed": str(bool(done)).lower()})
            self.tracker.log_params(self._params())
            cluster.warn_if_outputs_are_ephemeral({"run dir": self.run_dir, "results dir": self.results_dir,
                                                   "MLflow store": self.tracker.tracking_uri or ""})
            self.pair_set_ref = ray.put(pair_set)
            self.actors = FamilyActors(cfg, self.pair_set_ref, poolings)
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
        from raydistill.runtime.engine.stopping import JobStopped, signal_name

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
        """The pairs the job learns from; with qqp / mrpc also the pairs the AUC is measured on (``auc_pairs``: the
        same pairs, or the held-out half's) and their gold labels, kept in the driver: the actors get the label-free
        pair set only."""
        cfg = self.cfg
        if cfg.pairs.held_out is not None:
            pair_set, self.auc_pairs = split_held_out(cfg.pairs.source, cfg.pairs.held_out, cfg.pairs.max_pairs,
                                                      cfg.pairs_seed())
        else:
            pair_set = build_pair_set(cfg.pairs.source, cfg.pairs.max_pairs, cfg.pairs_seed())
            if pair_set.source in PAIR_CLASSIFICATION_SOURCES:
                self.auc_pairs = pair_set
        if self.auc_pairs is not None:
            self.gold_labels = gold_pair_labels(self.auc_pairs)
            if len(np.unique(self.gold_labels)) < 2:  # found now, before anything is written
                raise ConfigError(f"pairs: the {len(self.auc_pairs)} {pair_set.source} pairs sampled for the AUC "
                                  "hold one class only, and the ROC AUC needs both; raise pairs.max_pairs (or "
                                  "pairs.held_out) or change pairs.seed")
        return pair_set

    def _poolings(self) -> dict[str, str | None]:
        """Each family's bi-encoder pooling, fixed once: a saved cross-encoder carries none, so a sequential bi
        stage that starts from one must be told the family's pooling."""
        from raydistill.models.bi_encoder import read_sentence_transformers_layout

        poolings = {}
        for f in self.cfg.families:
            layout = None if f.pooling else read_sentence_transformers_layout(Path(self.start_checkpoint("bi", f.name)))
            poolings[f.name] = f.pooling or (layout.pooling if layout is not None else "mean")
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
            # record: which run the model belongs to (a damaged state.json is rebuilt from these, ``state``).
            fit_refs.append(actors.actor(f, kind).fit.remote(
                labels_dir, target_column, cycle=cycle, stage=stage, out_dir=str(out_dir),
                train_dir=str(self.layout.training_dir(cycle, kind, f)),
                record={"config_hash": self.cfg.config_hash(), "pairs_fingerprint": self.pair_set.fingerprint}))
            actors.holding[(f, kind)] = str(out_dir)  # fit leaves the best model in memory
        # The next stage's labels come from the models just trained: queue them on the same actors, so each family
        # labels as soon as its own training ends; the exchange (average, Parquet) waits for all of them.
        label_next = next_cycle <= self.cfg.cycles
        label_refs = [actors.actor(f, kind).predict_pairs.remote() for f in self.families] if label_next else []
        # Asked after predict_pairs, so each is the fingerprint of the model that labelled (an actor runs in order).
        labeller_refs = [actors.actor(f, kind).fingerprint.remote() for f in self.families] if label_next else []
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
            self._record_labels(next_cycle, next_stage, dict(zip(self.families, ray.get(label_refs))),
                                labellers=dict(zip(self.families, ray.get(labeller_refs))),
                                dev={f: float(summaries[f]["best_dev"]) for f in self.families})

    def _wait_for_fits(self, cycle: int, stage: str, fit_refs: list) -> dict[str, dict[str, Any]]:
        """Every family's fit summary. A SIGTERM / SIGINT meanwhile asks the learners to stop at their next step
        boundary and save their position; the stage then ends the job with ``JobStopped``."""
        import ray

        from raydistill.runtime.engine.stopping import JobStopped, signal_name, step_boundaries, stop_requested

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
                                  f"{self.layout.training_dir(cycle, kind, '<family>')}/checkpoints")
        return summaries

    # ------------------------------------------------------------------------------------------------------------
    # Label exchange

    def _label(self, cycle: int, stage: str) -> None:
        """Every family's labelling model of ``stage`` labels the pairs; the label set goes to Parquet."""
        import ray

        kind = STAGE_LABELS[stage]
        labeller_cycle = cycle - 1 if stage == "bi2cross" else cycle
        self._hold(kind, dict.fromkeys(self.families, labeller_cycle))
        say(f"[{stage_key(cycle, stage)}] labelling the pairs with the {kind}-encoders of cycle {labeller_cycle}")
        labels = ray.get([self.actors.actor(f, kind).predict_pairs.remote() for f in self.families])
        labellers = ray.get([self.actors.actor(f, kind).fingerprint.remote() for f in self.families])
        self._record_labels(cycle, stage, dict(zip(self.families, labels)),
                            labellers=dict(zip(self.families, labellers)),
                            dev=self._labeller_dev(labeller_cycle, kind) if self._weights_by_dev() else None)

    def _weights_by_dev(self) -> bool:
        return self.cfg.mode == "mutual" and self.cfg.label_weighting == "dev"

    def _teacher_labels(self) -> dict[str, Any] | None:
        """``teacher``'s labels of the pairs, its dev score and weight fingerprint (None without a teacher):
        computed once per run by ``frozen_labels`` and kept in the run dir, so a resumed run reads them back."""
        if self.cfg.teacher is None:
            return None
        if self.teacher is None:
            from raydistill.fileio import atomic_writer
            from raydistill.models import resolve_model

            path, recorded = self.layout.teacher_labels_file(), self.state.data.get(TEACHER_LABELLER)
            if recorded is not None and path.is_file():
                self.teacher = {**recorded, "scores": np.load(path)}
            else:
                say(f"the teacher {self.cfg.teacher} labels the {len(self.pair_set):,} pairs (once per run)")
                computed = frozen_labels(self.cfg, self.pair_set_ref, str(resolve_model(self.cfg.teacher)))
                path.parent.mkdir(parents=True, exist_ok=True)
                with atomic_writer(path) as out:
                    np.save(out, np.asarray(computed["scores"], dtype=np.float32))
                recorded = {"model": self.cfg.teacher, "dev": computed["dev"], "fingerprint": computed["fingerprint"]}
                self.state.data[TEACHER_LABELLER] = recorded
                self.state.save()
                say(f"the teacher's {self.cfg.eval.dev_set}: {computed['dev']:.2f}")
                self.teacher = {**recorded, "scores": computed["scores"]}
        return self.teacher

    def _labeller_dev(self, labeller_cycle: int, kind: str) -> dict[str, float]:
        """Each family's dev score of its ``kind`` model of ``labeller_cycle``: the starting bi-encoder's at cycle 0,
        else the best dev of the stage that trained it (the model the stage handed on)."""
        if labeller_cycle == 0:
            self._measure_start_dev()
            return {f: float(self.state.data["start_dev"][f]) for f in self.families}
        trained_in = self.state.stages[stage_key(labeller_cycle, STAGE_TRAINED_IN[kind])]
        return {f: float(trained_in["families"][f]["best_dev"]) for f in self.families}

    def _record_labels(self, cycle: int, stage: str, per_family: dict[str, np.ndarray], *,
                       labellers: dict[str, str], dev: dict[str, float] | None) -> None:
        """Write a stage's label set: each family's labels, the teacher's with a ``teacher``, and their mean (weighted
        by the labellers' ``dev`` with label_weighting dev), which mutual mode trains on. The state records each
        labelling model's weight fingerprint (``labellers``): which models taught each stage."""
        per_family = {f: per_family[f] for f in self.families}
        labellers = {f: labellers[f] for f in self.families}
        teacher = self._teacher_labels()
        if teacher is not None:
            per_family[TEACHER_LABELLER] = teacher["scores"]
            labellers[TEACHER_LABELLER] = teacher["fingerprint"]
            dev = None if dev is None else {**dev, TEACHER_LABELLER: teacher["dev"]}
        key = stage_key(cycle, stage)
        weights = None
        if self._weights_by_dev():  # each labeller's weight in the mean label, from its labelling model's dev score
            weights = dev_label_weights(dev, self.cfg.label_weight_temperature)
            say(f"[{key}] label weights from {self.cfg.eval.dev_set}: " + ", ".join(
                f"{name} {weights[name]:.3f} (dev {dev[name]:.2f})" for name in dev))
        averaged = combine_labels(per_family, weights)
        directory = self.layout.labels_dir(cycle, stage)
        started = time.perf_counter()
        rows = write_label_set(directory, self.pair_set, per_family, averaged)
        stats = label_stats(per_family, averaged)
        self.state.labels[key] = {"path": str(directory), "rows": rows, "written": now(), **stats,
                                  "labellers": labellers, **({"weights": weights} if weights is not None else {})}
        self.state.save()
        say(f"[{key}] wrote {rows:,} labels to {directory} in {time.perf_counter() - started:.1f} s "
            f"(mean {stats['mean']:.3f}, std {stats['std']:.3f}"
            + (f", family agreement (Spearman) {stats['agreement']:.3f})" if "agreement" in stats else ")"))
        if self.tracker is not None:
            self.tracker.log_metrics({f"labels/{stage}/{k}": v for k, v in stats.items()}, step=cycle)

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
        from raydistill.evaluation.plots import plot_learning_curve

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
        overlays every family's per-cycle dev curve; each point once (a resumed job continues the stopped job's run,
        which may hold some points already)."""
        if self.tracker is None:
            return
        for (f, kind), points in self.state.dev_curves(self.families, self.cfg.cycles).items():
            if not any(logged[:2] == (f, kind) for logged in self.dev_points_logged):
                self.dev_points_logged |= {(f, kind, step) for step in self.tracker.logged_steps(f"dev/{f}/{kind}")}
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
        return params
