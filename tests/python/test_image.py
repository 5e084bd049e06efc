"""Images and ImageFolder against Pillow and torchvision's algorithms: decoded
pixels, RandomResizedCrop boxes, resize quality, determinism across threads,
bad files."""

from __future__ import annotations

import io
import math
import os
import pickle
import struct
import subprocess
import sys
import textwrap
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest

import leanloader as ll

Image = pytest.importorskip("PIL.Image")
ImageFilter = pytest.importorskip("PIL.ImageFilter")


def natural_image(height: int, width: int, seed: int = 0) -> Image.Image:
    """Photo-like content: smooth shapes plus blurred texture."""
    rng = np.random.default_rng(seed)
    base = Image.fromarray(
        rng.integers(0, 256, (max(1, height // 8), max(1, width // 8), 3), dtype=np.uint8)
    ).resize((width, height), Image.BICUBIC)
    texture = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
    return Image.blend(base, texture.filter(ImageFilter.GaussianBlur(2)), 0.3)


def decode(path, **options) -> np.ndarray:
    return ll.decode_image(path, **options)


def pillow_rgb(path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


def read_all(source, **loader_options) -> dict[str, list[np.ndarray]]:
    options = {"batch_size": 4, "num_threads": 2, "output": "numpy", "collate": "list"}
    options.update(loader_options)
    out: dict[str, list[np.ndarray]] = {}
    with ll.Loader(source, **options) as loader:
        for batch in loader:
            for name, values in batch.items():
                if isinstance(values, list):
                    out.setdefault(name, []).extend(v.copy() for v in values)
                else:
                    out.setdefault(name, []).extend(values.copy())
    return out


# -- decoding equals Pillow ---------------------------------------------------


@pytest.mark.parametrize("progressive", [False, True])
@pytest.mark.parametrize("subsampling", [0, 2])  # 4:4:4, 4:2:0
def test_jpeg_pixels_equal_pillows(tmp_path, progressive, subsampling):
    path = tmp_path / "x.jpg"
    natural_image(75, 101).save(path, quality=90, progressive=progressive, subsampling=subsampling)
    ours, theirs = decode(path), pillow_rgb(path)
    assert ours.shape == theirs.shape == (75, 101, 3)
    assert np.abs(ours.astype(int) - theirs.astype(int)).max() <= 1


@pytest.mark.parametrize("mode", ["L", "CMYK"])
def test_gray_and_cmyk_jpegs_convert_as_pillow(tmp_path, mode):
    path = tmp_path / "x.jpg"
    natural_image(40, 56).convert(mode).save(path, quality=92)
    ours, theirs = decode(path), pillow_rgb(path)
    assert np.abs(ours.astype(int) - theirs.astype(int)).max() <= 1
    with Image.open(path) as image:
        gray = np.asarray(image.convert("L"))
    assert np.abs(decode(path, mode="L")[..., 0].astype(int) - gray.astype(int)).max() <= 1


def test_a_cmyk_jpeg_without_an_adobe_marker_is_inverted_as_pillow(tmp_path):
    """Pillow reads every 4-component JPEG as inverted CMYK ("assume adobe
    conventions"), with the Adobe APP14 marker or without it."""
    written = tmp_path / "adobe.jpg"
    natural_image(24, 32).convert("CMYK").save(written, quality=95)
    data = written.read_bytes()
    at = data.find(b"\xff\xee")  # APP14, "Adobe"
    assert data[at + 4 : at + 9] == b"Adobe"
    length = int.from_bytes(data[at + 2 : at + 4], "big")
    path = tmp_path / "no_adobe.jpg"
    path.write_bytes(data[:at] + data[at + 2 + length :])
    with Image.open(path) as image:
        assert image.mode == "CMYK" and "adobe" not in image.info
    ours, theirs = decode(path), pillow_rgb(path)
    assert np.abs(ours.astype(int) - theirs.astype(int)).max() <= 1


def png_file(pixels: np.ndarray, color_type: int, depth: int, plte=None, trns=None) -> bytes:
    """A PNG written by hand (any color type and bit depth Pillow cannot
    write), filter 0, so that Pillow reads it as the reference."""
    height, width = pixels.shape[:2]
    rows = pixels.reshape(height, -1).astype(np.uint64)
    if depth == 16:
        raw = rows.astype(">u2").tobytes()
        row_bytes = rows.shape[1] * 2
    elif depth == 8:
        raw = rows.astype(np.uint8).tobytes()
        row_bytes = rows.shape[1]
    else:
        per_byte = 8 // depth
        padded = -rows.shape[1] % per_byte
        rows = np.pad(rows, ((0, 0), (0, padded)))
        groups = rows.reshape(height, -1, per_byte)
        shifts = np.arange(per_byte - 1, -1, -1, dtype=np.uint64) * depth
        raw = (groups << shifts).sum(axis=2).astype(np.uint8).tobytes()
        row_bytes = len(raw) // height
    data = b"".join(b"\0" + raw[y * row_bytes : (y + 1) * row_bytes] for y in range(height))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    out = b"\x89PNG\r\n\x1a\n" + chunk(
        b"IHDR", struct.pack(">IIBBBBB", width, height, depth, color_type, 0, 0, 0)
    )
    if plte is not None:
        out += chunk(b"PLTE", bytes(plte))
    if trns is not None:
        out += chunk(b"tRNS", trns)
    return out + chunk(b"IDAT", zlib.compress(data)) + chunk(b"IEND", b"")


PNG_CASES = [
    # (color type, channels, bit depths)
    (0, 1, [1, 2, 4, 8, 16]),  # gray
    (2, 3, [8, 16]),  # RGB
    (3, 1, [1, 2, 4, 8]),  # palette
    (4, 2, [8, 16]),  # gray + alpha
    (6, 4, [8, 16]),  # RGBA
]


@pytest.mark.parametrize(
    "color_type,channels,depth,transparency",
    [
        (t, c, d, trns)
        for t, c, depths in PNG_CASES
        for d in depths
        for trns in ([False] if t in (4, 6) else [False, True])  # tRNS only without alpha
    ],
)
@pytest.mark.filterwarnings("ignore:Palette images with Transparency")
def test_png_every_color_type_and_depth_equals_pillow(
    tmp_path, color_type, channels, depth, transparency
):
    rng = np.random.default_rng(depth * 10 + color_type)
    high = 2**depth
    plte = trns = None
    if color_type == 3:
        entries = min(high, 256)
        pixels = rng.integers(0, entries, (9, 13, 1))
        plte = rng.integers(0, 256, entries * 3).astype(np.uint8)
        if transparency:
            trns = bytes(rng.integers(0, 256, entries).astype(np.uint8))
    else:
        pixels = rng.integers(0, high, (9, 13, channels))
        if depth == 16 and color_type == 0:
            pixels[0, :4, 0] = [0, 100, 255, 256]  # around Pillow's clip at 255
        if transparency:
            trns = struct.pack(">" + "H" * channels, *pixels[0, 0, :channels].tolist())
    path = tmp_path / "x.png"
    path.write_bytes(png_file(pixels, color_type, depth, plte, trns))
    theirs = pillow_rgb(path)
    ours = decode(path)
    np.testing.assert_array_equal(ours, theirs)
    # Gray keeps one channel as Pillow's convert("L").
    with Image.open(path) as image:
        gray = np.asarray(image.convert("L"))
        rgba = np.asarray(image.convert("RGBA"))
    np.testing.assert_array_equal(decode(path, mode="L")[..., 0], gray)
    np.testing.assert_array_equal(decode(path, mode="RGBA"), rgba)


@pytest.mark.parametrize(
    "color_type,depth", [(0, 1), (0, 2), (0, 4), (0, 8), (0, 16), (2, 8), (2, 16)]
)
def test_a_png_colour_key_makes_the_pixels_pillow_makes_transparent(tmp_path, color_type, depth):
    """Pillow compares a tRNS colour key's low byte with the 8-bit pixels it
    holds (low gray depths scaled up, 16-bit gray clipped, 16-bit color cut
    to its high byte; 1-bit gray: the key on or off), not in the samples'
    own depth as the PNG rule and libspng do: a 2-bit gray keyed 1 is opaque
    in Pillow."""
    channels = 1 if color_type == 0 else 3
    top = 2**depth - 1
    values = sorted({0, 1, 2, 3, 85, 255, 256, 258, 515, 772, 1000, top // 2, top - 1, top})
    values = [v for v in values if v <= top]
    pixels = np.array(values)[:, None].repeat(channels, axis=1)
    if channels == 3:
        pixels[:, 1] = pixels[:, 1] * 2 % (top + 1)
        pixels[:, 2] = pixels[:, 2] * 3 % (top + 1)
    pixels = pixels[None]
    keys = {0, 1, 3, 17, 85, 255, 256, 341, 511, 1000, 65535}
    keys |= {int(v) for v in pixels[0, :, 0]}
    for key in sorted(keys):
        key_samples = [key, key * 2 % 65536, key * 3 % 65536][:channels]
        path = tmp_path / f"key{key}.png"
        trns = struct.pack(">" + "H" * channels, *key_samples)
        path.write_bytes(png_file(pixels, color_type, depth, trns=trns))
        with Image.open(path) as image:
            expected = np.asarray(image.convert("RGBA"))
        np.testing.assert_array_equal(decode(path, mode="RGBA"), expected, err_msg=f"key {key}")


def test_png_interlaced_and_rgba_mode(tmp_path):
    path = tmp_path / "x.png"
    rgba = natural_image(20, 30).convert("RGBA")
    rgba.putalpha(Image.fromarray(np.arange(600, dtype=np.uint8).reshape(20, 30)))
    rgba.save(path, interlace=1)
    np.testing.assert_array_equal(decode(path, mode="RGBA"), np.asarray(rgba))
    np.testing.assert_array_equal(decode(path), pillow_rgb(path))


def test_webp_lossless_exact_and_lossy_close(tmp_path):
    image = natural_image(48, 64)
    image.save(tmp_path / "lossless.webp", lossless=True)
    np.testing.assert_array_equal(decode(tmp_path / "lossless.webp"), np.asarray(image))
    image.save(tmp_path / "lossy.webp", quality=80)
    ours, theirs = decode(tmp_path / "lossy.webp"), pillow_rgb(tmp_path / "lossy.webp")
    assert np.abs(ours.astype(int) - theirs.astype(int)).max() <= 2
    assert np.abs(ours.astype(int) - theirs.astype(int)).mean() < 0.5


def test_exif_orientation_as_pillows_exif_transpose(tmp_path):
    from PIL import ImageOps

    image = natural_image(30, 50)
    for orientation in range(1, 9):
        exif = Image.Exif()
        exif[0x0112] = orientation
        path = tmp_path / f"o{orientation}.png"
        image.save(path, exif=exif.tobytes())
        with Image.open(path) as opened:
            expected = np.asarray(ImageOps.exif_transpose(opened).convert("RGB"))
        np.testing.assert_array_equal(decode(path, exif_orientation=True), expected)
        np.testing.assert_array_equal(decode(path), np.asarray(image))


@pytest.mark.parametrize(
    "name,options",
    [("x.jpg", {"quality": 85}), ("x.jpg", {"progressive": True}), ("x.webp", {"quality": 70}),
     ("x.png", {})],
)  # fmt: skip
def test_crops_decode_only_the_region_with_a_full_decodes_pixels(tmp_path, name, options):
    path = tmp_path / name
    natural_image(122, 154).save(path, **options)
    full = decode(path)
    for crop in [(33, 41), (50, 50), (7, 9), (122, 154)]:
        source = ll.Images([path], transform=[ll.CenterCrop(crop)], layout="HWC")
        ((i, j, h, w),) = source.transform_params(0)["crops"]
        ours = read_all(source)["image"][0]
        np.testing.assert_array_equal(ours, full[i : i + h, j : j + w])


@pytest.mark.parametrize("mode", ["RGBA", "L"])
def test_jpeg_crops_in_every_mode_equal_the_full_decodes_pixels(tmp_path, mode):
    # A cropped scanline is cut out and copied; 4 components are RGBA here,
    # not CMYK (which is converted).
    path = tmp_path / "x.jpg"
    natural_image(122, 154).save(path, quality=85)
    full = decode(path, mode=mode)
    for crop in [(33, 41), (7, 9)]:
        source = ll.Images([path], transform=[ll.CenterCrop(crop)], layout="HWC", mode=mode)
        ((i, j, h, w),) = source.transform_params(0)["crops"]
        ours = read_all(source)["image"][0]
        np.testing.assert_array_equal(
            ours.reshape(full[i : i + h, j : j + w].shape), full[i : i + h, j : j + w]
        )


# -- transforms ---------------------------------------------------------------


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return math.inf if mse == 0 else 10 * math.log10(255**2 / mse)


@pytest.mark.parametrize(
    "size,resize",
    [
        ((375, 500), 256),  # shorter side, 1.5x down
        ((375, 500), (224, 224)),
        ((1500, 2000), (224, 300)),  # 6.7x down
        ((100, 120), (300, 360)),  # up
    ],
)
def test_resize_is_pillows_antialiased_bilinear(tmp_path, size, resize):
    image = natural_image(*size)
    _check_resize_against_pillow(tmp_path, image, size, resize)


def _stripes(height: int, width: int, period: float, vertical: bool) -> Image.Image:
    axis = np.arange(width if vertical else height)
    line = (127.5 + 127.5 * np.sin(2 * np.pi * axis / period)).astype(np.uint8)
    plane = np.tile(line, (height, 1)) if vertical else np.tile(line[:, None], (1, width))
    return Image.fromarray(np.stack([plane, 255 - plane, plane // 2], -1))


def _zone_plate(height: int, width: int) -> Image.Image:
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    r2 = ((x - width / 2) ** 2 + (y - height / 2) ** 2) / max(height, width)
    plane = (127.5 + 127.5 * np.cos(np.pi * r2 / 4)).astype(np.uint8)
    return Image.fromarray(np.stack([plane] * 3, -1))


@pytest.mark.parametrize(
    "pattern,size,resize",
    [
        ("photo", (160, 640), (224, 224)),  # wide: width shrinks, height grows
        ("photo", (640, 160), (224, 224)),  # tall
        ("photo", (300, 900), (320, 180)),
        ("stripes-x", (160, 640), (224, 224)),  # fine detail along the shrinking axis
        ("stripes-y", (640, 160), (224, 224)),
        ("zone", (200, 800), (256, 256)),
        ("zone", (400, 400), (200, 200)),  # shrink
        ("zone", (120, 120), (300, 300)),  # grow
    ],
)
def test_resize_with_any_pair_of_factors_is_pillows(tmp_path, pattern, size, resize):
    if pattern == "photo":
        image = natural_image(*size)
    elif pattern == "zone":
        image = _zone_plate(*size)
    else:
        image = _stripes(*size, period=3.3, vertical=pattern == "stripes-x")
    _check_resize_against_pillow(tmp_path, image, size, resize)


def _check_resize_against_pillow(tmp_path, image, size, resize) -> None:
    image.save(tmp_path / "x.png")
    source = ll.Images([tmp_path / "x.png"], transform=[ll.Resize(resize)], layout="HWC")
    ours = read_all(source)["image"][0]
    height, width = ours.shape[:2]
    if isinstance(resize, int):  # torchvision: shorter side, the longer truncated
        assert (height, width) == (resize, int(resize * size[1] / size[0]))
    expected = np.asarray(image.resize((width, height), Image.BILINEAR))
    # Pillow's resampling itself (image/resample.h): equal, not just close
    # (the issue asks for 40 dB; full-size decodes resize bit for bit)
    np.testing.assert_array_equal(ours, expected)


def torchvision_rrc(height, width, draws, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """torchvision.transforms.RandomResizedCrop.get_params with torch's random
    numbers replaced by `draws` (uniforms in [0, 1), used in the same order)."""

    def uniform(low, high):
        return low + (high - low) * next(draws)

    def randint(high):  # torch.randint(0, high)
        return min(int(next(draws) * high), high - 1)

    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * uniform(scale[0], scale[1])
        aspect_ratio = math.exp(uniform(log_ratio[0], log_ratio[1]))
        w = round(math.sqrt(target_area * aspect_ratio))
        h = round(math.sqrt(target_area / aspect_ratio))
        if 0 < w <= width and 0 < h <= height:
            i = randint(height - h + 1)
            j = randint(width - w + 1)
            return i, j, h, w
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = round(w / min(ratio))
    elif in_ratio > max(ratio):
        h = height
        w = round(h * max(ratio))
    else:
        w = width
        h = height
    i = (height - h) // 2
    j = (width - w) // 2
    return i, j, h, w


@pytest.mark.parametrize("shape,scale", [((375, 500), (0.08, 1.0)), ((40, 900), (0.5, 1.0))])
def test_random_resized_crop_boxes_follow_torchvision(tmp_path, shape, scale):
    path = tmp_path / "x.png"
    Image.new("RGB", (shape[1], shape[0])).save(path)
    source = ll.Images(
        [path] * 300,
        transform=[ll.RandomResizedCrop(32, scale=scale), ll.RandomHorizontalFlip(0.5)],
    )
    fallbacks = 0
    for index in range(300):
        params = source.transform_params(index, epoch=3, seed=11)
        draws = iter(ll._core.sample_uniforms(11, 3, index, 64))
        expected = torchvision_rrc(*shape, draws, scale=scale)
        assert params["crops"] == [expected]
        assert params["flipped"] == (next(draws) < 0.5)
        assert params["output_size"] == (32, 32)
        fallbacks += expected[2] == shape[0] and expected[0] == 0
    if shape == (40, 900):
        assert fallbacks > 0  # the central fallback was exercised


@pytest.mark.parametrize(
    "name,dct_scaling,min_psnr", [("x.png", False, 45), ("x.jpg", False, 45), ("x.jpg", True, 41)]
)
def test_reported_params_are_the_ones_applied(tmp_path, name, dct_scaling, min_psnr):
    path = tmp_path / name
    natural_image(300, 400).save(path, **({"quality": 95} if name.endswith(".jpg") else {}))
    reference_image = Image.open(path).convert("RGB")
    transform = [ll.RandomResizedCrop(64), ll.RandomHorizontalFlip()]
    source = ll.Images([path] * 12, transform=transform, layout="HWC", dct_scaling=dct_scaling)
    loader = ll.Loader(source, batch_size=4, shuffle=True, seed=5, num_threads=2, output="numpy")
    loader.set_epoch(2)
    flips = 0
    for batch in loader:
        for index, image in zip(loader.last_indices, batch["image"], strict=True):
            params = source.transform_params(int(index), epoch=2, seed=5)
            ((i, j, h, w),) = params["crops"]
            expected = reference_image.resize((64, 64), Image.BILINEAR, box=(j, i, j + w, i + h))
            if params["flipped"]:
                expected = expected.transpose(Image.FLIP_LEFT_RIGHT)
                flips += 1
            assert psnr(image, np.asarray(expected)) >= min_psnr, (index, params)
    assert 0 < flips < 12


@pytest.mark.parametrize("orientation", [2, 3, 5, 6, 7, 8])
def test_dct_scaled_crops_of_oriented_jpegs_follow_pillows_exif_transpose(tmp_path, orientation):
    from PIL import ImageOps

    exif = Image.Exif()
    exif[0x0112] = orientation
    path = tmp_path / "x.jpg"
    natural_image(300, 400).save(path, quality=95, exif=exif.tobytes())
    with Image.open(path) as opened:
        upright = ImageOps.exif_transpose(opened).convert("RGB")
    source = ll.Images(
        [path] * 6, transform=[ll.RandomResizedCrop(64)], layout="HWC", exif_orientation=True
    )
    images = read_all(source)["image"]
    for index, image in enumerate(images):
        params = source.transform_params(index)
        assert params["image_size"] == (upright.height, upright.width)
        ((i, j, h, w),) = params["crops"]
        expected = upright.resize((64, 64), Image.BILINEAR, box=(j, i, j + w, i + h))
        assert psnr(image, np.asarray(expected)) >= 41, (orientation, index, params)


def test_flip_normalize_and_dtypes_match_a_numpy_reference(tmp_path):
    image = natural_image(20, 30)
    image.save(tmp_path / "x.png")
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    pixels = np.asarray(image).astype(np.float32) / 255
    expected = ((pixels - np.float32(mean)) / np.float32(std)).transpose(2, 0, 1)
    import torch

    for dtype, tolerance in [("float32", 1e-6), ("float16", 2e-3), ("bfloat16", 2e-2)]:
        source = ll.Images(
            [tmp_path / "x.png"],
            transform=[ll.RandomHorizontalFlip(1.0), ll.Normalize(mean, std, dtype=dtype)],
        )
        loader = ll.Loader(source, batch_size=1, collate="list", num_threads=1)
        ours = next(iter(loader))["image"][0]
        assert ours.dtype == getattr(torch, dtype)
        np.testing.assert_allclose(
            ours.float().numpy(), expected[:, :, ::-1], rtol=tolerance, atol=tolerance
        )
    hwc = read_all(ll.Images([tmp_path / "x.png"], layout="HWC"))["image"][0]
    np.testing.assert_array_equal(hwc, np.asarray(image))
    chw = read_all(ll.Images([tmp_path / "x.png"]))["image"][0]
    np.testing.assert_array_equal(chw, np.asarray(image).transpose(2, 0, 1))


def test_center_crop_after_resize_as_torchvision(tmp_path):
    natural_image(300, 400).save(tmp_path / "x.png")
    source = ll.Images([tmp_path / "x.png"], transform=[ll.Resize(256), ll.CenterCrop(224)])
    params = source.transform_params(0)
    assert params["resizes"] == [(256, 341)]
    # torchvision: top = round((256 - 224) / 2) = 16, left = round((341 - 224) / 2) = 58
    assert params["crops"] == [(16, 58, 224, 224)]
    assert source.fields[0] == ("image", "U8", [3, 224, 224])


def test_resize_max_size_is_checked_as_torchvision_checks_it(tmp_path):
    # max_size=0 meant no cap at all; torchvision refuses a max_size that is
    # not above the requested smaller edge.
    for max_size in (0, 256, 100):
        with pytest.raises(ValueError, match=f"max_size = {max_size} must be strictly greater"):
            ll.Resize(256, max_size=max_size)
    natural_image(300, 400).save(tmp_path / "x.png")
    source = ll.Images([tmp_path / "x.png"], transform=[ll.Resize(256, max_size=300)])
    # torchvision: the longer side 341 is over 300, so (h, w) = (int(300 * 256 / 341), 300)
    assert source.transform_params(0)["resizes"] == [(225, 300)]


def torchvision_center_crop(pixels: np.ndarray, crop_h: int, crop_w: int) -> np.ndarray:
    """torchvision.transforms.functional.center_crop on an (H, W, C) array."""
    height, width = pixels.shape[:2]
    if crop_w > width or crop_h > height:
        left = (crop_w - width) // 2 if crop_w > width else 0
        top = (crop_h - height) // 2 if crop_h > height else 0
        right = (crop_w - width + 1) // 2 if crop_w > width else 0
        bottom = (crop_h - height + 1) // 2 if crop_h > height else 0
        pixels = np.pad(pixels, ((top, bottom), (left, right), (0, 0)))
        height, width = pixels.shape[:2]
    top = round((height - crop_h) / 2.0)
    left = round((width - crop_w) / 2.0)
    return pixels[top : top + crop_h, left : left + crop_w]


@pytest.mark.parametrize("crop", [(40, 25), (19, 41), (41, 41), (12, 13)])
def test_center_crop_pads_small_images_as_torchvision(tmp_path, crop):
    image = natural_image(20, 30)
    image.save(tmp_path / "x.png")
    pixels = np.asarray(image)
    source = ll.Images([tmp_path / "x.png"], transform=[ll.CenterCrop(crop)], layout="HWC")
    np.testing.assert_array_equal(
        read_all(source)["image"][0], torchvision_center_crop(pixels, *crop)
    )
    flipped = ll.Images(
        [tmp_path / "x.png"],
        transform=[ll.RandomHorizontalFlip(1.0), ll.CenterCrop(crop)],
        layout="HWC",
    )
    np.testing.assert_array_equal(
        read_all(flipped)["image"][0], torchvision_center_crop(pixels[:, ::-1], *crop)
    )
    # Padded after a resize too.
    resized = ll.Images([tmp_path / "x.png"], transform=[ll.Resize((10, 15)), ll.CenterCrop(crop)])
    assert read_all(resized)["image"][0].shape == (3, *crop)


# -- the loader: determinism, labels, ImageFolder --------------------------------


def write_jpegs(directory, count, size=(96, 128)):
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        path = directory / f"img{i:03d}.jpg"
        natural_image(size[0] + i % 5, size[1], seed=i).save(path, quality=85)
        paths.append(path)
    return paths


def test_same_augmentations_at_1_and_8_threads_and_new_ones_each_epoch(tmp_path):
    paths = write_jpegs(tmp_path / "imgs", 24)
    transform = [
        ll.RandomResizedCrop(40),
        ll.RandomHorizontalFlip(),
        ll.Normalize([0.5] * 3, [0.25] * 3),
    ]
    source = ll.Images(paths, labels=list(range(24)), transform=transform)

    def epoch_images(threads, epoch):
        loader = ll.Loader(
            source, batch_size=5, shuffle=True, seed=7, num_threads=threads, output="numpy"
        )
        loader.set_epoch(epoch)
        by_label = {}
        for batch in loader:
            for image, label in zip(batch["image"], batch["label"], strict=True):
                by_label[int(label)] = image.copy()
        return by_label

    one, eight = epoch_images(1, 0), epoch_images(8, 0)
    assert sorted(one) == list(range(24))
    for label in one:
        np.testing.assert_array_equal(one[label], eight[label])
    next_epoch = epoch_images(8, 1)
    assert sum(not np.array_equal(one[k], next_epoch[k]) for k in one) >= 20


def test_loader_batches_are_float_chw_with_int64_labels(tmp_path):
    import torch

    root = tmp_path / "train"
    write_jpegs(root / "dog", 5)
    write_jpegs(root / "cat", 3)
    (root / "cat" / "notes.txt").write_text("not an image")
    (root / "empty_file_dir").mkdir()
    (root / "empty_file_dir" / "x.png").write_bytes(Image.new("RGB", (9, 9)).tobytes() and b"")
    ds = ll.ImageFolder(
        root,
        transform=[
            ll.RandomResizedCrop(32),
            ll.RandomHorizontalFlip(),
            ll.Normalize([0.5] * 3, [0.5] * 3),
        ],
        is_valid_file=lambda p: p.endswith(".jpg"),
        allow_empty=True,
    )
    assert ds.classes == ["cat", "dog", "empty_file_dir"]
    assert ds.class_to_idx == {"cat": 0, "dog": 1, "empty_file_dir": 2}
    assert [t for _, t in ds.samples] == [0] * 3 + [1] * 5
    assert ds.samples[0][0].endswith("cat/img000.jpg")
    assert ds.targets == [0, 0, 0, 1, 1, 1, 1, 1]
    loader = ll.Loader(ds, batch_size=4, shuffle=True, num_threads=2)
    batches = list(loader)
    assert batches[0]["image"].shape == (4, 3, 32, 32)
    assert batches[0]["image"].dtype == torch.float32
    assert batches[0]["label"].dtype == torch.int64
    assert sorted(torch.cat([b["label"] for b in batches]).tolist()) == ds.targets


def test_image_folder_extensions_and_empty_classes_as_torchvision(tmp_path):
    root = tmp_path / "root"
    write_jpegs(root / "a", 2)
    (root / "a" / "UPPER.JPG").write_bytes((root / "a" / "img000.jpg").read_bytes())
    (root / "a" / "skip.txt").write_text("x")
    (root / "b").mkdir()
    with pytest.raises(FileNotFoundError, match="Found no valid file for the classes b"):
        ll.ImageFolder(root)
    (root / "b" / "one.webp").write_bytes(b"")
    ds = ll.ImageFolder(root)
    assert [p.rsplit("/", 1)[1] for p, _ in ds.samples] == [
        "UPPER.JPG",
        "img000.jpg",
        "img001.jpg",
        "one.webp",
    ]
    with pytest.raises(FileNotFoundError, match="Couldn't find any class folder"):
        ll.ImageFolder(root / "a")


def test_image_folder_lists_samples_as_torchvisions_dataset_folder(tmp_path, monkeypatch):
    # torchvision 0.29's datasets/folder.py is the reference for each case.
    root = tmp_path / "root"
    write_jpegs(root / "a", 1)
    write_jpegs(root / "b", 1)
    natural_image(9, 9).save(root / "a" / "x.png")

    # The documented way to choose classes: a subclass overriding find_classes
    # (ignored before: both classes, b labelled 1).
    class OnlyB(ll.ImageFolder):
        def find_classes(self, directory):
            return ["b"], {"b": 0}

    ds = OnlyB(root)
    assert ds.classes == ["b"] and [(os.path.basename(p), t) for p, t in ds.samples] == [
        ("img000.jpg", 0)
    ]

    class Relabelled(ll.ImageFolder):
        @staticmethod
        def make_dataset(directory, class_to_idx, extensions=None, is_valid_file=None,
                         allow_empty=False):  # fmt: skip
            found = ll.image.make_dataset(directory, class_to_idx, extensions, is_valid_file)
            return [(path, 7) for path, _ in found]

    assert Relabelled(root).targets == [7, 7, 7]
    assert [t for _, t in ll.ImageFolder(root).samples] == [0, 0, 1]
    # extensions as DatasetFolder takes them: a string is one extension (not
    # its characters), compared with the lower-cased name as given
    only_png = ll.ImageFolder(root, extensions=".png", allow_empty=True)
    assert [os.path.basename(p) for p, _ in only_png.samples] == ["x.png"]
    for extensions in ((".JPG", ".PNG"), ()):
        with pytest.raises(FileNotFoundError, match="Found no valid file for the classes a, b"):
            ll.ImageFolder(root, extensions=extensions)
    # is_valid_file given: no extension list in the message
    with pytest.raises(FileNotFoundError) as error:
        ll.ImageFolder(root, is_valid_file=lambda p: p.endswith(".png"))
    assert str(error.value) == "Found no valid file for the classes b. "
    with pytest.raises(ValueError, match="Both extensions and is_valid_file"):
        ll.ImageFolder(root, extensions=".png", is_valid_file=bool)
    # "~" expanded; a Path root kept as a Path
    monkeypatch.setenv("HOME", str(tmp_path))
    assert len(ll.ImageFolder("~/root")) == 3
    assert ll.ImageFolder(root).root == root
    # every class empty (allowed): torchvision's dataset is empty, a source cannot be
    with pytest.raises(FileNotFoundError, match="every class folder is empty"):
        ll.ImageFolder(root, is_valid_file=lambda p: False, allow_empty=True)


def test_labels_and_file_names_the_engine_cannot_carry_are_refused(tmp_path):
    write_jpegs(tmp_path, 2)
    paths = sorted(str(p) for p in tmp_path.glob("*.jpg"))
    with pytest.raises(TypeError, match=r"labels\[1\] must be an int, got float 1.7"):
        ll.Images(paths, labels=[0, 1.7])  # was silently label 1
    assert ll.Images(paths, labels=np.array([3, -1], dtype=np.int16)).labels == [3, -1]
    odd = tmp_path / "folder" / "class" / os.fsdecode(b"caf\xe9.jpg")
    odd.parent.mkdir(parents=True)
    odd.write_bytes(Path(paths[0]).read_bytes())
    for make in (lambda: ll.Images([odd]), lambda: ll.ImageFolder(tmp_path / "folder")):
        with pytest.raises(ValueError, match="file names that are not UTF-8 are not supported"):
            make()


def test_image_folder_refuses_formats_it_cannot_decode_before_the_first_epoch(tmp_path):
    root = tmp_path / "root"
    write_jpegs(root / "a", 2)
    (root / "b").mkdir()
    natural_image(20, 30).save(root / "b" / "x.ico")
    natural_image(20, 30).save(root / "b" / "y.bmp")
    natural_image(20, 30).save(root / "b" / "w.gif")
    # A JPEG named .gif is decoded (formats are told by their bytes).
    (root / "b" / "z.gif").write_bytes((root / "a" / "img000.jpg").read_bytes())
    extensions = (".jpg", ".gif", ".bmp", ".ico")
    with pytest.raises(ValueError, match=r"1 of 6 files are not JPEG, PNG, WebP") as error:
        ll.ImageFolder(root, extensions=extensions)
    assert "x.ico" in str(error.value) and "y.bmp" not in str(error.value)
    assert "gif" not in str(error.value) and "is_valid_file" in str(error.value)
    assert len(read_all(ll.ImageFolder(root, extensions=(".jpg", ".gif")))["image"]) == 4
    # every extension torchvision's ImageFolder lists is decoded
    ds = ll.ImageFolder(root)
    assert len(ds) == 3 and len(read_all(ds)["image"]) == 3


# -- bad files ------------------------------------------------------------------


def bad_files(directory):
    directory.mkdir(parents=True, exist_ok=True)
    good = directory / "good.jpg"
    natural_image(64, 80).save(good, quality=90)
    data = good.read_bytes()
    corrupt = bytearray(data)
    for k in range(len(data) // 3, len(data) * 2 // 3, 5):
        corrupt[k] ^= 0x5A
    png = io.BytesIO()
    natural_image(20, 20).save(png, "PNG")
    bomb = bytearray(png.getvalue())
    bomb[16:24] = struct.pack(">II", 20000, 20000)  # 400 M pixels claimed in IHDR
    files = {
        "truncated.jpg": data[: len(data) // 2],
        "corrupt.jpg": bytes(corrupt),
        "empty.jpg": b"",
        "text.png": b"this is not an image at all",
        "bomb.png": bytes(bomb),
        "truncated.png": png.getvalue()[:-40],
    }
    paths = []
    for name, content in files.items():
        (directory / name).write_bytes(content)
        paths.append(directory / name)
    return good, paths


CHILD = textwrap.dedent(
    """
    import json, sys
    import leanloader as ll
    paths = json.loads(sys.argv[1])
    for index, path in enumerate(paths):
        source = ll.Images([paths[0], path], transform=[ll.RandomResizedCrop(16)])
        try:
            for _ in ll.Loader(source, batch_size=2, num_threads=2):
                pass
            print(json.dumps({"path": path, "error": None}))
        except Exception as error:
            print(json.dumps({"path": path, "type": type(error).__name__, "error": str(error)}))
    """
)


def test_bad_files_raise_errors_naming_file_sample_and_decode_stage(tmp_path):
    import json

    good, paths = bad_files(tmp_path / "bad")
    # A crash in the decoders fails this test instead of killing pytest.
    result = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps([str(good)] + [str(p) for p in paths])],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    reports = [json.loads(line) for line in result.stdout.splitlines()]
    assert reports[0]["error"] is None  # the good file
    causes = {
        "truncated.jpg": "Premature end of JPEG file",
        "corrupt.jpg": "JPEG",
        "empty.jpg": "empty file",
        "text.png": "not a JPEG, PNG, WebP",
        "bomb.png": "exceed twice the limit of 89478485",
        "truncated.png": "PNG",
    }
    for report in reports[1:]:
        name = report["path"].rsplit("/", 1)[1]
        message = report["error"]
        assert report["type"] == "FormatError", report
        assert "sample 1" in message and report["path"] in message, message
        assert "stage 'decode'" in message, message
        assert causes[name] in message, message


def test_skip_mode_counts_bad_files_and_lenient_jpeg(tmp_path):
    good, paths = bad_files(tmp_path / "bad")
    source = ll.Images([good] * 30 + paths, transform=[ll.Resize((16, 16))])
    loader = ll.Loader(source, batch_size=8, num_threads=2, on_error="skip", max_skip_fraction=0.5)
    with pytest.warns(RuntimeWarning, match=r"skipped 6 bad sample"):
        rows = sum(len(batch["image"]) for batch in loader)
    assert rows == 30
    assert loader.stats()["samples_skipped"] == 6
    # A decompression bomb passes with a raised limit; max_pixels=None lifts it.
    with pytest.raises(ll.FormatError):
        decode(paths[4], max_pixels=1000)


def write_corrupt_jpeg(path) -> None:
    """A JPEG with two stray bytes after APP0: libjpeg warns "Corrupt JPEG
    data" and decodes on, as Pillow does."""
    natural_image(40, 40).save(path, quality=90)
    data = path.read_bytes()
    end_of_app0 = 4 + int.from_bytes(data[4:6], "big")
    path.write_bytes(data[:end_of_app0] + b"\x12\x34" + data[end_of_app0:])


def test_corrupt_jpeg_data_is_decoded_as_pillow_does_with_a_warning_or_refused_on_request(
    tmp_path,
):
    path = tmp_path / "x.jpg"
    write_corrupt_jpeg(path)
    with pytest.warns(RuntimeWarning, match="corrupt JPEG data, decoded as Pillow") as warned:
        np.testing.assert_array_equal(decode(path), pillow_rgb(path))
    assert str(path) in str(warned[0].message)
    assert "accept_corrupt_jpeg=False" in str(warned[0].message)  # the option that refuses it
    with pytest.raises(ll.FormatError, match="Corrupt JPEG data") as refused:
        decode(path, accept_corrupt_jpeg=False)
    assert "accept_corrupt_jpeg=True" in str(refused.value)  # the option that accepts it
    assert str(refused.value).startswith(f"'{path}': JPEG: Corrupt JPEG data")
    # In a loader: decoded, one warning naming the file (Python's registry
    # shows it once), and the sample counted once over two epochs.
    source = ll.Images([path] * 3, transform=[ll.RandomResizedCrop(16)])
    loader = ll.Loader(source, batch_size=3, num_threads=2, output="numpy")
    with pytest.warns(RuntimeWarning, match="corrupt JPEG data") as warned:
        for _ in range(2):
            assert sum(len(batch["image"]) for batch in loader) == 3
    assert all(str(path) in str(w.message) for w in warned)
    assert loader.stats()["samples_warned"] == 3
    strict = ll.Images([path], transform=[ll.RandomResizedCrop(16)], accept_corrupt_jpeg=False)
    with pytest.raises(ll.FormatError, match="accept_corrupt_jpeg=True"):
        list(ll.Loader(strict, batch_size=1, output="numpy"))


# -- TensorCache ------------------------------------------------------------------


def test_cache_build_hands_decoded_images_to_the_encoder(tmp_path):
    import torch

    paths = []
    for i, size in enumerate([(40, 60), (50, 50)]):
        path = tmp_path / f"{i}.png"
        natural_image(*size, seed=i).save(path)
        paths.append(path)
    seen = []

    def encode(batch):
        images = batch["image"]
        seen.extend(tuple(image.shape) for image in images)
        return {"mean": torch.stack([image.float().mean(dim=(1, 2)) for image in images])}

    cache = ll.TensorCache(tmp_path / "cache")
    stats = cache.build(
        ll.Images(str(tmp_path / "*.png"), transform=[ll.Resize(20)]), encode=encode, progress=False
    )
    assert stats["built"] == 2
    assert sorted(seen) == [(3, 20, 20), (3, 20, 30)]
    entry = cache[str(paths[0])]
    expected = np.asarray(Image.open(paths[0]).resize((30, 20), Image.BILINEAR)).mean(axis=(0, 1))
    np.testing.assert_allclose(np.asarray(entry["mean"]), expected, atol=1.5)


# -- Pillow's pixel limit and 16-bit PNG ------------------------------------------


def test_pixel_limit_warns_above_and_refuses_above_twice_as_pillow(tmp_path):
    path = tmp_path / "big.png"
    natural_image(100, 100).save(path)  # 10,000 pixels
    with pytest.warns(RuntimeWarning, match=r"100x100 pixels exceed max_pixels \(6000\)"):
        assert decode(path, max_pixels=6000).shape == (100, 100, 3)
    with pytest.raises(ll.FormatError, match="exceed twice the limit of 4999"):
        decode(path, max_pixels=4999)
    assert decode(path, max_pixels=None).shape == (100, 100, 3)
    # In a loader: decoded, the warning names the file.
    source = ll.Images([path], max_pixels=6000)
    loader = ll.Loader(source, batch_size=1, output="numpy", collate="list")
    with pytest.warns(RuntimeWarning, match=str(path)):
        assert len(next(iter(loader))["image"]) == 1
    assert loader.stats()["samples_warned"] == 1


def test_the_pixel_limit_warning_is_pillows_class_and_its_filters_apply(tmp_path, monkeypatch):
    # Users silence Pillow's warning, or make it an error, by its class: a
    # filter on Pillow's DecompressionBombWarning treats ours as it treats
    # Pillow's own (ours is an instance of Pillow's class while Pillow is
    # imported); a corrupt-JPEG warning is not one.
    path = tmp_path / "big.png"
    natural_image(100, 100).save(path)  # 10,000 pixels
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 6000)
    loader = ll.Loader(ll.Images([path], max_pixels=6000), batch_size=1, collate="list")
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        with pytest.raises(Image.DecompressionBombWarning, match="could be decompression bomb"):
            Image.open(path)  # the reference
        with pytest.raises(Image.DecompressionBombWarning, match="exceed max_pixels"):
            decode(path, max_pixels=6000)
        with pytest.raises(Image.DecompressionBombWarning, match=str(path)):
            next(iter(loader))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        with Image.open(path) as image:
            expected = np.asarray(image.convert("RGB"))
        np.testing.assert_array_equal(decode(path, max_pixels=6000), expected)
        np.testing.assert_array_equal(next(iter(loader))["image"][0], expected.transpose(2, 0, 1))
    with pytest.warns(ll.DecompressionBombWarning) as warned:
        decode(path, max_pixels=6000)
    assert issubclass(warned[0].category, RuntimeWarning)
    # Pickled (a warning turned error in a worker process travels so), in
    # this process and in a fresh one that has not made the class yet.
    data = pickle.dumps(warned[0].message)
    assert isinstance(pickle.loads(data), Image.DecompressionBombWarning)
    code = (
        "import pickle, leanloader\n"
        "from PIL import Image\n"
        f"message = pickle.loads({data!r})\n"
        "assert isinstance(message, Image.DecompressionBombWarning)\n"
        "assert isinstance(message, leanloader.DecompressionBombWarning)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    corrupt = tmp_path / "corrupt.jpg"
    write_corrupt_jpeg(corrupt)
    with pytest.warns(RuntimeWarning, match="corrupt JPEG data") as warned:
        decode(corrupt)
    assert not issubclass(warned[0].category, Image.DecompressionBombWarning)


def test_the_pixel_limit_warning_does_not_import_pillow(tmp_path):
    # Without Pillow imported no filter can name its class: ours alone,
    # and Pillow stays unimported.
    path = tmp_path / "big.png"
    natural_image(100, 100).save(path)
    code = f"""
import sys, warnings
import leanloader as ll
with warnings.catch_warnings(record=True) as warned:
    warnings.simplefilter("always")
    ll.decode_image({str(path)!r}, max_pixels=6000)
assert [w.category for w in warned] == [ll.DecompressionBombWarning], warned
assert issubclass(ll.DecompressionBombWarning, RuntimeWarning)
assert "PIL" not in sys.modules, "Pillow imported"
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("mode", ["RGB", "L", "RGBA"])
def test_sixteen_bit_grayscale_png_as_pillow_converts_it(tmp_path, mode):
    values = np.array([[0, 100, 200, 255], [256, 1000, 40000, 65535]], dtype=np.uint16)
    path = tmp_path / "gray16.png"
    Image.fromarray(values).save(path)  # mode I;16
    with Image.open(path) as image:
        assert image.mode in ("I;16", "I")
        expected = np.asarray(image.convert(mode))
    got = decode(path, mode=mode)
    np.testing.assert_array_equal(got.reshape(expected.shape), expected)


@pytest.mark.parametrize("mode", ["RGB", "L", "RGBA"])
@pytest.mark.parametrize("lossless", [True, False], ids=["lossless", "lossy"])
def test_animated_webp_gives_its_first_frame_as_pillow(tmp_path, mode, lossless):
    frames = []
    for seed in range(3):
        frame = natural_image(48, 64, seed=seed).convert("RGBA")
        alpha = np.full((48, 64), 255, dtype=np.uint8)
        alpha[:10, :20] = 0  # a transparent corner
        frame.putalpha(Image.fromarray(alpha))
        frames.append(frame)
    path = tmp_path / "animated.webp"
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=80,
                   lossless=lossless, quality=90)  # fmt: skip
    with Image.open(path) as image:
        assert getattr(image, "n_frames", 1) == 3
        expected = np.asarray(image.convert(mode))
    got = decode(path, mode=mode)
    np.testing.assert_array_equal(got.reshape(expected.shape), expected)
    # a crop of it, as a transform decodes it
    source = ll.Images([path], transform=[ll.CenterCrop(32)], layout="HWC", mode=mode)
    batch = next(iter(ll.Loader(source, batch_size=1, output="numpy")))
    cropped = expected[8:40, 16:48].reshape(32, 32, -1)
    np.testing.assert_array_equal(batch["image"][0], cropped)


def _xmp(orientation: int, attribute: bool) -> bytes:
    value = (
        f'tiff:Orientation="{orientation}"'
        if attribute
        else f"><tiff:Orientation>{orientation}</tiff:Orientation"
    )
    return (
        '<?xpacket begin=""?><x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF '
        'xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#"><rdf:Description '
        f'xmlns:tiff="http://ns.adobe.com/tiff/1.0/" {value}></rdf:Description></rdf:RDF>'
        "</x:xmpmeta>"
    ).encode()


def _raw_profile_exif(orientation: int, twice: bool = False) -> str:
    exif = Image.Exif()
    exif[0x0112] = orientation
    payload = exif.tobytes()  # (with its "Exif\0\0" prefix, as ImageMagick writes it)
    if twice:  # (some writers repeat the prefix; Pillow drops two)
        payload = b"Exif\x00\x00" + payload
    hex_digits = payload.hex()
    lines = "\n".join(hex_digits[i : i + 72] for i in range(0, len(hex_digits), 72))
    return f"\nexif\n{len(payload):8d}\n{lines}\n"


@pytest.mark.parametrize(
    "where",
    ["jpeg-xmp", "jpeg-xmp-element", "png-itxt-xmp", "png-ztxt-xmp", "png-raw-exif",
     "png-raw-exif-twice", "webp-xmp", "jpeg-exif-and-xmp"],
)  # fmt: skip
@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_orientation_from_xmp_and_png_text_as_pillows_exif_transpose(tmp_path, where, orientation):
    from PIL import ImageOps, PngImagePlugin

    image = natural_image(24, 40)
    if where.startswith("jpeg"):
        path = tmp_path / "x.jpg"
        options = {"quality": 95, "xmp": _xmp(orientation, where != "jpeg-xmp-element")}
        if where == "jpeg-exif-and-xmp":  # EXIF's tag wins over XMP's
            exif = Image.Exif()
            exif[0x0112] = 2
            options["exif"] = exif.tobytes()
        image.save(path, **options)
    elif where.startswith("png"):
        path = tmp_path / "x.png"
        info = PngImagePlugin.PngInfo()
        if where.startswith("png-raw-exif"):
            profile = _raw_profile_exif(orientation, twice=where.endswith("twice"))
            info.add_text("Raw profile type exif", profile)
        else:
            xmp = _xmp(orientation, True).decode()
            info.add_itxt("XML:com.adobe.xmp", xmp, zip=where == "png-ztxt-xmp")
        image.save(path, pnginfo=info)
    else:
        path = tmp_path / "x.webp"
        image.save(path, lossless=True, xmp=_xmp(orientation, True))
    with Image.open(path) as opened:
        expected = np.asarray(ImageOps.exif_transpose(opened).convert("RGB"))
    assert expected.shape[:2] != (24, 40) or orientation == 3 or where == "jpeg-exif-and-xmp"
    np.testing.assert_array_equal(decode(path, exif_orientation=True), expected)


@pytest.mark.parametrize("size", [(17, 23), (90, 30), (200, 160)])
def test_rgba_resizes_premultiplied_as_pillow(tmp_path, size):
    # Pillow resizes RGBA as "RGBa": a fully transparent pixel's colour does
    # not bleed into its neighbours.
    rng = np.random.default_rng(3)
    pixels = rng.integers(0, 256, (60, 80, 4), dtype=np.uint8)
    pixels[::3, :, 3] = 0
    pixels[1::3, :, 3] = 255
    path = tmp_path / "alpha.png"
    Image.fromarray(pixels, "RGBA").save(path)
    source = ll.Images([path], transform=[ll.Resize(size)], layout="HWC", mode="RGBA")
    (got,) = read_all(source)["image"]
    expected = Image.open(path).convert("RGBA").resize(size[::-1], Image.BILINEAR)
    assert np.array_equal(got, np.asarray(expected))


def _apng(frame: tuple[int, int, int, int], width: int = 8, height: int = 6) -> bytes:
    """An APNG of one frame whose frame control (width, height, x, y) comes
    before the image data, which holds the whole width x height image."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    rows = b"".join(b"\0" + bytes((200, 30, 90)) * width for _ in range(height))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"acTL", struct.pack(">II", 1, 0))
        + chunk(b"fcTL", struct.pack(">IIIIIHHBB", 0, *frame, 1, 10, 0, 0))
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


@pytest.mark.parametrize("frame", [(8, 6, 0, 0), (4, 3, 0, 0), (8, 5, 0, 1)])
def test_an_apng_first_frame_control_is_read_as_pillow_or_refused(tmp_path, frame):
    """Pillow decodes the image data as the frame its control names (and
    fails when the data holds the whole image), libspng as the whole image.
    The APNG rule is a frame of the whole image at (0, 0): such a file equals
    Pillow's; any other is refused, with the reason (Pillow refuses it, or
    reads the image data as a smaller frame: (8, 5, 0, 1))."""
    path = tmp_path / "x.png"
    path.write_bytes(_apng(frame))
    if frame == (8, 6, 0, 0):
        np.testing.assert_array_equal(decode(path), pillow_rgb(path))
        return
    with pytest.raises((ValueError, OSError), match="frame control before the image data"):
        decode(path)
