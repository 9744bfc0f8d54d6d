"""The training engine: the one Ray Train loop and what every training run needs around it.

    train_loop.py     the Train worker's loop: NaN agreement, best-dev selection, checkpoints, progress
    batches.py        which batches each worker trains on, and where a resume continues
    events.py         rank 0's events to the driver and its stop request back (EventRelay, LocalEvents)
    learner.py        DistillLearner: one model, its optimizer and schedule, a train step
    learner_state.py  the learner's mix-in: dev evaluation, best model, checkpoint state and RNG
    learner_group.py  LearnerGroup: 0 learners = in process, N = a Ray Train worker group
    checkpoint.py     verified checkpoints: atomic writes, manifests, loading, the config check
    resume.py         where a run keeps its checkpoints, and whether this config may resume them
    rundir.py         the run directory's lock, and output directories checked before anything starts
    reporting.py      where the loop's reports and checkpoints go: Ray Train by default (a Tune trial plugs in its own)
    tracking.py       MLflow runs, with retries
    cluster.py        ray.init, resource checks, the driver node
    preflight.py      every check that needs files or models, before Ray starts
    stopping.py       SIGTERM/SIGINT: stop at the next step boundary, or raise JobStopped
"""
