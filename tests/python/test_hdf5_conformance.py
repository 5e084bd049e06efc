"""HDF5Source against h5py (+ hdf5plugin) on files other tools wrote.

Every dataset is read whole by both readers: leanloader's rows must equal
h5py's byte for byte, or leanloader must refuse the dataset at open and name
the type it does not serve. The files come from h5py, PyTables, netCDF4 and
hdf5plugin, each written in its own process (tests/python/hdf5_corpus.py).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import hdf5plugin
import numpy as np
import pytest

import leanloader as ll

CORPUS = Path(__file__).with_name("hdf5_corpus.py")

# Datasets whose element type cannot become a tensor: refused at open.
REFUSED = {
    "strings": "string elements",
    "compound": "compound elements",
    "table": "compound elements",
    "complex256": "complex elements of two 128-bit floats",
    "array_of_arrays": "arrays of arrays",
}

# The fast path each of these must take (not fall back to the library).
FAST = {
    "h5py userblock 512 chunked": "chunks",
    "h5py userblock 512 gzip": "chunks",
    "h5py userblock 4096 edges": "chunks",
    "h5py userblock 512 contiguous": "pread",
    "h5py external link contiguous": "pread (data in",
    "h5py external link gzip": "chunks (data in",
    "h5py low-level unfiltered_edges": "chunks",
    "h5py lzf": "chunks",
    "h5py lzf_shuffle": "chunks",
    "h5py libver=latest gzip": "chunks",
    "h5py SWMR": "chunks",
    "MATLAB v7.3 style X": "chunks",
    "hdf5plugin blosc_lz4_shuffle": "chunks",
    "hdf5plugin blosc_zstd_bitshuffle int16": "chunks",
    "PyTables carray_blosc": "chunks",
    "PyTables carray_blosc_lz4": "chunks",
    "PyTables complex64": "chunks",
    "h5py complex64": "pread",
    "h5py complex64_gzip_shuffle": "chunks",
    "h5py complex128": "pread",
    "PyTables atom_shape_carray": "chunks",
    "PyTables atom_shape_earray": "chunks",
    "PyTables atom_shape_complex": "chunks",
    "PyTables atom_shape_bool": "chunks",
    "PyTables atom_shape_array": "pread",
    "h5py low-level array_compact": "memory",
}


def _write(tool: str, directory: Path) -> list[dict]:
    result = subprocess.run(
        [sys.executable, str(CORPUS), tool, str(directory)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _h5py_read(path: str, dataset: str) -> np.ndarray:
    with h5py.File(path, "r") as f:
        return f[dataset][()]


def _read_all(source) -> np.ndarray | None:
    rows = [
        batch["x"].copy()
        for batch in ll.Loader(source, batch_size=5, shuffle=False, output="numpy", num_threads=2)
    ]
    return np.concatenate(rows) if rows else None


def _native(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array.astype(array.dtype.newbyteorder("=")))


@pytest.mark.parametrize("tool", ["h5py", "hdf5plugin", "pytables", "netcdf4"])
def test_every_dataset_reads_as_h5py_reads_it(tmp_path, tool):
    entries = _write(tool, tmp_path)
    assert len(entries) >= 6
    for entry in entries:
        what, path, name = entry["what"], entry["file"], entry["dataset"]
        expected = _h5py_read(path, name)
        if name in REFUSED:
            with pytest.raises(ValueError, match=REFUSED[name]) as refusal:
                ll.HDF5Source({"x": (path, name)})
            assert f"'{path}' dataset '{name}'" in str(refusal.value)
            continue
        source = ll.HDF5Source({"x": (path, name)})
        layout = source.layout(0)[0]
        if what in FAST:
            assert layout.startswith(FAST[what]), (what, layout)
        assert len(source) == expected.shape[0], what
        got = _read_all(source)
        if expected.shape[0] == 0:
            assert got is None, what
            continue
        expected = _native(expected)
        assert got.shape == expected.shape, (what, got.shape, expected.shape)
        assert got.dtype.itemsize == expected.dtype.itemsize, (what, got.dtype, expected.dtype)
        if expected.dtype.kind in "biufc":
            assert got.dtype == expected.dtype, (what, got.dtype, expected.dtype)
        assert got.tobytes() == expected.tobytes(), (what, layout)


def test_the_hdf5_library_is_h5pys(tmp_path):
    library = ll.hdf5_library()
    assert library["version"] == h5py.version.hdf5_version_tuple[:3]
    assert library["shared_with_object"], library
    assert "h5py" in library["chosen_because"]
    # A file only the newest HDF5 reads (h5py's own, libver="latest" + a
    # filter) opens, and the blosc filter hdf5plugin registered serves too.
    path = tmp_path / "latest.h5"
    data = np.arange(60, dtype=np.float32).reshape(6, 10)
    with h5py.File(path, "w", libver="latest") as f:
        f.create_dataset("x", data=data, chunks=(2, 10), compression="gzip")
        f.create_dataset("b", data=data, chunks=(2, 10), **hdf5plugin.BZip2())
    for name in ("x", "b"):
        assert np.array_equal(_read_all(ll.HDF5Source({"x": (str(path), name)})), data)


MISSING_FILTER_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.modules["hdf5plugin"] = None  # as if it were not installed
    import numpy as np
    import leanloader as ll
    path = sys.argv[1]
    try:
        ll.HDF5Source({"x": (path, "bzip2")})
        print("opened")
    except ll.FormatError as e:
        print("refused:", e)
    source = ll.HDF5Source({"x": (path, "blosc")})  # leanloader decodes Blosc itself
    rows = [b["x"].copy() for b in ll.Loader(source, batch_size=4, shuffle=False, output="numpy")]
    assert np.array_equal(np.concatenate(rows), np.arange(80, dtype=np.int32).reshape(8, 10))
    print("blosc", source.layout(0)[0])
    """
)


def test_a_missing_filter_is_named_at_open_with_the_fix(tmp_path):
    path = tmp_path / "plugins.h5"
    data = np.arange(80, dtype=np.int32).reshape(8, 10)
    with h5py.File(path, "w") as f:
        f.create_dataset("bzip2", data=data, chunks=(4, 10), **hdf5plugin.BZip2())
        f.create_dataset("blosc", data=data, chunks=(4, 10), **hdf5plugin.Blosc())
    result = subprocess.run(
        [sys.executable, "-c", MISSING_FILTER_SCRIPT, str(path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    refused = result.stdout.splitlines()[0]
    for needle in (f"'{path}' dataset 'bzip2'", "filter 'bzip2' (id 307)", "HDF5_PLUGIN_PATH",
                   "pip install hdf5plugin"):  # fmt: skip
        assert needle in refused, refused
    assert result.stdout.splitlines()[1] == "blosc chunks"
    assert "HDF5-DIAG" not in result.stderr, result.stderr


def _chunk_btree_entry(raw: bytes, entry: int, ndims: int) -> int:
    """The file offset of entry `entry` of a dataset's version-1 chunk B-tree."""
    at = 0
    while True:
        at = raw.find(b"TREE", at + 1)
        assert at >= 0, "no chunk B-tree"
        if raw[at + 4] == 1:  # node type 1: raw data chunks
            return at + 24 + entry * (8 + 8 * (ndims + 1) + 8)


def _damaged_files(directory: Path) -> dict[str, Path]:
    data = np.arange(40 * 16, dtype=np.float32).reshape(40, 16) + 1
    made = {}
    for compression in (None, "gzip"):
        path = directory / f"v1_{compression}.h5"
        with h5py.File(path, "w", libver="earliest") as f:
            f.create_dataset("x", data=data, chunks=(4, 16), compression=compression)
        raw = path.read_bytes()
        entry = _chunk_btree_entry(raw, 2, 2)
        for damage, (offset, value) in {
            "index_coordinate": (8, 9),  # the key of chunk 2 points between chunks
            "index_address": (8 + 24, 2**50),  # chunk 2's address past the file
            "index_size": (0, 2**28),  # chunk 2's stored size
        }.items():
            broken = bytearray(raw)
            struct.pack_into(
                "<I" if damage == "index_size" else "<Q", broken, entry + offset, value
            )
            made[f"{damage}_{compression}"] = directory / f"{damage}_{compression}.h5"
            made[f"{damage}_{compression}"].write_bytes(bytes(broken))
    latest = directory / "latest.h5"
    with h5py.File(latest, "w", libver="latest") as f:
        f.create_dataset("x", data=data, chunks=(4, 16), compression="gzip")
    raw = bytearray(latest.read_bytes())
    at = raw.find(b"FADB")
    raw[at + 20 : at + 28] = bytes(8)  # checksummed fixed-array data block
    made["index_checksum_latest"] = directory / "index_checksum_latest.h5"
    made["index_checksum_latest"].write_bytes(bytes(raw))
    garbage = directory / "garbage_chunk.h5"
    shutil.copy(directory / "v1_gzip.h5", garbage)
    with h5py.File(garbage, "r") as f:
        info = f["x"].id.get_chunk_info_by_coord((12, 0))
    with open(garbage, "r+b") as f:
        f.seek(info.byte_offset + info.size // 3)
        f.write(bytes([0x13, 0x77, 0x00, 0xFF, 0x42, 0x01, 0x99, 0x55]))
    made["garbage_chunk"] = garbage
    truncated = directory / "truncated.h5"
    shutil.copy(directory / "v1_None.h5", truncated)
    os.truncate(truncated, truncated.stat().st_size - 700)
    made["truncated"] = truncated
    return made


def test_damaged_files_are_refused_never_filled(tmp_path):
    data = np.arange(40 * 16, dtype=np.float32).reshape(40, 16) + 1
    for damage, path in _damaged_files(tmp_path).items():
        try:
            _h5py_read(str(path), "x")
            h5py_refuses = False
        except Exception:
            h5py_refuses = True
        assert h5py_refuses, damage
        with pytest.raises((ll.Error, ll.FormatError)) as refusal:
            _read_all(ll.HDF5Source({"x": (str(path), "x")}))
        message = str(refusal.value)
        assert str(path) in message and "dataset 'x'" in message, (damage, message)
        # Rows the damage does not touch still read.
        if damage == "garbage_chunk":
            source = ll.HDF5Source({"x": (str(path), "x", np.arange(12))})
            assert np.array_equal(_read_all(source), data[:12])


MANY_FILES_SCRIPT = textwrap.dedent(
    """
    import os, resource, sys
    import numpy as np, h5py
    import leanloader as ll
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    directory, count = sys.argv[1], int(sys.argv[2])
    for i in range(count):
        with h5py.File(f"{directory}/shard{i:05d}.h5", "w") as f:
            f.create_dataset("x", data=np.full((2, 3), i, dtype=np.int32),
                             chunks=(1, 3) if i % 2 else None)
    source = ll.HDF5Source({"x": (f"{directory}/shard*.h5", "x")})
    seen = np.zeros(count, dtype=np.int64)
    for batch in ll.Loader(source, batch_size=64, shuffle=True, seed=1, output="numpy"):
        x = batch["x"]
        assert (x == x[:, :1]).all()
        np.add.at(seen, x[:, 0], 1)
    assert (seen == 2).all(), np.nonzero(seen != 2)
    print(source.open_file_budget, source.open_file_count, len(os.listdir("/proc/self/fd")))
    """
)


def test_ten_thousand_files_under_a_1024_descriptor_limit(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", MANY_FILES_SCRIPT, str(tmp_path), "10000"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    budget, held, descriptors = map(int, result.stdout.split())
    assert budget == 256 and held <= budget and descriptors < 1024


def test_too_many_open_files_is_said_as_such(tmp_path):
    script = textwrap.dedent(
        """
        import resource, sys
        import numpy as np, h5py
        import leanloader as ll
        path = sys.argv[1]
        with h5py.File(path, "w") as f:
            f.create_dataset("x", data=np.zeros((2, 2)))
        ll.hdf5_library()  # h5py and hdf5plugin imported while descriptors remain
        held = []
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
        try:
            while True:
                held.append(open(path, "rb"))
        except OSError:
            pass
        try:
            ll.HDF5Source({"x": (path, "x")})
        except OSError as e:
            print(e)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "a.h5")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "too many open files" in result.stdout and "ulimit -n is 64" in result.stdout, (
        result.stdout + result.stderr
    )


SHARED_LIBRARY_SCRIPT = textwrap.dedent(
    """
    import sys, threading
    import numpy as np, h5py, hdf5plugin
    import leanloader as ll
    path = sys.argv[1]
    data = np.arange(64 * 300, dtype=np.float32).reshape(64, 300)
    with h5py.File(path, "w") as f:
        f.create_dataset("fletcher", data=data, chunks=(1, 300), fletcher32=True)
        f.create_dataset("bzip2", data=data, chunks=(2, 300), **hdf5plugin.BZip2())
        f.create_dataset("plain", data=data, chunks=(8, 300), compression="gzip")
    stop = threading.Event()
    failures = []

    def h5py_reader():
        while not stop.is_set():
            with h5py.File(path, "r") as f:
                if not np.array_equal(f["plain"][3:9], data[3:9]):
                    failures.append("h5py read wrong rows")

    def opener():
        # Sources opened and dropped while holding the GIL, as the loader's
        # threads call into HDF5 through h5py's lock.
        while not stop.is_set():
            other = ll.HDF5Source({"p": (path, "plain")})
            del other

    threads = [threading.Thread(target=h5py_reader), threading.Thread(target=opener)]
    for thread in threads:
        thread.start()
    try:
        source = ll.HDF5Source({"x": (path, "fletcher"), "y": (path, "bzip2")})
        assert all(e.startswith("library") for e in source.layout(0) + source.layout(1))
        for _ in range(5):
            loader = ll.Loader(source, batch_size=8, shuffle=True, seed=3, output="numpy",
                               num_threads=2)
            for batch in loader:
                assert np.array_equal(batch["x"], batch["y"])
                assert (batch["x"][:, 1:] - batch["x"][:, :-1] == 1).all()
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert not failures
    print("ok")
    """
)


def test_h5py_in_other_threads_while_the_loader_reads_through_the_library(tmp_path):
    # h5py's HDF5 is not thread-safe: leanloader's calls into it take h5py's
    # own lock (without it, the library's state is corrupted or the process
    # crashes); and that lock alone, so no thread holding the GIL waits on a
    # lock of ours (a deadlock: the deadline catches it).
    result = subprocess.run(
        [sys.executable, "-c", SHARED_LIBRARY_SCRIPT, str(tmp_path / "shared.h5")],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]
