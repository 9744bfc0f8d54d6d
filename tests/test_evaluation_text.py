"""No evaluation sentence in any training set a job builds, by the one key of ``raydistill.data.evaluation_text``.

Each training set is rebuilt through the function the jobs call (the ``mixed`` corpus, DistilCSE's stage-2
triplets, DvBERT's teacher pairs and its STS-B stage, the derivation's calibration sentences, Trans-Encoder's
inductive pairs), and every text in it is compared with every text of every evaluation set.
"""

from __future__ import annotations

import json
import unicodedata
from types import SimpleNamespace

import numpy as np
import pytest

from raydistill.data import load_dataset
from raydistill.data.evaluation_text import EVALUATION_DATASETS, evaluation_key, evaluation_keys


def _evaluation_sets() -> dict[str, set[str]]:
    return {name: {evaluation_key(text) for pair in load_dataset(name) for text in (pair.sentence1, pair.sentence2)}
            for name in EVALUATION_DATASETS}


def _leaks(texts) -> dict[str, int]:
    """Distinct evaluation sentences among ``texts``, per evaluation set (only sets with any)."""
    found = {evaluation_key(text) for text in texts} & evaluation_keys()
    return {name: len(found & keys) for name, keys in _evaluation_sets().items() if found & keys}


def _training_sets() -> dict[str, tuple[int, list[str]]]:
    """name -> (rows, every text of every row)."""
    from raydistill.data.corpus import read_corpus
    from raydistill.methods import get_method
    from raydistill.models.derive import default_calibration_sentences
    from raydistill.methods import dvbert_teachers
    from raydistill.runtime.jobs import stage_data
    from raydistill.runtime.tenc.pairs import build_pair_set

    mixed = read_corpus("mixed")
    triplets = stage_data.nli_triplets(None, seed=0)
    teacher_pairs = dvbert_teachers.nli_pairs()
    cfg = SimpleNamespace(seed=0, data=SimpleNamespace(max_sentences=None, shuffle=False))
    stsb = stage_data.build_stage_data(cfg, get_method("sts-cosine"))
    stsb_rows = stsb.rows(np.arange(stsb.num_rows))
    inductive = build_pair_set("inductive")
    calibration = default_calibration_sentences()
    return {
        "mixed": (len(mixed), [*mixed.texts, *(t for group in mixed.groups for t in group)]),
        "DistilCSE stage-2 NLI triplets": (len(triplets["text_anchor"]),
                                           [t for column in triplets.values() for t in column]),
        "DvBERT teachers' NLI pairs": (len(teacher_pairs["label"]),
                                       [*teacher_pairs["text_a"], *teacher_pairs["text_b"]]),
        "DvBERT's STS-B train stage": (stsb.num_rows, [*stsb_rows["text_a"], *stsb_rows["text_b"]]),
        "derivation calibration sentences": (len(calibration), calibration),
        "Trans-Encoder inductive pairs": (len(inductive), [*inductive.sentence1, *inductive.sentence2]),
    }


def test_no_training_set_holds_an_evaluation_sentence():
    sets = _training_sets()
    leaks = {name: _leaks(texts) for name, (_, texts) in sets.items()}
    assert not any(leaks.values()), f"distinct evaluation sentences per training set: {leaks}"
    # The sizes docs/data.md reports ("Evaluation text")
    assert {name: rows for name, (rows, _) in sets.items()} == {
        "mixed": 269_340, "DistilCSE stage-2 NLI triplets": 9_102, "DvBERT teachers' NLI pairs": 29_316,
        "DvBERT's STS-B train stage": 673, "derivation calibration sentences": 512, "Trans-Encoder inductive pairs": 32_779}


def test_a_user_corpus_loses_evaluation_sentences_however_they_are_written(tmp_path):
    from raydistill.data.corpus import read_corpus

    sts = load_dataset("sts12")[0].sentence1  # ends with a period
    sick = load_dataset("sick_test")[0].sentence1  # has none
    variants = [sts.rstrip(".").upper(), sick + ".", "  " + sick.replace(" ", "  ") + " !", chr(ord(sick[0]) + 0xFEE0) + sick[1:]]  # full-width first letter
    kept = ["A dog runs on the beach.", "3 men talk in a cafe."]
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in [kept[0], *variants, kept[1]]), encoding="utf-8")
    corpus = read_corpus(f"file:{path}")
    assert corpus.texts == kept and corpus.stats["evaluation_sentences_removed"] == len(variants)


@pytest.mark.parametrize("first, second", [
    ("A man is playing a guitar.", "a man is playing a guitar"),
    ("He didn't go -- \u201cno\u201d.", "He did n't go `` no ''"),
    ("A woman is talking on a cell phone.", "A woman is talking on a cellphone"),
    ("\uff21 \ufb01ne day", "A fine day"),  # full-width letter, ligature: NFKC
    ("Stra\u00dfe", "STRASSE"),  # case folding, not lower()
    ("Caf\u00e9\u200b au lait", "Cafe\u0301 au lait"),  # a zero-width space (Cf); composed and decomposed
])
def test_the_key_ignores_case_punctuation_spacing_and_compatibility_forms(first, second):
    assert evaluation_key(first) == evaluation_key(second) != ""


def test_the_key_keeps_letters_digits_and_marks():
    assert evaluation_key("3 men") != evaluation_key("4 men")
    assert evaluation_key("\u0915\u093f") != evaluation_key("\u0915")  # a Devanagari vowel sign (Mc) counts
    assert evaluation_key("a $5 + 3% rise!") == "a53rise"


def test_the_ascii_fast_path_is_the_general_key():
    def general(text: str) -> str:
        folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())
        return "".join(c for c in folded if unicodedata.category(c)[0] in "LMN" or unicodedata.category(c) in
                       ("Cn", "Co", "Cs"))

    ascii_text = "".join(chr(c) for c in range(128))
    texts = [ascii_text, "Caf\u00e9 \u2014 na\u00efve \u00bd \u2460 \U0001F600 \u00b4quoted\u00b4 \ufe0f \U000E0041"]
    texts += [t for pair in load_dataset("sts16")[:200] for t in (pair.sentence1, pair.sentence2)]
    assert [evaluation_key(t) for t in texts] == [general(t) for t in texts]


def test_a_view_is_never_an_evaluation_sentence(tmp_path):
    """Views are trained on like texts: a paraphrase (``paired:<file>``) or sibling caption (``caption``) that is an
    evaluation sentence, however written, is never chosen; the text stands in when it is the only option."""
    from raydistill.augment import caption_views, make_views

    sts = load_dataset("sts12")[0].sentence1
    leaked = sts.rstrip(".").upper()
    path = tmp_path / "paraphrases.jsonl"
    rows = [("A dog runs on the beach.", leaked), ("A dog runs on the beach.", "A dog is running on sand."),
            ("3 men talk in a cafe.", leaked)]
    path.write_text("".join(json.dumps({"text": t, "paraphrase": p}) + "\n" for t, p in rows), encoding="utf-8")
    texts = ["A dog runs on the beach.", "3 men talk in a cafe."]
    for seed in range(8):
        assert make_views(texts, f"paired:{path}", seed) == ["A dog is running on sand.", "3 men talk in a cafe."]
    groups = [("A girl sits on a bench.", sts), ("A girl sits on a bench.", sts, "A child rests on a seat.")]
    for seed in range(8):
        assert caption_views(["A girl sits on a bench."], groups, seed) == ["A child rests on a seat."]
