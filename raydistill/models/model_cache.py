"""Where models live on this machine, what makes a checkpoint directory usable, and how a cached model is built.

Assembled and derived checkpoints live under ``$RAYDISTILL_HOME/models/<name>`` (default ``~/.cache/raydistill``;
``models_dir``). Each is built in a temporary sibling directory and renamed into place, under a file lock
(``build_cached``), so a crash or a concurrent process never leaves a half-written model where a reader looks. Each
holds ``raydistill_model.json`` (``METADATA_FILE``) with the recipe (``plan``) and the size and SHA-256 of every
file; a cache whose files do not match it, or whose recipe is not the current one, is rebuilt (``cache_problems``).
The local Hugging Face cache (``hub_cache_snapshot``) is only read, never filled. ``RAYDISTILL_HOME``,
``HF_HUB_CACHE`` and ``HF_HOME`` are read at call time. The registry decides which model a name means; this module
only stores and checks (``checkpoint_problems``: config, weights, tokenizer)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

from raydistill.fileio import atomic_write_json, file_sha256, open_lock_file, recover_directory, replace_directory

__all__ = ["METADATA_FILE", "TOKENIZER_FILES", "WEIGHT_FILES", "build_cached", "cache_problems", "checkpoint_problems",
           "hf_hub_cache", "hub_cache_snapshot", "models_dir", "raydistill_home", "read_metadata"]

logger = logging.getLogger(__name__)

METADATA_FILE = "raydistill_model.json"
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model", "tokenizer.model")


def raydistill_home() -> Path:
    return Path(os.environ.get("RAYDISTILL_HOME") or Path.home() / ".cache" / "raydistill").expanduser()


def models_dir() -> Path:
    return raydistill_home() / "models"


def hf_hub_cache() -> Path:
    """The local Hugging Face cache, resolved from the environment now (huggingface_hub freezes it at import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    hf_home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    return Path(hf_home).expanduser() / "hub"


def hub_cache_snapshot(repo_id: str) -> Path | None:
    """The snapshot directory of `repo_id` in the local HF cache when it holds a usable checkpoint, else None."""
    from huggingface_hub import try_to_load_from_cache

    cache_dir = hf_hub_cache()
    if not cache_dir.is_dir():
        return None
    config = try_to_load_from_cache(repo_id, "config.json", cache_dir=cache_dir)
    if not isinstance(config, str):  # None, or the "known not to exist" sentinel
        return None
    snapshot = Path(config).parent
    return snapshot if not checkpoint_problems(snapshot) else None


# --------------------------------------------------------------------------------------------------- validation


def _transformer_dir(path: Path) -> Path:
    """Where the transformer of a checkpoint lives: `path`, or the Transformer module folder of an older
    sentence-transformers layout (modules.json pointing at e.g. `0_Transformer/`)."""
    try:
        modules = json.loads((path / "modules.json").read_text())
        first = modules[0]
        if str(first.get("type", "")).endswith("Transformer") and first.get("path"):
            return path / first["path"]
    except (OSError, ValueError, LookupError, AttributeError):
        pass
    return path


def checkpoint_problems(path: Path) -> list[str]:
    """What keeps `path` from being a loadable HF checkpoint directory (empty list: nothing)."""
    if not path.is_dir():
        return [f"{path} is not a directory"]
    path = _transformer_dir(path)
    problems = []
    if not (path / "config.json").is_file():
        problems.append("no config.json")
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        problems.append(f"no weights (one of {', '.join(WEIGHT_FILES)})")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        problems.append(f"no tokenizer (one of {', '.join(TOKENIZER_FILES)})")
    return problems


def _file_manifest(directory: Path) -> dict[str, dict[str, Any]]:
    return {str(p.relative_to(directory)): {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
            for p in sorted(directory.rglob("*")) if p.is_file() and p.name != METADATA_FILE}


def read_json(path: Path) -> Any:
    """The JSON in ``path``; invalid JSON is a ValueError naming the file and line."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}:{error.lineno}: invalid JSON: {error.msg}") from None


def read_metadata(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads((Path(path) / METADATA_FILE).read_text())
    except (OSError, ValueError):
        return None


def cache_problems(path: Path, plan: dict[str, Any] | None = None, *, full_hash: bool = False) -> list[str]:
    """Why the cached model at `path` cannot be reused (empty list: it can).

    Checks the recorded recipe against `plan` and every recorded file's size; `full_hash` also re-hashes every file
    (about 1.5 s per 400 MB), which catches bit rot as well as the truncation and partial copies sizes catch."""
    if not path.is_dir():
        return ["not built"]
    metadata = read_metadata(path)
    if metadata is None or not isinstance(metadata.get("files"), dict):
        return [f"{METADATA_FILE} missing or unreadable (an interrupted or foreign build)"]
    problems = []
    if plan is not None and metadata.get("plan") != plan:
        problems.append(f"built with recipe {metadata.get('plan')}, current recipe is {plan}")
    for relpath, expected in metadata["files"].items():
        file = path / relpath
        if not file.is_file():
            problems.append(f"{relpath} missing")
        elif file.stat().st_size != expected["bytes"]:
            problems.append(f"{relpath} has {file.stat().st_size} bytes, expected {expected['bytes']}")
        elif full_hash and file_sha256(file) != expected["sha256"]:
            problems.append(f"{relpath} has a different SHA-256 than recorded")
    return problems + [f"checkpoint: {p}" for p in checkpoint_problems(path)]


@contextlib.contextmanager
def _build_lock(target: Path) -> Iterator[None]:
    """Serialise builders of one cached model across processes (Ray actors may resolve the same preset at once)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = open_lock_file(target.parent / f".{target.name}.lock")  # no symlink followed, nothing truncated
    try:
        with contextlib.suppress(ImportError):  # no fcntl (Windows): the atomic rename still keeps readers safe
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def build_cached(name: str, plan: dict[str, Any], build: Callable[[Path], dict[str, Any]]) -> Path:
    """`$RAYDISTILL_HOME/models/<name>`, built by `build(tmp_dir) -> metadata` unless a valid build is there.

    The build happens in a temporary sibling directory renamed into place only once complete and recorded, so the
    target is either absent, the old build, or the new complete one."""
    target = models_dir() / name
    with _build_lock(target):
        recover_directory(target)  # a builder that died between the swap's two renames left the old build aside
        problems = cache_problems(target, plan)
        if not problems:
            return target
        if target.exists():
            logger.warning("Rebuilding cached model %s: %s", target, "; ".join(problems))
        tmp_dir = Path(tempfile.mkdtemp(prefix=f".{name}.building-", dir=target.parent))
        umask = os.umask(0)
        os.umask(umask)
        tmp_dir.chmod(0o777 & ~umask)  # mkdtemp makes it private; the finished model is an ordinary directory
        try:
            metadata = build(tmp_dir)
            for file in tmp_dir.rglob("*"):  # some writers create private files; a cache is shared like the dir
                file.chmod((0o777 if file.is_dir() else 0o666) & ~umask)
            metadata = {**metadata, "plan": plan, "files": _file_manifest(tmp_dir)}
            atomic_write_json(tmp_dir / METADATA_FILE, metadata)
            replace_directory(tmp_dir, target)
        finally:
            shutil.rmtree(tmp_dir, ignore_errors=True)
    logger.info("Cached model %s ready at %s", name, target)
    return target
