"""Starting or joining Ray, checking that the configured roles fit the cluster before any actor starts, and keeping
the driver's own helper actors on the driver's node (`on_the_driver_node`), so that losing another node loses only
what Ray Train can restart.

The same job script runs standalone (``python jobs/congen.py``: a private local Ray with the config's CPU count) and
under ``ray job submit`` (the job supervisor sets ``RAY_ADDRESS``: connect, and take the cluster's resources as they
are). Roles take resources from the config only, so moving to a GPU cluster changes the ``resources`` block and
nothing else.

A config here is any config whose ``resources`` have ``num_cpus`` and ``data_max_cpus`` and which states its own
long-lived actors with ``actor_reservation()`` (a ``JobConfig``; the Trans-Encoder's families' ``TencConfig``).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from raydistill.config.job import ConfigError, JobConfig
from raydistill.config.sections import Reservation

__all__ = ["WORKER_ENV", "Reservation", "ResourceError", "check_resources", "configure_data_context", "data_limits",
           "drop_log_messages", "init_ray", "on_the_driver_node", "prepare_worker_environment",
           "quiet_ray_internal_deprecation", "quiet_auth_notice", "warn_if_outputs_are_ephemeral"]

log = logging.getLogger(__name__)

# Environment every Ray worker of a local cluster inherits (the raylet is started from this process): the model hub
# is never reachable at run time, and Ray should neither phone home nor collapse repeated log lines that explain a
# failure.
WORKER_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DEDUP_LOGS": "0",
    "OMP_WAIT_POLICY": "PASSIVE",  # see raydistill/__init__.py
    # Ray starts workers at nice 15 so the driver stays responsive; here the actors do all the work, and at nice 15
    # any other process on the machine (an evaluation, a second job) starves them (measured: a Trans-Encoder
    # learner got 5% of a core beside one nice-0 process). Read by the raylet of a local cluster only.
    "RAY_worker_niceness": "0",
    # transformers 5 draws a "Loading weights" bar at every model load, in every actor and Data worker, between the
    # job's own progress lines (which say what is loading and how far the job is).
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
}


class ResourceError(ConfigError):
    """The configured roles cannot all be scheduled on the Ray cluster."""


def init_ray(cfg: Any = None, *, dashboard: bool = False, **init_kwargs: Any) -> Callable[[], None]:
    """Connect to the cluster in ``RAY_ADDRESS`` (or the one already initialised), else start a local Ray with
    ``cfg.resources.num_cpus``, ``init_kwargs`` and, with ``dashboard``, Ray's state API (`start_local_ray`).
    Returns `configure_data_context`'s function that puts Ray Data's settings back."""
    import ray

    prepare_worker_environment()
    if ray.is_initialized():
        log.debug("Ray already initialised; using it")
    elif os.environ.get("RAY_ADDRESS"):
        log.info("connecting to the Ray cluster at %s", os.environ["RAY_ADDRESS"])
        ray.init(**init_kwargs)
    else:
        num_cpus = cfg.resources.num_cpus if cfg is not None else None
        kwargs = {"num_cpus": num_cpus} | init_kwargs
        log.info("starting a local Ray (%s CPUs)", kwargs["num_cpus"])
        start_local_ray(dashboard=dashboard, **kwargs)
    return configure_data_context(cfg)


def start_local_ray(*, dashboard: bool = False, **init_kwargs: Any) -> None:
    """``ray.init(address="local", ...)``; with ``dashboard``, a Ray whose workers can reach its state API.

    A Tune sweep needs that: Train's placement-group cleaner learns through it that a stopped trial's controller died,
    and only then frees its CPUs (else the next trial waits forever). The cleaner finds the cluster by ``RAY_ADDRESS``,
    so it names a GCS port chosen here while Ray starts, then is put back (a later ``init_ray`` starts a new Ray)."""
    import socket

    import ray

    quiet_auth_notice()
    if not dashboard:
        ray.init(address="local", include_dashboard=False, **init_kwargs)
        return
    with socket.socket() as probe:  # a free port for the GCS
        probe.bind(("", 0))
        port = probe.getsockname()[1]
    started_with = {"RAY_GCS_SERVER_PORT": str(port), "RAY_ADDRESS": f"{ray.util.get_node_ip_address()}:{port}"}
    before = {key: os.environ.get(key) for key in started_with}
    os.environ.update(started_with)
    try:
        ray.init(address="local", include_dashboard=True, **init_kwargs)
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def quiet_auth_notice() -> None:
    """Drop Ray 2.60's notice, at every ``ray.init`` without ``RAY_AUTH_MODE``, that it turned token authentication
    on: nothing for a user to act on. No public API sets the mode once Ray is imported, so the notice is filtered by
    its logger's name (a string no import needs; a Ray whose logger is named otherwise keeps its notice)."""
    drop_log_messages("ray._private.authentication.authentication_token_setup",
                      "Token authentication is enabled for this Ray cluster")


def drop_log_messages(logger_name: str, prefix: str) -> None:
    """Filter out of logger ``logger_name`` the records whose message starts with ``prefix`` (one filter each)."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, _DropMessages) and f.prefix == prefix for f in logger.filters):
        logger.addFilter(_DropMessages(prefix))


class _DropMessages(logging.Filter):
    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


def on_the_driver_node() -> Any:
    """A scheduling strategy that keeps a driver-serving actor (the event relay) on this node, as Train places its
    controller: elsewhere it would die with that node and end a job Train could restart (measured)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)


def prepare_worker_environment() -> None:
    """Set ``WORKER_ENV`` for a local Ray's workers (before ``ray.init``), and put the package's directory on
    ``PYTHONPATH``: a checkout not pip-installed would otherwise import in the driver but not in the workers."""
    import raydistill

    for key, value in WORKER_ENV.items():
        os.environ.setdefault(key, value)
    package_root = str(Path(raydistill.__file__).resolve().parents[1])
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if package_root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([package_root, *paths])


def configure_data_context(cfg: Any = None) -> Callable[[], None]:
    """Ray Data defaults: no progress bars in CI or without a terminal (the jobs print their own lines), and
    ``resource_limits`` of what the actors (``actor_reservation()``) leave, so Data neither waits for their CPUs nor
    takes them (actors on every CPU hang Data: docs/runtime.md); a resource no actor holds stays Ray's own (a limit,
    not the deprecated ``exclude_resources``). Returns a function that puts the process-wide settings back."""
    from ray.data import DataContext

    quiet_ray_internal_deprecation()
    ctx = DataContext.get_current()
    options = ctx.execution_options
    previous = (ctx.wait_for_min_actors_s, ctx.enable_progress_bars, ctx.print_on_execution_start,
                options.resource_limits)

    def restore() -> None:
        (ctx.wait_for_min_actors_s, ctx.enable_progress_bars, ctx.print_on_execution_start,
         options.resource_limits) = previous

    # An actor pool that cannot get its resources fails after this long instead of waiting forever (Ray's
    # default); -1 restores waiting forever, e.g. for an autoscaler that needs long to add GPU nodes.
    ctx.wait_for_min_actors_s = int(os.environ.get("RAYDISTILL_ACTOR_WAIT_S", "600"))
    if os.environ.get("CI") or os.environ.get("RAYDISTILL_NO_PROGRESS") or not sys.stdout.isatty():
        ctx.enable_progress_bars = False
        # Ray Data's "Progress bars disabled. To enable, set ..." would undo what raydistill does on purpose (its
        # own progress lines stand in for the bars); its other progress messages stay.
        drop_log_messages("ray.data._internal.progress", "Progress bars disabled")
        ctx.print_on_execution_start = False
    if cfg is not None:
        # CPUs and GPUs are this job's to set (a job run after another in one process must not inherit its cap);
        # memory and object-store limits stay as they are.
        cap = data_limits(cfg.actor_reservation(), _cluster_total(cfg))
        options.resource_limits = options.resource_limits.copy(cpu=cap.cpu, gpu=cap.gpu)
    return restore


def data_limits(held: Reservation, total: dict[str, float]) -> Any:
    """Ray Data's ``resource_limits``: the cluster's CPUs and GPUs less what ``held`` reserves; a resource no actor
    holds is left unlimited (Ray Data then follows the cluster as it grows)."""
    from ray.data import ExecutionResources

    def left(name: str, reserved: float) -> float | None:
        return max(0.0, float(total.get(name, 0.0)) - reserved) if reserved > 0 else None

    return ExecutionResources.for_limits(cpu=left("CPU", held.cpus), gpu=left("GPU", held.gpus))


def _cluster_total(cfg: Any) -> dict[str, float]:
    import ray

    return ray.cluster_resources() if ray.is_initialized() else {"CPU": cfg.resources.num_cpus}


def quiet_ray_internal_deprecation() -> None:
    """Hide the ``ExecutionOptions.exclude_resources`` deprecation notice Ray Train 2.60 causes itself (it builds
    one for every run with datasets, zero default included). Only warnings from that constructor's module are
    filtered, so code setting it is still warned; a Tune trial calls this before ``fit``."""
    import warnings

    from ray.util.annotations import RayDeprecationWarning

    warnings.filterwarnings("ignore", message=r"`ExecutionOptions\.exclude_resources` is deprecated",
                            category=RayDeprecationWarning,
                            module=r"ray\.data\._internal\.execution\.interfaces\.execution_options$")


def check_resources(cfg: Any, available: dict[str, float] | None = None) -> None:
    """Raise ResourceError, naming the fields to change, if the roles cannot be scheduled together on ``available``
    (``{"CPU": 2, "GPU": 0}``; default: the running cluster's, or the config's ``num_cpus`` before Ray starts)."""
    if available is None:
        available = _cluster_total(cfg)
    cpus, gpus = float(available.get("CPU", 0)), float(available.get("GPU", 0))
    r, held = cfg.resources, cfg.actor_reservation()
    held_cpus, held_gpus = held.cpus, held.gpus
    where = f"the Ray cluster has {cpus:g} CPU and {gpus:g} GPU"
    problems = []
    if held_cpus + r.data_max_cpus > cpus + 1e-9:
        problems.append(
            f"{held.cpu_terms} + Ray Data headroom {r.data_max_cpus:g} CPU = {held_cpus + r.data_max_cpus:g} CPU > "
            f"{cpus:g}: {held.cpu_fix}")
    if held_gpus > gpus + 1e-9:
        problems.append(f"{held.holders} ask for {held_gpus:g} GPU; {held.gpu_fix}")
    # Only a distillation job has a teacher pool: Ray Data actors that come and go beside the long-lived ones.
    if isinstance(cfg, JobConfig) and cfg.teacher is not None and cfg.data.teacher_views:
        teacher_cpus = r.teacher.num_actors * r.teacher.num_cpus
        teacher_gpus = r.teacher.num_actors * r.teacher.num_gpus
        if teacher_cpus > cpus - held_cpus + 1e-9:
            problems.append(
                f"teacher pool {r.teacher.num_actors} x {r.teacher.num_cpus:g} CPU = {teacher_cpus:g} CPU, but only "
                f"{cpus - held_cpus:g} CPU are left beside the {held.holders}: lower resources.teacher.num_cpus "
                "or num_actors")
        if teacher_gpus > gpus - held_gpus + 1e-9:
            problems.append(f"teacher pool asks for {teacher_gpus:g} GPU, {gpus - held_gpus:g} left: set "
                            "resources.teacher.num_gpus: 0 or use a GPU cluster")
    for family, custom in (getattr(r, "families", None) or {}).items():
        for resource, amount in custom.items():
            have = float(available.get(resource, 0))
            if 2 * amount > have + 1e-9:  # the family's bi- and cross-encoder actor each ask for it
                problems.append(f"family {family}'s two actors ask for 2 x {amount:g} of the custom resource "
                                f"{resource!r}; the cluster has {have:g}: start a node with `ray start --resources "
                                f"'{{\"{resource}\": 2}}'` or change resources.families.{family}")
    if problems:
        source = f"{cfg._source}: " if cfg._source else ""
        raise ResourceError(f"{source}resources do not fit ({where}):\n  - " + "\n  - ".join(problems))


def warn_if_outputs_are_ephemeral(outputs: dict[str, str | os.PathLike]) -> list[str]:
    """Under ``ray job submit --working-dir .`` the job runs in a copy (``.../working_dir_files/_ray_pkg_*``) that Ray
    deletes with its session, with the default run dir and MLflow store in it. Print one warning naming each output
    there and how to move it; return those names."""
    cwd = Path.cwd().resolve()
    if "working_dir_files" not in cwd.parts:
        return []
    ephemeral = []
    for name, location in outputs.items():
        text = str(location)
        path = Path(text.removeprefix("sqlite:///"))
        if path.is_absolute() and path.resolve().is_relative_to(cwd):
            ephemeral.append(name)
    if ephemeral:
        print(f"warning: {', '.join(ephemeral)} lie in Ray's temporary copy of the working dir ({cwd}), which is "
              "deleted with the Ray session: pass --run-dir / --results-dir with absolute paths on shared storage "
              "and set MLFLOW_TRACKING_URI (e.g. --runtime-env-json '{\"env_vars\": {\"MLFLOW_TRACKING_URI\": "
              "\"sqlite:////abs/path/mlflow.db\"}}')", flush=True)
    return ephemeral

