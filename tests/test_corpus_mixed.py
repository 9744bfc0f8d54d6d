"""The ``mixed`` corpus (sources, counts, no evaluation text) and a user's own corpus through ``data.corpus``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from raydistill.data import DataError, load_dataset
from raydistill.data.corpus import (
    EVALUATION_DATASETS,
    MIXED_SOURCES,
    evaluation_key,
    mixed_corpus_counts,
    mixed_corpus_table,
    normalize_text,
    read_corpus,
)
from raydistill.config.job import ConfigError, JobConfig
from raydistill.runtime.engine.preflight import preflight

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def mixed():
    return read_corpus("mixed")


def _texts_of(name: str) -> list[str]:
    """Every text of a registry set, read straight from the registry (not through raydistill.data.corpus)."""
    out = []
    for record in load_dataset(name):
        for attribute in ("sentence1", "sentence2", "text"):
            if hasattr(record, attribute):
                out.append(getattr(record, attribute))
        out.extend(getattr(record, "captions", ()))
    return out


def test_mixed_holds_every_source_in_order_with_its_count(mixed):
    counts = mixed_corpus_counts()
    assert counts == {"flickr30k_captions": 152_987, "nli_dev": 36_041, "mrpc_train": 5_470, "sick_train": 1_048,
                      "stsb_train": 1_439, "sst2_train": 66_978, "trec_train": 5_377, "total": 269_340}
    assert counts["total"] >= 250_000 and len(mixed) == counts["total"]
    assert list(dict.fromkeys(mixed.sources)) == [source.name for source in MIXED_SOURCES]


def test_no_evaluation_sentence_is_in_mixed(mixed):
    """Exhaustive: every text of every evaluation set, compared by ``evaluation_key``, against every row."""
    corpus_keys = {evaluation_key(text) for text in mixed.texts}
    partner_keys = {evaluation_key(text) for group in mixed.groups for text in group}
    for name in EVALUATION_DATASETS:
        texts = _texts_of(name)
        assert texts, name
        leaked = [t for t in texts if evaluation_key(t) in corpus_keys or evaluation_key(t) in partner_keys]
        assert not leaked, f"{len(leaked)} sentences of {name} are in mixed, e.g. {leaked[:3]}"


def test_evaluation_sets_cover_every_set_a_score_is_reported_on():
    from raydistill.evaluation import sts

    reported = set(sts.STS_SETS.values()) | {"mrpc_val", "qqp_dev"}  # 7-STS + dev, and the pair-AUC sets
    assert reported <= set(EVALUATION_DATASETS)
    # The sets the paired evaluations default to are among them too.
    assert sts.evaluate_pair_auc.__defaults__[0] in EVALUATION_DATASETS


def test_mixed_is_normalised_deduplicated_and_keeps_caption_groups(mixed):
    assert all(text == normalize_text(text) for text in mixed.texts)
    assert len(set(mixed.texts)) == len(mixed.texts)
    assert len(mixed.caption_groups) == len(mixed.sources) == len(mixed.texts)
    images = load_dataset("flickr_captions")
    for row, (source, group) in enumerate(zip(mixed.sources, mixed.caption_groups)):
        if source == "flickr30k_captions":
            assert group >= 0 and mixed.group_names[group] == images[group].image
            assert mixed.texts[row] in mixed.groups[row]  # its siblings include itself
        else:
            assert group == -1 and mixed.groups[row] == (mixed.texts[row],)
    # Captions of one image share one id: the first image's five captions are rows 0-4.
    assert mixed.caption_groups[:5] == [0] * 5 and mixed.caption_groups[5] == 1


def test_normalisation_is_nfc_with_whitespace_collapsed():
    assert normalize_text("  Cafe\u0301\t au\u00a0 lait \n") == "Caf\u00e9 au lait"
    assert evaluation_key("A  DOG runs.") == evaluation_key("a dog RUNS.")


def test_docs_table_is_the_generated_one():
    text = (ROOT / "docs" / "data.md").read_text(encoding="utf-8")
    found = re.search(r"<!-- mixed-corpus-table -->\n(.*?)\n<!-- /mixed-corpus-table -->", text, re.S)
    assert found, "docs/data.md lacks the generated table markers"
    assert found.group(1).strip() == mixed_corpus_table().strip(), \
        "docs/data.md is stale: regenerate with python -m raydistill.data.corpus"


# ---------------------------------------------------------------------------------------------------------------
# A user's corpus


SENTENCES = ["A dog runs on the beach.", "Two men talk in a cafe.", "A child reads a book.", "A cat sleeps."]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def _read(spec: str) -> list[str]:
    return list(read_corpus(spec).texts)


def test_text_jsonl_csv_parquet_and_hf_corpora_by_column(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    txt = tmp_path / "s.txt"
    txt.write_text("\n".join(SENTENCES) + "\n")
    assert _read(f"file:{txt}") == SENTENCES
    jsonl = _jsonl(tmp_path / "s.jsonl", [{"id": i, "body": s} for i, s in enumerate(SENTENCES)])
    assert _read(f"file:{jsonl}#body") == SENTENCES
    csv_path = tmp_path / "s.csv"
    csv_path.write_text("id,body\n" + "".join(f'{i},"{s}"\n' for i, s in enumerate(SENTENCES)))
    assert _read(f"file:{csv_path}#body") == SENTENCES
    tsv_path = tmp_path / "s.tsv"
    tsv_path.write_text("text\n" + "".join(f"{s}\n" for s in SENTENCES))
    assert _read(f"file:{tsv_path}") == SENTENCES  # default column: text
    parquet = tmp_path / "s.parquet"
    pq.write_table(pa.table({"body": SENTENCES}), parquet)
    assert _read(f"file:{parquet}#body") == SENTENCES
    datasets = pytest.importorskip("datasets")
    hf_dir = tmp_path / "hf"
    datasets.Dataset.from_dict({"sentence": SENTENCES, "label": [0, 1, 0, 1]}).save_to_disk(str(hf_dir))
    assert _read(f"file:{hf_dir}#sentence") == SENTENCES
    splits = tmp_path / "hf_splits"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": SENTENCES})}).save_to_disk(str(splits))
    assert _read(f"file:{splits / 'train'}") == SENTENCES
    with pytest.raises(DataError, match=r"DatasetDict with splits train: name one"):
        read_corpus(f"file:{splits}")


def test_a_pairs_file_stays_pairs_and_evaluation_pairs_are_removed(tmp_path):
    sts_pair = load_dataset("sts12")[0]
    rows = [{"sentence1": SENTENCES[0], "sentence2": SENTENCES[1]},
            {"sentence1": sts_pair.sentence1.upper(), "sentence2": SENTENCES[2]},  # an STS12 sentence, other case
            {"sentence1": SENTENCES[2], "sentence2": SENTENCES[3]}]
    corpus = read_corpus(f"file:{_jsonl(tmp_path / 'pairs.jsonl', rows)}")
    assert corpus.is_pairs and corpus.groups == [(SENTENCES[0], SENTENCES[1]), (SENTENCES[2], SENTENCES[3])]
    assert corpus.stats["evaluation_sentences_removed"] == 1


def test_evaluation_sentences_are_removed_from_a_sentence_file(tmp_path):
    stsb = load_dataset("stsb_test")[3].sentence2
    path = tmp_path / "mine.txt"
    path.write_text("\n".join([SENTENCES[0], "  " + stsb.lower() + "  ", SENTENCES[1]]) + "\n")
    corpus = read_corpus(f"file:{path}")
    assert corpus.texts == SENTENCES[:2] and corpus.stats["evaluation_sentences_removed"] == 1


def test_a_split_of_an_evaluation_set_keeps_that_set_and_no_other(tmp_path):
    """``data.evaluation_set_split``: a corpus cut from QQP dev keeps its questions (a domain benchmark tests on the
    other split), while a sentence of any other evaluation set still goes."""
    qqp = [pair.sentence1 for pair in load_dataset("qqp_dev")[:3]]
    stsb = load_dataset("stsb_test")[3].sentence2
    path = tmp_path / "half.txt"
    path.write_text("\n".join([*qqp, stsb, SENTENCES[0]]) + "\n")
    assert read_corpus(f"file:{path}").texts == [SENTENCES[0]]
    kept = read_corpus(f"file:{path}", "qqp_dev")
    assert kept.texts == [*qqp, SENTENCES[0]] and kept.stats["evaluation_sentences_removed"] == 1
    with pytest.raises(ValueError, match="not an evaluation set"):
        read_corpus(f"file:{path}", "mrpc_train")
    with pytest.raises(ValueError, match="is for a file: corpus"):
        read_corpus("mixed", "qqp_dev")
    with pytest.raises(ConfigError, match="evaluation_set_split 'qqp_dev' is for a file: corpus"):
        JobConfig.from_dict({"method": "simcse", "student": "s", "data": {"corpus": "mixed",
                                                                          "evaluation_set_split": "qqp_dev"}})


# ---------------------------------------------------------------------------------------------------------------
# Bad input: refused at config validation, before Ray, a model or the teacher pass


def _config(tmp_path: Path, corpus: str, student: Path) -> JobConfig:
    return JobConfig.from_dict({
        "method": "simcse", "student": str(student), "run_dir": str(tmp_path / "run"),
        "data": {"corpus": corpus, "max_sentences": None, "max_length": 16},
        "resources": {"num_cpus": 2, "learner": {"num_learners": 0, "threads": 1}},
        "tracking": {"enabled": False},
    })


def test_unknown_corpus_is_refused_with_the_known_ones(tmp_path, tiny_bert):
    with pytest.raises(ConfigError, match=r"field 'data\.corpus': 'mixd' \(did you mean 'mixed'\?\); allowed: .*mixed"):
        preflight(_config(tmp_path, "mixd", tiny_bert))


@pytest.mark.parametrize("case", ["empty", "all_evaluation", "missing_column", "csv_missing_column", "not_a_dataset",
                                  "text_with_column", "missing_file"])
def test_bad_user_corpus_is_named_at_validation(tmp_path, tiny_bert, case):
    sts = [p.sentence1 for p in load_dataset("sts13")[:5]]
    if case == "empty":
        path = tmp_path / "empty.txt"
        path.write_text("\n\n")
        spec, expected = f"file:{path}", rf"{path}: file is empty \(no records\)"
    elif case == "all_evaluation":
        path = tmp_path / "sts.txt"
        path.write_text("\n".join(sts) + "\n")
        spec, expected = f"file:{path}", rf"{path}: all 5 sentences are sentences of the evaluation sets .* nothing"
    elif case == "missing_column":
        path = _jsonl(tmp_path / "rows.jsonl", [{"body": SENTENCES[0]}, {"sentence": SENTENCES[1]}])
        spec, expected = f"file:{path}#body", rf"{path}:2: field 'body': missing"
    elif case == "csv_missing_column":
        path = tmp_path / "rows.csv"
        path.write_text("id,text\n1,A dog.\n")
        spec, expected = f"file:{path}#body", rf"{path}:2: field 'body': missing"
    elif case == "not_a_dataset":
        path = tmp_path / "folder"
        path.mkdir()
        spec, expected = f"file:{path}", rf"training data directory {path} is neither a Hugging Face dataset"
    elif case == "text_with_column":
        path = tmp_path / "s.txt"
        path.write_text(SENTENCES[0] + "\n")
        spec, expected = f"file:{path}#body", rf"{path} is a text file .* no column 'body'"
    else:
        path = tmp_path / "nowhere.jsonl"
        spec, expected = f"file:{path}#text", rf"training file not found: {path}"
    with pytest.raises(ConfigError, match=r"field 'data\.corpus': .*" + expected):
        preflight(_config(tmp_path, spec, tiny_bert))
    assert not (tmp_path / "run").exists()


def test_mixed_validates_and_feeds_the_training_rows(tmp_path, tiny_bert, mixed):
    from raydistill.config.job import DataConfig
    from raydistill.runtime.teachers.pipeline import load_training_texts

    preflight(_config(tmp_path, "mixed", tiny_bert))
    stats: dict = {}
    rows = load_training_texts(DataConfig(corpus="mixed", max_sentences=500, views={"a": "none", "b": "caption"}),
                               seed=0, stats=stats)
    assert len(rows) == 500 and stats["evaluation_sentences_removed"] == mixed.stats["evaluation_sentences_removed"]
    texts = set(mixed.texts)
    assert all(row["text_a"] in texts for row in rows)
    sibling_of = {text: group for text, group in zip(mixed.texts, mixed.groups)}
    assert all(row["text_b"] in sibling_of[row["text_a"]] for row in rows)  # another caption, or itself
    assert sum(row["text_b"] != row["text_a"] for row in rows) > 200  # captions (more than half) get a sibling
