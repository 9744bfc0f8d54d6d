"""One shared instance queue, two learners: every mirror holds exactly the authoritative FIFO content.

Mirrors are compared with the actor's queue and with a reference ``objectives.InstanceQueue`` fed the same pushes in
the same order: buffer, ring pointer and fill count (the whole state_dict), and the FIFO view ``ordered()``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raydistill.objectives.queue import InstanceQueue
from raydistill.config.job import JobConfig
from raydistill.methods.shared_queue import SharedInstanceQueue, create_shared_queue, queue_client_class
from tests.ray_fixtures import ray_session  # noqa: F401  (session-scoped fixture)

SIZE, DIM = 24, 8


def _queue_cls():
    return InstanceQueue


def _rows(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)


def _state(module) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy() for k, v in module.state_dict().items() if isinstance(v, torch.Tensor)}


def _assert_same_state(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]), err_msg=key)


def _reference(pushes: list[np.ndarray]):
    queue = _queue_cls()(SIZE, DIM)
    with torch.no_grad():
        for rows in pushes:
            queue.enqueue(torch.from_numpy(rows))
    return queue


def test_shared_queue_replays_recent_pushes_and_snapshots_the_rest():
    shared = SharedInstanceQueue(SIZE, DIM, queue_cls=_queue_cls())
    pushes = [_rows(i, 5) for i in range(8)]
    for rows in pushes[:3]:
        shared.push(rows)
    delta = shared.since(1)
    assert delta["version"] == 3 and [rows.tolist() for rows, _ in delta["pushes"]] == [p.tolist() for p in pushes[1:3]]
    assert all(groups is None for _, groups in delta["pushes"])  # pushed without group ids
    assert shared.since(3) == {"version": 3, "pushes": []}
    for rows in pushes[3:]:
        shared.push(rows)
    # 40 rows pushed into a 24-row queue: only the pushes that still shape the content are kept.
    assert "state" in shared.since(0)
    _assert_same_state(shared.since(0)["state"], _state(_reference(pushes)))
    replay = shared.since(5)
    assert [rows.tolist() for rows, _ in replay["pushes"]] == [p.tolist() for p in pushes[5:]]
    with pytest.raises(ValueError, match=r"expected rows of shape \[B, 8\]"):
        shared.push(np.zeros((2, 3), dtype=np.float32))


@pytest.mark.ray
def test_two_learners_share_one_queue(ray_session):
    queue_cls = _queue_cls()
    client_cls = queue_client_class(queue_cls)
    cfg = JobConfig.from_dict({"method": "congen", "student": "bert-tiny"})
    actor = create_shared_queue(cfg, size=SIZE, dim=DIM, queue_cls=queue_cls)
    first, second = client_cls(actor, SIZE, DIM), client_cls(actor, SIZE, DIM)
    _assert_same_state(_state(first), _state(_reference([])))

    # Turn by turn (a learner's pushes are visible to itself at its next read, to the other after its sync).
    order = []
    for step in range(3):
        for name, client in (("first", first), ("second", second)):
            rows = _rows(100 * step + len(name), 4)
            client.enqueue(torch.from_numpy(rows))
            client.sync()
            order.append(rows)
    first.sync()
    expected = _state(_reference(order))
    # FIFO order, computed independently of InstanceQueue: the newest SIZE rows, normalised, oldest first.
    fifo = torch.nn.functional.normalize(torch.from_numpy(np.concatenate(order)), dim=1)[-SIZE:]
    torch.testing.assert_close(first.ordered(), fifo)
    torch.testing.assert_close(second.ordered(), fifo)
    _assert_same_state(_state(first), expected)
    _assert_same_state(_state(second), expected)
    _assert_same_state(ray_session.get(actor.snapshot.remote(), timeout=60)["state"], expected)

    # Pipelined, as in training: pushes are in flight while the other learner pushes too.
    own = {"first": [], "second": []}
    for step in range(6):
        for name, client, n in (("first", first, 3), ("second", second, 5)):
            rows = _rows(1000 * len(name) + step, n)
            client.enqueue(torch.from_numpy(rows))
            own[name].append(rows)
            assert len(client) == SIZE  # a read in between: applies the pending reply
    first.sync()
    second.sync()
    # Each learner's rows sit in the shared FIFO in the order that learner pushed them.
    position = {tuple(np.round(r, 5)): (name, i) for name in own
                for i, r in enumerate(torch.nn.functional.normalize(torch.from_numpy(np.concatenate(own[name])),
                                                                    dim=1).numpy())}
    sources = [position[tuple(np.round(r, 5))] for r in first.ordered().numpy()]
    for name in own:
        indices = [i for n, i in sources if n == name]
        assert indices == sorted(indices) and indices[-1] == len(np.concatenate(own[name])) - 1
    authoritative = ray_session.get(actor.snapshot.remote(), timeout=60)
    assert authoritative["version"] == 6 + 12 and first.version == second.version == authoritative["version"]
    _assert_same_state(_state(first), authoritative["state"])
    _assert_same_state(_state(second), authoritative["state"])
    assert not np.array_equal(authoritative["state"][next(iter(authoritative["state"]))],
                              expected[next(iter(expected))])  # the pushes did change the queue


@pytest.mark.ray
def test_queue_state_dict_round_trip_through_a_loss_module(ray_session):
    queue_cls = _queue_cls()
    client_cls = queue_client_class(queue_cls)
    cfg = JobConfig.from_dict({"method": "congen", "student": "bert-tiny"})
    actor = create_shared_queue(cfg, size=SIZE, dim=DIM, queue_cls=queue_cls)

    class LossWithQueue(torch.nn.Module):  # how a loss module holds its queue
        def __init__(self, queue):
            super().__init__()
            self.queue = queue

    learner_a = LossWithQueue(client_cls(actor, SIZE, DIM))
    learner_b = LossWithQueue(client_cls(actor, SIZE, DIM))
    local = LossWithQueue(queue_cls(SIZE, DIM))
    pushes = [_rows(i, 6) for i in range(3)]
    for rows in pushes:
        learner_a.queue.enqueue(torch.from_numpy(rows))
    checkpoint = learner_a.state_dict()
    assert checkpoint.keys() == local.state_dict().keys()  # same keys as a loss with its own queue
    _assert_same_state({k: v.numpy() for k, v in checkpoint.items()},
                       {f"queue.{k}": v for k, v in _state(_reference(pushes)).items()})

    learner_b.queue.enqueue(torch.from_numpy(_rows(99, 6)))  # moves on after the checkpoint ...
    learner_b.queue.sync()
    learner_b.load_state_dict(checkpoint)  # ... and a restart restores it: for every learner
    learner_a.queue.sync()
    _assert_same_state(_state(learner_a), {k: v.numpy() for k, v in checkpoint.items()})
    _assert_same_state(ray_session.get(actor.snapshot.remote(), timeout=60)["state"],
                       {k.removeprefix("queue."): v.numpy() for k, v in checkpoint.items()})

    # Without an actor the client is a plain local queue.
    alone = client_cls(None, SIZE, DIM)
    for rows in pushes:
        alone.enqueue(torch.from_numpy(rows))
    _assert_same_state(_state(alone), _state(_reference(pushes)))


@pytest.mark.ray
def test_two_congen_learners_see_each_others_teacher_rows(ray_session):
    """Learner A's second step scores against the teacher rows of both learners' first steps, exactly as a single
    learner whose queue received both batches would."""
    from raydistill.objectives import ConGenLoss
    from raydistill.methods.shared_queue import QueueClient

    cfg = JobConfig.from_dict({"method": "congen", "student": "bert-tiny"})
    actor = create_shared_queue(cfg, size=SIZE, dim=DIM, init="random", seed=3)
    loss_a, loss_b = (ConGenLoss(queue_size=SIZE, dim=DIM, queue=QueueClient(actor, SIZE, DIM, init="random", seed=3))
                      for _ in range(2))
    single = ConGenLoss(queue_size=SIZE, dim=DIM, queue_init="random", queue_seed=3)

    def features(seed: int) -> dict[str, torch.Tensor]:
        return {name: torch.from_numpy(_rows(seed * 10 + i, 4))
                for i, name in enumerate(("student_control", "student_generalize", "teacher"))}

    loss_a(features(1))
    loss_b(features(2))
    loss_b.queue.sync()
    loss_a.queue.sync()
    single.queue.enqueue(features(1)["teacher"])
    single.queue.enqueue(features(2)["teacher"])
    step2 = features(3)
    torch.testing.assert_close(loss_a(step2).loss, single(step2).loss)
