"""Damaged images: one outcome per file, whatever the random crop.

Files written by Pillow (JPEG baseline and progressive, 4:2:0 and 4:4:4,
grayscale; PNG; WebP lossy and lossless), then truncated at 10/50/90%, hit
with byte flips in the compressed data, or given a broken header. Each goes
through 20 epochs of RandomResizedCrop (each epoch a different region): it
must either decode in every epoch or fail in every epoch, and it fails
exactly where Pillow's `Image.open(...).load()` fails.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

import leanloader as ll

EPOCHS = 20


def _photo(width: int, height: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // width, y * 255 // height, (x + y) * 127 // (width + height)], -1)
    noise = rng.integers(0, 40, size=(height, width, 3))
    return Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8))


def _encodings() -> dict[str, bytes]:
    photo = _photo(192, 160, 1)
    out = {}
    for name, image, fmt, options in (
        ("baseline420.jpg", photo, "JPEG", {"quality": 85}),
        ("baseline444.jpg", photo, "JPEG", {"quality": 85, "subsampling": 0}),
        ("progressive.jpg", photo, "JPEG", {"quality": 85, "progressive": True}),
        ("gray.jpg", photo.convert("L"), "JPEG", {"quality": 85}),
        ("photo.png", photo, "PNG", {}),
        ("lossy.webp", photo, "WEBP", {"quality": 80}),
        ("lossless.webp", photo, "WEBP", {"lossless": True}),
    ):
        buffer = io.BytesIO()
        image.save(buffer, fmt, **options)
        out[name] = buffer.getvalue()
    return out


def _damaged() -> dict[str, bytes]:
    files = {}
    for name, data in _encodings().items():
        for percent in (10, 50, 90):
            files[f"{name}-truncated{percent}"] = data[: len(data) * percent // 100]
        for place in (30, 60, 85):
            flipped = bytearray(data)
            at = len(data) * place // 100
            flipped[at] ^= 0x5A
            flipped[at + 7] ^= 0xA5
            files[f"{name}-flip{place}"] = bytes(flipped)
        header = bytearray(data)
        header[2:6] = b"\x00\x00\x00\x00" if not name.endswith(".webp") else b"\x00\x00\x00\x01"
        files[f"{name}-header"] = bytes(header)
    return files


def _pillow_refuses(data: bytes) -> bool:
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
        return False
    except Exception:
        return True


def test_damaged_files_have_one_outcome_per_file_and_it_is_pillow_s(tmp_path):
    files = _damaged()
    paths = []
    for name, data in files.items():
        path = tmp_path / name
        path.write_bytes(data)
        paths.append(path)
    outcomes: dict[str, set[bool]] = {path.name: set() for path in paths}
    for index, path in enumerate(paths):
        # One sample per loader; the seed and the epoch pick its crop.
        source = ll.Images([path], transform=[ll.RandomResizedCrop(24)])
        loader = ll.Loader(source, batch_size=1, seed=index, output="numpy", num_threads=1)
        for epoch in range(EPOCHS):
            loader.set_epoch(epoch)
            try:
                with _quiet():
                    next(iter(loader))
                outcomes[path.name].add(True)
            except (ll.FormatError, OSError):
                outcomes[path.name].add(False)
    varying = sorted(name for name, seen in outcomes.items() if len(seen) > 1)
    assert varying == [], f"outcome depends on the crop: {varying}"
    differ = sorted(
        name for name, seen in outcomes.items() if (False in seen) != _pillow_refuses(files[name])
    )
    assert differ == [], f"refused by one reader only: {differ}"


class _quiet:
    """Corrupt-but-decodable JPEGs warn (once per file): not under test here."""

    def __enter__(self):
        import warnings

        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *exc):
        return self._catch.__exit__(*exc)
