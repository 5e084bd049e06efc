"""Scenario `latents`: cached diffusion latents + text embeddings (seed 000).

Data: N samples, each a latent (16×128×128 float16, 512 KiB) and a text
embedding (256×4096 bfloat16, 2 MiB): 2.5 MiB per sample, 2.5 GB for the full
1,000. Batch 4, shuffled, 2 threads / worker processes. Generated once, one
sample at a time, as one ``.safetensors`` per sample (what ai-toolkit writes
with ``cache_latents_to_disk``) and as a leanloader ``TensorCache`` built from
those files (256 MiB shards).

- ``leanloader``: ``ll.TensorCache`` (shards memory-mapped once, shared page
  cache) → ``ll.Loader(batch_size=4, shuffle=True, num_threads=2)``: one
  memcpy per tensor straight into the batch slot.
- ``torch-ram`` (baseline a, ``cache_latents: true``): a Dataset that holds
  every latent and embedding in RAM as tensors in a list, as ai-toolkit's
  ``FileItemDTO`` objects do; ``DataLoader(num_workers=2, spawn,
  persistent_workers=True)``, so the dataset is pickled into each worker.
  Loading the in-RAM cache is the run's ``setup``: untimed, as the
  leanloader side's ``TensorCache`` is built untimed by ``prepare``. Start-up
  work is counted alike: neither cache's creation is in the timed run, and
  both loaders' construction (workers, pickling, mapping) is.
- ``grain``, ``torchdata``, ``spdl`` (each when installed: ``make bench``
  installs them): the peers on leanloader's own shard files
  (``ShardSamples``: ``safe_open`` once per shard, ``get_tensor`` per
  tensor, batches by ``torch.stack``), shuffled, 2 threads, configured as
  in the arrays scenario: the engine compared, not the file format.
- ``copy-and-read``: the arrays scenario's yardstick with this batch size
  (``leanloader.bench.yardstick``).
- ``torch-files`` (baseline b, ``cache_latents_to_disk: true``): a Dataset of
  paths whose ``__getitem__`` calls ``safetensors.torch.load_file``;
  ``DataLoader(num_workers=2, spawn, persistent_workers=True)``.

With ``--cold`` the shards and the per-sample files are evicted before every
pass and fio reads a shard at random in samples' size (the shard readers'
yardstick).
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from leanloader.bench import peers
from leanloader.bench.scenarios import Goal, LoaderContext, LoaderRun, Scenario, peer_goals
from leanloader.bench.yardstick import copy_and_read_run

LATENT_SHAPE = (16, 128, 128)  # float16
TEXT_SHAPE = (256, 4096)  # bfloat16
SAMPLE_BYTES = 2 * (16 * 128 * 128) + 2 * (256 * 4096)
BATCH_SIZE = 4
THREADS = 2
SHARD_BYTES = 256 << 20
_FORMAT_VERSION = 1


def _write_sample(path: Path, latent: np.ndarray, text_bits: np.ndarray) -> None:
    """One sample as the reference writer lays it out (header padded to 8,
    tensors by dtype then name), written under a temporary name and renamed."""
    header = {
        "__metadata__": {"format": "pt"},
        "latent": {"dtype": "F16", "shape": list(LATENT_SHAPE), "data_offsets": [0, latent.nbytes]},
        "text_embedding": {
            "dtype": "BF16",
            "shape": list(TEXT_SHAPE),
            "data_offsets": [latent.nbytes, latent.nbytes + text_bits.nbytes],
        },
    }
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb") as file:
        file.write(struct.pack("<Q", len(text)))
        file.write(text)
        file.write(latent.tobytes())
        file.write(text_bits.tobytes())
    os.replace(partial, path)


def prepare(data_dir: Path, size: Mapping[str, Any]) -> dict[str, Any]:
    samples = int(size["samples"])
    folder = Path(data_dir) / f"latents-{samples}"
    per_sample = folder / "latent_cache"
    cache_dir = folder / "tensor_cache"
    marker = folder / "complete.json"
    description = {"samples": samples, "version": _FORMAT_VERSION}
    complete = marker.exists() and json.loads(marker.read_text()) == description
    if not complete:
        per_sample.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(0)
        for i in range(samples):  # one sample in memory at a time
            path = per_sample / f"img{i:05d}.safetensors"
            if path.exists() and path.stat().st_size > SAMPLE_BYTES:
                continue
            latent = rng.standard_normal(LATENT_SHAPE, dtype=np.float32).astype(np.float16)
            embedding = rng.standard_normal(TEXT_SHAPE, dtype=np.float32)
            text_bits = (embedding.view(np.uint32) >> 16).astype(np.uint16)  # bfloat16 bits
            _write_sample(path, latent, text_bits)
        # The sharded cache, built from the same files by the cache's own
        # build(): the per-sample folder is itself a (read-only) TensorCache.
        import leanloader as ll

        cache = ll.TensorCache(cache_dir, shard_bytes=SHARD_BYTES)
        cache.build(ll.TensorCache(per_sample), encode=lambda batch: batch, batch_size=16,
                    progress=False)  # fmt: skip
        marker.write_text(json.dumps(description))
    shards = sorted(str(p) for p in cache_dir.glob("shard-*.safetensors"))
    files = sorted(str(p) for p in per_sample.glob("*.safetensors"))
    return {
        "per_sample": str(per_sample),
        "cache": str(cache_dir),
        "files": files,
        "shards": shards,
        "samples": samples,
    }


# The runs that read the shard files (fio's yardstick with --cold reads one).
_SHARD_READERS = frozenset({"leanloader", "grain", "torchdata", "spdl"})


def _cold_read(data: Mapping[str, Any], run: LoaderRun) -> tuple[str, int] | None:
    """A shard file and a sample's bytes (in whole pages) for the runs that
    read the shards: fio's random reads with --cold. None for torch's runs
    (one file per sample, or every sample loaded into RAM before the timer)
    and the yardstick (from RAM)."""
    if run.name not in _SHARD_READERS or not data["shards"]:
        return None
    return data["shards"][0], -(-SAMPLE_BYTES // 4096) * 4096


def iterate_leanloader(context: LoaderContext) -> Iterator[Any]:
    import leanloader as ll

    cache = ll.TensorCache(context.data["cache"])
    loader = ll.Loader(
        cache,
        batch_size=BATCH_SIZE,
        shuffle=True,
        seed=context.seed,
        num_threads=THREADS,
        output="torch",
    )
    try:
        for epoch in range(int(context.size["epochs"])):
            loader.set_epoch(epoch)
            yield from loader
    finally:
        loader.close()


class InRamLatents:
    """Baseline (a): every sample's tensors loaded up front and kept in a list
    of small objects, like ai-toolkit's FileItemDTO with ``cache_latents``."""

    def __init__(self, files: list[str]) -> None:
        from safetensors.torch import load_file

        self.items = []
        for path in files:
            tensors = load_file(path)
            # .clone(): owned memory, not a view of the file (ai-toolkit converts
            # with .to(device, dtype), which copies).
            self.items.append({name: t.clone() for name, t in tensors.items()})

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.items[index]


class SafetensorsFiles:
    """Baseline (b): one ``.safetensors`` per sample, loaded per item."""

    def __init__(self, files: list[str]) -> None:
        self.files = files

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> dict[str, Any]:
        from safetensors.torch import load_file

        return load_file(self.files[index])


def _iterate_torch(context: LoaderContext, dataset: Any) -> Iterator[Any]:
    import torch
    from torch.utils.data import DataLoader

    loader = DataLoader(
        dataset,
        batch_size=BATCH_SIZE,
        shuffle=True,
        num_workers=THREADS,
        persistent_workers=True,
        multiprocessing_context="spawn",
        generator=torch.Generator().manual_seed(context.seed),
    )
    try:
        for _epoch in range(int(context.size["epochs"])):
            yield from loader
    finally:
        del loader


def load_in_ram(context: LoaderContext) -> InRamLatents:
    """The torch-ram run's setup (untimed): the cache loaded into RAM."""
    return InRamLatents(context.data["files"])


def iterate_torch_ram(context: LoaderContext) -> Iterator[Any]:
    yield from _iterate_torch(context, context.prepared)


def iterate_torch_files(context: LoaderContext) -> Iterator[Any]:
    yield from _iterate_torch(context, SafetensorsFiles(context.data["files"]))


class ShardSamples:
    """The samples of leanloader's own shard files, read by a peer loader as a
    user of safetensors would: each shard opened once per process with
    ``safe_open`` (a mapping), each tensor taken with ``get_tensor``; which
    shard and slot a sample is in comes from the cache's manifest. The same
    bytes in the same files as the leanloader row, so the comparison is the
    engine's, not the format's."""

    def __init__(self, cache_dir: str) -> None:
        manifest = json.loads((Path(cache_dir) / "manifest.json").read_text())
        self.shards = [str(Path(cache_dir) / shard["file"]) for shard in manifest["shards"]]
        self.entries = [(entry["shard"], entry["slot"]) for entry in manifest["entries"]]
        self._open: dict[int, Any] = {}

    def __len__(self) -> int:
        return len(self.entries)

    def _shard(self, shard: int) -> Any:
        handle = self._open.get(shard)
        if handle is None:
            from safetensors import safe_open

            handle = self._open.setdefault(shard, safe_open(self.shards[shard], framework="pt"))
        return handle

    def __getitem__(self, index: int) -> dict[str, Any]:
        shard, slot = self.entries[index]
        handle = self._shard(shard)
        return {name: handle.get_tensor(f"{slot}/{name}") for name in ("latent", "text_embedding")}


def _stack(samples: Any) -> dict[str, Any]:
    import torch

    return {name: torch.stack([sample[name] for sample in samples]) for name in samples[0]}


def _gather_samples(context: LoaderContext) -> tuple[int, Any]:
    samples = ShardSamples(context.data["cache"])
    return len(samples), lambda indices: _stack([samples[i] for i in indices])


def iterate_grain(context: LoaderContext) -> Iterator[Any]:
    # Batches made by torch.stack: NumPy has no bfloat16.
    samples = ShardSamples(context.data["cache"])
    yield from peers.grain_batches(
        samples, batch_fn=_stack, **peers.work(context, BATCH_SIZE, THREADS)
    )


def iterate_torchdata(context: LoaderContext) -> Iterator[Any]:
    yield from peers.torchdata_batches(
        *_gather_samples(context), **peers.work(context, BATCH_SIZE, THREADS)
    )


def iterate_spdl(context: LoaderContext) -> Iterator[Any]:
    yield from peers.spdl_batches(
        *_gather_samples(context), **peers.work(context, BATCH_SIZE, THREADS)
    )


def _describe_size(size: Mapping[str, Any]) -> str:
    samples = int(size["samples"])
    epochs = int(size["epochs"])
    return (
        f"{samples} samples × (latent 16×128×128 f16 + text 256×4096 bf16) = "
        f"{samples * SAMPLE_BYTES / 1e9:.2g} GB, batch {BATCH_SIZE}, shuffled, "
        f"{epochs} epoch{'s' if epochs != 1 else ''}"
    )


SCENARIO = Scenario(
    name="latents",
    description="cached latents + text embeddings: TensorCache vs torch DataLoader (seed 000)",
    sizes={
        "full": {"samples": 1000, "epochs": 2},
        "quick": {"samples": 200, "epochs": 2},
        "demo": {"samples": 100, "epochs": 1},
    },
    prepare=prepare,
    loaders=(
        LoaderRun(
            name="leanloader",
            function=iterate_leanloader,
            threads=THREADS,
            imports=("leanloader", "torch"),
            label=f"leanloader TensorCache, {THREADS} threads",
        ),
        LoaderRun(
            name="torch-ram",
            function=iterate_torch_ram,
            setup=load_in_ram,
            threads=THREADS,
            imports=("torch", "safetensors"),
            label=f"torch DataLoader, latents in RAM, {THREADS} spawned workers",
        ),
        LoaderRun(
            name="torch-files",
            function=iterate_torch_files,
            threads=THREADS,
            imports=("torch", "safetensors"),
            label=f"torch DataLoader, load_file per sample, {THREADS} spawned workers",
        ),
        LoaderRun(
            name="grain",
            function=iterate_grain,
            threads=THREADS,
            imports=("grain", "torch", "safetensors"),
            label=f"Grain MapDataset on the same shard files (safe_open), {THREADS} read threads",
        ),
        LoaderRun(
            name="torchdata",
            function=iterate_torchdata,
            threads=THREADS,
            imports=("torchdata.nodes", "torch", "safetensors"),
            label=f"torchdata.nodes on the same shard files (safe_open), {THREADS} threads",
        ),
        LoaderRun(
            name="spdl",
            function=iterate_spdl,
            threads=THREADS,
            imports=("spdl.pipeline", "torch", "safetensors"),
            label=f"SPDL pipeline on the same shard files (safe_open), {THREADS} threads",
        ),
        copy_and_read_run(
            batch_shape=(BATCH_SIZE, SAMPLE_BYTES),
            dtype=np.uint8,
            batches_per_epoch=lambda size: -(-int(size["samples"]) // BATCH_SIZE),
            threads=THREADS,
            output="torch",
            batch_label="10.5 MB",
        ),
    ),
    ratios=(
        ("leanloader", "torch-files"),
        ("leanloader", "torch-ram"),
        ("leanloader", "grain"),
        ("leanloader", "torchdata"),
        ("leanloader", "spdl"),
        ("leanloader", "copy-and-read"),
    ),
    goals=(
        Goal(
            "samples/s ≥ 3× torch-files",
            "samples_per_s",
            at_least=3.0,
            ratio="leanloader/torch-files",
        ),
        Goal(
            "peak unreclaimable ≤ ¼ torch-ram",
            "peak_unreclaimable_bytes",
            at_most=0.25,
            ratio="leanloader/torch-ram",
        ),
        Goal(
            "peak unreclaimable ≤ ½ torch-files",
            "peak_unreclaimable_bytes",
            at_most=0.5,
            ratio="leanloader/torch-files",
        ),
        *peer_goals(
            (("Grain", "grain"), ("torchdata", "torchdata"), ("SPDL", "spdl")),
            where="on the same shard files",
        ),
        Goal(
            "batch assembly ≥ 90% of memcpy",
            "fraction_of_memcpy",
            at_least=0.9,
            loader="leanloader",
            yardstick="copy-and-read",
        ),
        Goal(
            "batch assembly ≥ 60% of memcpy",
            "fraction_of_memcpy",
            at_least=0.6,
            loader="leanloader",
            yardstick="copy-and-read",
        ),
    ),
    warm_files=lambda data: [*data["shards"], *data["files"]],
    cold_read=_cold_read,
    describe_size=_describe_size,
)
