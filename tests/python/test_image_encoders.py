"""Images written by encoders we did not write — libjpeg-turbo's cjpeg,
libwebp's cwebp and img2webp, ImageMagick — decoded by ``ll.decode_image``
and by Pillow (``Image.open -> convert(mode)``): equal (lossy formats within
±1), in every output mode. The tools come from Debian (libjpeg-turbo-progs,
webp, imagemagick: `make test` installs them); a missing tool skips its
files only."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

import leanloader as ll

Image = pytest.importorskip("PIL.Image")
ImageFilter = pytest.importorskip("PIL.ImageFilter")

HEIGHT, WIDTH = 45, 61  # odd: chroma subsampling and padding at the edges


def _source(directory):
    rng = np.random.default_rng(11)
    base = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)).resize(
        (WIDTH, HEIGHT), Image.BICUBIC
    )
    noise = Image.fromarray(rng.integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8))
    image = Image.blend(base, noise.filter(ImageFilter.GaussianBlur(1)), 0.3)
    alpha = Image.fromarray(rng.integers(0, 256, (HEIGHT, WIDTH), dtype=np.uint8))
    image.save(directory / "source.ppm")
    rgba = image.copy()
    rgba.putalpha(alpha)
    rgba.save(directory / "source_alpha.png")
    return directory / "source.ppm", directory / "source_alpha.png"


def _tool(*names):
    for name in names:
        path = shutil.which(name)
        if path is not None and not path.startswith("/usr/local/"):
            return path
    return None


def _encode(directory) -> dict[str, int]:
    """Writes the corpus; returns {file name: tolerance}."""
    ppm, png_alpha = _source(directory)
    files: dict[str, int] = {}

    def run(tolerance, name, *command):
        subprocess.run([*command], check=True, capture_output=True, timeout=60)
        files[name] = tolerance

    cjpeg = _tool("cjpeg")
    if cjpeg is not None:
        variants = {
            "baseline": [],
            "progressive": ["-progressive"],
            "restart": ["-restart", "1"],
            "arithmetic": ["-arithmetic"],
            "optimized": ["-optimize"],
            "444": ["-sample", "1x1"],
            "422": ["-sample", "2x1"],
            "420": ["-sample", "2x2"],
            "411": ["-sample", "4x1"],
            "gray": ["-grayscale"],
        }
        for name, options in variants.items():
            out = directory / f"cjpeg_{name}.jpg"
            run(1, out.name, cjpeg, "-quality", "90", *options, "-outfile", str(out), str(ppm))
    png = directory / "source.png"
    Image.open(ppm).save(png)
    cwebp = _tool("cwebp")
    if cwebp is not None:
        for name, options in {"lossy": ["-q", "80"], "lossless": ["-lossless"]}.items():
            out = directory / f"cwebp_{name}.webp"
            run(1 if name == "lossy" else 0, out.name, cwebp, "-quiet", *options, str(png),
                "-o", str(out))  # fmt: skip
        out = directory / "cwebp_alpha_lossless.webp"
        run(0, out.name, cwebp, "-quiet", "-lossless", "-exact", str(png_alpha), "-o", str(out))
    img2webp = _tool("img2webp")
    if img2webp is not None:
        second = directory / "frame2.png"
        Image.open(ppm).transpose(Image.FLIP_LEFT_RIGHT).save(second)
        out = directory / "img2webp_animated.webp"
        run(0, out.name, img2webp, "-lossless", str(png), str(second), "-o", str(out))
    convert = _tool("convert-im6.q16", "convert-im7", "magick", "convert")
    if convert is not None:
        magick = {
            "im_palette.png": ["-colors", "40", "png8:{out}"],
            "im_16bit.png": ["-depth", "16", "png48:{out}"],
            "im_interlaced.png": ["-interlace", "PNG", "{out}"],
            "im_gray.png": ["-colorspace", "Gray", "png:{out}"],
            "im_gray_16bit.png": ["-colorspace", "Gray", "-depth", "16", "png:{out}"],
            "im_lzw.tif": ["-compress", "LZW", "{out}"],
            "im_zip_16bit.tif": ["-depth", "16", "-compress", "Zip", "{out}"],
            "im_jpeg.tif": ["-compress", "JPEG", "{out}"],
            "im_gray.tif": ["-colorspace", "Gray", "{out}"],
            # Pillow converts uncompressed YCbCr itself (its ycbcr2rgb tables;
            # libtiff's RGBA interface was one off in half the values)
            "im_ycbcr.tif": ["-colorspace", "YCbCr", "-compress", "None", "{out}"],
            "im_ycbcr_lzw.tif": ["-colorspace", "YCbCr", "-compress", "LZW", "{out}"],
            "im_bmp3.bmp": ["bmp3:{out}"],
            "im_bmp_rle.bmp": ["-colors", "16", "-compress", "RLE", "bmp3:{out}"],
            "im_palette.bmp": ["-colors", "200", "-type", "Palette", "bmp3:{out}"],
            "im_plain.ppm": ["-compress", "None", "{out}"],
            "im_gray.pgm": ["-colorspace", "Gray", "{out}"],
            "im_16bit.ppm": ["-depth", "16", "{out}"],
            "im.gif": ["{out}"],
            "im_interlaced.gif": ["-interlace", "GIF", "{out}"],
            "im_16_colours.gif": ["-colors", "16", "{out}"],
            "im_gray.gif": ["-colorspace", "Gray", "{out}"],
            "im_transparent.gif": [
                "-colors",
                "32",
                "-transparent",
                "black",
                "-fuzz",
                "30%",
                "{out}",
            ],
            "im_page_offset.gif": ["-repage", "80x60+7+5", "{out}"],
        }
        for name, options in magick.items():
            out = str(directory / name)
            tolerance = 1 if name == "im_jpeg.tif" else 0
            run(tolerance, name, convert, str(ppm), *[o.format(out=out) for o in options])
    if not files:
        pytest.skip("none of cjpeg, cwebp, img2webp, ImageMagick is installed")
    return files


def _pillow(path, mode):
    with Image.open(path) as image:
        return np.asarray(image.convert(mode))


@pytest.mark.parametrize("mode", ["RGB", "L", "RGBA"])
def test_files_from_other_encoders_decode_as_pillow_decodes_them(tmp_path, mode):
    files = _encode(tmp_path)
    different = {}
    for name, tolerance in files.items():
        expected = _pillow(tmp_path / name, mode)
        got = ll.decode_image(tmp_path / name, mode=mode)
        if mode == "L":
            got = got[..., 0]
        worst = int(np.abs(got.astype(int) - expected.astype(int)).max(initial=0))
        if got.shape != expected.shape or worst > tolerance:
            different[name] = (got.shape, expected.shape, worst)
    assert not different, different
    assert len(files) >= 10, sorted(files)


def _psnr(a, b) -> float:
    mse = float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean())
    return 99.0 if mse == 0 else 10 * np.log10(255.0**2 / mse)


@pytest.mark.parametrize("sample", ["2x2", "1x1", "2x1", "1x2", "4x1", "1x4", "2x2,1x2,2x1"])
def test_dct_scaled_resizes_of_every_chroma_layout_stay_near_pillows(tmp_path, sample):
    """Resize / RandomResizedCrop with DCT scaling, against Pillow's full
    decode and BILINEAR resize (torchvision's result): >= 40 dB for every
    chroma layout cjpeg writes, on a texture harsher than test_image's photo
    (4:4:4, bounded by the DCT scale's 1.5x margin, is the worst: 40.1 dB).
    Layouts libjpeg upsamples at a reduced scale (4:2:2, 4:4:0, 4:1:1,
    mixed) came out at 24-32 dB."""
    cjpeg = _tool("cjpeg")
    if cjpeg is None:
        pytest.skip("cjpeg (libjpeg-turbo-progs) is not installed")
    rng = np.random.default_rng(12)
    height, width = 603, 451
    base = Image.fromarray(rng.integers(0, 256, (height // 8, width // 8, 3), dtype=np.uint8))
    texture = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
    image = Image.blend(base.resize((width, height), Image.BICUBIC),
                        texture.filter(ImageFilter.GaussianBlur(2)), 0.3)  # fmt: skip
    image.save(tmp_path / "source.ppm")
    path = tmp_path / "x.jpg"
    subprocess.run([cjpeg, "-quality", "90", "-sample", sample, "-outfile", str(path),
                    str(tmp_path / "source.ppm")], check=True, timeout=60)  # fmt: skip
    full = Image.open(path).convert("RGB")
    worst = {}
    for name, transform in (("Resize(60)", [ll.Resize(60)]),
                            ("Resize(130)", [ll.Resize(130)]),
                            ("RandomResizedCrop(48)", [ll.RandomResizedCrop(48)])):  # fmt: skip
        source = ll.Images([path] * 8, transform=transform, layout="HWC", dct_scaling=True)
        loader = ll.Loader(source, batch_size=8, num_threads=2, output="numpy", collate="list")
        values = []
        for batch in loader:
            for index, got in enumerate(batch["image"]):
                params = source.transform_params(index)
                box = None
                if params["crops"]:
                    ((i, j, h, w),) = params["crops"]
                    box = (j, i, j + w, i + h)
                expected = full.resize((got.shape[1], got.shape[0]), Image.BILINEAR, box=box)
                values.append(_psnr(got, np.asarray(expected)))
        worst[name] = round(min(values), 1)
    assert min(worst.values()) >= 40, worst


@pytest.mark.parametrize("progressive", [False, True])
def test_arithmetic_coded_jpegs_pillow_cannot_feed_decode_as_djpeg_decodes_them(
    tmp_path, progressive
):
    # Pillow feeds libjpeg its file in blocks, and libjpeg's arithmetic
    # decoder cannot resume mid-scan when a block runs out: Pillow refuses an
    # arithmetic-coded JPEG larger than a block ("broken data stream"), which
    # is a valid file. We decode it as libjpeg-turbo's own djpeg does (README).
    cjpeg, djpeg = _tool("cjpeg"), _tool("djpeg")
    if cjpeg is None or djpeg is None:
        pytest.skip("cjpeg/djpeg (libjpeg-turbo-progs) are not installed")
    rng = np.random.default_rng(13)
    source = tmp_path / "source.ppm"
    Image.fromarray(rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)).save(source)
    path = tmp_path / "arithmetic.jpg"
    options = ["-arithmetic"] + (["-progressive"] if progressive else [])
    subprocess.run([cjpeg, "-quality", "90", *options, "-outfile", str(path), str(source)],
                   check=True, timeout=60)  # fmt: skip
    assert path.stat().st_size > 65536
    decoded = tmp_path / "djpeg.ppm"
    subprocess.run([djpeg, "-ppm", "-outfile", str(decoded), str(path)], check=True, timeout=60)
    np.testing.assert_array_equal(ll.decode_image(path), np.asarray(Image.open(decoded)))
    # Pillow's L is its own conversion of RGB (not libjpeg's): compare with it.
    expected_l = np.asarray(Image.open(decoded).convert("L"))
    np.testing.assert_array_equal(ll.decode_image(path, mode="L")[..., 0], expected_l)
    with pytest.raises(OSError, match="broken data stream"):  # Pillow's limit, still there?
        Image.open(path).load()
