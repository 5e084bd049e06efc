"""safetensors files, byte-compatible with the reference ``safetensors`` package.

``load_safetensors`` mirrors ``safetensors.torch.load_file`` /
``safetensors.numpy.load_file`` but returns zero-copy views of the memory-mapped
file (pages stay in the shared page cache; writing into a tensor touches a private
copy of that page only). ``save_safetensors`` mirrors ``save_file`` and writes
atomically: a crash leaves the old file or the new one, never a partial one.

Files are validated as strictly as the reference reader, and a name (of a tensor,
``__metadata__`` or a metadata key) given twice, which the reference resolves by
keeping the last, is refused as ambiguous (``DuplicateKey``); a malformed file raises
``leanloader.FormatError`` whose message names the file and the rule, e.g.
``'/x/a.safetensors': MetadataIncompleteBuffer: ...``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from leanloader import _core
from leanloader.packed import PackedTensor

__all__ = ["load_safetensors", "read_safetensors_header", "save_safetensors"]


def _default_output() -> str:
    try:
        import torch  # noqa: F401
    except ImportError:
        return "numpy"
    return "torch"


def load_safetensors(path: str | os.PathLike[str], output: str | None = None) -> dict[str, Any]:
    """Loads every tensor of a safetensors file.

    ``output`` is ``"torch"`` (the default when torch is installed), ``"numpy"``
    or ``"dlpack"``. Returns ``{name: array}`` in file order. The arrays view the
    mapped file without copying; a tensor whose data is not aligned for its dtype
    (some third-party writers skip the padding) is copied to an aligned buffer.
    NumPy has no bfloat16 or float8, so such files need ``output="torch"``.

    Every dtype of the reference safetensors 0.8 reads. As in
    ``safetensors.torch``, ``F8_E8M0`` is ``torch.float8_e8m0fnu`` and ``F4``
    is ``torch.float4_e2m1fn_x2`` (two values per element: the last dimension
    halved). Where the framework has no such type (``F6_E2M3``, ``F6_E3M2``;
    ``F4`` with an odd last dimension or for NumPy) the tensor is a
    ``leanloader.PackedTensor``: its packed bytes (1-D uint8, zero-copy), the
    dtype and the logical shape.
    """
    return _core.load_safetensors(os.fspath(path), output or _default_output())


def _as_cpu_array(name: str, value: Any) -> Any:
    """An object nanobind can read as a CPU array without losing the dtype
    (for a ``PackedTensor``: its dtype name, shape and bytes)."""
    if isinstance(value, PackedTensor):
        return (value.dtype, value.shape, _as_cpu_array(name, value.data))
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        if value.layout != torch.strided:
            raise ValueError(f"tensor {name!r} is {value.layout}; only dense tensors can be saved")
        tensor = value.detach()
        if tensor.device.type != "cpu":
            tensor = tensor.cpu()
        # DLPack refuses tensors with a lazy conjugate or negative bit.
        return tensor.resolve_conj().resolve_neg()
    array = value if isinstance(value, np.ndarray) else np.asarray(value)
    if array.dtype.byteorder not in ("=", "|", "<" if sys.byteorder == "little" else ">"):
        # safetensors is little-endian; DLPack carries native order only.
        array = array.astype(array.dtype.newbyteorder("="))
    if any(stride < 0 for stride in array.strides):
        array = np.ascontiguousarray(array)
    return array


def save_safetensors(
    path: str | os.PathLike[str],
    tensors: Mapping[str, Any],
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Writes ``{name: array}`` to ``path`` in the reference layout, atomically.

    Arrays may be NumPy arrays, torch tensors (any dtype, including bfloat16,
    float8 and ``float4_e2m1fn_x2``, written as ``F4`` with the last dimension
    doubled; CUDA tensors are copied to the host), ``leanloader.PackedTensor``
    (written with its dtype and shape) or anything ``np.asarray`` accepts.
    Non-contiguous arrays are written in row-major order. ``metadata`` maps
    str to str and is stored as ``__metadata__``. Raises ``ValueError`` for a
    tensor named ``__metadata__`` and ``OSError`` when the file cannot be written
    (no temporary file is left behind).
    """
    if metadata is not None:
        for key, value in metadata.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise TypeError(
                    f"metadata must map str to str, got {type(key).__name__} -> "
                    f"{type(value).__name__} for key {key!r}"
                )
            # (a lone surrogate: UnicodeEncodeError, as the reference writer raises)
            key.encode("utf-8"), value.encode("utf-8")
        metadata = dict(metadata)
    arrays = {}
    for name, value in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be str, got {type(name).__name__}")
        name.encode("utf-8")  # (as above)
        arrays[name] = _as_cpu_array(name, value)
    _core.save_safetensors(os.fspath(path), arrays, metadata)


def read_safetensors_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Reads and validates only the header (no mapping of the data).

    Returns ``{"tensors": {name: {"dtype", "shape", "data_offsets"}}`` in file
    order, ``"metadata": dict | None, "data_offset": int}``.
    """
    return _core.safetensors_header(os.fspath(path))
