"""A user's own scored sentence pairs (``raydistill distill --eval-pairs`` / ``--dev-pairs``, ``train.dev_pairs``):
``read_eval_pairs(path) -> list[Pair]``, every line checked.

Formats: ``.tsv`` (three columns in the order sentence1, sentence2, score, or a header line naming them; more
columns with a header), ``.csv`` with a header line, JSON Lines (``{"sentence1", "sentence2", "score"}``),
Parquet; gzip'd alike. A bad line raises ``DataError`` naming the file, the line and the field. Here, below the
runtime, because the training loop reads dev pairs as the packaging step reads evaluation pairs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from raydistill.data.formats import DataError, is_csv, iter_lines, iter_records, last_suffix
from raydistill.data.readers import Pair, _Line

__all__ = ["PAIR_COLUMNS", "read_eval_pairs"]

PAIR_COLUMNS = ("sentence1", "sentence2", "score")


def _score_value(value: Any) -> Any:
    """A text cell's number (CSV / TSV cells are strings); anything else as it is, for the field check to reject."""
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return value
    return value


def _tsv_rows(path: Path):
    """``(line, {sentence1, sentence2, score})`` of a tab-separated file, header line optional.

    Plain tab splitting, no quoting: STS files hold quotes that a CSV reader would take as field delimiters."""
    columns = None
    for line_number, text in iter_lines(path):
        if isinstance(text, DataError):
            yield line_number, text
            continue
        cells = text.split("\t")
        if columns is None:
            names = [cell.strip().lower() for cell in cells]
            if {"sentence1", "sentence2"} <= set(names):
                columns = names
                continue
            columns = list(PAIR_COLUMNS)
        if len(cells) > len(columns):
            yield line_number, DataError(path, f"has {len(cells)} tab-separated fields, expected {len(columns)} "
                                               f"({', '.join(columns)})", line=line_number, reason="not_object")
            continue
        yield line_number, dict(zip(columns, cells))


def read_eval_pairs(path: str | os.PathLike) -> list[Pair]:
    """The user's labelled pairs: (sentence1, sentence2, score), every line checked; DataError names file, line, field.

    Formats: ``.tsv`` (three columns in that order, or a header line naming them; more columns with a header),
    ``.csv`` with a header line, JSON Lines (``{"sentence1", "sentence2", "score"}``), Parquet; gzip'd alike. Scores
    are any finite numbers, at least two of them distinct: all 0 or 1 are labels, scored with ROC AUC, any others
    are graded, scored with Spearman (``raydistill.evaluation.pair_metric``)."""
    path = Path(path).expanduser()
    if last_suffix(path) == ".tsv" and path.is_file():
        rows, text_cells = _tsv_rows(path), True
    else:
        rows, text_cells = iter_records(path), is_csv(path)
    pairs = []
    for line_number, obj in rows:
        if isinstance(obj, DataError):
            raise obj
        if text_cells and "score" in obj:
            obj = {**obj, "score": _score_value(obj["score"])}
        line = _Line(path, line_number, obj, PAIR_COLUMNS)
        pairs.append(Pair(line.text("sentence1"), line.text("sentence2"), line.numeric("score", None), None))
    if len(pairs) < 2 or len({pair.score for pair in pairs}) < 2:
        raise DataError(path, f"{len(pairs)} pair(s) with {len({p.score for p in pairs})} distinct score(s): a "
                        "Spearman correlation needs at least two pairs of different scores", field="score",
                        reason="too_few")
    return pairs
