"""Checks of arguments and saved values that the engine takes as integers."""

from __future__ import annotations

import operator
from typing import Any


def integer(what: str, value: Any) -> int:
    """`value` as an int (a NumPy integer too), else a TypeError naming the
    argument (the binding's listed its whole signature)."""
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an int, got a bool ({value})")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int, got {type(value).__name__} {value!r}") from None
