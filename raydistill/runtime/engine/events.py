"""Rank 0's events to the driver, and the driver's answer: ``EventRelay`` (a Ray actor) and ``LocalEvents``.

Events (``start``, ``step``, ``eval``) go from rank 0 to the driver through an ``EventRelay`` (a Ray actor the
driver owns; in local mode a plain object calling the driver's callbacks): the driver logs them to MLflow, prints
the progress lines and answers with the stop request of a SIGTERM, which rank 0 passes to every worker.

``push_event`` is rank 0's side: it hands an event to whichever of the two the loop config carries and returns the
driver's answer (``stop``, ``abort``, ``restarts``); a relay that takes no event within ``EVENT_TIMEOUT_S`` raises.
The relay also keeps the shared teacher-queue actors, so a worker group that Train restarts gets live ones.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["EVENT_TIMEOUT_S", "EventRelay", "LocalEvents", "push_event"]

# How long rank 0 waits for the driver's relay to take an event before it gives up on the driver.
EVENT_TIMEOUT_S = 120.0


class EventRelay:
    """Rank 0's events for the driver, and the driver's stop request for the workers; behind ``ray.remote``.

    It also keeps the shared teacher queues: workers ask it for the queue actors (``shared_queues``), and it
    replaces queue actors that died, so a worker group that Train restarts after a queue actor was lost gets live
    ones (their content comes back from the checkpoint).
    """

    def __init__(self, queue_factory: Callable[[], list] | None = None):
        self._events: list[tuple[str, dict[str, Any], int]] = []
        self._stop = self._abort = False
        self._starts = 0
        self._queue_factory = queue_factory
        self._queues: list = []

    def push(self, kind: str, info: dict[str, Any], step: int) -> dict[str, Any]:
        """Queue an event; the answer: whether the driver asked the run to stop (SIGTERM) or gave up on it
        (``abort``: it stopped waiting for events), and how many times the workers were restarted so far."""
        self._starts += kind == "start"
        self._events.append((kind, info, step))
        return {"stop": self._stop, "abort": self._abort, "restarts": max(0, self._starts - 1)}

    def drain(self) -> list[tuple[str, dict[str, Any], int]]:
        events, self._events = self._events, []
        return events

    def request_stop(self) -> None:
        self._stop = True

    def abort(self) -> None:
        """The driver gave up (no event within its timeout): workers that still report leave without training."""
        self._abort = True

    def shared_queues(self) -> list:
        """Live shared-queue actors (new ones when any has died); [] when the method shares no queue."""
        import ray

        if self._queue_factory is None:
            return []
        if self._queues:
            try:
                ray.get([queue.ping.remote() for queue in self._queues], timeout=30)
            except Exception:  # noqa: BLE001 - a dead or unreachable queue actor: replace them all
                for queue in self._queues:
                    ray.kill(queue)
                self._queues = []
        if not self._queues:
            self._queues = self._queue_factory()
        return list(self._queues)

    def shutdown(self) -> None:
        import ray

        for queue in self._queues:
            try:
                ray.kill(queue)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self._queues = []


class LocalEvents:
    """The relay of Train's local mode: the loop runs in the driver, so events go straight to ``on_event``."""

    def __init__(self, on_event: Callable[[str, dict[str, Any], int], None], stop_requested: Callable[[], bool]):
        self.on_event, self.stop_requested = on_event, stop_requested

    def push(self, kind: str, info: dict[str, Any], step: int) -> dict[str, Any]:
        self.on_event(kind, info, step)
        return {"stop": self.stop_requested(), "abort": False, "restarts": 0}  # no worker to restart here

    def shared_queues(self) -> list:
        return []  # one learner: the loss keeps its own queues


def push_event(events, kind: str, info: dict[str, Any], step: int) -> dict[str, Any]:
    if isinstance(events, LocalEvents):
        return events.push(kind, info, step)
    import ray

    return ray.get(events.push.remote(kind, info, step), timeout=EVENT_TIMEOUT_S)
