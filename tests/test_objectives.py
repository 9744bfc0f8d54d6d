"""Every loss against an independent direct computation (numpy, explicit loops) on small hand-made tensors, and
which side carries the gradient: teacher / reference inputs get none, the student gets some."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from raydistill.objectives import (
    CKDLoss,
    ConGenLoss,
    CosineMSELoss,
    DvBERTLoss,
    InstanceQueue,
    L2DistillLoss,
    SCTDistillLoss,
    SCTLoss,
    SimCSELoss,
    SoftBCELoss,
    SoftmaxClassifierLoss,
    SupervisedSimCSELoss,
    TeacherAnnealing,
    annealed_target,
    average_pseudo_labels,
    build_nli_triplets,
    cosine_to_target,
)
from raydistill.objectives.functional import query_soft_cross_entropy, soft_cross_entropy, softmax_blocks_

# ------------------------------------------------------------------------------------------------------------------
# Reference math, written out with loops over rows and candidates


def unit(x) -> np.ndarray:
    x = np.asarray(x.detach() if isinstance(x, torch.Tensor) else x, dtype=np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def softmax_row(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def soft_ce(p: np.ndarray, z: np.ndarray) -> float:
    """−Σ_j p_j log softmax(z)_j for one row."""
    log_q = z - z.max() - math.log(np.exp(z - z.max()).sum())
    return float(-sum(p[j] * log_q[j] for j in range(len(z))))


def kl(p: np.ndarray, z: np.ndarray) -> float:
    """KL(p ‖ softmax(z)) for one row."""
    return soft_ce(p, z) + float(sum(p[j] * math.log(p[j]) for j in range(len(p)) if p[j] > 0))


def distribution_loss(target_vecs, target_tau, student_vecs, student_tau, candidates, divergence) -> float:
    """mean_i divergence(softmax(t_i·C/τ_t), s_i·C/τ_s) over explicit candidate rows C."""
    values = []
    for t, s in zip(target_vecs, student_vecs):
        p = softmax_row(np.array([t @ c for c in candidates]) / target_tau)
        z = np.array([s @ c for c in candidates]) / student_tau
        values.append(divergence(p, z))
    return float(np.mean(values))


def info_nce(queries, keys, scale) -> float:
    """mean_i −log softmax(scale·q_i·K)_i with the positive of row i at key i."""
    values = []
    for i, q in enumerate(queries):
        z = np.array([scale * (q @ k) for k in keys])
        values.append(-(z[i] - z.max() - math.log(np.exp(z - z.max()).sum())))
    return float(np.mean(values))


def leaf(rows: int, dim: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, dim, generator=g) * scale).requires_grad_()


def assert_close(actual, expected, rtol=1e-5, atol=1e-6):
    actual = actual.detach() if isinstance(actual, torch.Tensor) else actual
    np.testing.assert_allclose(float(actual), expected, rtol=rtol, atol=atol)


def assert_student_gets_gradient(*tensors):
    for t in tensors:
        assert t.grad is not None and float(t.grad.abs().sum()) > 0


def assert_no_gradient(*tensors):
    for t in tensors:
        assert t.grad is None or float(t.grad.abs().sum()) == 0.0


# ------------------------------------------------------------------------------------------------------------------
# Shared block math


def test_block_soft_cross_entropy_matches_concat_and_gradcheck():
    g = torch.Generator().manual_seed(0)
    z_queue = torch.randn(6, 5, dtype=torch.float64, generator=g, requires_grad=True)
    z_batch = torch.randn(6, 3, dtype=torch.float64, generator=g, requires_grad=True)
    target = torch.softmax(torch.randn(3, 8, dtype=torch.float64, generator=g), dim=1)  # shared by 2 stacked views
    blocks = [target[:, :5].contiguous(), target[:, 5:].contiguous()]
    rows = soft_cross_entropy([z_queue, z_batch], blocks)
    full = torch.cat([z_queue, z_batch], dim=1).detach().numpy()
    expected = [soft_ce(target[i % 3].numpy(), full[i]) for i in range(6)]
    np.testing.assert_allclose(rows.detach().numpy(), expected, rtol=1e-10)
    assert torch.autograd.gradcheck(lambda a, b: soft_cross_entropy([a, b], blocks), (z_queue, z_batch))
    eye = torch.eye(6, 3, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda a, b: soft_cross_entropy([a, b], [None, eye]), (z_queue, z_batch))


def test_query_soft_cross_entropy_gradient_to_the_queries():
    g = torch.Generator().manual_seed(1)
    queries = torch.randn(4, 3, dtype=torch.float64, generator=g, requires_grad=True)
    queue_keys, batch_keys = torch.randn(5, 3, dtype=torch.float64, generator=g), torch.randn(2, 3, dtype=torch.float64, generator=g)
    target = torch.softmax(torch.randn(2, 7, dtype=torch.float64, generator=g), dim=1)  # shared by 2 stacked views
    targets = [target[:, :5].contiguous(), target[:, 5:].contiguous()]

    def fused(q):
        with torch.no_grad():
            logits = [q @ queue_keys.T, q @ batch_keys.T]
        return query_soft_cross_entropy(q, [queue_keys, batch_keys], logits, targets)

    def composite(q):
        return soft_cross_entropy([q @ queue_keys.T, q @ batch_keys.T], targets)

    torch.testing.assert_close(fused(queries), composite(queries))
    # Vector-Jacobian products against the composite (itself gradchecked above) for random row weights. (No
    # gradcheck here: the fused backward consumes its logits, so a graph can be back-propagated only once.)
    for seed in range(3):
        weights = torch.rand(4, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        grad_fused, = torch.autograd.grad((fused(queries) * weights).sum(), queries)
        grad_composite, = torch.autograd.grad((composite(queries) * weights).sum(), queries)
        torch.testing.assert_close(grad_fused, grad_composite)
    with pytest.raises(ValueError, match="no graph"):
        query_soft_cross_entropy(queries, [queue_keys], [queries @ queue_keys.T], [None])


def test_softmax_blocks_in_place_with_entropy():
    a, b = torch.randn(3, 4), torch.randn(3, 2)
    full = torch.cat([a, b], dim=1)
    probs, neg_entropy = softmax_blocks_([a.clone(), b.clone()], with_neg_entropy=True)
    torch.testing.assert_close(torch.cat(probs, dim=1), torch.softmax(full, dim=1))
    torch.testing.assert_close(neg_entropy, (torch.softmax(full, 1) * torch.log_softmax(full, 1)).sum(1))
    with pytest.raises(ValueError, match="no_grad"):
        softmax_blocks_([torch.randn(2, 2, requires_grad=True)])


# ------------------------------------------------------------------------------------------------------------------
# ConGen


@pytest.mark.parametrize("alpha", [0.5, 0.8])
def test_congen_equals_direct_computation(alpha):
    B, D, K, tau_t, tau_s = 3, 4, 5, 0.05, 0.07
    loss_fn = ConGenLoss(queue_size=K, tau_teacher=tau_t, tau_student=tau_s, dim=D, alpha=alpha)
    queue_rows = torch.randn(K, D, generator=torch.Generator().manual_seed(1))
    loss_fn.queue.init_from(queue_rows)
    teacher = leaf(B, D, seed=2)
    control, generalize = leaf(B, D, seed=3), leaf(B, D, seed=4)

    out = loss_fn({"student_control": control, "student_generalize": generalize, "teacher": teacher})

    candidates = list(unit(queue_rows)) + list(unit(teacher))  # queue ++ current teacher batch, appended LAST
    con = distribution_loss(unit(teacher), tau_t, unit(control), tau_s, candidates, soft_ce)
    gen = distribution_loss(unit(teacher), tau_t, unit(generalize), tau_s, candidates, soft_ce)
    assert_close(out.loss, alpha * con + (1 - alpha) * gen)
    assert_close(out.parts["con"], con)
    assert_close(out.parts["gen"], gen)
    out.loss.backward()
    assert_student_gets_gradient(control, generalize)
    assert_no_gradient(teacher)
    # The teacher batch was enqueued after the logits: FIFO keeps the newest K of queue ++ teacher.
    np.testing.assert_allclose(loss_fn.queue.ordered().double().numpy(), np.stack(candidates[-K:]), atol=1e-6)


def test_congen_bf16_products_match_fp32_up_to_bf16_rounding():
    """precision="bf16": the teacher's and the student's logits against the queue, and the student's gradient,
    from bfloat16 products (softmaxes in fp32). Loss and gradients agree with the fp32 loss to bf16's ~3 significant
    digits, and the queue itself is stored and advanced in fp32 exactly as in fp32 mode."""
    B, D, K = 8, 64, 256
    queue_rows = torch.randn(K, D, generator=torch.Generator().manual_seed(1))
    results = {}
    for precision in ("fp32", "bf16"):
        loss_fn = ConGenLoss(queue_size=K, dim=D, precision=precision)
        loss_fn.queue.init_from(queue_rows)
        teacher, control, generalize = leaf(B, D, seed=2), leaf(B, D, seed=3), leaf(B, D, seed=4)
        out = loss_fn({"student_control": control, "student_generalize": generalize, "teacher": teacher})
        out.loss.backward()
        results[precision] = (out.loss.detach(), control.grad, generalize.grad, loss_fn.queue.ordered().clone())
    (loss32, con32, gen32, queue32), (loss16, con16, gen16, queue16) = results["fp32"], results["bf16"]
    assert loss16.dtype == torch.float32 and con16.dtype == torch.float32
    torch.testing.assert_close(loss16, loss32, rtol=1e-2, atol=0)
    for grad16, grad32 in ((con16, con32), (gen16, gen32)):
        assert (grad16 - grad32).norm() < 0.05 * grad32.norm()
    assert not torch.equal(con16, con32)  # the bf16 path really ran
    assert queue16.dtype == torch.float32 and torch.equal(queue16, queue32)
    with pytest.raises(ValueError, match="precision must be 'fp32' or 'bf16'"):
        ConGenLoss(queue_size=K, dim=D, precision="fp16")


def test_congen_partly_filled_queue_uses_filled_rows_only():
    B, D = 2, 3
    loss_fn = ConGenLoss(queue_size=8, dim=D, queue_init="empty")
    teacher, control, generalize = leaf(B, D, 5), leaf(B, D, 6), leaf(B, D, 7)
    out = loss_fn({"student_control": control, "student_generalize": generalize, "teacher": teacher})
    candidates = list(unit(teacher))  # empty queue: only the current batch
    expected = 0.5 * (distribution_loss(unit(teacher), 0.05, unit(control), 0.07, candidates, soft_ce)
                      + distribution_loss(unit(teacher), 0.05, unit(generalize), 0.07, candidates, soft_ce))
    assert_close(out.loss, expected)
    assert len(loss_fn.queue) == 2


def test_congen_errors_name_the_problem():
    loss_fn = ConGenLoss(queue_size=4, dim=3)
    with pytest.raises(KeyError, match="student_generalize"):
        loss_fn({"student_control": torch.randn(2, 3), "teacher": torch.randn(2, 3)})
    with pytest.raises(ValueError, match="projection_dim"):
        loss_fn({"student_control": torch.randn(2, 5), "student_generalize": torch.randn(2, 5),
                 "teacher": torch.randn(2, 3)})
    with pytest.raises(ValueError, match="same batch size"):
        loss_fn({"student_control": torch.randn(2, 3), "student_generalize": torch.randn(3, 3),
                 "teacher": torch.randn(2, 3)})


# ------------------------------------------------------------------------------------------------------------------
# SCT


def _cross_view_expected(online_a, online_b, ref_a, ref_b, queue_a_rows, queue_b_rows, tau_t, tau_s):
    cand_a = list(unit(queue_a_rows)) + list(unit(ref_a))
    cand_b = list(unit(queue_b_rows)) + list(unit(ref_b))
    kl_a = distribution_loss(unit(ref_a), tau_t, unit(online_b), tau_s, cand_a, kl)  # view B predicts A
    kl_b = distribution_loss(unit(ref_b), tau_t, unit(online_a), tau_s, cand_b, kl)  # view A predicts B
    return kl_a, kl_b


@pytest.mark.parametrize("faithful", [False, True])
def test_sct_self_supervised_equals_direct_computation(faithful):
    B, d, K, tau_t, tau_s = 3, 4, 5, 0.02, 0.03
    torch.manual_seed(0)
    loss_fn = SCTLoss(queue_size=K, tau_teacher=tau_t, tau_student=tau_s, dim=d, faithful=faithful,
                      projector_expansion=2)
    queue_a_rows, queue_b_rows = loss_fn.queue_a.ordered().clone(), loss_fn.queue_b.ordered().clone()
    assert not torch.allclose(queue_a_rows, queue_b_rows)  # two independent random queues
    online_a, online_b = leaf(B, d, 1), leaf(B, d, 2)
    ref_a, ref_b = leaf(B, d, 3), leaf(B, d, 4)  # with requires_grad on purpose: the loss must detach them

    out = loss_fn({"online_a": online_a, "online_b": online_b, "reference_a": ref_a, "reference_b": ref_b})

    with torch.no_grad():  # the projector is part of the online branch; apply it to get the online vectors
        projected_a, projected_b = loss_fn.projector(online_a), loss_fn.projector(online_b)
    kl_a, kl_b = _cross_view_expected(projected_a, projected_b, ref_a, ref_b, queue_a_rows, queue_b_rows, tau_t, tau_s)
    weight = 1.0 if faithful else 0.5
    assert_close(out.loss, weight * (kl_a + kl_b))
    assert_close(out.parts["kl_a"], kl_a)
    assert_close(out.parts["kl_b"], kl_b)
    out.loss.backward()
    assert_student_gets_gradient(online_a, online_b)
    assert_no_gradient(ref_a, ref_b)
    assert all(p.grad is not None for p in loss_fn.projector.parameters())
    np.testing.assert_allclose(loss_fn.queue_a.ordered()[-B:].double().numpy(), unit(ref_a), atol=1e-6)
    np.testing.assert_allclose(loss_fn.queue_b.ordered()[-B:].double().numpy(), unit(ref_b), atol=1e-6)


def test_sct_projector_shape():
    loss_fn = SCTLoss(queue_size=4, dim=6)
    linears = [m for m in loss_fn.projector.modules() if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(6, 60), (60, 6)] * 3


def test_sct_distill_cd_only_and_joint():
    B, D, K, tau_t, tau_s = 2, 4, 3, 0.04, 0.05
    torch.manual_seed(1)
    student_a, student_b = leaf(B, D, 1), leaf(B, D, 2)
    teacher_a, teacher_b = leaf(B, D, 3), leaf(B, D, 4)
    ref_a, ref_b = leaf(B, D, 5), leaf(B, D, 6)

    cd_only = SCTDistillLoss(queue_size=K, tau_teacher=tau_t, tau_student=tau_s, dim=D, objective="cd_only")
    qa, qb = cd_only.queue_a.ordered().clone(), cd_only.queue_b.ordered().clone()
    out = cd_only({"student_a": student_a, "student_b": student_b, "teacher_a": teacher_a, "teacher_b": teacher_b})
    cd_a, cd_b = _cross_view_expected(student_a, student_b, teacher_a, teacher_b, qa, qb, tau_t, tau_s)
    assert_close(out.loss, 0.5 * (cd_a + cd_b))
    assert cd_only.self_supervised is None
    out.loss.backward()
    assert_student_gets_gradient(student_a, student_b)
    assert_no_gradient(teacher_a, teacher_b)

    joint = SCTDistillLoss(queue_size=K, tau_teacher=tau_t, tau_student=tau_s, dim=D, faithful=True,
                           projector_expansion=2)
    qa, qb = joint.queue_a.ordered().clone(), joint.queue_b.ordered().clone()
    sa, sb = joint.self_supervised.queue_a.ordered().clone(), joint.self_supervised.queue_b.ordered().clone()
    features = {"student_a": student_a, "student_b": student_b, "teacher_a": teacher_a, "teacher_b": teacher_b,
                "reference_a": ref_a, "reference_b": ref_b}
    out = joint(features)
    with torch.no_grad():
        pa, pb = joint.self_supervised.projector(student_a), joint.self_supervised.projector(student_b)
    # L_SCT has its own temperatures (SCT's self-supervised defaults), not L_CD's
    assert (joint.self_supervised.tau_teacher, joint.self_supervised.tau_student) == (0.02, 0.03)
    sct_a, sct_b = _cross_view_expected(pa, pb, ref_a, ref_b, sa, sb, 0.02, 0.03)
    cd_a, cd_b = _cross_view_expected(student_a, student_b, teacher_a, teacher_b, qa, qb, tau_t, tau_s)
    assert_close(out.loss, (sct_a + sct_b) + (cd_a + cd_b))  # faithful: summed KLs; Eq. 3: L_SCT + L_CD
    with pytest.raises(KeyError, match="reference_a"):
        joint({k: v for k, v in features.items() if not k.startswith("reference")})
    with pytest.raises(TypeError, match="TWO queues"):
        SCTDistillLoss(queue_size=K, dim=D, queue=InstanceQueue(K, D))


# ------------------------------------------------------------------------------------------------------------------
# CKD and DistilCSE stage 2


def test_ckd_equals_direct_infonce_with_current_batch_first_then_queue():
    B, D, K = 3, 4, 8
    loss_fn = CKDLoss(queue_size=K, temperature=0.1, learnable_temperature=False, dim=D)
    assert len(loss_fn.queue) == 0  # authors: the queue starts empty
    first_teacher = leaf(B, D, 1)
    loss_fn({"student": leaf(B, D, 2), "teacher": first_teacher})
    student, teacher = leaf(B, D, 3), leaf(B, D, 4)
    out = loss_fn({"student": student, "teacher": teacher})
    keys = list(unit(teacher)) + list(unit(first_teacher))  # current batch FIRST, then the queue
    assert_close(out.loss, info_nce(unit(student), keys, 10.0))
    assert_close(out.parts["scale"], 10.0)
    out.loss.backward()
    assert_student_gets_gradient(student)
    assert_no_gradient(teacher)
    assert len(loss_fn.queue) == 2 * B


def test_ckd_learnable_scale_gets_gradient_and_is_clamped():
    B, D = 4, 3
    loss_fn = CKDLoss(queue_size=0, temperature=math.exp(-1.0), learnable_temperature=True, dim=D, max_scale=50.0)
    student, teacher = leaf(B, D, 1), leaf(B, D, 2)
    out = loss_fn({"student": student, "teacher": teacher})
    assert_close(out.parts["scale"], math.e, rtol=1e-6)
    assert_close(out.loss, info_nce(unit(student), list(unit(teacher)), math.e))
    out.loss.backward()
    assert loss_fn.scale.log_scale.grad is not None and float(loss_fn.scale.log_scale.grad) != 0.0
    with torch.no_grad():
        loss_fn.scale.log_scale.fill_(10.0)  # e^10 ≫ 50
    assert_close(loss_fn.scale(), 50.0, rtol=1e-6)
    with pytest.raises(ValueError, match="min_scale, max_scale"):
        CKDLoss(queue_size=0, temperature=0.001, dim=D)  # scale 1000 > max_scale 100


def test_ckd_optional_mse_term():
    B, D = 2, 3
    loss_fn = CKDLoss(queue_size=0, temperature=0.5, learnable_temperature=False, mse_weight=2.0, dim=D)
    student, teacher = leaf(B, D, 1), leaf(B, D, 2)
    out = loss_fn({"student": student, "teacher": teacher})
    mse = float(np.mean((student.detach().numpy() - teacher.detach().numpy()) ** 2))
    assert_close(out.loss, info_nce(unit(student), list(unit(teacher)), 2.0) + 2.0 * mse)


def test_supervised_simcse_with_hard_negatives():
    B, d = 3, 4
    loss_fn = SupervisedSimCSELoss(tau=0.05)
    anchor, positive, negative = leaf(B, d, 1), leaf(B, d, 2), leaf(B, d, 3)
    out = loss_fn({"anchor": anchor, "positive": positive, "negative": negative})
    keys = list(unit(positive)) + list(unit(negative))  # every positive and every hard negative
    assert_close(out.loss, info_nce(unit(anchor), keys, 20.0))
    out.loss.backward()
    assert_student_gets_gradient(anchor, positive, negative)
    no_negatives = loss_fn({"anchor": anchor, "positive": positive})
    assert_close(no_negatives.loss, info_nce(unit(anchor), list(unit(positive)), 20.0))


def test_build_nli_triplets():
    records = [
        {"premise": "A man sleeps.", "hypothesis": "A person rests.", "label": "entailment"},
        {"premise": "A man sleeps.", "hypothesis": "A man runs.", "label": "contradiction"},
        {"premise": "A man sleeps.", "hypothesis": "A man dreams.", "label": "neutral"},
        {"premise": "A man sleeps.", "hypothesis": "Someone is asleep.", "label": "entailment"},
        {"premise": "Dogs play.", "hypothesis": "Animals play.", "label": "entailment"},  # no contradiction: dropped
    ]
    assert build_nli_triplets(records) == [("A man sleeps.", "A person rests.", "A man runs."),
                                           ("A man sleeps.", "Someone is asleep.", "A man runs.")]
    with pytest.raises(ValueError, match="record 1: field 'label'"):
        build_nli_triplets([records[0], {**records[1], "label": "contra"}])
    with pytest.raises(ValueError, match="field 'premise' missing"):
        build_nli_triplets([{"hypothesis": "x", "label": "entailment"}])


def test_nli_triplets_from_the_bundled_sets():
    from raydistill.objectives import load_nli_triplets

    triplets = load_nli_triplets(("snli_dev",))
    assert len(triplets) > 3000
    premise, positive, negative = triplets[0]
    assert premise and positive and negative and positive != negative


def test_nli_triplets_hold_no_evaluation_sentence():
    """The public loader is a training path like any other: the unfiltered dev sets hold scored STS/SICK text."""
    from raydistill.data.evaluation_text import evaluation_key, evaluation_keys
    from raydistill.objectives import load_nli_triplets

    keys = evaluation_keys()
    leaked = {text for triplet in load_nli_triplets() for text in triplet if evaluation_key(text) in keys}
    assert not leaked, f"{len(leaked)} evaluation sentences, e.g. {sorted(leaked)[:3]}"


# ------------------------------------------------------------------------------------------------------------------
# Baselines


def test_simcse_equals_direct_infonce_and_both_views_train():
    B, d = 4, 5
    first, second = leaf(B, d, 1), leaf(B, d, 2)
    out = SimCSELoss(tau=0.05)({"first": first, "second": second})
    assert_close(out.loss, info_nce(unit(first), list(unit(second)), 20.0))
    out.loss.backward()
    assert_student_gets_gradient(first, second)


def test_l2_distillation():
    student, teacher = leaf(3, 4, 1), leaf(3, 4, 2)
    out = L2DistillLoss(normalize=False)({"student": student, "teacher": teacher})
    diff = student.detach().numpy() - teacher.detach().numpy()
    assert_close(out.loss, sum(float(v) ** 2 for v in diff.ravel()) / diff.size)
    out.loss.backward()
    assert_student_gets_gradient(student)
    assert_no_gradient(teacher)
    normalized = L2DistillLoss()({"student": student, "teacher": teacher})  # default: normalised
    assert_close(normalized.loss, float(np.mean((unit(student) - unit(teacher)) ** 2)))


# ------------------------------------------------------------------------------------------------------------------
# DvBERT


def test_teacher_annealing_rises_linearly_from_zero_to_one():
    schedule = TeacherAnnealing(total_steps=10)
    assert [schedule(s) for s in (0, 5, 10, 20)] == [0.0, 0.5, 1.0, 1.0]
    with pytest.raises(ValueError):
        TeacherAnnealing(0)


def test_annealed_target_mixes_gold_and_mean_teacher_probabilities():
    teacher_logits = torch.tensor([[[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])  # 1 pair, 2 teachers, 3 classes
    gold = torch.tensor([2])
    mean_probs = (softmax_row(np.array([2.0, 0, 0])) + softmax_row(np.array([0, 1.0, 0]))) / 2
    for lam in (0.0, 0.3, 1.0):
        expected = lam * np.eye(3)[2] + (1 - lam) * mean_probs
        np.testing.assert_allclose(annealed_target(gold, teacher_logits, lam).numpy()[0], expected, rtol=1e-6)


def test_dvbert_loss_equals_direct_computation_and_advances_the_schedule():
    B, d = 3, 2
    torch.manual_seed(0)
    loss_fn = DvBERTLoss(dim=d, total_steps=4)
    u, v = leaf(B, d, 1), leaf(B, d, 2)
    teacher_logits = leaf(B * 2 * 3, 1, 3).reshape(B, 2, 3)  # grad-requiring non-leaf: must be detached
    gold = torch.tensor([0, 2, 1])
    W, b = loss_fn.classifier.weight.detach().numpy(), loss_fn.classifier.bias.detach().numpy()
    U, V, T = u.detach().numpy(), v.detach().numpy(), teacher_logits.detach().numpy()
    for step in range(3):
        out = loss_fn({"u": u, "v": v, "teacher_logits": teacher_logits}, gold)
        lam = step / 4
        expected = []
        for i in range(B):
            features = np.concatenate([U[i], V[i], np.abs(U[i] - V[i])])
            logits = W @ features + b
            teacher_mean = (softmax_row(T[i, 0]) + softmax_row(T[i, 1])) / 2
            target = lam * np.eye(3)[gold[i]] + (1 - lam) * teacher_mean
            expected.append(soft_ce(target, logits))
        assert_close(out.loss, float(np.mean(expected)))
        assert out.parts["lambda"] == lam
    assert int(loss_fn.steps_done) == 3 and "steps_done" in loss_fn.state_dict()
    out.loss.backward()
    assert_student_gets_gradient(u, v)
    loss_fn.eval()
    loss_fn({"u": u, "v": v, "teacher_probs": torch.full((B, 3), 1 / 3)}, gold)
    assert int(loss_fn.steps_done) == 3  # evaluation passes do not advance the schedule


def test_softmax_classifier_hard_labels_match_cross_entropy():
    loss_fn = SoftmaxClassifierLoss(dim=4, num_labels=3)
    u, v = torch.randn(5, 4), torch.randn(5, 4)
    gold = torch.tensor([0, 1, 2, 1, 0])
    out = loss_fn({"u": u, "v": v}, gold)
    logits = loss_fn.classifier(torch.cat([u, v, (u - v).abs()], 1))
    assert_close(out.loss, float(F.cross_entropy(logits, gold).detach()))


# ------------------------------------------------------------------------------------------------------------------
# Trans-Encoder


def test_soft_bce_equals_softplus_formula_for_any_target():
    logits = torch.tensor([0.5, -1.0, 2.0, 0.0], requires_grad=True)
    targets = torch.tensor([0.9, 0.1, -0.3, 0.5])  # a raw negative cosine, as the authors feed
    out = SoftBCELoss()({"logits": logits}, targets)
    expected = np.mean([math.log1p(math.exp(x)) - t * x for x, t in zip(logits.tolist(), targets.tolist())])
    assert_close(out.loss, expected)
    assert out.parts["targets_outside_01"] == 0.25
    out.loss.backward()
    assert_student_gets_gradient(logits)
    column = SoftBCELoss()({"logits": logits.detach()[:, None]}, targets)  # [B, 1] logits accepted
    assert_close(column.loss, expected)


def test_cosine_mse_and_its_alias_keys():
    u, v = leaf(3, 4, 1), leaf(3, 4, 2)
    targets = torch.tensor([0.2, 0.9, 0.5])
    out = CosineMSELoss()({"u": u, "v": v}, targets)
    cos = np.sum(unit(u) * unit(v), axis=1)
    assert_close(out.loss, float(np.mean((cos - targets.numpy()) ** 2)))
    alias = CosineMSELoss()({"embeddings_a": u, "embeddings_b": v}, targets)
    assert_close(alias.loss, float(out.loss.detach()))
    out.loss.backward()
    assert_student_gets_gradient(u, v)


def test_cosine_to_target_modes():
    cos = np.array([-0.5, 0.0, 0.4, 1.0])
    np.testing.assert_allclose(cosine_to_target(cos, "clip"), [0.0, 0.0, 0.4, 1.0])
    np.testing.assert_allclose(cosine_to_target(cos, "affine"), [0.25, 0.5, 0.7, 1.0])
    np.testing.assert_allclose(cosine_to_target(cos, "raw"), cos)
    torch.testing.assert_close(cosine_to_target(torch.tensor([-0.2, 0.3]), "clip"), torch.tensor([0.0, 0.3]))
    assert cosine_to_target(-0.4) == 0.0  # default is "clip"
    assert isinstance(cosine_to_target(torch.tensor([0.1]), "affine"), torch.Tensor)
    with pytest.raises(ValueError, match="one of"):
        cosine_to_target(cos, "sigmoid")


def test_raw_negative_targets_make_bce_unbounded_but_clip_does_not():
    """Why "clip" is the default: with a negative target the BCE keeps decreasing as the logit goes to −∞."""
    logits = torch.tensor([-5.0, -50.0, -500.0])
    raw = [float(SoftBCELoss()({"logits": x[None]}, torch.tensor([-0.3])).loss) for x in logits]
    clipped = [float(SoftBCELoss()({"logits": x[None]}, torch.tensor([cosine_to_target(-0.3, "clip")])).loss)
               for x in logits]
    assert raw[0] > raw[1] > raw[2] and raw[2] < -100
    assert min(clipped) >= 0.0


def test_average_pseudo_labels_is_the_plain_mean():
    np.testing.assert_allclose(average_pseudo_labels([[0.1, 0.5], np.array([0.3, 0.9])]), [0.2, 0.7])
    with pytest.raises(ValueError, match="one shape"):
        average_pseudo_labels([[0.1, 0.2], [0.3]])
    with pytest.raises(ValueError, match="no label arrays"):
        average_pseudo_labels([])


def test_dev_weighted_labels_lean_on_the_family_that_is_better_on_dev():
    from raydistill.objectives.trans_encoder import dev_weights

    weights = dev_weights([84.0, 80.0], temperature=2.0)
    np.testing.assert_allclose(weights, [np.e**2 / (np.e**2 + 1), 1 / (np.e**2 + 1)])  # 4 dev points at T = 2
    np.testing.assert_allclose(dev_weights([84.0, 80.0], temperature=1e6), [0.5, 0.5], atol=1e-5)  # large T: plain mean
    np.testing.assert_allclose(average_pseudo_labels([[0.0, 1.0], [1.0, 1.0]], weights=[3.0, 1.0]), [0.25, 1.0])
    np.testing.assert_allclose(average_pseudo_labels([[0.1, 0.5], [0.3, 0.9]], weights=[1.0, 1.0]), [0.2, 0.7])
    for bad in ([1.0], [-1.0, 2.0], [0.0, 0.0], [np.nan, 1.0]):
        with pytest.raises(ValueError, match="non-negative weights"):
            average_pseudo_labels([[0.1], [0.2]], weights=bad)
    with pytest.raises(ValueError, match="temperature"):
        dev_weights([80.0, 70.0], temperature=0.0)


def test_losses_import_without_ray():
    import subprocess
    import sys

    code = "import sys, raydistill.objectives, raydistill.augment; assert 'ray' not in sys.modules, 'ray imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------------------------------------------------------
# Same-group masking: a sibling caption's teacher vector is not a negative


def _drop(candidates: list, keep: list[bool]) -> list:
    return [c for c, k in zip(candidates, keep) if k]


def test_congen_same_group_mask_equals_the_loss_without_those_candidates():
    B, D, K, tau_t, tau_s = 3, 4, 5, 0.05, 0.07
    queue_rows = torch.randn(K, D, generator=torch.Generator().manual_seed(1))
    queue_groups = torch.tensor([7, 8, 9, 7, 11])
    groups = torch.tensor([7, 9, 7])  # rows 0 and 2 are siblings (one image); row 1 shares a group with queue row 2
    teacher = leaf(B, D, seed=2)
    control, generalize = leaf(B, D, seed=3), leaf(B, D, seed=4)
    loss_fn = ConGenLoss(queue_size=K, tau_teacher=tau_t, tau_student=tau_s, dim=D)
    loss_fn.queue.init_from(queue_rows, queue_groups)
    out = loss_fn({"student_control": control, "student_generalize": generalize, "teacher": teacher,
                   "group": groups})

    queue_c, batch_c = list(unit(queue_rows)), list(unit(teacher))
    con, gen = [], []
    for i in range(B):  # per row: its candidates without same-group ones (its own positive kept)
        cands = (_drop(queue_c, [int(g) != int(groups[i]) for g in queue_groups])
                 + _drop(batch_c, [j == i or int(groups[j]) != int(groups[i]) for j in range(B)]))
        con.append(distribution_loss(unit(teacher)[i:i + 1], tau_t, unit(control)[i:i + 1], tau_s, cands, soft_ce))
        gen.append(distribution_loss(unit(teacher)[i:i + 1], tau_t, unit(generalize)[i:i + 1], tau_s, cands, soft_ce))
    assert_close(out.loss, 0.5 * np.mean(con) + 0.5 * np.mean(gen))
    out.loss.backward()
    assert torch.isfinite(control.grad).all() and torch.isfinite(generalize.grad).all()
    # the enqueued rows carry their groups
    assert loss_fn.queue.ordered().shape[0] == K
    assert loss_fn.queue.row_groups().tolist().count(7) >= 2

    unmasked = ConGenLoss(queue_size=K, tau_teacher=tau_t, tau_student=tau_s, dim=D, mask_same_group=False)
    unmasked.queue.init_from(queue_rows, queue_groups)
    plain = unmasked({"student_control": control, "student_generalize": generalize, "teacher": teacher,
                      "group": groups})
    candidates = queue_c + batch_c
    expected = 0.5 * distribution_loss(unit(teacher), tau_t, unit(control), tau_s, candidates, soft_ce) + \
        0.5 * distribution_loss(unit(teacher), tau_t, unit(generalize), tau_s, candidates, soft_ce)
    assert_close(plain.loss, expected)
    assert float(plain.loss.detach()) != pytest.approx(float(out.loss.detach()))


def test_ckd_same_group_keys_are_not_negatives():
    B, D, K = 3, 4, 8
    loss_fn = CKDLoss(queue_size=K, temperature=0.1, learnable_temperature=False, dim=D)
    first_teacher = leaf(B, D, 1)
    loss_fn({"student": leaf(B, D, 2), "teacher": first_teacher, "group": torch.tensor([5, 6, 7])})
    student, teacher = leaf(B, D, 3), leaf(B, D, 4)
    groups = torch.tensor([5, 9, 9])  # row 0's earlier copy is queued; rows 1 and 2 are siblings
    out = loss_fn({"student": student, "teacher": teacher, "group": groups})
    queued_groups = [5, 6, 7]
    values = []
    for i in range(B):
        keys = [unit(teacher)[i]] + _drop(list(unit(teacher)), [j != i and int(groups[j]) != int(groups[i])
                                                                 for j in range(B)])
        keys += _drop(list(unit(first_teacher)), [g != int(groups[i]) for g in queued_groups])
        values.append(info_nce(unit(student)[i:i + 1], keys, 10.0))  # the positive is key 0 here
    assert_close(out.loss, float(np.mean(values)))
    out.loss.backward()
    assert torch.isfinite(student.grad).all()


def test_sct_distill_masks_same_group_in_both_terms():
    B, D, K = 4, 3, 6
    torch.manual_seed(0)
    features = {"student_a": leaf(B, D, 1), "student_b": leaf(B, D, 2), "teacher_a": leaf(B, D, 3),
                "teacher_b": leaf(B, D, 4)}
    masked = SCTDistillLoss(queue_size=K, dim=D, objective="cd_only")
    plain = SCTDistillLoss(queue_size=K, dim=D, objective="cd_only", mask_same_group=False)
    groups = torch.tensor([1, 1, 2, 3])
    a = masked({**features, "group": groups}).loss
    b = plain({**features, "group": groups}).loss
    c = masked(features).loss  # no groups: nothing masked
    d = plain(features).loss
    assert torch.isfinite(a) and float(a.detach()) != pytest.approx(float(b.detach()))
    assert float(c.detach()) == pytest.approx(float(d.detach()))


# ------------------------------------------------------------------------------------------------------------------
# CKD's learned scale


def test_learned_scale_cannot_start_at_its_clamp_bound():
    with pytest.raises(ValueError, match="cannot start at its clamp bound"):
        CKDLoss(queue_size=0, temperature=1.0, learnable_temperature=True, dim=3)  # scale 1 = the floor
    with pytest.raises(ValueError, match="cannot start at its clamp bound"):
        CKDLoss(queue_size=0, temperature=0.01, learnable_temperature=True, dim=3)  # scale 100 = the cap
    CKDLoss(queue_size=0, temperature=1.0, learnable_temperature=False, dim=3)  # a fixed scale may sit there


def test_learned_scale_moves_off_its_start_in_a_short_run():
    """With the authors' start (scale e) the learned scale leaves it within a few optimiser steps."""
    B, D = 16, 8
    torch.manual_seed(0)
    encoder = torch.nn.Linear(D, D)
    loss_fn = CKDLoss(queue_size=32, temperature=math.exp(-1.0), learnable_temperature=True, dim=D)
    optimizer = torch.optim.AdamW(list(encoder.parameters()) + list(loss_fn.parameters()), lr=1e-2)
    start = float(loss_fn.scale().detach())
    for step in range(10):
        x = torch.randn(B, D)
        out = loss_fn({"student": encoder(x), "teacher": x})
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
    assert abs(float(loss_fn.scale().detach()) - start) > 0.05, (start, float(loss_fn.scale().detach()))


def test_logit_cross_entropy_is_torch_cross_entropy_and_reports_accuracy():
    from raydistill.objectives import LogitCrossEntropyLoss

    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 3.0], [0.5, 0.2, 0.1], [0.0, 4.0, 0.0]], requires_grad=True)
    gold = torch.tensor([0, 2, 1, 1])
    out = LogitCrossEntropyLoss()({"logits": logits}, gold)
    assert torch.allclose(out.loss, F.cross_entropy(logits, gold))
    assert out.parts == {"accuracy": 0.75}
    out.loss.backward()
    assert logits.grad is not None
    with pytest.raises(ValueError, match="gold classes"):
        LogitCrossEntropyLoss()({"logits": logits})
