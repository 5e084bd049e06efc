"""HDF5 files written by tools leanloader did not write, for the conformance tests.

Run as ``python hdf5_corpus.py TOOL DIRECTORY``: writes that tool's files into
DIRECTORY and prints a JSON list of ``{"file", "dataset", "what"}`` entries,
one per dataset to read. Each tool runs in its own process, since PyTables
and netCDF4 bring their own copies of HDF5.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

import numpy as np

ROWS = 23  # not a multiple of any chunk length below: edge chunks everywhere
MATLAB_HEADER = (
    b"MATLAB 7.3 MAT-file, Platform: GLNXA64, Created on: Thu Nov 26 2026 HDF5 schema 1.00 ."
)


def _values(dtype, shape, seed=0):
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return (rng.standard_normal(shape) * 100).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -(2**40)), min(info.max, 2**40), shape, endpoint=True).astype(
        dtype
    )


def _h5py_library():
    """h5py's own HDF5, for the C calls h5py does not wrap."""
    import h5py.defs

    return ctypes.CDLL(_library_linked_by(h5py.defs.__file__))


def _library_linked_by(module_path):
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if "libhdf5-" in path or "libhdf5.so" in path or "libhdf5_serial" in path:
                if "h5py" in path or "h5py" in module_path:
                    return path
    raise RuntimeError("h5py's HDF5 is not loaded")


def _select_rows(space, start, count):
    selected = space.copy()
    selected.select_hyperslab((start, 0), (count, space.shape[1]))
    return selected


def write_h5py(d):
    import h5py

    out = []

    def add(file, dataset, what):
        out.append({"file": file, "dataset": dataset, "what": what})

    f32 = _values("f4", (ROWS, 5, 7))
    path = f"{d}/h5py_layouts.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("contiguous", data=f32)
        f.create_dataset("chunked", data=f32, chunks=(4, 2, 3))
        f.create_dataset(
            "gzip_shuffle", data=f32, chunks=(4, 5, 7), compression="gzip", shuffle=True
        )
        f.create_dataset("gzip_edges", data=f32, chunks=(3, 2, 4), compression=9, shuffle=True)
        f.create_dataset("lzf", data=f32, chunks=(2, 5, 7), compression="lzf")
        f.create_dataset("lzf_shuffle", data=f32, chunks=(5, 3, 3), compression="lzf", shuffle=True)
        f.create_dataset("fletcher32", data=f32, chunks=(4, 5, 7), fletcher32=True)
        f.create_dataset(
            "scaleoffset_int", data=_values("i4", (ROWS, 9)), chunks=(4, 9), scaleoffset=0
        )
        f.create_dataset("scaleoffset_float", data=f32, chunks=(4, 5, 7), scaleoffset=2)
        f.create_dataset("big_endian", data=f32.astype(">f4"))
        f.create_dataset(
            "big_endian_chunked", data=f32.astype(">f8"), chunks=(3, 5, 7), compression="gzip"
        )
        for dtype in ("i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f2", "f8", "?"):
            f.create_dataset(
                f"dtype_{dtype}", data=_values(dtype, (ROWS, 6)), chunks=(5, 6), compression="gzip"
            )
        resizable = f.create_dataset(
            "resizable", shape=(5, 4), maxshape=(None, 4), dtype="i8", chunks=(4, 4)
        )
        resizable[:] = _values("i8", (5, 4))
        for _ in range(3):
            resizable.resize(resizable.shape[0] + 6, axis=0)
            resizable[-6:] = _values("i8", (6, 4), seed=resizable.shape[0])
        sparse = f.create_dataset(
            "fill_never_written", shape=(ROWS, 8), dtype="f4", chunks=(4, 8), fillvalue=7.5
        )
        sparse[0:4] = 1.0
        sparse[17:19] = 2.0
        f.create_dataset(
            "compact", data=_values("i2", (ROWS, 3))
        )  # small: h5py may keep it contiguous
        f.create_dataset("one_dim", data=_values("f8", (ROWS,)), chunks=(4,), compression="gzip")
        f.create_dataset(
            "strings", data=np.array([b"a", b"bc"] * 3, dtype=object), dtype=h5py.string_dtype()
        )
        f.create_dataset("compound", data=np.zeros(4, dtype=[("a", "<i4"), ("b", "<f4")]))
        f["soft"] = h5py.SoftLink("/gzip_shuffle")
        # Enums over big-endian integers: HDF5 will not change an enum's byte
        # order, so they must be read as their base integer.
        levels = _values("u1", (ROWS, 5)) % 3
        for base, options in ((">i4", {}), (">i2", {"chunks": (4, 5), "compression": "gzip"})):
            f.create_dataset(
                f"enum_{base[1:]}_big_endian",
                data=levels.astype(base),
                dtype=h5py.enum_dtype({"A": 0, "B": 1, "C": 2}, basetype=base),
                **options,
            )
        f.create_group("group").create_dataset("inside", data=_values("i2", (ROWS, 3)))
        # Complex numbers: h5py's compound {r, i} of two floats.
        c64 = (_values("f4", (ROWS, 3, 4)) + 1j * _values("f4", (ROWS, 3, 4), seed=1)).astype("c8")
        f.create_dataset("complex64", data=c64)
        f.create_dataset(
            "complex64_gzip_shuffle", data=c64, chunks=(4, 3, 2), compression="gzip", shuffle=True
        )
        f.create_dataset("complex64_big_endian", data=c64.astype(">c8"), chunks=(5, 3, 4))
        f.create_dataset("complex128", data=c64.astype("c16"))
        f.create_dataset("complex256", data=c64.astype(np.clongdouble))
        f.create_dataset("complex128_big_endian", data=c64.astype(">c16"), chunks=(4, 3, 4),
                         compression="gzip")  # fmt: skip
    for name in ("contiguous", "chunked", "gzip_shuffle", "gzip_edges", "lzf", "lzf_shuffle",
                 "fletcher32", "scaleoffset_int", "scaleoffset_float", "big_endian",
                 "big_endian_chunked", "resizable", "fill_never_written", "compact", "one_dim",
                 "soft", "strings", "compound", "enum_i4_big_endian", "enum_i2_big_endian",
                 "group/./inside", "complex64", "complex64_gzip_shuffle", "complex64_big_endian",
                 "complex128", "complex128_big_endian", "complex256"):  # fmt: skip
        add(path, name, f"h5py {name}")
    for dtype in ("i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f2", "f8", "?"):
        add(path, f"dtype_{dtype}", f"h5py dtype {dtype}")

    # Compact layout and the n-bit filter over a 12-bit integer type, through
    # the low-level API (and C calls h5py does not wrap).
    library = _h5py_library()
    path = f"{d}/h5py_lowlevel.h5"
    with h5py.File(path, "w") as f:
        space = h5py.h5s.create_simple((ROWS, 4))
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_layout(h5py.h5d.COMPACT)
        h5py.h5d.create(f.id, b"compact", h5py.h5t.STD_I32LE, space, dcpl=dcpl).write(
            h5py.h5s.ALL, h5py.h5s.ALL, _values("i4", (ROWS, 4))
        )
        nbit_type = h5py.h5t.STD_I16LE.copy()
        nbit_type.set_precision(12)
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_chunk((4, 4))
        assert library.H5Pset_nbit(ctypes.c_int64(dcpl.id)) >= 0
        nbit = h5py.h5d.create(f.id, b"nbit", nbit_type, space, dcpl=dcpl)
        nbit.write(h5py.h5s.ALL, h5py.h5s.ALL, (_values("i2", (ROWS, 4)) % 2000).astype("i2"))
        precision = h5py.h5t.STD_U32LE.copy()
        precision.set_precision(20)
        h5py.h5d.create(f.id, b"nbit_type_only", precision, space).write(
            h5py.h5s.ALL, h5py.h5s.ALL, (_values("u4", (ROWS, 4)) % 1000000).astype("u4")
        )
        # Edge chunks stored unfiltered: H5Pset_chunk_opts(DONT_FILTER_PARTIAL_CHUNKS).
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_chunk((4, 3))
        dcpl.set_shuffle()
        dcpl.set_deflate(6)
        assert library.H5Pset_chunk_opts(ctypes.c_int64(dcpl.id), ctypes.c_uint(2)) >= 0
        edge = h5py.h5d.create(
            f.id,
            b"unfiltered_edges",
            h5py.h5t.IEEE_F32LE,
            h5py.h5s.create_simple((ROWS, 7)),
            dcpl=dcpl,
        )
        edge.write(h5py.h5s.ALL, h5py.h5s.ALL, _values("f4", (ROWS, 7)))
        # IEEE bit fields but the mantissa's leading bit stored (H5T_NORM_NONE):
        # h5py converts; the bits read as IEEE floats were other numbers.
        for name, options in (("norm_none", {}), ("norm_none_gzip", {"chunk": (4, 5)})):
            norm_none = h5py.h5t.IEEE_F32LE.copy()
            norm_none.set_norm(h5py.h5t.NORM_NONE)
            dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
            if options:
                dcpl.set_chunk(options["chunk"])
                dcpl.set_deflate(4)
            h5py.h5d.create(
                f.id, name.encode(), norm_none, h5py.h5s.create_simple((ROWS, 5)), dcpl=dcpl
            ).write(h5py.h5s.ALL, h5py.h5s.ALL, _values("f4", (ROWS, 5)))
        # Enums h5py reads as bool (exactly {FALSE: 0, TRUE: 1}, any order and
        # base integer) and two it reads as integers.
        flags = _values("u1", (ROWS, 6)) % 2
        for name, base, members, stored in (
            ("bool_enum_int32", h5py.h5t.NATIVE_INT32, (("FALSE", 0), ("TRUE", 1)), flags),
            ("bool_enum_i2_big_endian", h5py.h5t.STD_I16BE, (("FALSE", 0), ("TRUE", 1)), flags),
            ("bool_enum_true_first", h5py.h5t.NATIVE_UINT8, (("TRUE", 1), ("FALSE", 0)), flags),
            ("enum_false_true_0_2", h5py.h5t.NATIVE_UINT8, (("FALSE", 0), ("TRUE", 2)), flags * 2),
            ("enum_false_true_1_0", h5py.h5t.NATIVE_UINT8, (("FALSE", 1), ("TRUE", 0)), flags),
        ):
            file_type = h5py.h5t.enum_create(base)
            memory_type = h5py.h5t.enum_create(h5py.h5t.NATIVE_UINT8)
            for member, value in members:
                file_type.enum_insert(member.encode(), value)
                memory_type.enum_insert(member.encode(), value)
            h5py.h5d.create(
                f.id, name.encode(), file_type, h5py.h5s.create_simple((ROWS, 6))
            ).write(h5py.h5s.ALL, h5py.h5s.ALL, stored.astype("u1"), mtype=memory_type)
        # Array-typed elements the high-level API does not write: compact, a
        # chunk never written (the fill value, read by the library), arrays
        # of arrays (refused).
        pairs = h5py.h5t.array_create(h5py.h5t.STD_U16LE, (2,))
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_layout(h5py.h5d.COMPACT)
        h5py.h5d.create(f.id, b"array_compact", pairs, space, dcpl=dcpl).write(
            h5py.h5s.ALL, h5py.h5s.ALL, _values("u2", (ROWS, 4, 2)), mtype=pairs
        )
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_chunk((4, 4))
        dcpl.set_deflate(3)
        unwritten = h5py.h5d.create(f.id, b"array_unwritten_chunk", pairs, space, dcpl=dcpl)
        unwritten.write(
            h5py.h5s.create_simple((8, 4)),
            _select_rows(space, 0, 8),
            _values("u2", (8, 4, 2)),
            mtype=pairs,
        )
        nested = h5py.h5t.array_create(pairs, (3,))
        h5py.h5d.create(f.id, b"array_of_arrays", nested, h5py.h5s.create_simple((ROWS,))).write(
            h5py.h5s.ALL, h5py.h5s.ALL, _values("u2", (ROWS, 3, 2)), mtype=nested
        )
    for name in ("compact", "nbit", "nbit_type_only", "unfiltered_edges", "norm_none",
                 "norm_none_gzip", "bool_enum_int32", "bool_enum_i2_big_endian",
                 "bool_enum_true_first", "enum_false_true_0_2", "enum_false_true_1_0",
                 "array_compact", "array_unwritten_chunk", "array_of_arrays"):  # fmt: skip
        add(path, name, f"h5py low-level {name}")

    # libver earliest and latest, each with filters; SWMR.
    for libver in ("earliest", "latest"):
        path = f"{d}/h5py_libver_{libver}.h5"
        with h5py.File(path, "w", libver=libver) as f:
            f.create_dataset("gzip", data=f32, chunks=(4, 5, 7), compression="gzip", shuffle=True)
            f.create_dataset("lzf", data=f32, chunks=(3, 5, 7), compression="lzf")
            f.create_dataset("plain", data=f32, chunks=(4, 5, 7))
            f.create_dataset("contiguous", data=f32)
            grow = f.create_dataset(
                "appended",
                shape=(0, 6),
                maxshape=(None, 6),
                dtype="f4",
                chunks=(4, 6),
                compression="gzip",
            )
            for step in range(5):
                grow.resize(grow.shape[0] + 5, axis=0)
                grow[-5:] = _values("f4", (5, 6), seed=step)
        for name in ("gzip", "lzf", "plain", "contiguous", "appended"):
            add(path, name, f"h5py libver={libver} {name}")
    path = f"{d}/h5py_swmr.h5"
    with h5py.File(path, "w", libver="latest") as f:
        grow = f.create_dataset(
            "acquisition",
            shape=(0, 16),
            maxshape=(None, 16),
            dtype="i2",
            chunks=(8, 16),
            compression="gzip",
        )
        f.swmr_mode = True
        for step in range(5):
            grow.resize(grow.shape[0] + 5, axis=0)
            grow[-5:] = _values("i2", (5, 16), seed=step)
            grow.flush()
    add(path, "acquisition", "h5py SWMR")

    # User blocks (MATLAB v7.3 files carry 512 bytes of header text).
    for size in (512, 4096):
        path = f"{d}/h5py_userblock_{size}.h5"
        with h5py.File(path, "w", userblock_size=size) as f:
            f.create_dataset("contiguous", data=f32)
            f.create_dataset("chunked", data=f32, chunks=(4, 5, 7))
            f.create_dataset("gzip", data=f32, chunks=(4, 5, 7), compression="gzip")
            f.create_dataset("edges", data=f32, chunks=(3, 2, 4))
        with open(path, "r+b") as raw:
            raw.write(MATLAB_HEADER)
        for name in ("contiguous", "chunked", "gzip", "edges"):
            add(path, name, f"h5py userblock {size} {name}")

    # External links: the data lives in another file at other offsets.
    target = f"{d}/h5py_external_target.h5"
    with h5py.File(target, "w") as f:
        f.create_dataset("padding", data=_values("f8", (300, 10)))
        f.create_dataset("contiguous", data=f32)
        f.create_dataset("chunked", data=f32, chunks=(4, 5, 7))
        f.create_dataset("gzip", data=f32, chunks=(4, 5, 7), compression="gzip")
    path = f"{d}/h5py_external_link.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("own", data=_values("f8", (100, 10)))
        for name in ("contiguous", "chunked", "gzip"):
            f[f"ext_{name}"] = h5py.ExternalLink(os.path.basename(target), f"/{name}")
    for name in ("contiguous", "chunked", "gzip"):
        add(path, f"ext_{name}", f"h5py external link {name}")

    # MATLAB v7.3 style: user block, column-major arrays stored transposed,
    # a MATLAB_class attribute, double and logical (uint8) data.
    path = f"{d}/matlab_v73_style.mat"
    with h5py.File(path, "w", userblock_size=512) as f:
        x = f.create_dataset(
            "X",
            data=np.ascontiguousarray(_values("f8", (ROWS, 12)).T),
            chunks=(12, 4),
            compression="gzip",
        )
        x.attrs["MATLAB_class"] = np.bytes_("double")
        mask = f.create_dataset("mask", data=_values("?", (ROWS, 9)).astype("u1"))
        mask.attrs["MATLAB_class"] = np.bytes_("logical")
    with open(path, "r+b") as raw:
        raw.write(MATLAB_HEADER)
    add(path, "X", "MATLAB v7.3 style X")
    add(path, "mask", "MATLAB v7.3 style logical")
    return out


def write_hdf5plugin(d):
    import h5py
    import hdf5plugin

    data = _values("f4", (ROWS, 6, 10))
    ints = _values("i2", (ROWS, 33))
    filters = {
        "blosc_lz4_shuffle": hdf5plugin.Blosc(
            cname="lz4", clevel=5, shuffle=hdf5plugin.Blosc.SHUFFLE
        ),
        "blosc_zstd_bitshuffle": hdf5plugin.Blosc(
            cname="zstd", clevel=3, shuffle=hdf5plugin.Blosc.BITSHUFFLE
        ),
        "blosc_blosclz": hdf5plugin.Blosc(
            cname="blosclz", clevel=9, shuffle=hdf5plugin.Blosc.NOSHUFFLE
        ),
        "blosc_zlib": hdf5plugin.Blosc(cname="zlib", clevel=4),
        "blosc2_lz4": hdf5plugin.Blosc2(cname="lz4", clevel=5, filters=hdf5plugin.Blosc2.SHUFFLE),
        "blosc2_zstd": hdf5plugin.Blosc2(
            cname="zstd", clevel=3, filters=hdf5plugin.Blosc2.BITSHUFFLE
        ),
        "bitshuffle": hdf5plugin.Bitshuffle(),
        "bitshuffle_zstd": hdf5plugin.Bitshuffle(cname="zstd"),
        "zstd": hdf5plugin.Zstd(),
        "lz4": hdf5plugin.LZ4(),
        "bzip2": hdf5plugin.BZip2(),
    }
    out = []
    path = f"{d}/hdf5plugin_filters.h5"
    with h5py.File(path, "w") as f:
        for name, options in filters.items():
            f.create_dataset(name, data=data, chunks=(4, 6, 10), **options)
            f.create_dataset(f"{name}_int16_edges", data=ints, chunks=(5, 16), **options)
            out.append({"file": path, "dataset": name, "what": f"hdf5plugin {name}"})
            out.append(
                {"file": path, "dataset": f"{name}_int16_edges", "what": f"hdf5plugin {name} int16"}
            )
    return out


def write_pytables(d):
    import tables

    out = []
    path = f"{d}/pytables.h5"
    data = _values("f4", (ROWS, 8, 5))
    with tables.open_file(path, "w") as f:
        f.create_array("/", "array", data)
        carrays = {
            "carray_zlib": ((4, 8, 5), tables.Filters(5, "zlib", shuffle=True)),
            "carray_blosc": ((4, 8, 5), tables.Filters(5, "blosc")),
            "carray_blosc_lz4": ((3, 8, 5), tables.Filters(9, "blosc:lz4", bitshuffle=True)),
            "carray_blosc2": ((4, 8, 5), tables.Filters(5, "blosc2:zstd")),
            "carray_lzo_or_bzip2": ((4, 8, 5), tables.Filters(5, "bzip2")),
        }
        for name, (chunks, filters) in carrays.items():
            f.create_carray("/", name, obj=data, chunkshape=chunks, filters=filters)
        earray = f.create_earray(
            "/",
            "earray",
            tables.Int32Atom(),
            (0, 7),
            filters=tables.Filters(5, "blosc"),
            chunkshape=(6, 7),
        )
        for step in range(4):
            earray.append(_values("i4", (6, 7), seed=step))
        f.create_carray("/", "bool_atom", obj=_values("?", (ROWS, 9)), chunkshape=(4, 9))
        f.create_array("/", "bool_array", _values("?", (ROWS, 9)))
        c64 = (data + 1j * data[::-1]).astype("c8")
        f.create_carray("/", "complex64", obj=c64, chunkshape=(4, 8, 5),
                        filters=tables.Filters(5, "zlib", shuffle=True))  # fmt: skip
        f.create_array("/", "complex128_array", c64.astype("c16"))
        table = f.create_table("/", "table", {"a": tables.Int32Col(), "b": tables.Float32Col()})
        table.append([(1, 2.0), (3, 4.0)])
        # Atoms with a shape: each element an HDF5 array type, which h5py reads
        # as trailing dimensions.
        shaped = f.create_carray("/", "atom_shape_carray", tables.Float32Atom(shape=(3, 2)),
                                 (ROWS, 5), chunkshape=(4, 2),
                                 filters=tables.Filters(5, "zlib", shuffle=True))  # fmt: skip
        shaped[:] = _values("f4", (ROWS, 5, 3, 2))
        shaped = f.create_earray("/", "atom_shape_earray", tables.Int16Atom(shape=(5,)), (0,),
                                 chunkshape=(6,), filters=tables.Filters(5, "blosc"))  # fmt: skip
        shaped.append(_values("i2", (ROWS, 5)))
        shaped = f.create_carray("/", "atom_shape_big_endian", tables.Int32Atom(shape=(3,)),
                                 (ROWS,), chunkshape=(5,), byteorder="big")  # fmt: skip
        shaped[:] = _values("i4", (ROWS, 3))
        shaped = f.create_carray("/", "atom_shape_complex", tables.ComplexAtom(8, shape=(2,)),
                                 (ROWS,), chunkshape=(7,))  # fmt: skip
        shaped[:] = _values("f4", (ROWS, 2)) + 1j * _values("f4", (ROWS, 2), seed=1)
        shaped = f.create_carray("/", "atom_shape_bool", tables.BoolAtom(shape=(4,)), (ROWS, 2),
                                 chunkshape=(3, 2), filters=tables.Filters(5, "zlib"))  # fmt: skip
        shaped[:] = _values("?", (ROWS, 2, 4))
        shaped = f.create_array("/", "atom_shape_array", atom=tables.Float64Atom(shape=(2, 2)),
                                shape=(ROWS,))  # fmt: skip
        shaped[:] = _values("f8", (ROWS, 2, 2))
    for name in ("array", "carray_zlib", "carray_blosc", "carray_blosc_lz4", "carray_blosc2",
                 "carray_lzo_or_bzip2", "earray", "bool_atom", "bool_array", "table",
                 "complex64", "complex128_array", "atom_shape_carray", "atom_shape_earray",
                 "atom_shape_big_endian", "atom_shape_complex", "atom_shape_bool",
                 "atom_shape_array"):  # fmt: skip
        out.append({"file": path, "dataset": name, "what": f"PyTables {name}"})
    return out


def write_netcdf4(d):
    import netCDF4

    out = []
    path = f"{d}/netcdf4.nc"
    with netCDF4.Dataset(path, "w") as f:
        f.createDimension("time", None)
        f.createDimension("y", 9)
        f.createDimension("x", 11)
        variables = {
            "plain": f.createVariable("plain", "f4", ("time", "y", "x")),
            "zlib": f.createVariable(
                "zlib",
                "f4",
                ("time", "y", "x"),
                zlib=True,
                complevel=4,
                shuffle=True,
                chunksizes=(4, 9, 11),
            ),
            "fill": f.createVariable(
                "fill", "i2", ("time", "y", "x"), zlib=True, fill_value=-999, chunksizes=(5, 3, 4)
            ),
            "contiguous": f.createVariable("contiguous", "f8", ("y", "x"), contiguous=True),
            "fletcher": f.createVariable(
                "fletcher", "i4", ("time", "x"), fletcher32=True, chunksizes=(6, 11)
            ),
        }
        data = _values("f4", (ROWS, 9, 11))
        variables["plain"][:] = data
        variables["zlib"][:] = data
        variables["fill"][0:ROWS] = _values("i2", (ROWS, 9, 11)) % 500
        variables["fill"][5:9, :, :] = np.ma.masked  # written as the fill value
        variables["contiguous"][:] = _values("f8", (9, 11))
        variables["fletcher"][0:ROWS] = _values("i4", (ROWS, 11))
    for name in ("plain", "zlib", "fill", "contiguous", "fletcher", "time"):
        out.append({"file": path, "dataset": name, "what": f"netCDF4 {name}"})
    return out


WRITERS = {
    "h5py": write_h5py,
    "hdf5plugin": write_hdf5plugin,
    "pytables": write_pytables,
    "netcdf4": write_netcdf4,
}

if __name__ == "__main__":
    tool, directory = sys.argv[1], sys.argv[2]
    print(json.dumps(WRITERS[tool](directory)))
