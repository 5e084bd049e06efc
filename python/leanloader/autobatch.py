"""AutoBatch: shrink the batch on out-of-memory, retry the same data, grow back.

Seed 001's "Auto-Scaling Recovery": detect an OOM, reduce the batch size by
25%, retry the training step, and increase it again once training has been
stable for ``warmup_steps`` steps.

`AutoBatch` runs ``step_fn`` on micro-batches of at most ``size`` samples
that together cover the batch it is given, in order, each sample once (as in
gradient accumulation). When ``step_fn`` raises an out-of-memory error the
same micro-batch is retried at 75% of the size; no sample is skipped or
repeated in a successful call. After ``warmup_steps`` successful calls in a
row the size grows by 25% (at least 1), up to ``max_size``; if that size runs
out of memory again it shrinks again.

Out of memory means ``torch.OutOfMemoryError`` (``torch.cuda.OutOfMemoryError``
is the same class), ``MemoryError``, or a ``RuntimeError`` whose message says
"out of memory" (the MPS backend and older PyTorch raise those). torch is not
imported by this module; if it is loaded, its CUDA cache is emptied after an
OOM so the retry sees the freed memory.
"""

from __future__ import annotations

import gc
import math
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["AutoBatch"]


def _is_out_of_memory(error: BaseException) -> bool:
    if isinstance(error, MemoryError):
        return True
    torch = sys.modules.get("torch")
    oom_type = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    if oom_type is not None and isinstance(error, oom_type):
        return True
    return isinstance(error, RuntimeError) and "out of memory" in str(error).lower()


def _release_cached_memory() -> None:
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _length(batch: Any) -> int:
    if isinstance(batch, Mapping):
        lengths = {_length(value) for value in batch.values()}
        if len(lengths) != 1:
            raise ValueError(f"AutoBatch: the batch's fields differ in length: {sorted(lengths)}")
        return lengths.pop()
    if hasattr(batch, "shape") and len(batch.shape) > 0:
        return int(batch.shape[0])
    return len(batch)


def _slice(batch: Any, start: int, stop: int) -> Any:
    if isinstance(batch, Mapping):
        return type(batch)({key: _slice(value, start, stop) for key, value in batch.items()})
    return batch[start:stop]


class AutoBatch:
    """Call ``step_fn`` on micro-batches of an adaptive size.

    ``auto = AutoBatch(step_fn, start=8)``; then ``auto(batch)`` for each batch
    (a tensor, array, list or a dict of them, samples along the first axis)
    returns the list of ``step_fn`` results, one per micro-batch. ``auto.size``
    is the current micro-batch size, ``auto.oom_count`` the number of
    out-of-memory errors recovered from.

    Raises the out-of-memory error when it happens at ``min_size``, and any
    other error from ``step_fn`` unchanged. Not thread-safe.
    """

    def __init__(
        self,
        step_fn: Callable[[Any], Any],
        start: int,
        min_size: int = 1,
        max_size: int | None = None,
        warmup_steps: int = 100,
    ) -> None:
        if min_size < 1:
            raise ValueError(f"min_size must be >= 1, got {min_size}")
        if max_size is not None and max_size < min_size:
            raise ValueError(f"max_size ({max_size}) must be >= min_size ({min_size})")
        if start < min_size or (max_size is not None and start > max_size):
            raise ValueError(
                f"start ({start}) must be in [min_size, max_size] = [{min_size}, {max_size}]"
            )
        if warmup_steps < 1:
            raise ValueError(f"warmup_steps must be >= 1, got {warmup_steps}")
        self.step_fn = step_fn
        self.size = int(start)
        self.min_size = int(min_size)
        self.max_size = None if max_size is None else int(max_size)
        self.warmup_steps = int(warmup_steps)
        self.oom_count = 0
        self.stable_steps = 0  # successful step_fn calls since the last change of size

    def shrink(self) -> bool:
        """Reduce the size by 25% (at least 1, not below min_size); False when at min_size."""
        if self.size <= self.min_size:
            return False
        self.size = max(self.min_size, min(self.size - 1, math.floor(self.size * 0.75)))
        self.stable_steps = 0
        return True

    def _grow(self) -> None:
        grown = max(self.size + 1, math.floor(self.size * 1.25))
        if self.max_size is not None:
            grown = min(grown, self.max_size)
        if grown != self.size:
            self.size = grown
        self.stable_steps = 0

    def __call__(self, batch: Any) -> list[Any]:
        total = _length(batch)
        results = []
        position = 0
        while position < total:
            stop = min(total, position + self.size)
            out_of_memory = False
            try:
                results.append(self.step_fn(_slice(batch, position, stop)))
            except Exception as error:
                if not _is_out_of_memory(error) or not self.shrink():
                    raise
                self.oom_count += 1
                out_of_memory = True
            if out_of_memory:
                # Outside the except block, so the traceback's frames (and the
                # tensors they hold) are gone before the cache is emptied.
                _release_cached_memory()
                continue  # the same samples again, in smaller pieces
            position = stop
            self.stable_steps += 1
            if self.stable_steps >= self.warmup_steps:
                self._grow()
        return results

    step = __call__

    def __repr__(self) -> str:
        return (
            f"AutoBatch(size={self.size}, min_size={self.min_size}, max_size={self.max_size}, "
            f"warmup_steps={self.warmup_steps}, oom_count={self.oom_count})"
        )
