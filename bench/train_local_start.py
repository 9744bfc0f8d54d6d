"""What it costs to start a Ray Train run in Train's local mode, in the driver and inside a long-lived actor.

Train's local mode (``ScalingConfig(num_workers=0)``, the engine's ``resources.learner.num_learners: 0``) runs the
train function in the calling process: no placement group, no worker actors, no process group. The Trans-Encoder
job runs each stage that way inside its family's actor (``runtime/tenc/learners.py``), where a one-worker Train run
would cost ``train_run_s`` of bench/train_start.py per stage (19.4 s here, results/bench-train_start.json). This
bench times ``TorchTrainer(...).fit()`` of a train function that only reports once, so the number is pure start and
finish:

    driver_first_fit_s    the first local-mode fit of this process (imports, Train's local controller)
    driver_fit_s          a later one (median)
    actor_first_fit_s     the first local-mode fit inside a ``ray.remote`` actor with a ``control`` concurrency group,
                          as the Trans-Encoder job's learner actors are (its methods run in a thread of the actor)
    actor_fit_s           a later one there (median)
    main_job_stages_s     12 x actor_first_fit_s: an upper bound for the main job's 12 stages (each actor pays the
                          first fit once; later stages pay actor_fit_s)

    python bench/train_local_start.py --rounds 5 --write results/bench-train_local_start.json
"""

from __future__ import annotations

import argparse
import tempfile
import time

import common  # noqa: F401  (environment before torch)

from common import load_average, median, write_record


def _report_once(config):
    import ray.train

    ray.train.report({"done": 1})


def local_fit_times(rounds: int) -> list[float]:
    """Seconds of ``rounds`` + 1 local-mode fits in this process, the first one first."""
    import logging
    import os

    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    # Local mode logs every report at INFO; the engine quiets it the same way (learner_group._fit_local).
    logging.getLogger("ray.train.v2._internal.execution.train_fn_utils").setLevel(logging.WARNING)
    os.environ.setdefault("RAY_CHDIR_TO_TRIAL_DIR", "0")
    storage = tempfile.mkdtemp(prefix="train-local-start-")
    seconds = []
    for i in range(rounds + 1):
        started = time.perf_counter()
        TorchTrainer(_report_once, scaling_config=ScalingConfig(num_workers=0),
                     run_config=RunConfig(name=f"fit-{i}", storage_path=storage)).fit()
        seconds.append(time.perf_counter() - started)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="timed fits after the first one")
    parser.add_argument("--write", default=None, help="result file (default: print only)")
    args = parser.parse_args()

    import ray

    load_before = load_average()
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    print("ray started", flush=True)

    @ray.remote(num_cpus=0, concurrency_groups={"control": 1})
    class Learner:
        def fit_times(self, rounds: int) -> list[float]:
            return local_fit_times(rounds)

    try:
        driver = local_fit_times(args.rounds)
        actor = Learner.remote()
        in_actor = ray.get(actor.fit_times.remote(args.rounds))
        ray.kill(actor)
    finally:
        ray.shutdown()
    record = {
        "driver_first_fit_s": round(driver[0], 4), "driver_fit_s": round(median(driver[1:]), 5),
        "actor_first_fit_s": round(in_actor[0], 4), "actor_fit_s": round(median(in_actor[1:]), 5),
        "rounds": args.rounds, "driver_samples_s": [round(s, 5) for s in driver],
        "actor_samples_s": [round(s, 5) for s in in_actor],
        "main_job_stages": 12, "main_job_stages_s": round(12 * in_actor[0], 2),
    }
    for key, value in record.items():
        print(f"{key}: {value}")
    write_record(args.write, record, threads=2, load_before=load_before)


if __name__ == "__main__":
    main()
