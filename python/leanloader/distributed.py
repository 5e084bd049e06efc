"""Rank and world size for sharded loading, and loader state as a plain dict.

The ranks never talk to each other: each one computes its share of an epoch
from (seed, epoch, rank, world size) alone. The process group (or the
environment) is read once, when a loader is built.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

from leanloader import _core
from leanloader.arguments import integer

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
    rank, world_size = integer("rank", rank), integer("world_size", world_size)
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
    state.version = _state_int(data, "version")
    state.epoch = _state_int(data, "epoch")
    state.position = _state_int(data, "samples_consumed")
    state.seed = _state_int(data, "seed")
    state.shuffle = _state_bool(data, "shuffle")
    state.batch_size = _state_int(data, "batch_size", least=1)
    state.drop_last = _state_bool(data, "drop_last")
    state.world_size = _state_int(data, "world_size", least=1)
    state.size = _state_int(data, "num_samples")
    if not isinstance(data["source_fingerprint"], str):
        raise ValueError(
            "malformed loader state: source_fingerprint must be a str, "
            f"got {type(data['source_fingerprint']).__name__}"
        )
    state.fingerprint = data["source_fingerprint"]
    return state


def _state_int(data: dict[str, Any], key: str, least: int = 0) -> int:
    """data[key] as an unsigned 64-bit int: an int (NumPy's too), not a float,
    a str or a bool, that a state_dict() could have written."""
    try:
        value = integer(key, data[key])
    except TypeError as error:
        raise ValueError(f"malformed loader state: {error}") from None
    if not least <= value < 1 << 64:
        raise ValueError(f"malformed loader state: {key} = {value} is out of range")
    return value


def _state_bool(data: dict[str, Any], key: str) -> bool:
    value = data[key]
    if not isinstance(value, bool | np.bool_):
        raise ValueError(
            f"malformed loader state: {key} must be a bool, got {type(value).__name__} {value!r}"
        )
    return bool(value)
