"""HDF5Source: rows of HDF5 datasets, read by native threads past HDF5's global lock."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from leanloader import _core


def _index_array(name: str, index: Any) -> np.ndarray:
    array = np.asarray(index)
    if array.ndim != 1 or array.dtype.kind not in "iu":
        raise TypeError(
            f"HDF5Source field {name!r}: the index must be a 1-D integer array, "
            f"got {array.dtype} with shape {array.shape}"
        )
    if array.dtype.kind == "u" and array.size and array.max() > np.iinfo(np.int64).max:
        raise ValueError(f"HDF5Source field {name!r}: index values do not fit in int64")
    return np.ascontiguousarray(array, dtype=np.int64)


_library: dict | None = None


def hdf5_library() -> dict:
    """The HDF5 library leanloader reads with, chosen once per process.

    When h5py is importable it is h5py's own library (so files the newest h5py
    writes open, and filters registered with it serve leanloader's reads),
    with ``hdf5plugin``'s filters registered when that is installed, and
    h5py's lock taken around every call into it; otherwise the system's. The
    dict has ``path``, ``version``, ``threadsafe`` and ``chosen_because``.
    """
    global _library
    if _library is not None:
        return _library
    try:
        import h5py
        import h5py.defs
        from h5py import _objects
    except ImportError:
        _library = dict(_core.hdf5_library_info())
        return _library
    try:
        import hdf5plugin  # noqa: F401  (registers its filters with h5py's HDF5)
    except ImportError:
        pass
    _library = dict(_core.use_hdf5_library_of(h5py.defs.__file__, _objects.phil))
    return _library


def HDF5Source(
    fields: Mapping[str, tuple],
    chunk_cache: int | str = "64MiB",
    max_open_files: int = 0,
) -> _core.HDF5Source:
    """Samples from HDF5 datasets: row ``i`` along the first axis is sample ``i``.

    ``fields`` maps a field name to ``(files, dataset)`` or
    ``(files, dataset, index)``:

    - ``files``: a path or a glob (``"betas_session*.hdf5"``; a file of that
      very name is read alone, as h5py would open it); the matches are
      sorted and their rows concatenated;
    - ``dataset``: the dataset's path inside each file (``"betas"``, ``"/g/x"``);
    - ``index``: an integer array; row ``i`` of the field is then row
      ``index[i]`` of the dataset (a join, e.g. the stimulus of each trial).

    Every field must have the same number of rows. Files are opened once, under
    a lock (HDF5 is not thread-safe), with the HDF5 library h5py uses when it
    is installed (``hdf5_library()``). Rows are then read without the library
    where that was proven equal to it at open (one raw chunk against
    ``H5Dread_chunk``, the first and last row against ``H5Dread``): contiguous
    data with ``pread``, chunks decoded (shuffle, gzip, lz4, zstd, Blosc, LZF)
    in the loader's threads, with ``chunk_cache`` bytes of decoded chunks for
    chunks that span several rows. Other storage and filters (hdf5plugin's,
    ``HDF5_PLUGIN_PATH``) are read with ``H5Dread`` under the lock;
    ``source.layout(field_index)`` says which path each file takes and why. A
    filter no reader can decode is an error at open. Data files are opened on
    demand, at most ``max_open_files`` at once (0: a quarter of ``ulimit -n``,
    within 16..512). A source opened before ``fork`` cannot be read in the
    child: open it there.

    A file written after the source opened it (h5py in ``"r+"`` mode, rows
    appended) is opened again at a ``Loader``'s next pass, which then reads it
    as h5py would (appended rows join it, with a warning); a ``Loader`` made
    with ``follow_updates=False`` stops with a ``FormatError`` instead.

    Example (seed 004)::

        src = ll.HDF5Source({"fmri": ("betas_session*.hdf5", "betas"),
                             "image": ("stimuli.hdf5", "images", trial_to_image)})
    """
    if not isinstance(fields, Mapping) or not fields:
        raise ValueError("HDF5Source takes a non-empty dict of name -> (files, dataset[, index])")
    entries = []
    for name, spec in fields.items():
        if not isinstance(spec, (tuple, list)) or len(spec) not in (2, 3):
            raise TypeError(
                f"HDF5Source field {name!r}: expected (files, dataset) or "
                f"(files, dataset, index), got {spec!r}"
            )
        files, dataset = os.fspath(spec[0]), str(spec[1])
        index = _index_array(name, spec[2]) if len(spec) == 3 and spec[2] is not None else None
        entries.append((str(name), files, dataset, index))
    if isinstance(chunk_cache, bool):
        raise TypeError("chunk_cache must be a byte count or a size string like '64MiB'")
    if isinstance(chunk_cache, int):
        if chunk_cache < 0:
            raise ValueError(f"chunk_cache must be >= 0, got {chunk_cache}")
        cache_bytes = chunk_cache
    else:
        cache_bytes = _core.parse_byte_size(str(chunk_cache))
    if (
        isinstance(max_open_files, bool)
        or not isinstance(max_open_files, int)
        or max_open_files < 0
    ):
        raise ValueError(f"max_open_files must be an int >= 0, got {max_open_files!r}")
    hdf5_library()
    return _core.HDF5Source.open(entries, cache_bytes, max_open_files)
