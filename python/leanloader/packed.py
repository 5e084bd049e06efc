"""Tensors of packed sub-byte dtypes that neither torch nor NumPy can hold.

safetensors 0.8 has three dtypes narrower than a byte: ``F4`` (float4 e2m1),
``F6_E2M3`` and ``F6_E3M2``. torch has ``float4_e2m1fn_x2`` (two F4 values per
byte) and no float6; NumPy has neither. Where a framework has no type for a
tensor, leanloader hands out a ``PackedTensor``: the packed bytes, viewed
without a copy, with the safetensors dtype and the logical shape named.
``save_safetensors`` and ``TensorCache.build`` accept one back.
"""

from __future__ import annotations

import math
from typing import Any

# Bits per element of the packed dtypes (the reference's Dtype::bitsize).
SUBBYTE_BITS = {"F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}


class PackedTensor:
    """``dtype`` (``"F4"``, ``"F6_E2M3"``, ``"F6_E3M2"``), ``shape`` (elements,
    as in the safetensors header) and ``data``: a 1-D uint8 array (torch or
    NumPy) of ``nbytes = prod(shape) * bits / 8`` bytes, which must be whole
    (safetensors' rule for sub-byte tensors)."""

    __slots__ = ("data", "dtype", "shape")

    def __init__(self, dtype: str, shape: tuple[int, ...], data: Any) -> None:
        if dtype not in SUBBYTE_BITS:
            raise ValueError(f"PackedTensor holds {sorted(SUBBYTE_BITS)}, got {dtype!r}")
        shape = tuple(int(d) for d in shape)
        bits = math.prod(shape) * SUBBYTE_BITS[dtype]
        if bits % 8:
            raise ValueError(
                f"{dtype} {list(shape)}: {bits} bits do not end on a byte boundary "
                "(safetensors needs whole bytes)"
            )
        if len(data.shape) != 1 or int(data.shape[0]) != bits // 8:
            raise ValueError(f"{dtype} {list(shape)} needs {bits // 8} bytes of data")
        self.dtype = dtype
        self.shape = shape
        self.data = data

    @property
    def nbytes(self) -> int:
        return int(self.data.shape[0])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PackedTensor):
            return NotImplemented
        return (
            self.dtype == other.dtype
            and self.shape == other.shape
            and bytes(memoryview(_as_numpy(self.data))) == bytes(memoryview(_as_numpy(other.data)))
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PackedTensor(dtype={self.dtype!r}, shape={self.shape}, nbytes={self.nbytes})"


def _as_numpy(data: Any) -> Any:
    import numpy as np

    if hasattr(data, "numpy"):
        return data.detach().cpu().numpy()
    return np.asarray(data)
