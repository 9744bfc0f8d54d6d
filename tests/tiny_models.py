"""Tiny, randomly initialised BERT / RoBERTa / MPNet checkpoints for tests.

Why not a real small checkpoint: the Hugging Face hub is unreachable here and the only bundled weights are
22M-110M parameters, too slow for a test suite on two cores. A 2-layer, 32-wide encoder runs a batch in
milliseconds yet goes through exactly the code paths a real checkpoint does: the tokenizer is a real trained
tokenizer of the right kind (WordPiece for BERT and MPNet, byte-level BPE for RoBERTa), saved with
`save_pretrained` so `AutoTokenizer` / `AutoModel` load the directory like any hub checkpoint, and the padding
and position-id conventions of each family (RoBERTa and MPNet count positions from `pad_token_id + 1`) are
the real ones.

The vocabulary is trained on real sentences (Flickr30k captions and STS-B train, bundled with the package) so
that test sentences tokenise into ordinary sub-words rather than a stream of unknown tokens.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import (
    AutoModel,
    BertConfig,
    BertTokenizer,
    MPNetConfig,
    MPNetTokenizer,
    RobertaConfig,
    RobertaTokenizer,
)

BUNDLED_DATA = Path(__file__).resolve().parents[1] / "raydistill" / "data" / "bundled"
FAMILIES = ("bert", "roberta", "mpnet")

# Special tokens in the order of the real checkpoints, so pad/cls ids match them (BERT pad 0, RoBERTa/MPNet pad 1).
BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
MPNET_SPECIALS = ["<s>", "<pad>", "</s>", "[UNK]", "<mask>"]


def load_real_sentences(n_captions: int = 1000, n_stsb: int = 1000) -> list[str]:
    """First `n_captions` Flickr30k captions and first `n_stsb` STS-B train sentences, deduplicated, in file order."""
    captions: list[str] = []
    with gzip.open(BUNDLED_DATA / "corpus" / "flickr30k-captions.jsonl.gz", "rt", encoding="utf-8") as f:
        for line in f:
            captions.extend(json.loads(line)["captions"])
            if len(captions) >= n_captions:
                break
    stsb: list[str] = []
    with gzip.open(BUNDLED_DATA / "sts" / "stsb-train.jsonl.gz", "rt", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            stsb.extend([row["sentence1"], row["sentence2"]])
            if len(stsb) >= n_stsb:
                break
    return list(dict.fromkeys(captions[:n_captions] + stsb[:n_stsb]))


def train_wordpiece_vocab(sentences: list[str], specials: list[str], vocab_size: int) -> dict[str, int]:
    """A WordPiece vocabulary built with BERT's own normaliser and pre-tokeniser, so the wrapper splits text the
    same way: the specials, every character seen (alone and as a `##` continuation) and then the most frequent
    words, ties broken alphabetically.

    Not `tokenizers.trainers.WordPieceTrainer`: it breaks ties between equally frequent merges in an order that
    changes from process to process, so every test on a tiny BERT/MPNet saw a slightly different model in each
    session and thin margins flaked (byte-level BPE, below, is stable). Whole words and single characters are
    what a real vocabulary ends in too, and greedy longest-match WordPiece never needs the unknown token on seen text.
    """
    normalizer = normalizers.BertNormalizer(lowercase=True)
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    counts: dict[str, int] = {}
    for sentence in sentences:
        for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(sentence)):
            counts[word] = counts.get(word, 0) + 1
    characters = sorted({c for word in counts for c in word})
    tokens = list(specials) + characters + ["##" + c for c in characters]
    seen = set(tokens)
    for word in sorted(counts, key=lambda w: (-counts[w], w)):
        if len(tokens) >= vocab_size:
            break
        if word not in seen:
            tokens.append(word)
            seen.add(word)
    return {token: index for index, token in enumerate(tokens)}


def train_byte_bpe(
    sentences: list[str], specials: list[str], vocab_size: int
) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Byte-level BPE as GPT-2/RoBERTa use it; returns (vocab, merges) for `RobertaTokenizer(vocab=, merges=)`."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(sentences, trainer)
    model_json = json.loads(tokenizer.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model_json["merges"]]
    return model_json["vocab"], merges


def make_tiny_model(
    family: str,
    out_dir: str | Path,
    sentences: list[str],
    hidden: int = 32,
    layers: int = 2,
    heads: int = 4,
    intermediate: int = 64,
    max_positions: int = 128,
    vocab_size: int = 2000,
    initializer_range: float = 0.2,
    seed: int = 0,
    dropout: float | None = None,
) -> Path:
    """Write a randomly initialised `family` encoder + trained tokenizer to `out_dir`; return the directory.

    `max_positions` is the usable sequence length: RoBERTa and MPNet get `pad_token_id + 1` extra position rows,
    as their real checkpoints do (514 = 512 + 2), because they number positions from `pad_token_id + 1`.

    `initializer_range` is 10x BERT's 0.02 on purpose: at width 32 the standard init makes every input give
    nearly the same output (a fresh cross-encoder head's logits differ by ~1e-5 between pairs), which would
    let ordering and padding bugs hide under test tolerances. At 0.2 outputs differ by ~0.1-1.

    `dropout` (hidden and attention) replaces the family's default: 0.0 makes a training step a function of the
    weights and the batch alone, as a test comparing runs whose random draws differ needs.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if family == "bert":
        vocab = train_wordpiece_vocab(sentences, BERT_SPECIALS, vocab_size)
        tokenizer = BertTokenizer(vocab=vocab, do_lower_case=True)
        config = BertConfig(max_position_embeddings=max_positions, pad_token_id=tokenizer.pad_token_id)
    elif family == "roberta":
        vocab, merges = train_byte_bpe(sentences, ROBERTA_SPECIALS, vocab_size)
        tokenizer = RobertaTokenizer(vocab=vocab, merges=merges)
        config = RobertaConfig(
            max_position_embeddings=max_positions + tokenizer.pad_token_id + 1,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            type_vocab_size=1,
        )
    elif family == "mpnet":
        vocab = train_wordpiece_vocab(sentences, MPNET_SPECIALS, vocab_size)
        tokenizer = MPNetTokenizer(vocab=vocab, do_lower_case=True)
        config = MPNetConfig(
            max_position_embeddings=max_positions + tokenizer.pad_token_id + 1,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            relative_attention_num_buckets=32,
        )
    else:
        raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")

    config.vocab_size = len(tokenizer)
    config.hidden_size = hidden
    config.num_hidden_layers = layers
    config.num_attention_heads = heads
    config.intermediate_size = intermediate
    config.initializer_range = initializer_range
    if dropout is not None:
        config.hidden_dropout_prob = config.attention_probs_dropout_prob = dropout
    tokenizer.model_max_length = max_positions

    torch.manual_seed(seed)
    model = AutoModel.from_config(config)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
