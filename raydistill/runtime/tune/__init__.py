"""``raydistill tune``: a Ray Tune search over one method's learning rate, temperatures and queue size for a student.

    raydistill tune --student bert-mini [--method congen] [--teacher mpnet-base] [--num-samples 16] [--time-budget 3h]
    raydistill tune --list
    raydistill tune --resume --student bert-mini            # or --resume --sweep-dir DIR

``plan_sweep`` checks the space file and the base config before Ray starts; ``run_sweep`` has the teacher encode the
corpus once for all trials, runs the trials under ASHA or PBT (metric: the best STS-B dev so far) and exports the
best trial's model and job config. docs/tune.md describes the space files, the sweep directory, resume and MLflow.

Each module imports only the ones listed before it:

    config/sweep.py   SweepSettings: search budget and algorithm, ASHA or PBT, resources per trial; parse_duration
    space.py          search-space files: found, read and checked (SearchSpace, Param, SpaceError)
    plan.py           plan_sweep and SweepPlan (sweep.json): base config + searched values, checked before Ray starts
    trial.py          distill_trial, the Tune trainable, and its trial.json
    reporting.py      how a trial hears its training loop: its reporter and the Train callback (imported in a trial)
    report.py         summary.json, the best trial's export and STS scores, the MLflow runs' final state, the table
    sweep.py          run_sweep / resume_sweep: one driver per sweep (SweepLock), trial concurrency, the shared
                      teacher pass, the Tuner (lost trials retried), the report

This module gathers their public names; the CLI, bench/sweep.py and the tests import them from here.
"""

from __future__ import annotations

from raydistill.runtime.tune.plan import default_sweep_dir, plan_sweep, uses_teacher
from raydistill.runtime.tune.report import format_trials_table
from raydistill.config.sweep import SweepSettings, parse_duration
from raydistill.runtime.tune.space import SpaceError, list_spaces, spaces_dir
from raydistill.runtime.tune.sweep import resume_sweep, run_sweep, trial_concurrency, trial_data_cpus

# A sweep directory written when all of this lived in one module names the Tuner's trial_dirname_creator
# raydistill.runtime.tune._trial_dirname; its --resume loads the function from here.
from raydistill.runtime.tune.sweep import trial_dirname as _trial_dirname  # noqa: F401

__all__ = [
    "SpaceError", "SweepSettings", "spaces_dir", "list_spaces", "parse_duration", "default_sweep_dir", "plan_sweep",
    "run_sweep", "resume_sweep", "format_trials_table", "uses_teacher", "trial_concurrency", "trial_data_cpus",
]
