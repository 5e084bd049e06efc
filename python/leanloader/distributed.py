"""Rank and world size for sharded loading, and loader state as a plain dict.

The ranks never talk to each other: each one computes its share of an epoch
from (seed, epoch, rank, world size) alone. The process group (or the
environment) is read once, when a loader is built.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from leanloader import _core

STATE_KEYS = (
    "version",
    "epoch",
    "samples_consumed",
    "seed",
    "shuffle",
    "batch_size",
    "drop_last",
    "world_size",
    "num_samples",
    "source_fingerprint",
)


def _from_process_group() -> tuple[int, int] | None:
    torch = sys.modules.get("torch")  # only a process group someone started counts
    if torch is None:
        return None
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist.get_rank(), dist.get_world_size()


def _from_environment() -> tuple[int, int] | None:
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is None and world is None:
        return None
    try:
        return int(rank if rank is not None else 0), int(world if world is not None else 1)
    except ValueError as error:
        raise ValueError(
            f"RANK={rank!r} / WORLD_SIZE={world!r} in the environment are not integers"
        ) from error


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)``: the arguments where given, else the initialised
    ``torch.distributed`` process group, else ``RANK``/``WORLD_SIZE``, else ``(0, 1)``."""
    if rank is None or world_size is None:
        found = _from_process_group() or _from_environment() or (0, 1)
        rank = found[0] if rank is None else rank
        world_size = found[1] if world_size is None else world_size
    for name, value in (("rank", rank), ("world_size", world_size)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {value!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world_size {world_size} (0 .. {world_size - 1})")
    return rank, world_size


def state_to_dict(state: Any) -> dict[str, Any]:
    return {
        "version": state.version,
        "epoch": state.epoch,
        "samples_consumed": state.position,
        "seed": state.seed,
        "shuffle": state.shuffle,
        "batch_size": state.batch_size,
        "drop_last": state.drop_last,
        "world_size": state.world_size,
        "num_samples": state.size,
        "source_fingerprint": state.fingerprint,
    }


def state_from_dict(data: dict[str, Any]) -> Any:
    if not isinstance(data, dict):
        raise TypeError(f"a loader state is a dict from state_dict(), got {type(data).__name__}")
    missing = [key for key in STATE_KEYS if key not in data]
    if missing:
        raise ValueError(
            f"loader state lacks {', '.join(missing)}; expected a dict from state_dict()"
        )
    state = _core.LoaderState()
    try:
        state.version = int(data["version"])
        state.epoch = int(data["epoch"])
        state.position = int(data["samples_consumed"])
        state.seed = int(data["seed"])
        state.shuffle = bool(data["shuffle"])
        state.batch_size = int(data["batch_size"])
        state.drop_last = bool(data["drop_last"])
        state.world_size = int(data["world_size"])
        state.size = int(data["num_samples"])
        state.fingerprint = str(data["source_fingerprint"])
    except (TypeError, ValueError, OverflowError) as error:
        raise ValueError(f"malformed loader state: {error}") from error
    return state
