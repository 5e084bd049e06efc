"""Helpers the tests share for watching other processes."""

from __future__ import annotations


def alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie. A process that exits
    while its /proc entry is read (open succeeds, read fails with ESRCH) is
    gone too."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return fields.rsplit(") ", 1)[1][0] != "Z"
