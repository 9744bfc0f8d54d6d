"""argparse ``type=`` checks shared by the command lines (``raydistill``, ``raydistill serve``): each turns a bad
value into argparse's own one-line usage error."""

from __future__ import annotations

import argparse
from typing import Callable

__all__ = ["non_negative_float", "non_negative_int", "positive_float", "positive_int"]


def _checked(name: str, convert: Callable[[str], float], accepts: Callable[[float], bool], expected: str):
    """A ``type=`` function: ``convert(text)``, refused unless ``accepts`` it (an int's value shown, a float's text)."""
    def check(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not accepts(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {value if convert is int else text}")
        return value
    check.__name__ = check.__qualname__ = name
    return check


positive_int = _checked("positive_int", int, lambda value: value > 0, "a positive integer")
non_negative_int = _checked("non_negative_int", int, lambda value: value >= 0, "an integer >= 0")
positive_float = _checked("positive_float", float, lambda value: value > 0, "a number > 0")
non_negative_float = _checked("non_negative_float", float, lambda value: value >= 0, "a number >= 0")
