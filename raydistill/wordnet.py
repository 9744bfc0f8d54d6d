"""A reader of the Princeton WordNet 3.0 database files (``index.*``, ``data.*``, ``*.exc``; see wndb(5)): the
synonyms of a word's most frequent sense, for ``raydistill.augment``'s ``synonym:`` views.

    directory = find_wordnet_dir()        # $RAYDISTILL_WORDNET, $WNHOME/dict, /usr/share/wordnet, nltk_data; or None
    WordNet(directory).synonyms("dogs")   # ('Canis familiaris', 'domestic dog')

Inflected forms are reduced with WordNet's morphy rules and exception lists; a word's own base forms are never its
synonyms. Needs no nltk. ``raydistill.augment`` loads it once (``load_wordnet``, which names the install command
when the files are missing) and re-exports ``WordNet`` and ``find_wordnet_dir``."""

from __future__ import annotations

import os
import re
from pathlib import Path

_POS = ("noun", "verb", "adj", "adv")
# Detachment rules of WordNet's morphy (morph(7WN)): suffix -> base suffix, per part of speech.
_MORPHY_RULES = {
    "noun": (("s", ""), ("ses", "s"), ("xes", "x"), ("zes", "z"), ("ches", "ch"), ("shes", "sh"), ("men", "man"),
             ("ies", "y")),
    "verb": (("s", ""), ("ies", "y"), ("es", "e"), ("es", ""), ("ed", "e"), ("ed", ""), ("ing", "e"), ("ing", "")),
    "adj": (("er", ""), ("est", ""), ("er", "e"), ("est", "e")),
    "adv": (),
}


def find_wordnet_dir() -> Path | None:
    """The first directory holding the WordNet database: $RAYDISTILL_WORDNET, $WNHOME/dict, /usr/share/wordnet,
    then nltk_data/corpora/wordnet under $NLTK_DATA, ~, /usr/share, /usr/local/share, /usr/lib."""
    candidates = []
    if os.environ.get("RAYDISTILL_WORDNET"):
        candidates.append(Path(os.environ["RAYDISTILL_WORDNET"]))
    if os.environ.get("WNHOME"):
        candidates.append(Path(os.environ["WNHOME"]) / "dict")
    candidates.append(Path("/usr/share/wordnet"))
    nltk_roots = [Path(p) for p in os.environ.get("NLTK_DATA", "").split(os.pathsep) if p]
    nltk_roots += [Path.home() / "nltk_data", Path("/usr/share/nltk_data"), Path("/usr/local/share/nltk_data"),
                   Path("/usr/lib/nltk_data")]
    candidates += [root / "corpora" / "wordnet" for root in nltk_roots]
    for directory in candidates:
        if all((directory / f"{kind}.{pos}").is_file() for kind in ("index", "data") for pos in _POS):
            return directory
    return None


class WordNet:
    """Synonym lookup over the WordNet 3.0 database files (no nltk needed: nltk's reader also wants a
    ``lexnames`` file that Debian's package does not ship, and its path sandbox refuses /usr/share)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self._index: dict[str, dict[str, tuple[int, list[int]]]] = {}  # pos -> lemma -> (tagged senses, offsets)
        self._data: dict[str, bytes] = {}
        self._exceptions: dict[str, dict[str, list[str]]] = {}
        self._synonym_cache: dict[str, tuple[str, ...]] = {}
        for pos in _POS:
            self._index[pos] = self._read_index(self.root / f"index.{pos}")
            self._data[pos] = (self.root / f"data.{pos}").read_bytes()
            self._exceptions[pos] = self._read_exceptions(self.root / f"{pos}.exc")

    @staticmethod
    def _read_index(path: Path) -> dict[str, tuple[int, list[int]]]:
        # lemma pos synset_cnt p_cnt [ptr_symbol...] sense_cnt tagsense_cnt synset_offset...
        index = {}
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.startswith(" "):  # licence header
                    continue
                fields = line.split()
                synsets, pointers = int(fields[2]), int(fields[3])
                tagged = int(fields[5 + pointers])
                index[fields[0]] = (tagged, [int(x) for x in fields[-synsets:]])
        return index

    @staticmethod
    def _read_exceptions(path: Path) -> dict[str, list[str]]:
        if not path.is_file():
            return {}
        with open(path, encoding="utf-8") as f:
            return {fields[0]: fields[1:] for fields in (line.split() for line in f) if len(fields) > 1}

    def _base_forms(self, word: str, pos: str) -> list[str]:
        index = self._index[pos]
        forms = [word] if word in index else []
        forms += [base for base in self._exceptions[pos].get(word, []) if base in index]
        for suffix, replacement in _MORPHY_RULES[pos]:
            if word.endswith(suffix) and len(word) > len(suffix):
                base = word[: len(word) - len(suffix)] + replacement
                if base in index:
                    forms.append(base)
        return list(dict.fromkeys(forms))

    def _synset_lemmas(self, pos: str, offset: int) -> list[str]:
        data = self._data[pos]
        line = data[offset: data.index(b"\n", offset)].decode("utf-8").split()
        # synset_offset lex_filenum ss_type w_cnt(hex) word lex_id [word lex_id ...] ...
        count = int(line[3], 16)
        words = line[4: 4 + 2 * count: 2]
        return [re.sub(r"\((a|p|ip)\)$", "", w) for w in words]

    def synonyms(self, word: str) -> tuple[str, ...]:
        """Other lemmas of the most frequent sense of ``word`` (spaces for underscores), sorted; () if none."""
        if word not in self._synonym_cache:
            self._synonym_cache[word] = self._lookup(word)
        return self._synonym_cache[word]

    def _lookup(self, word: str) -> tuple[str, ...]:
        lowered = word.lower()
        best = None  # ((tagged sense count, -pos order), pos, offsets)
        forms = {lowered}
        for order, pos in enumerate(_POS):
            for form in self._base_forms(lowered, pos):
                forms.add(form)
                tagged, offsets = self._index[pos][form]
                key = (tagged, -order)
                if best is None or key > best[0]:
                    best = (key, pos, offsets)
        if best is None:
            return ()
        _, pos, offsets = best
        # The word's own base forms are not synonyms ("dogs" -> "dog" would only change the inflection).
        excluded = {form.replace("_", " ") for form in forms}
        lemmas = {lemma.replace("_", " ") for lemma in self._synset_lemmas(pos, offsets[0])}
        return tuple(sorted(lemma for lemma in lemmas if lemma.lower() not in excluded and lemma.strip()))
