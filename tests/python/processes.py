"""Helpers the tests share for watching other processes."""

from __future__ import annotations

import time
from collections.abc import Iterable


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


def wait_gone(pids: Iterable[int], seconds: float = 5.0) -> bool:
    """Whether every process of `pids` is gone within `seconds` (polled: a
    process killed a moment ago may take a while to be reaped)."""
    pids = list(pids)
    deadline = time.monotonic() + seconds
    while any(alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
