"""Validated readers for the project's JSON Lines files (plain or gzip'd) and one-sentence-per-line text files.

Every benchmark number the project reports starts here, so a malformed row must never be read silently: a bad line
raises `DataError` naming the file, the 1-based line and the field, e.g.

    sts/sts12.jsonl:17: field 'score': 7.5 is outside the scale 0-5

Readers stream the file (a generator parses one line at a time, so memory holds the records, not the text) and
return a `Records` list. With ``on_error="skip"`` a bad line is dropped instead and counted by reason in
``Records.skipped`` (e.g. ``{"empty_text": 2, "not_json": 1}``); problems with the file as a whole (``formats.py``)
always raise, since there is nothing to skip to. Blank lines carry nothing and are ignored, but counted
(``Records.ignored["blank_lines"]``).

Formats: whatever ``formats.py`` reads (JSON Lines, plain or gzip'd; Parquet files and directories of parts; a
Hugging Face ``datasets`` directory; ``.csv`` / ``.tsv`` with a header line), one record per line or row, an error's
"line" being the file's line or the part's 1-based row:

    pairs             {"sentence1": str, "sentence2": str, "score"?: number, "label"?: str|int, ...}
                      (NLI files name the texts "premise" / "hypothesis"; found automatically)
    labelled texts    {"text": str, "label": str|int}
    sentences         {"text": str, ...}  or a .txt file with one sentence per line (blank lines ignored)
    captions          {"image": str, "captions": [str, ...]}

Extra fields (``subset``, ``source``, ``pair_id``) are allowed and ignored. Texts are kept exactly as written
(no stripping): the evaluation must see what the benchmark's authors published. A text must still be one a
tokenizer can take: not null, a string, with at least one visible character (a text of control characters alone
tokenizes to nothing), and no lone UTF-16 surrogate (``"\\ud800"`` is valid JSON but not Unicode text; the
tokenizers and UTF-8 encoding fail on it). A field given twice on one line is an error (JSON keeps the last one
silently)."""

from __future__ import annotations

import difflib
import json
import math
import reprlib
import unicodedata
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from raydistill.data.formats import (
    DataError, is_csv, is_hf_dataset, is_parquet, iter_lines, iter_sourced_records, json_type_name, last_suffix,
)

__all__ = [
    "Pair", "LabelledText", "CaptionGroup", "Records", "read_pairs", "read_labelled_texts", "read_sentences",
    "read_captions",
]

ON_ERROR_MODES = ("raise", "skip")
PAIR_TEXT_FIELDS = (("sentence1", "sentence2"), ("premise", "hypothesis"))

@dataclass(frozen=True, slots=True)
class Pair:
    """Two texts with an optional gold similarity (STS, SICK-R) and/or class label (NLI, SICK-E, MRPC, QQP)."""

    sentence1: str
    sentence2: str
    score: float | None = None
    label: str | int | None = None


@dataclass(frozen=True, slots=True)
class LabelledText:
    """One text with its class (SentEval transfer tasks)."""

    text: str
    label: str | int


@dataclass(frozen=True, slots=True)
class CaptionGroup:
    """Independent captions of one image: human paraphrases of one scene (Flickr30k)."""

    image: str
    captions: tuple[str, ...]


T = TypeVar("T")


class Records(list):
    """The records of one file, in file order, plus what ``on_error="skip"`` dropped.

    A plain list otherwise; ``skipped``: ``DataError.reason`` -> count (empty when nothing was skipped);
    ``ignored``: what was dropped without being an error (``{"blank_lines": 3}``)."""

    def __init__(self, items=(), *, path: str | Path = "", skipped: Counter | None = None,
                 ignored: Counter | None = None):
        super().__init__(items)
        self.path = str(path)
        self.skipped: Counter = skipped if skipped is not None else Counter()
        self.ignored: Counter = ignored if ignored is not None else Counter()

    @property
    def num_skipped(self) -> int:
        return sum(self.skipped.values())

_PREVIEW = reprlib.Repr()  # (keyword arguments only from Python 3.12)
_PREVIEW.maxstring = _PREVIEW.maxother = 40
_PREVIEW.maxlist = _PREVIEW.maxdict = 4
_PREVIEW.maxlevel = 2


def _preview(value: Any) -> str:
    """A short rendering of a bad value for a message (never fails, never renders a huge value in full)."""
    if isinstance(value, str):
        return json.dumps(value[:37] + "..." if len(value) > 40 else value, ensure_ascii=False)
    if isinstance(value, (bool, int, float)) or value is None:
        text = json.dumps(value)
        return text if len(text) <= 40 else text[:37] + "..."
    return _PREVIEW.repr(value)


# ---------------------------------------------------------------------------------------------------------------
# Fields


@dataclass(frozen=True, slots=True)
class _Line:
    """Where a record came from, so every field check can say so."""

    path: Path
    lineno: int
    obj: dict[str, Any]
    expected: tuple[str, ...]

    def error(self, field: str | None, problem: str, reason: str) -> DataError:
        return DataError(self.path, problem, line=self.lineno, field=field, reason=reason)

    def require(self, field: str) -> Any:
        """The value of `field`; a missing field suggests the closest name the line does have."""
        if field in self.obj:
            return self.obj[field]
        unexpected = [key for key in self.obj if key not in self.expected]
        close = difflib.get_close_matches(field, unexpected, n=1, cutoff=0.6)
        if close:
            hint = f"; the line has '{close[0]}' instead (misspelled?)"
        else:
            present = ", ".join(f"'{key}'" for key in self.obj) or "none"
            hint = f"; the line's fields are {present}"
        raise self.error(field, f"missing{hint}", "missing_field")

    def text(self, field: str, value: Any = None, *, lookup: bool = True) -> str:
        value = self.require(field) if lookup else value
        if value is None:
            raise self.error(field, "is null, expected a string", "null_text")
        if not isinstance(value, str):
            raise self.error(field, f"expected a string, got {json_type_name(value)} {_preview(value)}", "not_string")
        problem = _text_problem(value)
        if problem:
            raise self.error(field, *problem)
        return value

    def numeric(self, field: str, scale: tuple[float, float] | None) -> float:
        value = self.require(field)
        if value is None:
            raise self.error(field, "is null, expected a number", "not_number")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(field, f"expected a number, got {json_type_name(value)} {_preview(value)}", "not_number")
        if not math.isfinite(value):
            raise self.error(field, f"expected a finite number, got {value}", "not_number")
        if scale is not None and not scale[0] <= value <= scale[1]:
            raise self.error(field, f"{value:g} is outside the scale {scale[0]:g}-{scale[1]:g}", "out_of_range")
        return float(value)

    def label(self, field: str, label_set: Collection | None) -> str | int:
        value = self.require(field)
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise self.error(field, f"expected a string or integer label, got {json_type_name(value)}", "bad_label")
        # Type-exact membership: 1 and "1" are different labels, and a file mixing them is a bug worth reporting.
        if label_set is not None and not any(value == allowed and type(value) is type(allowed)
                                             for allowed in label_set):
            allowed_text = ", ".join(json.dumps(a) for a in sorted(label_set, key=str))
            raise self.error(field, f"{json.dumps(value)} is not one of the labels {{{allowed_text}}}", "bad_label")
        return value


# Whitespace, control characters (Cc) and invisible format characters (Cf: zero-width space and joiners, soft
# hyphen, bidi marks, BOM, tags): tokenizers drop all of them, so a text made only of these is an empty sentence.
_INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Zs", "Zl", "Zp"})


def _visible(char: str) -> bool:
    return not char.isspace() and unicodedata.category(char) not in _INVISIBLE_CATEGORIES


def _text_problem(value: str) -> tuple[str, str] | None:
    """``(problem, reason)`` when a string cannot serve as a sentence, else None."""
    if not value.strip():
        return ("is empty" if not value else "is whitespace only"), "empty_text"
    if not any(_visible(char) for char in value):  # stops at the first visible character, usually the first
        return "has no visible characters (only control or invisible format characters)", "empty_text"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        return (f"contains a lone UTF-16 surrogate U+{ord(value[err.start]):04X} at character {err.start + 1} "
                "(valid JSON escape, but not Unicode text)"), "bad_unicode"
    return None


def _check_on_error(on_error: str) -> None:
    if on_error not in ON_ERROR_MODES:
        raise ValueError(f"on_error must be one of {ON_ERROR_MODES}, got {on_error!r}")


def _read_records(path: str | Path, parse: Callable[[_Line], T], expected: tuple[str, ...] | Callable,
                  on_error: str) -> Records:
    """Drive `iter_records`, build one record per line with `parse`, and raise or count bad lines."""
    _check_on_error(on_error)
    path = Path(path)
    records: list[T] = []
    skipped: Counter = Counter()
    ignored: Counter = Counter()
    for source, line_number, obj in iter_sourced_records(path, ignored):
        try:
            if isinstance(obj, DataError):
                raise obj
            fields = expected(obj) if callable(expected) else expected
            records.append(parse(_Line(source, line_number, obj, fields)))
        except DataError as err:
            if on_error == "raise":
                raise
            skipped[err.reason] += 1
    return _nonempty_records(path, records, skipped, ignored)


def _nonempty_records(path: Path, records: list, skipped: Counter, ignored: Counter) -> Records:
    if not records:
        detail = ", ".join(f"{reason}: {count}" for reason, count in sorted(skipped.items()))
        raise DataError(path, f"no valid records (skipped {detail})", reason="empty_file")
    return Records(records, path=path, skipped=skipped, ignored=ignored)


# ---------------------------------------------------------------------------------------------------------------
# Readers


def read_pairs(path: str | Path, *, score_range: tuple[float, float] | None = None, label_set: Collection | None = None,
               text_fields: tuple[str, str] | None = None, on_error: str = "raise") -> Records:
    """Sentence pairs from a JSON Lines file, validated line by line.

    Args:
        score_range: when given, every line must have a numeric ``score`` inside ``[low, high]`` (STS: 0-5,
            SICK: 1-5). Without it a ``score`` is optional but must still be a finite number when present.
        label_set: when given, every line must have a ``label`` from this set (type-exact: ``1`` is not ``"1"``).
            Without it a ``label`` is optional (string or integer).
        text_fields: the two text field names; default: ``("premise", "hypothesis")`` for lines that have a
            ``premise`` field, else ``("sentence1", "sentence2")``.
        on_error: ``"raise"`` (default) or ``"skip"`` (count bad lines by reason in ``Records.skipped``).
    """
    def fields_of(obj: dict) -> tuple[str, ...]:
        first, second = text_fields or (PAIR_TEXT_FIELDS[1] if "premise" in obj else PAIR_TEXT_FIELDS[0])
        return (first, second, "score", "label")

    def parse(line: _Line) -> Pair:
        first, second = line.expected[:2]
        score = line.numeric("score", score_range) if score_range is not None or "score" in line.obj else None
        label = line.label("label", label_set) if label_set is not None or "label" in line.obj else None
        return Pair(line.text(first), line.text(second), score, label)

    return _read_records(path, parse, fields_of, on_error)


def read_labelled_texts(path: str | Path, *, label_set: Collection | None = None,
                        on_error: str = "raise") -> Records:
    """``{"text", "label"}`` lines (SentEval transfer tasks); `label_set` as in `read_pairs`."""
    return _read_records(path, lambda line: LabelledText(line.text("text"), line.label("label", label_set)),
                         ("text", "label"), on_error)


def read_captions(path: str | Path, *, on_error: str = "raise") -> Records:
    """``{"image": str, "captions": [str, ...]}`` lines; an error in a caption names it as ``captions[i]``."""

    def parse(line: _Line) -> CaptionGroup:
        image = line.require("image")
        if isinstance(image, bool) or not isinstance(image, (str, int)):
            raise line.error("image", f"expected a string id, got {json_type_name(image)}", "not_string")
        captions = line.require("captions")
        if not isinstance(captions, list):
            raise line.error("captions", f"expected an array of strings, got {json_type_name(captions)}", "not_string")
        if not captions:
            raise line.error("captions", "is an empty array", "empty_text")
        texts = tuple(line.text(f"captions[{i}]", caption, lookup=False) for i, caption in enumerate(captions))
        return CaptionGroup(str(image), texts)

    return _read_records(path, parse, ("image", "captions"), on_error)


def read_sentences(path: str | Path, *, field: str = "text", on_error: str = "raise") -> Records:
    """Sentences from a ``.txt`` file (one per line, blank lines ignored), or the `field` column of JSON Lines,
    Parquet, CSV/TSV or a Hugging Face dataset directory (``save_to_disk``).

    The format is chosen by the content for Parquet, by the directory's files for a Hugging Face dataset, by the
    name otherwise (``.txt`` / ``.txt.gz`` is text, ``.jsonl`` / ``.json`` / ``.ndjson`` is JSON Lines, ``.csv`` /
    ``.tsv`` is CSV) and, for other names, by whether the first non-blank line starts with ``{``. Text lines keep
    their inner and leading whitespace; only the line ending is removed."""
    _check_on_error(on_error)
    path = Path(path)
    if not _has_records(path):
        return _read_text_lines(path, on_error)
    return _read_records(path, lambda line: line.text(field), (field,), on_error)


def _has_records(path: Path) -> bool:
    if is_parquet(path) or is_hf_dataset(path) or is_csv(path):
        return True
    suffix = last_suffix(path)
    if suffix in (".txt", ".jsonl", ".json", ".ndjson"):
        return suffix != ".txt"
    for _, text in iter_lines(path):
        return isinstance(text, str) and text.lstrip().startswith("{")
    return False


def _read_text_lines(path: Path, on_error: str) -> Records:
    sentences: list[str] = []
    skipped: Counter = Counter()
    ignored: Counter = Counter()
    for line_number, text in iter_lines(path, ignored):
        problem = None if isinstance(text, DataError) else _text_problem(text)
        if problem:
            text = DataError(path, problem[0], line=line_number, reason=problem[1])
        if isinstance(text, DataError):
            if on_error == "raise":
                raise text
            skipped[text.reason] += 1
            continue
        sentences.append(text)
    return _nonempty_records(path, sentences, skipped, ignored)
