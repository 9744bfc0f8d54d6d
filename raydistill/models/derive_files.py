"""The files a derived student carries over from its source besides the weights (``raydistill.models.derive``).

    copy_tokenizer_files(source, target)                       # the source's tokenizer, unchanged (whole vocabulary)
    copy_sentence_transformers_files(source, target, hidden)   # its pooling recipe, at the student's width
    with quiet_progress_bars(): ...                            # transformers' per-file bars off, then restored
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from pathlib import Path
from typing import Iterator

from raydistill.fileio import atomic_write_json

# Names the default calibration sentences of a derivation: other sentences derive a different checkpoint from the
# same plan, so the model cache's plan carries this name too (registry._derivation_plan).
CALIBRATION_SET = "stsb_train sentences without evaluation text, 512 spread over the file"

__all__ = ["TOKENIZER_FILES", "copy_sentence_transformers_files", "copy_tokenizer_files", "quiet_progress_bars"]

logger = logging.getLogger("raydistill.models.derive")

TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.txt",
    "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model", "tokenizer.model",
)
_SENTENCE_TRANSFORMERS_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json")


def copy_tokenizer_files(source: Path, target: Path) -> None:
    """Every tokenizer file of ``source`` that exists, into ``target``: the student keeps the whole vocabulary."""
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, target / name)


def copy_sentence_transformers_files(source: Path, target: Path, hidden: int) -> None:
    """Keep the source's pooling recipe (e.g. mean pooling) so sentence-transformers loads the student the same way."""
    modules_file = source / "modules.json"
    if not modules_file.is_file():
        return
    modules = json.loads(modules_file.read_text())
    kinds = {m["type"].rsplit(".", 1)[-1] for m in modules}
    if not kinds <= {"Transformer", "Pooling", "Normalize"}:
        logger.info("Not copying sentence-transformers modules %s: only width-free ones can follow a narrower model", kinds)
        return
    for name in _SENTENCE_TRANSFORMERS_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, target / name)
    for module in modules:
        if module["type"].endswith("Pooling") and (source / module["path"] / "config.json").is_file():
            pooling = json.loads((source / module["path"] / "config.json").read_text())
            pooling["word_embedding_dimension"] = hidden
            (target / module["path"]).mkdir(parents=True, exist_ok=True)
            atomic_write_json(target / module["path"] / "config.json", pooling)


@contextlib.contextmanager
def quiet_progress_bars() -> Iterator[None]:
    """Silence transformers' per-file progress bars (derivation logs one INFO line instead), then restore them."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()
