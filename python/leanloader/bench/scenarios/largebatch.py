"""Scenario `largebatch`: seed 004's own workload through the DataLoader drop-in.

The seed's Dataset, unchanged: h5py session files opened lazily in
``__getitem__`` (one 9 MB float32 fMRI trial and its 425×425×3 stimulus image
per item), batch 32 (≈ 300 MB per batch), shuffled. The same files as
``bench hdf5`` (generated with h5py, one chunk per trial, uncompressed).

- ``leanloader-N``: ``ll.DataLoader`` with N worker processes, started as
  by default (forkserver: workers fork from a server that preloaded torch,
  numpy and the dataset's module, and share those pages); batches written
  into shared-memory segments sample by sample and wrapped without a copy.
- ``leanloader-spawn-N``: the same with ``multiprocessing_context="spawn"``
  (each worker imports its own torch).
- ``leanloader-thread-N``: ``ll.DataLoader(worker_mode="thread")``: N native
  threads call ``__getitem__`` in this process.
- ``torch-fork-N`` / ``torch-spawn-N``: ``torch.utils.data.DataLoader`` with
  N workers under fork (Python 3.11's default on Linux) and spawn (seed
  003's fix, and the default from Python 3.14 on is forkserver, which pays
  the same start-up).

All runs: N = 2 and 4, persistent workers, prefetch factor 2, the same
generator seed. Seed 004's own loop besides: ``leanloader-seed004-4`` /
``torch-fork-seed004-4``: 4 workers, ``pin_memory=True`` (a no-op without an
accelerator, on both sides), two epochs. Goals (issue 9): samples/s ≥ 1×
torch (fork and spawn), first batch ≤ torch spawn's, peak unreclaimable
memory ≤ torch fork's; seed 004's loop (issue 23): samples/s ≥ 1× and peak
≤ 1× torch fork's.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from leanloader.bench.scenarios import EPOCH_END, Goal, LoaderContext, LoaderRun, Scenario
from leanloader.bench.scenarios import hdf5 as _hdf5

BATCH_SIZE = 32
WORKER_COUNTS = (2, 4)


def _dataset(context: LoaderContext) -> _hdf5.SessionDataset:
    sessions, stimuli, trial_to_image = _hdf5._paths(context.data, "raw")
    return _hdf5.SessionDataset(sessions, stimuli, trial_to_image, int(context.data["trials"]))


def _loader_arguments(context: LoaderContext) -> dict[str, Any]:
    import torch

    return {
        "batch_size": BATCH_SIZE,
        "shuffle": True,
        "num_workers": int(context.options["workers"]),
        "persistent_workers": True,
        "prefetch_factor": 2,
        "pin_memory": bool(context.options.get("pin", False)),
        "generator": torch.Generator().manual_seed(context.seed),
    }


def iterate_leanloader(context: LoaderContext) -> Iterator[Any]:
    import leanloader as ll

    mode = context.options["mode"]
    loader = ll.DataLoader(
        _dataset(context),
        worker_mode=mode,
        **(
            {"multiprocessing_context": context.options["start"]}
            if mode == "process" and context.options.get("start")
            else {}
        ),
        **_loader_arguments(context),
    )
    try:
        yield from _passes(loader, context)
    finally:
        loader.close()


def _passes(loader: Any, context: LoaderContext) -> Iterator[Any]:
    """Every batch of every epoch, EPOCH_END after each epoch."""
    epochs = int(context.options.get("epochs") or context.size["epochs"])
    for _ in range(epochs):
        yield from loader
        yield EPOCH_END


def iterate_torch(context: LoaderContext) -> Iterator[Any]:
    from torch.utils.data import DataLoader

    loader = DataLoader(
        _dataset(context),
        multiprocessing_context=context.options["start"],
        **_loader_arguments(context),
    )
    try:
        yield from _passes(loader, context)
    finally:
        del loader


def _describe_size(size: Mapping[str, Any]) -> str:
    return _hdf5._describe_size(size).replace("uncompressed, gzip-1, Blosc-LZ4", "uncompressed")


def _leanloader(workers: int, mode: str, start: str = "") -> LoaderRun:
    if mode == "thread":
        key, kind = f"leanloader-thread-{workers}", "native threads"
    elif not start:
        key, kind = f"leanloader-{workers}", "worker processes (the default: forkserver)"
    else:
        key, kind = f"leanloader-{start}-{workers}", f"worker processes ({start})"
    return LoaderRun(
        name="leanloader",
        function=iterate_leanloader,
        threads=workers,
        imports=("leanloader", "torch", "h5py"),
        options={"workers": workers, "mode": mode, "start": start},
        row_options=("workers", "mode", "start"),
        label=f"ll.DataLoader, {workers} {kind}",
        key=key,
    )


def _torch(workers: int, start: str) -> LoaderRun:
    return LoaderRun(
        name="torch",
        function=iterate_torch,
        threads=workers,
        imports=("torch", "h5py"),
        options={"workers": workers, "start": start},
        row_options=("workers", "start"),
        label=f"torch DataLoader, {workers} workers ({start})",
        key=f"torch-{start}-{workers}",
    )


SEED004_WORKERS = 4
SEED004_EPOCHS = 2


def _seed004(name: str) -> LoaderRun:
    """Seed 004's loop: 4 workers, pin_memory=True, persistent, two epochs."""
    options = {"workers": SEED004_WORKERS, "start": "fork" if name == "torch" else "",
               "mode": "process", "pin": True, "epochs": SEED004_EPOCHS}  # fmt: skip
    key = "torch-fork" if name == "torch" else "leanloader"
    return LoaderRun(
        name=name,
        function=iterate_torch if name == "torch" else iterate_leanloader,
        threads=SEED004_WORKERS,
        imports=("torch", "h5py") if name == "torch" else ("leanloader", "torch", "h5py"),
        options=options,
        row_options=("workers", "start", "pin", "epochs"),
        label=f"{'torch DataLoader (fork)' if name == 'torch' else 'll.DataLoader'}, seed 004's "
        f"loop: {SEED004_WORKERS} workers, pin_memory=True, {SEED004_EPOCHS} epochs",
        key=f"{key}-seed004-{SEED004_WORKERS}",
    )


def _goals(workers: int) -> tuple[Goal, ...]:
    ours = f"leanloader-{workers}"
    return (
        Goal(
            f"{workers} workers: samples/s ≥ 1× torch (fork)",
            "samples_per_s",
            at_least=1.0,
            ratio=f"{ours}/torch-fork-{workers}",
        ),
        Goal(
            f"{workers} workers: samples/s ≥ 1× torch (spawn)",
            "samples_per_s",
            at_least=1.0,
            ratio=f"{ours}/torch-spawn-{workers}",
        ),
        Goal(
            f"{workers} workers: first batch ≤ torch (spawn)",
            "first_batch_s",
            at_most=1.0,
            ratio=f"{ours}/torch-spawn-{workers}",
        ),
        Goal(
            f"{workers} workers: peak unreclaimable ≤ torch (fork)",
            "peak_unreclaimable_bytes",
            at_most=1.0,
            ratio=f"{ours}/torch-fork-{workers}",
        ),
    )


SCENARIO = Scenario(
    name="largebatch",
    description="seed 004's Dataset (h5py in __getitem__, ~300 MB batches) under ll.DataLoader",
    sizes={
        "full": {
            "sessions": 3,
            "trials": 100,
            "trial_shape": [150, 150, 100],
            "images": 300,
            "epochs": 1,
        },
        "quick": {
            "sessions": 3,
            "trials": 32,
            "trial_shape": [75, 75, 50],
            "images": 48,
            "epochs": 1,
        },
    },
    prepare=_hdf5.prepare,
    loaders=(
        *(
            run
            for workers in WORKER_COUNTS
            for run in (
                _leanloader(workers, "process"),
                _leanloader(workers, "process", start="spawn"),
                _leanloader(workers, "thread"),
                _torch(workers, "fork"),
                _torch(workers, "spawn"),
            )
        ),
        _seed004("leanloader"),
        _seed004("torch"),
    ),
    ratios=(
        *(
            (f"leanloader{variant}-{workers}", f"torch-{start}-{workers}")
            for workers in WORKER_COUNTS
            for variant in ("", "-spawn")
            for start in ("fork", "spawn")
        ),
        *((f"leanloader-thread-{workers}", f"torch-fork-{workers}") for workers in WORKER_COUNTS),
        (f"leanloader-seed004-{SEED004_WORKERS}", f"torch-fork-seed004-{SEED004_WORKERS}"),
    ),
    goals=(
        *(goal for workers in WORKER_COUNTS for goal in _goals(workers)),
        *(
            Goal(
                f"seed 004's loop: epoch {epoch} samples/s ≥ 1× torch (fork)",
                f"epoch{epoch}_samples_per_s",
                at_least=1.0,
                ratio=f"leanloader-seed004-{SEED004_WORKERS}/torch-fork-seed004-{SEED004_WORKERS}",
            )
            for epoch in range(1, SEED004_EPOCHS + 1)
        ),
        Goal(
            "seed 004's loop: peak unreclaimable ≤ torch (fork)",
            "peak_unreclaimable_bytes",
            at_most=1.0,
            ratio=f"leanloader-seed004-{SEED004_WORKERS}/torch-fork-seed004-{SEED004_WORKERS}",
        ),
    ),
    warm_files=_hdf5._warm_files,
    describe_size=_describe_size,
)
