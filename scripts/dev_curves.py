"""Add ``training.dev_curve`` ([step, STS-B dev] of every evaluation) to result files written before jobs recorded
it, from the MLflow metric history of the run (``mlflow_run_id`` in the file) and of its earlier attempts (a resumed
job logs to a new MLflow run), and say so in ``training.dev_curve_source``. Files whose job wrote the curve, or
whose run is not in the store, are left alone.

    python scripts/dev_curves.py results/mixed/*.json                       # the project's MLflow store
    python scripts/dev_curves.py --tracking-uri sqlite:///mlflow.db FILE...
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def attempts(client, run_id: str, config_hash: str | None) -> list:
    """The MLflow runs of every attempt of the result's run, oldest first: the run itself and the earlier runs with
    its name and config hash in its experiment (a resumed job logs to a new MLflow run)."""
    run = client.get_run(run_id)
    found = client.search_runs([run.info.experiment_id],
                               filter_string=f"attributes.run_name = '{run.info.run_name}'", max_results=1000)
    same = [r for r in found if r.info.run_id == run_id or (
        config_hash is not None and r.data.params.get("config_hash") == config_hash
        and r.info.start_time < run.info.start_time)]
    return sorted(same, key=lambda r: r.info.start_time)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--tracking-uri", default=f"sqlite:///{Path(__file__).resolve().parents[1] / 'mlflow.db'}")
    args = parser.parse_args()
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient(tracking_uri=args.tracking_uri)
    for path in args.files:
        record = json.loads(path.read_text())
        training = record.get("training")
        run_id = record.get("mlflow_run_id")
        # A curve the job wrote is kept; one this script added is made again (the store may know more now).
        if not isinstance(training, dict) or not run_id or (
                training.get("dev_curve") and not training.get("dev_curve_source")):
            continue
        try:
            runs = attempts(client, run_id, training.get("config_hash"))
        except MlflowException as exc:
            print(f"{path}: MLflow run {run_id} not readable ({exc}); left alone", file=sys.stderr)
            continue
        dev_by_step: dict[int, float] = {}
        for run in runs:  # oldest attempt first: a later attempt's evaluation of the same step wins
            for metric in sorted(client.get_metric_history(run.info.run_id, "stsb_dev"), key=lambda m: m.timestamp):
                dev_by_step[int(metric.step)] = round(float(metric.value), 2)
        best_step, best_dev = training.get("best_step"), training.get("best_stsb_dev")
        # The model the run kept, whichever attempt logged it; a multi-stage run's best_step counts its last stage's
        # steps only, so it is not a point of the curve.
        if best_step is not None and best_dev is not None and len(training.get("stages") or []) <= 1:
            dev_by_step.setdefault(int(best_step), round(float(best_dev), 2))
        if not dev_by_step:
            print(f"{path}: MLflow run {run_id} has no stsb_dev history; left alone", file=sys.stderr)
            continue
        training["dev_curve"] = [[step, dev] for step, dev in sorted(dev_by_step.items())]
        ids = ", ".join(run.info.run_id for run in runs)
        training["dev_curve_source"] = (f"stsb_dev history of MLflow run(s) {ids} (this run and its earlier attempts in "
                                        "the same run dir), added after the run")
        path.write_text(json.dumps(record, indent=2, sort_keys=True, allow_nan=False, ensure_ascii=False) + "\n")
        print(f"{path}: {len(dev_by_step)} evaluations from {len(runs)} MLflow run(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
