"""The runtime knobs' old spelling: ``extra.max_restarts``, ``extra.learner_timeout_s``, ``extra.log_every`` and
``extra.storage_path`` are read from ``runtime:`` now.

A config that still sets them under ``extra`` loads: ``_move_runtime_knobs`` moves each to ``runtime.<key>`` (with
its line) and ``_warn_moved`` shows one ``ConfigDeprecationWarning`` per key, attributed to the config file and line.
Setting a knob both ways with different values is a ``ConfigError``, unless the ``extra`` spelling came from
``--set`` or ``runtime`` holds only the default. Code reads them from ``cfg.runtime`` only.
"""

from __future__ import annotations

import warnings
from typing import Any

from raydistill.config.schema import ConfigError, line_of, where
from raydistill.config.sections import RuntimeConfig


class ConfigDeprecationWarning(FutureWarning):
    """A config spelling that still loads but has moved (shown by default: it is meant for the person running)."""


#: Keys that used to live under ``extra`` and moved to ``runtime``.
RUNTIME_KNOBS = ("max_restarts", "learner_timeout_s", "log_every", "storage_path")


def _move_runtime_knobs(d: dict[str, Any], source: str | None, lines: dict[str, int]) -> dict[str, Any]:
    """``extra.<knob>`` of an older config moved to ``runtime.<knob>``, with one deprecation line per key."""
    extra = d.get("extra")
    if not isinstance(extra, dict) or not any(key in extra for key in RUNTIME_KNOBS):
        return d
    d = dict(d)
    extra = dict(extra)
    runtime = d.get("runtime")
    runtime = dict(runtime) if isinstance(runtime, dict) else ({} if runtime is None else runtime)
    if not isinstance(runtime, dict):
        return d  # the schema says what is wrong with runtime
    moved = {}
    for key in RUNTIME_KNOBS:
        if key not in extra:
            continue
        value = extra.pop(key)
        if key in runtime and runtime[key] != value and not _later_spelling_wins(key, runtime[key], lines):
            raise ConfigError(where(source, lines, f"extra.{key}") + f"moved to runtime.{key}, which this config "
                              f"also sets ({runtime[key]!r}); keep runtime.{key} only")
        runtime[key] = value
        moved[key] = value
        if f"extra.{key}" in lines:
            lines[f"runtime.{key}"] = lines[f"extra.{key}"]
    d["extra"], d["runtime"] = extra, runtime
    _warn_moved(moved, source, lines)
    return d


def _later_spelling_wins(key: str, in_runtime: Any, lines: dict[str, int]) -> bool:
    """Whether ``extra.<key>`` may replace what ``runtime.<key>`` holds: it came from the command line (``--set``
    overrides the file, as for any field), or ``runtime`` only holds the default (a saved config's ``to_dict``).
    Both written in the file, or given as data with different values, are a conflict."""
    if lines.get(f"extra.{key}") == 0:
        return True
    default = RuntimeConfig.__pydantic_fields__[key].get_default()
    return f"runtime.{key}" not in lines and in_runtime == default


def _warn_moved(moved: dict[str, Any], source: str | None, lines: dict[str, int]) -> None:
    for key in moved:
        line = line_of(lines, f"extra.{key}")
        message = (f"extra.{key} is deprecated: it moved to runtime.{key}; write it there (the old spelling still "
                   "loads)")
        # Attributed to the config file and line (not to this module), so the warning points where to edit.
        warnings.warn_explicit(("--set " if line == 0 else "") + message, ConfigDeprecationWarning,
                               filename=source or "<config>", lineno=line or 0, module="raydistill.config")
