"""Static-embedding students (``--student static`` / ``static:N``): a table of token vectors initialised from the
teacher as Model2Vec does, trained by the project's own learner, saved for sentence-transformers and Model2Vec.

Teachers are the session's tiny random checkpoints (conftest): ``tiny_bert`` (32 wide, a real WordPiece tokenizer of
~1,000 tokens) and ``tiny_teacher`` (an MPNet 48 wide). No test starts Ray; the training test runs the real
``DistillLearner`` in-process, as tests/test_learner.py does. ``raydistill distill`` with a static student: its own
recipe size, the plan the command makes of a static name, the package (no ONNX, a card that says what it is) and
what ``raydistill serve`` runs of it, scored on conftest's small evaluation sample as tests/test_package.py does.
"""

from __future__ import annotations

import argparse
import json
import math
import re

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file
from tokenizers import Tokenizer
from transformers import AutoModel, AutoTokenizer

from raydistill.models import BiEncoder
from raydistill.models.registry import PRESETS, ModelNotAvailableError, find_preset, resolve_model
from raydistill.models.static_embedding import build_static_student, sif_weights, static_width

pytestmark = pytest.mark.usefixtures("one_thread")

SENTENCES = [
    "A man is playing a guitar on the street.",
    "Two dogs run through the snow.",
    "A woman slices a tomato in the kitchen while the children watch and the radio plays an old song.",
    "",
    "the the the",
]


@pytest.fixture(scope="module")
def static_dir(tmp_path_factory, tiny_bert):
    """The 8-wide static student of the tiny BERT, built by the Model2Vec-style init."""
    target = tmp_path_factory.mktemp("static8")
    build_static_student(tiny_bert, target, 8, teacher="tiny-bert", progress=False)
    return target


def test_init_is_the_teachers_token_outputs_reduced_by_pca_and_weighted_by_sif(static_dir, tiny_bert):
    teacher = AutoModel.from_pretrained(tiny_bert).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    vocab = len(tokenizer)
    ids = torch.arange(vocab)
    sequences = torch.stack([torch.full_like(ids, tokenizer.cls_token_id), ids,
                             torch.full_like(ids, tokenizer.sep_token_id)], dim=1)  # [V, 3]: [CLS] v [SEP]
    with torch.no_grad():
        outputs = teacher(input_ids=sequences, attention_mask=torch.ones_like(sequences)).last_hidden_state
    centred = outputs.mean(dim=1).double().numpy()
    centred -= centred.mean(axis=0)  # [V, 32]
    eigenvalues, eigenvectors = np.linalg.eigh(centred.T @ centred / (vocab - 1))
    top = eigenvectors[:, ::-1][:, :8]  # [32, 8], largest variance first

    table = load_file(str(static_dir / "model.safetensors"))["embeddings"].double().numpy()
    assert table.shape == (vocab, 8)
    unweighted = table / sif_weights(vocab)[:, None]  # [V, 8]
    expected = centred @ top  # PCA scores, up to each component's sign
    signs = np.sign((unweighted * expected).sum(axis=0))
    np.testing.assert_allclose(unweighted, expected * signs, atol=1e-4)
    # Zipf + SIF: the first (most frequent) ids are shrunk most, the last barely
    weights = sif_weights(vocab)
    assert weights[0] < weights[100] < weights[-1] < 1.0 and weights[0] == pytest.approx(1e-4 / (1e-4 + 0.5 / sum(
        1.0 / np.arange(2, vocab + 2))), rel=1e-9)


def test_save_loads_in_sentence_transformers_with_the_same_vectors(static_dir, tmp_path):
    from sentence_transformers import SentenceTransformer

    model = BiEncoder.from_pretrained(static_dir, max_length=8)  # the third sentence is cut at 8 tokens
    with torch.no_grad():
        model.transformer.embeddings.weight.add_(0.01 * torch.randn_like(model.transformer.embeddings.weight))
    model.save(tmp_path / "saved")
    modules = json.loads((tmp_path / "saved" / "modules.json").read_text())
    assert [m["type"] for m in modules] == ["sentence_transformers.models.StaticEmbedding",
                                           "sentence_transformers.models.Normalize"]

    loaded = SentenceTransformer(str(tmp_path / "saved"), device="cpu")
    ours = model.encode(SENTENCES, normalize=True)  # the directory ends in Normalize, as Model2Vec's distill does
    np.testing.assert_allclose(loaded.encode(SENTENCES), ours, atol=1e-5)
    assert model.tokenize(["a dog"])["input_ids"].tolist() == [AutoTokenizer.from_pretrained(static_dir)(
        "a dog", add_special_tokens=False)["input_ids"]]  # no [CLS] / [SEP]


def test_from_pretrained_round_trip_folds_a_linear_projection(static_dir, tmp_path):
    model = BiEncoder.from_pretrained(static_dir, projection_dim=12, projection_activation="identity")
    assert model.is_static and model.dim == 12
    vectors = model.encode(SENTENCES)
    model.save(tmp_path / "folded")
    loaded = BiEncoder.from_pretrained(tmp_path / "folded")
    assert loaded.is_static and loaded.projection is None and loaded.dim == 12
    np.testing.assert_allclose(loaded.encode(SENTENCES[:3] + SENTENCES[4:]), np.delete(vectors, 3, axis=0),
                               atol=1e-5)  # the empty text is 0 in the folded table, b through the projection
    assert resolve_model(tmp_path / "folded") == (tmp_path / "folded").resolve()  # a usable checkpoint directory

    tanh = BiEncoder.from_pretrained(static_dir, projection_dim=12)
    with pytest.raises(ValueError, match="only a linear projection folds"):
        tanh.save(tmp_path / "tanh")


def test_encode_takes_each_texts_mean_row_without_padding_as_the_padded_forward_does(static_dir):
    """A static model's ``encode`` skips the padded batches (one embedding_bag over every text's ids): the same
    vectors as the training forward, with a head and without, an empty text and a truncated long one included."""
    texts = SENTENCES + ["word " * 600]
    for head in (None, 12):
        model = BiEncoder.from_pretrained(str(static_dir), projection_dim=head, projection_activation="identity",
                                          max_length=16)
        with torch.no_grad():
            padded = torch.cat([model(model.tokenize(texts[i:i + 2])) for i in range(0, len(texts), 2)])
        np.testing.assert_allclose(model.encode(texts, batch_size=2), padded.numpy(), atol=1e-6)
        np.testing.assert_allclose(model.encode(texts, normalize=True),
                                   torch.nn.functional.normalize(padded, dim=-1).numpy(), atol=1e-6)


def test_model2vec_files_hold_the_table_tokenizer_and_config(static_dir, tmp_path):
    model = BiEncoder.from_pretrained(static_dir, max_length=8)
    model.save(tmp_path / "saved")
    tensors = load_file(str(tmp_path / "saved" / "model.safetensors"))
    assert list(tensors) == ["embeddings"]
    table = tensors["embeddings"]
    assert table.dtype == torch.float32 and table.shape == (len(model.tokenizer), 8)
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert config["model_type"] == "model2vec" and config["hidden_dim"] == 8 and config["normalize"] is True

    # Model2Vec's encode: the bare tokenizer without special tokens, mean of the rows, normalised
    tokenizer = Tokenizer.from_file(str(tmp_path / "saved" / "tokenizer.json"))
    assert tokenizer.get_vocab_size() == table.shape[0] and tokenizer.padding is None
    assert tokenizer.truncation["max_length"] == 8
    texts = [text for text in SENTENCES if text]
    means = torch.stack([table[encoding.ids].mean(dim=0)
                         for encoding in tokenizer.encode_batch(texts, add_special_tokens=False)])
    np.testing.assert_allclose(torch.nn.functional.normalize(means, dim=1).numpy(),
                               model.encode(texts, normalize=True), atol=1e-5)


def test_static_names_resolve_and_bad_widths_say_what_a_width_is():
    from raydistill.cli import _student

    assert static_width("static") == 256 and static_width("static:64") == 64 and static_width("minilm-l3") is None
    assert "static" in PRESETS and find_preset("static:64").hidden == 64 and "static:64" not in PRESETS
    assert "derived from the job's teacher" in PRESETS["static"].description
    assert _student("static:64") == "static:64"
    for bad in ("static:abc", "static:0", "static:-3"):
        assert find_preset(bad) is None
        with pytest.raises(ModelNotAvailableError, match="must be a positive integer"):
            resolve_model(bad)
        with pytest.raises(argparse.ArgumentTypeError, match=r"width after 'static:' must be a positive integer"):
            _student(bad)


def test_static_student_trains_with_congen_on_the_learner(tiny_teacher, teacher_vectors, paraphrases, tmp_path,
                                                          monkeypatch):
    from raydistill.config.job import JobConfig
    from raydistill.runtime.engine.learner import DistillLearner
    from raydistill.runtime.engine.preflight import preflight
    from tests.conftest import TEACHER_DIM

    monkeypatch.setenv("RAYDISTILL_HOME", str(tmp_path / "home"))  # the static table is built into a fresh cache
    batch = 16
    cfg = preflight(JobConfig.from_dict({
        "method": "congen", "student": "static:16", "teacher": str(tiny_teacher), "run_dir": str(tmp_path / "run"),
        "data": {"max_length": 32},
        "train": {"batch_size": batch, "lr": 2e-2, "warmup_ratio": 0.0, "epochs": 1},
        "loss": {"queue_size": 64, "tau_teacher": 0.05, "tau_student": 0.07},
        "tracking": {"enabled": False},
    }))
    control, generalize = paraphrases
    batches = [{"idx": np.arange(i, i + batch), "text_control": control[i:i + batch],
                "text_generalize": generalize[i:i + batch], "teacher_control": teacher_vectors[i:i + batch]}
               for i in range(0, len(control), batch)]
    learner = DistillLearner(cfg, total_steps=10 * len(batches), teacher_dim=TEACHER_DIM, run_dir=tmp_path / "run")
    student = learner.student
    assert student.is_static and student.transformer.config.hidden_size == 16
    assert student.dim == TEACHER_DIM and student.projection_activation == "identity"  # foldable into the table
    built = list((tmp_path / "home" / "models").glob("static-16-*"))
    assert len(built) == 1 and json.loads((built[0] / "raydistill_model.json").read_text())["derived_from"] == \
        str(tiny_teacher)
    table_before = student.transformer.embeddings.weight.detach().clone()

    def mean_loss(rounds):
        return float(np.mean([learner.train_step(b)["loss"] for _ in range(rounds) for b in batches]))

    mean_loss(1)  # fills the queue (K = 64 = every row)
    early = mean_loss(1)
    mean_loss(4)
    late = mean_loss(1)
    # no dropout in a table, so the same batches give the same loss until the table moves: it fell ~30 % here
    assert math.isfinite(early) and late < 0.9 * early, (early, late)
    assert not torch.equal(table_before, student.transformer.embeddings.weight.detach())

    student.save(tmp_path / "best")
    saved = BiEncoder.from_pretrained(tmp_path / "best")
    assert saved.is_static and saved.dim == TEACHER_DIM
    texts = [str(t) for t in control[:8]]
    np.testing.assert_allclose(saved.encode(texts), student.encode(texts), atol=1e-5)


# ----------------------------------------------------------------------------------------------------------------
# raydistill distill and serve with a static student


def test_a_static_student_is_a_recipe_size_of_its_own():
    from raydistill.ship.recipe import STATIC_SIZE, layer_params, recipe_for, recipes_help, size_for

    minilm_l3 = layer_params(3, 384, 1536)
    assert size_for(minilm_l3, static=True) == size_for(0, static=True) == STATIC_SIZE == "static"
    recipe = recipe_for(minilm_l3, static=True)  # no layer count, however large, picks a transformer size's recipe
    assert (recipe.size, recipe.labels, recipe.method, recipe.config) == ("static", "none", "congen", "congen")
    assert recipe_for(0).size == "bert-tiny"  # a transformer student is sized as before
    with pytest.raises(ValueError, match="a static student supports labels none"):
        recipe_for(0, "nli", static=True)
    assert "static (static:N, a token table N wide" in recipes_help()


def test_distill_plans_a_static_student_with_the_static_recipe(tiny_bert, static_dir, tmp_path, monkeypatch):
    from raydistill.ship.command import DistillError, describe_plan, plan_distill

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RAYDISTILL_HOME", str(tmp_path / "home"))
    (tmp_path / "corpus.txt").write_text("a dog runs across the field\ntwo people ride bikes downhill\n")
    plan = plan_distill(teacher=str(tiny_bert), student="static:16", corpus="corpus.txt")
    assert (plan.recipe.size, plan.student.kind, plan.student_params) == ("static", "static", 0)
    # the job builds the table from its own teacher: the name goes to the config as given
    from raydistill.ship.recipe import RECIPES

    recipe = next(r for r in RECIPES if r.size == "static")
    overrides = dict(override.split("=", 1) for override in recipe.overrides)
    assert (plan.cfg.student, plan.cfg.method) == ("static:16", recipe.method)
    assert (plan.cfg.train.lr, plan.cfg.train.epochs) == (float(overrides["train.lr"]), int(overrides["train.epochs"]))
    assert plan.out_dir == tmp_path / f"distilled-{tiny_bert.name}-static-16"
    lines = describe_plan(plan)
    assert "student static:16 (static token table x 16, no layers" in lines[0]
    assert lines[1].startswith("recipe of the static size, label-free: congen")
    assert not (tmp_path / "home" / "models").exists()  # the checks build nothing
    assert plan_distill(teacher=str(tiny_bert), student=str(static_dir), corpus="corpus.txt").recipe.size == "static"

    for student, labels, words in [
        ("static:64", "none", "--student 'static:64': a static table 64 wide is wider than the teacher"),
        ("static", "none", "--student 'static': a static table 256 wide is wider than the teacher"),
        ("static:16", "nli", "--labels 'nli': no recipe for a static student (static:16)"),
        ("static:x", "none", "--student 'static:x': the width after 'static:' must be a positive integer"),
    ]:
        with pytest.raises(DistillError, match=re.escape(words)):
            plan_distill(teacher=str(tiny_bert), student=student, corpus="corpus.txt", labels=labels)


@pytest.fixture(scope="module")
def small_data(request):
    from conftest import _small_eval_data

    from raydistill.data import DATA_ENV

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(DATA_ENV, str(_small_eval_data(request.config)))
        yield


@pytest.fixture(scope="module")
def static_package(static_dir, tiny_bert, tmp_path_factory, small_data):
    """The static student packaged as ``raydistill distill`` packages it, the tiny BERT its teacher."""
    from raydistill.ship.package import package_student

    out = tmp_path_factory.mktemp("static-package") / "DIR"
    lines: list[str] = []
    report = package_student(static_dir, out, teacher=str(tiny_bert), corpus_info={"name": "tiny", "sentences": 100},
                             recipe_info={"methods": ["congen"], "student": "static:8"},
                             command="raydistill distill --teacher TEACHER --student static:8 --corpus tiny",
                             progress=lines.append, teacher_scores_dir=tmp_path_factory.mktemp("teacher-scores"),
                             speed_sentences_count=24, speed_rounds=1)
    return out, report, lines


def test_a_static_package_has_no_onnx_and_loads_in_sentence_transformers(static_package, static_dir):
    from sentence_transformers import SentenceTransformer

    from raydistill.ship.package import MANIFEST_FILE, STATIC_NO_ONNX

    out, report, lines = static_package
    assert not (out / "onnx").exists() and [row.kind for row in report.rows] == ["teacher", "student"]
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    assert manifest["onnx"] == {"exported": False, "reason": STATIC_NO_ONNX} and manifest["files"] == []
    static = manifest["model"]["static"]
    assert (static["kind"], static["width"], static["tokenizer"]) == ("static embedding model", 8, "WordPiece")
    assert static["vocabulary"] == len(AutoTokenizer.from_pretrained(static_dir))
    assert f"package: no ONNX export: {STATIC_NO_ONNX}" in lines

    texts = [text for text in SENTENCES if text]
    reference = BiEncoder.from_pretrained(static_dir).encode(texts, normalize=True)  # the directory ends in Normalize
    np.testing.assert_allclose(SentenceTransformer(str(out), device="cpu").encode(texts), reference, atol=1e-5)


def test_a_static_packages_card_names_what_it_is_and_its_loaders(static_package, tiny_bert):
    from raydistill.ship.package import STATIC_NO_ONNX

    out, report, _ = static_package
    text = report.card_path.read_text()
    front = yaml.safe_load(text.split("---\n")[1])
    assert {"static-embeddings", "model2vec"} <= set(front["tags"]) and "onnx" not in front["tags"]
    assert "base_model" not in front  # the table is built from the teacher (a directory here), not from a preset
    body = text.split("---\n", 2)[2]
    vocabulary = report.manifest["model"]["static"]["vocabulary"]
    for words in ("It is a **static embedding model**", "- **Model Type:** Static embedding model",
                  "- **Width:** 8", f"- **Vocabulary:** {vocabulary:,} tokens (the teacher's WordPiece tokenizer)",
                  f"- **Teacher:** `{tiny_bert.name}`", "its `StaticEmbedding` module", "`model2vec.StaticModel`",
                  'from model2vec import StaticModel\nmodel = StaticModel.from_pretrained("DIR")',
                  f"No ONNX export: {STATIC_NO_ONNX}."):
        assert words in body, words
    assert 'backend="onnx"' not in body and "load_onnx" not in body


def test_serve_runs_a_static_package_as_its_torch_model(static_package, static_dir):
    """What ``raydistill serve`` does before its replicas start (which runtime, a test load); the replicas run
    ``load_encoder``'s model, as for any package (tests/test_serve.py serves one over HTTP)."""
    from raydistill.ship.serve import ServeError, check_loads, choose_runtime, load_encoder

    out, _, _ = static_package
    runtime = choose_runtime(out)
    assert runtime.file is None and runtime.reason.startswith("fastest recorded")
    check_loads(out, runtime)
    with pytest.raises(ServeError, match=r"exports in .*: none \(a static model is a table lookup: ONNX adds nothing"):
        choose_runtime(out, "onnx/model.onnx")
    texts = [text for text in SENTENCES if text]
    np.testing.assert_allclose(load_encoder(out, runtime.file).encode(texts),
                               BiEncoder.from_pretrained(static_dir).encode(texts), atol=1e-6)
