"""A short training loop: encode once into a TensorCache, then train from it.

The images are small random PNGs (decoded and resized by leanloader's native
threads) and the "encoder" a fixed random projection, so the example runs
anywhere in seconds; swap in your files and your VAE.

    python examples/train_from_cache.py [--samples 512] [--epochs 3] [--dir DIR]
"""

from __future__ import annotations

import argparse
import struct
import tempfile
import zlib
from pathlib import Path

import numpy as np
import torch

import leanloader as ll


def write_png(path: Path, rgb: np.ndarray) -> None:
    """An 8-bit RGB PNG with the standard library (no imaging package needed)."""
    height, width, _ = rgb.shape
    rows = b"".join(b"\0" + rgb[y].tobytes() for y in range(height))

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + body))
        return struct.pack(">I", len(body)) + kind + body + crc

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def make_images(folder: Path, count: int) -> None:
    """One PNG per sample, 40x48 RGB."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        write_png(folder / f"img{i:05d}.png", rng.integers(0, 256, (40, 48, 3), dtype=np.uint8))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    work = args.dir or Path(tempfile.mkdtemp(prefix="leanloader-example-"))

    make_images(work / "images", args.samples)
    # Decoded and resized to 3x32x32 float32 (x / 255) in the loader's threads.
    images = ll.Images(
        str(work / "images" / "*.png"), transform=[ll.Resize((32, 32))], dtype="float32"
    )

    # Encode once: the cache keeps one copy on disk, memory-mapped by every reader.
    projection = torch.randn(3 * 32 * 32, 64, generator=torch.Generator().manual_seed(0))
    projection /= (3 * 32 * 32) ** 0.5

    def encode(batch):
        flat = batch["image"].reshape(len(batch["image"]), -1)
        # The model learns to predict the image's brightness from its latent.
        return {
            "latent": (flat @ projection).to(torch.bfloat16),
            "target": flat.mean(dim=1, keepdim=True),
        }

    cache = ll.TensorCache(work / "cache")
    cache.build(images, encode=encode, batch_size=64, progress=False, config={"dim": 64})

    model = torch.nn.Linear(64, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = ll.Loader(cache, batch_size=32, shuffle=True, seed=0, num_threads=2)
    print(f"{len(cache)} cached samples; batch memory planned: {loader.memory_bill()} bytes")
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        total = 0.0
        for batch in loader:
            prediction = model(batch["latent"].float())
            loss = torch.nn.functional.mse_loss(prediction, batch["target"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
        print(f"epoch {epoch}: mean loss {total / len(loader):.4f}")
    print(ll.memory_report(tree=False)["total"]["pss_anon_bytes"] // 2**20, "MiB private")


if __name__ == "__main__":
    main()
