"""Scenario `arrays`: shuffled batches of rows from one large .npy file.

Data: a .npy of float32 rows of 256 KiB (65,536 values), 2 GiB in the full
size. Batch 64, shuffled.

With ``--cold`` every pass starts with the files evicted from the page cache
and fio reads the same files at random, a row at a time, as the yardstick.

Row-size sweep (leanloader only, the share of memcpy per size): the same
bytes as rows of 4 KiB, 64 KiB and 4 MiB, each in its own .npy, batches of
16 MiB like the main row's (4,096, 256 and 4 rows): what a sample costs
beyond its bytes shows at 4 KiB (tabular rows, token windows).

- ``leanloader``: ``NpySource`` (memory-mapped) with 2 native threads that
  copy each row straight into its batch slot.
- ``torch``: ``torch.utils.data.DataLoader(num_workers=2)`` over a Dataset that
  indexes the rows of ``np.load(path, mmap_mode="r")``, default collate,
  configured as its documentation recommends: persistent workers, default
  prefetch factor, a seeded generator for the shuffle. Workers start with the
  platform's default method: fork on Linux up to Python 3.13, where they share
  the parent's pages (Python, torch) copy-on-write.
- ``spdl`` (when SPDL is installed: ``make bench`` installs it): SPDL's
  pipeline as its documentation recommends for data that is not media,
  work done per batch: the shuffled indices aggregated into batches of 64
  (``PipelineBuilder.aggregate``), each batch gathered from the memory-mapped
  array by NumPy's fancy indexing in a stage of concurrency 2 on 2 threads,
  handed out as a torch tensor.
- ``grain`` (when Grain is installed: ``make bench`` installs it): Grain's
  ``MapDataset`` over the memory-mapped rows, shuffled, batched by its default
  batch function (``np.stack``, one copy per row), read by 2 threads
  (``ReadOptions(num_threads=2, prefetch_buffer_size=4)``).
- ``torchdata`` (when torchdata is installed): ``torchdata.nodes`` with a
  ``RandomSampler``, the indices batched, each batch gathered from the memory
  map by NumPy's fancy indexing in a ``ParallelMapper`` of 2 threads, a
  ``Prefetcher``, in a ``Loader``.
- ``copy-and-read`` (a yardstick, not a loader): 2 threads each copy whole
  16 MiB batches from an array in RAM with one copy (the stores leanloader
  fills a slot of that size with) and the consumer reads
  them (``leanloader.bench.yardstick``): the most any loader can reach while
  the consumer reads every byte on the same cores.
- ``torch-forkserver``: the same with ``multiprocessing_context="forkserver"``,
  Linux's default from Python 3.14 and the safe choice once CUDA is
  initialised (fork deadlocks then, seed 003): each worker imports torch itself.
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from leanloader.bench import peers
from leanloader.bench.scenarios import Goal, LoaderContext, LoaderRun, Scenario, peer_goals
from leanloader.bench.yardstick import copy_and_read_run

ROW_VALUES = 65_536  # float32 values per row: 256 KiB
ROW_BYTES = ROW_VALUES * 4
BATCH_SIZE = 64
BATCH_BYTES = BATCH_SIZE * ROW_BYTES  # 16 MiB, kept by the sweep's rows
SWEEP_ROW_KIB = (4, 64, 4096)  # besides the main 256 KiB row
THREADS = 2
FIELD = "features"  # NpySource names its one field after the file stem

# Rows generated per write: 16 MiB, so that generation never holds the file
# in memory.
_ROWS_PER_CHUNK = 64


def prepare(data_dir: Path, size: Mapping[str, Any]) -> dict[str, Any]:
    rows = int(size["rows"])
    paths = {}
    sweep = SWEEP_ROW_KIB if size.get("sweep", True) else ()
    for row_kib in (ROW_BYTES >> 10, *sweep):
        row_values = (row_kib << 10) // 4
        # The same bytes at every size (at least one row).
        row_count = max(1, rows * ROW_BYTES // (row_kib << 10))
        name = f"arrays-{rows}x{ROW_VALUES}-float32"
        if row_values != ROW_VALUES:
            name = f"arrays-{row_count}x{row_values}-float32"
        path = Path(data_dir) / name / f"{FIELD}.npy"
        if not _is_complete(path, row_count, row_values):
            path.parent.mkdir(parents=True, exist_ok=True)
            _write_rows(path, row_count, row_values)
        paths[str(row_kib)] = str(path)
    return {
        "path": paths[str(ROW_BYTES >> 10)],
        "paths_by_row_kib": paths,
        "rows": rows,
        "bytes_per_sample": ROW_BYTES,
    }


def _is_complete(path: Path, rows: int, row_values: int) -> bool:
    try:
        array = np.load(path, mmap_mode="r")
    except (OSError, ValueError):
        return False
    return array.shape == (rows, row_values) and array.dtype == np.float32


def _write_rows(path: Path, rows: int, row_values: int) -> None:
    # Written under a temporary name and renamed, so an interrupted run never
    # leaves a file that _is_complete accepts.
    partial = path.with_name(f"{path.name}.partial-{os.getpid()}")
    rng = np.random.default_rng(0)
    try:
        array = np.lib.format.open_memmap(
            partial, mode="w+", dtype=np.float32, shape=(rows, row_values)
        )
        step = max(1, _ROWS_PER_CHUNK * ROW_VALUES // row_values)  # 16 MiB per write
        for start in range(0, rows, step):
            stop = min(start + step, rows)
            array[start:stop] = rng.random((stop - start, row_values), dtype=np.float32)
        array.flush()
        del array
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def iterate_leanloader(context: LoaderContext) -> Iterator[Any]:
    import leanloader as ll

    row_kib = int(context.options.get("row_kib", ROW_BYTES >> 10))
    paths = context.data["paths_by_row_kib"]
    if str(row_kib) not in paths:
        raise ValueError(
            f"no data for {row_kib} KiB rows: this size was prepared without the sweep"
        )
    source = ll.NpySource(paths[str(row_kib)])
    loader = ll.Loader(
        source,
        batch_size=max(1, BATCH_BYTES // (row_kib << 10)),
        shuffle=True,
        seed=context.seed,
        num_threads=THREADS,
        prefetch=2,
        output=context.options["output"],
    )
    try:
        for epoch in range(int(context.size["epochs"])):
            loader.set_epoch(epoch)
            yield from loader
    finally:
        loader.close()


class NpyRowDataset:
    """The rows of a .npy file, as a torch map-style Dataset would index them.

    The file is memory-mapped lazily, on the first ``__getitem__`` in the
    process that runs it (each DataLoader worker): a ``np.memmap`` pickles by
    copying its whole contents, so a map opened in ``__init__`` would be
    copied into every worker under spawn/forkserver. Indexing returns the
    mapped row itself, so default collate copies it once, straight into the
    shared-memory batch, which is the baseline's fastest path.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.length = int(np.load(path, mmap_mode="r").shape[0])
        self._rows: np.ndarray | None = None

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> np.ndarray:
        if self._rows is None:
            self._rows = np.load(self.path, mmap_mode="r")
        return self._rows[index]


def iterate_torch(context: LoaderContext) -> Iterator[Any]:
    import torch
    from torch.utils.data import DataLoader

    # torch.as_tensor warns once per worker that a read-only memmap row is not
    # writable; collate only reads it.
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
    loader = DataLoader(
        NpyRowDataset(context.data["path"]),
        batch_size=BATCH_SIZE,
        shuffle=True,
        num_workers=THREADS,
        persistent_workers=True,
        generator=torch.Generator().manual_seed(context.seed),
        multiprocessing_context=context.options.get("start_method"),
    )
    try:
        for _epoch in range(int(context.size["epochs"])):
            yield from loader
    finally:
        # Dropping the last reference shuts the persistent workers down and
        # joins them, so their CPU time reaches this process's rusage.
        del loader


def _gather_rows(context: LoaderContext) -> tuple[int, Any]:
    """The peers' gather: a batch of rows with NumPy fancy indexing from the
    memory map (one copy per row, as torch's default collate makes)."""
    import torch

    rows = np.load(context.data["path"], mmap_mode="r")
    return len(rows), lambda indices: torch.from_numpy(rows[np.asarray(indices)])


def iterate_spdl(context: LoaderContext) -> Iterator[Any]:
    yield from peers.spdl_batches(
        *_gather_rows(context), **peers.work(context, BATCH_SIZE, THREADS)
    )


def iterate_grain(context: LoaderContext) -> Iterator[Any]:
    import torch

    rows = np.load(context.data["path"], mmap_mode="r")
    for batch in peers.grain_batches(rows, **peers.work(context, BATCH_SIZE, THREADS)):
        yield torch.from_numpy(batch)


def iterate_torchdata(context: LoaderContext) -> Iterator[Any]:
    yield from peers.torchdata_batches(
        *_gather_rows(context), **peers.work(context, BATCH_SIZE, THREADS)
    )


def _describe_size(size: Mapping[str, Any]) -> str:
    rows = int(size["rows"])
    gib = rows * ROW_BYTES / 2**30
    epochs = int(size["epochs"])
    return (
        f"{rows} rows × 256 KiB float32 ({gib:.2g} GiB), batch {BATCH_SIZE}, shuffled, "
        f"{epochs} epoch{'s' if epochs != 1 else ''}"
        + (
            "; the same bytes as 4 KiB, 64 KiB and 4 MiB rows in 16 MiB batches (leanloader only)"
            if size.get("sweep", True)
            else ""
        )
    )


def _cold_read(data: Mapping[str, Any], run: LoaderRun) -> tuple[str, int] | None:
    """The file a run reads and its row size: fio's random reads with --cold."""
    row_kib = int(run.options.get("row_kib", ROW_BYTES >> 10))
    path = data["paths_by_row_kib"].get(str(row_kib))
    return None if path is None else (path, row_kib << 10)


def _row_label(row_kib: int) -> str:
    return f"{row_kib >> 10}MiB" if row_kib >= 1024 else f"{row_kib}KiB"


# leanloader hands out torch tensors like the baseline when torch is
# installed, NumPy arrays otherwise (the demo still runs without torch).
_OUTPUT = "torch" if importlib.util.find_spec("torch") is not None else "numpy"

SCENARIO = Scenario(
    name="arrays",
    description="shuffled batches of 256 KiB float32 rows from one memory-mapped .npy",
    sizes={
        "full": {"rows": 8192, "epochs": 3},
        "quick": {"rows": 1024, "epochs": 3},
        "demo": {"rows": 1024, "epochs": 2, "sweep": False},
    },
    prepare=prepare,
    loaders=(
        LoaderRun(
            name="leanloader",
            function=iterate_leanloader,
            threads=THREADS,
            imports=("leanloader", "torch") if _OUTPUT == "torch" else ("leanloader",),
            options={"output": _OUTPUT},
            row_options=("output",),
            label=f"leanloader, {THREADS} threads",
        ),
        LoaderRun(
            name="torch",
            function=iterate_torch,
            threads=THREADS,
            imports=("torch",),
            label=f"torch DataLoader, {THREADS} worker processes (fork)",
        ),
        LoaderRun(
            name="torch",
            function=iterate_torch,
            threads=THREADS,
            imports=("torch",),
            options={"start_method": "forkserver"},
            row_options=("start_method",),
            label=f"torch DataLoader, {THREADS} worker processes (forkserver)",
            key="torch-forkserver",
        ),
        LoaderRun(
            name="spdl",
            function=iterate_spdl,
            threads=THREADS,
            imports=("spdl.pipeline", "torch"),
            label=f"SPDL pipeline, batches gathered from the memory map, {THREADS} threads",
        ),
        LoaderRun(
            name="grain",
            function=iterate_grain,
            threads=THREADS,
            imports=("grain", "torch"),
            label=f"Grain MapDataset, batches stacked from the memory map, {THREADS} read threads",
        ),
        LoaderRun(
            name="torchdata",
            function=iterate_torchdata,
            threads=THREADS,
            imports=("torchdata.nodes", "torch"),
            label=f"torchdata.nodes, batches gathered from the memory map, {THREADS} threads",
        ),
        copy_and_read_run(
            batch_shape=(BATCH_SIZE, ROW_VALUES),
            dtype=np.float32,
            batches_per_epoch=lambda size: int(size["rows"]) // BATCH_SIZE,
            threads=THREADS,
            output=_OUTPUT,
            batch_label="16 MiB",
        ),
        *(
            LoaderRun(
                name="leanloader",
                function=iterate_leanloader,
                threads=THREADS,
                imports=("leanloader", "torch") if _OUTPUT == "torch" else ("leanloader",),
                options={"output": _OUTPUT, "row_kib": row_kib},
                row_options=("output", "row_kib"),
                label=f"leanloader, {THREADS} threads, {_row_label(row_kib)} rows, "
                f"batch {BATCH_BYTES // (row_kib << 10)}",
                key=f"leanloader-{_row_label(row_kib)}",
            )
            for row_kib in SWEEP_ROW_KIB
        ),
    ),
    ratios=(
        ("leanloader", "torch"),
        ("leanloader", "torch-forkserver"),
        ("leanloader", "spdl"),
        ("leanloader", "grain"),
        ("leanloader", "torchdata"),
        ("leanloader", "copy-and-read"),
    ),
    goals=(
        Goal("samples/s ≥ 3× torch", "samples_per_s", at_least=3.0, ratio="leanloader/torch"),
        *peer_goals((("SPDL", "spdl"), ("Grain", "grain"), ("torchdata", "torchdata"))),
        Goal(
            "peak unreclaimable memory ≤ ½ torch (fork workers)",
            "peak_unreclaimable_bytes",
            at_most=0.5,
            ratio="leanloader/torch",
        ),
        Goal(
            "peak unreclaimable memory ≤ ½ torch (forkserver workers)",
            "peak_unreclaimable_bytes",
            at_most=0.5,
            ratio="leanloader/torch-forkserver",
        ),
        Goal(
            "time to first batch ≤ ⅕ torch", "first_batch_s", at_most=0.2, ratio="leanloader/torch"
        ),
        Goal(
            "batch assembly ≥ 90% of memcpy (256 KiB rows)",
            "fraction_of_memcpy",
            at_least=0.9,
            loader="leanloader",
            yardstick="copy-and-read",
        ),
        *(
            Goal(
                f"batch assembly ≥ {share:.0%} of memcpy ({_row_label(row_kib)} rows)",
                "fraction_of_memcpy",
                at_least=share,
                loader=f"leanloader-{_row_label(row_kib)}",
            )
            for row_kib, share in zip(SWEEP_ROW_KIB, (0.5, 0.9, 0.9), strict=True)
        ),
        Goal(
            "--cold: ≥ 90% of fio with 32 reads in flight a thread (256 KiB rows)",
            "fraction_of_fio_deep",
            at_least=0.9,
            loader="leanloader",
        ),
    ),
    warm_files=lambda data: list(data["paths_by_row_kib"].values()),
    cold_read=_cold_read,
    describe_size=_describe_size,
)
