"""bench/domain.py's split of a labelled pair set: what trains never shares a sentence with what chooses or tests."""

from __future__ import annotations

import sys
from pathlib import Path

from raydistill.data.readers import Pair

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import domain  # noqa: E402


def _pairs(count: int) -> list[Pair]:
    # sentence i is in pairs i-1 and i: a chain, so a careless split leaks sentences across halves
    return [Pair(f"question {i}", f"question {i + 1}", label=i % 2) for i in range(count)]


def test_the_corpus_dev_and_test_share_no_sentence():
    corpus, dev, test = domain.split_domain(_pairs(1000), seed=0, test_pairs=100, dev_pairs=60)
    texts = lambda pairs: {t for p in pairs for t in (p.sentence1, p.sentence2)}  # noqa: E731
    assert (len(test), len(dev)) == (100, 60)
    assert not set(corpus) & (texts(dev) | texts(test)) and not texts(dev) & texts(test)
    assert {p.score for p in test} == {0.0, 1.0} and corpus
    assert domain.split_domain(_pairs(1000), seed=0, test_pairs=100, dev_pairs=60) == (corpus, dev, test)


def test_a_small_set_splits_its_other_half_sixty_forty():
    corpus, dev, test = domain.split_domain(_pairs(100), seed=1, test_pairs=2000, dev_pairs=2000)
    assert len(test) == 30 and 0 < len(dev) <= 20


def test_an_nli_pair_is_labelled_by_entailment_and_a_neutral_one_is_left_out():
    assert [domain.binary_label(label) for label in ("entailment", "contradiction", "neutral", 1, 0)] == [
        1.0, 0.0, None, 1.0, 0.0]
