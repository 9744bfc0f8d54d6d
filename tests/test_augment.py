"""Text augmentations: deterministic per (text, spec, seed), never empty, each edit does what it says."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raydistill import augment
from raydistill.augment import (
    AugmentationError,
    WordNetUnavailableError,
    caption_views,
    load_wordnet,
    make_views,
    pair_captions,
    parse_spec,
    split_words,
)
from raydistill.data import DataError

SENTENCES = [
    "Two young, White males are outside near many bushes.",
    "A man in a blue shirt standing in a garden.",
    "Several men in hard hats are operating a giant pulley system.",
    "A little girl climbing into a wooden playhouse.",
    "Two dogs are running through the snow, chasing a ball!",
]
EDIT_SPECS = ["delete:0.3", "crop:0.6", "swap:0.3", "synonym:0.3"]


def words(text: str) -> list[str]:
    return [t.text for t in split_words(text) if t.is_word]


@pytest.mark.parametrize("spec", EDIT_SPECS)
def test_same_text_seed_and_spec_give_the_same_view_in_any_order(spec):
    texts = SENTENCES * 2
    views = make_views(texts, spec, seed=7)
    assert views[: len(SENTENCES)] == views[len(SENTENCES):]  # duplicates get the same view
    shuffled = list(range(len(SENTENCES)))
    random.Random(0).shuffle(shuffled)
    reordered = make_views([SENTENCES[i] for i in shuffled], spec, seed=7)
    assert reordered == [views[i] for i in shuffled]
    assert make_views(SENTENCES[:1], spec, seed=7) == views[:1]  # alone or in a batch: the same
    assert any(v != t for v, t in zip(views, texts))  # it did augment


def test_views_are_the_same_in_another_process_and_differ_across_seeds():
    code = ("import json, sys; from raydistill.augment import make_views; "
            f"print(json.dumps(make_views({SENTENCES!r}, 'delete:0.3', 11)))")
    other = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                           env={"PYTHONHASHSEED": "123", "PATH": "/usr/bin:/bin"})
    assert json.loads(other.stdout) == make_views(SENTENCES, "delete:0.3", 11)
    assert make_views(SENTENCES, "delete:0.3", 11) != make_views(SENTENCES, "delete:0.3", 12)


def test_deletion_keeps_order_and_deletes_about_the_ratio():
    kept, total = 0, 0
    rng_texts = [f"{s} {i}" for i, s in enumerate(SENTENCES * 40)]
    for text, view in zip(rng_texts, make_views(rng_texts, "delete:0.3", seed=1)):
        original, remaining = words(text), words(view)
        iterator = iter(original)
        assert all(w in iterator for w in remaining)  # a subsequence: order kept, nothing added
        assert remaining
        kept, total = kept + len(remaining), total + len(original)
    assert abs(1 - kept / total - 0.3) < 0.05  # Bernoulli(0.3) per word over ~2000 words


def test_crop_keeps_one_contiguous_span_of_the_requested_size():
    for text, view in zip(SENTENCES, make_views(SENTENCES, "crop:0.5", seed=2)):
        original, cropped = words(text), words(view)
        assert len(cropped) == math.ceil(0.5 * len(original))
        assert any(original[i:i + len(cropped)] == cropped for i in range(len(original)))
        assert view in text  # the span keeps the original spacing and punctuation between the words


def test_swap_keeps_every_word_and_every_punctuation_mark_in_place():
    for text, view in zip(SENTENCES, make_views(SENTENCES, "swap:0.2", seed=3)):
        assert sorted(words(view)) == sorted(words(text)) and words(view) != words(text)
        punctuation = [(i, t.text) for i, t in enumerate(split_words(text)) if not t.is_word]
        assert punctuation == [(i, t.text) for i, t in enumerate(split_words(view)) if not t.is_word]


def test_synonym_replacement_uses_wordnet_synonyms():
    wordnet = load_wordnet()
    assert "domestic dog" in wordnet.synonyms("dog")
    assert "dog" not in wordnet.synonyms("dogs")  # an inflection is not a synonym
    replaced = 0
    for text, view in zip(SENTENCES, make_views(SENTENCES, "synonym:0.3", seed=4)):
        original = split_words(text)
        assert view != text
        # Replacements may be multi-word ("domestic dog"): compare per token position.
        new = {t.text for t in split_words(view)} - {t.text for t in original}
        for token in original:
            if token.is_word and token.text not in view:
                candidates = {s[:1].upper() + s[1:] if token.text[:1].isupper() else s
                              for s in wordnet.synonyms(token.text)}
                assert any(c in view for c in candidates), (token.text, view)
                replaced += 1
        assert new
    assert replaced >= len(SENTENCES)


def test_missing_wordnet_names_the_install(monkeypatch):
    monkeypatch.setattr(augment, "find_wordnet_dir", lambda: None)
    augment.load_wordnet.cache_clear()
    try:
        with pytest.raises(WordNetUnavailableError, match="apt-get install wordnet-base"):
            make_views(SENTENCES, "synonym:0.2", seed=0)
        assert make_views(SENTENCES, "delete:0.2", seed=0)  # the others need nothing
    finally:
        augment.load_wordnet.cache_clear()


@pytest.mark.parametrize("spec", ["none", "dropout"])
def test_identity_specs(spec):
    assert make_views(SENTENCES, spec, seed=0) == SENTENCES


def test_paired_views_from_jsonl_and_tsv(tmp_path):
    jsonl = tmp_path / "para.jsonl"
    jsonl.write_text("\n".join(json.dumps({"text": s, "paraphrase": s.upper()}) for s in SENTENCES[:3]) + "\n")
    assert make_views(SENTENCES[:3], f"paired:{jsonl}", seed=0) == [s.upper() for s in SENTENCES[:3]]
    tsv = tmp_path / "para.tsv"
    tsv.write_text(f"{SENTENCES[0]}\tfirst paraphrase\n{SENTENCES[0]}\tsecond paraphrase\n")
    view = make_views([SENTENCES[0]], f"paired:{tsv}", seed=5)[0]
    assert view in ("first paraphrase", "second paraphrase")
    assert make_views([SENTENCES[0]], f"paired:{tsv}", seed=5)[0] == view
    with pytest.raises(AugmentationError, match=r"1 of 2 texts have no entry \(first: 'A man in a blue"):
        make_views([SENTENCES[0], SENTENCES[1]], f"paired:{tsv}", seed=0)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "a", "paraphrase": "b"}) + "\n" + json.dumps({"text": "c"}) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl:2: field 'paraphrase'"):
        make_views(["a"], f"paired:{bad}", seed=0)
    with pytest.raises(AugmentationError, match="not found"):
        make_views(["a"], f"paired:{tmp_path / 'nope.tsv'}", seed=0)


def test_caption_views_pair_captions_of_the_same_image():
    groups = [("A dog runs.", "A puppy is running.", "A dog runs."), ("Kids play.", "Children are playing.")]
    views = caption_views(["A dog runs.", "Kids play.", "A puppy is running."], groups, seed=0)
    assert views == ["A puppy is running.", "Children are playing.", "A dog runs."]
    assert pair_captions(groups, seed=0) == [("A dog runs.", "A puppy is running."),
                                             ("A puppy is running.", "A dog runs."),
                                             ("Kids play.", "Children are playing."),
                                             ("Children are playing.", "Kids play.")]
    with pytest.raises(AugmentationError, match="no other caption"):
        caption_views(["Not a caption."], groups, seed=0)


def test_caption_spec_uses_the_flickr_captions():
    from raydistill.data import load_dataset

    group = load_dataset("flickr_captions")[0].captions
    views = make_views(list(group[:2]), "caption", seed=3)
    assert all(v in group and v != t for v, t in zip(views, group[:2]))


@pytest.mark.parametrize("spec, message", [
    ("blur:0.1", "unknown augmentation 'blur'"), ("delete", "needs a ratio"), ("delete:1.0", "ratio must be"),
    ("crop:0", "ratio must be"), ("paired:", "needs a file"), ("dropout:0.1", "takes no argument"), ("", "non-empty"),
])
def test_bad_specs(spec, message):
    with pytest.raises(AugmentationError, match=message):
        parse_spec(spec)


# Arbitrary text: letters, digits, punctuation-only words, underscores, apostrophes, hyphens, unicode, whitespace.
TEXTS = st.text(alphabet=st.sampled_from(list("ab Zé_'-.,!?…\t\n 0") + ["—", "ß", "日", "\u0301"]), max_size=40)


@settings(max_examples=150, deadline=None)
@given(text=TEXTS, spec=st.sampled_from(EDIT_SPECS + ["delete:0.9", "crop:0.1", "swap:1.0", "synonym:1.0"]),
       seed=st.integers(0, 2**31))
def test_a_visible_text_never_becomes_empty(text, spec, seed):
    view = make_views([text], spec, seed)[0]
    if text.strip():
        assert view.strip(), (text, spec, view)
    else:
        assert view == text
    assert make_views([text], spec, seed)[0] == view
