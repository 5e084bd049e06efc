"""Scenario `pydataset`: seed 000's Python dataset under worker processes.

The dataset holds a 1 GiB NumPy feature array (``quick``: 128 MiB), 300,000
dict records (path, caption, size) and a reference to a 256 MiB
``torch.nn.Module``, as ai-toolkit's dataset holds cached latents, its file
list and the model. Batch 4, spawn, persistent workers.

Both loaders get the same dataset objects, so that the ratio measures the
loader, not a dataset fix that torch users can apply too:

- ``leanloader-N`` / ``torch-N`` (1, 2 and 4 workers): the records in an
  ``ll.SharedRecords`` (the audit's fix, one packed buffer) on both sides.
  ``ll.DataLoader`` shares the features and the module once; torch pickles
  the features into every worker and moves the module to shared memory.
- ``leanloader-list-2`` / ``torch-list-2`` (2 workers): the records in a
  plain list on both sides, as users write it (copy-on-read of the list in
  every worker).

Two more pairs check how the dataset reaches the workers:

- ``leanloader-fresh-2`` / ``torch-fresh-2``: torch's default,
  ``persistent_workers=False``, for two epochs: fresh workers each epoch,
  each given the dataset again (records shared on both sides).
- ``leanloader-memmap-4`` / ``torch-fork-memmap-4`` (4 workers): a dataset
  holding a slice of a ``.npy`` file opened with ``mmap_mode="r"`` (2 GiB;
  ``quick``: 128 MiB), against torch with fork, where the slice costs
  nothing: ours sends it as a reference to the file.

The marginal cost of one more worker is the least-squares slope of the
steady-state unreclaimable memory (the median over the epoch) over the 1-, 2-
and 4-worker runs (``marginal_unreclaimable_per_worker``); the slope of the
start-up peaks is reported apart (``marginal_startup_peak_per_worker``): a
one-time move into shared memory is not a per-worker cost.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from leanloader.bench.scenarios import Goal, LoaderContext, LoaderRun, Scenario

BATCH_SIZE = 4
WORKER_COUNTS = (1, 2, 4)
# The plain-list rows run at this worker count only.
LIST_WORKERS = 2
# The rows with fresh workers each epoch, and those with a memmap slice.
FRESH_WORKERS = 2
FRESH_EPOCHS = 2
MEMMAP_WORKERS = 4
MEMMAP_ROW_BYTES = 64 << 10


class SeedDataset:
    """Seed 000's dataset: features, records, a model reference."""

    def __init__(self, feature_bytes: int, records: int, model_bytes: int, shared: bool) -> None:
        import numpy as np
        import torch

        rows = 4096
        self.features = np.ones((rows, feature_bytes // (rows * 4)), dtype=np.float32)
        items = (
            {"path": f"/data/train/{i:07d}.png", "caption": f"photo {i} of a cat", "size": i}
            for i in range(records)
        )
        if shared:
            import leanloader as ll

            self.records: Any = ll.SharedRecords(items)
        else:
            self.records = list(items)
        side = int((model_bytes // 4) ** 0.5)
        self.sd = torch.nn.Linear(side, side, bias=False)

    def __len__(self) -> int:
        return len(self.features)

    def __getitem__(self, index: int) -> Any:
        record = self.records[index % len(self.records)]
        return self.features[index, :1024].copy(), record["size"]


class MemmapSlice:
    """A train split of a token file: rows of a slice of a memory-mapped
    ``.npy`` (the file's first rows held out)."""

    def __init__(self, path: str, held_out_rows: int) -> None:
        import numpy as np

        self.rows = np.load(path, mmap_mode="r")[held_out_rows:]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> Any:
        import numpy as np

        return np.array(self.rows[index])


def _mode(context: LoaderContext) -> str:
    return str(context.options.get("mode", "persistent"))


def _dataset(context: LoaderContext, shared: bool) -> Any:
    if _mode(context) == "memmap":
        return MemmapSlice(context.data["memmap_path"], int(context.data["held_out_rows"]))
    size = context.size
    return SeedDataset(
        int(size["feature_bytes"]), int(size["records"]), int(size["model_bytes"]), shared
    )


def _shared(context: LoaderContext) -> bool:
    return context.options.get("records", "shared") == "shared"


def iterate_leanloader(context: LoaderContext) -> Iterator[Any]:
    import torch

    import leanloader as ll

    loader = ll.DataLoader(
        _dataset(context, shared=_shared(context)),
        batch_size=BATCH_SIZE,
        shuffle=True,
        num_workers=int(context.options["workers"]),
        multiprocessing_context=None if _mode(context) == "memmap" else "spawn",
        persistent_workers=_mode(context) != "fresh",
        generator=torch.Generator().manual_seed(context.seed),
    )
    try:
        for _ in range(_epochs(context)):
            yield from loader
    finally:
        loader.close()


def _epochs(context: LoaderContext) -> int:
    epochs = int(context.size["epochs"])
    return max(epochs, FRESH_EPOCHS) if _mode(context) == "fresh" else epochs


def iterate_torch(context: LoaderContext) -> Iterator[Any]:
    import torch
    from torch.utils.data import DataLoader

    loader = DataLoader(
        _dataset(context, shared=_shared(context)),
        batch_size=BATCH_SIZE,
        shuffle=True,
        num_workers=int(context.options["workers"]),
        multiprocessing_context="fork" if _mode(context) == "memmap" else "spawn",
        persistent_workers=_mode(context) != "fresh",
        generator=torch.Generator().manual_seed(context.seed),
    )
    try:
        for _ in range(_epochs(context)):
            yield from loader
    finally:
        del loader


def prepare(data_dir: Path, size: Mapping[str, Any]) -> dict[str, Any]:
    """The memmap rows' file: `memmap_bytes` of float32 rows after
    `held_out_rows` rows the dataset leaves out (everything else is built in
    memory by the dataset)."""
    import numpy as np

    row_elements = MEMMAP_ROW_BYTES // 4
    rows = int(size["memmap_bytes"]) // MEMMAP_ROW_BYTES
    held_out = max(1, rows // 32)
    path = data_dir / f"pydataset-memmap-{rows + held_out}x{row_elements}.npy"
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial.npy")
        out = np.lib.format.open_memmap(
            partial, mode="w+", dtype=np.float32, shape=(rows + held_out, row_elements)
        )
        step = 1024
        for start in range(0, rows + held_out, step):
            stop = min(start + step, rows + held_out)
            out[start:stop] = np.arange(start, stop, dtype=np.float32)[:, None]
        out.flush()
        del out
        partial.rename(path)
    return {"memmap_path": str(path), "held_out_rows": held_out}


def _family(row: dict[str, Any]) -> str:
    return row.get("family", row["loader"])


def _main(row: dict[str, Any]) -> bool:
    """A row of the 1/2/4-worker series: records shared, persistent workers."""
    return (
        row.get("records", "shared") == "shared" and row.get("mode", "persistent") == "persistent"
    )


def marginal_per_worker(
    results: list[dict[str, Any]], loader: str, figure: str = "steady_unreclaimable_bytes"
) -> float:
    """Bytes of `figure` one more worker costs `loader` ("leanloader" or
    "torch") with the records shared on both sides: the least-squares slope
    over the worker counts."""
    points = [(r["workers"], r[figure]) for r in results if _family(r) == loader and _main(r)]
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / spread


def derive_ratios(results: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """The issue's "leanloader/torch" ratios: the marginal cost of a worker over
    1/2/4 workers at steady state (and, apart, of the start-up peaks), and the
    figures at 2 workers."""
    shared = [r for r in results if _main(r)]
    loaders = {_family(r) for r in shared}
    if not {"leanloader", "torch"} <= loaders or len({r["workers"] for r in shared}) < 2:
        return {}
    by_key = {(_family(r), r["workers"]): r for r in shared}
    two = by_key.get(("leanloader", 2)), by_key.get(("torch", 2))

    def slope_ratio(figure: str) -> float:
        torch_slope = marginal_per_worker(results, "torch", figure)
        leanloader_slope = marginal_per_worker(results, "leanloader", figure)
        return leanloader_slope / torch_slope if torch_slope else float("inf")

    ratios = {
        "marginal_unreclaimable_per_worker": slope_ratio("steady_unreclaimable_bytes"),
        "marginal_startup_peak_per_worker": slope_ratio("startup_peak_unreclaimable_bytes"),
    }
    if all(two):
        for figure in (
            "steady_unreclaimable_bytes",
            "peak_unreclaimable_bytes",
            "samples_per_s",
            "first_batch_s",
        ):
            ratios[figure] = two[0][figure] / two[1][figure]
    return {"leanloader/torch": ratios}


def _describe(size: Mapping[str, Any]) -> str:
    return (
        f"{int(size['feature_bytes']) / 2**20:.0f} MiB features, {int(size['records']):,} "
        f"records, {int(size['model_bytes']) / 2**20:.0f} MiB module; batch {BATCH_SIZE}, "
        f"spawn, persistent workers, {', '.join(map(str, WORKER_COUNTS))} workers with "
        f"SharedRecords on both sides, {LIST_WORKERS} with a plain list on both sides; "
        f"{FRESH_WORKERS} fresh workers per epoch for {FRESH_EPOCHS} epochs; a "
        f"{int(size['memmap_bytes']) / 2**20:.0f} MiB memmap slice, {MEMMAP_WORKERS} workers "
        "(torch with fork)"
    )


def _run(name: str, workers: int, records: str, mode: str = "persistent") -> LoaderRun:
    suffix = "" if records == "shared" else "-list"
    if mode != "persistent":
        suffix = f"-{mode}"
    torch_label = "torch with fork" if mode == "memmap" else name
    what = {
        "persistent": "records in " + ("ll.SharedRecords" if records == "shared" else "a list"),
        "fresh": f"fresh workers each epoch ({FRESH_EPOCHS} epochs), records in ll.SharedRecords",
        "memmap": "a slice of a memory-mapped .npy",
    }[mode]
    plural = "es" if workers > 1 else ""
    return LoaderRun(
        name=name,
        function=iterate_leanloader if name == "leanloader" else iterate_torch,
        threads=workers,
        imports=("torch",) if name == "torch" else ("leanloader", "torch"),
        options={"workers": workers, "records": records, "mode": mode},
        row_options=("workers", "records", "mode"),
        label=f"{torch_label if name == 'torch' else name}, {workers} worker process{plural}, "
        + what,
        key=("torch-fork" if name == "torch" and mode == "memmap" else name)
        + f"{suffix}-{workers}",
    )


def _runs() -> tuple[LoaderRun, ...]:
    runs = [_run(name, w, "shared") for w in WORKER_COUNTS for name in ("leanloader", "torch")]
    runs += [_run(name, LIST_WORKERS, "list") for name in ("leanloader", "torch")]
    runs += [_run(name, FRESH_WORKERS, "shared", "fresh") for name in ("leanloader", "torch")]
    runs += [_run(name, MEMMAP_WORKERS, "shared", "memmap") for name in ("leanloader", "torch")]
    return tuple(runs)


SCENARIO = Scenario(
    name="pydataset",
    description="seed 000: a Python dataset with features, records and a model, 1/2/4 workers",
    sizes={
        "full": {
            "feature_bytes": 1 << 30,
            "records": 300_000,
            "model_bytes": 256 << 20,
            "memmap_bytes": 2 << 30,
            "epochs": 1,
        },
        "quick": {
            "feature_bytes": 128 << 20,
            "records": 300_000,
            "model_bytes": 32 << 20,
            "memmap_bytes": 128 << 20,
            "epochs": 1,
        },
    },
    prepare=prepare,
    loaders=_runs(),
    ratios=(
        *((f"leanloader-{w}", f"torch-{w}") for w in WORKER_COUNTS),
        (f"leanloader-list-{LIST_WORKERS}", f"torch-list-{LIST_WORKERS}"),
        (f"leanloader-fresh-{FRESH_WORKERS}", f"torch-fresh-{FRESH_WORKERS}"),
        (f"leanloader-memmap-{MEMMAP_WORKERS}", f"torch-fork-memmap-{MEMMAP_WORKERS}"),
    ),
    derive_ratios=derive_ratios,
    goals=(
        Goal(
            "marginal unreclaimable memory per worker ≤ ¼ torch",
            "marginal_unreclaimable_per_worker",
            at_most=0.25,
            ratio="leanloader/torch",
        ),
        Goal(
            "total at 2 workers ≤ ½ torch (steady)",
            "steady_unreclaimable_bytes",
            at_most=0.5,
            ratio="leanloader-2/torch-2",
        ),
        Goal(
            "samples/s ≥ torch (2 workers)",
            "samples_per_s",
            at_least=1.0,
            ratio="leanloader-2/torch-2",
        ),
        Goal(
            "time to first batch ≤ ½ torch (2 workers)",
            "first_batch_s",
            at_most=0.5,
            ratio="leanloader-2/torch-2",
        ),
        Goal(
            "fresh workers each epoch: total ≤ ½ torch (steady)",
            "steady_unreclaimable_bytes",
            at_most=0.5,
            ratio=f"leanloader-fresh-{FRESH_WORKERS}/torch-fresh-{FRESH_WORKERS}",
        ),
        Goal(
            "fresh workers each epoch: samples/s ≥ torch",
            "samples_per_s",
            at_least=1.0,
            ratio=f"leanloader-fresh-{FRESH_WORKERS}/torch-fresh-{FRESH_WORKERS}",
        ),
        Goal(
            "memmap slice: total ≤ torch fork (steady)",
            "steady_unreclaimable_bytes",
            at_most=1.0,
            ratio=f"leanloader-memmap-{MEMMAP_WORKERS}/torch-fork-memmap-{MEMMAP_WORKERS}",
        ),
    ),
    describe_size=_describe,
)
