"""Every dtype of the reference safetensors 0.8, both ways: files written by
the reference read equal through ll.load_safetensors, files written by
ll.save_safetensors read equal in the reference; the sub-byte rule and its
error; sub-byte tensors through a TensorCache and a Loader."""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import numpy as np
import pytest
import safetensors
import safetensors.numpy
import safetensors.torch
import torch

import leanloader as ll
from leanloader import _core

# safetensors name -> torch dtype, as safetensors.torch maps them (F4 is
# float4_e2m1fn_x2: two values per element, the header's last dimension is
# twice the tensor's).
TORCH_DTYPES = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "U16": torch.uint16,
    "I16": torch.int16,
    "U32": torch.uint32,
    "I32": torch.int32,
    "U64": torch.uint64,
    "I64": torch.int64,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F32": torch.float32,
    "F64": torch.float64,
    "C64": torch.complex64,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "F8_E4M3FNUZ": torch.float8_e4m3fnuz,
    "F8_E5M2FNUZ": torch.float8_e5m2fnuz,
    "F8_E8M0": torch.float8_e8m0fnu,
    "F4": torch.float4_e2m1fn_x2,
}
NUMPY_DTYPES = {
    "BOOL": np.bool_,
    "U8": np.uint8,
    "I8": np.int8,
    "U16": np.uint16,
    "I16": np.int16,
    "U32": np.uint32,
    "I32": np.int32,
    "U64": np.uint64,
    "I64": np.int64,
    "F16": np.float16,
    "F32": np.float32,
    "F64": np.float64,
    "C64": np.complex64,
}
# Every dtype the reference reads (its Dtype enum); F6 has no torch or NumPy type.
REFERENCE_DTYPES = sorted([*TORCH_DTYPES, "F6_E2M3", "F6_E3M2"])


def torch_tensor(name, shape, seed):
    """Deterministic bytes viewed as `name`'s torch dtype (any bit pattern)."""
    dtype = TORCH_DTYPES[name]
    itemsize = torch.empty(0, dtype=dtype).element_size()
    count = int(np.prod(shape)) * itemsize
    raw = torch.tensor([(seed * 31 + i * 7) % 256 for i in range(count)], dtype=torch.uint8)
    if dtype == torch.bool:
        raw = raw % 2
    return raw.view(dtype).reshape(shape)


def raw_bytes(tensor):
    if isinstance(tensor, ll.PackedTensor):
        return np.asarray(tensor.data).tobytes()
    return tensor.contiguous().view(torch.uint8).numpy().tobytes()


def test_the_dtype_set_is_the_references():
    assert sorted(_core.dtype_names()) == REFERENCE_DTYPES


def test_files_written_by_the_reference_torch_writer_read_equal(tmp_path):
    tensors = {name: torch_tensor(name, (3, 4), seed) for seed, name in enumerate(TORCH_DTYPES)}
    tensors["scalar_f8"] = torch_tensor("F8_E8M0", (), 9)
    tensors["empty_f4"] = torch_tensor("F4", (0, 2), 0)
    path = tmp_path / "ref.safetensors"
    safetensors.torch.save_file(tensors, path)
    ours = ll.load_safetensors(path, output="torch")
    reference = safetensors.torch.load_file(path)
    assert ours.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert ours[name].dtype == tensor.dtype == reference[name].dtype, name
        assert ours[name].shape == tensor.shape == reference[name].shape, name
        assert raw_bytes(ours[name]) == raw_bytes(tensor), name
    header = ll.safetensors.read_safetensors_header(path)["tensors"]
    assert header["F4"]["dtype"] == "F4" and header["F4"]["shape"] == (3, 8)


def test_files_written_by_the_reference_numpy_writer_read_equal(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {
        name: rng.integers(0, 256, size=(2, 5, np.dtype(t).itemsize), dtype=np.uint8)
        .view(t)
        .reshape(2, 5)
        for name, t in NUMPY_DTYPES.items()
        if name != "BOOL"
    }
    arrays["BOOL"] = rng.integers(0, 2, size=(2, 5)).astype(np.bool_)
    path = tmp_path / "ref.safetensors"
    safetensors.numpy.save_file(arrays, path)
    ours = ll.load_safetensors(path, output="numpy")
    for name, array in arrays.items():
        assert ours[name].dtype == array.dtype, name
        assert ours[name].tobytes() == array.tobytes(), name


def test_every_dtype_written_by_us_reads_equal_in_the_reference(tmp_path):
    tensors = {name: torch_tensor(name, (2, 4), seed) for seed, name in enumerate(TORCH_DTYPES)}
    # No framework type: PackedTensor (F6; F4 whose last dimension is odd).
    tensors["F6_E2M3"] = ll.PackedTensor("F6_E2M3", (2, 4), np.arange(6, dtype=np.uint8))
    tensors["F6_E3M2"] = ll.PackedTensor("F6_E3M2", (4,), torch.arange(3, dtype=torch.uint8) + 9)
    tensors["F4_odd"] = ll.PackedTensor("F4", (2, 3), np.array([1, 2, 3], dtype=np.uint8))
    path = tmp_path / "ours.safetensors"
    ll.save_safetensors(path, tensors)

    data = path.read_bytes()
    reference = dict(safetensors.deserialize(data))
    assert reference.keys() == tensors.keys()
    for name, tensor in tensors.items():
        expected_dtype = tensor.dtype if isinstance(tensor, ll.PackedTensor) else name
        shape = list(tensor.shape)
        if name == "F4":
            shape[-1] *= 2
        assert reference[name]["dtype"] == expected_dtype, name
        assert list(reference[name]["shape"]) == shape, name
        assert bytes(reference[name]["data"]) == raw_bytes(tensor), name
    # The reference's torch reader maps every dtype torch has, F4 included.
    with safetensors.safe_open(path, "pt") as f:
        for name in TORCH_DTYPES:
            got = f.get_tensor(name)
            assert got.dtype == tensors[name].dtype and got.shape == tensors[name].shape, name
            assert raw_bytes(got) == raw_bytes(tensors[name]), name
    # And they read back equal here, PackedTensors included.
    back = ll.load_safetensors(path)
    for name, tensor in tensors.items():
        assert raw_bytes(back[name]) == raw_bytes(tensor), name
        if isinstance(tensor, ll.PackedTensor):
            assert back[name] == tensor


def test_our_bytes_equal_the_reference_writers_for_every_torch_dtype(tmp_path):
    tensors = {name: torch_tensor(name, (3, 2), seed) for seed, name in enumerate(TORCH_DTYPES)}
    safetensors.torch.save_file(tensors, tmp_path / "ref.safetensors")
    ll.save_safetensors(tmp_path / "ours.safetensors", tensors)
    assert (tmp_path / "ours.safetensors").read_bytes() == (
        tmp_path / "ref.safetensors"
    ).read_bytes()


def file_with(dtype, shape, nbytes):
    header = json.dumps({"t": {"dtype": dtype, "shape": shape, "data_offsets": [0, nbytes]}})
    return struct.pack("<Q", len(header)) + header.encode() + bytes(nbytes)


@pytest.mark.parametrize(
    ("dtype", "shape", "nbytes"),
    [
        ("F4", [3, 7], 11),
        ("F4", [], 1),
        ("F4", [1, 1], 1),
        ("F6_E2M3", [3], 3),
        ("F6_E3M2", [5, 2], 8),
    ],
)
def test_a_sub_byte_tensor_that_does_not_pack_is_rejected_with_the_references_error(
    tmp_path, dtype, shape, nbytes
):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(file_with(dtype, shape, nbytes))
    with pytest.raises(safetensors.SafetensorError) as reference:
        safetensors.deserialize(path.read_bytes())
    words = str(reference.value).split(": ", 1)[1]
    assert "byte boundary" in words
    for reader in (ll.load_safetensors, ll.safetensors.read_safetensors_header):
        with pytest.raises(ll.FormatError) as ours:
            reader(path)
        assert words in str(ours.value)
        assert str(path) in str(ours.value) and "MisalignedSlice" in str(ours.value)


@pytest.mark.parametrize(("dtype", "shape", "nbytes"), [("F4", [2, 3], 3), ("F6_E3M2", [4, 1], 3)])
def test_sub_byte_tensors_pack_on_their_total_bits_as_in_the_reference(
    tmp_path, dtype, shape, nbytes
):
    path = tmp_path / "ok.safetensors"
    path.write_bytes(file_with(dtype, shape, nbytes))
    assert dict(safetensors.deserialize(path.read_bytes()))["t"]["shape"] == shape
    tensor = ll.load_safetensors(path)["t"]
    assert isinstance(tensor, ll.PackedTensor)
    assert (tensor.dtype, list(tensor.shape), tensor.nbytes) == (dtype, shape, nbytes)


def test_a_float4_cache_builds_verifies_and_loads(tmp_path):
    cache = ll.TensorCache(tmp_path / "c", output="torch")
    items = [{"key": f"k{i}", "i": i} for i in range(10)]

    def encode(batch):
        ids = torch.tensor(batch["i"], dtype=torch.uint8)
        packed = (ids.reshape(-1, 1) * 16 + torch.arange(4, dtype=torch.uint8)).contiguous()
        return {"w": packed.view(torch.float4_e2m1fn_x2), "id": ids.to(torch.int64)}

    cache.build(items, encode=encode, batch_size=4, progress=False)
    assert [(n, d, list(s)) for n, d, s in cache.fields] == [("w", "F4", [8]), ("id", "I64", [])]
    assert cache.verify() == []
    # `leanloader cache verify` used to reject such a cache as "unknown dtype".
    verified = subprocess.run(
        [sys.executable, "-m", "leanloader.cli", "cache", "verify", str(tmp_path / "c")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "10 entries, OK" in verified.stdout

    assert cache["k3"]["w"].dtype == torch.float4_e2m1fn_x2
    assert cache["k3"]["w"].view(torch.uint8).tolist() == [48, 49, 50, 51]
    loader = ll.Loader(cache, batch_size=3, shuffle=True, output="torch")
    seen = []
    for batch in loader:
        assert batch["w"].dtype == torch.float4_e2m1fn_x2 and batch["w"].shape[1:] == (4,)
        for row, i in zip(batch["w"].view(torch.uint8).tolist(), batch["id"].tolist(), strict=True):
            assert row == [i * 16 + j for j in range(4)]
            seen.append(i)
    assert sorted(seen) == list(range(10))


def test_packed_arrays_are_refused_where_rows_need_element_strides():
    f4 = torch.zeros(4, 2, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    with pytest.raises(ValueError, match="packed sub-byte"):
        ll.ArraySource({"w": f4})
    with pytest.raises(ValueError, match="byte boundary"):
        ll.PackedTensor("F4", (3,), np.zeros(2, dtype=np.uint8))
