"""Stopping a job cleanly on SIGTERM (a preempted node, ``kill``, a scheduler's time limit) or SIGINT (Ctrl-C).

Contract: while ``StopOnSignals`` is installed (the job's main thread, after ``ray.init``, which installs a SIGTERM
handler of its own that aborts the process), the first SIGTERM or SIGINT

    * inside ``step_boundaries()`` (code that calls ``stop_requested()`` at each step boundary: training) only sets
      the stop flag; that code saves its position at the next boundary and raises ``JobStopped``;
    * anywhere else (the teacher pass, labelling, evaluation, between stages) raises ``JobStopped`` at once, so the
      ``finally`` blocks of what runs keep what it computed (the teacher cache appends the rows encoded so far).

Code that leaves a step loop with the flag set calls ``raise_if_stop_requested()`` before its next phase. Code that
must pass the request on at once (a driver whose training runs in Ray workers) registers a listener with
``on_stop_request``, called in the thread that made the request. A second signal while the job stops is only
reported. The job exits with ``exit_status()``, 128 + the signal's number (143 for SIGTERM: schedulers read it as
"preempted, requeue"; 130 for SIGINT). Outside the main thread (a Tune trial's job) nothing is installed.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator

__all__ = ["JobStopped", "StopOnSignals", "clear_stop_request", "exit_status", "on_stop_request",
           "raise_if_stop_requested", "request_stop", "signal_name", "step_boundaries", "stop_requested"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

_STOP_REQUESTED = threading.Event()
_received = {"signum": int(signal.SIGTERM)}
_polling_depth = [0]  # > 0 while a step loop checks the flag itself
_listeners: list[Callable[[], None]] = []


class JobStopped(BaseException):
    """The job was asked to stop (SIGTERM, SIGINT) and stopped where it stood, keeping what it had done.
    ``step``/``checkpoint``: where training stopped; ``where``/``kept``: filled in by the phase it interrupted.

    A ``BaseException``, as ``KeyboardInterrupt`` is: raised wherever the main thread stands, often inside library
    code whose ``except Exception`` (Ray Data's metrics, MLflow retries) would otherwise swallow the stop."""

    def __init__(self, message: str, step: int | None = None, checkpoint: str | None = None, *,
                 where: str | None = None, kept: str | None = None):
        super().__init__(message)
        self.step, self.checkpoint = step, checkpoint
        self.where, self.kept = where, kept


def request_stop(signum: int = signal.SIGTERM) -> None:
    """Ask the job to stop at the next step boundary (safe to call from a signal handler)."""
    _received["signum"] = int(signum)
    _STOP_REQUESTED.set()
    for listener in list(_listeners):
        listener()


def clear_stop_request() -> None:
    _STOP_REQUESTED.clear()
    _received["signum"] = int(signal.SIGTERM)


def stop_requested() -> bool:
    return _STOP_REQUESTED.is_set()


def signal_name() -> str:
    """The name of the signal that asked for the stop (SIGTERM when the stop came from code)."""
    return signal.Signals(_received["signum"]).name


def exit_status() -> int:
    """128 + the signal's number: what a shell reports for a process the signal ended."""
    return 128 + _received["signum"]


def raise_if_stop_requested(where: str) -> None:
    """Between phases: a stop that arrived while a step loop ran (and finished anyway) ends the job here."""
    if stop_requested():
        raise JobStopped(f"stop requested ({signal_name()}) {where}", where=where)


@contextlib.contextmanager
def step_boundaries() -> Iterator[None]:
    """While inside, a signal only sets the flag: the code inside checks ``stop_requested()`` at step boundaries."""
    _polling_depth[0] += 1
    try:
        yield
    finally:
        _polling_depth[0] -= 1


@contextlib.contextmanager
def on_stop_request(listener: Callable[[], None]) -> Iterator[None]:
    """While inside, every stop request also calls ``listener`` (at once if one came before)."""
    _listeners.append(listener)
    try:
        if stop_requested():
            listener()
        yield
    finally:
        _listeners.remove(listener)


class StopOnSignals:
    """SIGTERM and SIGINT handlers for a whole job (see the module docstring); ``restore`` puts the previous back."""

    def __init__(self, job: str = "job"):
        self.job = job
        self._previous: dict[int, object] = {}

    def install(self) -> StopOnSignals:
        clear_stop_request()
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                previous = signal.signal(signum, self._handle)
                self._previous.setdefault(signum, previous)
        return self

    def restore(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
        clear_stop_request()

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if stop_requested():
            print(f"[{self.job}] {name} received again: already stopping (SIGKILL ends the job without saving)",
                  flush=True)
            return
        request_stop(signum)
        if _polling_depth[0] > 0:
            print(f"[{self.job}] {name} received: stopping at the next step boundary", flush=True)
            return
        print(f"[{self.job}] {name} received: stopping now", flush=True)
        raise JobStopped(f"stop requested ({name})")
