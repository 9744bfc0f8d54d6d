"""The file formats a data file may come in, read row by row: JSON Lines (plain or gzip'd), Parquet files and
directories of Parquet parts, ``.csv`` / ``.tsv`` with a header line, Hugging Face ``datasets`` directories.

``iter_records(path)`` yields ``(line, object | DataError)``: the 1-based line of a text file, or the 1-based row
of the Parquet part or dataset it names. Problems with the file as a whole (missing, empty, corrupt gzip or Parquet,
Parquet parts whose column types disagree) raise `DataError`; a bad line is yielded as one, for the typed readers
(``readers.py``) to raise or skip. Gzip and Parquet are detected from the file's magic bytes, not its name."""

from __future__ import annotations

import gzip
import io
import json
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["DataError", "iter_lines", "iter_jsonl", "iter_parquet", "iter_csv", "iter_hf_dataset", "iter_records",
           "iter_sourced_records", "is_parquet", "is_csv", "is_hf_dataset", "json_type_name"]

GZIP_MAGIC = b"\x1f\x8b"
PARQUET_MAGIC = b"PAR1"
_HF_DATASET_MARKERS = ("state.json", "dataset_dict.json")


class DataError(ValueError):
    """A bad data file or line. ``str()`` is ``"<file>:<line>: field '<field>': <problem>"``.

    The line and field parts are left out when they do not apply (a missing file has neither, a line that is not
    JSON has no field). ``reason`` is a short machine-readable key (``"not_json"``, ``"out_of_range"``, ...) used
    to count skipped rows in ``on_error="skip"`` mode."""

    def __init__(self, path: str | Path, problem: str, *, line: int | None = None, field: str | None = None,
                 reason: str = "invalid"):
        self.path, self.line, self.field, self.problem, self.reason = str(path), line, field, problem, reason
        location = self.path if line is None else f"{self.path}:{line}"
        where = f"{location}: field '{field}'" if field is not None else location
        super().__init__(f"{where}: {problem}")

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

    Decoding line by line (rather than opening in text mode) lets a bad byte be reported with its line: such a line
    is yielded as ``(line_number, DataError)``. A UTF-8 byte-order mark on the first line is dropped; blank lines
    are counted in ``counts["blank_lines"]`` when a Counter is given."""
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
        return bad(f"expected a JSON object, got {json_type_name(obj)}", "not_object")
    return obj


def iter_jsonl(path: str | Path, counts: Counter | None = None
               ) -> Iterator[tuple[int, dict[str, Any] | DataError]]:
    """Yield ``(line_number, object)`` per JSON Lines record, or ``(line_number, DataError)`` for a bad line."""
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
    begins with "PAR1" is still text)."""
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
    e.g. parts written by different tools) raises at the first part that differs, naming the column."""
    for _, row_number, row in _iter_parquet_parts(Path(path)):
        yield row_number, row


def _iter_parquet_parts(path: Path) -> Iterator[tuple[Path, int, dict[str, Any]]]:
    """`iter_parquet` with the part each row comes from: ``(part, row_number, row)``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

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


def last_suffix(path: str | Path) -> str:
    """The name's last suffix other than ``.gz``, lower case ("" when none): ``a.TSV.gz`` -> ``.tsv``."""
    suffixes = [s.lower() for s in Path(path).suffixes if s.lower() != ".gz"]
    return suffixes[-1] if suffixes else ""


def is_csv(path: str | Path) -> bool:
    """A ``.csv`` or ``.tsv`` file (optionally gzip'd), by name: CSV has no magic bytes to go by."""
    return last_suffix(path) in (".csv", ".tsv") and Path(path).is_file()


def is_hf_dataset(path: str | Path) -> bool:
    """A directory written by Hugging Face ``datasets``' ``save_to_disk`` (a Dataset or a DatasetDict)."""
    path = Path(path)
    return path.is_dir() and any((path / name).is_file() for name in _HF_DATASET_MARKERS)


def iter_csv(path: str | Path) -> Iterator[tuple[int, dict[str, Any] | DataError]]:
    """Yield ``(line_number, row dict)`` of a CSV (``.csv``) or tab-separated (``.tsv``) file with a header line.

    The line number is the file line where the record ends (a quoted field may span lines), so an editor jumps to
    it; the header is line 1. A row with more fields than the header is yielded as a ``DataError``; a row with
    fewer has ``None`` in the missing columns (reported by the field check that reads them). Empty cells read as
    ``""``."""
    import csv

    path = Path(path)
    delimiter = "\t" if last_suffix(path) == ".tsv" else ","
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

    A DatasetDict (several splits) must be narrowed to one split by naming its directory (``<dir>/train``)."""
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


def iter_sourced_records(path: Path, counts: Counter) -> Iterator[tuple[Path, int, dict[str, Any] | DataError]]:
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


def json_type_name(value: Any) -> str:
    if value is None:
        return "null"
    for types, name in ((bool, "a boolean"), ((int, float), "a number"), (str, "a string"),
                        ((list, tuple), "an array"), (dict, "an object"), ((bytes, bytearray), "bytes")):
        if isinstance(value, types):
            return name
    return type(value).__name__
