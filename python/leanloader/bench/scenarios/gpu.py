"""Scenario `gpu`: batches to an NVIDIA GPU, with and without a compute-bound
consumer (issue 13). Needs a CUDA build of torch and a GPU; without one,
`prepare` stops the bench with a message that says so.

Data: a .npy of float32 rows of 1 MiB (full: 2,048 rows = 2 GiB; quick: 256),
batch 32 (32 MiB), shuffled. Every run yields the batch's indices (a small CPU
tensor, for counting) once its GPU work is enqueued and the previous batch's
has finished; the consumer's GPU work reads every byte of the batch (a sum) on
the device.

- ``leanloader-copy``: ``ll.Loader(device="cuda")`` (slots page-locked in
  place, copies on a stream of their own), no compute: host-to-device
  throughput.
- ``leanloader-copy-cores``: the same with a thread per usable core: on a
  GPU machine of many cores, what the loader's copy path reaches when the
  gathering of rows into slots is not held to two threads (the goal's row).
- ``h2d-limit``: ``cudaMemcpyAsync`` from one pinned batch to the GPU (torch's
  ``copy_(non_blocking=True)``), the same bytes per batch and the same
  consumer (a sum): the link's limit.
- ``leanloader``: ``ll.Loader(device="cuda")`` with a compute-bound consumer
  (``STEPS`` matmuls of 4096² per batch on the current stream).
- ``resident``: the same consumer over the same batches already on the GPU
  (copied untimed in ``setup``): the step time without loading.
- ``torch``: ``DataLoader(num_workers=2, pin_memory=True, persistent_workers
  =True)`` over the rows of ``np.load(mmap_mode="r")``, ``.to("cuda",
  non_blocking=True)``, the same consumer.
- ``ll-dataloader``: the same with ``ll.DataLoader`` (batch segments pinned
  in place instead of a pin copy per batch).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from leanloader.bench.scenarios import Goal, LoaderContext, LoaderRun, Scenario

ROW_VALUES = 1 << 18  # float32: 1 MiB
BATCH_SIZE = 32
THREADS = 2
CORES = len(os.sched_getaffinity(0))
STEPS = 4  # matmuls per batch in the compute-bound consumer
MATRIX = 4096


def prepare(data_dir: Path, size: Mapping[str, Any]) -> dict[str, Any]:
    from leanloader import _core

    if _core.cuda_device_count() == 0:
        from leanloader.bench.harness import BenchError

        raise BenchError(
            "bench gpu needs a CUDA device: no NVIDIA GPU is usable here "
            "(libcudart missing or no driver)"
        )
    rows = int(size["rows"])
    folder = Path(data_dir) / f"gpu-{rows}x{ROW_VALUES}-float32"
    path = folder / "rows.npy"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / "rows.partial.npy"
        out = np.lib.format.open_memmap(partial, "w+", np.float32, (rows, ROW_VALUES))
        rng = np.random.default_rng(0)
        for start in range(0, rows, 64):
            out[start : start + 64] = rng.standard_normal(
                (min(64, rows - start), ROW_VALUES), dtype=np.float32
            )
        out.flush()
        del out
        partial.rename(path)
    return {"path": str(path), "rows": rows, "bytes_per_sample": ROW_VALUES * 4}


def _order(context: LoaderContext) -> list[np.ndarray]:
    rows = int(context.data["rows"])
    order = np.random.default_rng(context.seed).permutation(rows)
    return [order[i : i + BATCH_SIZE] for i in range(0, rows, BATCH_SIZE)]


class _Compute:
    """The compute-bound consumer: STEPS matmuls, then a sum of the batch, on
    the current stream. Before a batch is counted, the GPU work of the batch
    before it has finished (an event wait, as a training loop's loss.item()
    would): a run's time is GPU time, not how fast work can be queued (an
    unbounded queue made the copy limit read 1 TB/s on an H100)."""

    def __init__(self, steps: int) -> None:
        import torch

        self.steps = steps
        self.matrix = torch.randn(MATRIX, MATRIX, device="cuda") if steps else None
        self.total = torch.zeros((), device="cuda")
        self.previous: Any = None

    def __call__(self, batch: Any) -> None:
        import torch

        a = self.matrix
        for _ in range(self.steps):
            a = (a @ a) / MATRIX
        self.total += batch.sum()
        done = torch.cuda.Event()
        done.record()
        if self.previous is not None:
            self.previous.synchronize()
        self.previous = done

    def finish(self) -> None:
        import torch

        torch.cuda.synchronize()


def iterate_leanloader(context: LoaderContext) -> Iterator[Any]:
    import torch

    import leanloader as ll

    compute = _Compute(int(context.options.get("steps", STEPS)))
    loader = ll.Loader(ll.NpySource(context.data["path"]), batch_size=BATCH_SIZE, shuffle=True,
                       seed=context.seed, num_threads=int(context.options.get("threads", THREADS)),
                       device="cuda")  # fmt: skip
    try:
        for batch in loader:
            compute(next(iter(batch.values())))
            yield torch.as_tensor(loader.last_indices)
        compute.finish()
    finally:
        loader.close()


def iterate_h2d_limit(context: LoaderContext) -> Iterator[Any]:
    import torch

    compute = _Compute(0)
    pinned = torch.empty((BATCH_SIZE, ROW_VALUES), dtype=torch.float32).pin_memory()
    target = torch.empty_like(pinned, device="cuda")
    for indices in _order(context):
        target[: len(indices)].copy_(pinned[: len(indices)], non_blocking=True)
        compute(target[: len(indices)])
        yield torch.as_tensor(indices)
    compute.finish()


def setup_resident(context: LoaderContext) -> Any:
    import torch

    rows = np.load(context.data["path"], mmap_mode="r")
    return [
        torch.from_numpy(np.ascontiguousarray(rows[np.sort(i)])).cuda() for i in _order(context)
    ]


def iterate_resident(context: LoaderContext) -> Iterator[Any]:
    import torch

    compute = _Compute(STEPS)
    for indices, batch in zip(_order(context), context.prepared, strict=True):
        compute(batch)
        yield torch.as_tensor(indices)
    compute.finish()


class _Rows:
    def __init__(self, path: str) -> None:
        self.path = path
        self.rows = None

    def __len__(self) -> int:
        return len(np.load(self.path, mmap_mode="r"))

    def __getitem__(self, index: int) -> Any:
        if self.rows is None:
            self.rows = np.load(self.path, mmap_mode="r")
        return np.array(self.rows[index]), index


def iterate_torch(context: LoaderContext) -> Iterator[Any]:
    from torch.utils.data import DataLoader

    return _iterate_dataloader(context, DataLoader)


def iterate_dataloader(context: LoaderContext) -> Iterator[Any]:
    import leanloader as ll

    return _iterate_dataloader(context, ll.DataLoader)


def _iterate_dataloader(context: LoaderContext, loader_class: Any) -> Iterator[Any]:
    import torch

    compute = _Compute(STEPS)
    loader = loader_class(_Rows(context.data["path"]), batch_size=BATCH_SIZE, shuffle=True,
                          num_workers=THREADS, pin_memory=True, persistent_workers=True,
                          generator=torch.Generator().manual_seed(context.seed))  # fmt: skip
    try:
        for rows, indices in loader:
            compute(rows.to("cuda", non_blocking=True))
            yield indices
        compute.finish()
    finally:
        del loader


SCENARIO = Scenario(
    name="gpu",
    description="batches to an NVIDIA GPU: copy throughput and a compute-bound consumer",
    sizes={"full": {"rows": 2048}, "quick": {"rows": 256}},
    prepare=prepare,
    loaders=(
        LoaderRun(
            name="leanloader-copy",
            function=iterate_leanloader,
            threads=THREADS,
            imports=("leanloader", "torch"),
            options={"steps": 0},
            label="ll.Loader(device='cuda'), no compute",
        ),
        LoaderRun(
            name="leanloader-copy-cores",
            function=iterate_leanloader,
            threads=CORES,
            imports=("leanloader", "torch"),
            options={"steps": 0, "threads": CORES},
            label=f"ll.Loader(device='cuda'), {CORES} threads, no compute",
        ),
        LoaderRun(
            name="h2d-limit",
            function=iterate_h2d_limit,
            threads=1,
            imports=("torch",),
            label="cudaMemcpyAsync from pinned memory",
        ),
        LoaderRun(
            name="leanloader",
            function=iterate_leanloader,
            threads=THREADS,
            imports=("leanloader", "torch"),
            label=f"ll.Loader(device='cuda'), {STEPS} matmuls per batch",
        ),
        LoaderRun(
            name="resident",
            function=iterate_resident,
            threads=1,
            imports=("torch",),
            setup=setup_resident,
            label="batches already on the GPU, same consumer",
        ),
        LoaderRun(
            name="torch",
            function=iterate_torch,
            threads=THREADS,
            imports=("torch",),
            label="torch DataLoader(pin_memory=True), 2 workers, same consumer",
        ),
        LoaderRun(
            name="ll-dataloader",
            function=iterate_dataloader,
            threads=THREADS,
            imports=("leanloader", "torch"),
            label="ll.DataLoader(pin_memory=True), 2 workers, same consumer",
        ),
    ),
    ratios=(
        ("leanloader-copy", "h2d-limit"),
        ("leanloader-copy-cores", "h2d-limit"),
        ("leanloader", "resident"),
        ("leanloader", "torch"),
        ("ll-dataloader", "torch"),
    ),
    goals=(
        Goal(
            "host-to-device ≥ 90% of cudaMemcpyAsync",
            "samples_per_s",
            at_least=0.9,
            ratio="leanloader-copy-cores/h2d-limit",
        ),
        Goal(
            "compute-bound step time ≤ 1.05× resident data",
            "samples_per_s",
            at_least=1 / 1.05,
            ratio="leanloader/resident",
        ),
    ),
    describe_size=lambda size: (
        f"{int(size['rows'])} rows × 1 MiB float32, batch {BATCH_SIZE}, shuffled; "
        f"compute: {STEPS} matmuls {MATRIX}² per batch"
    ),
)
