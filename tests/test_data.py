"""raydistill.data: every bad input names its file, line and field; gzip and $RAYDISTILL_DATA are transparent;
the bundled benchmark files are complete (the row counts of the source sets)."""

from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path

import pytest

from raydistill.data import (
    BUNDLED_DIR,
    DATASETS,
    CaptionGroup,
    DataError,
    LabelledText,
    Pair,
    data_path,
    dataset_path,
    load_dataset,
    read_captions,
    read_labelled_texts,
    read_pairs,
    read_sentences,
)

STS_SCALE = (0, 5)


def write_lines(path: Path, lines: list[str | dict | bytes], *, compress: bool = False) -> Path:
    """Write raw lines (dicts as JSON) to `path`, gzip'd when asked."""
    data = b"".join(
        (line if isinstance(line, bytes) else (json.dumps(line) if isinstance(line, dict) else line).encode()) + b"\n"
        for line in lines
    )
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


GOOD = {"sentence1": "A man plays a guitar.", "sentence2": "A man is playing guitar.", "score": 4.2}


# --------------------------------------------------------------------------------------------------------------
# Bad input: one case per problem, each must name file, line and field.

BAD_LINES = [
    # (second line of the file, field in the message or None, words in the problem, skip reason)
    ("{not json", None, "not valid JSON", "not_json"),
    ("[1, 2]", None, "expected a JSON object, got an array", "not_object"),
    ({"sentence1": "a", "score": 1.0}, "sentence2", "missing", "missing_field"),
    ({"sentence1": None, "sentence2": "b", "score": 1.0}, "sentence1", "is null", "null_text"),
    ({"sentence1": 42, "sentence2": "b", "score": 1.0}, "sentence1", "expected a string, got a number", "not_string"),
    ({"sentence1": "a", "sentence2": "", "score": 1.0}, "sentence2", "is empty", "empty_text"),
    ({"sentence1": "a", "sentence2": " \t ", "score": 1.0}, "sentence2", "whitespace only", "empty_text"),
    ({"sentence1": "a", "sentence2": "b", "score": "4.5"}, "score", "expected a number, got a string", "not_number"),
    ({"sentence1": "a", "sentence2": "b", "score": True}, "score", "expected a number, got a boolean", "not_number"),
    ({"sentence1": "a", "sentence2": "b", "score": 5.5}, "score", "outside the scale 0-5", "out_of_range"),
    ({"sentence1": "a", "sentence2": "b", "score": -0.1}, "score", "outside the scale 0-5", "out_of_range"),
    ({"sentence1": "a", "sentence2": "b"}, "score", "missing", "missing_field"),
]


@pytest.mark.parametrize("bad_line, field, problem, reason", BAD_LINES,
                         ids=[case[3] + f"-{i}" for i, case in enumerate(BAD_LINES)])
def test_bad_pair_line_names_file_line_and_field(tmp_path, bad_line, field, problem, reason):
    path = write_lines(tmp_path / "pairs.jsonl", [GOOD, bad_line, GOOD])
    with pytest.raises(DataError) as caught:
        read_pairs(path, score_range=STS_SCALE)
    err = caught.value
    assert (err.path, err.line, err.field, err.reason) == (str(path), 2, field, reason)
    prefix = f"{path}:2: field '{field}': " if field else f"{path}:2: "
    assert str(err).startswith(prefix), str(err)
    assert problem in str(err)


def test_skip_mode_counts_each_reason_and_keeps_good_rows(tmp_path):
    lines = [GOOD] + [case[0] for case in BAD_LINES] + [GOOD]
    path = write_lines(tmp_path / "pairs.jsonl", lines)
    records = read_pairs(path, score_range=STS_SCALE, on_error="skip")
    assert len(records) == 2 and all(r == Pair(GOOD["sentence1"], GOOD["sentence2"], 4.2) for r in records)
    expected = {}
    for case in BAD_LINES:
        expected[case[3]] = expected.get(case[3], 0) + 1
    assert dict(records.skipped) == expected
    assert records.num_skipped == len(BAD_LINES)


def test_skip_mode_with_nothing_valid_still_raises(tmp_path):
    path = write_lines(tmp_path / "pairs.jsonl", ["{oops", {"sentence1": "a"}])
    with pytest.raises(DataError, match=r"no valid records \(skipped missing_field: 1, not_json: 1\)"):
        read_pairs(path, on_error="skip")


def test_on_error_must_be_known(tmp_path):
    path = write_lines(tmp_path / "pairs.jsonl", [GOOD])
    with pytest.raises(ValueError, match="on_error must be one of"):
        read_pairs(path, on_error="ignore")


def test_misspelled_field_suggests_the_line_s_closest_name(tmp_path):
    path = write_lines(tmp_path / "pairs.jsonl", [GOOD, {"sentense1": "a", "sentence2": "b", "score": 1.0}])
    with pytest.raises(DataError) as caught:
        read_pairs(path, score_range=STS_SCALE)
    assert str(caught.value) == (f"{path}:2: field 'sentence1': missing; the line has 'sentense1' instead "
                                 "(misspelled?)")


def test_missing_field_without_a_close_name_lists_the_line_s_fields(tmp_path):
    path = write_lines(tmp_path / "pairs.jsonl", [{"sentence1": "a", "xyz": "b"}])
    with pytest.raises(DataError, match=r":1: field 'sentence2': missing; the line's fields are 'sentence1', 'xyz'"):
        read_pairs(path)


def test_non_utf8_bytes_report_their_line(tmp_path):
    bad = b'{"sentence1": "caf\xe9", "sentence2": "b", "score": 1.0}'
    path = write_lines(tmp_path / "pairs.jsonl", [GOOD, GOOD, bad, GOOD])
    with pytest.raises(DataError, match=r"pairs\.jsonl:3: not valid UTF-8 \(byte 0xe9 at column 19\)"):
        read_pairs(path)
    records = read_pairs(path, on_error="skip")
    assert len(records) == 3 and dict(records.skipped) == {"not_utf8": 1}


def test_missing_and_empty_files(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(DataError) as caught:
        read_pairs(missing)
    assert str(caught.value) == f"{missing}: file not found"
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    with pytest.raises(DataError, match=r"empty\.jsonl: file is empty"):
        read_pairs(empty)
    blank = write_lines(tmp_path / "blank.jsonl.gz", ["", "   "], compress=True)
    with pytest.raises(DataError, match="file is empty"):
        read_pairs(blank, on_error="skip")  # nothing to skip to: a file-level problem always raises


def test_corrupt_gzip_is_a_data_error(tmp_path):
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(gzip.compress(json.dumps(GOOD).encode() * 200)[:40])
    with pytest.raises(DataError, match="corrupt gzip stream"):
        read_pairs(path)


def test_labels_are_checked_against_the_set_type_exactly(tmp_path):
    path = write_lines(tmp_path / "mrpc.jsonl", [
        {"sentence1": "a", "sentence2": "b", "label": 1},
        {"sentence1": "a", "sentence2": "b", "label": "1"},
    ])
    with pytest.raises(DataError) as caught:
        read_pairs(path, label_set={0, 1})
    assert caught.value.line == 2 and caught.value.field == "label"
    assert '"1" is not one of the labels {0, 1}' in str(caught.value)
    nli = write_lines(tmp_path / "nli.jsonl", [{"premise": "a", "hypothesis": "b", "label": "entails"}])
    with pytest.raises(DataError, match=r"nli\.jsonl:1: field 'label': \"entails\" is not one of the labels"):
        read_pairs(nli, label_set={"entailment", "neutral", "contradiction"})


def test_nli_field_names_are_found_and_mapped(tmp_path):
    path = write_lines(tmp_path / "nli.jsonl", [{"premise": "p", "hypothesis": "h", "label": "neutral"}])
    assert read_pairs(path, label_set={"neutral"}) == [Pair("p", "h", None, "neutral")]
    broken = write_lines(tmp_path / "nli2.jsonl", [{"premise": "p", "hypotesis": "h", "label": "neutral"}])
    with pytest.raises(DataError, match="field 'hypothesis': missing; the line has 'hypotesis' instead"):
        read_pairs(broken)


def test_optional_score_is_still_validated_when_present(tmp_path):
    path = write_lines(tmp_path / "pairs.jsonl", [{"sentence1": "a", "sentence2": "b"},
                                                  {"sentence1": "a", "sentence2": "b", "score": float("nan")}])
    with pytest.raises(DataError, match=r":2: field 'score': expected a finite number, got nan"):
        read_pairs(path)


def test_texts_are_kept_exactly(tmp_path):
    path = write_lines(tmp_path / "pairs.jsonl", [{"sentence1": " a  b ", "sentence2": "ü\tx", "score": 0}])
    assert read_pairs(path, score_range=STS_SCALE) == [Pair(" a  b ", "ü\tx", 0.0)]


# --------------------------------------------------------------------------------------------------------------
# Formats


def test_gzip_is_transparent_and_detected_by_content(tmp_path):
    rows = [GOOD, {"sentence1": "x", "sentence2": "y", "score": 0.5}]
    plain = read_pairs(write_lines(tmp_path / "a.jsonl", rows), score_range=STS_SCALE)
    zipped = read_pairs(write_lines(tmp_path / "b.jsonl.gz", rows, compress=True), score_range=STS_SCALE)
    misnamed = read_pairs(write_lines(tmp_path / "c.jsonl", rows, compress=True), score_range=STS_SCALE)
    assert plain == zipped == misnamed
    assert len(plain) == 2 and plain[1].score == 0.5


def test_gzip_errors_report_lines_too(tmp_path):
    path = write_lines(tmp_path / "a.jsonl.gz", [GOOD, GOOD, {"sentence1": "x", "sentence2": "y", "score": 9}],
                       compress=True)
    with pytest.raises(DataError, match=r"a\.jsonl\.gz:3: field 'score': 9 is outside the scale 0-5"):
        read_pairs(path, score_range=STS_SCALE)


def test_blank_lines_are_ignored_but_counted_in_line_numbers(tmp_path):
    path = write_lines(tmp_path / "a.jsonl", [GOOD, "", "   ", "{bad"])
    with pytest.raises(DataError) as caught:
        read_pairs(path)
    assert caught.value.line == 4


def test_sentences_from_text_and_jsonl(tmp_path):
    text_file = tmp_path / "s.txt"
    text_file.write_bytes("\ufeffFirst one.\r\n\n  Second, indented.\nThird\n".encode())
    assert read_sentences(text_file) == ["First one.", "  Second, indented.", "Third"]
    gz_text = tmp_path / "s.txt.gz"
    gz_text.write_bytes(gzip.compress(b"one\ntwo\n"))
    assert read_sentences(gz_text) == ["one", "two"]
    jsonl = write_lines(tmp_path / "s.jsonl", [{"text": "a"}, {"text": "b", "label": 1}])
    assert read_sentences(jsonl) == ["a", "b"]
    sniffed = write_lines(tmp_path / "s.data", [{"text": "a"}])
    assert read_sentences(sniffed) == ["a"]
    bad = write_lines(tmp_path / "bad.jsonl", [{"text": "a"}, {"txt": "b"}])
    with pytest.raises(DataError, match=r"bad\.jsonl:2: field 'text': missing; the line has 'txt' instead"):
        read_sentences(bad)
    bad_bytes = write_lines(tmp_path / "bad.txt", [b"ok", b"\xff\xfe", b"fine"])
    with pytest.raises(DataError, match=r"bad\.txt:2: not valid UTF-8"):
        read_sentences(bad_bytes)
    skipped = read_sentences(bad_bytes, on_error="skip")
    assert skipped == ["ok", "fine"] and dict(skipped.skipped) == {"not_utf8": 1}


def test_captions_validate_each_caption(tmp_path):
    good = {"image": "img-1", "captions": ["A dog runs.", "A brown dog running."]}
    path = write_lines(tmp_path / "c.jsonl", [good, {"image": "img-2", "captions": ["fine", "  "]}])
    with pytest.raises(DataError, match=r"c\.jsonl:2: field 'captions\[1\]': is whitespace only"):
        read_captions(path)
    records = read_captions(path, on_error="skip")
    assert records == [CaptionGroup("img-1", ("A dog runs.", "A brown dog running."))]
    not_list = write_lines(tmp_path / "d.jsonl", [{"image": "i", "captions": "A dog."}])
    with pytest.raises(DataError, match=r"d\.jsonl:1: field 'captions': expected an array of strings, got a string"):
        read_captions(not_list)


def test_labelled_texts(tmp_path):
    path = write_lines(tmp_path / "t.jsonl", [{"text": "good film", "label": 1}, {"text": "bad", "label": 2}])
    with pytest.raises(DataError, match=r"t\.jsonl:2: field 'label': 2 is not one of the labels \{0, 1\}"):
        read_labelled_texts(path, label_set={0, 1})
    assert read_labelled_texts(path)[1] == LabelledText("bad", 2)


# --------------------------------------------------------------------------------------------------------------
# Paths, registry and the bundled files


def test_data_path_prefers_the_override_and_falls_back_to_bundled(tmp_path, monkeypatch):
    monkeypatch.delenv("RAYDISTILL_DATA", raising=False)
    assert data_path("sts/sts12.jsonl") == BUNDLED_DIR / "sts" / "sts12.jsonl.gz"
    assert data_path("corpus/flickr30k-captions.jsonl.gz") == BUNDLED_DIR / "corpus" / "flickr30k-captions.jsonl.gz"

    (tmp_path / "sts").mkdir()
    own = write_lines(tmp_path / "sts" / "sts12.jsonl", [GOOD, GOOD, GOOD])
    monkeypatch.setenv("RAYDISTILL_DATA", str(tmp_path))
    assert data_path("sts/sts12.jsonl") == own
    assert data_path("sts/sts13.jsonl") == BUNDLED_DIR / "sts" / "sts13.jsonl.gz"  # absent there: bundled
    assert len(load_dataset("sts12")) == 3  # the cache notices the override
    monkeypatch.delenv("RAYDISTILL_DATA")
    assert len(load_dataset("sts12")) == 3108
    with pytest.raises(DataError, match=r"sts/nope\.jsonl: file not found \(looked in "):
        data_path("sts/nope.jsonl")


def test_override_errors_name_the_override_file(tmp_path, monkeypatch):
    (tmp_path / "sick").mkdir()
    path = write_lines(tmp_path / "sick" / "sick-test.jsonl",
                       [{"sentence1": "a", "sentence2": "b", "score": 0.5, "label": "neutral"}])
    monkeypatch.setenv("RAYDISTILL_DATA", str(tmp_path))
    with pytest.raises(DataError) as caught:
        load_dataset("sick_test")  # SICK relatedness is on a 1-5 scale
    assert str(caught.value) == f"{path}:1: field 'score': 0.5 is outside the scale 1-5"


def test_unknown_dataset_name_suggests():
    with pytest.raises(KeyError, match="did you mean 'stsb_dev'"):
        load_dataset("stsb-dev")


def test_load_dataset_is_cached_and_immutable(monkeypatch):
    monkeypatch.delenv("RAYDISTILL_DATA", raising=False)
    first = load_dataset("stsb_dev")
    assert load_dataset("stsb_dev") is first
    assert isinstance(first, tuple)


EXPECTED_ROWS = {  # rows of each source set as published
    "sts12": 3108, "sts13": 1500, "sts14": 3750, "sts15": 3000, "sts16": 1186,
    "stsb_train": 5749, "stsb_dev": 1500, "stsb_test": 1379,
    "sick_train": 4500, "sick_trial": 500, "sick_test": 4927,
    "mrpc_train": 3576, "mrpc_val": 500, "qqp_dev": 10000,
    "snli_dev": 9831, "mnli_dev": 19647, "flickr_captions": 31014,
    "mr": 10662, "cr": 3771, "subj": 10000, "mpqa": 10603,
    "sst2_train": 67349, "sst2_dev": 872, "sst2_test": 1821, "trec_train": 5452, "trec_test": 500,
}


def test_registry_covers_the_expected_sets():
    assert set(DATASETS) == set(EXPECTED_ROWS)


@pytest.mark.parametrize("name", sorted(EXPECTED_ROWS))
def test_bundled_file_reads_with_expected_rows(name, monkeypatch):
    monkeypatch.delenv("RAYDISTILL_DATA", raising=False)
    assert dataset_path(name).is_relative_to(BUNDLED_DIR)
    records = load_dataset(name)
    assert len(records) == EXPECTED_ROWS[name]
    spec = DATASETS[name]
    if spec.kind == "scored_pairs":
        scores = [r.score for r in records]
        assert spec.score_range[0] <= min(scores) < max(scores) <= spec.score_range[1]
    if spec.label_set is not None:
        assert {r.label for r in records} == set(spec.label_set)  # every class occurs
    if name == "flickr_captions":
        assert sum(len(group.captions) for group in records) >= 5 * len(records) - 10
        assert len({group.image for group in records}) == len(records)


def test_every_bundled_file_is_in_the_registry():
    bundled = {str(p.relative_to(BUNDLED_DIR)).removesuffix(".gz") for p in BUNDLED_DIR.rglob("*.gz")}
    registered = {spec.relpath.removesuffix(".gz") for spec in DATASETS.values()}
    assert bundled == registered


def test_data_error_is_a_value_error_with_the_documented_format():
    err = DataError("f.jsonl", "bad thing", line=7, field="score")
    assert isinstance(err, ValueError)
    assert re.fullmatch(r"f\.jsonl:7: field 'score': bad thing", str(err))


def test_the_ray_tests_evaluation_sample_is_valid_spread_and_only_theirs(request, monkeypatch):
    """The sample every Ray test scores on (conftest): valid files of the sizes asked for, each keeping most of its
    set's distinct grades (a Spearman over a few ties would say nothing), and out of reach of the tests without Ray."""
    from conftest import SMALL_EVAL_ROWS, _small_eval_data

    sample_root = str(_small_eval_data(request.config))
    assert request.node.get_closest_marker("ray") is None and os.environ.get("RAYDISTILL_DATA") != sample_root
    monkeypatch.setenv("RAYDISTILL_DATA", sample_root)
    for name, rows in SMALL_EVAL_ROWS.items():
        sample, whole = load_dataset(name), [p.score for p in read_pairs(BUNDLED_DIR / f"{DATASETS[name].relpath}.gz")]
        assert dataset_path(name).suffix == ".jsonl" and len(sample) == rows, name
        assert len({p.score for p in sample}) >= min(len(set(whole)), 25), name
        assert min(whole) <= min(p.score for p in sample) < max(p.score for p in sample) <= max(whole), name
    assert dataset_path("stsb_train").parent.parent == BUNDLED_DIR  # training data stays whole
