"""The peer loaders of issue 26, each configured once, as its documentation
composes a loader: a scenario gives them its samples (or a gather function
over a list of indices) and reads their batches.

Every peer gets the same work as leanloader: a shuffle per epoch, batches of
the scenario's size, ``threads`` loading threads and a few batches prefetched.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

Gather = Callable[[list[int]], Any]


def work(context: Any, batch_size: int, threads: int) -> dict[str, int]:
    """The work a scenario gives every peer: its batch size and thread
    count, and the run's shuffling seed and epochs (keyword arguments of the
    functions below)."""
    return {
        "batch_size": batch_size,
        "threads": threads,
        "seed": context.seed,
        "epochs": int(context.size["epochs"]),
    }


def spdl_batches(
    size: int, gather: Gather, *, batch_size: int, threads: int, seed: int, epochs: int
) -> Iterator[Any]:
    """SPDL's pipeline: shuffled indices aggregated into batches, each batch
    gathered in `threads` threads, two batches buffered at the sink."""
    from spdl.pipeline import PipelineBuilder

    order = np.random.default_rng(seed)
    for _epoch in range(epochs):
        pipeline = (
            PipelineBuilder()
            .add_source(order.permutation(size).tolist())
            .aggregate(batch_size)
            .pipe(gather, concurrency=threads)
            .add_sink(2)
            .build(num_threads=threads)
        )
        with pipeline.auto_stop():
            yield from pipeline


def grain_batches(
    source: Sequence[Any],
    *,
    batch_size: int,
    threads: int,
    seed: int,
    epochs: int,
    batch_fn: Callable[[Sequence[Any]], Any] | None = None,
) -> Iterator[Any]:
    """Grain's MapDataset pipeline: a random-access source, a global shuffle,
    batches made by `batch_fn` (Grain's default stacks NumPy arrays, one copy
    per row), read by `threads` threads with a few batches prefetched (its
    default buffer, 500 elements, would be 500 batches)."""
    import grain

    for epoch in range(epochs):
        batched = grain.MapDataset.source(source).shuffle(seed=seed + epoch)
        batched = (
            batched.batch(batch_size)
            if batch_fn is None
            else batched.batch(batch_size, batch_fn=batch_fn)
        )
        yield from batched.to_iter_dataset(
            grain.ReadOptions(num_threads=threads, prefetch_buffer_size=2 * threads)
        )


def torchdata_batches(
    size: int, gather: Gather, *, batch_size: int, threads: int, seed: int, epochs: int
) -> Iterator[Any]:
    """torchdata.nodes: a sampler, its indices batched, each batch gathered in
    a thread pool (in order), a prefetcher; the Loader restarts the graph each
    epoch (a new shuffle)."""
    import torch
    import torchdata.nodes as nodes
    from torch.utils.data import RandomSampler

    sampler = RandomSampler(range(size), generator=torch.Generator().manual_seed(seed))
    node = nodes.Batcher(nodes.SamplerWrapper(sampler), batch_size=batch_size, drop_last=False)
    node = nodes.ParallelMapper(node, map_fn=gather, num_workers=threads, method="thread")
    loader = nodes.Loader(nodes.Prefetcher(node, prefetch_factor=2))
    for _epoch in range(epochs):
        yield from loader
