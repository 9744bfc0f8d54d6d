"""Text views for contrastive and cross-view training: deterministic, tokenizer-agnostic augmentations.

    make_views(texts, "delete:0.1", seed=1000) -> list[str]        one view per text, same order

Specs:

| spec | view | reference |
|---|---|---|
| ``none`` / ``dropout`` | the text itself (the encoder's dropout mask is the augmentation) | SimCSE (Gao et al., 2021) |
| ``delete:p`` | every word deleted independently with probability p (≥ 1 word kept) | EDA random deletion (Wei & Zou, 2019) |
| ``crop:r`` | a random contiguous span holding a fraction r of the words | SimCSE's "crop" ablation |
| ``swap:r`` | max(1, round(r·n)) swaps of a random word with the next word | EDA random swap, adjacent |
| ``synonym:r`` | max(1, round(r·n)) words replaced by a WordNet synonym | EDA synonym replacement |
| ``paired:<path>`` | the paraphrase of the text from a file (JSONL ``{"text", "paraphrase"}`` or TSV) | e.g. SCT/ConGen back-translations |
| ``caption`` | another caption of the same Flickr30k image (a human paraphrase) | this project |

Determinism: the random choices for one text come from a generator seeded with hash(seed, spec, text)
(BLAKE2b, not Python's salted ``hash``), so a text gets the same view whatever else is in the list, in whatever
order, in whichever process. Two copies of one sentence get the same view.

Words are split on whitespace and punctuation (``\\w+`` runs, keeping inner apostrophes/hyphens, and runs of
punctuation), never with a model tokenizer; each token keeps the whitespace that preceded it, so the output is
spaced like the input. Only word tokens are deleted/swapped/replaced; punctuation stays where it was.

Never empty: an augmentation that would leave no visible character returns the original text. A blank input
is returned as it is.

WordNet: ``synonym:`` reads the Princeton WordNet 3.0 database files (``index.*``, ``data.*``, ``*.exc``) from
``$RAYDISTILL_WORDNET``, ``/usr/share/wordnet`` (Debian/Ubuntu package ``wordnet-base``) or an
``nltk_data/corpora/wordnet`` folder. Install with ``apt-get install wordnet-base``. Without it,
``synonym:`` raises ``WordNetUnavailableError`` naming that command; the other specs need nothing. The reader of
the files is ``raydistill.wordnet``."""

from __future__ import annotations

import functools
import hashlib
import math
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from raydistill.wordnet import WordNet, find_wordnet_dir

__all__ = [
    "SPEC_KINDS", "WORDNET_INSTALL", "AugmentSpec", "AugmentationError", "WordNetUnavailableError", "caption_views",
    "crop_span", "delete_words", "join_words", "load_paraphrases", "load_wordnet", "make_views", "pair_captions",
    "parse_spec", "replace_synonyms", "split_words", "swap_adjacent", "text_rng",
]

SPEC_KINDS = ("none", "dropout", "delete", "crop", "swap", "synonym", "paired", "caption")
_RATIO_KINDS = ("delete", "crop", "swap", "synonym")
WORDNET_INSTALL = "apt-get install wordnet-base"


class AugmentationError(ValueError):
    """A bad spec, or a view that cannot be made (a text missing from a paraphrase file or the captions)."""


class WordNetUnavailableError(RuntimeError):
    """The WordNet database files are not installed."""


# ----------------------------------------------------------------------------------------------------------------
# Words


@dataclass(frozen=True)
class Token:
    text: str
    space: str  # the whitespace before it in the input
    is_word: bool


_TOKEN = re.compile(r"(\s*)(\w+(?:['’\-]\w+)*|[^\w\s]+)")
_WORD_START = re.compile(r"\w")


def split_words(text: str) -> list[Token]:
    """Word and punctuation tokens of ``text``, each with the whitespace before it."""
    return [Token(m.group(2), m.group(1), bool(_WORD_START.match(m.group(2)))) for m in _TOKEN.finditer(text)]


def join_words(tokens: Sequence[Token]) -> str:
    """Inverse of ``split_words`` up to the leading/trailing whitespace of the whole text."""
    return "".join(("" if i == 0 else token.space) + token.text for i, token in enumerate(tokens))


def text_rng(seed: int, spec: str, text: str) -> random.Random:
    """The generator of one (seed, spec, text): independent of call order and of the process."""
    digest = hashlib.blake2b(f"{int(seed)}\x1f{spec}\x1f{text}".encode("utf-8", "surrogatepass"),
                             digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "little"))


def _visible(text: str) -> bool:
    return bool(text.strip())


def _word_positions(tokens: Sequence[Token]) -> list[int]:
    return [i for i, token in enumerate(tokens) if token.is_word]


def _count(ratio: float, words: int) -> int:
    return max(1, round(ratio * words))


# ----------------------------------------------------------------------------------------------------------------
# Augmentations (text, ratio, rng) -> text


def delete_words(text: str, ratio: float, rng: random.Random) -> str:
    """Delete each word with probability ``ratio``; at least one word stays (EDA's random deletion)."""
    tokens = split_words(text)
    words = _word_positions(tokens)
    if not words:
        return text
    dropped = {i for i in words if rng.random() < ratio}
    if len(dropped) == len(words):
        dropped.discard(words[rng.randrange(len(words))])
    out = join_words([t for i, t in enumerate(tokens) if i not in dropped])
    return out if _visible(out) else text


def crop_span(text: str, ratio: float, rng: random.Random) -> str:
    """Keep a random contiguous span with ``max(1, ceil(ratio·n))`` of the n words (and the punctuation
    between them)."""
    tokens = split_words(text)
    words = _word_positions(tokens)
    if not words:
        return text
    keep = min(len(words), max(1, math.ceil(ratio * len(words))))
    start = rng.randrange(len(words) - keep + 1)
    first, last = words[start], words[start + keep - 1]
    out = join_words(tokens[first:last + 1])
    return out if _visible(out) else text


def swap_adjacent(text: str, ratio: float, rng: random.Random) -> str:
    """Swap ``max(1, round(ratio·n))`` distinct random words each with the word after it, in random order
    (word-order noise that keeps every word; punctuation stays in place)."""
    tokens = split_words(text)
    words = _word_positions(tokens)
    if len(words) < 2:
        return text
    texts = [tokens[i].text for i in words]
    # Distinct swap positions: the same pair swapped twice would give the input back.
    for i in rng.sample(range(len(words) - 1), min(len(words) - 1, _count(ratio, len(words)))):
        texts[i], texts[i + 1] = texts[i + 1], texts[i]
    out_tokens = list(tokens)
    for position, word in zip(words, texts):
        out_tokens[position] = Token(word, tokens[position].space, True)
    return join_words(out_tokens)


# A function-word list (articles, pronouns, auxiliaries, prepositions, conjunctions): replacing these with
# "synonyms" only produces noise (WordNet lists "a" as a noun for the vitamin, "in" for the state of Indiana).
STOPWORDS = frozenset([
    "a", "about", "above", "after", "again", "against", "all", "am", "an", "and", "any", "are", "as", "at", "be",
    "because", "been", "before", "being", "below", "between", "both", "but", "by", "can", "could", "did", "do",
    "does", "doing", "down", "during", "each", "few", "for", "from", "further", "had", "has", "have", "having",
    "he", "her", "here", "hers", "herself", "him", "himself", "his", "how", "i", "if", "in", "into", "is", "it",
    "its", "itself", "just", "me", "more", "most", "my", "myself", "no", "nor", "not", "now", "of", "off", "on",
    "once", "only", "or", "other", "our", "ours", "ourselves", "out", "over", "own", "same", "she", "should", "so",
    "some", "such", "than", "that", "the", "their", "theirs", "them", "themselves", "then", "there", "these",
    "they", "this", "those", "through", "to", "too", "under", "until", "up", "very", "was", "we", "were", "what",
    "when", "where", "which", "while", "who", "whom", "why", "will", "with", "would", "you", "your", "yours",
    "yourself", "yourselves", "one", "two", "three"
])


def replace_synonyms(text: str, ratio: float, rng: random.Random, wordnet: WordNet | None = None) -> str:
    """Replace ``max(1, round(ratio·n))`` words (not stop words, not numbers) that WordNet knows by a synonym.

    Synonyms are the other lemmas of the word's most frequent sense (the first synset of its most frequent part
    of speech, WordNet's sense order). EDA samples from every sense, which turns "dog" into "andiron" or "cad";
    the most-frequent-sense rule keeps the meaning and is the standard baseline of word-sense disambiguation.
    Capitalisation of the first letter is kept. Texts without such a word are returned unchanged."""
    wordnet = wordnet or load_wordnet()
    tokens = split_words(text)
    candidates = []
    for i, token in enumerate(tokens):
        if token.is_word and token.text.lower() not in STOPWORDS and not any(c.isdigit() for c in token.text):
            synonyms = wordnet.synonyms(token.text)
            if synonyms:
                candidates.append((i, synonyms))
    if not candidates:
        return text
    words = len(_word_positions(tokens))
    chosen = rng.sample(candidates, min(len(candidates), _count(ratio, words)))
    out_tokens = list(tokens)
    for i, synonyms in sorted(chosen):
        replacement = synonyms[rng.randrange(len(synonyms))]
        if tokens[i].text[:1].isupper():
            replacement = replacement[:1].upper() + replacement[1:]
        out_tokens[i] = Token(replacement, tokens[i].space, True)
    out = join_words(out_tokens)
    return out if _visible(out) else text


# ----------------------------------------------------------------------------------------------------------------
# WordNet (the database reader is raydistill.wordnet)


@functools.lru_cache(maxsize=1)
def load_wordnet() -> WordNet:
    directory = find_wordnet_dir()
    if directory is None:
        raise WordNetUnavailableError(
            "synonym augmentation needs the WordNet 3.0 database files (index.noun, data.noun, ...), which were "
            f"not found. Install them with `{WORDNET_INSTALL}` (Debian/Ubuntu, files in /usr/share/wordnet), or "
            "set RAYDISTILL_WORDNET to a directory that holds them (e.g. an nltk_data/corpora/wordnet folder).")
    return WordNet(directory)


# ----------------------------------------------------------------------------------------------------------------
# Paired views: a paraphrase file, Flickr captions


@functools.lru_cache(maxsize=8)
def _load_paraphrases_cached(path: str, mtime_ns: int, size: int) -> dict[str, tuple[str, ...]]:
    from raydistill.data.formats import DataError, iter_jsonl, iter_lines

    source = Path(path)
    is_jsonl = source.name.endswith((".jsonl", ".json", ".jsonl.gz", ".json.gz"))
    if not is_jsonl:
        for _, first in iter_lines(source):
            is_jsonl = isinstance(first, str) and first.lstrip().startswith("{")
            break
    table: dict[str, list[str]] = {}
    records = iter_jsonl(source) if is_jsonl else iter_lines(source)
    for line, record in records:
        if isinstance(record, DataError):
            raise record
        if is_jsonl:
            for field in ("text", "paraphrase"):
                if not isinstance(record.get(field), str) or not record[field].strip():
                    raise DataError(source, "must be a non-empty string", line=line, field=field)
            text, paraphrase = record["text"], record["paraphrase"]
        else:
            columns = record.split("\t")
            if len(columns) != 2 or not columns[0].strip() or not columns[1].strip():
                raise DataError(source, f"expected 'text<TAB>paraphrase', got {len(columns)} column(s)",
                                line=line, field="paraphrase" if len(columns) == 1 else "text")
            text, paraphrase = columns
        table.setdefault(text, []).append(paraphrase)
    return {text: tuple(paraphrases) for text, paraphrases in table.items()}


def load_paraphrases(path: str | Path) -> dict[str, tuple[str, ...]]:
    """text → its paraphrases, from JSONL ``{"text": ..., "paraphrase": ...}`` or TSV ``text<TAB>paraphrase``
    (gzip allowed). Bad lines raise ``raydistill.data.DataError`` ("<file>:<line>: field '<f>': ...")."""
    path = Path(path).expanduser()
    try:
        stat = path.stat()
    except OSError:
        raise AugmentationError(f"{path}: paraphrase file not found") from None
    return _load_paraphrases_cached(str(path.resolve()), stat.st_mtime_ns, stat.st_size)


def _pick_views(texts: Sequence[str], table: dict[str, Sequence[str]], spec: str, seed: int, source: str) -> list[str]:
    missing = [t for t in texts if t not in table]
    if missing:
        examples = "; ".join(repr(t[:80]) for t in missing[:3])
        raise AugmentationError(f"{source}: {len(missing)} of {len(texts)} texts have no entry (first: {examples})")
    from raydistill.data.evaluation_text import evaluation_key, evaluation_keys

    # A view is trained on like its text: a paraphrase or sibling caption that is an evaluation sentence is never
    # one (the text itself stands in when every option is).
    held_out = evaluation_keys()
    out = []
    for text in texts:
        options = [option for option in table[text] if evaluation_key(option) not in held_out]
        if not options:
            out.append(text)
            continue
        view = options[0] if len(options) == 1 else options[text_rng(seed, spec, text).randrange(len(options))]
        out.append(view if _visible(view) else text)
    return out


def caption_views(texts: Sequence[str], groups: Iterable[Sequence[str]], seed: int) -> list[str]:
    """For each text, another caption of the same image (a real human paraphrase), chosen per text by
    ``text_rng(seed, "caption", text)``. ``groups``: the captions of each image. A text that appears under several
    images may be paired with a caption of any of them; a text with no other caption, or in no group, raises."""
    others: dict[str, set[str]] = {}
    for group in groups:
        captions = [c for c in group if _visible(c)]
        for caption in captions:
            others.setdefault(caption, set()).update(c for c in captions if c != caption)
    table = {text: tuple(sorted(partners)) for text, partners in others.items() if partners}
    return _pick_views(texts, table, "caption", seed, "caption views (no other caption of the same image)")


def pair_captions(groups: Iterable[Sequence[str]], seed: int) -> list[tuple[str, str]]:
    """Every caption paired with another caption of the same image: (caption, partner) for each caption of
    each group of ≥ 2 distinct captions, in input order."""
    groups = [tuple(dict.fromkeys(c for c in group if _visible(c))) for group in groups]
    texts = [caption for group in groups if len(group) > 1 for caption in group]
    return list(zip(texts, caption_views(texts, groups, seed)))


@functools.lru_cache(maxsize=1)
def _flickr_groups() -> tuple[tuple[str, ...], ...]:
    from raydistill.data import load_dataset

    return tuple(tuple(group.captions) for group in load_dataset("flickr_captions"))


# ----------------------------------------------------------------------------------------------------------------
# Specs


@dataclass(frozen=True)
class AugmentSpec:
    kind: str
    ratio: float | None = None
    path: str | None = None

    def __str__(self) -> str:
        if self.ratio is not None:
            return f"{self.kind}:{self.ratio:g}"
        if self.path is not None:
            return f"{self.kind}:{self.path}"
        return self.kind


def parse_spec(spec: str | AugmentSpec) -> AugmentSpec:
    """``"delete:0.1"`` → AugmentSpec("delete", 0.1); errors name the spec and the accepted forms."""
    if isinstance(spec, AugmentSpec):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise AugmentationError(f"augmentation spec must be a non-empty string, got {spec!r}")
    kind, _, argument = spec.strip().partition(":")
    kind = kind.strip().lower()
    if kind not in SPEC_KINDS:
        raise AugmentationError(f"unknown augmentation {kind!r} in spec {spec!r}; known: {', '.join(SPEC_KINDS)} "
                                "(e.g. 'delete:0.1', 'crop:0.8', 'swap:0.1', 'synonym:0.2', 'dropout', "
                                "'paired:<file>', 'caption')")
    if kind in _RATIO_KINDS:
        try:
            ratio = float(argument)
        except ValueError:
            raise AugmentationError(f"spec {spec!r}: {kind} needs a ratio, e.g. '{kind}:0.1'") from None
        if not 0.0 < ratio <= 1.0 or (kind == "delete" and ratio >= 1.0):
            raise AugmentationError(f"spec {spec!r}: ratio must be in (0, 1{')' if kind == 'delete' else ']'}, "
                                    f"got {ratio}")
        return AugmentSpec(kind, ratio=ratio)
    if kind == "paired":
        if not argument.strip():
            raise AugmentationError(f"spec {spec!r}: paired needs a file, e.g. 'paired:data/paraphrases.jsonl'")
        return AugmentSpec(kind, path=argument.strip())
    if argument:
        raise AugmentationError(f"spec {spec!r}: {kind} takes no argument")
    return AugmentSpec(kind)


_EDITS = {"delete": delete_words, "crop": crop_span, "swap": swap_adjacent, "synonym": replace_synonyms}


def make_views(texts: Sequence[str], spec: str | AugmentSpec, seed: int) -> list[str]:
    """One view per text under ``spec`` (module docstring), deterministic per (text, spec, seed)."""
    parsed = parse_spec(spec)
    texts = list(texts)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise AugmentationError(f"texts[{i}] must be a string, got {type(text).__name__}")
    if parsed.kind in ("none", "dropout"):
        return list(texts)
    if parsed.kind == "paired":
        table = load_paraphrases(parsed.path)
        return _pick_views(texts, table, str(parsed), seed, f"{parsed.path} (paired views)")
    if parsed.kind == "caption":
        return caption_views(texts, _flickr_groups(), seed)
    edit = _EDITS[parsed.kind]
    if parsed.kind == "synonym":
        load_wordnet()  # fail before the loop, with the install hint
    name = str(parsed)
    out = []
    for text in texts:
        view = edit(text, parsed.ratio, text_rng(seed, name, text)) if _visible(text) else text
        out.append(view if _visible(view) or not _visible(text) else text)
    return out
