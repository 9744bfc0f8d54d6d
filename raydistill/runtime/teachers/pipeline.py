"""Training data: sentences -> views -> cached teacher embeddings -> a memory-mapped rows file -> a Ray Dataset
streamed as numpy batches.

    rows = load_training_texts(cfg.data, seed)      # [{"idx": 0, "text_con": ..., "text_gen": ...}, ...]
    data = build_training_data(cfg)                 # every teacher view's vectors cached; the rows in a rows file
    stream = data.epoch_stream(0, epochs, rows_per_epoch)          # what Ray Train workers read (Ray Data)
    for batch in data.iter_batches(epoch, batch_size, skip_batches=k):   # resume lands on batch k exactly
        batch["text_con"], batch["teacher_con"]     # object array [B], float32 [B, D]

Sources: ``cfg.data.corpus`` (``raydistill.data.corpus``: ``mixed``, ``flickr``, ``nli``, ``flickr+nli`` or a
``file:`` corpus of sentences or pairs). Sentence corpora are de-duplicated; ``max_sentences`` keeps a seeded random
subset. A malformed line of a corpus file is a ``DataError`` naming file, line and field, raised by
``runtime.preflight`` before Ray or any model starts (docs/reliability.md). What is dropped or kept as is without
being an error is counted in ``load_training_texts(..., stats=)``, logged, and reaches MLflow as ``input.*``:

    blank_lines                 blank lines of the corpus file (ignored)
    duplicates_dropped          repeated sentences (sentence corpora) or repeated (sentence1, sentence2) pairs
    subsampled_out              rows left out by ``max_sentences``
    long_texts                  training texts over LONG_TEXT_CHARS characters (kept; the tokenizers truncate them
                                to max_length tokens, so only their beginning is learned)
    texts_with_control_chars    texts with C0/C1 control characters (kept; BERT-style tokenizers drop them)

Views (``cfg.data.views``: view name -> spec): ``none`` (the sentence itself), ``caption`` (another caption of the
same image) and ``pair`` (the second text of a pairs file) need the corpus structure and are handled here; every other
spec (``delete:0.1``, ...) is a text augmentation of ``raydistill.augment.make_views``, seeded per (job seed, view
name). The rows file is ``rows_file.py``'s (``write_rows_file`` and ``RowsFileError`` are re-exported here).

Order: each epoch is a permutation drawn from ``(seed, epoch)``, independent of how Ray schedules blocks, so
``skip_batches`` resumes a run at exactly the batch it would have seen next (``data.arrays.ArrayData`` too).
"""

from __future__ import annotations

import functools
import logging
import math
import re
import zlib
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from raydistill.config.job import DataConfig, JobConfig
from raydistill.runtime.teachers.rows_file import RowsFileError, _mapped_rows, _take_rows, write_rows_file

__all__ = ["TrainingData", "load_training_texts", "build_training_data", "cache_teacher_vectors", "view_seed",
           "write_rows_file", "RowsFileError", "EVALUATION_SETS", "SOURCE_SETS", "LONG_TEXT_CHARS",
           "read_training_corpus", "has_caption_groups"]

log = logging.getLogger(__name__)

# A "sentence" this long is almost certainly a paragraph or a whole document: kept, but counted and logged.
LONG_TEXT_CHARS = 2000
_CONTROL_CHARS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # C0/C1 controls other than tab and newline

# Registry data sets every distillation job reads after training (raydistill.evaluation: 7-STS + STS-B dev), and
# the corpora of the named sources. A bad line in a $RAYDISTILL_DATA copy of one of them must fail before
# training, not in the final evaluation an hour later.
EVALUATION_SETS = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb_test", "sick_test", "stsb_dev")
SOURCE_SETS = {"flickr": ("flickr_captions",), "nli": ("snli_dev", "mnli_dev")}


@dataclass
class _Corpus:
    texts: list[str]  # the base sentence of each row
    groups: list[tuple[str, ...]]  # texts that describe the same thing as texts[i] (captions of one image, a pair)
    is_pairs: bool = False
    # Per row, the id of its caption group (the image) or -1; rows of one group are siblings: a ``caption`` view
    # shows one of them, and the queue losses mask their teacher vectors from each other's negatives.
    caption_groups: list[int] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)  # what reading the file dropped (blank lines, duplicates)


def view_seed(seed: int, view: str) -> int:
    """Seed of one view's augmentation: two views with the same spec still get different random edits."""
    return int(np.random.SeedSequence([int(seed), zlib.crc32(view.encode())]).generate_state(1)[0])


def read_training_corpus(corpus: str, split_of: str | None = None) -> _Corpus:
    from raydistill.data import load_dataset

    if corpus.startswith("file:") or corpus == "mixed":
        from raydistill.data.corpus import read_corpus

        # A Corpus has _Corpus's fields (plus per-row sources); cached per file version, so the preflight
        # reads it once up front and the pipeline reuses it. Evaluation sentences are already removed.
        return read_corpus(corpus, split_of)
    texts: list[str] = []
    groups: list[tuple[str, ...]] = []
    caption_groups: list[int] = []
    for name in corpus.split("+"):
        if name == "flickr":
            for image, group in enumerate(load_dataset("flickr_captions")):
                for caption in group.captions:
                    texts.append(caption)
                    groups.append(group.captions)
                    caption_groups.append(image)
        elif name == "nli":
            for dataset in ("snli_dev", "mnli_dev"):
                for pair in load_dataset(dataset):
                    texts.extend([pair.sentence1, pair.sentence2])
                    groups.extend([(pair.sentence1,), (pair.sentence2,)])
                    caption_groups.extend([-1, -1])
        else:
            raise ValueError(f"data.corpus: unknown source {name!r}; use flickr, nli, flickr+nli or file:<path>")
    return _Corpus(texts, groups, caption_groups=caption_groups)


def load_training_texts(data_cfg: DataConfig, seed: int, stats: dict[str, int] | None = None
                        ) -> list[dict[str, Any]]:
    """Rows ``{"idx": i, "text_<view>": str, ...}`` for every view of ``data_cfg.views``; deterministic in ``seed``.
    A ``stats`` dict receives the module docstring's input counts."""
    corpus = read_training_corpus(data_cfg.corpus, data_cfg.evaluation_set_split)
    counts = {"blank_lines": 0, "duplicates_dropped": 0, **corpus.stats}
    keep = range(len(corpus.texts))
    if not corpus.is_pairs:  # the same sentence twice is one training example (and one teacher pass)
        first_seen: dict[str, int] = {}
        for i, text in enumerate(corpus.texts):
            first_seen.setdefault(text, i)
        keep = sorted(first_seen.values())
        counts["duplicates_dropped"] += len(corpus.texts) - len(keep)
    keep = np.asarray(list(keep), dtype=np.int64)
    counts["subsampled_out"] = 0
    if data_cfg.max_sentences is not None and len(keep) > data_cfg.max_sentences:
        counts["subsampled_out"] = len(keep) - data_cfg.max_sentences
        chosen = np.random.default_rng(seed).choice(len(keep), size=data_cfg.max_sentences, replace=False)
        keep = keep[np.sort(chosen)]
    texts = [corpus.texts[i] for i in keep]
    groups = [corpus.groups[i] for i in keep]
    row_groups = _row_group_ids(corpus, keep)
    # Every distinct text a training row can show: the sentence and its caption / pair partners.
    _count_odd_texts(counts, dict.fromkeys(t for text, group in zip(texts, groups) for t in (text, *group)))
    counts["rows"] = len(texts)
    _log_input_counts(data_cfg.corpus, counts)
    if stats is not None:
        stats.update(counts)

    columns: dict[str, list[str]] = {}
    for view, spec in data_cfg.views.items():
        columns[view] = _make_view(view, spec, texts, groups, corpus, seed)
    return [{"idx": i, "group": int(row_groups[i]), **{f"text_{view}": columns[view][i] for view in columns}}
            for i in range(len(texts))]


def _row_group_ids(corpus: _Corpus, keep: np.ndarray) -> np.ndarray:
    """Group id of each kept row: its caption group (image), else an id of its own, so a queue loss can keep a row's
    own teacher vector from an earlier pass (and its siblings') out of its negatives."""
    caption = np.asarray(corpus.caption_groups if corpus.caption_groups else [-1] * len(corpus.texts),
                         dtype=np.int64)[keep]
    own = caption.max(initial=-1) + 1 + np.arange(len(keep), dtype=np.int64)
    return np.where(caption >= 0, caption, own)


def has_caption_groups(corpus: str, split_of: str | None = None) -> bool:
    """Whether ``corpus`` has rows with sibling captions (what the ``caption`` view shows)."""
    return any(group >= 0 for group in read_training_corpus(corpus, split_of).caption_groups)


def _count_odd_texts(counts: dict[str, int], texts) -> None:
    counts["long_texts"] = counts["texts_with_control_chars"] = 0
    for text in texts:
        if len(text) > LONG_TEXT_CHARS:
            counts["long_texts"] += 1
        if _CONTROL_CHARS.search(text):
            counts["texts_with_control_chars"] += 1


def _log_input_counts(corpus: str, counts: dict[str, int]) -> None:
    summary = ", ".join(f"{key} {value}" for key, value in counts.items())
    # A user's file with anything dropped or suspicious deserves a warning; the bundled corpora's duplicate
    # captions and max_sentences subsampling are expected.
    odd = counts["long_texts"] or counts["texts_with_control_chars"] or (
        corpus.startswith("file:") and (counts["duplicates_dropped"] or counts["blank_lines"]))
    log.log(logging.WARNING if odd else logging.INFO, "training corpus %s: %s (long = over %d characters, "
            "truncated by the tokenizers)", corpus, summary, LONG_TEXT_CHARS)


def _make_view(view: str, spec: str, texts: list[str], groups: list[tuple[str, ...]], corpus: _Corpus,
               seed: int) -> list[str]:
    if spec == "none":
        return list(texts)
    if spec in ("caption", "pair"):  # resolved from the corpus itself rather than by rewriting the text
        if spec == "pair" and not corpus.is_pairs:
            raise ValueError(f"data.views.{view}: 'pair' needs a pairs file (data.corpus: file:<pairs.jsonl>)")
        if spec == "caption" and not any(g >= 0 for g in corpus.caption_groups):
            raise ValueError(f"data.views.{view}: 'caption' shows another caption of the same image, and this "
                             "corpus has no caption groups: every view would be the sentence itself. Use a "
                             "corpus with captions (flickr) or another view (e.g. delete:0.1, pair)")
        rng = np.random.default_rng(view_seed(seed, view))
        out, alone = [], 0
        for text, group in zip(texts, groups):
            others = [g for g in group if g != text]
            if not others:
                alone += 1
                out.append(text)
            else:
                out.append(others[int(rng.integers(len(others)))])
        if alone:
            log.warning("view %s (%s): %d of %d sentences have no other caption/pair text; they are their own view",
                        view, spec, alone, len(texts))
        return out
    from raydistill.augment import make_views

    augmented = list(make_views(texts, spec, view_seed(seed, view)))
    if len(augmented) != len(texts):
        raise ValueError(f"data.views.{view}: augmentation {spec!r} returned {len(augmented)} texts for {len(texts)}")
    return [str(t) for t in augmented]


@dataclass
class TrainingData:
    """Training rows in a memory-mapped rows file (``idx``, ``group``, ``text_<view>``), plus a deterministic,
    resumable batch iterator whose order depends only on ``(seed, epoch)``. Batches read teacher vectors from the
    memory-mapped cache (``teacher[view]``), so no process holds the corpus or its vectors, and a copy sent to another
    process carries only locations."""

    num_rows: int
    cache_stats: dict[str, Any]
    rows_path: str  # the rows file (write_rows_file)
    seed: int = 0
    shuffle: bool = True
    teacher: dict[str, Any] = field(default_factory=dict)  # view -> TeacherVectors

    @property
    def teacher_dim(self) -> int | None:
        dims = [reader.dim for reader in self.teacher.values()]
        return dims[0] if dims else None

    @property
    def column_names(self) -> list[str]:
        return list(_mapped_rows(self.rows_path).column_names)

    def rows(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """The rows ``indices`` as a batch: every column, plus ``teacher_<view>`` float32 [B, D] per teacher view."""
        batch = _take_rows(self.rows_path, np.asarray(indices, dtype=np.int64))
        for view, vectors in self.teacher.items():
            batch[f"teacher_{view}"] = vectors(batch[f"text_{view}"])
        return batch

    def num_batches(self, batch_size: int, drop_last: bool = True) -> int:
        return self.num_rows // batch_size if drop_last else math.ceil(self.num_rows / batch_size)

    def epoch_order(self, epoch: int) -> np.ndarray:
        return epoch_order(self.num_rows, self.seed, epoch, self.shuffle)

    def epoch_stream(self, first_epoch: int, epochs: int, rows_per_epoch: int):
        """The rows of epochs ``first_epoch .. epochs - 1`` as a Ray Dataset, each epoch in its seeded order (what
        Train workers stream): ``ray.data.range`` over the positions (each epoch's first ``rows_per_epoch``), mapped
        to row ids by the epoch's permutation and read from the rows file, so no process holds a column of the
        corpus. Rows carry ``epoch`` and ``position``: read in order (``preserve_order``) they are ``iter_batches``'."""
        import ray.data

        first_epoch, epochs, rows_per_epoch = int(first_epoch), int(epochs), int(rows_per_epoch)
        total = (epochs - first_epoch) * rows_per_epoch
        if total <= 0:
            raise ValueError(f"epoch_stream: no rows from epoch {first_epoch} to {epochs} ({rows_per_epoch} a epoch)")
        read = functools.partial(_read_stream_rows, rows_path=self.rows_path, num_rows=self.num_rows,
                                 seed=self.seed, shuffle=self.shuffle, first_epoch=first_epoch,
                                 rows_per_epoch=rows_per_epoch)
        stream = ray.data.range(total, override_num_blocks=max(1, math.ceil(total / STREAM_BLOCK_ROWS)))
        stream = stream.map_batches(read, batch_format="numpy")
        stream.context.execution_options.preserve_order = True
        # Read inside the training loop, whose progress lines already say where it is: no per-epoch bars.
        stream.context.enable_progress_bars = False
        return stream

    def iter_batches(self, epoch: int, batch_size: int, skip_batches: int = 0, drop_last: bool = True,
                     ) -> Iterator[dict[str, np.ndarray]]:
        """Numpy batches of one epoch, from batch ``skip_batches`` on; texts are object arrays."""
        if batch_size <= 0:
            raise ValueError(f"batch_size must be > 0, got {batch_size}")
        order = self.epoch_order(epoch)
        for b in range(skip_batches, self.num_batches(batch_size, drop_last)):
            yield self.rows(order[b * batch_size:(b + 1) * batch_size])


# Rows per block of the training stream: a block's texts are a few MB, and a 300k-row epoch is ~40 map tasks.
STREAM_BLOCK_ROWS = 8192


def epoch_order(num_rows: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """Row ids in the order of epoch ``epoch``: a permutation drawn from ``(seed, epoch)`` (identity unshuffled)."""
    if not shuffle:
        return np.arange(num_rows)
    return np.random.default_rng([int(seed), int(epoch)]).permutation(num_rows)


@functools.lru_cache(maxsize=2)
def _cached_epoch_order(num_rows: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """``epoch_order``, kept: every block of an epoch needs it."""
    order = epoch_order(num_rows, seed, epoch, shuffle)
    order.setflags(write=False)
    return order


def _read_stream_rows(batch: dict[str, np.ndarray], *, rows_path: str, num_rows: int, seed: int, shuffle: bool,
                      first_epoch: int, rows_per_epoch: int) -> dict[str, np.ndarray]:
    """Positions of the stream (``batch["id"]``) -> those rows, with their ``epoch`` and ``position`` columns."""
    ids = np.asarray(batch["id"], dtype=np.int64)
    epoch = first_epoch + ids // rows_per_epoch  # [n]
    position = ids % rows_per_epoch  # [n]
    row_ids = np.empty_like(ids)
    for ep in np.unique(epoch):  # a block spans at most two epochs
        here = epoch == ep
        row_ids[here] = _cached_epoch_order(num_rows, seed, int(ep), shuffle)[position[here]]
    out = _take_rows(rows_path, row_ids)
    out["epoch"], out["position"] = epoch, position
    return out


def build_training_data(cfg: JobConfig) -> TrainingData:
    """Texts and views of ``cfg.data`` in a rows file (this process drops its copy), with every sentence of
    ``cfg.data.teacher_views`` in the teacher's cache (``cache_teacher_vectors``: needs Ray)."""
    import ray

    if not ray.is_initialized():
        raise RuntimeError("build_training_data needs Ray: call raydistill.runtime.engine.cluster.init_ray(cfg) first")
    input_stats: dict[str, int] = {}
    rows = load_training_texts(cfg.data, cfg.seed, stats=input_stats)
    if not rows:
        raise ValueError(f"data.corpus {cfg.data.corpus!r} gave no training sentences")
    columns: dict[str, np.ndarray] = {"idx": np.arange(len(rows), dtype=np.int64),
                                      "group": np.array([row["group"] for row in rows], dtype=np.int64)}
    for view in cfg.data.views:
        columns[f"text_{view}"] = np.array([row[f"text_{view}"] for row in rows], dtype=object)
    del rows

    teacher, cache_stats = cache_teacher_vectors(cfg, {view: list(columns[f"text_{view}"])
                                                       for view in cfg.data.teacher_views})
    cache_stats["input"] = input_stats
    rows_path = write_rows_file(columns, cfg.resolved_cache_dir())
    return TrainingData(num_rows=len(columns["idx"]), cache_stats=cache_stats, rows_path=str(rows_path),
                        seed=cfg.seed, shuffle=cfg.data.shuffle, teacher=teacher)


def cache_teacher_vectors(cfg: JobConfig, texts_by_view: dict[str, list[str]], *, in_process: bool = False,
                          ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The teacher pass: every text of every view in ``cfg``'s teacher cache, encoding only what it lacks (with Ray
    unless ``in_process``). Returns ``({view: TeacherVectors}, stats)``: hits, misses and teacher_forward_sentences
    summed over the views, each view's own under ``views``."""
    from raydistill.runtime.teachers.embedding_cache import TeacherVectors, ensure_teacher_embeddings
    from raydistill.runtime.teachers.teacher import TeacherSpec

    per_view: dict[str, dict[str, Any]] = {}
    teacher: dict[str, TeacherVectors] = {}
    if texts_by_view:
        spec = TeacherSpec.from_config(cfg)
        for view, texts in texts_by_view.items():
            _, per_view[view] = ensure_teacher_embeddings(texts, view, spec, cfg.resolved_cache_dir(),
                                                          in_process=in_process, return_vectors=False)
            teacher[view] = TeacherVectors(cfg.resolved_cache_dir(), spec.identity())
    stats: dict[str, Any] = {key: sum(s[key] for s in per_view.values())
                             for key in ("hits", "misses", "teacher_forward_sentences")}
    stats["views"] = per_view
    return teacher, stats
