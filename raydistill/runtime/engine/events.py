"""Rank 0's progress to the driver, and the driver's stop request to rank 0, through Ray's public API only.

Progress: rank 0's report of a progress step carries ``PROGRESS_STEP`` and, after an evaluation, its scores
(``EVAL_PREFIX``). ``ReportsToDriver``, a ``ray.train.UserCallback`` of the ``TorchTrainer``, turns each such report
into the driver's events (``step``, ``eval``: ``progress_events``) and hands them to the ``EventRelay``, a small Ray
actor the driver owns; the driver's main thread waits on it (``EventRelay.wait``, until events arrive, the run ends,
or ``runtime.learner_timeout_s`` passes: the watchdog of ``LearnerUnresponsiveError``). In Train's local mode the
loop runs in the driver, and ``LocalEvents`` hands the same events to the driver's callbacks directly.

Stop: the driver's SIGTERM / SIGINT handler sets the relay's flag (``EventRelay.request_stop``); rank 0 reads it at
its progress steps without waiting (``StopFlag``) and passes it to every worker inside the step's one control
all-reduce (``DistillLearner.train_step``).

What the public API does not do, and what this module does instead:

* ``UserCallback`` runs in Train's controller actor, not in the driver, and ``TorchTrainer.fit`` blocks without a
  timeout: so the reports reach the driver through the relay, and ``fit`` runs in a thread of its own while the main
  thread waits on the relay with a timeout (Train's health checks see a live process, not a silent one).
* Train's local mode runs no callbacks (``LocalController`` ignores ``RunConfig.callbacks``): hence ``LocalEvents``.
* ``start`` (rank 0's pid, actor and shared actors) is not a report: a report needs every worker, and the start
  answer must carry how often Train restarted the group (it goes into the checkpoints). Rank 0 tells the relay.
* Train cannot keep actors alive across worker-group restarts: the relay keeps the actors the method's hooks share
  between learners (``MethodSpec.hooks``), so a worker group that Train restarts gets live ones.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable

__all__ = ["EVENT_TIMEOUT_S", "EVAL_KEYS", "EVAL_PREFIX", "EVAL_STEP", "EventRelay", "LocalEvents", "PROGRESS_STEP",
           "ReportsToDriver", "StopFlag", "progress_events", "push_event"]

# How long rank 0 (at a start) and Train's controller (at a report) wait for the driver's relay.
EVENT_TIMEOUT_S = 120.0
# How long a report waits for the driver to take its events (a driver that has gone or hangs holds no run up longer).
TAKEN_TIMEOUT_S = 5.0
# The key of rank 0's report metrics that makes a report a progress step for the driver: its optimiser step.
PROGRESS_STEP = "raydistill_progress_step"
# The dev scores a report carries after a dev evaluation (as ``EVAL_PREFIX`` + key: a Tune trial's reporter adds
# keys of the same names for Tune, which must not see these), and the step evaluated (the reported one, or an
# earlier step that no report followed: an evaluation owed at a resume).
EVAL_KEYS = ("stsb_dev", "best_stsb_dev", "best_step")
EVAL_PREFIX = "raydistill_eval_"
EVAL_STEP = EVAL_PREFIX + "step"
# Keys of the report that are not training metrics: the markers above, and what a Tune trial's reporter adds.
_NOT_METRICS = ("stsb_dev", "best_stsb_dev", "step", "stage")

Event = tuple[str, dict[str, Any], int]


def progress_events(metrics: dict[str, Any]) -> list[Event]:
    """The driver's events of rank 0's report ``metrics``: ``step`` (the training metrics) when the report has
    them, then ``eval`` when the step had a dev evaluation; [] for a report that is no progress step."""
    if PROGRESS_STEP not in metrics:
        return []
    step = int(metrics[PROGRESS_STEP])
    events: list[Event] = []
    if "loss" in metrics:
        events.append(("step", {k: v for k, v in metrics.items()
                                if k not in _NOT_METRICS and not k.startswith(("raydistill_", EVAL_PREFIX))}, step))
    if EVAL_STEP in metrics:
        events.append(("eval", {k: metrics[EVAL_PREFIX + k] for k in EVAL_KEYS}, int(metrics[EVAL_STEP])))
    return events


class EventRelay:
    """The driver's end of the workers' events, its stop flag, and the method's shared actors; behind ``ray.remote``
    with several threads (``max_concurrency``), so the driver's wait never holds up a report or a read."""

    def __init__(self, actor_factory: Callable[[], dict[str, list]] | None = None):
        self._events: list[Event] = []
        self._pushed = self._taken = 0  # events ever pushed, and taken by the driver
        self._changed = threading.Condition()
        self._stop = self._abort = self._finished = False
        self._starts = 0
        self._actor_factory = actor_factory
        self._actors: dict[str, list] = {}  # hook name -> its actors
        self._actors_lock = threading.Lock()

    def push(self, events: list[Event], until_taken_s: float = 0.0) -> dict[str, Any]:
        """Queue events for the driver, waiting up to ``until_taken_s`` until it has taken them; the answer: the
        driver's flags (``control``) and how many times the workers were restarted so far."""
        with self._changed:
            self._starts += sum(kind == "start" for kind, _, _ in events)
            self._events.extend(events)
            self._pushed += len(events)
            pushed = self._pushed
            self._changed.notify_all()
            if until_taken_s > 0:
                self._changed.wait_for(lambda: self._taken >= pushed or self._finished, timeout=until_taken_s)
            return {**self.control(), "restarts": max(0, self._starts - 1)}

    def wait(self, timeout_s: float) -> tuple[list[Event], bool]:
        """The events since the last call, waiting up to ``timeout_s`` for one, and whether the run has finished
        (then every event of it is in the answer)."""
        with self._changed:
            self._changed.wait_for(lambda: self._events or self._finished, timeout=timeout_s)
            events, self._events = self._events, []
            self._taken += len(events)
            self._changed.notify_all()
            return events, self._finished

    def finish(self) -> None:
        """``fit`` returned: the driver's wait ends."""
        with self._changed:
            self._finished = True
            self._changed.notify_all()

    def control(self) -> dict[str, bool]:
        """``stop``: the driver asked the run to stop (SIGTERM); ``abort``: it gave up waiting for events."""
        return {"stop": self._stop, "abort": self._abort}

    def request_stop(self) -> None:
        self._stop = True

    def abort(self) -> None:
        """The driver gave up (no event within its timeout): workers that still run leave without training."""
        self._abort = True

    def shared_actors(self) -> dict[str, list]:
        """Live shared actors by hook name (new ones for all when any fails its ``ping``); {} when none."""
        import ray

        if self._actor_factory is None:
            return {}
        with self._actors_lock:  # the workers of a group ask at once: one set of actors for all
            if self._actors:
                try:
                    ray.get([actor.ping.remote() for actor in self._all_actors()], timeout=30)
                except Exception:  # noqa: BLE001 - a dead or unreachable actor: replace them all
                    self._kill_all()
            if not self._actors:
                self._actors = self._actor_factory()
            return dict(self._actors)

    def _all_actors(self) -> list:
        return [actor for actors in self._actors.values() for actor in actors]

    def _kill_all(self) -> None:
        import ray

        for actor in self._all_actors():
            with contextlib.suppress(Exception):  # already gone
                ray.kill(actor)
        self._actors = {}

    def shutdown(self) -> None:
        with self._actors_lock:
            self._kill_all()


def _user_callback_base():
    """``ray.train.UserCallback``: Train V2's public callback (the V1 layout has none; then a plain base)."""
    try:
        from ray.train import UserCallback
    except ImportError:
        return object
    return UserCallback


class ReportsToDriver(_user_callback_base()):
    """A Train callback (it runs in Train's controller): rank 0's progress reports to the driver's relay."""

    def __init__(self, relay):
        self.relay = relay

    def after_report(self, run_context, metrics: list[dict[str, Any]], checkpoint) -> None:
        events = progress_events(metrics[0]) if metrics else []
        if not events:
            return
        import ray

        # Waited for until the driver has taken the events (this callback comes before the Tune trial's, so the
        # driver has an evaluation before Tune can stop the trial on it), and so that every event is with the relay
        # before fit returns (a call that is not waited for could reach it after ``finish``). A driver that is gone
        # stops nothing: training goes on, its checkpoints are the record.
        with contextlib.suppress(Exception):
            ray.get(self.relay.push.remote(events, TAKEN_TIMEOUT_S), timeout=EVENT_TIMEOUT_S)


class LocalEvents:
    """The relay of Train's local mode: the loop runs in the driver, so events go straight to ``on_event``."""

    def __init__(self, on_event: Callable[[str, dict[str, Any], int], None], stop_requested: Callable[[], bool]):
        self.on_event, self.stop_requested = on_event, stop_requested

    def push(self, events: list[Event]) -> dict[str, Any]:
        for kind, info, step in events:
            self.on_event(kind, info, step)
        return {**self.control(), "restarts": 0}  # no worker to restart here

    def control(self) -> dict[str, bool]:
        return {"stop": self.stop_requested(), "abort": False}

    def shared_actors(self) -> dict[str, list]:
        return {}  # one learner: nothing to share


class StopFlag:
    """Rank 0's view of the driver's flags (``stop``, ``abort``), read without waiting: each ``read`` returns the
    answer to the request the previous ``read`` sent, once it has arrived (in local mode: the flag itself)."""

    def __init__(self, events, initial: dict[str, bool]):
        self.events, self.state = events, {"stop": bool(initial.get("stop")), "abort": bool(initial.get("abort"))}
        self._pending = None

    def read(self) -> dict[str, bool]:
        if isinstance(self.events, LocalEvents):
            return self.events.control()
        import ray

        if self._pending is not None:
            ready, _ = ray.wait([self._pending], timeout=0)
            if not ready:
                return self.state
            try:
                self.state = ray.get(self._pending)
            except Exception:  # noqa: BLE001 - the relay is gone with the driver: train on, checkpoints keep it
                pass
        self._pending = self.events.control.remote()
        return self.state


def push_event(events, kind: str, info: dict[str, Any], step: int) -> dict[str, Any]:
    """One event of rank 0 to the driver, waited for; the answer of ``EventRelay.push``."""
    if isinstance(events, LocalEvents):
        return events.push([(kind, info, step)])
    import ray

    return ray.get(events.push.remote([(kind, info, step)]), timeout=EVENT_TIMEOUT_S)
