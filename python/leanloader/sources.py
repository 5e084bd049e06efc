"""Sources: where samples come from. Thin constructors over the C++ sources."""

from __future__ import annotations

import glob as _glob
import os
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from leanloader import _core

Source = _core.Source


def ArraySource(arrays: Mapping[str, Any]) -> _core.ArraySource:
    """Samples are rows of in-memory arrays: row ``i`` of every array is sample ``i``.

    The arrays (NumPy arrays or CPU tensors) are viewed, never copied; they
    stay alive as long as the source does.
    """
    if not isinstance(arrays, Mapping) or not arrays:
        raise ValueError("ArraySource takes a non-empty dict of name -> array")
    for name, array in arrays.items():
        if not any(hasattr(array, hook) for hook in ("__dlpack__", "__array_interface__")):
            raise TypeError(
                f"ArraySource field {name!r}: a {type(array).__name__} is not an array; pass a "
                "NumPy array or CPU tensor (np.asarray(value)): arrays are viewed, never copied"
            )
        dtype = getattr(array, "dtype", None)
        if getattr(dtype, "byteorder", "=") == (">" if sys.byteorder == "little" else "<"):
            raise ValueError(
                f"ArraySource field {name!r}: {dtype.str!r} is in the other byte order than this "
                "machine's and is viewed, never converted; pass "
                f"array.astype(array.dtype.newbyteorder('='))"
            )
        kind, size = getattr(dtype, "kind", None), getattr(dtype, "itemsize", 0)
        if (
            kind in ("m", "M", "O", "S", "U")
            or (kind == "V" and getattr(dtype, "names", None) is not None)  # records
            or (kind == "f" and size > 8)  # long double
            or (kind == "c" and size > 16)
        ):  # a NumPy dtype no tensor has (torch dtypes have no kind; ml_dtypes' bfloat16
            # and float8 are kind "V" without fields, for DLPack to tell)
            raise ValueError(
                f"ArraySource field {name!r}: dtype {dtype} cannot become a tensor (bool, "
                "integers, floats and complex64/128 can)"
            )
    return _core.ArraySource(list(arrays.items()))


def NpySource(
    path: str | os.PathLike | Mapping[str, str | os.PathLike], name: str | None = None
) -> _core.NpySource:
    """Samples from ``.npy`` files.

    - ``NpySource("x.npy")``: one memory-mapped array; rows are samples; the
      field is named after the file's stem (or ``name``).
    - ``NpySource({"x": "x.npy", "y": "y.npy"})``: one field per file, same row count.
    - ``NpySource("dir/")``: one ``.npy`` per sample (sorted by name; hidden
      files, whose names start with ``.``, are skipped as ``glob`` skips
      them), one field named after the directory (or ``name``).
    """
    if isinstance(path, Mapping):
        if name is not None:
            raise ValueError("name= applies to a single path, not a dict of fields")
        return _core.NpySource.from_arrays([(k, _npy_path(v, k)) for k, v in path.items()])
    path = _npy_path(path)
    if os.path.isdir(path):
        field = name or os.path.basename(os.path.normpath(path)) or "data"
        return _core.NpySource.from_directory(field, path)
    field = name or os.path.splitext(os.path.basename(path))[0]
    return _core.NpySource.from_arrays([(field, path)])


def _npy_path(path: Any, field: str | None = None) -> str:
    """A path NpySource can open, as a str (bytes paths decoded as os.fsdecode does)."""
    where = f" for field {field!r}" if field is not None else ""
    if hasattr(path, "__array__") or hasattr(path, "__dlpack__"):
        raise TypeError(
            f"NpySource takes paths of .npy files{where}, got an array "
            f"({type(path).__name__}); for arrays in memory use ll.ArraySource"
        )
    try:
        return os.fsdecode(os.fspath(path))
    except TypeError:
        raise TypeError(
            f"NpySource takes a path to a .npy file or a directory{where}, "
            f"got {type(path).__name__}"
        ) from None


def FileSource(paths: str | os.PathLike | Iterable[str | os.PathLike]) -> _core.FileSource:
    """Each sample is the raw bytes of one file, in field ``data`` (uint8, varying length).

    ``paths`` is a glob pattern (``**`` recurses; matches are sorted) or a
    sequence of paths in sample order. Batch it with ``collate="list"``.
    """
    if isinstance(paths, (str, os.PathLike)):
        pattern = os.fspath(paths)
        matches = sorted(p for p in _glob.glob(pattern, recursive=True) if os.path.isfile(p))
        if not matches:
            raise FileNotFoundError(f"no files match {pattern!r}")
        return _core.FileSource(matches)
    return _core.FileSource([os.fspath(p) for p in paths])


def as_source(source: Any) -> _core.Source:
    """Accepts a Source, or a dict of arrays (made into an ArraySource)."""
    if isinstance(source, _core.Source):
        return source
    if isinstance(source, Mapping):
        return ArraySource(source)
    raise TypeError(
        f"expected a leanloader Source or a dict of arrays, got {type(source).__name__}"
    )
