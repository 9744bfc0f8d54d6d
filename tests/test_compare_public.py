"""bench/compare_public.py: a Model2Vec static model goes through raydistill's 7-STS evaluation via `StaticEncoder`,
offline, and the comparison record draws the headline picture and its docs table.

The static model is a tiny hand-made one (a word-level tokenizer over a few words, seeded random vectors), saved and
loaded from a local directory: nothing touches the network.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from compare_public import StaticEncoder, plot  # noqa: E402  (model2vec itself is imported where it is used)


@pytest.fixture
def model2vec():
    """The static-model tests need model2vec, which the bench's extra installs (pip install -e .[compare]); the
    record's picture and table need only the project."""
    return pytest.importorskip("model2vec", reason="the public-comparison bench needs model2vec (pip install model2vec)")

WORDS = ["a", "man", "woman", "is", "playing", "guitar", "dog", "runs", "the", "cat", "sleeps"]


def _tiny_static_model(tmp_path: Path) -> Path:
    from model2vec import StaticModel
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    vocab = {"[UNK]": 0, "[PAD]": 1, **{word: i + 2 for i, word in enumerate(WORDS)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    vectors = np.random.default_rng(0).normal(size=(len(vocab), 8)).astype(np.float32)
    StaticModel(vectors=vectors, tokenizer=tokenizer).save_pretrained(tmp_path / "static")
    return tmp_path / "static"


def test_a_saved_static_model_encodes_and_scores_through_the_evaluation(tmp_path, model2vec):
    from model2vec import StaticModel

    from raydistill.evaluation import evaluate_sts

    directory = _tiny_static_model(tmp_path)
    encoder = StaticEncoder.load(directory)
    texts = ["A man is playing guitar", "the cat sleeps", "a dog runs"]
    embeddings = encoder.encode(texts, batch_size=2)
    assert isinstance(embeddings, np.ndarray) and embeddings.shape == (3, 8)
    np.testing.assert_allclose(embeddings, StaticModel.from_pretrained(str(directory)).encode(texts), rtol=1e-6)
    assert encoder.parameters_m() == round((len(WORDS) + 2) * 8 / 1e6, 2)

    scores = evaluate_sts(encoder, sets=["stsb_dev"], progress=False)
    assert set(scores) == {"stsb_dev"} and np.isfinite(scores["stsb_dev"])


def test_a_directory_without_a_static_model_is_refused_before_any_hub_lookup(tmp_path, model2vec):
    with pytest.raises(FileNotFoundError, match="not a saved Model2Vec model"):
        StaticEncoder.load(tmp_path / "minishlab-potion-base-8M")


RECORD = {
    "batch": 128, "threads": 2, "sentences": 4, "machine": {"cpu": "test CPU"}, "load_before": 0.1, "load_after": 0.2,
    "models": [
        {"name": "mpnet-base", "label": "teacher", "family": "teacher", "sts7_avg": 80.5, "params_m": 109.5,
         "sentences_per_s": {"wall": 20.0, "cpu": 10.0}, "vs_teacher": {"speed": 1.0, "speed_cpu": 1.0, "sts7": 0.0},
         "sts7_source": "results/baseline-mpnet-base.json", "speed_model": {"preset": "mpnet-base"}},
        {"name": "raydistill bert-tiny", "label": "distilcse bert-tiny", "family": "raydistill", "sts7_avg": 74.7,
         "params_m": 4.5, "sentences_per_s": {"wall": 2000.0, "cpu": 1000.0},
         "vs_teacher": {"speed": 100.0, "speed_cpu": 100.0, "sts7": -5.8},
         "sts7_source": "results/mixed/x.json", "corpus_note": "before the filter",
         "speed_model": {"preset": "bert-tiny", "projection_dim": 768, "max_length": 32}},
        {"name": "model2vec mpnet-base", "label": "Model2Vec", "family": "model2vec", "sts7_avg": 70.0,
         "params_m": 7.6, "sentences_per_s": {"wall": 40000.0, "cpu": 20000.0},
         "vs_teacher": {"speed": 2000.0, "speed_cpu": 2000.0, "sts7": -10.5},
         "sts7_source": "evaluated in this run", "speed_model": {"static": True}},
    ],
}


def test_the_record_draws_the_picture_and_the_docs_table(tmp_path):
    from scripts.readme_tables import compare_public_table

    assert plot(copy.deepcopy(RECORD), tmp_path / "speed_quality.png").stat().st_size > 0
    table = compare_public_table([], record=copy.deepcopy(RECORD))
    rows = [line for line in table.splitlines() if line.startswith("| ")][1:]  # after the header
    assert len(rows) == 3 and "before the filter" in table
    # where each alternative stands against the raydistill student nearest to it in speed
    assert "Model2Vec: 20 × faster than distilcse bert-tiny (per CPU second), 4.70 points lower" in table


def test_a_point_whose_result_file_was_rerun_since_is_marked_in_the_picture():
    """The picture shows what was measured; a student whose result file holds another run now is marked (†), as the
    docs' table footnotes it, rather than shown as if it were the file's current score."""
    from compare_public import point_labels

    record = copy.deepcopy(RECORD)
    teacher = record["models"][0]
    teacher["result_git_sha"] = json.loads((ROOT / "results/baseline-mpnet-base.json").read_text())["git_sha"]
    assert point_labels(record)["mpnet-base"] == "teacher"
    teacher["result_git_sha"] = "0" * 40
    assert point_labels(record)["mpnet-base"] == "teacher †"
    assert point_labels(record)["model2vec mpnet-base"] == "Model2Vec"  # evaluated in the run: nothing to go stale


def test_the_pictures_labels_do_not_overlap_one_another_or_a_point():
    """Students of one size sit close in speed and score (label-free and + NLI): each label finds a free spot."""
    from compare_public import draw

    record = json.loads((ROOT / "results" / "bench-compare_public.json").read_text())
    plt, fig, ax, boxes = draw(record)
    markers = [ax.transData.transform((r["sentences_per_s"]["cpu"], r["sts7_avg"])) for r in record["models"]]
    plt.close(fig)
    assert len(boxes) == len(record["models"])
    for i, box in enumerate(boxes):
        assert not any(box.overlaps(other) for other in boxes[i + 1:]), [r["label"] for r in record["models"]]
        assert not any(box.contains(x, y) for x, y in markers)
