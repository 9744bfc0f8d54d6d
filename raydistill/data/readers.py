"""Validated readers for the project's JSON Lines files (plain or gzip'd) and one-sentence-per-line text files.

Every benchmark number the project reports starts here, so a malformed row must never be read silently: a bad line
raises `DataError` naming the file, the 1-based line and the field, e.g.

    sts/sts12.jsonl:17: field 'score': 7.5 is outside the scale 0-5

Readers stream the file (a generator parses one line at a time, so memory holds the records, not the text) and
return a `Records` list. With ``on_error="skip"`` a bad line is dropped instead and counted by reason in
``Records.skipped`` (e.g. ``{"empty_text": 2, "not_json": 1}``); problems with the file as a whole (missing,
empty, corrupt gzip or Parquet, Parquet parts whose column types disagree) always raise, since there is nothing to
skip to. Blank lines carry nothing and are ignored, but counted (``Records.ignored["blank_lines"]``).

Formats (UTF-8, one JSON object per line; gzip is detected from the file's magic bytes, not its name, so
``x.jsonl`` and ``x.jsonl.gz`` read the same way). A Parquet file (detected by its ``PAR1`` magic) or a directory
of ``*.parquet`` parts (what Ray Data writes) is read the same way, one row per record; there the "line" of an
error is the 1-based row of the part file it names. So is a Hugging Face ``datasets`` directory (``save_to_disk``;
"line" = 1-based row) and a ``.csv`` / ``.tsv`` file with a header line (line = the file's line):

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
silently).
"""

from __future__ import annotations

import difflib
import gzip
import io
import json
import math
import reprlib
import unicodedata
import zlib
from collections import Counter
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

__all__ = [
    "DataError",
    "Pair",
    "LabelledText",
    "CaptionGroup",
    "Records",
    "read_pairs",
    "read_labelled_texts",
    "read_sentences",
    "read_captions",
    "iter_jsonl",
    "iter_lines",
    "iter_parquet",
    "iter_records",
    "iter_csv",
    "iter_hf_dataset",
    "is_parquet",
    "is_csv",
    "is_hf_dataset",
]

GZIP_MAGIC = b"\x1f\x8b"
PARQUET_MAGIC = b"PAR1"
ON_ERROR_MODES = ("raise", "skip")
PAIR_TEXT_FIELDS = (("sentence1", "sentence2"), ("premise", "hypothesis"))


class DataError(ValueError):
    """A bad data file or line. ``str()`` is ``"<file>:<line>: field '<field>': <problem>"``.

    The line and field parts are left out when they do not apply (a missing file has neither, a line that is not
    JSON has no field). ``reason`` is a short machine-readable key (``"not_json"``, ``"out_of_range"``, ...) used
    to count skipped rows in ``on_error="skip"`` mode.
    """

    def __init__(self, path: str | Path, problem: str, *, line: int | None = None, field: str | None = None,
                 reason: str = "invalid"):
        self.path = str(path)
        self.line = line
        self.field = field
        self.problem = problem
        self.reason = reason
        location = self.path if line is None else f"{self.path}:{line}"
        where = f"{location}: field '{field}'" if field is not None else location
        super().__init__(f"{where}: {problem}")


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

    A plain list in every other respect; ``skipped`` maps a reason (``DataError.reason``) to its count and is
    empty when nothing was skipped; ``ignored`` counts what was dropped without being an error
    (``{"blank_lines": 3}``).
    """

    def __init__(self, items=(), *, path: str | Path = "", skipped: Counter | None = None,
                 ignored: Counter | None = None):
        super().__init__(items)
        self.path = str(path)
        self.skipped: Counter = skipped if skipped is not None else Counter()
        self.ignored: Counter = ignored if ignored is not None else Counter()

    @property
    def num_skipped(self) -> int:
        return sum(self.skipped.values())


# ---------------------------------------------------------------------------------------------------------------
# Lines


def _check_exists(path: Path) -> None:
    if not path.exists():
        raise DataError(path, "file not found", reason="missing_file")
    if not path.is_file():
        raise DataError(path, "not a regular file", reason="missing_file")


def _magic(path: Path, size: int) -> bytes:
    with open(path, "rb") as probe:
        return probe.read(size)


def _open_binary(path: Path):
    """Open `path` for binary reading, through gzip when its first bytes say so."""
    _check_exists(path)
    return gzip.open(path, "rb") if _magic(path, 2) == GZIP_MAGIC else open(path, "rb")


def iter_lines(path: str | Path, counts: Counter | None = None) -> Iterator[tuple[int, str | DataError]]:
    """Yield ``(line_number, text)`` for every non-blank line (line ending removed), 1-based.

    Decoding line by line (rather than opening in text mode) is what lets a bad byte be reported with its line:
    such a line is yielded as ``(line_number, DataError)`` so that the caller may raise or skip it and go on.
    A UTF-8 byte-order mark on the first line is dropped. A missing, empty or corrupt file raises. Blank lines
    are counted in ``counts["blank_lines"]`` when a Counter is given.
    """
    path = Path(path)
    seen_any = False
    try:
        with _open_binary(path) as stream:
            for line_number, raw in enumerate(stream, start=1):
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    seen_any = True
                    yield line_number, DataError(
                        path, f"not valid UTF-8 (byte 0x{raw[err.start]:02x} at column {err.start + 1})",
                        line=line_number, reason="not_utf8")
                    continue
                if line_number == 1 and text.startswith("\ufeff"):
                    text = text[1:]
                text = text.rstrip("\r\n")
                if not text.strip():
                    if counts is not None:
                        counts["blank_lines"] += 1
                    continue
                seen_any = True
                yield line_number, text
    except (gzip.BadGzipFile, EOFError, zlib.error) as err:
        raise DataError(path, f"corrupt gzip stream ({err or type(err).__name__})", reason="corrupt_file") from None
    if not seen_any:
        raise DataError(path, "file is empty (no records)", reason="empty_file")


class _DuplicateField(ValueError):
    def __init__(self, field: str):
        super().__init__(field)
        self.field = field


def _object_without_duplicate_fields(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateField(key)
            seen.add(key)
    return obj


def _parse_json_line(path: Path, line_number: int, text: str) -> dict[str, Any] | DataError:
    def bad(problem: str, reason: str = "not_json", field: str | None = None) -> DataError:
        return DataError(path, problem, line=line_number, field=field, reason=reason)

    try:
        obj = json.loads(text, object_pairs_hook=_object_without_duplicate_fields)
    except _DuplicateField as dup:
        return bad("given twice on the line (JSON would silently keep the last value)", "duplicate_field", dup.field)
    except json.JSONDecodeError as err:
        if err.msg == "Invalid control character at" and err.pos < len(text):
            return bad(f"not valid JSON (raw control character U+{ord(text[err.pos]):04X} inside a string at "
                       f"column {err.colno}; JSON needs it escaped, e.g. \\t or \\u0000)")
        return bad(f"not valid JSON ({err.msg} at column {err.colno})")
    except RecursionError:
        return bad("not valid JSON here (arrays or objects nested too deeply)")
    except ValueError as err:  # e.g. an integer literal of more than 4300 digits
        return bad(f"not valid JSON here ({err})")
    if not isinstance(obj, dict):
        return bad(f"expected a JSON object, got {_json_type(obj)}", "not_object")
    return obj


def iter_jsonl(path: str | Path, counts: Counter | None = None
               ) -> Iterator[tuple[int, dict[str, Any] | DataError]]:
    """Yield ``(line_number, object)`` per JSON Lines record, or ``(line_number, DataError)`` for a bad line.

    Bad lines are yielded rather than raised so that the caller decides between raising and skipping, and the
    stream goes on after a skipped line. File-level problems (missing, empty, corrupt) raise directly.
    """
    path = Path(path)
    for line_number, text in iter_lines(path, counts):
        if isinstance(text, DataError):
            yield line_number, text
        else:
            yield line_number, _parse_json_line(path, line_number, text)


def is_parquet(path: str | Path) -> bool:
    """A Parquet file or a directory holding ``*.parquet`` parts.

    A file is Parquet when it starts with the magic ``PAR1`` and either ends with it too (whatever its name) or is
    named ``*.parquet`` (so that a damaged Parquet file is reported as one, and a text file whose first sentence
    begins with "PAR1" is still text).
    """
    path = Path(path)
    if path.is_dir():
        return any(path.glob("*.parquet"))
    if not path.is_file() or _magic(path, 4) != PARQUET_MAGIC:
        return False
    if path.suffix.lower() == ".parquet":
        return True
    with open(path, "rb") as probe:
        probe.seek(max(0, path.stat().st_size - 4))
        return probe.read(4) == PARQUET_MAGIC and path.stat().st_size >= 8


def _parquet_parts(path: Path) -> list[Path]:
    if path.is_dir():
        parts = sorted(p for p in path.glob("*.parquet") if p.is_file())
        if not parts:
            raise DataError(path, "directory holds no *.parquet files", reason="missing_file")
        return parts
    _check_exists(path)
    return [path]


def iter_parquet(path: str | Path) -> Iterator[tuple[int, dict[str, Any] | DataError]]:
    """Yield ``(row_number, row dict)`` of a Parquet file, or of every part of a Parquet directory in name order.

    Row numbers are 1-based within their part, and errors name the part. The parts of a directory must agree on
    every column's type: a column that is ``double`` in one part and ``string`` in another (a "mixed-type column",
    e.g. parts written by different tools) raises at the first part that differs, naming the column.
    """
    for _, row_number, row in _iter_parquet_parts(Path(path)):
        yield row_number, row


def _iter_parquet_parts(path: Path) -> Iterator[tuple[Path, int, dict[str, Any]]]:
    """`iter_parquet` with the part each row comes from: ``(part, row_number, row)``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    first_seen: dict[str, tuple[Any, Path]] = {}  # column -> (type, part) where it was first seen with a type
    seen_any = False
    for part in _parquet_parts(path):
        try:
            parquet = pq.ParquetFile(part)
            schema = parquet.schema_arrow
        except (pa.ArrowException, OSError) as err:
            raise DataError(part, f"corrupt Parquet file ({_first_line(err)})", reason="corrupt_file") from None
        for name, arrow_type in zip(schema.names, schema.types):
            family = _type_family(arrow_type)
            if family == "null":  # an all-null column has no type of its own; its rows are checked one by one
                continue
            if name not in first_seen:
                first_seen[name] = (arrow_type, part)
            elif _type_family(first_seen[name][0]) != family:
                first_type, first_part = first_seen[name]
                raise DataError(part, f"column type {arrow_type} differs from {first_type} in {first_part.name}: "
                                      "a column must have one type in every part", field=name, reason="mixed_types")
        row_number = 0
        try:
            for batch in parquet.iter_batches(batch_size=4096):
                for row in batch.to_pylist():
                    row_number += 1
                    seen_any = True
                    yield part, row_number, row
        except (pa.ArrowException, OSError) as err:
            raise DataError(part, f"corrupt Parquet file after row {row_number} ({_first_line(err)})",
                            reason="corrupt_file") from None
    if not seen_any:
        raise DataError(path, "file is empty (no records)", reason="empty_file")


def is_csv(path: str | Path) -> bool:
    """A ``.csv`` or ``.tsv`` file (optionally gzip'd), by name: CSV has no magic bytes to go by."""
    suffixes = [s.lower() for s in Path(path).suffixes if s.lower() != ".gz"]
    return bool(suffixes) and suffixes[-1] in (".csv", ".tsv") and Path(path).is_file()


def is_hf_dataset(path: str | Path) -> bool:
    """A directory written by Hugging Face ``datasets``' ``save_to_disk`` (a Dataset or a DatasetDict)."""
    path = Path(path)
    return path.is_dir() and any((path / name).is_file() for name in _HF_DATASET_MARKERS)


_HF_DATASET_MARKERS = ("state.json", "dataset_dict.json")


def iter_csv(path: str | Path) -> Iterator[tuple[int, dict[str, Any] | DataError]]:
    """Yield ``(line_number, row dict)`` of a CSV (``.csv``) or tab-separated (``.tsv``) file with a header line.

    The line number is the file line where the record ends (a quoted field may span lines), so an editor jumps to
    it; the header is line 1. A row with more fields than the header is yielded as a ``DataError``; a row with
    fewer has ``None`` in the missing columns (reported by the field check that reads them). Empty cells read as
    ``""``.
    """
    import csv

    path = Path(path)
    delimiter = "\t" if [s.lower() for s in path.suffixes if s.lower() != ".gz"][-1] == ".tsv" else ","
    try:
        with _open_binary(path) as raw, io.TextIOWrapper(raw, encoding="utf-8-sig", newline="") as stream:
            reader = csv.reader(stream, delimiter=delimiter)
            header = next(reader, None)
            if header is None:
                raise DataError(path, "file is empty (no header line)", reason="empty_file")
            duplicated = sorted({name for name in header if header.count(name) > 1})
            if duplicated:
                raise DataError(path, f"the header names column(s) {', '.join(map(repr, duplicated))} more than once",
                                line=1, reason="duplicate_field")
            seen_any = False
            for values in reader:
                if not any(value.strip() for value in values):
                    continue
                seen_any = True
                if len(values) > len(header):
                    yield reader.line_num, DataError(path, f"has {len(values)} fields, the header has {len(header)}",
                                                     line=reader.line_num, reason="not_object")
                    continue
                yield reader.line_num, dict(zip(header, values + [None] * (len(header) - len(values))))
    except UnicodeDecodeError as err:
        raise DataError(path, f"not valid UTF-8 ({err.reason})", reason="not_utf8") from None
    except csv.Error as err:
        raise DataError(path, f"not valid CSV ({err})", reason="corrupt_file") from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as err:
        raise DataError(path, f"corrupt gzip stream ({err or type(err).__name__})", reason="corrupt_file") from None
    if not seen_any:
        raise DataError(path, "file is empty (no records)", reason="empty_file")


def iter_hf_dataset(path: str | Path) -> Iterator[tuple[int, dict[str, Any] | DataError]]:
    """Yield ``(row_number, row dict)`` of a ``datasets.load_from_disk`` directory, 1-based.

    A DatasetDict (several splits) must be narrowed to one split by naming its directory (``<dir>/train``).
    """
    path = Path(path)
    if (path / "dataset_dict.json").is_file() and not (path / "state.json").is_file():
        splits = sorted(p.name for p in path.iterdir() if (p / "state.json").is_file())
        raise DataError(path, f"is a Hugging Face DatasetDict with splits {', '.join(splits) or '(none)'}: "
                              f"name one, e.g. {path / (splits[0] if splits else 'train')}", reason="missing_file")
    import datasets

    try:
        dataset = datasets.load_from_disk(str(path))
    except (OSError, ValueError, FileNotFoundError) as err:
        raise DataError(path, f"not a readable Hugging Face dataset directory ({_first_line(err)})",
                        reason="corrupt_file") from None
    if len(dataset) == 0:
        raise DataError(path, "dataset is empty (no rows)", reason="empty_file")
    row_number = 0
    for batch in dataset.data.to_batches(max_chunksize=4096):
        for row in batch.to_pylist():
            row_number += 1
            yield row_number, row


def iter_records(path: str | Path, counts: Counter | None = None
                 ) -> Iterator[tuple[int, dict[str, Any] | DataError]]:
    """The one entry point of the record readers: Parquet (by content), a Hugging Face dataset directory, CSV/TSV
    (by name), else JSON Lines."""
    if is_parquet(path):
        return iter_parquet(path)
    if is_hf_dataset(path):
        return iter_hf_dataset(path)
    if is_csv(path):
        return iter_csv(path)
    return iter_jsonl(path, counts)


def _iter_sourced_records(path: Path, counts: Counter) -> Iterator[tuple[Path, int, dict[str, Any] | DataError]]:
    """`iter_records` plus the file each record comes from (the part, for a Parquet directory)."""
    if is_parquet(path):
        yield from _iter_parquet_parts(path)
    else:
        for line_number, obj in iter_records(path, counts):
            yield path, line_number, obj


def _type_family(arrow_type) -> str:
    """Types that read back as the same Python type (int32 and int64, string and large_string) are one family."""
    import pyarrow as pa

    for family, test in (("null", pa.types.is_null), ("text", pa.types.is_string), ("text", pa.types.is_large_string),
                         ("boolean", pa.types.is_boolean), ("number", pa.types.is_integer),
                         ("number", pa.types.is_floating), ("number", pa.types.is_decimal),
                         ("bytes", pa.types.is_binary), ("bytes", pa.types.is_large_binary),
                         ("array", pa.types.is_list), ("array", pa.types.is_large_list),
                         ("array", pa.types.is_fixed_size_list)):
        if test(arrow_type):
            return family
    return str(arrow_type)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, (bytes, bytearray)):
        return "bytes"
    return type(value).__name__


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
            raise self.error(field, f"expected a string, got {_json_type(value)} {_preview(value)}", "not_string")
        problem = _text_problem(value)
        if problem:
            raise self.error(field, *problem)
        return value

    def numeric(self, field: str, scale: tuple[float, float] | None) -> float:
        value = self.require(field)
        if value is None:
            raise self.error(field, "is null, expected a number", "not_number")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(field, f"expected a number, got {_json_type(value)} {_preview(value)}", "not_number")
        if not math.isfinite(value):
            raise self.error(field, f"expected a finite number, got {value}", "not_number")
        if scale is not None and not scale[0] <= value <= scale[1]:
            raise self.error(field, f"{value:g} is outside the scale {scale[0]:g}-{scale[1]:g}", "out_of_range")
        return float(value)

    def label(self, field: str, label_set: Collection | None) -> str | int:
        value = self.require(field)
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise self.error(field, f"expected a string or integer label, got {_json_type(value)}", "bad_label")
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
    for source, line_number, obj in _iter_sourced_records(path, ignored):
        try:
            if isinstance(obj, DataError):
                raise obj
            fields = expected(obj) if callable(expected) else expected
            records.append(parse(_Line(source, line_number, obj, fields)))
        except DataError as err:
            if on_error == "raise":
                raise
            skipped[err.reason] += 1
    if not records:
        detail = ", ".join(f"{reason}: {count}" for reason, count in sorted(skipped.items()))
        raise DataError(path, f"no valid records (skipped {detail})", reason="empty_file")
    return Records(records, path=path, skipped=skipped, ignored=ignored)


# ---------------------------------------------------------------------------------------------------------------
# Readers


def read_pairs(
    path: str | Path,
    *,
    score_range: tuple[float, float] | None = None,
    label_set: Collection | None = None,
    text_fields: tuple[str, str] | None = None,
    on_error: str = "raise",
) -> Records:
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
    score_required = score_range is not None
    label_required = label_set is not None

    def fields_of(obj: dict) -> tuple[str, ...]:
        first, second = text_fields or (PAIR_TEXT_FIELDS[1] if "premise" in obj else PAIR_TEXT_FIELDS[0])
        return (first, second, "score", "label")

    def parse(line: _Line) -> Pair:
        first, second = line.expected[:2]
        obj = line.obj
        score = line.numeric("score", score_range) if score_required or "score" in obj else None
        label = line.label("label", label_set) if label_required or "label" in obj else None
        return Pair(line.text(first), line.text(second), score, label)

    return _read_records(path, parse, fields_of, on_error)


def read_labelled_texts(path: str | Path, *, label_set: Collection | None = None,
                        on_error: str = "raise") -> Records:
    """``{"text", "label"}`` lines (SentEval transfer tasks); `label_set` as in `read_pairs`."""

    def parse(line: _Line) -> LabelledText:
        return LabelledText(line.text("text"), line.label("label", label_set))

    return _read_records(path, parse, ("text", "label"), on_error)


def read_captions(path: str | Path, *, on_error: str = "raise") -> Records:
    """``{"image": str, "captions": [str, ...]}`` lines; an error in a caption names it as ``captions[i]``."""

    def parse(line: _Line) -> CaptionGroup:
        image = line.require("image")
        if isinstance(image, bool) or not isinstance(image, (str, int)):
            raise line.error("image", f"expected a string id, got {_json_type(image)}", "not_string")
        captions = line.require("captions")
        if not isinstance(captions, list):
            raise line.error("captions", f"expected an array of strings, got {_json_type(captions)}", "not_string")
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
    ``.tsv`` is CSV) and, for other names, by whether the first non-blank line starts with ``{``. Text lines keep their inner and leading whitespace; only the line ending is removed.
    """
    _check_on_error(on_error)
    path = Path(path)
    if not _has_records(path):
        return _read_text_lines(path, on_error)

    def parse(line: _Line) -> str:
        return line.text(field)

    return _read_records(path, parse, (field,), on_error)


def _has_records(path: Path) -> bool:
    if is_parquet(path) or is_hf_dataset(path) or is_csv(path):
        return True
    suffixes = [s.lower() for s in path.suffixes if s.lower() != ".gz"]
    if suffixes and suffixes[-1] == ".txt":
        return False
    if suffixes and suffixes[-1] in (".jsonl", ".json", ".ndjson"):
        return True
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
    if not sentences:
        detail = ", ".join(f"{reason}: {count}" for reason, count in sorted(skipped.items()))
        raise DataError(path, f"no valid records (skipped {detail})", reason="empty_file")
    return Records(sentences, path=path, skipped=skipped, ignored=ignored)
