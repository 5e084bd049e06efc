"""PBM/PGM/PPM and TIFF against Pillow: files written by Pillow, by hand
(plain and raw PNM with every maxval rule, comments, damage) and by tifffile
(tiles, 16-bit samples, alpha, predictors, planar layouts, compression),
decoded by ``ll.decode_image`` and by Pillow (``Image.open -> exif_transpose
-> convert(mode)``): equal, or refused by both."""

from __future__ import annotations

import numpy as np
import pytest

import leanloader as ll

Image = pytest.importorskip("PIL.Image")
ImageOps = pytest.importorskip("PIL.ImageOps")


def pillow(path, mode: str = "RGB", exif: bool = True) -> np.ndarray:
    with Image.open(path) as image:
        if exif:
            image = ImageOps.exif_transpose(image)
        return np.asarray(image.convert(mode))


def ours(path, mode: str = "RGB", exif: bool = True) -> np.ndarray:
    pixels = ll.decode_image(path, mode=mode, exif_orientation=exif)
    return pixels[..., 0] if mode == "L" else pixels


def same_or_both_refuse(path, mode: str = "RGB", tolerance: int = 0, exif: bool = True) -> str:
    """Pillow's Image.open -> exif_transpose -> convert(mode) against ours with
    exif_orientation=True; with exif=False, torchvision's pil_loader
    (Image.open -> convert) against our default."""
    try:
        expected = pillow(path, mode, exif)
    except Exception as error:  # Pillow refuses: so must we
        with pytest.raises((ValueError, OSError)):
            ours(path, mode, exif)
        return f"refused ({type(error).__name__})"
    got = ours(path, mode, exif)
    assert got.shape == expected.shape, (path, got.shape, expected.shape)
    difference = np.abs(got.astype(int) - expected.astype(int)).max(initial=0)
    assert difference <= tolerance, (path, mode, int(difference))
    return "equal"


def rng_image(height: int, width: int, channels: int, dtype=np.uint8, seed: int = 0):
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    shape = (height, width) if channels == 1 else (height, width, channels)
    return rng.integers(0, int(info.max) + 1, shape, dtype=np.int64).astype(dtype)


# -- PBM / PGM / PPM -----------------------------------------------------------------------


def _plain(magic: str, width: int, height: int, values, maxval: int | None, comment=True) -> bytes:
    header = f"{magic}\n" + ("# written by hand\n" if comment else "") + f"{width} {height}\n"
    if maxval is not None:
        header += f"{maxval}\n"
    body = " ".join(str(int(v)) for v in np.ravel(values))
    if magic == "P1":
        body = "".join(str(int(v)) for v in np.ravel(values))  # no spaces needed
    return header.encode() + body.encode() + b"\n"


def _raw(magic: str, width: int, height: int, values, maxval: int | None) -> bytes:
    header = f"{magic}\n{width} {height}\n" + (f"{maxval}\n" if maxval is not None else "")
    if magic == "P4":
        rows = np.packbits(np.asarray(values, dtype=np.uint8), axis=1)
        return header.encode() + rows.tobytes()
    dtype = ">u2" if maxval is not None and maxval > 255 else "u1"
    return header.encode() + np.asarray(values).astype(dtype).tobytes()


def _floats(dtype: str) -> bytes:
    values = [-3.5, 0.0, 0.49, 1.5, 2.99, 127.5, 254.99, 255.0, 1e9, np.nan]
    return np.asarray(values, dtype=dtype).tobytes()


def pnm_corpus(directory) -> dict[str, bytes]:
    h, w = 7, 13
    bits = rng_image(h, w, 1) % 2
    files = {
        "plain_bits.pbm": _plain("P1", w, h, bits, None),
        "raw_bits_odd_width.pbm": _raw("P4", w, h, bits, None),
        "plain_gray.pgm": _plain("P2", w, h, rng_image(h, w, 1), 255),
        "plain_gray_maxval_15.pgm": _plain("P2", w, h, rng_image(h, w, 1) % 16, 15),
        "plain_gray_maxval_1000.pgm": _plain(
            "P2", w, h, rng_image(h, w, 1, np.uint16) % 1001, 1000
        ),
        "plain_color_maxval_7.ppm": _plain("P3", w, h, rng_image(h, w, 3) % 8, 7),
        "plain_color_maxval_65535.ppm": _plain("P3", w, h, rng_image(h, w, 3, np.uint16), 65535),
        "raw_gray.pgm": _raw("P5", w, h, rng_image(h, w, 1), 255),
        "raw_gray_maxval_15.pgm": _raw("P5", w, h, rng_image(h, w, 1) % 16, 15),
        # values above maxval in a raw file: Pillow clamps them
        "raw_gray_maxval_100.pgm": _raw("P5", w, h, rng_image(h, w, 1), 100),
        "raw_gray_maxval_1000.pgm": _raw("P5", w, h, rng_image(h, w, 1, np.uint16) % 1001, 1000),
        "raw_gray_16bit.pgm": _raw("P5", w, h, rng_image(h, w, 1, np.uint16) % 600, 65535),
        "raw_color.ppm": _raw("P6", w, h, rng_image(h, w, 3), 255),
        "raw_color_maxval_1023.ppm": _raw("P6", w, h, rng_image(h, w, 3, np.uint16) % 1024, 1023),
        "comment_inside_token.pgm": b"P5\n1#x\n3 1\n255\n" + bytes([1, 2, 3] * 13),
        # refused by Pillow: so by us
        "truncated.ppm": _raw("P6", w, h, rng_image(h, w, 3), 255)[:-10],
        "truncated_plain.pgm": _plain("P2", w, h, rng_image(h, w, 1), 255)[:-30],
        "above_maxval_plain.pgm": _plain("P2", 2, 1, [3, 9], 5),
        "maxval_zero.pgm": b"P5\n2 1\n0\n\x00\x00",
        "bad_bit.pbm": b"P1\n2 1\n0 2\n",
        # PFM (Pillow's mode "F"): bottom row first, the scale's sign is the byte order;
        # F -> L truncates and clips (negative, NaN: 0; above 255: 255)
        "float_little_endian.pfm": b"Pf\n5 2\n-1.0\n" + _floats("<f4"),
        "float_big_endian.pfm": b"Pf\n5 2\n2.5\n" + _floats(">f4"),
        "float_zero_scale.pfm": b"Pf\n5 2\n0\n" + _floats("<f4"),
        "float_truncated.pfm": (b"Pf\n5 2\n-1.0\n" + _floats("<f4"))[:-3],
    }
    for mode, name in (("1", "pillow_bits.pbm"), ("L", "pillow_gray.pgm"),
                       ("RGB", "pillow_color.ppm"), ("I;16", "pillow_16bit.pgm"),
                       ("F", "pillow_float.pfm")):  # fmt: skip
        image = Image.fromarray(rng_image(h, w, 3)).convert(mode if mode != "I;16" else "L")
        if mode == "I;16":
            image = Image.fromarray((rng_image(h, w, 1, np.uint16) % 700).astype(np.uint16))
        if mode == "F":
            image = Image.fromarray(rng_image(h, w, 1, np.uint16).astype(np.float32) / 200 - 20)
        path = directory / name
        image.save(path)
        files[name] = path.read_bytes()
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return files


@pytest.mark.parametrize("mode", ["RGB", "L", "RGBA"])
def test_pnm_files_decode_as_pillow_decodes_them(tmp_path, mode):
    outcomes = {name: same_or_both_refuse(tmp_path / name, mode) for name in pnm_corpus(tmp_path)}
    refused = {name for name, outcome in outcomes.items() if outcome.startswith("refused")}
    # the damaged files are refused (by Pillow, so by us); the others decode
    expected = {"truncated.ppm", "truncated_plain.pgm", "above_maxval_plain.pgm",
                "maxval_zero.pgm", "bad_bit.pbm", "float_zero_scale.pfm",
                "float_truncated.pfm"}  # fmt: skip
    assert refused == expected, outcomes


def test_pnm_errors_name_the_file_and_the_cause(tmp_path):
    path = tmp_path / "short.ppm"
    path.write_bytes(_raw("P6", 4, 4, rng_image(4, 4, 3), 255)[:-5])
    with pytest.raises(ValueError, match=r"short\.ppm.*truncated"):
        ll.decode_image(path)
    path = tmp_path / "float.pfm"
    path.write_bytes(b"Pf\n1 1\nnan\n\x00\x00\x80\x3f")
    with pytest.raises(ValueError, match=r"float\.pfm.*scale must be finite"):
        ll.decode_image(path)


# -- TIFF ----------------------------------------------------------------------------------

tifffile = pytest.importorskip("tifffile")


def tiff_corpus(directory) -> list[str]:
    h, w = 37, 53  # not a multiple of the 16-pixel tiles
    names = []

    def write(name, data, **options):
        tifffile.imwrite(directory / name, data, **options)
        names.append(name)

    write("gray8.tif", rng_image(h, w, 1))
    write("gray8_tiled.tif", rng_image(h, w, 1), tile=(16, 16))
    write("gray16.tif", rng_image(h, w, 1, np.uint16) % 400)
    write("gray16_tiled_deflate.tif", rng_image(h, w, 1, np.uint16) % 400, tile=(16, 16),
          compression="zlib")  # fmt: skip
    write("gray16_big_endian.tif", rng_image(h, w, 1, np.uint16) % 400, byteorder=">")
    write(
        "gray_alpha.tif", rng_image(h, w, 2), photometric="minisblack", extrasamples=["unassalpha"]
    )
    write("rgb8.tif", rng_image(h, w, 3))
    write("rgb8_tiled.tif", rng_image(h, w, 3), tile=(16, 32))
    write("rgb8_predictor_deflate.tif", rng_image(h, w, 3), compression="zlib", predictor=True)
    write("rgb8_planar.tif", np.moveaxis(rng_image(h, w, 3), -1, 0), planarconfig="separate",
          photometric="rgb")  # fmt: skip
    write("rgb16.tif", rng_image(h, w, 3, np.uint16))
    write("rgba8.tif", rng_image(h, w, 4), extrasamples=["unassalpha"])
    write("rgbx8.tif", rng_image(h, w, 4), extrasamples=["unspecified"])
    write("rgba16.tif", rng_image(h, w, 4, np.uint16), extrasamples=["unassalpha"])
    write("miniswhite8.tif", rng_image(h, w, 1), photometric="miniswhite")
    write("bits1.tif", rng_image(h, w, 1) % 2 == 1)
    write("palette8.tif", rng_image(h, w, 1), photometric="palette",
          colormap=rng_image(3, 256, 1, np.uint16))  # fmt: skip
    # Pillow's modes beyond 8-bit unsigned, each converted by Pillow's rules: "I;16" and
    # "I" clip, "F" truncates and clips, "RGBa" divides the alpha out, "CMYK" by
    # cmyk2rgb, "LAB" through LittleCMS
    write("gray16_miniswhite.tif", rng_image(h, w, 1, np.uint16) % 400, photometric="miniswhite")
    write("gray8_signed.tif", rng_image(h, w, 1).astype(np.int8))
    write("gray16_signed.tif", (rng_image(h, w, 1, np.uint16) % 600).astype(np.int16) - 200)
    write("gray32_signed.tif", (rng_image(h, w, 1, np.uint16) % 600).astype(np.int32) - 200)
    write("gray32_unsigned.tif", (rng_image(h, w, 1, np.uint16) % 600).astype(np.uint32))
    floats = rng_image(h, w, 1, np.uint16).astype(np.float32) / 150 - 50
    floats[0, :4] = [np.nan, np.inf, -np.inf, 254.999]
    write("gray32_float.tif", floats)
    write("gray32_float_tiled.tif", floats, tile=(16, 16), compression="zlib")
    write("rgb_associated_alpha8.tif", rng_image(h, w, 4), extrasamples=["assocalpha"])
    write("rgb_associated_alpha16.tif", rng_image(h, w, 4, np.uint16), extrasamples=["assocalpha"])
    write("rgb_alpha_and_unspecified8.tif", rng_image(h, w, 5),
          photometric="rgb", extrasamples=["unassalpha", "unspecified"])  # fmt: skip
    # (compressed: Pillow's own reader of uncompressed 16-bit planes takes every
    # byte for a sample; libtiff, which it uses for compressed files, does not)
    write("rgb16_planar.tif", np.moveaxis(rng_image(h, w, 3, np.uint16), -1, 0),
          planarconfig="separate", photometric="rgb", compression="zlib")  # fmt: skip
    write("rgba16_planar_tiled.tif", np.moveaxis(rng_image(h, w, 4, np.uint16), -1, 0),
          planarconfig="separate", photometric="rgb", extrasamples=["unassalpha"],
          tile=(16, 16), compression="zlib")  # fmt: skip
    write("gray_extra_plane.tif", np.moveaxis(rng_image(h, w, 2), -1, 0),
          planarconfig="separate", photometric="minisblack", extrasamples=["unspecified"],
          compression="zlib")  # fmt: skip
    write("cmyk8.tif", rng_image(h, w, 4), photometric="separated")
    write("cmyk16.tif", rng_image(h, w, 4, np.uint16), photometric="separated")
    write("cielab8.tif", rng_image(h, w, 3), photometric="cielab")
    # orientation (tag 274) applied as Pillow's exif_transpose applies it
    write("rgb8_rotated.tif", rng_image(h, w, 3), extratags=[(274, "H", 1, 6, True)])

    base = Image.fromarray(rng_image(h, w, 3, seed=3))
    for mode in ("1", "L", "P", "RGB", "RGBA", "CMYK", "I;16", "LA"):
        for compression in ("raw", "tiff_lzw", "tiff_adobe_deflate", "packbits"):
            name = f"pillow_{mode.replace(';', '')}_{compression}.tif"
            image = base.convert(mode) if mode != "I;16" else base.convert("L").convert("I;16")
            image.save(directory / name, compression=compression)
            names.append(name)
    base.save(directory / "pillow_jpeg.tif", compression="jpeg")
    base.convert("1").save(directory / "pillow_group4.tif", compression="group4")
    names += ["pillow_jpeg.tif", "pillow_group4.tif"]
    data = (directory / "rgb8_tiled.tif").read_bytes()
    (directory / "truncated.tif").write_bytes(data[: len(data) // 2])
    (directory / "header_only.tif").write_bytes(data[:8])
    names += ["truncated.tif", "header_only.tif"]
    return names


@pytest.mark.parametrize("mode", ["RGB", "L", "RGBA"])
def test_tiff_files_decode_as_pillow_decodes_them(tmp_path, mode):
    outcomes = {}
    for name in tiff_corpus(tmp_path):
        tolerance = 1 if name == "pillow_jpeg.tif" else 0
        if name == "cielab8.tif" and mode == "L":
            # Pillow has no LAB -> L conversion; ours is the luma of its LAB -> RGB
            rgb = Image.fromarray(pillow(tmp_path / name, "RGB"))
            assert np.array_equal(ours(tmp_path / name, "L"), np.asarray(rgb.convert("L")))
            continue
        outcomes[name] = same_or_both_refuse(tmp_path / name, mode, tolerance)
    refused = sorted(name for name, outcome in outcomes.items() if outcome.startswith("refused"))
    assert refused == ["header_only.tif", "truncated.tif"], outcomes


def test_tiff_errors_name_the_file(tmp_path):
    path = tmp_path / "cut.tif"
    tifffile.imwrite(path, rng_image(64, 64, 3))
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ValueError, match=r"cut\.tif.*TIFF"):
        ll.decode_image(path)
    # layouts Pillow has no mode for are refused, as Pillow refuses them, with the reason
    for name, data in (("float64.tif", rng_image(8, 8, 1).astype(np.float64)),
                       ("signed_rgb.tif", rng_image(8, 8, 3).astype(np.int16))):  # fmt: skip
        tifffile.imwrite(tmp_path / name, data)
        with pytest.raises(OSError):
            pillow(tmp_path / name)
        with pytest.raises(ValueError, match=name.replace(".", r"\.") + ".*not supported"):
            ll.decode_image(tmp_path / name)


# -- BMP -----------------------------------------------------------------------------------

import struct  # noqa: E402


def bmp_file(width, height, bits, data: bytes, *, header=40, compression=0, palette=b"",
             masks=None, top_down=False, colors=0) -> bytes:  # fmt: skip
    """A BMP with the given pixel data (rows in file order, already padded)."""
    if header == 12:
        info = struct.pack("<IHHHH", 12, width, height, 1, bits)
    else:
        info = struct.pack(
            "<IiiHHIIiiII", header, width, -height if top_down else height, 1, bits,
            compression, len(data), 2835, 2835, colors, 0,
        )  # fmt: skip
        if masks is not None and header >= 52:
            info += struct.pack(f"<{len(masks)}I", *masks)
        info = info.ljust(header, b"\0")
    extra = struct.pack("<3I", *masks) if masks is not None and header == 40 else b""
    offset = 14 + len(info) + len(extra) + len(palette)
    head = b"BM" + struct.pack("<IHHI", offset + len(data), 0, 0, offset)
    return head + info + extra + palette + data


def _rows(pixels: np.ndarray, bits: int, bottom_up: bool = True) -> bytes:
    """Packs (H, W) indices or (H, W, bytes) pixel bytes into padded rows."""
    rows = pixels[::-1] if bottom_up else pixels
    out = b""
    for row in rows:
        if bits == 1:
            data = np.packbits(row.astype(np.uint8)).tobytes()
        elif bits == 4:
            flat = np.append(row, 0) if len(row) % 2 else row
            data = bytes((flat[0::2] << 4 | flat[1::2]).astype(np.uint8))
        else:
            data = row.astype(np.uint8).tobytes()
        out += data + b"\0" * (-len(data) % 4)
    return out


def _rle8(indices: np.ndarray) -> bytes:
    """RLE8 of bottom-up rows: runs, an absolute run, end of line, end of bitmap."""
    out = b""
    for row in indices[::-1]:
        row = [int(v) for v in row]
        head, tail = row[:4], row[4:]
        out += bytes([0, len(head), *head])  # absolute (>= 3 pixels), word-aligned
        out += b"\0" * (len(head) % 2)
        for value in tail:
            out += bytes([1, value])
        out += b"\0\0"
    return out + b"\0\1"


def bmp_corpus(directory) -> list[str]:
    h, w = 9, 11
    rng = np.random.default_rng(7)
    palette16 = rng.integers(0, 256, (16, 4), dtype=np.uint8).tobytes()
    palette256 = rng.integers(0, 256, (256, 4), dtype=np.uint8).tobytes()
    idx16 = rng.integers(0, 16, (h, w))
    idx256 = rng.integers(0, 256, (h, w))
    bgr = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    words = rng.integers(0, 65536, (h, w), dtype=np.uint16)
    dwords = rng.integers(0, 2**32, (h, w), dtype=np.uint32)
    le16 = words.astype("<u2").view(np.uint8).reshape(h, w * 2)
    le32 = dwords.astype("<u4").view(np.uint8).reshape(h, w * 4)
    files = {
        "pal4.bmp": bmp_file(w, h, 4, _rows(idx16, 4), palette=palette16, colors=16),
        "pal8.bmp": bmp_file(w, h, 8, _rows(idx256, 8), palette=palette256),
        "pal8_top_down.bmp": bmp_file(
            w, h, 8, _rows(idx256, 8, False), palette=palette256, top_down=True
        ),
        "pal1.bmp": bmp_file(w, h, 1, _rows(idx16 % 2, 1), palette=palette16[:8], colors=2),
        "rgb555.bmp": bmp_file(w, h, 16, _rows(le16, 8)),
        "rgb565_bitfields.bmp": bmp_file(
            w, h, 16, _rows(le16, 8), compression=3, masks=(0xF800, 0x7E0, 0x1F)
        ),
        "bgr24.bmp": bmp_file(w, h, 24, _rows(bgr.reshape(h, w * 3), 8)),
        "bgrx32.bmp": bmp_file(w, h, 32, _rows(le32, 8)),
        "xbgr32_bitfields.bmp": bmp_file(
            w,
            h,
            32,
            _rows(le32, 8),
            compression=3,
            header=56,
            masks=(0xFF000000, 0xFF0000, 0xFF00, 0),
        ),
        "rgba32_bitfields.bmp": bmp_file(
            w,
            h,
            32,
            _rows(le32, 8),
            compression=3,
            header=108,
            masks=(0xFF, 0xFF00, 0xFF0000, 0xFF000000),
        ),
        "os2_bgr24.bmp": bmp_file(w, h, 24, _rows(bgr.reshape(h, w * 3), 8), header=12),
        "os2_pal8.bmp": bmp_file(
            w,
            h,
            8,
            _rows(idx256, 8),
            header=12,
            palette=rng.integers(0, 256, 768, dtype=np.uint8).tobytes(),
        ),
        "rle8.bmp": bmp_file(w, h, 8, _rle8(idx256), compression=1, palette=palette256),
        # the last row stored without its padding: Pillow reads it
        "last_row_unpadded.bmp": bmp_file(w, h, 8, _rows(idx256, 8), palette=palette256)[:-1],
        # refused by Pillow, so by us
        "rle8_ends_early.bmp": bmp_file(
            w, h, 8, _rle8(idx256)[:12] + b"\0\1", compression=1, palette=palette256
        ),
        "truncated.bmp": bmp_file(w, h, 24, _rows(bgr.reshape(h, w * 3), 8))[:-40],
        "bits2.bmp": bmp_file(w, h, 2, _rows(idx16 % 4, 8), palette=palette16[:16]),
        "odd_bitfields.bmp": bmp_file(
            w, h, 16, _rows(le16, 8), compression=3, masks=(0xF00, 0xF0, 0xF)
        ),
        "jpeg_payload.bmp": bmp_file(w, h, 24, b"\xff\xd8" + b"\0" * 50, compression=4),
        "palette_of_300.bmp": bmp_file(
            w, h, 8, _rows(idx256, 8), palette=palette256 + palette16 * 3, colors=300
        ),
    }
    base = Image.fromarray(bgr)
    for mode in ("1", "L", "P", "RGB", "RGBA"):
        path = directory / f"pillow_{mode}.bmp"
        base.convert(mode).save(path)
        files[path.name] = path.read_bytes()
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return list(files)


@pytest.mark.parametrize("mode", ["RGB", "L", "RGBA"])
def test_bmp_files_decode_as_pillow_decodes_them(tmp_path, mode):
    outcomes = {name: same_or_both_refuse(tmp_path / name, mode) for name in bmp_corpus(tmp_path)}
    refused = {name for name, outcome in outcomes.items() if outcome.startswith("refused")}
    expected = {"rle8_ends_early.bmp", "truncated.bmp", "bits2.bmp", "odd_bitfields.bmp",
                "jpeg_payload.bmp", "palette_of_300.bmp"}  # fmt: skip
    assert refused == expected, outcomes


# -- PNG chunk structure ---------------------------------------------------------------------

import zlib  # noqa: E402


def _chunk(name: bytes, data: bytes, crc: int | None = None) -> bytes:
    crc = zlib.crc32(name + data) if crc is None else crc
    return struct.pack(">I", len(data)) + name + data + struct.pack(">I", crc)


def png_structure_corpus(directory) -> list[str]:
    path = directory / "base.png"
    Image.fromarray(rng_image(9, 11, 3)).save(path)
    data = path.read_bytes()
    ihdr_end = 8 + 25
    idat = data.index(b"IDAT") - 4
    iend = data.index(b"IEND") - 4
    before, image, end = data[:ihdr_end], data[ihdr_end:iend], data[iend:]
    text = _chunk(b"tEXt", b"Comment\0written by hand")
    icc = zlib.compress(b"\0" * 300)
    files = {
        "text_before_image.png": before + text + image + end,
        "text_after_image.png": data[:iend] + text + end,
        "garbage_after_end.png": data + b"trailing bytes",
        "no_end_chunk.png": data[:iend],
        "end_chunk_cut.png": data[:-3],
        # refused by Pillow, so by us: a bad checksum before the image data, an ICC
        # profile of an unknown compression method, a chunk after the image cut short
        "bad_crc_before_image.png": before + _chunk(b"tEXt", b"Comment\0x", crc=1) + image + end,
        "icc_method_1.png": before + _chunk(b"iCCP", b"profile\0\1" + icc) + image + end,
        "chunk_after_image_cut.png": data[:iend] + text[:-10],
        "idat_header_after_image.png": data[:iend] + struct.pack(">I", 4000) + b"IDAT",
    }
    assert data[idat + 4 : idat + 8] == b"IDAT"
    for name, payload in files.items():
        (directory / name).write_bytes(payload)
    return list(files)


@pytest.mark.parametrize("mode", ["RGB", "L", "RGBA"])
def test_png_chunk_structure_is_checked_as_pillow_checks_it(tmp_path, mode):
    outcomes = {
        name: same_or_both_refuse(tmp_path / name, mode) for name in png_structure_corpus(tmp_path)
    }
    refused = {name for name, outcome in outcomes.items() if outcome.startswith("refused")}
    expected = {"bad_crc_before_image.png", "icc_method_1.png", "chunk_after_image_cut.png",
                "idat_header_after_image.png"}  # fmt: skip
    assert refused == expected, outcomes
    with pytest.raises(ValueError, match=r"bad_crc_before_image\.png.*checksum in the tEXt"):
        ll.decode_image(tmp_path / "bad_crc_before_image.png")


@pytest.mark.parametrize("compression", ["raw", "tiff_lzw"])
def test_a_tiffs_orientation_is_applied_as_pillow_applies_it_on_every_load(tmp_path, compression):
    """Pillow's TIFF plugin runs exif_transpose when it loads (load_end), so
    torchvision's pil_loader, Image.open(path).convert("RGB"), returns the
    oriented image; leanloader's default (exif_orientation=False) must too.
    Other formats' tags are applied only when asked (test_image.py)."""
    stored = rng_image(4, 6, 3)
    for orientation in range(1, 9):
        path = tmp_path / f"o{orientation}_{compression}.tif"
        Image.fromarray(stored).save(path, tiffinfo={274: orientation}, compression=compression)
        with Image.open(path) as image:
            expected = np.asarray(image.convert("RGB"))
        np.testing.assert_array_equal(ll.decode_image(path), expected)
        images = ll.Images([str(path)], layout="HWC")
        (batch,) = ll.Loader(images, batch_size=1, output="numpy", collate="list")
        np.testing.assert_array_equal(batch["image"][0], expected)


# -- GIF -------------------------------------------------------------------------------------


def _gif_bytes(image, **options) -> bytes:
    import io

    buffer = io.BytesIO()
    image.save(buffer, format="GIF", **options)
    return buffer.getvalue()


def _first_image(data: bytes) -> int:
    """The offset of the first image descriptor (","), past the header, the
    global colour table and the extensions."""
    at = 13 + ((3 << ((data[10] & 7) + 1)) if data[10] & 0x80 else 0)
    while data[at] == 0x21:
        at += 2
        while data[at]:
            at += data[at] + 1
        at += 1
    assert data[at] == 0x2C
    return at


def gif_corpus(directory) -> list[str]:
    """Pillow's GIFs (interlaced or not, gray, bilevel, transparent,
    animated) and hand-patched ones: a frame offset inside or reaching past
    the logical screen, gray-ramp/short/absent/local colour tables, bytes
    and odd extensions between blocks, every LZW code size, damage."""
    files = {
        "p_small.gif": _gif_bytes(Image.fromarray(rng_image(9, 11, 3)).convert("P")),
        "p_interlaced.gif": _gif_bytes(Image.fromarray(rng_image(40, 33, 3, seed=1)).convert("P")),
        "p_not_interlaced.gif": _gif_bytes(
            Image.fromarray(rng_image(40, 33, 3, seed=1)).convert("P"), interlace=0
        ),
        "l.gif": _gif_bytes(Image.fromarray(rng_image(20, 17, 1, seed=2))),
        # noise: the LZW table fills (4,096 codes) and is cleared, again and again
        "p_noise.gif": _gif_bytes(Image.fromarray(rng_image(120, 130, 3, seed=6)).convert("P")),
        "bilevel.gif": _gif_bytes(Image.fromarray(rng_image(20, 17, 1, seed=3)).convert("1")),
        "transparency.gif": _gif_bytes(
            Image.fromarray(rng_image(30, 30, 3, seed=5)).convert("P"), transparency=7
        ),
    }
    frames = [Image.fromarray(rng_image(26, 31, 3, seed=s)).convert("P") for s in range(3)]
    files["animated.gif"] = _gif_bytes(frames[0], save_all=True, append_images=frames[1:])
    base = files["p_small.gif"]
    image = _first_image(base)
    flags = base[10]
    table = 3 << ((flags & 7) + 1)
    ramp = bytes(v for i in range(table // 3) for v in (i, i, i))
    code_size_at = image + 10

    def patched(data, at, layout, *values):
        data = bytearray(data)
        struct.pack_into(layout, data, at, *values)
        return bytes(data)

    def before_image(data, extra):
        at = _first_image(data)
        return data[:at] + extra + data[at:]

    screen = patched(base, 6, "<HH", 20, 15)
    files["frame_offset.gif"] = patched(screen, image + 1, "<HH", 4, 3)
    files["frame_past_screen.gif"] = patched(base, image + 1, "<HH", 6, 2)
    files["screen_0x0.gif"] = patched(base, 6, "<HH", 0, 0)
    transparent = files["transparency.gif"]
    files["frame_offset_transparent.gif"] = patched(
        patched(transparent, 6, "<HH", 40, 36), _first_image(transparent) + 1, "<HH", 5, 4
    )
    files["gray_ramp_table.gif"] = base[:13] + ramp + base[13 + table :]
    no_table = base[:10] + bytes([flags & 0x7F]) + base[11:13] + base[13 + table :]
    files["no_table.gif"] = no_table
    gce_transparent_47 = b"\x21\xf9\x04\x01\x00\x00\x2f\x00"
    files["no_table_transparent.gif"] = before_image(no_table, gce_transparent_47)
    files["two_entry_table.gif"] = (
        base[:10] + bytes([flags & 0xF8]) + base[11:13] + bytes([10, 20, 30, 200, 100, 50])
        + base[13 + table :]
    )  # fmt: skip
    local = bytearray(base)
    local[image + 9] |= 0x80 | (flags & 7)
    # a gray-ramp local table beside a colour global one: Pillow's mode is L,
    # its RGB the global table's colours, its L the indices
    files["local_ramp.gif"] = bytes(local[: image + 10]) + ramp + bytes(local[image + 10 :])
    files["local_ramp_transparent.gif"] = before_image(files["local_ramp.gif"], gce_transparent_47)
    files["local_colour.gif"] = (
        base[:13] + ramp + bytes(local[13 + table : image + 10]) + base[13 : 13 + table]
        + bytes(local[image + 10 :])
    )  # fmt: skip
    files["bytes_between_blocks.gif"] = before_image(base, b"\x07\x01\x00")
    files["comment.gif"] = before_image(base, b"\x21\xfe\x05hello\x03abc\x00")
    files["extension_first_block_empty.gif"] = before_image(base, b"\x21\x01\x00\x02ab\x00")
    files["gce_too_short.gif"] = before_image(base, b"\x21\xf9\x02\x01\x00\x00")
    files["gce_transparent_5.gif"] = before_image(base, b"\x21\xf9\x04\x01\x00\x00\x05\x00")
    files["gif87a.gif"] = b"GIF87a" + base[6:]
    files["no_trailer.gif"] = base[:-1]
    files["image_data_cut.gif"] = base[:-30]
    files["header_cut.gif"] = base[:20]
    files["image_ends_early.gif"] = patched(patched(base, 6, "<HH", 11, 12), image + 7, "<H", 12)
    for code_size in (0, 1, 9, 13):
        files[f"code_size_{code_size}.gif"] = patched(base, code_size_at, "B", code_size)
    for k, at in enumerate((code_size_at + 10, code_size_at + 30)):
        damaged = bytearray(base)
        damaged[at] ^= 0xFF
        files[f"damaged_{k}.gif"] = bytes(damaged)
    files["empty_frame.gif"] = patched(base, image + 5, "<HH", 0, 0)
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return list(files)


@pytest.mark.parametrize("mode", ["RGB", "L", "RGBA"])
def test_gif_files_decode_as_pillow_decodes_them(tmp_path, mode):
    # GIFs carry no orientation; exif_transpose's copy would turn the
    # local_ramp files' "L" into "P" (and convert them otherwise)
    outcomes = {
        name: same_or_both_refuse(tmp_path / name, mode, exif=False)
        for name in gif_corpus(tmp_path)
    }
    refused = {name for name, outcome in outcomes.items() if outcome.startswith("refused")}
    expected = {"gce_too_short.gif", "image_data_cut.gif", "header_cut.gif",
                "image_ends_early.gif", "code_size_1.gif", "code_size_9.gif", "code_size_13.gif",
                "damaged_0.gif", "damaged_1.gif", "empty_frame.gif"}  # fmt: skip
    if mode == "RGBA":
        expected.add("local_ramp_transparent.gif")  # Pillow: no P -> RGBA convert_transparent
    assert refused == expected, outcomes
    with pytest.raises(ValueError, match=r"image_data_cut\.gif.*GIF: image file is truncated"):
        ll.decode_image(tmp_path / "image_data_cut.gif", mode=mode)


def test_a_gif_named_jpg_in_an_image_folder_decodes_as_torchvisions_pil_loader(tmp_path):
    """A GIF under an image extension (web-scraped datasets have them) was an
    error in the middle of an epoch; torchvision's pil_loader decodes it."""
    for label in ("a", "b"):
        (tmp_path / label).mkdir()
        Image.fromarray(rng_image(12, 10, 3, seed=len(label))).save(tmp_path / label / "0.png")
    gif = tmp_path / "b" / "1.jpg"
    gif.write_bytes(_gif_bytes(Image.fromarray(rng_image(12, 10, 3, seed=9)).convert("P")))
    dataset = ll.ImageFolder(str(tmp_path), layout="HWC")
    (batch,) = ll.Loader(dataset, batch_size=3, output="numpy", collate="list")
    with Image.open(gif) as image:
        np.testing.assert_array_equal(batch["image"][2], np.asarray(image.convert("RGB")))
    assert list(batch["label"]) == [0, 1, 1]
