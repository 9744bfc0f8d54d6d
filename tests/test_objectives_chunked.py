"""The CPU row-chunked paths of objectives.functional (CHUNK_ELEMENTS): the shared math's tests and the queue losses'
direct-computation tests again, with chunks of a few elements so that every matrix is cut into many row ranges,
including ranges that stop at the boundary between two stacked student views."""

from __future__ import annotations

import pytest
import torch

import raydistill.objectives.functional as functional
import test_objectives as unchunked


@pytest.fixture(autouse=True)
def tiny_chunks(monkeypatch):
    monkeypatch.setattr(functional, "CHUNK_ELEMENTS", 4)


def test_row_chunks_cover_every_row_once_and_stop_at_view_boundaries():
    cpu = torch.device("cpu")
    chunks = functional.row_chunks(10, 2, cpu, period=4)  # 2 rows per chunk; views of 4 rows
    assert chunks == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10)]
    chunks = functional.row_chunks(9, 3, cpu, period=3)  # 1 row per chunk
    assert chunks == [(i, i + 1) for i in range(9)]
    chunks = functional.row_chunks(7, 1, cpu, period=7)  # 4 rows per chunk
    assert chunks == [(0, 4), (4, 7)]
    assert functional.row_chunks(7, 1, torch.device("meta")) == [(0, 7)]  # off the CPU: one range


def test_block_logsumexp_in_chunks_equals_logsumexp_of_the_concatenation():
    a, b = torch.randn(9, 5, dtype=torch.float64), torch.randn(9, 3, dtype=torch.float64)
    expected = torch.logsumexp(torch.cat([a, b], dim=1), dim=1)
    assert len(functional.row_chunks(9, 5, a.device)) > 1
    torch.testing.assert_close(functional.block_logsumexp([a, b, torch.zeros(9, 0, dtype=torch.float64)]), expected)


def test_block_soft_cross_entropy_in_chunks():
    unchunked.test_block_soft_cross_entropy_matches_concat_and_gradcheck()


def test_query_soft_cross_entropy_in_chunks():
    unchunked.test_query_soft_cross_entropy_gradient_to_the_queries()


def test_softmax_blocks_in_chunks():
    unchunked.test_softmax_blocks_in_place_with_entropy()


@pytest.mark.parametrize("alpha", [0.5, 0.8])
def test_congen_in_chunks(alpha):
    unchunked.test_congen_equals_direct_computation(alpha)


@pytest.mark.parametrize("faithful", [False, True])
def test_sct_in_chunks(faithful):
    unchunked.test_sct_self_supervised_equals_direct_computation(faithful)


def test_sct_distill_in_chunks():
    unchunked.test_sct_distill_cd_only_and_joint()


def test_workspace_hands_back_the_same_memory_per_name_and_shape():
    workspace = functional.Workspace()
    cpu = torch.device("cpu")
    first = workspace.get("logits", (3, 5), torch.float32, cpu)
    assert workspace.get("logits", (3, 5), torch.float32, cpu).data_ptr() == first.data_ptr()
    assert workspace.get("other", (3, 5), torch.float32, cpu).data_ptr() != first.data_ptr()
    resized = workspace.get("logits", (4, 5), torch.float32, cpu)
    assert resized.shape == (4, 5) and workspace.get("logits", (4, 5), torch.bfloat16, cpu).dtype == torch.bfloat16


def test_query_soft_cross_entropy_with_bf16_keys_and_a_workspace():
    """The low-precision backward writes softmax − p into a workspace buffer: same gradient as without one."""
    generator = torch.Generator().manual_seed(0)
    keys = torch.nn.functional.normalize(torch.randn(40, 8, generator=generator), dim=1).bfloat16()
    targets = torch.softmax(torch.randn(3, 40, generator=generator), dim=1)
    grads = []
    for workspace in (None, functional.Workspace()):
        queries = torch.randn(6, 8, generator=torch.Generator().manual_seed(1)).requires_grad_()
        logits = (queries.detach().bfloat16() @ keys.T).float()
        functional.query_soft_cross_entropy(queries, [keys], [logits], [targets], workspace=workspace).sum().backward()
        grads.append(queries.grad)
    torch.testing.assert_close(grads[0], grads[1])

