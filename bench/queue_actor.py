"""The shared instance-queue actor's share of a ConGen training step (batch 128, K = 65536).

The same ``DistillLearner`` step as bench/train_step.py (ConGen, congen.yaml at batch 128, teacher
``mpnet-base`` vectors from the job's cache), run two ways, alternately, in one process:

    local    the loss owns its queue (one learner, as a laptop job runs)
    shared   the loss reads and writes the queue through a ``QueueClient`` of a ``SharedQueueActor`` (what N
             data-parallel learners use): each step sends its teacher rows and collects every push since its
             version, pipelined with the next step's forward

    queue_actor_share       seconds the learner spends in queue-actor traffic (the ``enqueue`` send and the ``ray.get``
                            of the pending reply, timed inside the client) ÷ the shared step's seconds
    shared_vs_local_step    shared step time ÷ local step time (≈ 1 when the traffic is hidden)

    python bench/queue_actor.py --write results/bench-queue_actor.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import common  # noqa: F401  (environment before torch)

from common import add_congen_step_arguments, load_average, median, set_threads, write_record
from train_step import TEACHER, RaydistillTrainer, congen_config, teacher_vectors, training_columns


class ClientClock:
    """Wall seconds inside the queue client's Ray traffic, summed (wraps the mixin's two call sites)."""

    def __init__(self):
        from raydistill.methods.shared_queue import _QueueClientMixin

        self.seconds = 0.0
        clock = self
        for name in ("_get", "enqueue"):
            original = getattr(_QueueClientMixin, name)

            def timed(client, *args, _original=original, **kwargs):
                if client.actor is None:
                    return _original(client, *args, **kwargs)
                started = time.perf_counter()
                try:
                    return _original(client, *args, **kwargs)
                finally:
                    clock.seconds += time.perf_counter() - started

            setattr(_QueueClientMixin, name, timed)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_congen_step_arguments(parser)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--teacher-vectors", choices=("cached", "random"), default="cached")
    parser.add_argument("--write", type=Path, default=None, help="e.g. results/bench-queue_actor.json")
    args = parser.parse_args(argv)
    set_threads(args.threads)
    load_before = load_average()
    started = time.perf_counter()

    import ray

    from raydistill.methods import get_method
    from raydistill.methods.hooks import make_shared_actors

    ray.init(num_cpus=args.threads, include_dashboard=False, logging_level="ERROR")
    clock = ClientClock()
    work = Path(tempfile.mkdtemp(prefix="bench-queue-actor-"))
    try:
        cfg = congen_config(args.student, args, work / "local", precision=args.precision)
        columns = training_columns(cfg)
        vectors, teacher_info = teacher_vectors(cfg, list(columns["text_control"]), args.teacher_vectors)
        columns["teacher_control"] = vectors
        dim = vectors.shape[1]
        local = RaydistillTrainer(cfg, columns, args.threads)
        shared_actors = make_shared_actors(get_method(cfg.method), cfg, teacher_dim=dim)
        shared = RaydistillTrainer(cfg, columns, args.threads, shared_actors=shared_actors)
        steps: dict[str, list[float]] = {"local": [], "shared": []}
        traffic: list[float] = []
        for round_index in range(args.rounds):
            steps["local"].extend(local.run(args.warmup + args.steps)[args.warmup:])
            shared.run(args.warmup)
            before = clock.seconds
            seconds = shared.run(args.steps)
            steps["shared"].extend(seconds)
            traffic.append((clock.seconds - before) / args.steps)
            print(f"  round {round_index + 1}: local {median(steps['local'][-args.steps:]):.2f} s, shared "
                  f"{median(seconds):.2f} s, queue traffic {traffic[-1] * 1e3:.1f} ms/step (load {load_average()})",
                  flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        ray.shutdown()

    local_s, shared_s, traffic_s = median(steps["local"]), median(steps["shared"]), median(traffic)
    record = {
        "bench": "queue_actor",
        "student": args.student, "teacher": TEACHER, "batch": args.batch, "queue_size": args.queue_size,
        "queue_dim": int(dim), "threads": args.threads, "precision": args.precision,
        "steps_timed": args.steps * args.rounds, "teacher_vectors": teacher_info,
        "local_step_s": round(local_s, 3),
        "shared_step_s": round(shared_s, 3),
        "queue_traffic_ms_per_step": round(traffic_s * 1e3, 2),
        "queue_actor_share": round(traffic_s / shared_s, 4),
        "shared_vs_local_step": round(shared_s / local_s, 3),
        "step_s_all": {name: [round(x, 3) for x in values] for name, values in steps.items()},
        "wall_s": round(time.perf_counter() - started, 1),
    }
    record = write_record(args.write, record, threads=args.threads, load_before=load_before)
    print(json.dumps({k: record[k] for k in ("local_step_s", "shared_step_s", "queue_traffic_ms_per_step",
                                             "queue_actor_share", "shared_vs_local_step")}))
    return record


if __name__ == "__main__":
    main()
