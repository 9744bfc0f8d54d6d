"""One Trans-Encoder cycle with one model family vs two families side by side, at equal CPU per family.

A Trans-Encoder cycle (raydistill/runtime/tenc/job.py) is: the bi-encoders label the pairs → the labels are exchanged
(the driver averages them over families and writes the stage's Parquet label set; each learner reads its rows back
through Ray Data) → the cross-encoders learn them and relabel → exchange → the bi-encoders learn them. Each family's
bi- and cross-encoder are Ray actors with one torch thread; families compute at the same time and meet only at the
exchanges.

The bench runs the job of mutual_tenc.yaml for ONE cycle on a small pair set (``--pairs``), once with one
family (``mode: self``) and once with two families of the same model (``mode: mutual``; equal work per family, so the
ideal is the same wall time), each family on one core (1 thread per actor; the machine has 2):

    mutual_parallel_efficiency  T(one family) ÷ T(two families); 1.0 = the second family is free
    exchange_share              the label exchanges as a share of the two-family cycle: the driver's average +
                                Parquet write (``_record_labels``) plus, per stage, the slowest family's read of its
                                rows back in its learner (``training_rows``, at the start of ``fit``); the families
                                wait for both, so it is pure overhead

The bench runs the job's own steps (``running``, ``start``, ``run_stage``, as ``tenc.run_trans_encoder`` does, minus
model selection and the report) in a subclass of ``TransEncoderJob`` that times them, with learner subclasses that
add their read time to the stage summary. The clock starts once every actor process is up (actor start-up is
reported separately) and stops when the cycle's last stage is done; Ray is started before either run. No test-set
evaluation (``eval.test_cycles: none``); each stage still selects its best checkpoint on STS-B dev, which is part
of the cycle.

    python bench/mutual.py                                  # prints the summary and the JSON
    python bench/mutual.py --write results/bench-mutual.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import common  # noqa: F401  (environment before torch)

import yaml

from common import RESULTS, load_average, write_record

from raydistill.shipped import shipped_config  # noqa: E402

CONFIG = shipped_config("mutual_tenc")


def tenc_config(families: list[str], model: str, args, run_dir: Path):
    """mutual_tenc.yaml for one cycle on ``args.pairs`` pairs, ``families`` copies of ``model``."""
    from raydistill.runtime.tenc import TencConfig

    data = yaml.safe_load(CONFIG.read_text())
    data.update(mode="mutual" if len(families) > 1 else "self", cycles=1, run_dir=str(run_dir),
                results_dir=str(run_dir / "results"),
                families=[{"name": name, "bi": model} for name in families])
    data["pairs"]["max_pairs"] = args.pairs
    data["eval"]["test_cycles"] = "none"
    for kind in ("bi", "cross"):
        if args.max_steps:
            data[kind]["max_steps"] = args.max_steps
    data["tracking"] = {"enabled": False}
    return TencConfig.from_dict(data, source=str(CONFIG)).validate()


def read_timed(learner):
    """``learner`` (a tenc_learners class) whose ``fit`` summary also says how long reading its rows took."""

    class ReadTimed(learner):
        def training_rows(self, labels_dir, target_column):
            started = time.perf_counter()
            rows = super().training_rows(labels_dir, target_column)
            self.read_s = time.perf_counter() - started
            return rows

        def fit(self, *args, **kwargs):
            return {**super().fit(*args, **kwargs), "read_s": self.read_s}

    return ReadTimed


def timed_cycle(cfg) -> dict:
    """Run ``cfg`` (one cycle) with the job's steps timed; returns seconds per phase."""
    from unittest import mock

    import ray

    from raydistill.runtime.tenc import learners as tenc_learners
    from raydistill.runtime.tenc.job import TransEncoderJob

    timings: dict = {"write_s": 0.0, "exchanges": 0, "stages": {}}

    class TimedJob(TransEncoderJob):
        def start(self):
            started = time.perf_counter()
            ray.get([actor.__ray_ready__.remote() for actor in self.actors.actors.values()])
            timings["actor_start_s"] = time.perf_counter() - started
            timings["cycle_started"] = time.perf_counter()
            super().start()
            timings["first_labels_s"] = time.perf_counter() - timings["cycle_started"]

        def run_stage(self, cycle, stage):
            started = time.perf_counter()
            super().run_stage(cycle, stage)
            timings["stages"][stage] = time.perf_counter() - started
            timings["cycle_ended"] = time.perf_counter()

        def _record_labels(self, cycle, stage, per_family, weights=None):
            started = time.perf_counter()
            super()._record_labels(cycle, stage, per_family, weights)
            timings["write_s"] += time.perf_counter() - started
            timings["exchanges"] += 1

    job = TimedJob(cfg)
    # FamilyActors takes the learner classes from tenc_learners when it makes the actors.
    with mock.patch.multiple(tenc_learners, BiEncoderLearner=read_timed(tenc_learners.BiEncoderLearner),
                             CrossEncoderLearner=read_timed(tenc_learners.CrossEncoderLearner)), job.running():
        job.start()
        for cycle, stage in job.stages():
            job.run_stage(cycle, stage)
    # Families read side by side: a stage waits for the slowest one.
    read_s = sum(max(f["read_s"] for f in s["families"].values()) for s in job.state.stages.values())
    cycle = timings.pop("cycle_ended") - timings.pop("cycle_started")
    return {"cycle_s": round(cycle, 2), "actor_start_s": round(timings["actor_start_s"], 2),
            "first_labels_s": round(timings["first_labels_s"], 2),
            "stage_s": {k: round(v, 2) for k, v in timings["stages"].items()},
            "exchange_s": round(timings["write_s"] + read_s, 3), "exchange_write_s": round(timings["write_s"], 3),
            "exchange_read_s": round(read_s, 3), "exchanges": timings["exchanges"]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="minilm-l3", help="the model of every family")
    parser.add_argument("--pairs", type=int, default=400)
    parser.add_argument("--max-steps", type=int, default=None, help="cap per stage (quick checks)")
    parser.add_argument("--write", type=Path, default=None, help=f"e.g. {RESULTS.name}/bench-mutual.json")
    args = parser.parse_args(argv)
    load_before = load_average()

    import ray

    from raydistill.runtime.engine.cluster import init_ray

    work = Path(tempfile.mkdtemp(prefix="bench-mutual-"))
    runs = {}
    try:
        one = tenc_config([args.model], args.model, args, work / "one")
        init_ray(None, num_cpus=one.resources.num_cpus)
        runs["one_family"] = timed_cycle(one)
        print(f"one family: cycle {runs['one_family']['cycle_s']:.1f} s (load {load_average()})", flush=True)
        two = tenc_config([args.model, f"{args.model}-b"], args.model, args, work / "two")
        runs["two_families"] = timed_cycle(two)
        print(f"two families: cycle {runs['two_families']['cycle_s']:.1f} s (load {load_average()})", flush=True)
    finally:
        if ray.is_initialized():
            ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)

    single, double = runs["one_family"], runs["two_families"]
    result = {
        "bench": "mutual",
        "mutual_parallel_efficiency": round(single["cycle_s"] / double["cycle_s"], 3),
        "exchange_share": round(double["exchange_s"] / double["cycle_s"], 4),
        "exchange_share_one_family": round(single["exchange_s"] / single["cycle_s"], 4),
        "model": args.model, "pairs": args.pairs, "cycles": 1, "threads_per_actor": two.resources.bi.threads,
        "cpus": two.resources.num_cpus, "runs": runs,
    }
    print(f"parallel efficiency {result['mutual_parallel_efficiency']:.2f} (1.0 = two families cost one); label "
          f"exchange {double['exchange_s']:.1f} s (write {double['exchange_write_s']:.1f} + read back "
          f"{double['exchange_read_s']:.1f}) = {result['exchange_share']:.1%} of the two-family cycle")
    result = write_record(args.write, result, threads=1, load_before=load_before)
    print(json.dumps({k: result[k] for k in ("mutual_parallel_efficiency", "exchange_share", "load_before",
                                             "load_after")}))
    return result


if __name__ == "__main__":
    main()
