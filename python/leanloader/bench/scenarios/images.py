"""Scenario `images`: an ImageNet-style training pipeline over JPEG files.

Data: generated photo-like JPEGs, about 500×375 at quality 90, with one in
twenty 2000×1500 (``quick``: 512 files; ``full``: 4,000). Every loader does
``RandomResizedCrop(224)`` + horizontal flip + normalize to float32 CHW,
batch 256, shuffled, 2 threads / 2 workers.

- ``leanloader``: ``ll.Images`` with ``ll.RandomResizedCrop``,
  ``ll.RandomHorizontalFlip`` and ``ll.Normalize`` on 2 native threads (JPEG
  region + DCT-scaled decode, resize and normalize fused into the batch row).
- ``decode-limit``: libjpeg-turbo's full-size decode of the same files on the
  same 2 threads (``ll.Images`` without transforms, uint8 HWC, decoded
  straight into the batch slot): the images/s a pipeline that decodes whole
  images cannot pass.
- ``torch``: ``torch.utils.data.DataLoader`` (2 persistent workers) over a
  Dataset that opens each file with Pillow, converts to RGB and applies
  torchvision's RandomResizedCrop algorithm (the same code as
  ``transforms.RandomResizedCrop.get_params``; PyPI's torchvision does not
  import beside this torch), ``Image.resize(BILINEAR)`` (antialiased), a flip
  and ToTensor + Normalize in torch.
- ``spdl``: SPDL's pipeline (``spdl.pipeline.PipelineBuilder``, 2 threads):
  ``spdl.io.demux_image`` for the size, the same crop parameters, FFmpeg's
  decoder and filter graph (``crop``, bilinear ``scale``, ``hflip``), batched
  by ``spdl.io.convert_frames`` and normalized in torch. A bench-only
  dependency (``pip install spdl==0.8.0``); skipped when it is not installed.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from leanloader.bench.scenarios import Goal, LoaderContext, LoaderRun, Scenario

BATCH_SIZE = 256
THREADS = 2
CROP = 224
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
SMALL = (500, 375)
LARGE = (2000, 1500)
LARGE_EVERY = 20  # one file in LARGE_EVERY is LARGE


def _photo(width: int, height: int, seed: int):
    """Photo-like content (smooth shapes, some texture) that JPEG encodes to
    typical sizes; pure noise would be unrealistically hard to decode."""
    import numpy as np
    from PIL import Image, ImageFilter

    rng = np.random.default_rng(seed)
    base = Image.fromarray(
        rng.integers(0, 256, (height // 16, width // 16, 3), dtype=np.uint8)
    ).resize((width, height), Image.BICUBIC)
    texture = Image.fromarray(rng.integers(0, 256, (height // 2, width // 2, 3), dtype=np.uint8))
    texture = texture.resize((width, height), Image.BILINEAR).filter(ImageFilter.GaussianBlur(1))
    return Image.blend(base, texture, 0.25)


def prepare(data_dir: Path, size: Mapping[str, Any]) -> dict[str, Any]:
    count = int(size["files"])
    folder = Path(data_dir) / f"images-{count}-q90"
    paths = [folder / f"{i:06d}.jpg" for i in range(count)]
    done = folder / "complete"
    if not done.exists():
        folder.mkdir(parents=True, exist_ok=True)
        for i, path in enumerate(paths):
            if path.exists():
                continue
            width, height = LARGE if i % LARGE_EVERY == LARGE_EVERY - 1 else SMALL
            partial = path.with_name(path.name + ".partial")
            _photo(width, height, seed=i).save(partial, "JPEG", quality=90)
            os.replace(partial, path)
        done.write_text("ok")
    return {"paths": [str(p) for p in paths]}


def iterate_leanloader(context: LoaderContext) -> Iterator[Any]:
    import leanloader as ll

    source = ll.Images(
        context.data["paths"],
        transform=[
            ll.RandomResizedCrop(CROP),
            ll.RandomHorizontalFlip(),
            ll.Normalize(MEAN, STD),
        ],
    )
    loader = ll.Loader(
        source, batch_size=BATCH_SIZE, shuffle=True, seed=context.seed, num_threads=THREADS
    )
    try:
        for epoch in range(int(context.size["epochs"])):
            loader.set_epoch(epoch)
            yield from loader
    finally:
        loader.close()


def iterate_decode_limit(context: LoaderContext) -> Iterator[Any]:
    import torch

    import leanloader as ll

    source = ll.Images(context.data["paths"], layout="HWC")
    loader = ll.Loader(
        source,
        batch_size=BATCH_SIZE,
        shuffle=True,
        seed=context.seed,
        num_threads=THREADS,
        collate="list",
    )
    try:
        for epoch in range(int(context.size["epochs"])):
            loader.set_epoch(epoch)
            for batch in loader:
                # The indices first: the harness counts samples by the first
                # array's leading dimension.
                yield torch.as_tensor(loader.last_indices), batch["image"]
    finally:
        loader.close()


def random_resized_crop_params(
    width: int, height: int, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)
) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params (Python's random for torch's)."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * random.uniform(*scale)
        aspect_ratio = math.exp(random.uniform(*log_ratio))
        w = round(math.sqrt(target_area * aspect_ratio))
        h = round(math.sqrt(target_area / aspect_ratio))
        if 0 < w <= width and 0 < h <= height:
            return random.randint(0, height - h), random.randint(0, width - w), h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, round(width / min(ratio))
    elif in_ratio > max(ratio):
        h, w = height, round(height * max(ratio))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


class PilImages:
    """A torchvision-style dataset: PIL decode, RandomResizedCrop, flip,
    ToTensor + Normalize."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> Any:
        import numpy as np
        import torch
        from PIL import Image

        with Image.open(self.paths[index]) as opened:
            image = opened.convert("RGB")
        i, j, h, w = random_resized_crop_params(*image.size)
        image = image.resize((CROP, CROP), Image.BILINEAR, box=(j, i, j + w, i + h))
        if random.random() < 0.5:
            image = image.transpose(Image.FLIP_LEFT_RIGHT)
        tensor = torch.from_numpy(np.asarray(image)).permute(2, 0, 1).float().div(255)
        mean = torch.tensor(MEAN).view(3, 1, 1)
        std = torch.tensor(STD).view(3, 1, 1)
        return (tensor - mean) / std


def iterate_torch(context: LoaderContext) -> Iterator[Any]:
    import torch
    from torch.utils.data import DataLoader

    loader = DataLoader(
        PilImages(context.data["paths"]),
        batch_size=BATCH_SIZE,
        shuffle=True,
        num_workers=THREADS,
        persistent_workers=True,
        generator=torch.Generator().manual_seed(context.seed),
        worker_init_fn=_seed_worker,
    )
    try:
        for _epoch in range(int(context.size["epochs"])):
            yield from loader
    finally:
        del loader


def iterate_spdl(context: LoaderContext) -> Iterator[Any]:
    import spdl.io
    import torch
    from spdl.pipeline import PipelineBuilder

    mean = torch.tensor(MEAN).view(1, 3, 1, 1)
    std = torch.tensor(STD).view(1, 3, 1, 1)

    def load(path: str) -> Any:
        packets = spdl.io.demux_image(path)
        i, j, h, w = random_resized_crop_params(packets.width, packets.height)
        flip = ",hflip" if random.random() < 0.5 else ""
        return spdl.io.decode_packets(
            packets,
            filter_desc=f"crop={w}:{h}:{j}:{i},scale={CROP}:{CROP}:flags=bilinear{flip},"
            "format=rgb24",
        )

    def collate(frames: list[Any]) -> Any:
        batch = spdl.io.to_torch(spdl.io.convert_frames(frames))  # (B, H, W, 3) uint8
        return (batch.permute(0, 3, 1, 2).float().div(255) - mean) / std

    order = random.Random(context.seed)
    for _epoch in range(int(context.size["epochs"])):
        paths = list(context.data["paths"])
        order.shuffle(paths)
        pipeline = (
            PipelineBuilder()
            .add_source(paths)
            .pipe(load, concurrency=THREADS)
            .aggregate(BATCH_SIZE)
            .pipe(collate)
            .add_sink(2)
            .build(num_threads=THREADS)
        )
        with pipeline.auto_stop():
            yield from pipeline


def _seed_worker(worker_id: int) -> None:
    import torch

    random.seed(torch.initial_seed() % 2**32 + worker_id)


def _describe_size(size: Mapping[str, Any]) -> str:
    return (
        f"{int(size['files'])} JPEGs q90 ({SMALL[0]}×{SMALL[1]}, 1 in {LARGE_EVERY} "
        f"{LARGE[0]}×{LARGE[1]}), RandomResizedCrop({CROP}) + flip + normalize to float32 "
        f"CHW, batch {BATCH_SIZE}, shuffled, {int(size['epochs'])} epoch(s)"
    )


SCENARIO = Scenario(
    name="images",
    description="JPEG decode + RandomResizedCrop + flip + normalize, batch 256, 2 threads/workers",
    sizes={
        "full": {"files": 4000, "epochs": 1},
        "quick": {"files": 512, "epochs": 1},
    },
    prepare=prepare,
    loaders=(
        LoaderRun(
            name="leanloader",
            function=iterate_leanloader,
            threads=THREADS,
            imports=("leanloader", "torch"),
            label=f"leanloader ll.Images, {THREADS} threads",
        ),
        LoaderRun(
            name="decode-limit",
            function=iterate_decode_limit,
            threads=THREADS,
            imports=("leanloader", "torch"),
            label=f"libjpeg-turbo full-size decode only, {THREADS} threads",
        ),
        LoaderRun(
            name="torch",
            function=iterate_torch,
            threads=THREADS,
            imports=("torch", "PIL"),
            label=f"torch DataLoader + PIL, {THREADS} worker processes",
        ),
        LoaderRun(
            name="spdl",
            function=iterate_spdl,
            threads=THREADS,
            imports=("spdl.io", "spdl.pipeline", "torch"),
            label=f"SPDL pipeline (FFmpeg decode + filter graph), {THREADS} threads",
        ),
    ),
    ratios=(("leanloader", "torch"), ("leanloader", "spdl"), ("leanloader", "decode-limit")),
    goals=(
        Goal("samples/s ≥ 2× torch+PIL", "samples_per_s", at_least=2.0, ratio="leanloader/torch"),
        Goal("samples/s ≥ 1× SPDL", "samples_per_s", at_least=1.0, ratio="leanloader/spdl"),
        Goal(
            "samples/s ≥ 1.2× the full-decode limit",
            "samples_per_s",
            at_least=1.2,
            ratio="leanloader/decode-limit",
        ),
        Goal(
            "peak unreclaimable memory ≤ ½ torch+PIL",
            "peak_unreclaimable_bytes",
            at_most=0.5,
            ratio="leanloader/torch",
        ),
    ),
    warm_files=lambda data: list(data["paths"]),
    describe_size=_describe_size,
)
