"""InstanceQueue: FIFO order with wrap-around, in-place writes, scoring only filled rows, state_dict round trip."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from raydistill.objectives.queue import InstanceQueue


def _rows(n: int, dim: int, seed: int) -> torch.Tensor:
    return torch.randn(n, dim, generator=torch.Generator().manual_seed(seed))


def _unit(x: torch.Tensor) -> np.ndarray:
    x = x.double().numpy()
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_fifo_order_and_wrap_around_against_a_python_list():
    queue = InstanceQueue(size=5, dim=3)
    pointer_before = queue.embeddings.data_ptr()
    reference: list[np.ndarray] = []  # what a FIFO holds: append newest, drop oldest beyond K
    for step, batch_size in enumerate([2, 2, 2, 3, 1, 4, 5, 2]):  # 3rd batch straddles the end: two slice writes
        batch = _rows(batch_size, 3, seed=step)
        queue.enqueue(batch)
        reference.extend(_unit(batch))
        reference = reference[-5:]
        np.testing.assert_allclose(queue.ordered().double().numpy(), np.stack(reference), atol=1e-6)
        assert len(queue) == len(reference)
    assert len(queue) == queue.size and queue.embeddings.data_ptr() == pointer_before


def test_oldest_rows_are_overwritten_first():
    queue = InstanceQueue(size=4, dim=2)
    queue.enqueue(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.0]]))
    queue.enqueue(torch.tensor([[0.0, -1.0]]))
    # The first row written was the oldest: it is the one replaced, in place.
    np.testing.assert_allclose(queue.flush()[0].numpy(), [0.0, -1.0])
    np.testing.assert_allclose(queue.ordered()[-1].numpy(), [0.0, -1.0])
    np.testing.assert_allclose(queue.ordered()[0].numpy(), [0.0, 1.0])
    assert int(queue.pointer) == 1


def test_batch_larger_than_queue_keeps_the_newest_rows():
    queue = InstanceQueue(size=3, dim=2)
    queue.enqueue(_rows(2, 2, seed=1))
    big = _rows(7, 2, seed=2)
    queue.enqueue(big)
    np.testing.assert_allclose(queue.ordered().double().numpy(), _unit(big)[-3:], atol=1e-6)
    assert len(queue) == 3


def test_enqueue_normalises_and_never_keeps_a_graph():
    queue = InstanceQueue(size=4, dim=3)
    batch = (_rows(2, 3, seed=3) * 7).requires_grad_()
    queue.enqueue(batch)
    np.testing.assert_allclose(queue.rows().norm(dim=1).numpy(), [1.0, 1.0], rtol=1e-6)
    assert not queue.embeddings.requires_grad and queue.embeddings.grad_fn is None


def test_scores_use_only_filled_rows_and_match_a_direct_product():
    queue = InstanceQueue(size=6, dim=4)
    assert queue.scores(torch.randn(2, 4)).shape == (2, 0)
    queue.enqueue(_rows(4, 4, seed=5))
    x = F.normalize(_rows(3, 4, seed=6), dim=1)
    scores = queue.scores(x)
    assert scores.shape == (3, 4)
    expected = x.double().numpy() @ queue.ordered().double().numpy().T
    np.testing.assert_allclose(scores.double().numpy(), expected, atol=1e-6)
    # Once wrapped, the columns are in ring order: the same multiset of values as FIFO order, row by row.
    queue.enqueue(_rows(5, 4, seed=7))
    scores = queue.scores(x).double().numpy()
    fifo = x.double().numpy() @ queue.ordered().double().numpy().T
    np.testing.assert_allclose(np.sort(scores, axis=1), np.sort(fifo, axis=1), atol=1e-6)


def test_scores_pass_gradients_to_the_query_only():
    queue = InstanceQueue(size=5, dim=3, init="random")
    x = torch.randn(2, 3, requires_grad=True)
    queue.scores(x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), queue.embeddings.sum(0).expand(2, 3).numpy(), rtol=1e-5)


def test_random_init_is_seeded_unit_and_full():
    first, second = InstanceQueue(8, 5, init="random", seed=3), InstanceQueue(8, 5, init="random", seed=3)
    other = InstanceQueue(8, 5, init="random", seed=4)
    assert len(first) == first.size
    torch.testing.assert_close(first.embeddings, second.embeddings)
    assert not torch.allclose(first.embeddings, other.embeddings)
    np.testing.assert_allclose(first.embeddings.norm(dim=1).numpy(), np.ones(8), rtol=1e-6)
    queue = InstanceQueue(8, 5)
    queue.init_random(torch.Generator().manual_seed(3))
    torch.testing.assert_close(queue.embeddings, first.embeddings)


def test_init_from_real_embeddings():
    queue = InstanceQueue(6, 3, init="random")
    vectors = _rows(4, 3, seed=9)
    queue.init_from(vectors)
    assert len(queue) == 4 < queue.size
    np.testing.assert_allclose(queue.ordered().double().numpy(), _unit(vectors), atol=1e-6)
    queue.init_from(_rows(9, 3, seed=10))
    assert len(queue) == queue.size


def test_state_dict_round_trip_restores_content_and_position():
    queue = InstanceQueue(5, 3)
    for step in range(4):
        queue.enqueue(_rows(2, 3, seed=20 + step))
    state = queue.state_dict()
    assert set(state) == {"embeddings", "pointer", "filled", "groups"}
    restored = InstanceQueue(5, 3, init="random")
    ptr = restored.embeddings.data_ptr()
    restored.load_state_dict(state)
    assert restored.embeddings.data_ptr() == ptr  # loaded in place
    torch.testing.assert_close(restored.ordered(), queue.ordered())
    # Both continue identically.
    nxt = _rows(3, 3, seed=99)
    queue.enqueue(nxt)
    restored.enqueue(nxt)
    torch.testing.assert_close(restored.ordered(), queue.ordered())
    torch.testing.assert_close(restored.state_dict()["pointer"], queue.state_dict()["pointer"])


def test_bad_shapes_raise_clear_errors():
    queue = InstanceQueue(4, 3)
    with pytest.raises(ValueError, match=r"expected \[B, 3\]"):
        queue.enqueue(torch.randn(2, 5))
    with pytest.raises(ValueError, match=r"expected \[B, 3\]"):
        queue.scores(torch.randn(2, 5))
    with pytest.raises(ValueError, match="init must be one of"):
        InstanceQueue(4, 3, init="zeros")


def test_full_size_queue_scores_and_enqueues_in_place():
    """K = 131072 × d = 1024 fp32 (512 MiB): one enqueue/score cycle moves no buffer and scores every row."""
    size, dim, batch = 131072, 1024, 128
    queue = InstanceQueue(size, dim, init="random", seed=0)
    buffer_ptr = queue.embeddings.data_ptr()
    queries = F.normalize(torch.randn(batch, dim, generator=torch.Generator().manual_seed(1)), dim=1)
    for step in range(2):
        scores = queue.scores(queries)  # [B, K] in one matmul
        assert scores.shape == (batch, size)
        columns = torch.tensor([0, 4097, size - 1])
        torch.testing.assert_close(scores[:, columns], queries @ queue.embeddings[columns].T, rtol=1e-4, atol=1e-5)
        queue.enqueue(queries)
        assert queue.embeddings.data_ptr() == buffer_ptr
    # Two batches written at rows [0, 2B): the oldest random rows went first.
    torch.testing.assert_close(queue.flush()[batch:2 * batch], queries, rtol=1e-6, atol=1e-6)
    assert queue.embeddings.data_ptr() == buffer_ptr
    assert int(queue.pointer) == 2 * batch and len(queue) == size


def test_enqueue_is_written_at_the_next_read_so_the_step_graph_stays_valid():
    """Loss order: logits from the queue, enqueue, then backward. The write waits for the next read, so the
    gradient uses the rows the logits were computed with."""
    queue = InstanceQueue(4, 3, init="random", seed=1)
    rows_before = queue.rows().clone()
    x = torch.randn(2, 3, requires_grad=True)
    logits = queue.scores(x)
    queue.enqueue(torch.randn(2, 3))
    logits.sum().backward()  # would raise "modified by an inplace operation" with an immediate write
    torch.testing.assert_close(x.grad, rows_before.sum(0).expand(2, 3))
    assert not torch.allclose(queue.rows(), rows_before)  # the read wrote it
    queue.enqueue(torch.ones(1, 3))
    assert torch.allclose(queue.state_dict()["embeddings"].norm(dim=1), torch.ones(4))
    np.testing.assert_allclose(queue.ordered()[-1].numpy(), np.full(3, 3 ** -0.5), rtol=1e-6)  # state_dict flushed


def test_low_precision_copy_stays_in_step_with_the_buffer():
    """rows(bf16) is the buffer cast to bf16 after every kind of write: enqueues (incremental, across the wrap),
    a batch larger than K, init_random, load_state_dict and an outside write (rebuilt whole). Not state."""
    queue = InstanceQueue(size=7, dim=4, init="random", seed=3)

    def check():
        torch.testing.assert_close(queue.rows(torch.bfloat16), queue.rows().to(torch.bfloat16), rtol=0, atol=0)

    check()
    copy_pointer = queue.rows(torch.bfloat16).data_ptr()
    for step, batch_size in enumerate([3, 3, 3, 2, 5]):  # wraps twice
        queue.enqueue(_rows(batch_size, 4, seed=10 + step))
        check()
    assert queue.rows(torch.bfloat16).data_ptr() == copy_pointer  # written in place, never recast
    queue.enqueue(_rows(9, 4, seed=20))  # more than K rows
    check()
    queue.init_random(torch.Generator().manual_seed(5))
    check()
    other = InstanceQueue(size=7, dim=4)
    other.enqueue(_rows(5, 4, seed=30))
    queue.load_state_dict(other.state_dict())
    check()
    with torch.no_grad():
        queue.embeddings[2].mul_(-1)
    check()
    assert set(queue.state_dict()) == {"embeddings", "pointer", "filled", "groups"}
    scores = queue.scores(F.normalize(_rows(2, 4, seed=40), dim=1), torch.bfloat16)
    assert scores.dtype == torch.bfloat16 and scores.shape == (2, 5)
    out = torch.empty(2, 5, dtype=torch.bfloat16)
    assert queue.scores(F.normalize(_rows(2, 4, seed=40), dim=1), torch.bfloat16, out=out).data_ptr() == out.data_ptr()
    torch.testing.assert_close(out, scores)


# ------------------------------------------------------------------------------------------------------------------
# The ring buffer against the authors' update rules, for any K and B


@pytest.mark.parametrize("size,batch", [(10, 4), (7, 3), (8, 4), (5, 7), (6, 1)])
def test_ring_buffer_keeps_the_authors_set_for_any_queue_and_batch_size(size, batch):
    """CKD: ``concat(batch, queue)[:K]`` from empty; ConGen/SCT: ``concat(queue, batch)[B:]`` from K rows."""
    generator = torch.Generator().manual_seed(size * 100 + batch)
    start = F.normalize(torch.randn(size, 3, generator=generator), dim=1)
    from_empty, from_full = InstanceQueue(size, 3), InstanceQueue(size, 3).init_from(start)
    newest_first = torch.zeros(0, 3)  # CKD's queue, newest row first
    append_last = start.clone()  # ConGen's / SCT's queue, oldest row first
    for step in range(9):
        rows = F.normalize(torch.randn(batch, 3, generator=generator), dim=1)
        from_empty.enqueue(rows)
        from_full.enqueue(rows)
        newest_first = torch.cat([rows.flip(0), newest_first])[:size]
        append_last = torch.cat([append_last, rows])[batch:]
        torch.testing.assert_close(from_empty.ordered(), newest_first.flip(0))
        torch.testing.assert_close(from_full.ordered(), append_last)


def test_groups_follow_their_rows_through_the_ring_and_a_checkpoint():
    queue = InstanceQueue(5, 3)
    for step in range(4):
        queue.enqueue(torch.randn(2, 3), torch.tensor([10 * step, 10 * step + 1]))
    # newest 5 rows in FIFO order: step 1's second row, steps 2 and 3
    assert len(queue) == 5  # a read: applies the pending batch
    pointer = int(queue.pointer)
    fifo = torch.cat([queue.groups[pointer:], queue.groups[:pointer]]).tolist()
    assert fifo == [11, 20, 21, 30, 31]
    assert queue.same_group(torch.tensor([20, 99, -1])).sum(dim=1).tolist() == [1, 0, 0]
    restored = InstanceQueue(5, 3)
    restored.load_state_dict(queue.state_dict())
    assert restored.row_groups().tolist() == queue.row_groups().tolist()
    # a checkpoint written before rows carried groups still loads; its rows have none
    old = {k: v for k, v in queue.state_dict().items() if k != "groups"}
    legacy = InstanceQueue(5, 3)
    legacy.load_state_dict(old)
    assert legacy.row_groups().tolist() == [-1] * 5
    assert queue.init_random().row_groups().tolist() == [-1] * 5
