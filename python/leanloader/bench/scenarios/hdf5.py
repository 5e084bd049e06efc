"""Scenario `hdf5`: seed 004's fMRI trials joined with stimulus images, from HDF5.

Data: ``sessions`` HDF5 files of ``trials`` float32 fMRI betas each (the
seed's (150, 150, 100), 9 MB per trial in the full size), chunked one trial
per chunk, written three times: uncompressed, gzip level 1 (with shuffle) and
Blosc-LZ4 (byte shuffle; hdf5plugin's filter, PyTables' default codec); plus
one file of ``images`` 425×425×3 uint8 stimuli and an index trial -> image.
Batch 32, shuffled.

- ``leanloader`` / ``leanloader-gzip`` / ``leanloader-blosc``: ``ll.HDF5Source``
  with the index join, 4 native threads; chunks are read with ``pread`` and
  (gzip, Blosc) decoded in those threads, past HDF5's global lock.
- ``torch-4`` / ``torch-2`` (and ``-gzip``, ``-blosc``): the seed's Dataset —
  h5py files opened lazily in ``__getitem__`` and kept per worker, one trial
  and its image per item (hdf5plugin imported for Blosc, as its documentation
  says) — under ``torch.utils.data.DataLoader`` with 4 or 2 workers,
  persistent, prefetch factor 2 (fork on Linux up to Python 3.13).
- ``pread``: the limit: the same chunk and image bytes read with
  ``os.preadv`` by 4 threads straight into one batch buffer reused for every
  batch, no decoding, no prefetch.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from leanloader.bench.scenarios import Goal, LoaderContext, LoaderRun, Scenario

BATCH_SIZE = 32
THREADS = 4
IMAGE_SHAPE = (425, 425, 3)
VARIANTS = ("raw", "gzip", "blosc")


def _folder(data_dir: Path, size: Mapping[str, Any]) -> Path:
    shape = "x".join(str(d) for d in size["trial_shape"])
    return (
        Path(data_dir) / f"hdf5-{size['sessions']}x{size['trials']}x{shape}-{size['images']}img-v2"
    )


def _compression(variant: str) -> dict[str, Any]:
    if variant == "gzip":
        return {"compression": "gzip", "compression_opts": 1, "shuffle": True}
    if variant == "blosc":
        import hdf5plugin

        return dict(hdf5plugin.Blosc(cname="lz4", clevel=5, shuffle=hdf5plugin.Blosc.SHUFFLE))
    return {}


def prepare(data_dir: Path, size: Mapping[str, Any]) -> dict[str, Any]:
    import h5py

    folder = _folder(data_dir, size)
    done = folder / "complete"
    sessions, trials = int(size["sessions"]), int(size["trials"])
    trial_shape = tuple(int(d) for d in size["trial_shape"])
    images = int(size["images"])
    if not done.exists():
        folder.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(0)
        for variant in VARIANTS:
            (folder / variant).mkdir(exist_ok=True)
        for s in range(sessions):
            # Betas rounded to 1/64: noisy like real betas, somewhat compressible.
            betas = np.round(rng.normal(size=(trials, *trial_shape)) * 64).astype(np.float32) / 64
            for variant in VARIANTS:
                with h5py.File(folder / variant / f"betas_session{s + 1:02d}.hdf5", "w") as f:
                    f.create_dataset(
                        "betas", data=betas, chunks=(1, *trial_shape), **_compression(variant)
                    )
        pictures = rng.integers(0, 256, size=(images, *IMAGE_SHAPE), dtype=np.uint8)
        with h5py.File(folder / "stimuli.hdf5", "w") as f:
            f.create_dataset("images", data=pictures)
        np.save(folder / "trial_to_image.npy", rng.integers(0, images, size=sessions * trials))
        done.touch()
    return {
        "folder": str(folder),
        "sessions": sessions,
        "trials": trials,
        "trial_shape": list(trial_shape),
        "bytes_per_sample": int(np.prod(trial_shape)) * 4 + int(np.prod(IMAGE_SHAPE)),
    }


def _paths(data: Mapping[str, Any], variant: str) -> tuple[str, str, np.ndarray]:
    folder = Path(data["folder"])
    return (
        str(folder / variant / "betas_session*.hdf5"),
        str(folder / "stimuli.hdf5"),
        np.load(folder / "trial_to_image.npy"),
    )


def iterate_leanloader(context: LoaderContext) -> Iterator[Any]:
    import leanloader as ll

    sessions, stimuli, trial_to_image = _paths(context.data, context.options["variant"])
    source = ll.HDF5Source(
        {"fmri": (sessions, "betas"), "image": (stimuli, "images", trial_to_image)}
    )
    loader = ll.Loader(
        source,
        batch_size=BATCH_SIZE,
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


class SessionDataset:
    """Seed 004's Dataset: h5py files opened lazily in each worker, kept open."""

    def __init__(self, sessions: str, stimuli: str, trial_to_image: np.ndarray, trials: int):
        import glob

        self.files = sorted(glob.glob(sessions))
        self.stimuli = stimuli
        self.trial_to_image = trial_to_image
        self.trials = trials
        self._handles: dict[str, Any] = {}

    def __len__(self) -> int:
        return len(self.trial_to_image)

    def _open(self, path: str) -> Any:
        import h5py
        import hdf5plugin  # noqa: F401  (Blosc files: the plugin registers the filter)

        if path not in self._handles:
            self._handles[path] = h5py.File(path, "r")
        return self._handles[path]

    def __getitem__(self, index: int) -> dict[str, Any]:
        import torch

        session, trial = divmod(int(index), self.trials)
        fmri = self._open(self.files[session])["betas"][trial]
        image = self._open(self.stimuli)["images"][int(self.trial_to_image[index])]
        return {"fmri": torch.from_numpy(fmri), "image": torch.from_numpy(image)}


def iterate_torch(context: LoaderContext) -> Iterator[Any]:
    import torch
    from torch.utils.data import DataLoader

    sessions, stimuli, trial_to_image = _paths(context.data, context.options["variant"])
    loader = DataLoader(
        SessionDataset(sessions, stimuli, trial_to_image, int(context.data["trials"])),
        batch_size=BATCH_SIZE,
        shuffle=True,
        num_workers=int(context.options["workers"]),
        persistent_workers=True,
        prefetch_factor=2,
        generator=torch.Generator().manual_seed(context.seed),
    )
    try:
        for _epoch in range(int(context.size["epochs"])):
            yield from loader
    finally:
        del loader


def iterate_pread(context: LoaderContext) -> Iterator[Any]:
    """The same bytes (uncompressed chunks and images) read with pread by 4 threads."""
    import glob
    from concurrent.futures import ThreadPoolExecutor

    import h5py

    sessions, stimuli, trial_to_image = _paths(context.data, "raw")
    extents = []  # (fd, offset) of each trial's chunk
    fds = []
    for path in sorted(glob.glob(sessions)):
        with h5py.File(path, "r") as f:
            dataset = f["betas"].id
            offsets = [
                dataset.get_chunk_info(i).byte_offset for i in range(dataset.get_num_chunks())
            ]
        fd = os.open(path, os.O_RDONLY)
        fds.append(fd)
        extents.extend((fd, offset) for offset in offsets)
    with h5py.File(stimuli, "r") as f:
        image_offset = f["images"].id.get_offset()
    image_fd = os.open(stimuli, os.O_RDONLY)
    trial_shape = tuple(context.data["trial_shape"])
    image_bytes = int(np.prod(IMAGE_SHAPE))
    rng = np.random.default_rng(context.seed)
    # One batch buffer, written once before timing and reused (each batch is
    # consumed before the next is read), like leanloader's recycled slots.
    fmri_buffer = np.ones((BATCH_SIZE, *trial_shape), np.float32)
    image_buffer = np.ones((BATCH_SIZE, *IMAGE_SHAPE), np.uint8)
    try:
        with ThreadPoolExecutor(THREADS) as pool:
            for _epoch in range(int(context.size["epochs"])):
                order = rng.permutation(len(extents))
                for start in range(0, len(order), BATCH_SIZE):
                    rows = order[start : start + BATCH_SIZE]
                    fmri = fmri_buffer[: len(rows)]
                    image = image_buffer[: len(rows)]

                    def read(slot: int, row: int, fmri=fmri, image=image) -> None:
                        fd, offset = extents[row]
                        os.preadv(fd, [memoryview(fmri[slot]).cast("B")], offset)
                        os.preadv(
                            image_fd,
                            [memoryview(image[slot]).cast("B")],
                            image_offset + int(trial_to_image[row]) * image_bytes,
                        )

                    list(pool.map(read, range(len(rows)), rows))
                    yield {"fmri": fmri, "image": image}
    finally:
        for fd in [*fds, image_fd]:
            os.close(fd)


def _describe_size(size: Mapping[str, Any]) -> str:
    shape = "×".join(str(d) for d in size["trial_shape"])
    mb = np.prod(size["trial_shape"]) * 4 / 1e6
    return (
        f"{size['sessions']} session files × {size['trials']} trials of float32 {shape} "
        f"({mb:.1f} MB, one chunk each; uncompressed, gzip-1, Blosc-LZ4), {size['images']} images "
        f"425×425×3 uint8 joined by index; batch {BATCH_SIZE}, shuffled, {size['epochs']} epochs"
    )


def _warm_files(data: Mapping[str, Any]) -> list[str]:
    folder = Path(data["folder"])
    return [str(p) for p in sorted(folder.rglob("*.hdf5"))]


_OUTPUT = "torch" if importlib.util.find_spec("torch") is not None else "numpy"
_LEANLOADER_IMPORTS = ("leanloader", "torch") if _OUTPUT == "torch" else ("leanloader",)


def _leanloader(variant: str) -> LoaderRun:
    return LoaderRun(
        name="leanloader",
        function=iterate_leanloader,
        threads=THREADS,
        imports=_LEANLOADER_IMPORTS,
        options={"output": _OUTPUT, "variant": variant},
        row_options=("variant",),
        label=f"leanloader HDF5Source, {THREADS} threads ({variant})",
        key="leanloader" if variant == "raw" else f"leanloader-{variant}",
    )


def _torch(workers: int, variant: str) -> LoaderRun:
    suffix = "" if variant == "raw" else f"-{variant}"
    return LoaderRun(
        name="torch",
        function=iterate_torch,
        threads=workers,
        imports=("torch", "h5py", "hdf5plugin"),
        options={"workers": workers, "variant": variant},
        row_options=("workers", "variant"),
        label=f"torch DataLoader + h5py, {workers} workers ({variant})",
        key=f"torch-{workers}{suffix}",
    )


SCENARIO = Scenario(
    name="hdf5",
    description="seed 004: fMRI trials from HDF5 session files joined with stimulus images",
    sizes={
        "full": {
            "sessions": 3,
            "trials": 100,
            "trial_shape": [150, 150, 100],
            "images": 300,
            "epochs": 2,
        },
        "quick": {
            "sessions": 3,
            "trials": 32,
            "trial_shape": [75, 75, 50],
            "images": 48,
            "epochs": 2,
        },
    },
    prepare=prepare,
    loaders=(
        _leanloader("raw"),
        _leanloader("gzip"),
        _leanloader("blosc"),
        _torch(4, "raw"),
        _torch(2, "raw"),
        _torch(4, "gzip"),
        _torch(2, "gzip"),
        _torch(4, "blosc"),
        _torch(2, "blosc"),
        LoaderRun(
            name="pread",
            function=iterate_pread,
            threads=THREADS,
            imports=("h5py",),
            label=f"raw pread of the same bytes, {THREADS} threads",
        ),
    ),
    ratios=(
        ("leanloader", "torch-4"),
        ("leanloader", "torch-2"),
        ("leanloader-gzip", "torch-4-gzip"),
        ("leanloader-gzip", "torch-2-gzip"),
        ("leanloader-blosc", "torch-4-blosc"),
        ("leanloader-blosc", "torch-2-blosc"),
        ("leanloader", "pread"),
    ),
    goals=(
        Goal(
            "samples/s ≥ 3× torch, 4 workers",
            "samples_per_s",
            at_least=3.0,
            ratio="leanloader/torch-4",
        ),
        Goal(
            "samples/s ≥ 3× torch, 2 workers",
            "samples_per_s",
            at_least=3.0,
            ratio="leanloader/torch-2",
        ),
        Goal(
            "gzip: samples/s ≥ 1.5× torch, 4 workers",
            "samples_per_s",
            at_least=1.5,
            ratio="leanloader-gzip/torch-4-gzip",
        ),
        Goal(
            "gzip: samples/s ≥ 1.5× torch, 2 workers",
            "samples_per_s",
            at_least=1.5,
            ratio="leanloader-gzip/torch-2-gzip",
        ),
        Goal(
            "Blosc-LZ4: samples/s ≥ 2× torch + hdf5plugin, 4 workers",
            "samples_per_s",
            at_least=2.0,
            ratio="leanloader-blosc/torch-4-blosc",
        ),
        Goal(
            "Blosc-LZ4: samples/s ≥ 2× torch + hdf5plugin, 2 workers",
            "samples_per_s",
            at_least=2.0,
            ratio="leanloader-blosc/torch-2-blosc",
        ),
        Goal(
            "uncompressed: ≥ 80% of raw pread",
            "samples_per_s",
            at_least=0.8,
            ratio="leanloader/pread",
        ),
        Goal(
            "peak unreclaimable memory ≤ ½ torch (4 workers)",
            "peak_unreclaimable_bytes",
            at_most=0.5,
            ratio="leanloader/torch-4",
        ),
        Goal(
            "time to first batch ≤ ⅓ torch (4 workers)",
            "first_batch_s",
            at_most=1 / 3,
            ratio="leanloader/torch-4",
        ),
    ),
    warm_files=_warm_files,
    describe_size=_describe_size,
)
