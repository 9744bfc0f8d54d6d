"""MLflow tracking that can never stop a training run.

A distillation run is hours of CPU; its tracking is a convenience. So every MLflow call goes through one guard. A
transient error (a locked sqlite store; a server that dropped the connection, timed out or answered 429/5xx) is
retried with back-off (``_RETRY_DELAYS_S``), each retry logged. An error that persists, or one that retrying cannot
fix (unwritable sqlite file, bad URI, rejected value), logs **one** warning naming the URI and the error, and the
Tracker turns into a no-op for the rest of the run; the metric values it then drops are counted, and ``end`` logs how
many were lost. The result JSON and checkpoints remain the record of truth.

URIs: ``cfg.tracking_uri`` if set, else ``$MLFLOW_TRACKING_URI``, else ``sqlite:///<cwd>/mlflow.db`` as an absolute
path (Ray Tune trials chdir into their own directory, so a relative default would scatter databases; docs/runtime.md).
A sqlite store's artifacts go next to the database (``<db dir>/mlartifacts``). An ``http(s)://`` server is probed
once with a short timeout first, so a dead server costs seconds instead of MLflow's retries at every call.

``MlflowClient`` rather than the fluent API: no process-global active run, so parent and child runs (the stages of
DistilCSE, Trans-Encoder cycles) can be open at once without interfering.
"""

from __future__ import annotations

import logging
import math
import os
import re
import time
from pathlib import Path
from typing import Any, Mapping

from raydistill.config.job import TrackingConfig
from raydistill.nested import flatten

__all__ = ["Tracker", "resolve_tracking_uri", "flatten_params", "EXPERIMENT_KIND_TAG", "TRAINING_EXPERIMENT_KIND",
           "training_runs_url"]

log = logging.getLogger(__name__)

_MAX_PARAM_VALUE = 6000  # MLflow 3 limit
_PARAMS_PER_BATCH = 100
_METRICS_PER_BATCH = 1000
_PROBE_TIMEOUT_S = 5.0
# Waits before the 2nd, 3rd and 4th attempt of a call that failed with a transient error; a store locked longer than
# this (plus the store's own wait per attempt) is a broken store for this run.
_RETRY_DELAYS_S = (0.5, 1.0, 2.0)
_TRANSIENT = re.compile(r"database is locked|database table is locked|\bbusy\b|temporarily unavailable|"
                        r"TEMPORARILY_UNAVAILABLE|connection (?:reset|aborted|refused)|remote ?disconnected|"
                        r"timed? ?out|\b(?:429|502|503|504)\b|too many requests|bad gateway|service unavailable",
                        re.IGNORECASE)


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it wraps) is one that the same call may not hit a moment later."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (ConnectionError, TimeoutError)) or _TRANSIENT.search(str(exc)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False

# MLflow 3's UI opens an experiment of unknown kind on its GenAI pages, where a training run does not appear. This tag
# is how the UI records "Model training", so raydistill's experiments carry it (an existing one without a kind gets
# it). MLflow 3.17's landing page no longer reads it: only ``training_runs_url``'s parameter opens the runs table.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
TRAINING_EXPERIMENT_KIND = "custom_model_development"


def training_runs_url(ui_url: str, experiment_id: str) -> str:
    """The MLflow UI page of an experiment's training runs (the "Model training" view), whatever view the browser
    last used."""
    return f"{ui_url.rstrip('/')}/#/experiments/{experiment_id}?workflowType=machine_learning"


#: In a job's run dir: the MLflow store and run it logs into, so that a resumed job continues the same run.
RUN_RECORD = "mlflow-run.json"


def _recorded_run_id(record: Path, tracking_uri: str) -> str | None:
    import json

    try:
        recorded = json.loads(record.read_text())
    except (OSError, ValueError):
        return None
    return recorded.get("run_id") if recorded.get("tracking_uri") == tracking_uri else None


def resolve_tracking_uri(configured: str | None = None) -> str:
    uri = configured or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlflow.db"
    if uri.startswith("sqlite:///"):
        path = uri[len("sqlite:///"):]
        if path and path != ":memory:" and not os.path.isabs(path):
            uri = "sqlite:///" + str(Path(path).expanduser().resolve())
    elif "://" not in uri:  # a bare path: MLflow's file store, resolved like sqlite
        uri = str(Path(uri).expanduser().resolve())
    return uri


def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested dicts -> dotted keys with string values (MLflow params are flat strings of a bounded length)."""
    flat: dict[str, str] = {}
    for name, value in flatten(params, prefix).items():
        text = "" if value is None else str(value)
        flat[name] = text if len(text) <= _MAX_PARAM_VALUE else text[: _MAX_PARAM_VALUE - 3] + "..."
    return flat


class Tracker:
    """One MLflow run. Safe to use when tracking is disabled or broken: every method is then a no-op.

        with Tracker(cfg.tracking, run_name="congen-bert-tiny") as tracker:
            tracker.log_params(cfg.to_dict())
            tracker.log_metrics({"loss": 0.7}, step=10)
            child = tracker.child("stage-2")          # nested run (mlflow.parentRunId tag)
    """

    def __init__(self, cfg: TrackingConfig | None = None, run_name: str | None = None,
                 parent_run_id: str | None = None, nested: bool = False, tags: Mapping[str, Any] | None = None,
                 run_id: str | None = None, run_dir: str | os.PathLike | None = None):
        # run_id: continue that existing run (a resumed sweep's parent, a restarted Tune trial) instead of
        # creating one; it is marked RUNNING again and ``tags`` are added to it. ``run_dir``: a job's run dir; the
        # run its earlier attempt logged into in this store (``RUN_RECORD``) is continued, a new one recorded.
        self.cfg = cfg or TrackingConfig()
        self._resume_run_id = run_id
        self.run_name = run_name or self.cfg.run_name
        self.parent_run_id = parent_run_id
        self.nested = nested or parent_run_id is not None
        self.tracking_uri = resolve_tracking_uri(self.cfg.tracking_uri)
        self._run_record = Path(run_dir) / RUN_RECORD if run_dir is not None else None
        if run_id is None and self._run_record is not None:
            self._resume_run_id = _recorded_run_id(self._run_record, self.tracking_uri)
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self.failed_reason: str | None = None
        self.retries = 0  # transient errors retried (each one is logged)
        self.lost_metrics = 0  # metric values not logged because tracking had failed
        self._client = None
        self._ended = False
        self._logged_params: dict[str, str] = {}  # a resumed run's params (MLflow refuses to change one)
        self.continued = False  # the run existed before this tracker (a resumed job's, a restored trial's)
        if not self.cfg.enabled:
            return
        self._guard("start run", self._start, tags or {})

    # ------------------------------------------------------------------------------------------------------------

    @property
    def active(self) -> bool:
        return self.run_id is not None and self.failed_reason is None and not self._ended

    def _start(self, tags: Mapping[str, Any]) -> None:
        self._probe_server()
        self._probe_sqlite()
        from mlflow import MlflowClient

        import raydistill

        client = MlflowClient(tracking_uri=self.tracking_uri)
        run = self._run_to_continue(client)
        if run is not None:
            client.update_run(run.info.run_id, status="RUNNING")
            if tags:
                from mlflow.entities import RunTag

                client.log_batch(run.info.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()],
                                 synchronous=True)
            self._client, self.run_id, self.experiment_id = client, run.info.run_id, run.info.experiment_id
            self._logged_params = dict(run.data.params)
            self.continued = True
            return
        experiment = client.get_experiment_by_name(self.cfg.experiment)
        if experiment is None:
            self.experiment_id = client.create_experiment(self.cfg.experiment,
                                                          artifact_location=self._artifact_location(),
                                                          tags={EXPERIMENT_KIND_TAG: TRAINING_EXPERIMENT_KIND})
        else:
            self.experiment_id = experiment.experiment_id
            if EXPERIMENT_KIND_TAG not in (experiment.tags or {}):  # created before raydistill set it, or by hand
                client.set_experiment_tag(self.experiment_id, EXPERIMENT_KIND_TAG, TRAINING_EXPERIMENT_KIND)
        run_tags = {"raydistill.version": raydistill.__version__} | {k: str(v) for k, v in tags.items()}
        if self.parent_run_id:
            run_tags["mlflow.parentRunId"] = self.parent_run_id
        run = client.create_run(self.experiment_id, run_name=self.run_name, tags=run_tags)
        self._client, self.run_id = client, run.info.run_id
        if self._run_record is not None:
            from raydistill.fileio import atomic_write_json

            atomic_write_json(self._run_record, {"tracking_uri": self.tracking_uri, "run_id": self.run_id})

    def _run_to_continue(self, client):
        """The run to continue: the one asked for, or the run dir's recorded one if the store still has it."""
        if not self._resume_run_id:
            return None
        if self._run_record is None:
            return client.get_run(self._resume_run_id)
        from mlflow.exceptions import MlflowException

        try:
            run = client.get_run(self._resume_run_id)
        except MlflowException:  # the store lost it (deleted by hand): a new run
            return None
        return None if run.info.lifecycle_stage == "deleted" else run

    def _artifact_location(self) -> str | None:
        if self.tracking_uri.startswith("sqlite:///"):
            db = Path(self.tracking_uri[len("sqlite:///"):])
            return (db.parent / "mlartifacts").as_uri()
        return None  # a file store or a server decides where its artifacts go

    def _probe_sqlite(self) -> None:
        # MLflow retries an unopenable sqlite file with back-off for ~100 s (measured); sqlite3 itself says at once.
        if not self.tracking_uri.startswith("sqlite:///"):
            return
        import sqlite3

        db = Path(self.tracking_uri[len("sqlite:///"):])
        db.parent.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(db, timeout=_PROBE_TIMEOUT_S)
        try:
            connection.execute("PRAGMA schema_version").fetchone()
        finally:
            connection.close()

    def _probe_server(self) -> None:
        if not self.tracking_uri.startswith(("http://", "https://")):
            return
        import urllib.error
        import urllib.request

        url = self.tracking_uri.rstrip("/") + "/health"
        try:
            urllib.request.urlopen(url, timeout=_PROBE_TIMEOUT_S).close()
        except urllib.error.HTTPError:
            pass  # the server answered (some deployments have no /health); it is reachable
        except (urllib.error.URLError, OSError) as exc:
            raise ConnectionError(f"MLflow server not reachable at {url}: {exc}") from exc

    def _guard(self, what: str, fn, *args, lost: int = 0, disables: bool = True, **kwargs) -> Any:
        """``fn(*args, **kwargs)``, retried on transient errors; None after a failure (``lost``: the metric values
        that a failure drops). ``disables=False``: a failure warns (naming the URI and the error) and tracking
        stays on, for a call whose failure says nothing about the store (a model MLflow cannot save)."""
        if self.failed_reason is not None:
            self.lost_metrics += lost
            return None
        for attempt, delay in enumerate((*_RETRY_DELAYS_S, None), start=1):
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - tracking must never stop training
                if delay is not None and is_transient(exc):
                    self.retries += 1
                    log.warning("MLflow %s at %s failed (attempt %d of %d, %s); retrying in %.1fs", what,
                                self.tracking_uri, attempt, len(_RETRY_DELAYS_S) + 1, _first_line(exc), delay)
                    time.sleep(delay)
                    continue
                if not disables:
                    log.warning("MLflow %s failed at %s: %s", what, self.tracking_uri, _first_line(exc))
                    return None
                self.failed_reason = f"{type(exc).__name__}: {exc}"
                self.lost_metrics += lost
                tries = f" after {attempt} attempts" if attempt > 1 else ""
                log.warning("MLflow tracking disabled for this run (%s failed at %s%s): %s; training continues, "
                            "%d metric value(s) lost so far, later ones are counted and reported when the run ends",
                            what, self.tracking_uri, tries, _first_line(exc), self.lost_metrics)
                return None
        return None

    # ------------------------------------------------------------------------------------------------------------
    # Logging

    def logged_steps(self, key: str) -> set[int]:
        """The steps at which this run already holds metric ``key`` (a continued run's earlier points)."""
        if not self.active or not self.continued:
            return set()
        history = self._guard("read metric history", self._client.get_metric_history, self.run_id, key,
                              disables=False)
        return {int(metric.step) for metric in history or ()}

    def log_params(self, params: Mapping[str, Any]) -> None:
        if not self.active:
            return
        from mlflow.entities import Param

        flat = flatten_params(params)
        # A resumed run that goes on with other values (a PBT trial continuing another trial's checkpoint): MLflow
        # params are write-once and a changed one fails the whole batch, so the first values stay and the new ones
        # become tags.
        changed = {k: v for k, v in flat.items() if k in self._logged_params and self._logged_params[k] != v}
        if changed:
            self.set_tags({f"raydistill.changed_param.{k}": v for k, v in changed.items()})
        items = [Param(k, v) for k, v in flat.items() if k not in changed]

        def send():
            for i in range(0, len(items), _PARAMS_PER_BATCH):
                self._client.log_batch(self.run_id, params=items[i:i + _PARAMS_PER_BATCH], synchronous=True)

        self._guard("log_params", send)
        self._logged_params.update((item.key, item.value) for item in items)

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        if not self.active:
            if self.failed_reason is not None and not self._ended:
                self.lost_metrics += sum(1 for value in metrics.values() if _is_metric(value))
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = []
        for key, value in metrics.items():
            if not _is_metric(value):
                continue  # strings and containers are not metrics
            number = float(value)
            if math.isfinite(number) or math.isnan(number):
                items.append(Metric(key, number, now, int(step or 0)))

        sent = 0

        def send():  # a retry resends only the batches not yet accepted
            nonlocal sent
            while sent < len(items):
                self._client.log_batch(self.run_id, metrics=items[sent:sent + _METRICS_PER_BATCH], synchronous=True)
                sent += _METRICS_PER_BATCH

        if items:
            self._guard("log_metrics", send, lost=len(items))

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        if not self.active:
            return
        from mlflow.entities import RunTag

        self._guard("set_tags", self._client.log_batch, self.run_id,
                    tags=[RunTag(k, str(v)) for k, v in tags.items()], synchronous=True)

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        if not self.active:
            return
        self._guard("log_artifact", self._client.log_artifact, self.run_id, str(path), artifact_path)

    def log_artifacts(self, directory: str | os.PathLike, artifact_path: str | None = None) -> None:
        if not self.active:
            return
        self._guard("log_artifacts", self._client.log_artifacts, self.run_id, str(directory), artifact_path)

    def log_model(self, model_dir: str | os.PathLike, *, name: str = "model", register: str | None = None,
                  step: int = 0, tags: Mapping[str, Any] | None = None):
        """Log ``model_dir`` as an MLflow model of this run (a new version of ``register`` if given) and return its
        ``LoggedStudent``, None when off or failed. A model MLflow cannot log warns and goes in as artifacts
        (``<name>/``); a failed registration warns with the logged model's URI."""
        if not self.active:
            return None
        from raydistill.runtime.engine.model_logging import log_student, register_student

        logged = self._guard(f"log_model {name}", log_student, model_dir, tracking_uri=self.tracking_uri,
                             run_id=self.run_id, name=name, step=step, tags=tags, disables=False)
        if logged is None:
            if self.active:
                self.log_artifacts(model_dir, name)
            return None
        if register:
            registered = self._guard(f"registration of {logged.model_uri} as {register!r}", register_student,
                                     self.tracking_uri, logged, register, disables=False)
            logged = registered or logged
        return logged

    # ------------------------------------------------------------------------------------------------------------
    # Runs

    def child(self, run_name: str, tags: Mapping[str, Any] | None = None) -> "Tracker":
        """A nested run under this one (a disabled Tracker if this one is not active)."""
        if not self.active:
            return Tracker(TrackingConfig(enabled=False), run_name=run_name)
        return Tracker(self.cfg, run_name=run_name, parent_run_id=self.run_id, nested=True, tags=tags)

    def end(self, status: str = "FINISHED") -> None:
        if self._ended:
            return
        if self.active:
            self._guard("end run", self._client.set_terminated, self.run_id, status)
        self._ended = True
        if self.failed_reason is not None and self.lost_metrics:
            log.warning("MLflow tracking of run %s at %s lost %d metric value(s) after it failed (%s); the result "
                        "file and checkpoints hold the run's record", self.run_name, self.tracking_uri,
                        self.lost_metrics, self.failed_reason.splitlines()[0][:200])

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.end("FAILED" if exc_type is not None else "FINISHED")

    def __repr__(self) -> str:
        state = "active" if self.active else ("failed: " + self.failed_reason if self.failed_reason else "inactive")
        return f"Tracker(uri={self.tracking_uri!r}, run_id={self.run_id!r}, {state})"


def _is_metric(value: Any) -> bool:
    return not isinstance(value, bool) and (isinstance(value, (int, float)) or hasattr(value, "__float__"))


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
