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


def pillow(path, mode: str = "RGB") -> np.ndarray:
    with Image.open(path) as image:
        image = ImageOps.exif_transpose(image)
        return np.asarray(image.convert(mode))


def ours(path, mode: str = "RGB") -> np.ndarray:
    pixels = ll.decode_image(path, mode=mode, exif_orientation=True)
    return pixels[..., 0] if mode == "L" else pixels


def same_or_both_refuse(path, mode: str = "RGB", tolerance: int = 0) -> str:
    try:
        expected = pillow(path, mode)
    except Exception as error:  # Pillow refuses: so must we
        with pytest.raises((ValueError, OSError)):
            ours(path, mode)
        return f"refused ({type(error).__name__})"
    got = ours(path, mode)
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
