"""Add ``training.dev_curve`` ([step, STS-B dev] of every evaluation) to result files written before jobs recorded
it, from the same run's MLflow metric history (``mlflow_run_id`` in the file), and say so in
``training.dev_curve_source``. Files that already have a curve, or whose run is not in the store, are left alone.

    python scripts/dev_curves.py results/mixed/*.json                       # the project's MLflow store
    python scripts/dev_curves.py --tracking-uri sqlite:///mlflow.db FILE...
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


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
        if not isinstance(training, dict) or training.get("dev_curve") or not run_id:
            continue
        try:
            history = client.get_metric_history(run_id, "stsb_dev")
        except MlflowException as exc:
            print(f"{path}: MLflow run {run_id} not readable ({exc}); left alone", file=sys.stderr)
            continue
        if not history:
            print(f"{path}: MLflow run {run_id} has no stsb_dev history; left alone", file=sys.stderr)
            continue
        last_by_step = {int(m.step): round(float(m.value), 2) for m in sorted(history, key=lambda m: m.timestamp)}
        training["dev_curve"] = [[step, dev] for step, dev in sorted(last_by_step.items())]
        training["dev_curve_source"] = f"MLflow run {run_id} (stsb_dev history), added after the run"
        path.write_text(json.dumps(record, indent=2, sort_keys=True, allow_nan=False, ensure_ascii=False) + "\n")
        print(f"{path}: {len(last_by_step)} evaluations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
