"""A description of the machine a benchmark ran on, for its report."""

from __future__ import annotations

import importlib.metadata
import os
import platform
from typing import Any


def describe_machine() -> dict[str, Any]:
    """CPU model, cores, memory, kernel and the versions that shape results.

    Versions come from package metadata, so torch is not imported here."""
    return {
        "cpu_model": _cpu_model(),
        "cpu_cores": os.cpu_count(),
        "cpu_cores_usable": len(os.sched_getaffinity(0)),
        "memory_total_bytes": _memory_total_bytes(),
        "kernel": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "numpy": _version("numpy"),
        "torch": _version("torch"),
        "leanloader": _leanloader_version(),
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_total_bytes() -> int | None:
    from leanloader import _core

    try:
        snapshot = _core.memory_snapshot(os.getpid(), False, "", False)
    except OSError:
        return None
    return int(snapshot["system"]["mem_total_bytes"])


def _leanloader_version() -> str:
    import leanloader

    return leanloader.__version__


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
