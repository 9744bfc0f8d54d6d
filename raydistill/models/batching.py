"""Plumbing shared by `BiEncoder` and `CrossEncoder`: local checkpoints, length limits, batched inference.

Inference follows sentence-transformers' recipe: sort inputs by length so each batch pads to a similar length
(padding a 10-token sentence to 120 tokens costs 12x the compute for nothing), run every batch under
`torch.inference_mode()` in eval mode, and write each batch's rows back at their input positions. The pieces
live here so the two encoders cannot drift apart."""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from raydistill.fileio import atomic_write_json
from raydistill.models.model_cache import METADATA_FILE, read_json

# Families whose position ids start at `pad_token_id + 1` (fairseq heritage): a checkpoint with 514 position
# rows takes 512 tokens, and feeding 514 raises an index error deep inside the embedding layer.
POSITIONS_AFTER_PADDING = {"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "mpnet", "longformer",
                           "data2vec-text"}

# `model_max_length` of a tokenizer saved without one (transformers' VERY_LARGE_INTEGER is ~1e30).
UNSET_TOKENIZER_LENGTH = 1_000_000


# ----------------------------------------------------------------------------------------------------------------
# Checkpoints


def resolve_checkpoint(name_or_path: str | Path) -> Path:
    """A local checkpoint directory for a directory path or a registry name (``registry.resolve_model``: validated
    directories, presets, the local Hugging Face cache); never touches the network."""
    try:
        from raydistill.models.registry import resolve_model
    except ModuleNotFoundError as error:
        if error.name != "raydistill.models.registry":
            raise
        path = Path(name_or_path).expanduser()
        if path.is_dir():
            return path
        raise FileNotFoundError(
            f"model {str(name_or_path)!r}: no such directory, and raydistill.models.registry (which resolves "
            "preset names) is not available; pass a local checkpoint directory") from None
    return Path(resolve_model(str(name_or_path)))


def config_error(path: Path, field: str, message: str) -> ValueError:
    """`ValueError("<file>:<line>: field '<field>': <message>")`, the project's format for bad input files.

    The line is where the key first appears in the file (1 when it is absent), so an editor jumps to it."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        lines = []
    line = next((number for number, text in enumerate(lines, start=1) if f'"{field}"' in text), 1)
    return ValueError(f"{path}:{line}: field '{field}': {message}")


def read_metadata(directory: Path) -> dict[str, Any]:
    """The directory's `raydistill_model.json` (derivation info from the registry, earlier saves), or `{}`."""
    path = directory / METADATA_FILE
    if not path.is_file():
        return {}
    metadata = read_json(path)
    if not isinstance(metadata, dict):
        raise ValueError(f"{path}:1: expected a JSON object, got {type(metadata).__name__}")
    return metadata


def write_metadata(directory: Path, inherited: dict[str, Any], encoder: dict[str, Any]) -> None:
    """Keep what the source checkpoint recorded (e.g. how it was derived) and describe this encoder under 'encoder'.

    The registry's 'files' manifest (size and SHA-256 of each file of a cached build) is dropped: it describes the
    source directory's files, and would make this directory look corrupt to anything that checks it."""
    from raydistill import __version__

    kept = {key: value for key, value in inherited.items() if key != "files"}
    atomic_write_json(directory / METADATA_FILE, {**kept, "encoder": encoder, "raydistill_version": __version__},
                      sort_keys=True)


def usable_max_length(config, tokenizer, requested: int | None, source: Path) -> int:
    """Tokens per input: `requested`, else the tokenizer's limit, never more than the position table holds."""
    position_limit = getattr(config, "max_position_embeddings", None)
    if position_limit is not None and position_limit > 0:
        if config.model_type in POSITIONS_AFTER_PADDING:
            position_limit -= (config.pad_token_id or 0) + 1
    else:
        position_limit = None
    if requested is not None:
        if requested < 2:
            raise ValueError(f"max_length must be >= 2 (room for the special tokens), got {requested}")
        if position_limit is not None and requested > position_limit:
            raise config_error(source / "config.json", "max_position_embeddings",
                               f"max_length={requested} exceeds the {position_limit} positions this "
                               f"{config.model_type} model has")
        return requested
    candidates = [position_limit] if position_limit is not None else []
    if 0 < tokenizer.model_max_length < UNSET_TOKENIZER_LENGTH:
        candidates.append(int(tokenizer.model_max_length))
    if not candidates:
        raise ValueError(f"{source}: neither the tokenizer nor config.json gives a maximum length; pass max_length")
    return min(candidates)


def masked_mean(token_states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``token_states`` [B, T, H] over the positions where ``mask`` [B, T] is set -> [B, H] (0 where none)."""
    weights = mask.unsqueeze(-1).to(token_states.dtype)  # [B, T, 1]
    return (token_states * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)  # [B, H]


def forward_input_names(model: nn.Module) -> frozenset[str]:
    """Tokenizer outputs the model's forward accepts (RoBERTa/MPNet tokenizers may emit token_type_ids they reject)."""
    return frozenset(inspect.signature(model.forward).parameters) & {"input_ids", "attention_mask", "token_type_ids"}


def check_texts(texts: Sequence[str], what: str = "texts") -> list[str]:
    """A list of strings, or a TypeError naming the first bad item (a bare string would be split into characters)."""
    if isinstance(texts, str):
        raise TypeError(f"{what} must be a list of strings, got one string; wrap it as [text]")
    texts = list(texts)
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"{what}[{index}] must be a string, got {type(text).__name__}")
    return texts


# ----------------------------------------------------------------------------------------------------------------
# Batched inference


def length_sorted_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Input indices grouped into batches of similar length, longest first.

    Longest first (as sentence-transformers does) makes the first batch the peak-memory one, so an
    out-of-memory error happens at once rather than after minutes of work. The sort is stable, so equal
    lengths keep input order and the batching is deterministic."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


def token_budget_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Input indices in length-sorted groups (longest first) of at most ``max_tokens`` padded tokens each.

    A group holds as many inputs as fit when each is padded to the group's longest: 32 inputs of 32 tokens or
    100 of 10 for ``max_tokens=1024``. Every group gets at least one input, however long. Stable sort, so the
    grouping is deterministic."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    groups: list[list[int]] = []
    current: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if current and (len(current) + 1) * max(1, lengths[current[0]]) > max_tokens:
            groups.append(current)
            current = []
        current.append(index)
    if current:
        groups.append(current)
    return groups


# Padded tokens per sub-batch of a CPU training forward (``bucketed_forward``): on 2 cores, whole bf16 ConGen steps
# (both views in one call) of minilm-l3 and bert-mini were fastest at 2048 (against 1024, 1536, 3072); smaller groups
# lose to the overhead of small matrix products. GPUs are not short of parallel work: they take the batch whole.
CPU_TRAIN_BUCKET_TOKENS = 2048


def bucketed_forward(model: nn.Module, features: dict[str, torch.Tensor], max_tokens: int | None) -> torch.Tensor:
    """``model(features)`` for one right-padded batch, run as length-sorted sub-batches without most of the padding.

    A batch padded to its longest input spends most of its matrix products on padding when lengths vary (Flickr
    captions: half the tokens of a batch of 128). Here the rows are grouped by real length
    (``token_budget_batches``), each group is cut to its own longest input and run through ``model``, and the
    outputs are put back in input order (gradients flow to every group). Rows do not interact in a transformer
    encoder with pooling, so the result is the batch's own (up to float rounding; with dropout on, other random
    masks). ``max_tokens`` None, a batch that fits, or left padding run as one call.

    When ``model`` has a Hugging Face ``transformer`` (``BiEncoder``) with a dense-gradient word embedding, the word
    embeddings are looked up ONCE for the whole batch and the groups get ``inputs_embeds``: one lookup per group would
    give the vocabulary-sized embedding matrix one dense gradient per group (measured 6 % of a minilm-l3 step with 9
    groups). With sparse embedding gradients (``speedups.use_reused_embedding_grad``, the CPU learner's) each group
    looks up its own trimmed ids: no lookup of padding, and no [B, T, H] split and concatenation in the backward."""
    mask = features["attention_mask"]
    rows, width = mask.shape
    left_padded = getattr(getattr(model, "tokenizer", None), "padding_side", "right") == "left"
    if not max_tokens or left_padded or rows <= 1 or rows * width <= max_tokens:
        return model(features)
    lengths = mask.sum(dim=1).tolist()
    groups = token_budget_batches(lengths, max_tokens)
    if len(groups) == 1:
        return model(features)
    order = torch.as_tensor([i for group in groups for i in group], device=mask.device)
    sizes = [len(group) for group in groups]
    tokens = {name: value.index_select(0, order).split(sizes) for name, value in features.items() if value.dim() == 2}
    transformer = getattr(model, "transformer", None)
    embeddings = transformer.get_input_embeddings() if hasattr(transformer, "get_input_embeddings") else None
    if "input_ids" in tokens and isinstance(embeddings, nn.Embedding) and not embeddings.sparse:
        # split (not indexing) so the backward concatenates the groups' gradients instead of zero-filling per group
        tokens["inputs_embeds"] = embeddings(features["input_ids"].index_select(0, order)).split(sizes)
        del tokens["input_ids"]
    outputs = []
    for position, group in enumerate(groups):
        longest = max(1, int(lengths[group[0]]))
        outputs.append(model({name: chunks[position][:, :longest] for name, chunks in tokens.items()}))
    return torch.cat(outputs).index_select(0, torch.argsort(order))


@contextmanager
def torch_threads(num_threads: int | None) -> Iterator[None]:
    """Use `num_threads` intra-op threads for the block, then restore the previous count.

    Teacher and learner actors share a few cores; each caller says how many it may use for one call
    without changing the process-wide setting that other code relies on."""
    if num_threads is None:
        yield
        return
    if num_threads < 1:
        raise ValueError(f"num_threads must be >= 1 or None, got {num_threads}")
    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@contextmanager
def inference(module: nn.Module) -> Iterator[None]:
    """Eval mode (no dropout) and no autograd for the block; the previous train/eval mode comes back after.

    Restoring the mode matters because `encode` is called from inside training loops (dev evaluation,
    SCT's reference pass helpers): leaving the student in eval mode would silently switch dropout off."""
    # Per submodule, not `module.train(was_training)`: that would also flip submodules that were deliberately
    # in the other mode (a frozen, eval-mode transformer inside a training wrapper).
    previous_modes = [(submodule, submodule.training) for submodule in module.modules()]
    module.eval()
    try:
        with torch.inference_mode():
            yield
    finally:
        for submodule, was_training in previous_modes:
            submodule.training = was_training
