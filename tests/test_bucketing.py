"""Length-bucketed training forward (models.batching.bucketed_forward): same embeddings and gradients as the one
padded batch, less padding; and the learner uses it on CPU unless the config turns it off."""

from __future__ import annotations

import pytest
import torch

from raydistill.models import BiEncoder
from raydistill.models.batching import bucketed_forward, token_budget_batches
from raydistill.models.speedups import use_reused_embedding_grad
from raydistill.runtime.engine.preflight import preflight
from tiny_models import FAMILIES


def test_token_budget_batches_groups_longest_first_within_budget():
    lengths = [5, 30, 12, 30, 7, 100, 12]
    groups = token_budget_batches(lengths, max_tokens=60)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))  # every input exactly once
    assert groups[0] == [5]  # longer than the budget: alone, not dropped
    for group in groups:
        longest = max(lengths[i] for i in group)
        assert [lengths[i] for i in group] == sorted((lengths[i] for i in group), reverse=True)
        assert len(group) == 1 or len(group) * longest <= 60
    assert groups[1] == [1, 3]  # 2 x 30 = 60 fits, a third would not
    with pytest.raises(ValueError, match="max_tokens"):
        token_budget_batches(lengths, 0)


@pytest.mark.parametrize("sparse_embedding", [False, True], ids=["one-lookup", "reused-sparse-grad"])
@pytest.mark.parametrize("family", FAMILIES)
def test_bucketed_forward_matches_the_padded_batch(family, sparse_embedding, tiny_models, real_sentences):
    """Dense embedding gradient: one lookup for the batch, groups get inputs_embeds. Sparse gradient into a reused
    buffer (the CPU learner's): each group looks its own ids up. Both give the padded batch's outputs and gradients,
    the embedding's included."""
    model = BiEncoder.from_pretrained(tiny_models[family], max_length=48, projection_dim=24)
    model.eval()  # no dropout: the two computations must agree
    # Lengths from a few tokens to the truncation limit, in corpus order (not sorted).
    texts = real_sentences[:40] + [" ".join(real_sentences[40:44])]
    features = model.tokenize(texts)
    assert features["attention_mask"].sum().item() < 0.8 * features["attention_mask"].numel()  # real padding

    reference = model(features)
    reference.pow(2).sum().backward()
    expected_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)

    if sparse_embedding:
        use_reused_embedding_grad(model.transformer.get_input_embeddings())
    width = features["attention_mask"].shape[1]
    budget = 4 * width  # several groups
    assert len(token_budget_batches(features["attention_mask"].sum(1).tolist(), budget)) > 2
    bucketed = bucketed_forward(model, features, budget)
    bucketed.pow(2).sum().backward()

    torch.testing.assert_close(bucketed, reference, rtol=1e-4, atol=1e-5)  # input order restored
    for name, param in model.named_parameters():
        if name in expected_grads:
            assert not param.grad.is_sparse, name
            torch.testing.assert_close(param.grad, expected_grads[name], rtol=1e-3, atol=1e-5, msg=name)
    assert model.transformer.get_input_embeddings().weight.grad is not None


def test_bucketed_forward_runs_one_call_when_the_batch_fits(tiny_bert, real_sentences):
    model = BiEncoder.from_pretrained(tiny_bert, max_length=32)
    calls = []
    handle = model.transformer.register_forward_hook(lambda module, args, output: calls.append(1))
    features = model.tokenize(real_sentences[:8])
    bucketed_forward(model, features, None)
    bucketed_forward(model, features, 10_000)
    assert len(calls) == 2
    bucketed_forward(model, features, 2 * features["attention_mask"].shape[1])
    assert len(calls) > 3
    handle.remove()


def _congen_config(student, run_dir, **extra):
    from raydistill.config.job import JobConfig

    return preflight(JobConfig.from_dict({
        "method": "congen", "student": str(student), "teacher": str(student), "run_dir": str(run_dir),
        "data": {"max_length": 32}, "train": {"batch_size": 16, "lr": 1e-3, "warmup_ratio": 0.0},
        "loss": {"queue_size": 64}, "tracking": {"enabled": False}, "extra": extra,
    }))


def test_learner_buckets_the_student_forward_on_cpu(tiny_bert, real_sentences, tmp_path):
    import numpy as np

    from raydistill.models.batching import CPU_TRAIN_BUCKET_TOKENS
    from raydistill.config.job import ConfigError
    from raydistill.runtime.engine.learner import DistillLearner

    assert DistillLearner(_congen_config(tiny_bert, tmp_path), total_steps=4, teacher_dim=24,
                          run_dir=tmp_path).bucket_tokens == CPU_TRAIN_BUCKET_TOKENS
    assert DistillLearner(_congen_config(tiny_bert, tmp_path, bucket_tokens=0), total_steps=4, teacher_dim=24,
                          run_dir=tmp_path).bucket_tokens is None
    with pytest.raises(ConfigError, match="extra.bucket_tokens"):
        _congen_config(tiny_bert, tmp_path, bucket_tokens=-5)

    learner = DistillLearner(_congen_config(tiny_bert, tmp_path, bucket_tokens=64), total_steps=4, teacher_dim=24,
                             run_dir=tmp_path)
    calls = []
    learner.student.transformer.register_forward_hook(lambda module, args, output: calls.append(1))
    teacher = np.random.default_rng(0).standard_normal((16, 24)).astype(np.float32)
    batch = {"idx": np.arange(16), "text_control": np.array(real_sentences[:16], dtype=object),
             "text_generalize": np.array(real_sentences[16:32], dtype=object), "teacher_control": teacher}
    metrics = learner.train_step(batch)
    assert np.isfinite(metrics["loss"]) and metrics["grad_norm"] > 0
    assert len(calls) > 2  # each of the two views went through the transformer in several sub-batches
