"""Scenario `pydataset`: seed 000's Python dataset under worker processes.

The dataset holds a 1 GiB NumPy feature array (``quick``: 128 MiB), a list of
300,000 dict records (path, caption, size) and a reference to a 256 MiB
``torch.nn.Module``, as ai-toolkit's dataset holds cached latents, its file
list and the model. Batch 4, spawn, persistent workers, 1, 2 and 4 workers.

- ``torch-N``: ``torch.utils.data.DataLoader`` over the dataset as users
  write it (records in a list): every spawned worker receives a pickled copy
  of the features and the records; the module's tensors are moved to shared
  memory by torch.
- ``leanloader-N``: ``ll.DataLoader`` with the same arguments over the same
  dataset with the audit's fix for the records applied
  (``ll.SharedRecords``); the features and the module are shared once by the
  loader itself.

The harness reports peak unreclaimable memory per run; the marginal cost of
one more worker is the least-squares slope over the 1-, 2- and 4-worker runs
(``marginal_per_worker``), reported with the 2-worker figures in the
``"leanloader/torch"`` ratios.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from leanloader.bench.scenarios import Goal, LoaderContext, LoaderRun, Scenario

BATCH_SIZE = 4
WORKER_COUNTS = (1, 2, 4)


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


def iterate_leanloader(context: LoaderContext) -> Iterator[Any]:
    import torch

    import leanloader as ll

    loader = ll.DataLoader(
        _dataset(context, shared=True),
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
        _dataset(context, shared=False),
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


def marginal_per_worker(results: list[dict[str, Any]], loader: str) -> float:
    """Bytes of peak unreclaimable memory one more worker costs `loader`
    ("leanloader" or "torch"): the least-squares slope over the worker counts."""
    points = [
        (r["workers"], r["peak_unreclaimable_bytes"]) for r in results if r["loader"] == loader
    ]
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / spread


def derive_ratios(results: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """The issue's "leanloader/torch" ratios: the marginal cost of a worker over
    1/2/4 workers, and the figures at 2 workers."""
    loaders = {r["loader"] for r in results}
    if not {"leanloader", "torch"} <= loaders or len({r["workers"] for r in results}) < 2:
        return {}
    by_key = {(r["loader"], r["workers"]): r for r in results}
    two = by_key.get(("leanloader", 2)), by_key.get(("torch", 2))
    ratios = {
        "marginal_unreclaimable_per_worker": marginal_per_worker(results, "leanloader")
        / marginal_per_worker(results, "torch")
    }
    if all(two):
        for figure in ("peak_unreclaimable_bytes", "samples_per_s", "first_batch_s"):
            ratios[figure] = two[0][figure] / two[1][figure]
    return {"leanloader/torch": ratios}


def _describe(size: Mapping[str, Any]) -> str:
    return (
        f"{int(size['feature_bytes']) / 2**20:.0f} MiB features, {int(size['records']):,} "
        f"records, {int(size['model_bytes']) / 2**20:.0f} MiB module; batch {BATCH_SIZE}, "
        f"spawn, persistent workers, {', '.join(map(str, WORKER_COUNTS))} workers"
    )


def _runs() -> tuple[LoaderRun, ...]:
    runs = []
    for workers in WORKER_COUNTS:
        for name, function in (("leanloader", iterate_leanloader), ("torch", iterate_torch)):
            runs.append(
                LoaderRun(
                    name=name,
                    function=function,
                    threads=workers,
                    imports=("torch",) if name == "torch" else ("leanloader", "torch"),
                    options={"workers": workers},
                    row_options=("workers",),
                    label=f"{name}, {workers} worker process{'es' if workers > 1 else ''}",
                    key=f"{name}-{workers}",
                )
            )
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
    ratios=tuple((f"leanloader-{w}", f"torch-{w}") for w in WORKER_COUNTS),
    derive_ratios=derive_ratios,
    goals=(
        Goal(
            "marginal unreclaimable memory per worker ≤ ¼ torch",
            "marginal_unreclaimable_per_worker",
            at_most=0.25,
            ratio="leanloader/torch",
        ),
        Goal(
            "total at 2 workers ≤ ½ torch",
            "peak_unreclaimable_bytes",
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
