"""Nested dicts as flat ones: ``flatten({"train": {"lr": 1e-4}})`` is ``{"train.lr": 1e-4}``.

Contract: keys become dotted paths (``str`` of each key, joined by ``.``); only mappings are descended into; a list or
any other value is a leaf, kept as it is (not copied, not converted). An empty mapping is a leaf too, so a section set
to ``{}`` differs from one that is absent. Used wherever two configs are compared key by key (config hash, checkpoint
resume, config help, the README's tables) and for MLflow's flat params. ``deep_merge`` lays one nested dict over
another (a stage's settings over its job's)."""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["flatten", "non_finite_numbers", "deep_merge"]


def flatten(nested: Mapping[Any, Any], prefix: str = "") -> dict[str, Any]:
    """``nested`` as ``{dotted path: leaf}``; ``prefix`` goes before every path (``"best."`` gives ``best.train.lr``)."""
    flat: dict[str, Any] = {}
    for key, value in nested.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, path + "."))
        else:
            flat[path] = value
    return flat


def non_finite_numbers(value: Any, path: str = "") -> Iterator[tuple[str, float]]:
    """``(path, number)`` for every NaN or infinity anywhere in nested dicts, lists and tuples: ``a.b[2]`` paths, the
    ones config errors and result-file errors name."""
    if isinstance(value, float) and not math.isfinite(value):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from non_finite_numbers(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from non_finite_numbers(item, f"{path}[{i}]")


def deep_merge(base: Mapping[Any, Any], overrides: Mapping[Any, Any]) -> dict[Any, Any]:
    """A copy of ``base`` with ``overrides`` laid over it: mappings merge key by key, anything else replaces."""
    out = copy.deepcopy(dict(base))
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out
