"""What a Trans-Encoder job reports: `TencReport.publish_results` turns each evaluation the run state records into a
result file (``kind: mutual_tenc``); `TencReport.finish` writes ``summary.json``, logs each family's best bi-encoder
as an MLflow model and prints the verdict lines.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from raydistill.evaluation.results import code_provenance, default_command
from raydistill.runtime.tenc.pairs import pair_sets_of
from raydistill.runtime.tenc.config import STAGE_TRAINED_IN, TEACHER_LABELLER, stage_key
from raydistill.runtime.tenc.actors import say
from raydistill.runtime.tenc.job import TransEncoderJob
from raydistill.runtime.tenc.state import json_default, now

__all__ = ["TencReport"]

log = logging.getLogger(__name__)


class TencReport:
    """The reporting of one `TransEncoderJob` (used inside its ``running()``: it logs to the job's MLflow run)."""

    def __init__(self, job: TransEncoderJob):
        self.job = job
        self.cfg = job.cfg

    # ------------------------------------------------------------------------------------------------------------
    # Result files

    def publish_results(self) -> None:
        """A result file for every evaluation in the run state that has none yet (a new one, an ensemble whose
        members changed, or one whose file is gone), with its scores on MLflow."""
        state = self.job.state
        published = False
        for key, record in state.evaluations.items():
            where, kind, name = key.split("/")
            if "members" in record:  # "<cycle0|cycle<k>|best>/<kind>/ensemble"
                family, cycle, ensemble = "ensemble", record["members"], where
            else:  # "cycle=<k>/<kind>/<family>"
                family, cycle, ensemble = name, int(where[len("cycle="):]), None
            file_name = (f"ensemble-{kind}-{ensemble}.json" if ensemble is not None
                         else f"{family}-{kind}-cycle{cycle}.json")
            path = self.job.results_dir / file_name
            if record.get("result_file") == str(path) and path.is_file():
                continue
            self._write_result(path, family, kind, cycle, record, name=ensemble)
            record["result_file"] = str(path)
            published = True
        if published:
            state.save()

    def _write_result(self, path, family: str, kind: str, cycle, record: dict[str, Any],
                      name: str | None = None) -> None:
        """One result-schema file at ``path``. ``cycle`` is an int, or {family: cycle} for the ensemble ``name``."""
        from raydistill.evaluation import write_result

        job, cfg = self.job, self.cfg
        scores, params_m = record["scores"], record["params_m"]
        training = {
            "transductive": job.pair_set.transductive, "pairs_source": cfg.pairs.source, "pairs": len(job.pair_set),
            "mode": cfg.mode, "init": cfg.init, "label_scaling": cfg.label_scaling,
            "label_weighting": cfg.label_weighting, "teacher": cfg.teacher, "cycles": cfg.cycles,
            "families": {f.name: f.recorded() for f in cfg.families},
            "bi": dataclasses.asdict(cfg.bi), "cross": dataclasses.asdict(cfg.cross), "run_dir": str(job.run_dir),
        }
        extra: dict[str, Any] = {"run_name": job.run_name}
        if family == "ensemble":
            members: dict[str, int] = cycle
            model = "ensemble(" + "+".join(job.model_name(f, kind) for f in members) + ")"
            model_dir = None
            extra.update(family="ensemble", members={f: {"cycle": c, "model_dir": job.trained_model(c, kind, f)}
                                                     for f, c in members.items()})
            pair_auc = self._pair_auc_extra(f"{name}/{kind}/ensemble")
            training["cycle"] = next(iter(members.values())) if len(set(members.values())) == 1 else None
        else:
            model = job.model_name(family, kind)
            model_dir = job.trained_model(cycle, kind, family)
            extra.update(family=family, cycle=cycle)
            pair_auc = self._pair_auc_extra(f"cycle={cycle}/{kind}/{family}")
            training["cycle"] = cycle
            stage = STAGE_TRAINED_IN[kind]
            stage_info = job.state.stages.get(stage_key(cycle, stage), {}).get("families", {}).get(family, {})
            if stage_info:
                training.update(steps=stage_info.get("steps"), best_step=stage_info.get("best_step"),
                                stage_best_dev=round(float(stage_info.get("best_dev")), 2),
                                stage_wall_s=round(float(stage_info.get("wall_s", 0)), 1))
        if pair_auc is not None:
            extra["pair_auc"] = pair_auc
        fields = {
            "kind": "mutual_tenc", "method": cfg.method, "model": model, "encoder": kind, "teacher": None,
            "params_m": round(float(params_m), 3), "scores": {k: round(float(v), 2) for k, v in scores.items()},
            "extra": extra, "training": training, "wall_s": round(time.perf_counter() - job.started, 1),
        }
        if job.tracker is not None and job.tracker.run_id:
            fields["mlflow_run_id"] = job.tracker.run_id
        if model_dir:
            fields["model_dir"] = model_dir
        write_result(path, **fields)
        step = cycle if isinstance(cycle, int) else max(cycle.values())
        self._track_eval(family, kind, step, scores, name)

    def _pair_auc_extra(self, key: str) -> dict[str, Any] | None:
        """``extra.pair_auc`` of a result file: the AUC recorded under ``key`` and what it was measured on."""
        record = self.job.state.data.get("pair_auc", {}).get(key)
        if record is None:
            return None
        return {"auc": round(float(record["auc"]), 2), **self._auc_pairs_record(),
                "metric": "ROC AUC x 100 of the pair scores (bi: cosine; cross: mean sigmoid over both orders) "
                          f"against the gold 0/1 labels of {self._auc_pairs_words()}"}

    def _auc_pairs_record(self) -> dict[str, Any]:
        """What the AUCs were measured on: the source, its sets, how many pairs, and whether the models learned
        from them (transductive) or never saw them (``held_out``: the other half of a split)."""
        held_out = self.job.auc_pairs is not self.job.pair_set
        return {"source": self.cfg.pairs.source, "sets": list(pair_sets_of(self.cfg.pairs.source)),
                "pairs": len(self.job.auc_pairs), "transductive": not held_out, "held_out": held_out,
                "labels_used_for_training": False}

    def _auc_pairs_words(self) -> str:
        if self.job.auc_pairs is self.job.pair_set:
            return f"the {len(self.job.pair_set):,} pairs the job learned from, unlabeled (transductive)"
        return (f"{len(self.job.auc_pairs):,} held-out pairs of the other half of the split, which share no sentence "
                f"with the {len(self.job.pair_set):,} pairs learned from (inductive)")

    def _track_eval(self, family: str, kind: str, step: int, scores: dict[str, float], name: str | None) -> None:
        tracker = self.job.tracker
        if tracker is None:
            return
        metrics = {f"sts/{set_name}": value for set_name, value in scores.items()}
        if family == "ensemble":
            if name == "best":  # the best models may come from different cycles: not a point of the per-cycle curve
                tracker.log_metrics({f"ensemble_best/{kind}/{k}": v for k, v in metrics.items()})
            else:
                tracker.log_metrics({f"ensemble/{kind}/{k}": v for k, v in metrics.items()}, step=step)
        else:
            self.job.child(family, kind).log_metrics(metrics, step=step)

    # ------------------------------------------------------------------------------------------------------------
    # The end of a run

    def drop_stale_results(self) -> list[str]:
        """Remove the result files in the run's results directory that no evaluation of this run wrote: files of an
        earlier run of the same name in another run dir (a checkout's committed results, a copied directory), which
        would otherwise stand beside this run's as if they were its models. Returns their names; says so."""
        written = {record.get("result_file") for record in self.job.state.evaluations.values()}
        stale = sorted(path.name for pattern in ("*-cycle*.json", "ensemble-*.json")
                       for path in self.job.results_dir.glob(pattern) if str(path) not in written)
        for name in stale:
            (self.job.results_dir / name).unlink()
        if stale:
            say(f"removed {len(stale)} result file(s) of {self.job.results_dir} that no evaluation of this run wrote "
                f"(an earlier run of the same name elsewhere): {', '.join(stale)}")
        return stale

    def stopped(self, key: str) -> dict[str, Any]:
        """A run stopped after stage ``key`` (``stop_after_stage``): what it did so far, no selection."""
        say(f"stopping after {key} as configured (stop_after_stage)")
        return {"stopped_after": key, "run_dir": str(self.job.run_dir), "state": self.job.state.data}

    def finish(self, best: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """The summary of a completed run (``summary.json``, also beside the result files), its last MLflow
        metrics and plot, and the verdict lines; returns the summary."""
        job, cfg = self.job, self.cfg
        by_family = self.outcome(best)
        dev_set = cfg.eval.dev_set
        curves = job.state.dev_curves(job.families, cfg.cycles)
        summary = {
            "run_name": job.run_name, "run_dir": str(job.run_dir), "results_dir": str(job.results_dir),
            "mode": cfg.mode, "families": job.families, "pairs": len(job.pair_set),
            "pairs_source": cfg.pairs.source,
            "transductive": job.pair_set.transductive, "cycles": cfg.cycles, "init": cfg.init,
            "teacher": job.state.data.get(TEACHER_LABELLER),  # model, dev, fingerprint (null: no teacher)
            "best": best, "by_family": by_family,
            "score_unit": "7-STS average: Spearman x 100 of the model's similarity against gold on STS12-16, STS-B "
                          f"test and SICK-R test, averaged; *_{dev_set}: Spearman x 100 on {dev_set}",
            "selection": {"dev_set": dev_set,
                          "bi_candidates": f"cycles 0..{cfg.cycles} (0 = the starting checkpoint)",
                          "cross_candidates": f"cycles 1..{cfg.cycles} (no cross-encoder exists before cycle "
                                              "1; the best one is compared with the starting bi-encoder)",
                          "ties": "the earlier cycle"},
            "pair_classification": self.pair_classification_note(),
            "stage_wall_s": {k: round(v["wall_s"], 1) for k, v in job.state.stages.items()},
            # <family>: {bi: {cycle: dev}, cross: {cycle: dev}}: the start (bi cycle 0) and every trained model
            f"{dev_set}_by_cycle": {f: {kind: {str(c): round(d, 2) for c, d in curves.get((f, kind), [])}
                                        for kind in ("bi", "cross")} for f in job.families},
            "wall_s": round(time.perf_counter() - job.started, 1),  # this invocation
            # every invocation that worked on the run dir (a run extended to more cycles counts its first part)
            "wall_s_total": job.state.wall_s_total,
            "invocations": [dict(i) for i in job.state.data.get("invocations", [])],
            "mlflow_run_id": job.tracker.run_id if job.tracker else None,
            # What reproduces it: the command, the code and the whole config (a screen with no result files, as
            # eval.test_cycles none makes, is known by this file alone).
            "command": default_command(), **code_provenance(), "date": now(), "config": cfg.to_dict(),
        }
        summary_path = job.layout.summary_file
        from raydistill.fileio import atomic_write_bytes, atomic_write_json

        atomic_write_json(summary_path, summary, default=json_default)
        job.results_dir.mkdir(parents=True, exist_ok=True)
        self.drop_stale_results()
        atomic_write_bytes(job.results_dir / "summary.json", summary_path.read_bytes())
        self._track_finish(best, by_family, summary_path)
        say("best models (by STS-B dev): " + "; ".join(
            f"{f}/{kind} cycle {b['cycle']} dev {b['best_dev']:.2f}"
            + (f" 7-STS {b['scores']['avg']:.2f}" if "avg" in b.get("scores", {}) else "")
            for f, kinds in best.items() for kind, b in kinds.items()))
        total = "" if summary["wall_s_total"] <= summary["wall_s"] + 1 else \
            f" ({summary['wall_s_total']:.0f} s over {len(summary['invocations'])} invocations of this run)"
        say(f"done in {summary['wall_s']:.0f} s{total}; results in {job.results_dir}")
        for line in self.verdict_lines(by_family):
            say(line)
        return summary

    def _track_finish(self, best: dict[str, dict[str, Any]], by_family: dict[str, dict[str, Any]],
                      summary_path) -> None:
        from raydistill.evaluation.plots import plot_dev_by_cycle

        job, dev_set = self.job, self.cfg.eval.dev_set
        job.tracker.log_artifact(summary_path)
        job.tracker.log_artifact(job.state.path)
        for f in job.families:
            for kind in ("bi", "cross"):
                job.tracker.log_metrics({f"best/{f}/{kind}/stsb_dev": best[f][kind]["best_dev"],
                                         f"best/{f}/{kind}/cycle": best[f][kind]["cycle"]})
            job.tracker.log_metrics({f"improved/{f}": int(by_family[f]["improved"])})
        job.log_dev_curves()
        try:
            png = plot_dev_by_cycle(job.state.dev_curves(job.families, self.cfg.cycles),
                                    job.layout.plots_dir / "dev_by_cycle.png", dev_set,
                                    title=f"{self.cfg.mode}: best {dev_set} of each stage, per cycle")
            job.tracker.log_artifact(png, "plots")
        except Exception as exc:  # noqa: BLE001 - a plot must never stop a run
            log.warning("dev-by-cycle plot failed: %s", exc)
        self._log_models(best)

    def _log_models(self, best: dict[str, dict[str, Any]]) -> None:
        """Each family's best bi-encoder (by dev, as selected) as the MLflow model ``<family>-bi`` of the job's run;
        with ``tracking.register_model``, the one with the best dev score of all families (ties: the first family)
        is registered under that name."""
        from raydistill.runtime.engine.model_logging import log_job_model

        job = self.job
        register = self.cfg.tracking.register_model
        chosen = max(job.families, key=lambda f: best[f]["bi"]["best_dev"])
        for f in job.families:
            bi = best[f]["bi"]
            log_job_model(job.tracker, bi["model_dir"], register if f == chosen else None, step=bi["cycle"],
                          tags={"method": self.cfg.method, "family": f, "encoder": "bi", "cycle": bi["cycle"],
                                f"{self.cfg.eval.dev_set}": round(float(bi["best_dev"]), 2)},
                          prefix="[tenc]", name=f"{f}-bi")

    def outcome(self, best: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """Per family: the start's and the best models' 7-STS averages (null, with the reason, without test
        evaluation), their cycles and dev scores, whether training improved on the start and, with qqp / mrpc pairs,
        the AUCs. Scores rounded to 2 decimals, as in the result files, and compared as rounded."""
        state = self.job.state
        dev_set = self.cfg.eval.dev_set
        tested = self.cfg.eval.test_cycles != "none"
        start_dev = state.data["start_dev"]
        auc = state.data.get("pair_auc", {})
        outcome: dict[str, dict[str, Any]] = {}

        def avg(scores: dict[str, float]) -> float | None:
            return round(float(scores["avg"]), 2) if tested and "avg" in scores else None

        for f in self.job.families:
            bi, cross = best[f]["bi"], best[f]["cross"]
            start_scores = state.evaluations.get(f"cycle=0/bi/{f}", {}).get("scores", {})
            row: dict[str, Any] = {
                "start_bi": avg(start_scores), "best_bi": avg(bi.get("scores", {})),
                "best_cross": avg(cross.get("scores", {})),
                "start_bi_cycle": 0, "best_bi_cycle": bi["cycle"], "best_cross_cycle": cross["cycle"],
                f"start_bi_{dev_set}": round(float(start_dev[f]), 2),
                f"best_bi_{dev_set}": round(float(bi["best_dev"]), 2),
                f"best_cross_{dev_set}": round(float(cross["best_dev"]), 2),
            }
            if row["start_bi"] is not None and row["best_bi"] is not None and row["best_cross"] is not None:
                row["improved"] = bi["cycle"] > 0 and row["best_bi"] > row["start_bi"]
                row["improved_on"] = "7-STS average of the best-dev bi-encoder against the start's"
                row["cross_beats_start_bi"] = row["best_cross"] > row["start_bi"]
            else:
                # A trained cycle is selected only when its dev score beats the start's (ties keep the start).
                row["improved"] = bi["cycle"] > 0
                row["improved_on"] = f"{dev_set} (no 7-STS scores)"
                row["cross_beats_start_bi"] = row[f"best_cross_{dev_set}"] > row[f"start_bi_{dev_set}"]
                row["scores_missing"] = ("eval.test_cycles is none: no model was evaluated on the 7 STS sets, so "
                                         "start_bi, best_bi and best_cross are null; rerun the same command with "
                                         "--set eval.test_cycles=best to evaluate (completed stages are reused)")
            if self.job.gold_labels is not None:
                row["start_bi_auc"] = _rounded(auc.get(f"cycle=0/bi/{f}", {}).get("auc"))
                row["best_bi_auc"] = _rounded(auc.get(f"cycle={bi['cycle']}/bi/{f}", {}).get("auc"))
                row["best_cross_auc"] = _rounded(auc.get(f"cycle={cross['cycle']}/cross/{f}", {}).get("auc"))
            outcome[f] = row
        return outcome

    def pair_classification_note(self) -> dict[str, Any] | None:
        """What the AUCs of a qqp / mrpc run were measured on, for the summary (None for the STS sources)."""
        gold = self.job.gold_labels
        if gold is None:
            return None
        return {**self._auc_pairs_record(), "positives": int(gold.sum()),
                "metric": "ROC AUC x 100 of each model's pair scores (bi: cosine; cross: mean sigmoid over both "
                          f"orders) against the gold 0/1 labels of {self._auc_pairs_words()}",
                "selection": f"{self.cfg.eval.dev_set}, apart from these pairs and their labels"}

    def verdict_lines(self, by_family: dict[str, dict[str, Any]]) -> list[str]:
        """The job's last words: per family and encoder, the start, the best (cycle) and whether training improved
        on the start; 7-STS averages, or dev scores when there was no test evaluation."""
        dev_set = self.cfg.eval.dev_set
        lines = []
        for f, row in by_family.items():
            on_dev = row["start_bi"] is None or row["best_bi"] is None or row["best_cross"] is None
            start, best_bi, best_cross = ((row[f"start_bi_{dev_set}"], row[f"best_bi_{dev_set}"],
                                           row[f"best_cross_{dev_set}"]) if on_dev
                                          else (row["start_bi"], row["best_bi"], row["best_cross"]))
            unit = f" ({dev_set}; eval.test_cycles none, so no 7-STS)" if on_dev else ""
            if row["improved"]:
                verdict = f"training improved on the start ({best_bi - start:+.2f})"
            else:
                verdict = "training did NOT improve on the start"
                if row["best_bi_cycle"] > 0:  # dev chose a trained cycle whose 7-STS is not above the start's
                    verdict += (f" ({dev_set} rose {row[f'start_bi_{dev_set}']:.2f} -> "
                                f"{row[f'best_bi_{dev_set}']:.2f}, which selected cycle {row['best_bi_cycle']})")
            lines.append(f"{f} bi{unit}: start {start:.2f}, best {best_bi:.2f} (cycle {row['best_bi_cycle']}) "
                         f"— {verdict}")
            beats = "beats" if row["cross_beats_start_bi"] else "does NOT beat"
            lines.append(f"{f} cross{unit}: start bi {start:.2f}, best {best_cross:.2f} "
                         f"(cycle {row['best_cross_cycle']}) — the best cross-encoder {beats} the start bi-encoder")
            if "start_bi_auc" in row:
                lines.append(f"{f} {self.cfg.pairs.source} ROC AUC (on {self._auc_pairs_words()}): start bi "
                             f"{_fmt(row['start_bi_auc'])}, best bi "
                             f"{_fmt(row['best_bi_auc'])} (cycle {row['best_bi_cycle']}), best cross "
                             f"{_fmt(row['best_cross_auc'])} (cycle {row['best_cross_cycle']})")
        return lines


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(float(value), 2)


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"
