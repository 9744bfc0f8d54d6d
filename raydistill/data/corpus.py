"""Training corpora: the bundled ``mixed`` corpus, the named sources, and a user's own file, minus evaluation text.

A training corpus is named by ``data.corpus``:

    mixed                 every unlabeled English sentence the package ships that no reported score is computed on:
                          Flickr30k captions, SNLI/MultiNLI dev premises and hypotheses, and the train splits of
                          MRPC, SICK, STS-B, SST-2 and TREC (``MIXED_SOURCES``), normalised and de-duplicated
    flickr, nli,          the older named sources, read as they are so that results trained on them stay reproducible:
    flickr+nli            UNFILTERED (no normalisation, no evaluation filter; they hold sentences of the STS, SICK
                          and MRPC evaluation sets, so scores of models trained on them are not held out)
    file:<path>[#column]  a user's corpus: a text file (one sentence per line), JSON Lines, CSV/TSV, Parquet (a file
                          or a directory of parts) or a Hugging Face ``datasets`` directory (``save_to_disk``);
                          ``#column`` picks the text column (default ``text``). A JSON Lines / Parquet / CSV / dataset
                          with ``sentence1``/``sentence2`` (or ``premise``/``hypothesis``) columns and no ``#column``
                          is a pairs corpus, whose second text is the ``pair`` view.

Evaluation text never reaches training through ``mixed`` or a ``file:`` corpus: a sentence of any set the project
reports a score on or selects with (``EVALUATION_DATASETS``), compared by ``evaluation_key`` (Unicode NFKC, case
folded, punctuation, symbols and whitespace removed; ``raydistill.data.evaluation_text``), is removed (a pair goes
when either of its texts is one), and counted as ``evaluation_sentences_removed``. One exception, by name:
``data.evaluation_set_split`` keeps the sentences of one set in a ``file:`` corpus that is a training split of it,
for a run tested on the set's other split with no sentence shared (``bench/domain.py`` on QQP dev). A corpus with nothing left, or
nothing in it, is a ``DataError`` naming the file (or the corpus) raised while the job config is validated, before
any teacher pass. The labelled pairs the supervised stages train on (``training_pairs``: SNLI/MultiNLI dev for
DistilCSE's triplets and DvBERT's teachers, STS-B train for DvBERT's second stage) go through the same filter.

    corpus = read_corpus("mixed")          # Corpus: texts, sources, caption_groups, groups (partner texts), stats
    mixed_corpus_counts()                  # {"flickr30k_captions": 152987, "nli_dev": 36041, ...}
    pairs, removed = training_pairs(NLI_TRAINING_SETS)   # labelled NLI pairs without evaluation text
    python -m raydistill.data.corpus       # the per-source table (--update docs/data.md rewrites it there)
"""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Sequence
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from raydistill.data.evaluation_text import (
    EVALUATION_DATASETS, dataset_versions, drop_evaluation_pairs, evaluation_key, evaluation_keys,
)
from raydistill.data.formats import DataError, is_hf_dataset, iter_records, last_suffix
from raydistill.data.readers import PAIR_TEXT_FIELDS, Pair, read_pairs, read_sentences
from raydistill.data.registry import DATASETS, load_dataset

__all__ = [
    "Corpus", "CorpusSpec", "EVALUATION_DATASETS", "MIXED_SOURCES", "NAMED_CORPORA", "NLI_TRAINING_SETS",
    "MixedSource", "corpus_spec_problem", "evaluation_key", "evaluation_keys", "mixed_corpus_counts",
    "mixed_corpus_table", "normalize_text", "parse_corpus_spec", "read_corpus", "training_pairs",
]

FILE_PREFIX = "file:"
NAMED_CORPORA = ("mixed", "flickr", "nli", "flickr+nli")
DEFAULT_TEXT_COLUMN = "text"

# The only labelled NLI pairs offline (SNLI/MultiNLI train are not shipped): DistilCSE's triplets, DvBERT's teachers.
NLI_TRAINING_SETS = ("snli_dev", "mnli_dev")


@dataclass(frozen=True)
class MixedSource:
    """One source of the ``mixed`` corpus: registry data sets whose texts it contributes, in this order."""

    name: str
    datasets: tuple[str, ...]
    description: str


MIXED_SOURCES = (
    MixedSource("flickr30k_captions", ("flickr_captions",), "Flickr30k captions (Multi30k release), five per image"),
    MixedSource("nli_dev", ("snli_dev", "mnli_dev"), "SNLI dev and MultiNLI dev (matched + mismatched): premises "
                                                      "and hypotheses"),
    MixedSource("mrpc_train", ("mrpc_train",), "MSR Paraphrase Corpus train: both sentences of each pair"),
    MixedSource("sick_train", ("sick_train",), "SICK 2014 train: both sentences of each pair"),
    MixedSource("stsb_train", ("stsb_train",), "STS Benchmark train: both sentences of each pair"),
    MixedSource("sst2_train", ("sst2_train",), "SST-2 train (SentEval): sentences and phrases"),
    MixedSource("trec_train", ("trec_train",), "TREC question classification train: questions"),
)


def normalize_text(text: str) -> str:
    """Unicode NFC with every run of whitespace collapsed to one space and none at either end."""
    return " ".join(unicodedata.normalize("NFC", text).split())


def training_pairs(names: Sequence[str]) -> tuple[tuple[Pair, ...], int]:
    """``(pairs, removed)``: the pairs of the registry sets ``names`` in file order, less every pair either of whose
    texts is an evaluation sentence, and how many went. Cached per file version."""
    return _training_pairs(dataset_versions(tuple(names) + EVALUATION_DATASETS), tuple(names))


@functools.lru_cache(maxsize=4)
def _training_pairs(versions: tuple, names: tuple[str, ...]) -> tuple[tuple[Pair, ...], int]:
    kept, removed = drop_evaluation_pairs(pair for name in names for pair in load_dataset(name))
    return tuple(kept), removed


def _dataset_texts(name: str) -> Iterator[tuple[str, int, tuple[str, ...]]]:
    """``(text, caption group, sibling captions)`` of every text of a registry set, in file order.

    The caption group is the image's 0-based line in the captions file (-1 for other sets); siblings are the raw
    captions of that image (empty for other sets)."""
    kind = DATASETS[name].kind
    for index, record in enumerate(load_dataset(name)):
        if kind == "captions":
            for caption in record.captions:
                yield caption, index, record.captions
        elif kind == "labelled_texts":
            yield record.text, -1, ()
        else:
            yield record.sentence1, -1, ()
            yield record.sentence2, -1, ()


# ---------------------------------------------------------------------------------------------------------------
# The corpus


@dataclass(frozen=True)
class Corpus:
    """The rows of a training corpus, row i being ``texts[i]``.

    The first four fields are what ``raydistill.runtime.teachers.pipeline`` reads from any corpus:
        texts           the sentence of each row
        groups          texts that describe the same thing as texts[i], itself included: the captions of its image
                        (evaluation sentences left out), or its pair; ``(texts[i],)`` when it has none
        is_pairs        rows are pairs (``groups[i] == (first, second)``)
        caption_groups  per row, its caption group (the image's line in the captions file) or -1; rows of one group
                        are captions of one image
        stats           what reading dropped: evaluation_sentences_removed, duplicates_dropped, blank_lines
    ``sources`` names each row's source (a ``MIXED_SOURCES`` name, or the file's path); ``group_names[g]`` is the
    image id of caption group g."""

    name: str
    texts: list[str]
    groups: list[tuple[str, ...]]
    is_pairs: bool = False
    caption_groups: list[int] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    group_names: dict[int, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.texts)

    def source_counts(self) -> dict[str, int]:
        """Rows per source, in the order sources first appear."""
        return dict(Counter(self.sources))


@functools.lru_cache(maxsize=2)
def _read_mixed_cached(versions: tuple) -> Corpus:
    """``mixed`` (module docstring); ``versions`` (of its data sets and the evaluation sets) keys the cache."""
    excluded = evaluation_keys()
    texts, groups, caption_groups, sources = [], [], [], []
    group_names: dict[int, str] = {}
    seen: set[str] = set()
    stats = Counter(sentences_read=0, evaluation_sentences_removed=0, duplicates_dropped=0)
    for source in MIXED_SOURCES:
        for dataset in source.datasets:
            siblings_of: dict[tuple[str, ...], tuple[str, ...]] = {}  # raw captions -> usable siblings
            for raw, group, raw_siblings in _dataset_texts(dataset):
                stats["sentences_read"] += 1
                text = normalize_text(raw)
                if evaluation_key(text) in excluded:
                    stats["evaluation_sentences_removed"] += 1
                    continue
                # Duplicates are exact after normalisation: "A dog." and "a dog." are two inputs to a cased model.
                if text in seen:
                    stats["duplicates_dropped"] += 1
                    continue
                seen.add(text)
                if group >= 0:
                    if raw_siblings not in siblings_of:
                        usable = (normalize_text(s) for s in raw_siblings)
                        siblings_of = {raw_siblings: tuple(dict.fromkeys(
                            s for s in usable if evaluation_key(s) not in excluded))}
                    groups.append(siblings_of[raw_siblings])
                    group_names.setdefault(group, load_dataset(dataset)[group].image)
                else:
                    groups.append((text,))
                texts.append(text)
                caption_groups.append(group)
                sources.append(source.name)
    if not texts:
        raise DataError("mixed", "no sentences left once the evaluation sentences are removed "
                                 f"({stats['evaluation_sentences_removed']} of {stats['sentences_read']})",
                        reason="empty_file")
    return Corpus("mixed", texts, groups, False, caption_groups, dict(stats), sources, group_names)


def mixed_corpus_counts() -> dict[str, int]:
    """Sentences per ``MIXED_SOURCES`` source in ``mixed`` (a sentence is counted under the first source that has
    it), in source order; ``"total"`` last."""
    counts = read_corpus("mixed").source_counts()
    ordered = {source.name: counts.get(source.name, 0) for source in MIXED_SOURCES}
    return {**ordered, "total": sum(ordered.values())}


def mixed_corpus_table() -> str:
    """The Markdown table of ``mixed``'s sources and counts (docs/data.md is generated from it)."""
    corpus = read_corpus("mixed")
    counts = mixed_corpus_counts()
    lines = ["| source | sets | sentences | what it is |", "|---|---|---:|---|"]
    for source in MIXED_SOURCES:
        sets = ", ".join(f"`{name}`" for name in source.datasets)
        lines.append(f"| `{source.name}` | {sets} | {counts[source.name]:,} | {source.description} |")
    lines.append(f"| **total** | | **{counts['total']:,}** | |")
    stats = corpus.stats
    lines += ["", f"Read {stats['sentences_read']:,} sentences; removed {stats['evaluation_sentences_removed']:,} that "
                 f"are sentences of an evaluation set and {stats['duplicates_dropped']:,} duplicates; "
                 f"{len(corpus.group_names):,} caption groups (images)."]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# Specs and files


@dataclass(frozen=True)
class CorpusSpec:
    """A parsed ``data.corpus``: a named corpus (``name``) or a file (``path`` and optional ``column``)."""

    text: str
    name: str | None = None
    path: Path | None = None
    column: str | None = None


def parse_corpus_spec(spec: str) -> CorpusSpec:
    """Split ``data.corpus`` into its parts; raises ValueError for an unknown name or a file spec without a path.

    ``file:<path>#<column>``: the part after the last ``#`` is the column, unless the whole text names an existing
    file or directory (a path may contain ``#``)."""
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"data.corpus must be a corpus name ({', '.join(NAMED_CORPORA)}) or file:<path>")
    if not spec.startswith(FILE_PREFIX):
        if spec not in NAMED_CORPORA:
            import difflib

            close = difflib.get_close_matches(spec, NAMED_CORPORA, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"unknown corpus {spec!r}{hint} Known: {', '.join(NAMED_CORPORA)}, or "
                             "file:<path>[#column] for your own")
        return CorpusSpec(spec, name=spec)
    rest = spec[len(FILE_PREFIX):]
    column = None
    if "#" in rest and not Path(rest).expanduser().exists():
        rest, column = rest.rsplit("#", 1)
        if not column:
            raise ValueError(f"corpus {spec!r}: empty column name after '#'")
    if not rest:
        raise ValueError(f"corpus {spec!r}: no path after 'file:'")
    return CorpusSpec(spec, path=Path(rest).expanduser(), column=column)


def corpus_spec_problem(spec: str) -> str | None:
    """Why ``data.corpus`` cannot be read, found without reading it (for config validation), or None."""
    try:
        parsed = parse_corpus_spec(spec)
    except ValueError as err:
        return str(err)
    if parsed.path is None:
        return None
    path = parsed.path
    if not path.exists():
        return f"training file not found: {path}"
    if path.is_dir():
        from raydistill.data.formats import is_parquet

        if not (is_hf_dataset(path) or is_parquet(path)):
            return (f"training data directory {path} is neither a Hugging Face dataset (save_to_disk: state.json) "
                    "nor a directory of *.parquet parts")
    elif parsed.column is not None and _is_text_file(path):
        return f"{path} is a text file (one sentence per line): it has no column {parsed.column!r}"
    return None


def read_corpus(spec: str, split_of: str | None = None) -> Corpus:
    """The rows of ``data.corpus`` (module docstring); validated, cached per spec and file version.

    ``split_of`` (``data.evaluation_set_split``, a ``file:`` corpus only) names the evaluation set this corpus is a
    training split of: that set's sentences stay, every other set's go (``evaluation_keys``).
    Raises ``DataError`` (naming file, line and field) for a bad line, an empty corpus or one with nothing left
    once the evaluation sentences are removed; ValueError for an unknown name, or ``split_of`` with a named corpus."""
    parsed = parse_corpus_spec(spec)
    if split_of is not None and parsed.name is not None:
        raise ValueError(f"data.evaluation_set_split={split_of} is for a file: corpus split from that set, not the "
                         f"bundled {parsed.name!r}")
    if parsed.name is not None:
        if parsed.name == "mixed":
            datasets = tuple(name for source in MIXED_SOURCES for name in source.datasets)
            return _read_mixed_cached(dataset_versions(datasets + EVALUATION_DATASETS))
        return _read_named(parsed.name)
    path = parsed.path.resolve()
    if not path.exists():
        raise DataError(path, "file not found", reason="missing_file")
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    version = tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    return _read_file_cached(str(path), parsed.column, version, dataset_versions(EVALUATION_DATASETS), split_of)


def _read_named(name: str) -> Corpus:
    """``flickr``, ``nli`` or ``flickr+nli`` as they always were: raw texts, unfiltered (evaluation sentences
    included), so that results trained on them stay reproducible."""
    texts, groups, caption_groups, sources = [], [], [], []
    for part in name.split("+"):
        datasets = ("flickr_captions",) if part == "flickr" else ("snli_dev", "mnli_dev")
        for dataset in datasets:
            for text, group, siblings in _dataset_texts(dataset):
                texts.append(text)
                groups.append(siblings if group >= 0 else (text,))
                caption_groups.append(group)
                sources.append(dataset)
    return Corpus(name, texts, groups, False, caption_groups, {}, sources)


def _is_text_file(path: Path) -> bool:
    return last_suffix(path) == ".txt"


def _pair_fields(path: Path) -> tuple[str, str] | None:
    """The two text columns when the file is a pairs corpus, else None (text files never are)."""
    if _is_text_file(path):
        return None
    for _, obj in iter_records(path):
        if isinstance(obj, dict):
            for first, second in PAIR_TEXT_FIELDS:
                if first in obj and second in obj:
                    return first, second
        return None
    return None


@functools.lru_cache(maxsize=4)
def _read_file_cached(path_text: str, column: str | None, version: tuple, evaluation_versions: tuple,
                      split_of: str | None) -> Corpus:
    path = Path(path_text)
    excluded = evaluation_keys(split_of)  # the version in the cache key makes a changed evaluation file a new entry
    pair_fields = None if column is not None else (_pair_fields(path) if path.is_file() or path.is_dir() else None)
    if pair_fields is not None:
        pairs = read_pairs(path, text_fields=pair_fields)
        unique = list(dict.fromkeys((p.sentence1, p.sentence2) for p in pairs))
        kept = [pair for pair in unique
                if evaluation_key(pair[0]) not in excluded and evaluation_key(pair[1]) not in excluded]
        stats = {"blank_lines": pairs.ignored["blank_lines"], "duplicates_dropped": len(pairs) - len(unique),
                 "evaluation_sentences_removed": len(unique) - len(kept)}
        _check_not_emptied(path, len(unique), kept, "pairs", split_of)
        return Corpus(str(path), [first for first, _ in kept], kept, True, [-1] * len(kept), stats,
                      [str(path)] * len(kept))
    sentences = read_sentences(path, field=column or DEFAULT_TEXT_COLUMN)
    kept = [s for s in sentences if evaluation_key(s) not in excluded]
    _check_not_emptied(path, len(sentences), kept, "sentences", split_of)
    stats = {"blank_lines": sentences.ignored["blank_lines"],
             "evaluation_sentences_removed": len(sentences) - len(kept)}
    return Corpus(str(path), kept, [(s,) for s in kept], False, [-1] * len(kept), stats, [str(path)] * len(kept))


def _check_not_emptied(path: Path, read: int, kept: list, what: str, split_of: str | None) -> None:
    if not kept:
        sets = [name for name in EVALUATION_DATASETS if name != split_of]
        raise DataError(path, f"all {read} {what} are sentences of the evaluation sets ({', '.join(sets)}); nothing "
                              "is left to train on", reason="empty_file")


TABLE_START, TABLE_END = "<!-- mixed-corpus-table -->", "<!-- /mixed-corpus-table -->"


def update_doc(path: str | Path) -> None:
    """Replace the table between the ``<!-- mixed-corpus-table -->`` markers of ``path`` with a fresh one."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    start, end = text.index(TABLE_START) + len(TABLE_START), text.index(TABLE_END)
    path.write_text(f"{text[:start]}\n{mixed_corpus_table()}\n{text[end:]}", encoding="utf-8")


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["--update"]:  # python -m raydistill.data.corpus --update docs/data.md
        update_doc(sys.argv[2])
    else:
        print(mixed_corpus_table())
