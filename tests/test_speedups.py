"""models/speedups.py: the CPU learner's changes to the student keep what it computes.

Fast dropout keeps nn.Dropout's law (drop rate, scaling, gradient, train/eval, seeding); the reused sparse embedding
gradient equals the dense one, step after step and when accumulated; the training attention equals sdpa's up to the
dropout mask. The learner applies all three on CPU; none of them reaches a saved model.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from raydistill.models import BiEncoder
from raydistill.models import speedups
from raydistill.models.speedups import (FastDropout, fast_dropout, use_fast_attention_dropout, use_fast_dropout,
                                        use_reused_embedding_grad)
from raydistill.runtime.engine.preflight import preflight


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fast_dropout_has_nn_dropouts_law(dtype):
    torch.manual_seed(0)
    x = torch.ones(1_000_000, dtype=dtype, requires_grad=True)
    out = fast_dropout(x, 0.1)
    kept = out != 0
    drop_rate = 1 - kept.float().mean().item()
    assert abs(drop_rate - 0.1) < 0.002  # binomial sd at n = 1e6 is 0.0003
    scale = 65536 / (65536 - round(0.1 * 65536))  # 1 / (1 - p_eff), p_eff = 6554 / 65536
    torch.testing.assert_close(out[kept].float(), torch.full((int(kept.sum()),), scale), rtol=1e-2, atol=0)
    assert abs(out.float().mean().item() - 1.0) < 0.005  # the expectation is kept
    out.float().sum().backward()
    torch.testing.assert_close(x.grad.float(), torch.where(kept, scale, 0.0), rtol=1e-2, atol=0)  # mask · scale
    # every 16-bit slice of the 64-bit draws is uniform: no position in a group of four drops more often
    per_slot = (~kept).float().view(-1, 4).mean(0)
    assert (per_slot - 0.1).abs().max() < 0.004


def test_fast_dropout_is_seeded_by_torch_and_rejects_bad_p():
    x = torch.randn(64, 32)
    torch.manual_seed(7)
    first = fast_dropout(x, 0.3)
    torch.manual_seed(7)
    torch.testing.assert_close(fast_dropout(x, 0.3), first)
    assert not torch.equal(fast_dropout(x, 0.3), first)
    assert fast_dropout(x, 0.0) is x
    with pytest.raises(ValueError, match=r"dropout probability must be in \[0, 1\)"):
        fast_dropout(x, 1.0)


def test_use_fast_dropout_swaps_every_dropout_and_keeps_the_checkpoint(tiny_bert):
    model = BiEncoder.from_pretrained(tiny_bert, projection_dim=24)
    before = {name: module.p for name, module in model.named_modules() if type(module) is nn.Dropout}
    keys = set(model.state_dict())
    assert use_fast_dropout(model) == len(before) > 0
    after = {name: module for name, module in model.named_modules() if isinstance(module, nn.Dropout)}
    assert set(after) == set(before) and all(type(m) is FastDropout for m in after.values())
    assert {name: m.p for name, m in after.items()} == before
    assert set(model.state_dict()) == keys
    x = torch.randn(4, 8)
    module = next(iter(after.values()))
    module.eval()
    assert module(x) is x  # eval: identity, as nn.Dropout
    module.train()
    assert not torch.equal(module(x), x)


def _embedding_grads(model, batches, reused: bool):
    embedding = model.transformer.get_input_embeddings()
    if reused:
        use_reused_embedding_grad(embedding)
    pointers, grads = [], []
    for features in batches:  # one optimiser-like cycle per batch: backward, read, set to None
        model(features).pow(2).sum().backward()
        pointers.append(embedding.weight.grad.data_ptr())
        grads.append(embedding.weight.grad.clone())
        model.zero_grad(set_to_none=True)
    model(batches[0]).sum().backward()  # two backward passes before zero_grad accumulate
    model(batches[1]).sum().backward()
    grads.append(embedding.weight.grad.clone())
    return grads, pointers


def test_reused_embedding_grad_equals_the_dense_gradient_in_one_buffer(tiny_bert, real_sentences):
    reference_model = BiEncoder.from_pretrained(tiny_bert).eval()
    model = BiEncoder.from_pretrained(tiny_bert).eval()
    batches = [model.tokenize(real_sentences[i:i + 6]) for i in (0, 6, 12)]
    expected, _ = _embedding_grads(reference_model, batches, reused=False)
    got, pointers = _embedding_grads(model, batches, reused=True)
    assert model.transformer.get_input_embeddings().sparse
    for dense, reused in zip(expected, got):
        assert reused.layout == torch.strided
        torch.testing.assert_close(reused, dense)
    assert len(set(pointers)) == 1  # one buffer, step after step
    assert use_reused_embedding_grad(model.transformer.get_input_embeddings()) is not None  # idempotent
    with pytest.raises(TypeError, match="needs an nn.Embedding"):
        use_reused_embedding_grad(nn.Linear(2, 2))


def test_training_attention_equals_sdpa_without_its_dropout(tiny_bert, real_sentences, monkeypatch):
    """With the mask drawn by fast_dropout replaced by 'keep everything', the training path is sdpa's attention:
    same padding mask handling, same outputs and gradients."""
    reference = BiEncoder.from_pretrained(tiny_bert).train()
    model = BiEncoder.from_pretrained(tiny_bert).train()
    for name, module in model.named_modules():  # hidden-state dropout off; the attention's probability stays
        if type(module) is nn.Dropout and not name.endswith("attention.self.dropout"):
            module.p = 0.0
    for module in reference.modules():  # sdpa without any dropout: the deterministic reference
        if type(module) is nn.Dropout:
            module.p = 0.0
    assert model.transformer.config.attention_probs_dropout_prob > 0
    assert use_fast_attention_dropout(model.transformer)
    features = model.tokenize(real_sentences[:7])  # padded: the mask matters
    assert features["attention_mask"].float().mean() < 1
    calls = []
    monkeypatch.setattr(speedups, "fast_dropout", lambda x, p: calls.append(p) or x)
    out, expected = model(features), reference(features)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    assert calls and all(p > 0 for p in calls)  # the training path ran, once per layer
    out.sum().backward()
    expected.sum().backward()
    for (name, a), (_, b) in zip(model.named_parameters(), reference.named_parameters()):
        if b.grad is not None:
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-3, atol=1e-5, msg=name)
    monkeypatch.undo()
    model.eval()  # eval: the sdpa kernel itself, no dropout
    torch.testing.assert_close(model(features), reference.eval()(features), rtol=1e-4, atol=1e-5)


def test_training_attention_drops_in_training_only(tiny_bert, real_sentences):
    model = BiEncoder.from_pretrained(tiny_bert)
    assert use_fast_attention_dropout(model.transformer)
    features = model.tokenize(real_sentences[:4])
    model.eval()
    torch.testing.assert_close(model(features), model(features))
    model.train()
    assert not torch.equal(model(features), model(features))


def test_cpu_learner_applies_the_speedups_and_saves_a_plain_model(tiny_bert, real_sentences, tmp_path):
    import json

    import numpy as np

    from raydistill.config.job import JobConfig
    from raydistill.runtime.engine.learner import DistillLearner

    cfg = preflight(JobConfig.from_dict({
        "method": "simcse", "student": str(tiny_bert), "run_dir": str(tmp_path / "run"),
        "data": {"max_length": 32}, "train": {"batch_size": 8, "lr": 1e-3, "warmup_ratio": 0.0},
        "tracking": {"enabled": False},
    }))
    learner = DistillLearner(cfg, total_steps=4)
    student = learner.student
    assert all(type(m) is FastDropout for m in student.modules() if isinstance(m, nn.Dropout))
    assert student.transformer.get_input_embeddings().sparse
    assert student.transformer.config._attn_implementation == speedups.ATTENTION_NAME
    batch = {"idx": np.arange(8), "text_a": np.array(real_sentences[:8], dtype=object)}
    metrics = learner.train_step(batch)
    assert np.isfinite(metrics["loss"]) and metrics["grad_norm"] > 0
    saved = tmp_path / "saved"
    student.save(saved)
    configs = [json.loads(p.read_text()) for p in saved.rglob("config.json")]
    assert configs and not any(speedups.ATTENTION_NAME in json.dumps(c) for c in configs)
    reloaded = BiEncoder.from_pretrained(saved)
    assert reloaded.transformer.config._attn_implementation == "sdpa"
    assert not reloaded.transformer.get_input_embeddings().sparse


def test_encode_views_is_one_forward_that_splits_back(tiny_bert, real_sentences):
    """StepContext.encode_views: both views in one student call, each view's rows as encode gives them."""
    from raydistill.methods import StepContext

    student = BiEncoder.from_pretrained(tiny_bert, projection_dim=24).eval()  # no dropout: comparable
    ctx = StepContext(student=student, loss=nn.Identity(), device=torch.device("cpu"), step=0, total_steps=1,
                      cfg=None, bucket_tokens=64)
    first, second = real_sentences[:5], real_sentences[5:12]
    calls = []
    handle = student.register_forward_hook(lambda module, args, output: calls.append(output.shape[0]))
    a, b = ctx.encode_views(first, second)
    handle.remove()
    assert sum(calls) == 12  # every row of both views once, in length-sorted groups across the views
    torch.testing.assert_close(a, ctx.encode(first), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(b, ctx.encode(second), rtol=1e-4, atol=1e-5)

