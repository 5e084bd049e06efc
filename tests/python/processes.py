"""Helpers the tests share for watching other processes."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence


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


def run_to_the_end(command: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """subprocess.run in a session of its own whose every process is killed
    at `timeout` (subprocess.run kills the child only, then waits for the
    output pipes that its children, hung worker processes, keep open)."""
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as child:  # fmt: skip
        try:
            stdout, stderr = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            stdout, stderr = child.communicate()
            raise AssertionError(
                f"{command} did not end within {timeout} s (hung):\n{stdout}\n{stderr[-3000:]}"
            ) from None
    return subprocess.CompletedProcess(command, child.returncode, stdout, stderr)
