"""The files raydistill ships inside the package: job configs and tune search spaces.

They are package data (``raydistill/configs/*.yaml``; the source tree's top-level ``tune_spaces/*.yaml``, linked
from ``raydistill/tune_spaces`` and copied into a wheel), located through ``importlib.resources`` so that
an installed wheel finds them the same way a checkout does: a user who ran ``pip install raydistill`` has no source
tree to point at.

    shipped_config("congen")        # -> .../raydistill/configs/congen.yaml
    resolve_config("congen-gpu")    # a shipped name, or any path to a YAML file the user wrote
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

__all__ = ["configs_dir", "tune_spaces_dir", "shipped_config", "shipped_config_names", "resolve_config"]


def _package_dir(name: str) -> Path:
    # A regular (non-zip) install is all setuptools produces, so the traversable is a real directory; Path() of it
    # keeps every caller's Path arithmetic working.
    return Path(str(resources.files("raydistill").joinpath(name)))


def configs_dir() -> Path:
    """The shipped job configs."""
    return _package_dir("configs")


def tune_spaces_dir() -> Path:
    """The shipped tune search spaces (in a checkout, ``raydistill/tune_spaces`` links to the top-level folder)."""
    return _package_dir("tune_spaces")


def shipped_config_names() -> list[str]:
    """``congen``, ``congen-gpu``, ... : the stems of the shipped job configs."""
    return sorted(p.stem for p in configs_dir().glob("*.yaml"))


def shipped_config(name: str) -> Path:
    """The shipped config ``<name>.yaml`` (``name`` with or without ``.yaml``); it may not exist."""
    stem = name[: -len(".yaml")] if name.endswith(".yaml") else name
    return configs_dir() / f"{stem}.yaml"


def resolve_config(value: str | os.PathLike) -> Path:
    """``--config`` as a user gives it: an existing file wins; otherwise a bare name such as ``congen-gpu`` (no
    directory part) means the shipped config of that name. Anything else is returned unchanged, so the config
    loader reports the missing file with its own "did you mean" hint."""
    path = Path(value).expanduser()
    if path.is_file():
        return path
    if path.parent == Path(".") and shipped_config(path.name).is_file():
        return shipped_config(path.name)
    return path
