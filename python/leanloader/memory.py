"""Memory of a process tree, the system, its cgroup and the GPUs.

The readings come from the C++ `MemoryMonitor` (include/leanloader/memory_monitor.h):
`/proc/PID/smaps_rollup` per process, `/proc/meminfo`, the process's memory
cgroup (v2, v1 fallback; the tightest limit on the path to the root) and NVML
when the NVIDIA driver is present.

PSS divides each shared page among the processes that map it, so totals are
sums of PSS-based figures and count a shared page once; RSS counts it in every
process. "Unreclaimable" memory is ``pss_anon_bytes + pss_shmem_bytes``;
``pss_file_bytes`` is page cache (memory-mapped files) the kernel can drop.
"""

from __future__ import annotations

import os
from typing import Any

from leanloader import _core

__all__ = ["BYTE_KEYS", "memory_report", "process_tree_memory"]

#: Per-process and total byte counts, in report order.
BYTE_KEYS: tuple[str, ...] = (
    "rss_bytes",
    "pss_bytes",
    "pss_anon_bytes",
    "pss_file_bytes",
    "pss_shmem_bytes",
    "uss_bytes",
    "swap_bytes",
)


def memory_report(
    pid: int | None = None, tree: bool = True, *, gpu: bool = True, root: str = ""
) -> dict[str, Any]:
    """Memory of ``pid`` (default: this process) and, with ``tree``, its descendants.

    Returns ``{"processes": [{"pid", "name", <BYTE_KEYS>}], "total": {<BYTE_KEYS>},
    "system": {"mem_total_bytes", "mem_available_bytes"}, "cgroup":
    {"memory_max_bytes", "memory_current_bytes"} or None, "gpu": [...] or None}``.
    ``cgroup["memory_max_bytes"]`` is None when no level of the cgroup path is
    limited; ``gpu`` is None without NVML (no NVIDIA driver), else one dict per
    GPU (``index, name, total_bytes, used_bytes, free_bytes, memory_info_supported``).
    ``root`` prefixes every /proc and /sys path (tests use fake trees).
    Raises FileNotFoundError when ``pid`` does not exist.
    """
    snapshot = _core.memory_snapshot(os.getpid() if pid is None else int(pid), tree, root, gpu)
    processes = [
        {"pid": p["pid"], "name": p["name"], **{key: p[key] for key in BYTE_KEYS}}
        for p in snapshot["processes"]
    ]
    cgroup = snapshot["cgroup"]
    return {
        "processes": processes,
        "total": {key: snapshot["total"][key] for key in BYTE_KEYS},
        "system": {
            "mem_total_bytes": snapshot["system"]["mem_total_bytes"],
            "mem_available_bytes": snapshot["system"]["mem_available_bytes"],
        },
        "cgroup": None
        if cgroup is None
        else {
            "memory_max_bytes": cgroup["memory_max_bytes"],
            "memory_current_bytes": cgroup["memory_current_bytes"],
        },
        "gpu": snapshot["gpu"],
    }


def process_tree_memory(pid: int | None = None) -> dict[str, int]:
    """Summed bytes over ``pid`` (default: this process) and its descendants, cheap
    enough to sample every 50 ms: BYTE_KEYS plus ``unreclaimable_bytes`` and
    ``num_processes`` (0 when the process is gone)."""
    return _core.process_tree_memory(os.getpid() if pid is None else int(pid))
