"""The training-memory estimator of seed 001, as Python functions.

The model lives in C++ (`leanloader::Planner`, include/leanloader/planner.h);
these functions mirror the seed's three (`calculateBatchDefaults`,
`estimateVRAMUsage`, `calculateRegularizationMemoryCost`) and add
`plan_memory`, the full breakdown the `leanloader estimate` command prints.

Figures are GB as the seed writes them; where bytes are converted,
1 GB = 2**30 bytes.
"""

from __future__ import annotations

import os
import platform
import sys
from typing import Any

from leanloader import _core

__all__ = [
    "ARCHITECTURES",
    "PLAN_KEYS",
    "batch_defaults",
    "estimate_memory",
    "machine_memory",
    "parse_memory",
    "plan_memory",
    "regularization_cost",
]

#: Architecture names as the CLI spells them, in seed 001's order.
ARCHITECTURES: tuple[str, ...] = tuple(a["name"] for a in _core.model_architectures())

#: The keys of `leanloader estimate --json`, in order.
PLAN_KEYS: tuple[str, ...] = (
    "unified",
    "total_memory_gb",
    "model_gb",
    "optimizer_gb",
    "ema_gb",
    "dop_gb",
    "workers_gb",
    "os_reserve_gb",
    "reserved_gb",
    "available_for_batches_gb",
    "per_sample_gb",
    "max_batch_size",
    "initial_batch_size",
    "recommended_workers",
)

_GIB = 1 << 30


def _request(
    *,
    unified: bool,
    workers: int | None,
    ema: bool,
    dop: bool,
    gradient_checkpointing: bool,
    quantization: str | None,
    training: str,
    rank: int | None,
    trainable_params: int | None,
    host_memory_gb: float | None,
    cpu_count: int | None,
) -> dict[str, Any]:
    return {
        "unified": bool(unified),
        "workers": workers,
        "ema": bool(ema),
        "diff_output_preservation": bool(dop),
        "gradient_checkpointing": bool(gradient_checkpointing),
        "quantization": quantization or "none",
        "training": training or "seed",
        "lora_rank": int(rank or 0),
        "trainable_params": int(trainable_params or 0),
        "host_memory_gb": float(host_memory_gb or 0.0),
        "cpu_count": int(cpu_count or 0),
    }


def parse_memory(size: str | float | int) -> float:
    """GB from ``120``, ``"120GB"``, ``"96GiB"``, ``"512MB"`` or ``"1.5TB"`` (binary units)."""
    if isinstance(size, (int, float)) and not isinstance(size, bool):
        if size < 0:
            raise ValueError(f"memory size must be >= 0 GB, got {size}")
        return float(size)
    return _core.parse_memory_size_gb(str(size))


def machine_memory() -> dict[str, Any]:
    """What this machine offers, cgroup-aware.

    Returns ``total_gb`` (min(MemTotal, cgroup memory.max)), ``available_gb``
    (min(MemAvailable, cgroup headroom)), ``unified`` and ``unified_reason``
    (LEANLOADER_UNIFIED_MEMORY, a Tegra device tree, an NVML GPU without its
    own memory such as GB10, a Grace superchip, or Apple Silicon), ``gpus``
    (NVML, or None without the driver) and ``cpu_count`` (CPUs this process may run on).
    """
    unified, reason = _core.detect_unified_memory()
    if not unified and sys.platform == "darwin" and platform.machine() == "arm64":
        unified, reason = True, "Apple Silicon shares one memory pool"
    try:
        cpu_count = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpu_count = os.cpu_count() or 0
    return {
        "total_gb": _core.total_memory_bytes() / _GIB,
        "available_gb": _core.available_memory_bytes() / _GIB,
        "unified": unified,
        "unified_reason": reason,
        "gpus": _core.gpu_memory(),
        "cpu_count": cpu_count,
    }


def plan_memory(
    model: str,
    resolution: int,
    memory: str | float = "auto",
    *,
    unified: bool | None = None,
    workers: int | None = None,
    ema: bool = False,
    dop: bool = False,
    gradient_checkpointing: bool = False,
    quantization: str | None = None,
    training: str = "seed",
    rank: int | None = None,
    trainable_params: int | None = None,
    host_memory_gb: float | None = None,
    cpu_count: int | None = None,
) -> dict[str, Any]:
    """Seed 001's full estimate: the keys of `PLAN_KEYS` plus ``workers``,
    ``gradient_checkpointing_savings_gb`` (<= 0, included in ``reserved_gb``),
    ``trainable_params`` and ``advice`` (the "Optimizing for this system" list:
    dicts with ``action``, ``saves_gb``, ``detail``).

    ``memory`` is the unified pool (``unified=True``) or the GPU's VRAM, as GB
    or a size string; ``"auto"`` reads the machine: the cgroup-aware total for
    a unified pool, GPU 0's memory through NVML otherwise. ``unified=None``
    means: detect (only meaningful with ``memory="auto"``; otherwise discrete).
    ``training="lora"`` with ``rank`` or ``trainable_params=N`` sizes optimizer
    and EMA from the parameters actually trained instead of the seed's 2x the
    whole model. Raises ValueError for bad input and RuntimeError when "auto"
    finds no GPU memory to read on a discrete machine.
    """
    machine = None
    if isinstance(memory, str) and memory.strip().lower() == "auto":
        machine = machine_memory()
        if unified is None:
            unified = machine["unified"]
        if unified:
            total_gb = machine["total_gb"]
        else:
            gpus = [g for g in (machine["gpus"] or []) if g["total_bytes"] > 0]
            if not gpus:
                raise RuntimeError(
                    "--memory auto: no GPU memory to read (NVML unavailable or no GPU); "
                    "pass the VRAM size, or --unified for a unified-memory machine"
                )
            total_gb = gpus[0]["total_bytes"] / _GIB
    else:
        total_gb = parse_memory(memory)
    unified = bool(unified)
    if not unified and (host_memory_gb is None or cpu_count is None):
        # Discrete GPUs: workers live in host RAM; the seed sizes them by it.
        machine = machine or machine_memory()
        host_memory_gb = machine["total_gb"] if host_memory_gb is None else host_memory_gb
        cpu_count = machine["cpu_count"] if cpu_count is None else cpu_count
    return _core.plan_memory(
        model,
        int(resolution),
        float(total_gb),
        **_request(
            unified=unified,
            workers=workers,
            ema=ema,
            dop=dop,
            gradient_checkpointing=gradient_checkpointing,
            quantization=quantization,
            training=training,
            rank=rank,
            trainable_params=trainable_params,
            host_memory_gb=host_memory_gb,
            cpu_count=cpu_count,
        ),
    )


def batch_defaults(
    memory_gb: float | str,
    resolution: int,
    model: str = "flux",
    workers: int | None = None,
    *,
    unified: bool = False,
    ema: bool = False,
    dop: bool = False,
    gradient_checkpointing: bool = False,
    quantization: str | None = None,
    training: str = "seed",
    rank: int | None = None,
    trainable_params: int | None = None,
) -> dict[str, Any]:
    """Seed 001's ``calculateBatchDefaults``: ``{"batch_size", "auto_scale_batch_size",
    "min_batch_size", "max_batch_size", "batch_size_warmup_steps"}``.

    ``memory_gb`` is the unified pool or the GPU's VRAM; ``workers=None`` uses the
    seed's recommendation for that much unified memory.
    """
    return _core.batch_defaults(
        model,
        int(resolution),
        parse_memory(memory_gb),
        **_request(
            unified=unified,
            workers=workers,
            ema=ema,
            dop=dop,
            gradient_checkpointing=gradient_checkpointing,
            quantization=quantization,
            training=training,
            rank=rank,
            trainable_params=trainable_params,
            host_memory_gb=None,
            cpu_count=None,
        ),
    )


def estimate_memory(
    model: str,
    resolution: int,
    batch_size: int,
    quantization: str | None = None,
    gradient_checkpointing: bool = False,
    unified: bool = False,
    workers: int = 4,
    ema: bool = False,
    dop: bool = False,
    *,
    training: str = "seed",
    rank: int | None = None,
    trainable_params: int | None = None,
) -> float:
    """Seed 001's ``estimateVRAMUsage`` (same argument order): GB for ``batch_size``
    samples = reserved memory + batch_size x resolution**2 / 1024**2 x 4 GB.

    Unified memory adds the workers (8 GB each) and the OS reserve (8 GB) to the
    pool; a discrete GPU's figure is what its VRAM must hold.
    """
    return _core.estimate_memory_gb(
        int(batch_size),
        model,
        int(resolution),
        0.0,
        **_request(
            unified=unified,
            workers=workers,
            ema=ema,
            dop=dop,
            gradient_checkpointing=gradient_checkpointing,
            quantization=quantization,
            training=training,
            rank=rank,
            trainable_params=trainable_params,
            host_memory_gb=None,
            cpu_count=None,
        ),
    )


def regularization_cost(
    model: str, ema: bool, dop: bool, gradient_checkpointing: bool
) -> dict[str, float]:
    """Seed 001's ``calculateRegularizationMemoryCost``: GB for each option,
    ``{"ema_gb", "diff_output_preservation_gb", "gradient_checkpointing_savings_gb"}``
    (savings negative: 30% of the architecture's weights figure)."""
    return _core.regularization_cost(model, bool(ema), bool(dop), bool(gradient_checkpointing))
