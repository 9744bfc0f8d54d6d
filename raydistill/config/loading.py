"""Reading a config file: YAML with the line of every key, ``--set key.path=value`` overrides, and building a
``@section`` from plain data with the section aliases folded in.

``load_yaml_with_overrides(path, overrides)`` returns the file's mapping with the overrides applied and
``{dotted key: line}`` (0 for a key set on the command line), which ``schema.where`` turns into ``<file>:<line>:``
prefixes; a missing file, bad YAML, a non-mapping top level or a malformed override raise the given error naming
the file, line or override. ``_SECTION_ALIASES`` are nested spellings of one field (``resources.data.max_cpus`` is
``resources.data_max_cpus``; both with different values is an error). Shared by the job, Trans-Encoder and Tune
configs.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any

import yaml

from raydistill.config.schema import ConfigError, build, where

_SECTION_ALIASES = {
    # runtime.md writes the Data cap as a nested block; both spellings load into data_max_cpus.
    ("resources", "data"): ("max_cpus", "data_max_cpus"),
}


def read_yaml(path: Path, error: type[Exception]) -> tuple[Any, dict[str, int]]:
    """``(data, {dotted key: line})`` of a YAML file; a syntax error raises ``error`` naming the file and line."""
    text = path.read_text(encoding="utf-8")
    try:
        return yaml.safe_load(text), _yaml_key_lines(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise error(f"{path}{line}: not valid YAML: {getattr(err, 'problem', err)}") from None


def load_yaml_with_overrides(path: str | os.PathLike, overrides: list[str] | None, *, nearby_hint: bool = False,
                             error: type[ConfigError] = ConfigError) -> tuple[dict[str, Any], dict[str, int]]:
    """A config file's mapping with ``key.path=value`` overrides applied, and its ``{dotted key: line}`` (0: the
    command line)."""
    path = Path(path)
    if not path.is_file():
        hint = ""
        if nearby_hint and path.parent.is_dir():
            siblings = sorted(p.name for p in path.parent.glob("*.y*ml"))
            close = difflib.get_close_matches(path.name, siblings, n=1)
            hint = f"; did you mean {path.parent / close[0]}?" if close else (
                f"; files there: {', '.join(siblings)}" if siblings else "")
        raise error(f"config file not found: {path}{hint}")
    data, lines = read_yaml(path, error)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise error(f"{path}:1: a config file must be a mapping of fields, got {type(data).__name__}")
    apply_overrides(data, lines, overrides or [])
    return data, lines


def apply_overrides(data: dict[str, Any], lines: dict[str, int], overrides: list[str]) -> None:
    """``key.path=value`` overrides into ``data`` (values parsed as YAML), their lines marked 0 (the command line)."""
    for item in overrides:
        key, value = _parse_override(item)
        _set_path(data, key, value, item)
        lines[key] = 0  # 0 = came from the command line, see where()


# ----------------------------------------------------------------------------------------------------------------
# Building (the schema library does the checking; this adds the section aliases)


def _build(cls: type, data: dict[str, Any], prefix: str, source: str | None, lines: dict[str, int]):
    """``cls`` (a ``@section``) from ``data``, with the spellings of ``_SECTION_ALIASES`` folded in first."""
    data = _fold_aliases(data, prefix, source, lines)
    return build(cls, data, source=source, lines=lines, prefix=prefix)


def _fold_aliases(data: dict[str, Any], prefix: str, source: str | None, lines: dict[str, int]) -> dict[str, Any]:
    if not isinstance(data, dict):
        return data
    data = dict(data)
    for (section_name, alias_key), (inner, target) in _SECTION_ALIASES.items():
        if not isinstance(data.get(section_name), dict) or not isinstance(data[section_name].get(alias_key), dict):
            continue
        block_owner = dict(data[section_name])
        block = block_owner.pop(alias_key)
        path = f"{prefix}{section_name}."
        for key in block:
            if key != inner:
                raise ConfigError(where(source, lines, f"{path}{alias_key}.{key}") + f"unknown field; allowed: {inner}")
        if inner in block:
            if target in block_owner and block_owner[target] != block[inner]:
                raise ConfigError(where(source, lines, f"{path}{target}") + f"given twice, also as "
                                  f"{path}{alias_key}.{inner}; keep one")
            block_owner[target] = block[inner]
        data[section_name] = block_owner
    return data


def _parse_override(item: str) -> tuple[str, Any]:
    if "=" not in item:
        raise ConfigError(f"--set {item}: expected key.path=value, e.g. train.lr=1e-4")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*", key):
        raise ConfigError(f"--set {item}: {key!r} is not a dotted field path")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return key, value


def _set_path(data: dict, key: str, value: Any, item: str) -> None:
    for (owner, alias_key), (inner, target) in _SECTION_ALIASES.items():
        if key == f"{owner}.{alias_key}.{inner}":
            key = f"{owner}.{target}"
        if key == f"{owner}.{target}":  # an override of the field replaces the alias spelling in the file
            block = data.get(owner, {}).get(alias_key) if isinstance(data.get(owner), dict) else None
            if isinstance(block, dict):
                block.pop(inner, None)
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"--set {item}: '{part}' is not a section")
        node = child
    node[parts[-1]] = value


def _yaml_key_lines(text: str) -> dict[str, int]:
    """Dotted key path -> 1-based line, from the YAML node tree (safe_load drops positions)."""
    lines: dict[str, int] = {}

    def walk(node, prefix: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if isinstance(key_node, yaml.ScalarNode):
                    path = f"{prefix}{key_node.value}"
                    lines[path] = key_node.start_mark.line + 1
                    walk(value_node, path + ".")

    root = yaml.compose(text, Loader=yaml.SafeLoader)
    if root is not None:
        walk(root, "")
    # resources.data.max_cpus is an alias of resources.data_max_cpus
    if "resources.data.max_cpus" in lines:
        lines.setdefault("resources.data_max_cpus", lines["resources.data.max_cpus"])
    return lines
