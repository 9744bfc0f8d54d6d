"""The named data sets of the project: where each file lives, what its lines hold, and a cached loader.

Files resolve through `data_path`: ``$RAYDISTILL_DATA/<relpath>`` when that variable is set and the file exists
there (a user's fresher or larger copy, e.g. ``RAYDISTILL_DATA=/srv/raydistill-data``), else the gzip'd copy bundled in
the package (``raydistill/data/bundled/<relpath>.gz``), so every command works offline on a fresh install.

`load_dataset` validates the whole file and caches the records in-process: the 7-STS evaluation, STS-B dev
selection during training and the tests all read the same few files many times."""

from __future__ import annotations

import difflib
import functools
import os
from dataclasses import dataclass
from pathlib import Path

from raydistill.data.formats import DataError
from raydistill.data.readers import read_captions, read_labelled_texts, read_pairs

__all__ = ["BUNDLED_DIR", "DATA_ENV", "DatasetSpec", "DATASETS", "data_path", "dataset_path", "load_dataset"]

DATA_ENV = "RAYDISTILL_DATA"
BUNDLED_DIR = Path(__file__).resolve().parent / "bundled"

NLI_LABELS = frozenset({"entailment", "neutral", "contradiction"})
BINARY_LABELS = frozenset({0, 1})
TREC_LABELS = frozenset({"ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM"})
STS_SCALE = (0.0, 5.0)
SICK_SCALE = (1.0, 5.0)


@dataclass(frozen=True)
class DatasetSpec:
    """One named file and the validation its lines get.

    kind: ``"scored_pairs"`` (Pair with score, maybe label), ``"labelled_pairs"`` (Pair with label),
    ``"labelled_texts"`` (LabelledText), ``"captions"`` (CaptionGroup)."""

    name: str
    relpath: str
    kind: str
    fields: tuple[str, ...]
    score_range: tuple[float, float] | None = None
    label_set: frozenset | None = None
    description: str = ""


def _specs_of(kind: str, fields: tuple[str, ...], score_range: tuple[float, float] | None, label_set: frozenset | None):
    """``spec(name, relpath, description)``: a data set of ``kind`` whose lines hold ``fields``."""
    return lambda name, relpath, description: DatasetSpec(name, relpath, kind, fields, score_range, label_set,
                                                          description)


_sts = _specs_of("scored_pairs", ("sentence1", "sentence2", "score"), STS_SCALE, None)
_sick = _specs_of("scored_pairs", ("sentence1", "sentence2", "score", "label"), SICK_SCALE, NLI_LABELS)
_para = _specs_of("labelled_pairs", ("sentence1", "sentence2", "label"), None, BINARY_LABELS)
_nli = _specs_of("labelled_pairs", ("premise", "hypothesis", "label"), None, NLI_LABELS)
_binary_texts = _specs_of("labelled_texts", ("text", "label"), None, BINARY_LABELS)
_trec = _specs_of("labelled_texts", ("text", "label"), None, TREC_LABELS)


DATASETS: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in (
        _sts("sts12", "sts/sts12.jsonl", "SemEval STS 2012 test, all five subsets"),
        _sts("sts13", "sts/sts13.jsonl", "STS 2013 test without the licensed SMT subset"),
        _sts("sts14", "sts/sts14.jsonl", "STS 2014 test, six subsets"),
        _sts("sts15", "sts/sts15.jsonl", "STS 2015 test, five subsets"),
        _sts("sts16", "sts/sts16.jsonl", "STS 2016 test, five subsets"),
        _sts("stsb_train", "sts/stsb-train.jsonl", "STS Benchmark train"),
        _sts("stsb_dev", "sts/stsb-dev.jsonl", "STS Benchmark dev: the model-selection set"),
        _sts("stsb_test", "sts/stsb-test.jsonl", "STS Benchmark test"),
        _sick("sick_train", "sick/sick-train.jsonl", "SICK 2014 train: relatedness 1-5 and NLI label"),
        _sick("sick_trial", "sick/sick-trial.jsonl", "SICK 2014 trial (dev)"),
        _sick("sick_test", "sick/sick-test.jsonl", "SICK 2014 test (SICK-R / SICK-E)"),
        _para("mrpc_train", "para/mrpc-train.jsonl", "MSR Paraphrase Corpus train, label 0/1"),
        _para("mrpc_val", "para/mrpc-val.jsonl", "MSR Paraphrase Corpus validation, label 0/1"),
        _para("qqp_dev", "para/qqp-dev.jsonl", "Quora Question Pairs dev (BiMPM split), label 0/1"),
        _nli("snli_dev", "nli/snli-dev.jsonl", "SNLI dev, gold-label pairs"),
        _nli("mnli_dev", "nli/mnli-dev.jsonl", "MultiNLI dev, matched + mismatched"),
        DatasetSpec("flickr_captions", "corpus/flickr30k-captions.jsonl.gz", "captions", ("image", "captions"),
                    description="Flickr30k captions (Multi30k), five per image"),
        _binary_texts("mr", "transfer/mr.jsonl", "SentEval MR: movie review polarity"),
        _binary_texts("cr", "transfer/cr.jsonl", "SentEval CR: product review polarity"),
        _binary_texts("subj", "transfer/subj.jsonl", "SentEval SUBJ: subjectivity"),
        _binary_texts("mpqa", "transfer/mpqa.jsonl", "SentEval MPQA: opinion polarity"),
        _binary_texts("sst2_train", "transfer/sst2-train.jsonl", "SentEval SST-2 train"),
        _binary_texts("sst2_dev", "transfer/sst2-dev.jsonl", "SentEval SST-2 dev"),
        _binary_texts("sst2_test", "transfer/sst2-test.jsonl", "SentEval SST-2 test"),
        _trec("trec_train", "transfer/trec-train.jsonl", "SentEval TREC question type train"),
        _trec("trec_test", "transfer/trec-test.jsonl", "SentEval TREC question type test"),
    )
}


def data_path(relpath: str) -> Path:
    """Resolve a data file: ``$RAYDISTILL_DATA/<relpath>`` when set and present, else the bundled gzip copy.

    ``"sts/sts12.jsonl"`` also matches ``sts12.jsonl.gz`` in either place, so a user may keep plain or gzip'd
    copies; the readers open both the same way."""
    names = [relpath] if relpath.endswith(".gz") else [relpath, relpath + ".gz"]
    override = os.environ.get(DATA_ENV)
    roots = ([Path(override).expanduser()] if override else []) + [BUNDLED_DIR]
    for root in roots:
        for name in names:
            candidate = root / name
            if candidate.is_file():
                return candidate
    looked = ", ".join(str(root / relpath) + ("[.gz]" if len(names) == 2 else "") for root in roots)
    raise DataError(relpath, f"file not found (looked in {looked})", reason="missing_file")


def _spec(name: str) -> DatasetSpec:
    if name not in DATASETS:
        close = difflib.get_close_matches(name, DATASETS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise KeyError(f"unknown data set {name!r}{hint} Known: {', '.join(DATASETS)}")
    return DATASETS[name]


def dataset_path(name: str) -> Path:
    """Where the named data set is read from now (depends on ``$RAYDISTILL_DATA``)."""
    return data_path(_spec(name).relpath)


def load_dataset(name: str) -> tuple:
    """All records of a named data set, validated, as an immutable tuple (shared by every caller).

    Cached per (resolved path, size, modification time), so changing ``$RAYDISTILL_DATA`` or the file itself
    is noticed; everything else reads the file once per process."""
    spec = _spec(name)
    path = data_path(spec.relpath)
    stat = path.stat()
    return _load_cached(name, str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _load_cached(name: str, path: str, size: int, mtime_ns: int) -> tuple:
    spec = DATASETS[name]
    if spec.kind in ("scored_pairs", "labelled_pairs"):
        records = read_pairs(path, score_range=spec.score_range, label_set=spec.label_set, text_fields=spec.fields[:2])
    elif spec.kind == "labelled_texts":
        records = read_labelled_texts(path, label_set=spec.label_set)
    elif spec.kind == "captions":
        records = read_captions(path)
    else:  # pragma: no cover - guarded by the registry's own definitions
        raise ValueError(f"data set {name!r} has unknown kind {spec.kind!r}")
    return tuple(records)
