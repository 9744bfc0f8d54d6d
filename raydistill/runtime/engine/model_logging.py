"""A trained student as an MLflow model that a registry can hand over and ``mlflow models serve`` can serve.

    logged = log_student(model_dir, tracking_uri=uri, run_id=run_id)           # -> LoggedStudent
    version = register_student(uri, logged, "my-encoder")                      # -> 1, 2, ...
    log_student(model_dir, tracking_uri=uri, run_id=run_id, register="my-encoder")   # both at once

``model_dir`` is a sentence-transformers directory (what ``BiEncoder.save`` writes). It is logged with MLflow's
sentence-transformers flavor as a model of run ``run_id`` in the store at ``tracking_uri`` (the job's ``Tracker``'s),
with an input example (``EXAMPLE_SENTENCES``), the signature (a list of strings in, a float32 ``[-1, dimension]``
array out) and pinned pip requirements; ``step`` links the run's metrics at that step (the final 7-STS scores) to the
model. With ``register`` it becomes the next version of the registered model of that name. Nothing here guards
against a failing store: ``Tracker.log_model`` does (a failure warns and the job goes on).

Every job logs its best student so at its end (``Tracker.log_model``), registered as the job config's
``tracking.register_model`` (``REGISTER_KNOB``, set by ``--register NAME``; null: log, do not register). The driver
logs, reading the model from the ``run_dir`` it evaluated it from, so a cluster needs nothing more.

Serving the registered model (docs/runtime.md):

    PATH=$PWD/.venv/bin:$PATH MLFLOW_TRACKING_URI=sqlite:///$PWD/mlflow.db mlflow models serve -m models:/NAME/1 --env-manager local -p 5001
    curl -s localhost:5001/invocations -H 'Content-Type: application/json' -d '{"inputs": ["A man plays a guitar."]}'

answers ``{"predictions": [[...], ...]}``: the vectors ``SentenceTransformer(model_dir).encode`` computes.

Cost, kept small because it runs at the end of every job and every whole-job test: the requirements are given, not
inferred (MLflow would load the model in a subprocess, seconds), the model card is not generated (~0.5 s), and the
signature comes from one ``encode`` of the example (bench numbers in docs/runtime.md).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

__all__ = ["REGISTER_KNOB", "EXAMPLE_SENTENCES", "LoggedStudent", "log_student", "register_student",
           "log_job_model", "pip_requirements", "serve_command"]

#: The config field holding the registration name (``--register NAME`` sets it).
REGISTER_KNOB = "tracking.register_model"

# The input example stored with the model (MLflow's UI shows it; ``serving_input_example.json`` is a ready request).
EXAMPLE_SENTENCES = ("A man is playing a guitar.", "A woman is slicing an onion.",
                     "Two dogs run across a snowy field.")

# What the flavor needs at serving time; the versions that trained and logged the model are pinned.
_REQUIREMENTS = ("sentence-transformers", "transformers", "torch")


@dataclass(frozen=True)
class LoggedStudent:
    """A logged model: ``model_uri`` (``models:/<model id>``) loads it anywhere the store is reachable; ``name`` and
    ``version`` are set once it is registered."""

    model_uri: str
    model_id: str
    run_id: str
    dimension: int
    name: str | None = None
    version: int | None = None

    @property
    def registered_uri(self) -> str | None:
        return f"models:/{self.name}/{self.version}" if self.name and self.version is not None else None


def pip_requirements() -> list[str]:
    """``package==version`` of what the sentence-transformers flavor imports, as installed here. A local version
    label (torch's ``+cpu``) is dropped: PyPI has no such file, and MLflow would warn about it at every log."""
    from importlib.metadata import version

    return [f"{name}=={version(name).split('+')[0]}" for name in _REQUIREMENTS]


def serve_command(logged: LoggedStudent, tracking_uri: str) -> str:
    """The command line that serves ``logged`` (its registered version, else the logged model itself), from a fresh
    shell: ``mlflow models serve`` starts ``uvicorn`` by name, so the command puts this interpreter's ``bin`` (the
    environment's, which has both) first on PATH instead of counting on an activated environment."""
    uri = logged.registered_uri or logged.model_uri
    bin_dir = shlex.quote(str(Path(sys.executable).parent))
    return f"PATH={bin_dir}:$PATH MLFLOW_TRACKING_URI={tracking_uri} mlflow models serve -m {uri} --env-manager local"


def log_job_model(tracker, model_dir: str | os.PathLike, register: str | None, *, step: int,
                  tags: Mapping[str, Any], prefix: str, name: str = "model") -> LoggedStudent | None:
    """A job's student as an MLflow model of the job's run (``Tracker.log_model``: a failure warns, the job goes
    on), said in one line with the command that serves it; the logged model, or None (tracking off, or failed)."""
    logged = tracker.log_model(model_dir, name=name, register=register, step=step, tags=tags)
    if logged is not None:
        what = (f"registered as {logged.name} version {logged.version}" if logged.version is not None
                else f"logged as {logged.model_uri}")
        print(f"{prefix} MLflow model {name} {what}; serve it with: {serve_command(logged, tracker.tracking_uri)}",
              flush=True)
    return logged


def log_student(model_dir: str | os.PathLike, *, tracking_uri: str, run_id: str, name: str = "model",
                register: str | None = None, step: int = 0, tags: Mapping[str, Any] | None = None) -> LoggedStudent:
    """Log the sentence-transformers directory ``model_dir`` as an MLflow model of run ``run_id`` (module
    docstring); ``register``: also register it under that name."""
    import mlflow.sentence_transformers
    from mlflow import MlflowClient
    from mlflow.models import infer_signature
    from sentence_transformers import SentenceTransformer

    from raydistill.models.derive_files import quiet_progress_bars

    model_dir = Path(model_dir)
    client = MlflowClient(tracking_uri=tracking_uri)
    run = client.get_run(run_id)
    # transformers draws a bar for every weight load and shard write: noise in a job's log, said once per model.
    with quiet_progress_bars():
        # cpu: a GPU driver would otherwise hold the model in device memory just to save it again
        model = SentenceTransformer(str(model_dir), device="cpu", local_files_only=True)
        examples = list(EXAMPLE_SENTENCES)
        vectors = model.encode(examples, show_progress_bar=False)
        # Created here rather than by log_model: without an active fluent run MLflow puts the model it creates in
        # the default experiment (and its files under ./mlruns of the working directory), not in the run's.
        created = client.create_logged_model(run.info.experiment_id, name=name, source_run_id=run_id,
                                             params=dict(run.data.params),
                                             tags={k: str(v) for k, v in (tags or {}).items()})
        with _tracking_uri(tracking_uri):
            info = mlflow.sentence_transformers.log_model(
                model, name=name, model_id=created.model_id, run_id=run_id, step=int(step),
                input_example=examples, signature=infer_signature(examples, vectors),
                pip_requirements=pip_requirements(),
                metadata={"embedding_dimension": int(vectors.shape[1])},
                create_model_card=False)  # passed on to SentenceTransformer.save
    logged = LoggedStudent(model_uri=info.model_uri, model_id=created.model_id, run_id=run_id,
                           dimension=int(vectors.shape[1]))
    if register:
        logged = register_student(tracking_uri, logged, register)
    return logged


def register_student(tracking_uri: str, logged: LoggedStudent, name: str) -> LoggedStudent:
    """``logged`` as the next version of the registered model ``name`` (created if new); returns it with ``name``
    and ``version`` set."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient(tracking_uri=tracking_uri)
    try:
        client.create_registered_model(name)
    except MlflowException as exc:
        if exc.error_code not in ("RESOURCE_ALREADY_EXISTS", "ALREADY_EXISTS"):
            raise
    with _tracking_uri(tracking_uri):  # the registry looks the logged model up in the process-wide store
        version = client.create_model_version(name, source=logged.model_uri, run_id=logged.run_id,
                                              model_id=logged.model_id)
    return LoggedStudent(logged.model_uri, logged.model_id, logged.run_id, logged.dimension, name,
                         int(version.version))


@contextlib.contextmanager
def _tracking_uri(uri: str) -> Iterator[None]:
    """MLflow's process-wide tracking URI set to ``uri`` while the flavor logs (it reads no other), then put back,
    ``$MLFLOW_TRACKING_URI`` included (MLflow's own setter also writes and, on the way back, unsets that)."""
    from mlflow.tracking._tracking_service import utils

    env = os.environ.get("MLFLOW_TRACKING_URI")
    try:
        with utils._use_tracking_uri(uri):
            yield
    finally:
        if env is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = env
