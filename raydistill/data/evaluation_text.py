"""What "an evaluation sentence" is: the one test every path that trains applies to the text it reads.

A text is an evaluation sentence when its ``evaluation_key`` is the key of a text of one of ``EVALUATION_DATASETS``
(both sides of every pair). The key is Unicode NFKC, case folded, with every character that is not a letter, a mark
or a number removed (punctuation P*, symbols S*, separators Z*, controls and format characters Cc/Cf), so

    evaluation_key("A man is playing a guitar.") == evaluation_key("a man is playing a guitar")
    evaluation_key("He didn't go -- \u201cno\u201d.") == evaluation_key("He did n't go `` no ''")

The sets differ from training copies of their sentences by a missing final period, PTB-style tokenised quotes and
contractions, spacing around punctuation, full-width or compatibility characters and case; none of those changes
what a model learns about the sentence, so none of them makes it a different sentence. Symbols go with punctuation
because tokenised copies write quotes and apostrophes with symbol characters (the backtick and the acute accent are
Sk, not P). Digits stay: "3 men" and "4 men" are different sentences. The key only removes training text, so a
false match (two different sentences with one key) costs one training row, while a missed one scores a model on a
sentence it trained on: the key errs towards matching.

    keys = evaluation_keys()                    # frozenset of every evaluation key (cached per data-file version)
    kept, removed = drop_evaluation_pairs(pairs)  # pairs (sentence1/sentence2) with neither text an evaluation one

Every training path calls these: ``raydistill.data.corpus`` (``mixed``, ``file:`` corpora, the NLI training pairs
behind DistilCSE's triplets and DvBERT's teachers), the derivation's calibration sentences, Trans-Encoder's inductive
pairs and the views of ``augment`` (a ``paired:<file>`` paraphrase or a sibling caption is never an evaluation
sentence). The older named corpora (``flickr``, ``nli``, ``flickr+nli``) and Trans-Encoder's transductive sources
are the exceptions, each documented where it is read."""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Iterable
from typing import Any

from raydistill.data.registry import dataset_path, load_dataset

__all__ = ["EVALUATION_DATASETS", "dataset_versions", "drop_evaluation_pairs", "evaluation_key", "evaluation_keys"]

# Every set a reported score is computed on or a model is selected with: the 7-STS sets and STS-B dev, and the
# paraphrase sets of the AUC evaluations (MRPC validation for `raydistill eval` and the jobs; QQP dev for
# Trans-Encoder). Not here: the SentEval transfer sets (MR, CR, SUBJ, MPQA, SST-2 dev/test, TREC test), which the
# registry ships but no path scores (a path that starts scoring one must add it: ``mixed``'s SST-2 rows share 5,540
# sentences with MR and 2,107 with SUBJ, all from the same movie reviews); and MRPC train, which Trans-Encoder's ``mrpc`` source scores only in a run
# that trains on those very pairs and says it is transductive. tests/test_corpus_mixed.py checks this list against
# raydistill.evaluation.
EVALUATION_DATASETS = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb_dev", "stsb_test", "sick_test", "mrpc_val",
                       "qqp_dev")


def _dropped(code: int) -> bool:
    """Punctuation, symbols, separators, controls and format characters: what the key leaves out.

    Letters (L*), marks (M*: after NFKC, mostly the vowel signs and diacritics of scripts without precomposed
    forms) and numbers (N*) stay; so do unassigned and private-use code points, which no evaluation set holds."""
    category = unicodedata.category(chr(code))
    return category[0] in "PSZ" or category in ("Cc", "Cf")


# Nearly every text is ASCII, where NFKC changes nothing and case folding is lower(): bytes.translate on those is
# about three times faster than the general path, which matters over the ~300k texts ``mixed`` reads.
_ASCII_DROPPED = bytes(code for code in range(128) if _dropped(code))


@functools.cache
def _deletions() -> dict[int, None]:
    """``str.translate`` table deleting every dropped character. Only planes 0-1 and 14 hold assigned characters
    outside the categories kept (planes 2-3 are CJK ideographs, 15-16 private use), so only those are scanned."""
    codes = (*range(0x20000), *range(0xE0000, 0xE1000))
    return {code: None for code in codes if _dropped(code)}


def evaluation_key(text: str) -> str:
    """The text as it is compared with the evaluation sets: NFKC, case folded, letters, marks and numbers only."""
    if text.isascii():
        return text.lower().encode("ascii").translate(None, _ASCII_DROPPED).decode("ascii")
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())
    return folded.translate(_deletions())


def evaluation_keys(split_of: str | None = None) -> frozenset[str]:
    """``evaluation_key`` of every text of every ``EVALUATION_DATASETS`` set (both sides of each pair).

    ``split_of`` names one set left out: a corpus that is a training split of that set, tested on its other split
    with no sentence shared (``data.evaluation_set_split``, a domain benchmark's setting). The other sets' texts
    stay excluded, a text that is also in one of them included."""
    if split_of is not None and split_of not in EVALUATION_DATASETS:
        raise ValueError(f"{split_of!r} is not an evaluation set; choose from {', '.join(EVALUATION_DATASETS)}")
    return _evaluation_keys(dataset_versions(name for name in EVALUATION_DATASETS if name != split_of))


@functools.lru_cache(maxsize=2)
def _evaluation_keys(versions: tuple) -> frozenset[str]:
    keys: set[str] = set()
    for name, *_ in versions:
        for pair in load_dataset(name):
            keys.add(evaluation_key(pair.sentence1))
            keys.add(evaluation_key(pair.sentence2))
    keys.discard("")  # a text of punctuation alone names no sentence
    return frozenset(keys)


def dataset_versions(names: Iterable[str]) -> tuple:
    """Where each registry set is read from now and its size and mtime: a cache key that sees a changed file."""
    paths = [(name, dataset_path(name)) for name in names]
    return tuple((name, str(path), (stat := path.stat()).st_size, stat.st_mtime_ns) for name, path in paths)


def drop_evaluation_pairs(pairs: Iterable[Any]) -> tuple[list[Any], int]:
    """``(kept, removed)``: the pairs (``sentence1``/``sentence2``) neither of whose texts is an evaluation sentence,
    in input order, and how many went."""
    excluded = evaluation_keys()
    kept, removed = [], 0
    for pair in pairs:
        if evaluation_key(pair.sentence1) in excluded or evaluation_key(pair.sentence2) in excluded:
            removed += 1
        else:
            kept.append(pair)
    return kept, removed
