"""safetensors interop with the reference package, validation, zero-copy, atomicity."""

from __future__ import annotations

import gc
import json
import os
import struct

import numpy as np
import pytest
import safetensors
import safetensors.numpy
import safetensors.torch
import torch

import leanloader as ll
from leanloader.safetensors import read_safetensors_header

TORCH_DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.uint16,
    torch.int32,
    torch.uint32,
    torch.int64,
    torch.uint64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    *[
        getattr(torch, name)
        for name in ("float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
        if hasattr(torch, name)
    ],
]

NUMPY_DTYPES = ["bool", "u1", "i1", "u2", "i2", "u4", "i4", "u8", "i8", "f2", "f4", "f8", "c8"]


def random_torch(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Every bit pattern of the dtype, NaNs included: compare bytes, not values."""
    generator = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    numel = int(np.prod(shape))
    raw = torch.randint(0, 256, (numel * dtype.itemsize,), generator=generator, dtype=torch.uint8)
    return raw.view(dtype).reshape(shape)


def torch_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def assert_same_torch(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    assert torch_bytes(actual) == torch_bytes(expected)


def torch_sample(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {
        "matrix": random_torch(dtype, (3, 5), 1),
        "scalar": random_torch(dtype, (), 2),
        "empty": random_torch(dtype, (0, 4), 3),
        "other": random_torch(dtype, (7,), 4),
    }


def numpy_sample(dtype: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    dt = np.dtype(dtype)

    def make(shape: tuple[int, ...]) -> np.ndarray:
        if dt == np.bool_:
            return rng.integers(0, 2, shape).astype(bool)
        raw = rng.integers(0, 256, int(np.prod(shape)) * dt.itemsize, dtype=np.uint8)
        return raw.view(dt).reshape(shape)

    return {"matrix": make((4, 3)), "scalar": make(()), "empty": make((2, 0)), "row": make((5,))}


def safetensors_file(header: dict | str | bytes, data: bytes = b"") -> bytes:
    if isinstance(header, dict):
        header = json.dumps(header, separators=(",", ":"))
    if isinstance(header, str):
        header = header.encode()
    return struct.pack("<Q", len(header)) + header + data


# --- interop with the reference package --------------------------------------------------------


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
def test_files_we_write_load_in_the_reference_torch(tmp_path, dtype):
    tensors = torch_sample(dtype)
    ours = tmp_path / "ours.safetensors"
    ll.save_safetensors(ours, tensors, metadata={"format": "pt"})
    loaded = safetensors.torch.load_file(ours)
    assert loaded.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert_same_torch(loaded[name], tensor)
    with safetensors.safe_open(ours, "pt") as f:
        assert f.metadata() == {"format": "pt"}
    # Byte for byte what the reference writes (one metadata key: no hash order).
    theirs = tmp_path / "theirs.safetensors"
    safetensors.torch.save_file(tensors, theirs, metadata={"format": "pt"})
    assert ours.read_bytes() == theirs.read_bytes()


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
def test_files_the_reference_writes_load_in_ours_torch(tmp_path, dtype):
    tensors = torch_sample(dtype)
    path = tmp_path / "theirs.safetensors"
    safetensors.torch.save_file(tensors, path)
    loaded = ll.load_safetensors(path, output="torch")
    assert loaded.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert_same_torch(loaded[name], tensor)


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_interop_with_the_reference_numpy(tmp_path, dtype):
    arrays = numpy_sample(dtype)
    ours = tmp_path / "ours.safetensors"
    theirs = tmp_path / "theirs.safetensors"
    ll.save_safetensors(ours, arrays)
    safetensors.numpy.save_file(arrays, theirs)
    assert ours.read_bytes() == theirs.read_bytes()
    for path in (ours, theirs):
        for loaded in (
            safetensors.numpy.load_file(path),
            ll.load_safetensors(path, output="numpy"),
        ):
            assert loaded.keys() == arrays.keys()
            for name, array in arrays.items():
                assert loaded[name].dtype == array.dtype
                assert loaded[name].shape == array.shape
                assert loaded[name].tobytes() == array.tobytes()


def test_all_dtypes_in_one_file_match_the_reference_layout(tmp_path):
    tensors = {
        f"t_{str(d).split('.')[-1]}": random_torch(d, (2, 3), i) for i, d in enumerate(TORCH_DTYPES)
    }
    ours = tmp_path / "ours.safetensors"
    theirs = tmp_path / "theirs.safetensors"
    ll.save_safetensors(ours, tensors)
    safetensors.torch.save_file(tensors, theirs)
    assert ours.read_bytes() == theirs.read_bytes()
    loaded = ll.load_safetensors(theirs)
    for name, tensor in tensors.items():
        assert_same_torch(loaded[name], tensor)


def test_metadata_round_trips_both_ways(tmp_path):
    metadata = {"format": "pt", 'quote"\\\n\x01': "é😀\x7f", "": "", "json": '{"a": [1]}'}
    tensors = {"x": torch.arange(4, dtype=torch.float32)}
    ours = tmp_path / "ours.safetensors"
    ll.save_safetensors(ours, tensors, metadata=metadata)
    with safetensors.safe_open(ours, "pt") as f:
        assert f.metadata() == metadata
    assert read_safetensors_header(ours)["metadata"] == metadata

    theirs = tmp_path / "theirs.safetensors"
    safetensors.torch.save_file(tensors, theirs, metadata=metadata)
    assert read_safetensors_header(theirs)["metadata"] == metadata
    assert read_safetensors_header(theirs)["data_offset"] % 8 == 0


def test_empty_files(tmp_path):
    path = tmp_path / "empty.safetensors"
    ll.save_safetensors(path, {})
    assert path.read_bytes() == safetensors_file("{}      ")
    assert ll.load_safetensors(path) == {}
    assert safetensors.numpy.load_file(path) == {}
    ll.save_safetensors(path, {}, metadata={"k": "v"})
    with safetensors.safe_open(path, "np") as f:
        assert f.metadata() == {"k": "v"}
        assert list(f.keys()) == []
    # An empty metadata dict with no tensors: the reference 0.8 writes an unreadable
    # header here ('{},"__metadata__":{}}'); we write one that both readers accept.
    ll.save_safetensors(path, {}, metadata={})
    with safetensors.safe_open(path, "np") as f:
        assert f.metadata() == {}
    assert read_safetensors_header(path)["metadata"] == {}


def test_header_reader(tmp_path):
    path = tmp_path / "h.safetensors"
    safetensors.torch.save_file(
        {"w": torch.zeros(2, 3), "b": torch.zeros(3, dtype=torch.bfloat16)}, path
    )
    header = read_safetensors_header(path)
    assert header["metadata"] is None
    assert list(header["tensors"]) == ["w", "b"]
    assert header["tensors"]["w"] == {"dtype": "F32", "shape": (2, 3), "data_offsets": (0, 24)}
    assert header["tensors"]["b"] == {"dtype": "BF16", "shape": (3,), "data_offsets": (24, 30)}
    assert header["data_offset"] + 30 == path.stat().st_size


def test_missing_file_raises_file_not_found(tmp_path):
    for read in (ll.load_safetensors, read_safetensors_header):
        with pytest.raises(FileNotFoundError, match=r"missing\.safetensors"):
            read(tmp_path / "missing.safetensors")


def test_default_output_is_torch(tmp_path):
    path = tmp_path / "a.safetensors"
    ll.save_safetensors(path, {"a": np.arange(3)})
    assert isinstance(ll.load_safetensors(path)["a"], torch.Tensor)
    assert isinstance(ll.load_safetensors(str(path), output="numpy")["a"], np.ndarray)
    ll.save_safetensors(path, {"a": torch.zeros(2, dtype=torch.bfloat16)})
    with pytest.raises(TypeError, match="NumPy has no BF16"):
        ll.load_safetensors(path, output="numpy")
    with pytest.raises(ValueError, match="output"):
        ll.load_safetensors(path, output="jax")


# --- writer inputs ------------------------------------------------------------------------------


def test_non_contiguous_and_unusual_inputs_are_written_row_major(tmp_path):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    array = np.arange(12, dtype=">i4").reshape(3, 4)  # big-endian
    tensors = {
        "transposed": base.t(),
        "sliced": base[1:3, ::2],
        "grad": torch.ones(3, requires_grad=True),
        "reversed": np.arange(5, dtype=np.int16)[::-1],
        "big_endian": array,
        "list": [[1.5, 2.5]],
        "conj": torch.tensor([1 + 2j], dtype=torch.complex64).conj(),
    }
    path = tmp_path / "a.safetensors"
    ll.save_safetensors(path, tensors)
    loaded = safetensors.torch.load_file(path)
    assert torch.equal(loaded["transposed"], base.t().contiguous())
    assert torch.equal(loaded["sliced"], base[1:3, ::2].contiguous())
    assert torch.equal(loaded["grad"], torch.ones(3))
    assert loaded["reversed"].tolist() == [4, 3, 2, 1, 0]
    assert loaded["big_endian"].tolist() == array.tolist()
    assert loaded["list"].tolist() == [[1.5, 2.5]]
    assert loaded["conj"].tolist() == [1 - 2j]


def test_rejects_bad_arguments_without_writing(tmp_path):
    path = tmp_path / "a.safetensors"
    with pytest.raises(ValueError, match="__metadata__"):
        ll.save_safetensors(path, {"__metadata__": np.zeros(1)})
    with pytest.raises(TypeError, match="metadata"):
        ll.save_safetensors(path, {"a": np.zeros(1)}, metadata={"k": 1})
    with pytest.raises(TypeError, match="names"):
        ll.save_safetensors(path, {1: np.zeros(1)})
    with pytest.raises(TypeError):
        ll.save_safetensors(path, {"a": np.array(["text"])})
    # a lone surrogate has no UTF-8 form: the reference writer's error (it
    # had been RuntimeError("std::bad_cast"))
    with pytest.raises(UnicodeEncodeError):
        ll.save_safetensors(path, {"a\udc80": np.zeros(1)})
    with pytest.raises(UnicodeEncodeError):
        ll.save_safetensors(path, {"a": np.zeros(1)}, metadata={"k": "v\udc80"})
    assert list(tmp_path.iterdir()) == []


def test_failed_write_leaves_no_temporary_file(tmp_path):
    target = tmp_path / "target.safetensors"
    target.mkdir()
    (target / "keep").write_bytes(b"x")
    with pytest.raises(OSError) as info:
        ll.save_safetensors(target, {"a": np.zeros(1000)})
    assert str(target) in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["target.safetensors"]
    with pytest.raises(FileNotFoundError):
        ll.save_safetensors(tmp_path / "missing" / "a.safetensors", {})


def test_overwriting_a_loaded_file_keeps_the_old_views_intact(tmp_path):
    # safetensors#762: rewriting a mapped file in place zeroed the live tensors.
    path = tmp_path / "a.safetensors"
    ll.save_safetensors(path, {"w": torch.full((1024,), 7.0)})
    old = ll.load_safetensors(path)["w"]
    ll.save_safetensors(path, ll.load_safetensors(path))  # save(load(p), p)
    ll.save_safetensors(path, {"w": torch.full((1024,), 9.0)})
    assert torch.equal(old, torch.full((1024,), 7.0))
    assert torch.equal(ll.load_safetensors(path)["w"], torch.full((1024,), 9.0))
    assert [p.name for p in tmp_path.iterdir()] == ["a.safetensors"]


# --- zero-copy and alignment -------------------------------------------------------------------


def mapped_ranges(path) -> list[tuple[int, int]]:
    """Address ranges of this process's mappings of `path` (from /proc/self/maps)."""
    target = os.stat(path)
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) < 6:
                continue
            inode = int(fields[4])
            if inode == target.st_ino and fields[5] == os.path.realpath(path):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                ranges.append((start, end))
    return ranges


def test_loaded_tensors_view_the_mapped_file(tmp_path):
    path = tmp_path / "big.safetensors"
    tensors = {"a": torch.randn(256, 256), "b": torch.arange(1000, dtype=torch.int64)}
    ll.save_safetensors(path, tensors)
    loaded = ll.load_safetensors(path)
    ranges = mapped_ranges(path)
    assert ranges, "the file is not mapped"
    header = read_safetensors_header(path)
    for name, tensor in loaded.items():
        begin = tensor.data_ptr()
        end = begin + tensor.numel() * tensor.element_size()
        assert any(start <= begin and end <= stop for start, stop in ranges), name
        assert_same_torch(tensor, tensors[name])
        assert begin % tensor.element_size() == 0
    # The tensors are views at their offsets in one mapping.
    offsets = header["tensors"]
    assert (
        loaded["b"].data_ptr() - loaded["a"].data_ptr()
        == offsets["b"]["data_offsets"][0] - offsets["a"]["data_offsets"][0]
    )
    arrays = ll.load_safetensors(path, output="numpy")
    data_ptr = arrays["a"].__array_interface__["data"][0]
    assert any(start <= data_ptr < stop for start, stop in mapped_ranges(path))


def test_tensors_keep_the_mapping_alive_and_writes_stay_private(tmp_path):
    path = tmp_path / "a.safetensors"
    ll.save_safetensors(path, {"w": torch.arange(8, dtype=torch.float32)})
    before = path.read_bytes()
    w = ll.load_safetensors(path)["w"]
    gc.collect()
    w += 1  # lands in a private copy of the page, never in the file
    assert w.tolist() == [float(i + 1) for i in range(8)]
    assert path.read_bytes() == before
    del w
    gc.collect()
    assert mapped_ranges(path) == []


def test_misaligned_third_party_data_is_copied_to_aligned_memory(tmp_path):
    # No alignment padding: the F32 tensor starts at an odd file offset.
    values = np.array([1.5, -2.0, 3.25], dtype="<f4")
    header = (
        '{"b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
        '"f":{"dtype":"F32","shape":[3],"data_offsets":[1,13]}}'
    )
    while (8 + len(header)) % 4 != 1:
        header += " "
    path = tmp_path / "odd.safetensors"
    path.write_bytes(safetensors_file(header, b"\x07" + values.tobytes()))
    assert (read_safetensors_header(path)["data_offset"] + 1) % 4 != 0
    reference = safetensors.numpy.load_file(path)
    for output in ("torch", "numpy"):
        loaded = ll.load_safetensors(path, output=output)
        f = loaded["f"]
        pointer = f.data_ptr() if output == "torch" else f.__array_interface__["data"][0]
        assert pointer % 4 == 0
        assert np.asarray(f).tolist() == values.tolist() == reference["f"].tolist()
        assert np.asarray(loaded["b"]).tolist() == [7]


# --- validation ---------------------------------------------------------------------------------

X = {"x": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}


def tensor(dtype: str, shape: list, begin: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


MALFORMED = [
    ("empty file", b"", "HeaderTooSmall"),
    ("seven bytes", b"\x00" * 7, "HeaderTooSmall"),
    ("header over the cap", struct.pack("<Q", 100_000_001) + b"{}", "HeaderTooLarge"),
    ("git lfs pointer", b"version https://git-lfs.github.com/spec/v1\n", "HeaderTooLarge"),
    ("header past the end", struct.pack("<Q", 64) + b"{}", "InvalidHeaderLength"),
    ("header not utf-8", safetensors_file(b'{"\xff":1}'), "InvalidHeader"),
    ("not json", safetensors_file("{x"), "InvalidHeaderDeserialization"),
    ("json array", safetensors_file("[]"), "InvalidHeaderDeserialization"),
    (
        "unknown dtype",
        safetensors_file({"x": tensor("U9", [2], 0, 2)}, b"ab"),
        "InvalidHeaderDeserialization",
    ),
    (
        "negative dim",
        safetensors_file({"x": tensor("U8", [-2], 0, 2)}, b"ab"),
        "InvalidHeaderDeserialization",
    ),
    (
        "float offset",
        safetensors_file({"x": tensor("U8", [2], 0, 2.0)}, b"ab"),
        "InvalidHeaderDeserialization",
    ),
    (
        "metadata value not a string",
        safetensors_file({"__metadata__": {"a": 1}}),
        "InvalidHeaderDeserialization",
    ),
    (
        "missing field",
        safetensors_file({"x": {"dtype": "U8", "shape": [2]}}, b"ab"),
        "InvalidHeaderDeserialization",
    ),
    (
        "trailing comma",
        safetensors_file(json.dumps(X)[:-1] + ",}", b"ab"),
        "InvalidHeaderDeserialization",
    ),
    (
        "duplicate tensor name",
        safetensors_file('{"x":' + json.dumps(X["x"]) + ',"x":' + json.dumps(X["x"]) + "}", b"ab"),
        "DuplicateKey",
    ),
    (
        "duplicate metadata key",
        safetensors_file('{"__metadata__":{"a":"b","a":"c"}}'),
        "DuplicateKey",
    ),
    (
        "first tensor not at 0",
        safetensors_file({"x": tensor("U8", [2], 1, 3)}, b"abc"),
        "InvalidOffset",
    ),
    (
        "overlap",
        safetensors_file({"a": tensor("U8", [2], 0, 2), "b": tensor("U8", [2], 1, 3)}, b"abc"),
        "InvalidOffset",
    ),
    (
        "hole",
        safetensors_file({"a": tensor("U8", [2], 0, 2), "b": tensor("U8", [2], 3, 5)}, b"abcde"),
        "InvalidOffset",
    ),
    (
        "overflow",
        safetensors_file({"x": tensor("F64", [2**32, 2**32], 0, 8)}, b"a" * 8),
        "ValidationOverflow",
    ),
    (
        "size does not match shape",
        safetensors_file({"x": tensor("F32", [2], 0, 4)}, b"abcd"),
        "TensorInvalidInfo",
    ),
    ("truncated", safetensors_file(X, b"a"), "MetadataIncompleteBuffer"),
    ("trailing bytes", safetensors_file(X, b"abc"), "MetadataIncompleteBuffer"),
]


@pytest.mark.parametrize(
    ("bytes_", "rule"), [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED]
)
def test_malformed_files_are_rejected_naming_the_rule(tmp_path, bytes_, rule):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(bytes_)
    for read in (ll.load_safetensors, read_safetensors_header):
        with pytest.raises(ll.FormatError) as info:
            read(path)
        assert f"'{path}': {rule}: " in str(info.value)
        assert isinstance(info.value, ValueError)
    if rule != "DuplicateKey":  # the reference keeps the last duplicate instead
        with pytest.raises(Exception, match=r"(?i)header|incomplete|offset|overflow|info"):
            safetensors.numpy.load_file(path)


WELL_FORMED = [
    ("only braces", safetensors_file("{}")),
    ("padded", safetensors_file("{}      ")),
    ("whitespace around", safetensors_file(" \n\t" + json.dumps(X) + " \r\n", b"ab")),
    ("null metadata", safetensors_file({"__metadata__": None, **X}, b"ab")),
    (
        "unknown fields",
        safetensors_file({"x": {**X["x"], "extra": [1, {"a": None}, -2.5e3, True]}}, b"ab"),
    ),
    ("rank 0", safetensors_file({"s": tensor("F64", [], 0, 8)}, b"\x00" * 8)),
    (
        "zero-sized",
        safetensors_file({"z": tensor("F32", [0, 3], 0, 0), "x": tensor("U8", [1], 0, 1)}, b"a"),
    ),
    (
        "escaped name",
        safetensors_file('{"\\u0078\\ud83d\\ude00":' + json.dumps(X["x"]) + "}", b"ab"),
    ),
    (
        "out of order members",
        safetensors_file({"b": tensor("U8", [1], 1, 2), "a": tensor("U8", [1], 0, 1)}, b"ab"),
    ),
]


@pytest.mark.parametrize("bytes_", [c[1] for c in WELL_FORMED], ids=[c[0] for c in WELL_FORMED])
def test_well_formed_variants_load_like_the_reference(tmp_path, bytes_):
    path = tmp_path / "ok.safetensors"
    path.write_bytes(bytes_)
    reference = safetensors.numpy.load_file(path)
    ours = ll.load_safetensors(path, output="numpy")
    assert ours.keys() == reference.keys()
    for name, array in reference.items():
        assert ours[name].dtype == array.dtype
        assert ours[name].shape == array.shape
        assert ours[name].tobytes() == array.tobytes()


DIMENSIONS_SCRIPT = """
import json, struct, sys
import leanloader as ll

path, dims, output = sys.argv[1], int(sys.argv[2]), sys.argv[3]
header = json.dumps({"x": {"dtype": "U8", "shape": [1] * dims, "data_offsets": [0, 1]}}).encode()
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(header)) + header + b"\\x07")
try:
    tensor = ll.load_safetensors(path, output=output)["x"]
    print("loaded", type(tensor).__module__, tensor.ndim)
except ValueError as error:
    print("refused", error)
"""


@pytest.mark.parametrize(
    "dims,output,expected",
    [
        (64, "numpy", "loaded numpy 64"),
        (65, "numpy", "refused"),
        (128, "torch", "loaded torch 128"),
        (129, "torch", "refused"),
        (129, "numpy", "refused"),
    ],
)
def test_tensors_with_more_dimensions_than_python_holds_are_refused_with_the_file(
    tmp_path, dims, output, expected
):
    """NumPy holds at most 64 dimensions (more came back as a 0-d object
    array) and nanobind hands at most 128 to Python (more ended the process);
    the reference reads such files, so they are refused by name, not parsed
    away."""
    import subprocess
    import sys

    path = tmp_path / f"d{dims}.safetensors"
    done = subprocess.run([sys.executable, "-c", DIMENSIONS_SCRIPT, str(path), str(dims), output],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(expected), done.stdout
    if expected == "refused":
        assert f"'{path}' tensor 'x': {dims} dimensions" in done.stdout
