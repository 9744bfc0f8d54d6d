"""Validated readers for JSON Lines / text data and the registry of the project's bundled benchmark sets.

    from raydistill.data import load_dataset, read_pairs, data_path
    pairs = load_dataset("stsb_dev")                      # tuple[Pair], validated, cached in-process
    pairs = read_pairs("my.jsonl.gz", score_range=(0, 5))  # a user's file; DataError names file, line, field

Bad input raises `DataError` (a ValueError) whose message is ``"<file>:<line>: field '<field>': <problem>"``.
JSON Lines (plain or gzip'd), Parquet files and directories of Parquet parts are read and validated alike."""

from raydistill.data.formats import DataError
from raydistill.data.readers import (
    CaptionGroup, LabelledText, Pair, Records, read_captions, read_labelled_texts, read_pairs, read_sentences,
)
from raydistill.data.registry import BUNDLED_DIR, DATA_ENV, DATASETS, data_path, dataset_path, load_dataset

__all__ = [
    "BUNDLED_DIR", "CaptionGroup", "DATA_ENV", "DATASETS", "DataError", "LabelledText", "Pair", "Records",
    "data_path", "dataset_path", "load_dataset", "read_captions", "read_labelled_texts", "read_pairs",
    "read_sentences",
]
