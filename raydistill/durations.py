"""How long something takes, written for a person: ``format_duration(4000.0) == "1h06m"``, and read back from one:
``parse_duration("1h30m") == 5400.0``.

Contract: ``format_duration`` writes whole seconds below a minute ("42s"), minutes and seconds below an hour
("3m05s"), hours and minutes above ("1h06m"); a value that is not finite (an ETA with no rate yet) is "?". Every
progress line's ETA uses it. ``parse_duration`` reads seconds from a number or from ``h``/``m``/``s`` parts
("90m", "3h", "1h30m", "45s") and refuses anything else, or a duration that is not > 0, with ValueError;
``exact_duration`` writes seconds back in that form without rounding ("1h30m", "1m30s"), so a parsed value keeps
one spelling (a config hash does not depend on how the user wrote it)."""

from __future__ import annotations

import math
import re
from typing import Any

__all__ = ["exact_duration", "format_duration", "parse_duration"]


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


def parse_duration(value: Any) -> float:
    """Seconds from ``3600``, ``"90m"``, ``"3h"``, ``"1h30m"``, ``"45s"``; raises ValueError otherwise."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        text = str(value).strip().lower()
        match = re.fullmatch(r"(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?", text)
        if not text or not match or not any(match.groups()):
            raise ValueError(f"expected a duration such as 3600, 90m, 3h or 1h30m, got {value!r}")
        hours, minutes, secs = (float(g) if g else 0.0 for g in match.groups())
        seconds = hours * 3600 + minutes * 60 + secs
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"a duration must be > 0, got {value!r}")
    return seconds


def exact_duration(seconds: float) -> str:
    """``seconds`` as ``parse_duration`` reads it, nothing rounded away: 5400 -> "1h30m", 90 -> "1m30s"."""
    hours, rest = divmod(float(seconds), 3600.0)
    minutes, secs = divmod(rest, 60.0)
    parts = [f"{int(hours)}h" if hours else "", f"{int(minutes)}m" if minutes else "",
             f"{secs:g}s" if secs or not (hours or minutes) else ""]
    return "".join(parts)
