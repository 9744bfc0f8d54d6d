"""The runtime knobs' old spelling: ``extra.max_restarts``, ``extra.learner_timeout_s``, ``extra.log_every`` and
``extra.storage_path`` are read from ``runtime:`` now.

A config that still sets them under ``extra`` loads: ``_move_runtime_knobs`` moves each to ``runtime.<key>`` (with
its line, for error messages) and ``_warn_moved`` shows one ``ConfigDeprecationWarning`` per key, attributed to the
config file and line. Setting a knob both ways with different values is a ``ConfigError``, unless the ``extra``
spelling came from ``--set`` or ``runtime`` holds only the default. ``MethodSettings`` (``cfg.extra``) still answers
``get``/``[]``/``in`` of a knob from ``runtime``, for readers written when the knobs lived under ``extra``.
``raydistill.config.job`` re-exports ``ConfigDeprecationWarning``, ``RUNTIME_KNOBS`` and ``MethodSettings``.
"""

from __future__ import annotations

import warnings
from typing import Any

from raydistill.config.schema import ConfigError, line_of, where
from raydistill.config.sections import RuntimeConfig


class ConfigDeprecationWarning(FutureWarning):
    """A config spelling that still loads but has moved (shown by default: it is meant for the person running)."""


_MISSING = object()

#: Keys that used to live under ``extra`` and moved to ``runtime``.
RUNTIME_KNOBS = ("max_restarts", "learner_timeout_s", "log_every", "storage_path")


class MethodSettings(dict):
    """``extra``: the method's own settings, as a plain mapping (its schema is the method's ``extra_settings``).

    ``get``/``[]``/``in`` of a runtime knob (``max_restarts``, ...) answer from ``runtime``, for readers written
    when the knobs lived here; iterating, ``to_dict`` and the hash see only the method's settings."""

    def __init__(self, *args, runtime: "RuntimeConfig | None" = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._runtime = runtime

    def _knob(self, key: Any) -> Any:
        runtime = getattr(self, "_runtime", None)
        if runtime is not None and key in RUNTIME_KNOBS and not dict.__contains__(self, key):
            return getattr(runtime, key)
        return _MISSING

    def get(self, key: Any, default: Any = None) -> Any:
        value = self._knob(key)
        if value is _MISSING or value is None:
            return dict.get(self, key, default)
        return value

    def __getitem__(self, key: Any) -> Any:
        value = self._knob(key)
        if value is _MISSING or value is None:
            return dict.__getitem__(self, key)
        return value

    def __contains__(self, key: object) -> bool:
        value = self._knob(key)
        return dict.__contains__(self, key) if value is _MISSING or value is None else True

    def __bool__(self) -> bool:
        # ``(cfg.extra or {}).get("storage_path")`` must see a storage path set under runtime: true while a knob
        # differs from its default (at its default, ``{}`` answers the same).
        runtime = getattr(self, "_runtime", None)
        return dict.__len__(self) > 0 or (runtime is not None and any(
            getattr(runtime, key) != RuntimeConfig.__pydantic_fields__[key].get_default() for key in RUNTIME_KNOBS))

    def __reduce__(self):
        return (_method_settings, (dict(self), getattr(self, "_runtime", None)))


def _method_settings(items: dict, runtime: "RuntimeConfig | None") -> MethodSettings:
    return MethodSettings(items, runtime=runtime)


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
