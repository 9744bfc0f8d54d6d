"""How long something takes, written for a person: ``format_duration(4000.0) == "1h06m"``.

Contract: whole seconds below a minute ("42s"), minutes and seconds below an hour ("3m05s"), hours and minutes
above ("1h06m"); a value that is not finite (an ETA with no rate yet) is "?". Every progress line's ETA uses it.
"""

from __future__ import annotations

import math

__all__ = ["format_duration"]


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"
