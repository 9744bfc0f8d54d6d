"""Nested dicts as flat ones: ``flatten({"train": {"lr": 1e-4}})`` is ``{"train.lr": 1e-4}``.

Contract: keys become dotted paths (``str`` of each key, joined by ``.``); only mappings are descended into; a list or
any other value is a leaf, kept as it is (not copied, not converted). An empty mapping is a leaf too, so a section set
to ``{}`` differs from one that is absent. Used wherever two configs are compared key by key (config hash, checkpoint
resume, config help, the README's tables) and for MLflow's flat params.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["flatten"]


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
