"""The copy-and-read yardstick: what any loader could reach with this consumer.

The memcpy yardstick (``_core.measure_memcpy_bandwidth``) times copying
alone, with nothing else on the cores. In a bench the consumer reads every
byte of every batch on the same cores, so even a loader that did nothing but
one memcpy per batch would reach only part of it. This row measures that
loader: ``threads`` Python threads, each copying whole batches from an array
in RAM with one copy (``_core.copy_as_batch_slot``: the stores leanloader
fills a slot of that size with, streaming for large batches; without the
GIL) into buffers the consumer hands back, and the bench's own consumer
reading them. No sampling,
no rows, no storage: the hardware's share for batch assembly with this
consumer, against which a loader's own per-sample costs show.
"""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from leanloader import _core
from leanloader.bench.scenarios import LoaderContext, LoaderRun

# The source cycles through this much RAM, well above any CPU cache, so the
# copies read memory as a loader's do.
SOURCE_BYTES = 256 << 20


def source_array(
    batch_shape: tuple[int, ...], dtype: Any, total_bytes: int = SOURCE_BYTES
) -> np.ndarray:
    """Whole batches of `batch_shape` filling `total_bytes` (at least two),
    every page written: batch k holds the bytes k % 251."""
    batch_bytes = int(np.prod(batch_shape)) * np.dtype(dtype).itemsize
    count = max(2, total_bytes // batch_bytes)
    source = np.empty((count, *batch_shape), dtype=dtype)
    for number in range(count):
        source[number].reshape(-1).view(np.uint8)[:] = number % 251
    return source


def copied_batches(
    source: np.ndarray, batches: int, threads: int, output: str = "numpy"
) -> Iterator[Any]:
    """`batches` batches, each one copy of a batch of `source` by one of
    `threads` threads, at most two batches in flight per thread.

    A batch's buffer is reused once the consumer asked for the next batch,
    as a loader's slots are.
    """
    free: queue.Queue[np.ndarray] = queue.Queue()
    for _ in range(2 * threads + 1):
        buffer = np.empty(source.shape[1:], dtype=source.dtype)
        buffer.reshape(-1).view(np.uint8)[:] = 0  # pages faulted before timing
        free.put(buffer)
    ready: queue.Queue[np.ndarray | None] = queue.Queue()
    stop = threading.Event()

    def copy(first: int) -> None:
        for number in range(first, batches, threads):
            buffer = free.get()
            if stop.is_set():
                break
            _core.copy_as_batch_slot(buffer, source[number % len(source)])
            ready.put(buffer)
        ready.put(None)

    workers = [threading.Thread(target=copy, args=(t,), daemon=True) for t in range(threads)]
    for worker in workers:
        worker.start()
    wrap = _wrapper(output)
    try:
        finished = 0
        while finished < threads:
            buffer = ready.get()
            if buffer is None:
                finished += 1
                continue
            yield wrap(buffer)
            free.put(buffer)
    finally:
        stop.set()
        for _ in workers:
            free.put(np.empty(0, dtype=source.dtype))  # wakes a copier waiting for a buffer
        for worker in workers:
            worker.join()


def _wrapper(output: str) -> Any:
    if output == "torch":
        import torch

        return torch.from_numpy
    return lambda array: array


def copy_and_read_run(
    *,
    batch_shape: tuple[int, ...],
    dtype: Any,
    batches_per_epoch: Callable[[Mapping[str, Any]], int],
    threads: int,
    output: str,
    batch_label: str,
) -> LoaderRun:
    """The yardstick as a scenario's run, keyed "copy-and-read": batches of
    `batch_shape` from a source made untimed (the run's setup),
    `batches_per_epoch(size)` of them each epoch."""
    return LoaderRun(
        name="copy-and-read",
        function=functools.partial(_iterate, batches_per_epoch, threads),
        setup=functools.partial(_source, batch_shape, dtype),
        threads=threads,
        imports=("torch",) if output == "torch" else (),
        options={"output": output},
        label=f"yardstick: {threads} threads copy whole {batch_label} batches from RAM "
        "(no loader), the consumer reads them",
    )


def _source(batch_shape: tuple[int, ...], dtype: Any, context: LoaderContext) -> np.ndarray:
    return source_array(batch_shape, dtype)


def _iterate(
    batches_per_epoch: Callable[[Mapping[str, Any]], int], threads: int, context: LoaderContext
) -> Iterator[Any]:
    batches = batches_per_epoch(context.size)
    for _epoch in range(int(context.size["epochs"])):
        yield from copied_batches(context.prepared, batches, threads, context.options["output"])
