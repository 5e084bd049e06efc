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


def _dataset(context: LoaderContext, shared: bool) -> SeedDataset:
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
        multiprocessing_context="spawn",
        persistent_workers=True,
        generator=torch.Generator().manual_seed(context.seed),
    )
    try:
        for _ in range(int(context.size["epochs"])):
            yield from loader
    finally:
        loader.close()


def iterate_torch(context: LoaderContext) -> Iterator[Any]:
    import torch
    from torch.utils.data import DataLoader

    loader = DataLoader(
        _dataset(context, shared=_shared(context)),
        batch_size=BATCH_SIZE,
        shuffle=True,
        num_workers=int(context.options["workers"]),
        multiprocessing_context="spawn",
        persistent_workers=True,
        generator=torch.Generator().manual_seed(context.seed),
    )
    try:
        for _ in range(int(context.size["epochs"])):
            yield from loader
    finally:
        del loader


def prepare(data_dir: Path, size: Mapping[str, Any]) -> dict[str, Any]:
    return {}  # everything is built in memory by the dataset


def _family(row: dict[str, Any]) -> str:
    return row.get("family", row["loader"])


def marginal_per_worker(
    results: list[dict[str, Any]], loader: str, figure: str = "steady_unreclaimable_bytes"
) -> float:
    """Bytes of `figure` one more worker costs `loader` ("leanloader" or
    "torch") with the records shared on both sides: the least-squares slope
    over the worker counts."""
    points = [
        (r["workers"], r[figure])
        for r in results
        if _family(r) == loader and r.get("records", "shared") == "shared"
    ]
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / spread


def derive_ratios(results: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """The issue's "leanloader/torch" ratios: the marginal cost of a worker over
    1/2/4 workers at steady state (and, apart, of the start-up peaks), and the
    figures at 2 workers."""
    shared = [r for r in results if r.get("records", "shared") == "shared"]
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
        f"SharedRecords on both sides, {LIST_WORKERS} with a plain list on both sides"
    )


def _run(name: str, workers: int, records: str) -> LoaderRun:
    suffix = "" if records == "shared" else "-list"
    return LoaderRun(
        name=name,
        function=iterate_leanloader if name == "leanloader" else iterate_torch,
        threads=workers,
        imports=("torch",) if name == "torch" else ("leanloader", "torch"),
        options={"workers": workers, "records": records},
        row_options=("workers", "records"),
        label=(
            f"{name}, {workers} worker process{'es' if workers > 1 else ''}, records in "
            + ("ll.SharedRecords" if records == "shared" else "a list")
        ),
        key=f"{name}{suffix}-{workers}",
    )


def _runs() -> tuple[LoaderRun, ...]:
    runs = [_run(name, w, "shared") for w in WORKER_COUNTS for name in ("leanloader", "torch")]
    runs += [_run(name, LIST_WORKERS, "list") for name in ("leanloader", "torch")]
    return tuple(runs)


SCENARIO = Scenario(
    name="pydataset",
    description="seed 000: a Python dataset with features, records and a model, 1/2/4 workers",
    sizes={
        "full": {
            "feature_bytes": 1 << 30,
            "records": 300_000,
            "model_bytes": 256 << 20,
            "epochs": 1,
        },
        "quick": {
            "feature_bytes": 128 << 20,
            "records": 300_000,
            "model_bytes": 32 << 20,
            "epochs": 1,
        },
    },
    prepare=prepare,
    loaders=_runs(),
    ratios=(
        *((f"leanloader-{w}", f"torch-{w}") for w in WORKER_COUNTS),
        (f"leanloader-list-{LIST_WORKERS}", f"torch-list-{LIST_WORKERS}"),
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
    ),
    describe_size=_describe,
)
