"""Memory of a process tree, the system, its cgroup and the GPUs.

The readings come from the C++ `MemoryMonitor` (include/leanloader/memory_monitor.h):
`/proc/PID/smaps_rollup` per process, `/proc/meminfo`, the process's memory
cgroup (v2, v1 fallback; the tightest limit on the path to the root) and NVML
when the NVIDIA driver is present.

PSS divides each shared page among the processes that map it, so totals are
sums of PSS-based figures and count a shared page once; RSS counts it in every
process. "Unreclaimable" memory is ``pss_anon_bytes + pss_shmem_bytes +
fd_shmem_bytes``: ``fd_shmem_bytes`` is shared memory the tree holds open by
file descriptor (unlinked /dev/shm files, memfds: batch and dataset segments of
``ll.DataLoader``, torch's shared tensors) and does not map, which smaps cannot
see. Each such file is counted once across the tree, by its allocated size,
less the Pss of its mappings that Pss_Shmem already counts.
``pss_file_bytes`` is page cache (memory-mapped files) the kernel can drop.
"""

from __future__ import annotations

import os
from typing import Any

from leanloader import _core

__all__ = ["BYTE_KEYS", "TOTAL_KEYS", "memory_report", "process_tree_memory"]

#: Totals of a report beyond BYTE_KEYS.
TOTAL_KEYS: tuple[str, ...] = ("fd_shmem_bytes", "unreclaimable_bytes")

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

    Returns ``{"processes": [{"pid", "name", <BYTE_KEYS>}], "total": {<BYTE_KEYS>,
    "fd_shmem_bytes", "unreclaimable_bytes"}, "shared_files": {"num_files",
    "held_bytes", "mapped_bytes", "unmapped_bytes", "owners": [{"pid", "name",
    "num_files", "held_bytes", "unmapped_bytes"}]}, "system": {"mem_total_bytes",
    "mem_available_bytes"}, "cgroup":
    {"memory_max_bytes", "memory_current_bytes"} or None, "gpu": [...] or None}``.
    ``cgroup["memory_max_bytes"]`` is None when no level of the cgroup path is
    limited; ``gpu`` is None without NVML (no NVIDIA driver), else one dict per
    GPU (``index, name, total_bytes, used_bytes, free_bytes, memory_info_supported,
    processes``: ``[{"pid", "used_bytes"}]`` from NVML's compute and graphics
    lists, ``used_bytes`` None where the driver gives no figure). Each process
    and the total have ``gpu_bytes``: GPU memory summed over the GPUs (None
    without NVML, or where a figure is missing).
    ``shared_files`` is the shared memory held by the tree's descriptors, each
    file once, attributed to the first process holding it (its "owner"):
    ``mapped_bytes`` of it are in ``pss_shmem_bytes``, the rest is
    ``total["fd_shmem_bytes"]``.
    ``root`` prefixes every /proc and /sys path (tests use fake trees).
    Raises FileNotFoundError when ``pid`` does not exist.
    """
    snapshot = _core.memory_snapshot(os.getpid() if pid is None else int(pid), tree, root, gpu)
    processes = [
        {"pid": p["pid"], "name": p["name"], **{key: p[key] for key in BYTE_KEYS},
         "gpu_bytes": p["gpu_bytes"]}
        for p in snapshot["processes"]
    ]  # fmt: skip
    cgroup = snapshot["cgroup"]
    return {
        "processes": processes,
        "total": {key: snapshot["total"][key] for key in (*BYTE_KEYS, *TOTAL_KEYS, "gpu_bytes")},
        "shared_files": snapshot["shared_files"],
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
    enough to sample every 50 ms: BYTE_KEYS plus ``fd_shmem_bytes`` (shared memory
    held by descriptors and not mapped), ``unreclaimable_bytes`` (= pss_anon +
    pss_shmem + fd_shmem) and ``num_processes`` (0 when the process is gone)."""
    return _core.process_tree_memory(os.getpid() if pid is None else int(pid))
