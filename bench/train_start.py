"""What it costs to start a Ray Train run on this machine, beside a plain actor, in one Ray session.

A training stage that runs as its own Ray Train run (``TorchTrainer.fit``) pays a start and a finish: a placement
group, worker actors, the torch process group, the result and checkpoint bookkeeping. A stage that runs inside a
long-lived ``ray.remote`` actor pays one method call. This bench times both with a train function that does nothing
but report once, so the difference is pure overhead:

    train_run_s          one ``TorchTrainer(num_workers=W).fit()`` whose train function reports one metric
    train_run_2w_s       the same with two workers (data parallel on this box)
    two_runs_at_once_s   two one-worker runs started together (two Trans-Encoder families training a stage at
                         once), until both have finished
    actor_start_s        create a ``ray.remote`` actor, one call, kill it
    actor_call_s         one call to a live actor
    train_run_over_actor_start   train_run_s / actor_start_s

A job of S stages pays about S x train_run_s more as Train runs than as calls to live actors: the main job has
12 stages (2 families x 3 cycles x bi and cross), so 12 x train_run_s against its 2,006 s if the families' runs
started one after the other, and 6 x two_runs_at_once_s when each stage starts both families' runs together.

    python bench/train_start.py --write results/bench-train_start.json
"""

from __future__ import annotations

import argparse
import tempfile

import common  # noqa: F401  (environment before torch)

from common import load_average, median, timed, write_record


def _report_once(config):
    import ray.train

    ray.train.report({"done": 1})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--write", default=None, help="result file (default: print only)")
    args = parser.parse_args()

    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    load_before = load_average()
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    print("ray started", flush=True)
    storage = tempfile.mkdtemp(prefix="train-start-")

    def train_run(workers: int) -> None:
        trainer = TorchTrainer(_report_once, scaling_config=ScalingConfig(num_workers=workers, use_gpu=False,
                                                                           resources_per_worker={"CPU": 1}),
                               run_config=RunConfig(storage_path=storage))
        trainer.fit()

    @ray.remote(num_cpus=1)
    class Stage:
        def ping(self) -> int:
            return 1

    def actor_start() -> None:
        actor = Stage.remote()
        ray.get(actor.ping.remote())
        ray.kill(actor)

    # Holds no CPU, so the two-worker Train run still gets both of this Ray's CPUs.
    live = Stage.options(num_cpus=0).remote()
    ray.get(live.ping.remote())
    def two_at_once() -> None:
        import threading

        runs = [threading.Thread(target=train_run, args=(1,)) for _ in range(2)]
        for run in runs:
            run.start()
        for run in runs:
            run.join()

    try:
        one = timed(lambda: train_run(1), args.rounds)
        together = timed(two_at_once, args.rounds)
        two = timed(lambda: train_run(2), args.rounds)
        start = timed(actor_start, args.rounds)
        call = timed(lambda: ray.get(live.ping.remote()), args.rounds * 4)
    finally:
        ray.shutdown()
    record = {
        "train_run_s": round(median(one), 3), "train_run_2w_s": round(median(two), 3),
        "actor_start_s": round(median(start), 3), "actor_call_s": round(median(call), 4),
        "train_run_over_actor_start": round(median(one) / median(start), 1),
        "rounds": args.rounds, "train_run_samples_s": [round(s, 3) for s in one],
        "two_runs_at_once_s": round(median(together), 3),
        "main_job_stages": 12, "main_job_extra_s_as_train_runs": round(12 * (median(one) - median(call)), 1),
        "main_job_extra_s_families_at_once": round(6 * (median(together) - median(call)), 1),
    }
    for key, value in record.items():
        print(f"{key}: {value}")
    write_record(args.write, record, threads=2, load_before=load_before)


if __name__ == "__main__":
    main()
