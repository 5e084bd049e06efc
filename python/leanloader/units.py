"""Byte counts for people: the one formatter every report and message uses."""

from __future__ import annotations


def format_bytes(count: float) -> str:
    """'1.5 GiB', '12.0 MiB', '3.0 KiB', '512 B' (binary units, one decimal)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(count) >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count:.0f} B"
