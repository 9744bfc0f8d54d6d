"""Bad input, tried for real: a corpus of malformed files, the same mistakes given to a whole job, and a fuzz.

The contract: every bad input ends in one of two documented outcomes,
  * a ``DataError`` naming the file, the line and the field, raised before any training starts (a job reads every
    file it will use in ``preflight``, before Ray or any model), or
  * a skip that is counted, logged and recorded in MLflow (``input.*`` params of the job's run);
never a traceback from deep inside a tokenizer or Ray. Each case records what the system did through the
``reliability`` fixture; docs/reliability.md is generated from those records (scripts/reliability_table.py).
"""

from __future__ import annotations

import gzip
import json
import logging
import unicodedata
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from raydistill.data import (
    DataError,
    Records,
    read_captions,
    read_labelled_texts,
    read_pairs,
    read_sentences,
)
from raydistill.config.job import ConfigError, DataConfig, JobConfig
from tests.ray_fixtures import ray_session  # noqa: F401 - the session-wide Ray fixture

pytest_plugins = ["tests.reliability_log"]

STS_SCALE = (0, 5)
NLI_LABELS = {"entailment", "neutral", "contradiction"}
GOOD = {"sentence1": "A man plays a guitar.", "sentence2": "A man is playing guitar.", "score": 4.2}
REFUSED = "nothing: a job reads the file in its preflight and stops before Ray or any model starts"
FILE_LEVEL_REASONS = {"missing_file", "empty_file", "corrupt_file", "mixed_types"}


def jsonl(*lines: dict | str | bytes) -> bytes:
    """JSON Lines bytes: dicts are serialised, str and bytes lines are written as they are."""
    out = b""
    for line in lines:
        if isinstance(line, dict):
            line = json.dumps(line)
        out += (line if isinstance(line, bytes) else line.encode()) + b"\n"
    return out


def write_parquet(path: Path, columns: dict) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)
    return path


def sts_pairs(path: Path) -> Records:
    return read_pairs(path, score_range=STS_SCALE)


def nli_pairs(path: Path) -> Records:
    return read_pairs(path, label_set=NLI_LABELS)


# --------------------------------------------------------------------------------------------------------------
# The corpus of malformed files


@dataclass
class Case:
    case: str
    input: str  # what the file holds, for the table
    write: Callable[[Path], Path]  # writes the file (or directory) under a temp dir, returns what to read
    read: Callable[[Path], Records] = sts_pairs
    error: tuple | None = None  # (line, field, reason, words in the message) when the file must be refused
    check: Callable[[Records], str] | None = None  # asserts on the records, returns what the system did
    error_in: str | None = None  # the part of a Parquet directory the error must name
    lost: str = "nothing"  # for the cases that are read (errors lose nothing: REFUSED)


def file_with(content: bytes, name: str = "data.jsonl") -> Callable[[Path], Path]:
    def write(root: Path) -> Path:
        path = root / name
        path.write_bytes(content)
        return path

    return write


def parquet_parts(*parts: dict) -> Callable[[Path], Path]:
    def write(root: Path) -> Path:
        for index, columns in enumerate(parts):
            write_parquet(root / "labels" / f"part-{index}.parquet", columns)
        return root / "labels"

    return write


def kept_blank_lines(records: Records) -> str:
    assert len(records) == 2 and records.ignored["blank_lines"] == 3
    return "read the 2 records; the 3 blank lines are ignored and counted (Records.ignored['blank_lines'] = 3)"


def kept_duplicates(records: Records) -> str:
    assert len(records) == 3 and records[0] == records[1]
    return ("kept both copies: an evaluation file is read exactly as published (a training corpus drops and "
            "counts them, see the training-job rows)")


def kept_long_text(records: Records) -> str:
    assert len(records[1].sentence1) == 100_000
    return ("read it unchanged; in training the tokenizers truncate it to max_length tokens, and the pipeline "
            "counts it as a long text (> 2000 characters) in the log and MLflow")


def kept_escaped_controls(records: Records) -> str:
    assert records[0].sentence1 == "bell\u0007 and nul\u0000 inside"
    return ("read it exactly; the tokenizers drop the control characters, and the pipeline counts such texts "
            "(texts_with_control_chars) in the log and MLflow")


CASES = [
    Case("empty file", "a 0-byte .jsonl", file_with(b""),
         error=(None, None, "empty_file", "file is empty")),
    Case("only blank lines", "three lines of spaces and tabs", file_with(b"\n   \n\t\n"),
         error=(None, None, "empty_file", "file is empty")),
    Case("blank lines between records", "2 records with 3 blank lines around them",
         file_with(jsonl("", GOOD, "  ", GOOD, "")), check=kept_blank_lines,
         lost="nothing (blank lines carry no data)"),
    Case("a line that is not JSON", "line 2 is cut off mid-object",
         file_with(jsonl(GOOD, '{"sentence1": "a", "sentence2": "b"')), error=(2, None, "not_json", "not valid JSON")),
    Case("a line that is a JSON array", "line 2 is [1, 2]", file_with(jsonl(GOOD, "[1, 2]")),
         error=(2, None, "not_object", "expected a JSON object, got an array")),
    Case("missing field", "line 2 has no sentence2",
         file_with(jsonl(GOOD, {"sentence1": "a", "score": 1.0})), error=(2, "sentence2", "missing_field", "missing")),
    Case("misspelled field", "line 2 says 'sentense1'",
         file_with(jsonl(GOOD, {"sentense1": "a", "sentence2": "b", "score": 1.0})),
         error=(2, "sentence1", "missing_field", "the line has 'sentense1' instead (misspelled?)")),
    Case("field given twice", 'line 2 has "score" twice (JSON keeps the last silently)',
         file_with(jsonl(GOOD, '{"sentence1": "a", "sentence2": "b", "score": 1.0, "score": 9.0}')),
         error=(2, "score", "duplicate_field", "given twice")),
    Case("null text", "sentence1 is null", file_with(jsonl(GOOD, {"sentence1": None, "sentence2": "b", "score": 1})),
         error=(2, "sentence1", "null_text", "is null, expected a string")),
    Case("numeric text", "sentence2 is the number 42",
         file_with(jsonl(GOOD, {"sentence1": "a", "sentence2": 42, "score": 1})),
         error=(2, "sentence2", "not_string", "expected a string, got a number 42")),
    Case("empty text", 'sentence2 is ""', file_with(jsonl(GOOD, {"sentence1": "a", "sentence2": "", "score": 1})),
         error=(2, "sentence2", "empty_text", "is empty")),
    Case("non-UTF-8 bytes", "a Latin-1 'é' (byte 0xE9) on line 3",
         file_with(jsonl(GOOD, GOOD, b'{"sentence1": "caf\xe9", "sentence2": "b", "score": 1.0}')),
         error=(3, None, "not_utf8", "not valid UTF-8 (byte 0xe9 at column 19)")),
    Case("score outside the scale", "an STS score of 7.5 (scale 0-5)",
         file_with(jsonl(GOOD, {"sentence1": "a", "sentence2": "b", "score": 7.5})),
         error=(2, "score", "out_of_range", "7.5 is outside the scale 0-5")),
    Case("score written as text", 'score "4.5" (a string)',
         file_with(jsonl(GOOD, {"sentence1": "a", "sentence2": "b", "score": "4.5"})),
         error=(2, "score", "not_number", "expected a number, got a string")),
    Case("score NaN", "score NaN (Python's json accepts it)",
         file_with(jsonl(GOOD, '{"sentence1": "a", "sentence2": "b", "score": NaN}')),
         error=(2, "score", "not_number", "expected a finite number")),
    Case("label outside the label set", 'an NLI label "entails"',
         file_with(jsonl({"premise": "p", "hypothesis": "h", "label": "neutral"},
                         {"premise": "p", "hypothesis": "h", "label": "entails"})),
         read=nli_pairs, error=(2, "label", "bad_label", '"entails" is not one of the labels')),
    Case("duplicate pairs (evaluation file)", "the same pair on lines 1 and 2",
         file_with(jsonl(GOOD, GOOD, {"sentence1": "x", "sentence2": "y", "score": 1.0})), check=kept_duplicates),
    Case("a 100 kB sentence", "sentence1 of 100,000 characters",
         file_with(jsonl(GOOD, {"sentence1": "x" * 100_000, "sentence2": "b", "score": 1.0})), check=kept_long_text),
    Case("raw control character in a JSON string", "an unescaped BEL (0x07) inside sentence1",
         file_with(jsonl(GOOD, b'{"sentence1": "a\x07b", "sentence2": "b", "score": 1.0}')),
         error=(2, None, "not_json", "raw control character U+0007")),
    Case("escaped control characters inside a text", "sentence1 'bell\\u0007 and nul\\u0000 inside'",
         file_with(jsonl({"sentence1": "bell\u0007 and nul\u0000 inside", "sentence2": "b", "score": 1.0})),
         check=kept_escaped_controls),
    Case("a text of control characters only", "sentence2 '\\u0000\\u0007'",
         file_with(jsonl(GOOD, {"sentence1": "a", "sentence2": "\u0000\u0007", "score": 1.0})),
         error=(2, "sentence2", "empty_text", "no visible characters")),
    Case("a text of zero-width spaces only", "sentence1 '\\u200b\\u200b'",
         file_with(jsonl(GOOD, {"sentence1": "\u200b\u200b", "sentence2": "b", "score": 1.0})),
         error=(2, "sentence1", "empty_text", "no visible characters")),
    Case("lone UTF-16 surrogate", "sentence1 'a\\ud800b' (valid JSON, not Unicode; tokenizers fail on it)",
         file_with(jsonl(GOOD, '{"sentence1": "a\\ud800b", "sentence2": "b", "score": 1.0}')),
         error=(2, "sentence1", "bad_unicode", "lone UTF-16 surrogate U+D800 at character 2")),
    Case("arrays nested 100,000 deep", "line 2 is '[[[[...' (Python's json raises RecursionError)",
         file_with(jsonl(GOOD, "[" * 100_000)), error=(2, None, "not_json", "nested too deeply")),
    Case("a 5000-digit integer", "score with 5000 digits (Python's json raises ValueError)",
         file_with(jsonl(GOOD, '{"sentence1": "a", "sentence2": "b", "score": ' + "9" * 5000 + "}")),
         error=(2, None, "not_json", "Exceeds the limit")),
    Case("corrupt gzip", "a .jsonl.gz cut after 40 bytes",
         file_with(gzip.compress(jsonl(GOOD) * 200)[:40], "data.jsonl.gz"),
         error=(None, None, "corrupt_file", "corrupt gzip stream")),
    Case("non-UTF-8 line in a text file", "line 2 of sentences.txt is the bytes FF FE",
         file_with(b"ok\n\xff\xfe\nfine\n", "sentences.txt"), read=read_sentences,
         error=(2, None, "not_utf8", "not valid UTF-8")),
    Case("truncated Parquet file", "a .parquet cut to half its bytes",
         lambda root: _truncated_parquet(root), error=(None, None, "corrupt_file", "corrupt Parquet file")),
    Case("mixed-type column across Parquet parts", "score is double in part-0, string in part-1",
         parquet_parts({"sentence1": ["a"], "sentence2": ["b"], "score": [1.0]},
                       {"sentence1": ["c"], "sentence2": ["d"], "score": ["4.5"]}),
         error=(None, "score", "mixed_types", "column type string differs from double in part-0.parquet"),
         error_in="part-1.parquet"),
    Case("text column of numbers in Parquet", "sentence2 is an int64 column",
         parquet_parts({"sentence1": ["a", "c"], "sentence2": [1, 2], "score": [1.0, 2.0]}),
         error=(1, "sentence2", "not_string", "expected a string, got a number 1"), error_in="part-0.parquet"),
]


def _truncated_parquet(root: Path) -> Path:
    path = write_parquet(root / "pairs.parquet", {"sentence1": ["a"] * 100, "sentence2": ["b"] * 100,
                                                  "score": [1.0] * 100})
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


@pytest.mark.parametrize("case", CASES, ids=[c.case.replace(" ", "-") for c in CASES])
def test_malformed_file(case: Case, tmp_path, reliability):
    target = case.write(tmp_path)
    if case.error is None:
        records = case.read(target)
        did = case.check(records)
        reliability.record("data file", case.case, input=case.input, did=did, lost=case.lost)
        return
    line, field, reason, words = case.error
    with pytest.raises(DataError) as caught:
        case.read(target)
    err = caught.value
    where = target / case.error_in if case.error_in else target
    assert (err.path, err.line, err.field, err.reason) == (str(where), line, field, reason), str(err)
    location = str(where) if line is None else f"{where}:{line}"
    assert str(err).startswith(location + (f": field '{field}': " if field else ": ")), str(err)
    assert words in str(err)
    reliability.record("data file", case.case, input=case.input, did="refused the file (DataError)",
                       message=str(err), lost=REFUSED)


def test_skip_mode_counts_every_bad_line_by_reason(tmp_path, reliability):
    """The library's on_error="skip" mode: one file with a line of most kinds above, read in one pass."""
    lines = [GOOD, "{cut", {"sentence1": None, "sentence2": "b", "score": 1}, b"\xe9\n",
             {"sentence1": "a", "sentence2": "b", "score": 7.5}, {"sentence1": "a", "sentence2": "\u0000", "score": 1},
             '{"sentence1": "a\\udc00", "sentence2": "b", "score": 1}', "", GOOD]
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(jsonl(*lines))
    records = read_pairs(path, score_range=STS_SCALE, on_error="skip")
    assert len(records) == 2
    assert dict(records.skipped) == {"not_json": 1, "null_text": 1, "not_utf8": 1, "out_of_range": 1,
                                     "empty_text": 1, "bad_unicode": 1}
    assert records.ignored["blank_lines"] >= 1
    reliability.record("data file", "skip mode (library API)", input="9 lines: 2 good, 6 bad of 6 kinds, blank lines",
                       did="kept the 2 good records, counted the rest by reason in Records.skipped",
                       message=json.dumps(dict(sorted(records.skipped.items()))),
                       lost="the 6 bad lines (counted); jobs do not use skip mode: they refuse the file")


# --------------------------------------------------------------------------------------------------------------
# The same mistakes given to a whole job: refused before anything starts


@pytest.fixture
def no_ray_start(monkeypatch):
    """Fail the test if the job gets as far as starting Ray (the error must come first)."""
    from raydistill.runtime.engine import cluster

    def started(*args, **kwargs):
        raise AssertionError("the job started Ray before refusing its input")

    monkeypatch.setattr(cluster, "init_ray", started)


def simcse_config(student: Path, run_dir: Path, corpus: str, tracking_uri: str | None = None) -> JobConfig:
    return JobConfig.from_dict({
        "method": "simcse", "student": str(student), "run_dir": str(run_dir),
        "data": {"corpus": corpus, "max_sentences": None, "max_length": 16},
        "train": {"batch_size": 8, "lr": 1e-4, "max_steps": 2, "eval_every": 100, "checkpoint_every": 100},
        "resources": {"num_cpus": 2, "learner": {"num_learners": 0, "threads": 1}},
        "tracking": {"enabled": tracking_uri is not None, "tracking_uri": tracking_uri, "experiment": "bad-input"},
    })


def test_bad_corpus_line_stops_the_job_before_anything_starts(tmp_path, tiny_bert, no_ray_start, reliability):
    from raydistill.runtime.jobs.distill import run_distillation

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(jsonl({"text": "A dog runs."}, {"text": "Two men talk."}, {"text": None}))
    cfg = simcse_config(tiny_bert, tmp_path / "run", f"file:{corpus}")
    with pytest.raises(ConfigError) as caught:
        run_distillation(cfg, results_dir=tmp_path / "results")
    message = str(caught.value)
    assert message == f"field 'data.corpus': bad training data: {corpus}:3: field 'text': is null, expected a string"
    assert isinstance(caught.value.__cause__, DataError)
    assert not (tmp_path / "run").exists()  # run_distillation makes run_dir right after validation
    reliability.record("training job", "bad line in the training corpus", input="corpus.jsonl line 3: text null",
                       did="run_distillation refused the config (ConfigError, caused by the DataError)",
                       message=message, lost="nothing: no run dir, no Ray, no model loaded")


@pytest.mark.parametrize("relpath, line, problem", [
    ("sts/sts12.jsonl", {"sentence1": "a", "sentence2": "b", "score": 7.5}, "field 'score': 7.5 is outside the scale"),
    ("sick/sick-test.jsonl", {"sentence1": "a", "sentence2": "b", "score": 3.0, "label": "entails"},
     "field 'label': \"entails\" is not one of the labels"),
], ids=["sts12-score", "sick-label"])
def test_bad_evaluation_file_stops_the_job_before_training(tmp_path, tiny_bert, monkeypatch, no_ray_start,
                                                            reliability, relpath, line, problem):
    """An evaluation set is read after training; a bad $RAYDISTILL_DATA copy must fail at the start instead."""
    from raydistill.runtime.jobs.distill import run_distillation

    data_root = tmp_path / "data"
    (data_root / relpath).parent.mkdir(parents=True)
    good = {"sentence1": "x", "sentence2": "y", "score": 3.0, **({"label": "neutral"} if "label" in line else {})}
    (data_root / relpath).write_bytes(jsonl(good, line))
    monkeypatch.setenv("RAYDISTILL_DATA", str(data_root))
    cfg = simcse_config(tiny_bert, tmp_path / "run", "nli")
    with pytest.raises(ConfigError) as caught:
        run_distillation(cfg, results_dir=tmp_path / "results")
    message = str(caught.value)
    assert message.startswith(f"a data set this job reads is bad ($RAYDISTILL_DATA={data_root}): "
                              f"{data_root / relpath}:2: {problem}"), message
    assert not (tmp_path / "run").exists()
    reliability.record("training job", f"bad line in an evaluation set ({Path(relpath).name})",
                       input=f"$RAYDISTILL_DATA copy of {relpath}, line 2: {problem.split(': ')[0]} bad",
                       did="refused at the start of the job, not after training when the 7-STS evaluation reads it",
                       message=message, lost="nothing: no run dir, no Ray, no model loaded")


def test_duplicate_pairs_and_blank_lines_of_a_pairs_corpus_are_dropped_and_counted(tmp_path, reliability):
    from raydistill.runtime.teachers.pipeline import load_training_texts

    pairs = [("a man rides a grey horse", "a person is on a horse"), ("two dogs play", "dogs are playing")]
    lines = [{"sentence1": a, "sentence2": b} for a, b in pairs]
    path = tmp_path / "pairs.jsonl"
    path.write_bytes(jsonl(lines[0], "", lines[1], lines[0], lines[0]))
    stats: dict = {}
    rows = load_training_texts(DataConfig(corpus=f"file:{path}", max_sentences=None,
                                          views={"a": "none", "b": "pair"}), seed=0, stats=stats)
    assert [(r["text_a"], r["text_b"]) for r in rows] == pairs
    assert stats["duplicates_dropped"] == 2 and stats["blank_lines"] == 1 and stats["rows"] == 2
    reliability.record("training job", "duplicate pairs in a pairs corpus", input="pairs.jsonl: one pair 3 times",
                       did="trained on each pair once; dropped copies counted (input.duplicates_dropped = 2)",
                       lost="nothing (a copy is the same example)")


@pytest.mark.ray
def test_job_counts_what_it_skips_in_the_log_and_mlflow(ray_session, tmp_path, tiny_bert, real_sentences, caplog,
                                                        reliability):
    """Blank lines, duplicates, a 100 kB sentence and control characters: a real (tiny) job trains and says so."""
    from mlflow import MlflowClient

    from raydistill.runtime.jobs.distill import run_distillation

    sentences = real_sentences[:40]
    huge = "word " * 20_000
    lines = [{"text": s} for s in sentences] + ["", "  "] + [{"text": sentences[0]}] * 3
    lines += [{"text": huge}, {"text": "a dog\u0007 runs"}]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(jsonl(*lines))
    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = simcse_config(tiny_bert, tmp_path / "run", f"file:{corpus}", tracking_uri)
    with caplog.at_level(logging.WARNING, logger="raydistill.runtime.teachers.pipeline"):
        record = run_distillation(cfg, evaluate=False)

    assert record["training"]["sentences"] == 42 and record["training"]["steps"] == 2
    params = MlflowClient(tracking_uri=tracking_uri).get_run(record["mlflow_run_id"]).data.params
    counts = {key[len("input."):]: params[key] for key in params if key.startswith("input.")}
    assert counts == {"blank_lines": "2", "duplicates_dropped": "3", "subsampled_out": "0", "long_texts": "1",
                      "texts_with_control_chars": "1", "rows": "42",
                      "evaluation_sentences_removed": "0"}
    warnings = [r.getMessage() for r in caplog.records if "training corpus" in r.getMessage()]
    assert len(warnings) == 1 and "duplicates_dropped 3" in warnings[0] and "long_texts 1" in warnings[0]
    logged = warnings[0]
    rows = [
        ("blank lines in the training corpus", "2 blank lines", "ignored; counted in the log and as MLflow param "
         "input.blank_lines = 2", "nothing (they carry no data)"),
        ("duplicate sentences in the training corpus", "one sentence 4 times",
         "trained on it once; copies counted (input.duplicates_dropped = 3)", "nothing (a copy is the same example)"),
        ("a 100 kB sentence in the training corpus", "a 100,000-character text",
         "trained on it, truncated to max_length tokens by the tokenizers; counted (input.long_texts = 1)",
         "the text beyond max_length tokens"),
        ("control characters in a training text", "'a dog\\u0007 runs'",
         "trained on it; the tokenizer drops the BEL; counted (input.texts_with_control_chars = 1)", "nothing"),
    ]
    for case, what, did, lost in rows:
        reliability.record("training job", case, input=what, did=did, message=logged, lost=lost)


def test_long_and_control_texts_encode_like_what_the_tokenizer_keeps(tiny_bert, reliability):
    """No tokenizer traceback: a 100 kB text is truncated, control characters are dropped."""
    import torch

    from raydistill.models import BiEncoder

    torch.manual_seed(0)
    model = BiEncoder.from_pretrained(str(tiny_bert), max_length=16).eval()
    huge, prefix = "word " * 20_000, "word " * 40
    with_bell, without = "a dog\u0007 runs", "a dog runs"
    encoded = model.encode([huge, prefix, with_bell, without])
    assert np.isfinite(encoded).all()
    np.testing.assert_allclose(encoded[0], encoded[1], atol=1e-6)
    np.testing.assert_allclose(encoded[2], encoded[3], atol=1e-6)
    reliability.record("training job", "encoding a 100 kB text and a text with control characters",
                       input="BiEncoder.encode of both (tiny BERT, max_length 16)",
                       did="the 100 kB text encodes exactly as its first 40 words, the BEL text as the text without "
                           "it: the tokenizer truncates and cleans, no error", lost="the text beyond max_length tokens")


# --------------------------------------------------------------------------------------------------------------
# Fuzz: any bytes give records or a DataError naming the file (and line), never another exception


READERS: dict[str, tuple[str, Callable[..., Records]]] = {  # name -> (file name, reader(path, on_error=))
    "pairs": ("f.jsonl", read_pairs),
    "scored pairs": ("f.jsonl", lambda p, **kw: read_pairs(p, score_range=STS_SCALE, label_set=NLI_LABELS, **kw)),
    "sentences (JSON Lines)": ("f.jsonl", read_sentences),
    "sentences (text)": ("f.txt", read_sentences),
    "labelled texts": ("f.jsonl", lambda p, **kw: read_labelled_texts(p, label_set={0, 1}, **kw)),
    "captions": ("f.jsonl", read_captions),
}


def outcome_of(read: Callable[..., Records], path: Path, on_error: str) -> str:
    """Read; assert the outcome keeps the contract; return "parsed" or the DataError's reason."""
    try:
        records = read(path, on_error=on_error)
    except DataError as err:
        assert err.path == str(path) or Path(err.path).parent == path, (err.path, path)
        if err.reason in FILE_LEVEL_REASONS:
            assert err.line is None and str(err).startswith(f"{err.path}: ")
        else:
            assert on_error == "raise", f"skip mode raised a line-level error: {err}"
            assert err.line >= 1 and str(err).startswith(f"{err.path}:{err.line}: "), str(err)
        return err.reason
    assert isinstance(records, Records) and len(records) > 0
    for record in records:
        texts = [record] if isinstance(record, str) else [getattr(record, f) for f in ("sentence1", "sentence2", "text")
                                                          if hasattr(record, f)] + list(getattr(record, "captions", ()))
        for text in texts:  # every text a reader returns can go to a tokenizer: valid Unicode, something visible
            assert isinstance(text, str) and any(unicodedata.category(ch) not in ("Cc", "Cf", "Zs", "Zl", "Zp")
                                                 and not ch.isspace() for ch in text), repr(text)
            text.encode("utf-8")
    return "parsed"


def run_fuzz(outcomes: Counter, root: Path, content: bytes, on_error: str, compress: bool) -> None:
    for file_name, read in READERS.values():
        path = root / (file_name + (".gz" if compress else ""))
        path.write_bytes(gzip.compress(content) if compress else content)
        outcomes[outcome_of(read, path, on_error)] += 1


def test_fuzz_any_bytes(tmp_path_factory, reliability):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    root = tmp_path_factory.mktemp("fuzz-bytes")
    outcomes: Counter = Counter()
    examples = 150

    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(content=st.binary(max_size=400) | st.binary(max_size=40).map(lambda b: b"PAR1" + b + b"PAR1") |
           st.binary(max_size=60).map(lambda b: b"\x1f\x8b" + b),
           on_error=st.sampled_from(["raise", "skip"]), compress=st.booleans())
    def fuzz(content, on_error, compress):
        run_fuzz(outcomes, root, content, on_error, compress)

    fuzz()
    assert sum(outcomes.values()) >= examples * len(READERS)
    reliability.record("fuzz", "any bytes", input=f"{examples} random byte strings (plain or gzip'd; some with a "
                       f"gzip or Parquet magic) x {len(READERS)} readers x raise/skip modes",
                       did="every read gave records or a DataError naming the file (and the line for line-level "
                           "problems)", message=json.dumps(dict(sorted(outcomes.items()))),
                       lost="nothing: no other exception escaped")


def _json_lines_strategy():
    from hypothesis import strategies as st

    text = st.text(max_size=12) | st.sampled_from(["", " ", "\u0000", "\u200b", "\ud800", "a\u0007b", "caf\u00e9"])
    scalar = st.none() | st.booleans() | st.integers(-10, 10) | st.floats(allow_nan=True, allow_infinity=True) | text
    value = st.recursive(scalar, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5),
                                                                                             inner, max_size=3),
                         max_leaves=6)
    fields = ["sentence1", "sentence2", "premise", "hypothesis", "score", "label", "text", "image", "captions",
              "sentense1", "txt"]
    record = st.dictionaries(st.sampled_from(fields), value | text | st.lists(text, max_size=3), max_size=5)
    line = st.one_of(record.map(lambda r: json.dumps(r)), value.map(json.dumps), text, st.just(""))
    return st.lists(line, min_size=0, max_size=6)


def test_fuzz_json_lines(tmp_path_factory, reliability):
    """Structured fuzz: lines that are mostly JSON objects with the readers' field names and hostile values."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    root = tmp_path_factory.mktemp("fuzz-json")
    outcomes: Counter = Counter()
    examples = 150

    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(lines=_json_lines_strategy(), on_error=st.sampled_from(["raise", "skip"]),
           cut=st.none() | st.integers(0, 200))
    def fuzz(lines, on_error, cut):
        content = "\n".join(lines).encode("utf-8", "surrogatepass")  # a raw surrogate byte sequence, too
        if cut is not None:
            content = content[:cut]
        run_fuzz(outcomes, root, content, on_error, compress=False)

    fuzz()
    parsed = outcomes["parsed"]
    assert parsed > 0 and sum(outcomes.values()) - parsed > 0  # both outcomes were exercised
    reliability.record("fuzz", "JSON Lines with the readers' fields", input=f"{examples} files of up to 6 lines: "
                       "objects with the expected and misspelled fields holding null, numbers, NaN, nested values, "
                       "control and zero-width characters, surrogates; files cut at random",
                       did="every read gave records (only usable texts) or a DataError naming file and line",
                       message=json.dumps(dict(sorted(outcomes.items()))), lost="nothing: no other exception escaped")


def test_fuzz_parquet_tables(tmp_path_factory, reliability):
    """Random Parquet files and directories of parts, column types chosen at random (and differing per part)."""
    import pyarrow as pa
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    root = tmp_path_factory.mktemp("fuzz-parquet")
    outcomes: Counter = Counter()
    examples = 40
    types = {"string": (pa.string(), st.text(max_size=6) | st.sampled_from(["", "\u0000"])),
             "int": (pa.int64(), st.integers(-3, 3)), "float": (pa.float64(), st.floats(allow_nan=True)),
             "bool": (pa.bool_(), st.booleans()), "strings": (pa.list_(pa.string()), st.lists(st.text(max_size=4)))}
    names = ["sentence1", "sentence2", "score", "label", "text", "image", "captions"]

    @st.composite
    def table(draw):
        rows = draw(st.integers(0, 3))
        columns = {}
        for name in draw(st.lists(st.sampled_from(names), unique=True, max_size=4)):
            arrow_type, values = types[draw(st.sampled_from(sorted(types)))]
            columns[name] = pa.array(draw(st.lists(st.none() | values, min_size=rows, max_size=rows)), type=arrow_type)
        return pa.table(columns) if columns else pa.table({"text": pa.array([], type=pa.string())})

    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(parts=st.lists(table(), min_size=1, max_size=3), on_error=st.sampled_from(["raise", "skip"]))
    def fuzz(parts, on_error):
        import shutil

        import pyarrow.parquet as pq

        target = root / "parts"
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir()
        for index, part in enumerate(parts):
            pq.write_table(part, target / f"part-{index}.parquet")
        single = target / "part-0.parquet"
        for name, (_, read) in READERS.items():
            if name == "sentences (text)":
                continue
            for path in (single, target):
                outcomes[outcome_of(read, path, on_error)] += 1

    fuzz()
    assert sum(outcomes.values()) > 0
    reliability.record("fuzz", "Parquet files and part directories", input=f"{examples} sets of 1-3 random tables "
                       "(columns of string, int, float, bool, list types, nulls; types differing between parts)",
                       did="every read gave records or a DataError naming the part (and the row)",
                       message=json.dumps(dict(sorted(outcomes.items()))), lost="nothing: no other exception escaped")


# --------------------------------------------------------------------------------------------------------------
# The generator of docs/reliability.md


def test_reliability_log_merges_and_the_table_renders(tmp_path):
    import importlib.util

    from tests.reliability_log import merge_rows

    spec = importlib.util.spec_from_file_location("reliability_table", Path(__file__).resolve().parents[1] / "scripts"
                                                  / "reliability_table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)

    def row(test, case, **extra):
        return {"area": "data file", "case": case, "input": "in | put", "did": "refused", "lost": "nothing",
                "test": test, "position": [1, 0], "outcome": "passed", "e2e": False, **extra}

    log = tmp_path / "reliability.json"
    # Tests defined in this file: the log keeps rows only of tests that still exist.
    test_a, test_b = "tests/test_bad_input.py::test_fuzz_any_bytes", \
        "tests/test_bad_input.py::test_skip_mode_counts_every_bad_line_by_reason"
    merge_rows(log, [row(test_a, "old a"), row(test_b, "b"),
                     row("tests/test_gone.py::test_c", "vanished file")], set())
    merge_rows(log, [row(test_a, "new a", message="<tmp>/x.jsonl:2: `bad`", outcome="failed")], {test_a})
    rows = table.load_rows(log)
    assert [r["case"] for r in rows] == ["new a", "b"]  # replaced, kept, dropped (its file does not exist)

    text = table.render(rows + [dict(rows[1], area="a new kind of fault")])
    assert "3 cases in 2 areas (1 failed, 2 passed)." in text
    assert "| new a | in \\| put | refused: `` <tmp>/x.jsonl:2: `bad` `` | nothing | " in text
    assert "[test_fuzz_any_bytes](../tests/test_bad_input.py) **FAILED**" in text
    assert text.index("## Data file") < text.index("## A new kind of fault")  # unknown areas go last
    out = tmp_path / "reliability.md"
    assert table.main(["--json", str(log), "--out", str(out)]) == 0
    assert table.main(["--json", str(log), "--out", str(out), "--check"]) == 0
    out.write_text(out.read_text() + "hand edit\n")
    assert table.main(["--json", str(log), "--out", str(out), "--check"]) == 1
