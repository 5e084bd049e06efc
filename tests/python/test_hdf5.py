"""HDF5Source against h5py: the rows it reads, the paths it takes, its errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest

import leanloader as ll

h5py = pytest.importorskip("h5py")


def read_field(source, name: str, batch_size: int = 3) -> np.ndarray:
    loader = ll.Loader(source, batch_size=batch_size, shuffle=False, num_threads=2, output="numpy")
    return np.concatenate([batch[name].copy() for batch in loader])  # slots are reused


def sample_array(shape, dtype, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    # Compressible floats: a smooth ramp plus a little noise.
    ramp = np.arange(np.prod(shape), dtype=np.float64).reshape(shape) / 97.0
    return (ramp + rng.normal(size=shape) * 0.01).astype(dtype)


LAYOUTS = {
    "contiguous": ({}, "pread"),
    "chunk_one_row": ({"chunks": (1, 5, 6)}, "chunks"),
    "chunk_spanning_rows": ({"chunks": (3, 5, 6)}, "chunks"),
    "chunk_smaller_than_row": ({"chunks": (1, 2, 4)}, "chunks"),
    "chunk_edges_on_every_axis": ({"chunks": (4, 3, 4)}, "chunks"),
    "gzip_shuffle": ({"chunks": (2, 5, 3), "compression": "gzip", "shuffle": True}, "chunks"),
    "gzip_1": ({"chunks": (1, 5, 6), "compression": "gzip", "compression_opts": 1}, "chunks"),
    "compact": ({"compact": True}, "memory"),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_rows_equal_h5py(tmp_path, layout):
    options, expected_path = LAYOUTS[layout]
    data = sample_array((7, 5, 6), np.float32)
    path = tmp_path / "x.h5"
    with h5py.File(path, "w") as f:
        if options.get("compact"):
            space = h5py.h5s.create_simple(data.shape)
            plist = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
            plist.set_layout(h5py.h5d.COMPACT)
            dset = h5py.h5d.create(f.id, b"x", h5py.h5t.IEEE_F32LE, space, dcpl=plist)
            dset.write(h5py.h5s.ALL, h5py.h5s.ALL, data)
        else:
            f.create_dataset("x", data=data, **options)
        reference = f["x"][:]
    source = ll.HDF5Source({"x": (str(path), "x")})
    assert source.layout(0) == [expected_path]
    assert source.fields == [("x", "F32", [5, 6])]
    np.testing.assert_array_equal(read_field(source, "x"), reference)


@pytest.mark.parametrize("filter_name", ["LZ4", "Zstd"])
def test_lz4_and_zstd_decoded_by_leanloader(tmp_path, filter_name):
    hdf5plugin = pytest.importorskip("hdf5plugin")
    data = sample_array((6, 40, 30), np.float32)
    path = tmp_path / "x.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, chunks=(2, 40, 30), **getattr(hdf5plugin, filter_name)())
        reference = f["x"][:]
    source = ll.HDF5Source({"x": (str(path), "x")})
    assert source.layout(0) == ["chunks"]
    np.testing.assert_array_equal(read_field(source, "x"), reference)


DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "bool"]  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chunked", [False, True], ids=["contiguous", "gzip"])
def test_dtypes(tmp_path, dtype, chunked):
    data = sample_array((5, 3, 4), dtype, seed=3)
    path = tmp_path / "x.h5"
    with h5py.File(path, "w") as f:
        options = {"chunks": (2, 3, 2), "compression": "gzip", "shuffle": True} if chunked else {}
        f.create_dataset("x", data=data, **options)
        reference = f["x"][:]
    source = ll.HDF5Source({"x": (str(path), "x")})
    got = read_field(source, "x", batch_size=2)
    assert got.dtype == reference.dtype
    np.testing.assert_array_equal(got, reference)


def test_big_endian_goes_through_the_library(tmp_path):
    data = sample_array((4, 3), "<i4").astype(">i4")
    path = tmp_path / "x.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data)
    source = ll.HDF5Source({"x": (str(path), "x")})
    assert source.layout(0)[0].startswith("library: big-endian")
    np.testing.assert_array_equal(read_field(source, "x"), data.astype("<i4"))


def test_seed_004_join_sessions_and_stimuli(tmp_path):
    """Session files concatenated in sorted order, images joined through an index."""
    sessions = []
    for s in (2, 1, 3):  # written out of order: the glob's sorted order counts
        betas = sample_array((4 + s, 6, 5, 4), np.float32, seed=s)
        with h5py.File(tmp_path / f"betas_session{s:02d}.hdf5", "w") as f:
            f.create_dataset("betas", data=betas, chunks=(1, 6, 5, 4))
        sessions.append((s, betas))
    betas_all = np.concatenate([b for _, b in sorted(sessions, key=lambda x: x[0])])
    images = sample_array((9, 8, 8, 3), np.uint8, seed=9)
    with h5py.File(tmp_path / "stimuli.hdf5", "w") as f:
        f.create_dataset("images", data=images)
    trial_to_image = np.random.default_rng(1).integers(0, 9, size=len(betas_all))
    source = ll.HDF5Source(
        {
            "fmri": (str(tmp_path / "betas_session*.hdf5"), "betas"),
            "image": (str(tmp_path / "stimuli.hdf5"), "images", trial_to_image),
        }
    )
    assert len(source) == len(betas_all) == 18
    assert [os.path.basename(p) for p in source.files(0)] == [
        "betas_session01.hdf5", "betas_session02.hdf5", "betas_session03.hdf5"]  # fmt: skip
    loader = ll.Loader(source, batch_size=4, shuffle=True, seed=5, num_threads=3, output="numpy")
    seen = 0
    for batch in loader:
        assert batch["fmri"].shape[1:] == (6, 5, 4) and batch["image"].shape[1:] == (8, 8, 3)
        for row in range(len(batch["fmri"])):
            # Each row's fmri and image belong to the same trial.
            trial = int(np.flatnonzero((betas_all == batch["fmri"][row]).all(axis=(1, 2, 3)))[0])
            np.testing.assert_array_equal(batch["image"][row], images[trial_to_image[trial]])
        seen += len(batch["fmri"])
    assert seen == 18


BAD_INPUT_SCRIPT = textwrap.dedent(
    """
    import json, os, shutil, sys
    import numpy as np, h5py
    import leanloader as ll
    d = sys.argv[1]
    results = {}

    def attempt(name, make):
        try:
            source = make()
            loader = ll.Loader(source, batch_size=2, shuffle=False, output="numpy")
            for _ in loader:
                pass
            results[name] = ["no error", ""]
        except Exception as e:
            results[name] = [type(e).__name__, str(e)]

    data = (np.arange(6 * 500, dtype=np.float32) % 17).reshape(6, 500)
    with h5py.File(f"{d}/good.h5", "w") as f:
        f.create_dataset("x", data=data)
        f.create_dataset("z", data=data, chunks=(1, 500), compression="gzip")
        f.create_dataset("s", data=np.array([b"ab", b"cd"], dtype=object),
                         dtype=h5py.string_dtype())
        f.create_dataset("c", data=np.zeros(3, dtype=[("a", "<i4"), ("b", "<f4")]))
        dcid = f["z"].id
        address = dcid.get_chunk_info_by_coord((3, 0)).byte_offset
        stored = dcid.get_chunk_info_by_coord((3, 0)).size
    try:
        import hdf5plugin
        with h5py.File(f"{d}/blosc.h5", "w") as f:
            f.create_dataset("x", data=data, chunks=(2, 500), **hdf5plugin.Blosc())
    except ImportError:
        pass

    size = os.path.getsize(f"{d}/good.h5")
    shutil.copy(f"{d}/good.h5", f"{d}/truncated.h5")
    os.truncate(f"{d}/truncated.h5", size // 2)
    shutil.copy(f"{d}/good.h5", f"{d}/corrupt.h5")
    with open(f"{d}/corrupt.h5", "r+b") as f:
        f.seek(address + stored // 2)
        f.write(bytes([0x13, 0x77, 0x00, 0xFF, 0x42, 0x01, 0x99]))

    attempt("truncated", lambda: ll.HDF5Source({"x": (f"{d}/truncated.h5", "x")}))
    attempt("missing_file", lambda: ll.HDF5Source({"x": (f"{d}/nothere*.h5", "x")}))
    attempt("missing_dataset", lambda: ll.HDF5Source({"x": (f"{d}/good.h5", "nope")}))
    attempt("row_past_the_end",
            lambda: ll.HDF5Source({"x": (f"{d}/good.h5", "x", np.array([0, 6]))}))
    attempt("corrupt_chunk", lambda: ll.HDF5Source({"z": (f"{d}/corrupt.h5", "z")}))
    attempt("strings", lambda: ll.HDF5Source({"s": (f"{d}/good.h5", "s")}))
    attempt("compound", lambda: ll.HDF5Source({"c": (f"{d}/good.h5", "c")}))
    if os.path.exists(f"{d}/blosc.h5"):
        attempt("blosc", lambda: ll.HDF5Source({"x": (f"{d}/blosc.h5", "x")}))
    print(json.dumps(results))
    """
)


def test_bad_input_is_a_clear_error_never_a_crash(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", BAD_INPUT_SCRIPT, str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    errors = json.loads(result.stdout.strip().splitlines()[-1])
    d = str(tmp_path)

    def check(name, kind, *needles):
        got_kind, message = errors[name]
        assert got_kind == kind, (name, errors[name])
        for needle in needles:
            assert needle in message, (name, needle, message)

    check("truncated", "FormatError", f"{d}/truncated.h5", "HDF5 cannot open the file", "truncated")
    assert "HDF5-DIAG" not in result.stderr, result.stderr  # nothing printed by the library
    check("missing_file", "FileNotFoundError", "nothere*.h5")
    check("missing_dataset", "FormatError", f"{d}/good.h5", "no dataset 'nope'")
    check("row_past_the_end", "ValueError", "index[1] = 6", "6 rows", "dataset 'x'")
    check("corrupt_chunk", "FormatError", f"'{d}/corrupt.h5' dataset 'z' row 3", "deflate")
    check("strings", "ValueError", "dataset 's'", "string elements, which cannot become a tensor")
    check("compound", "ValueError", "dataset 'c'", "compound elements")
    if "blosc" in errors:
        check("blosc", "no error")  # decoded by leanloader itself


FORK_SCRIPT = textwrap.dedent(
    """
    import os, sys
    import numpy as np, h5py
    import leanloader as ll
    path = sys.argv[1]
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.arange(8, dtype=np.int32).reshape(4, 2))
    source = ll.HDF5Source({"x": (path, "x")})
    pid = os.fork()
    if pid == 0:
        try:
            for _ in ll.Loader(source, batch_size=2, output="numpy"):
                pass
            os._exit(1)
        except ll.Error as e:
            os._exit(0 if "forked child" in str(e) else 2)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status))
    """
)


def one_pass(loader, name="x"):
    """Every row of one pass, and the messages of the warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows = np.concatenate([batch[name].copy() for batch in loader])
    return rows, [str(w.message) for w in caught]


UPDATED_LAYOUTS = {
    name: LAYOUTS[name][0] for name in ("contiguous", "chunk_spanning_rows", "gzip_shuffle")
} | {"fletcher32_through_the_library": {"chunks": (3, 5, 6), "fletcher32": True}}


@pytest.mark.parametrize("layout", sorted(UPDATED_LAYOUTS))
def test_a_file_written_since_the_source_opened_it_is_read_as_it_is_now(tmp_path, layout):
    # h5py in "r+" mode rewrites rows in place: a rewritten compressed chunk
    # moves, and decoded chunks are kept, so the next pass read the old rows
    # where h5py reads the new ones. The next pass opens the file again.
    # A dataset read through the HDF5 library kept its file open there, and
    # h5py could not open it for writing ("already open for read-only").
    path = tmp_path / "d.h5"
    options = dict(UPDATED_LAYOUTS[layout])
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=sample_array((12, 5, 6), "f4"), **options)
    source = ll.HDF5Source({"x": (path, "x")})
    loader = ll.Loader(source, batch_size=4, shuffle=False, output="numpy")
    kept = ll.Loader(source, batch_size=4, shuffle=False, output="numpy", follow_updates=False)
    assert len(one_pass(loader)[0]) == len(one_pass(kept)[0]) == 12

    def h5py_rows():
        with h5py.File(path) as f:
            return f["x"][()]

    for value in (100, 200):
        time.sleep(0.05)  # a later modification time (the kernel stamps at its tick: 4-10 ms)
        with h5py.File(path, "r+") as f:
            f["x"][0:3] = sample_array((3, 5, 6), "f4", seed=1) + value
        rows, caught = one_pass(loader)
        np.testing.assert_array_equal(rows, h5py_rows())
        assert caught == []  # as many rows as before: nothing to announce
    # Opened in "r+" mode and closed without a write: HDF5 still rewrites
    # its superblock (a new modification time); the rows are the same.
    time.sleep(0.05)
    with h5py.File(path, "r+"):
        pass
    np.testing.assert_array_equal(one_pass(loader)[0], h5py_rows())
    # A loader that keeps the snapshot it was made with cannot read it.
    with pytest.raises(
        ll.FormatError, match=r"d\.h5' was replaced or modified .*open the source again"
    ):
        next(iter(kept))


def test_rows_appended_since_the_source_opened_them_join_the_next_pass(tmp_path):
    path = tmp_path / "grow.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=sample_array((12, 4), "i4"), maxshape=(None, 4), chunks=(5, 4))
        f.create_dataset("y", data=np.arange(12, dtype=np.int64), maxshape=(None,))
    source = ll.HDF5Source({"x": (path, "x"), "y": (path, "y")})
    loader = ll.Loader(source, batch_size=5, shuffle=True, num_threads=2, output="numpy")
    assert len(loader) == 3
    assert sorted(one_pass(loader, "y")[0].tolist()) == list(range(12))
    time.sleep(0.05)
    with h5py.File(path, "r+") as f:  # an appending writer
        for name in ("x", "y"):
            f[name].resize(17, axis=0)
        f["x"][12:] = sample_array((5, 4), "i4", seed=2)
        f["y"][12:] = np.arange(12, 17)
        expected = f["x"][()]
    loader.set_epoch(1)
    ids, caught = one_pass(loader, "y")
    assert sorted(ids.tolist()) == list(range(17))
    assert len(caught) == 1 and "from 12 to 17 samples" in caught[0], caught
    assert len(loader) == 4 and len(source) == 12  # the source is as it was opened
    ordered = ll.Loader(source, batch_size=5, shuffle=False, output="numpy")
    np.testing.assert_array_equal(one_pass(ordered)[0], expected)


def test_a_sharded_loader_refuses_a_source_whose_size_changed(tmp_path):
    # Each rank took the new size at its own pass start: ranks took different
    # numbers of steps (DDP waits forever) and read rows twice or never.
    path = tmp_path / "grow.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.arange(12, dtype=np.int64), maxshape=(None,))
    sharded = dict(batch_size=2, world_size=2, output="numpy")
    loaders = [ll.Loader(ll.HDF5Source({"x": (path, "x")}), rank=r, **sharded) for r in range(2)]
    assert [len(one_pass(loader)[0]) for loader in loaders] == [6, 6]
    time.sleep(0.05)
    with h5py.File(path, "r+") as f:
        f["x"].resize((20,))
        f["x"][12:] = np.arange(12, 20)
    for loader in loaders:
        with pytest.raises(ValueError, match=r"changed from 12 to 20 samples .* 2 ranks"):
            next(iter(loader))


def test_a_forked_child_gets_a_clear_error(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", FORK_SCRIPT, str(tmp_path / "x.h5")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "0", result.stdout + result.stderr


EXIT_MID_PASS_SCRIPT = """
import sys
import h5py  # leanloader then reads through h5py's HDF5, under h5py's lock (taken with the GIL)
import leanloader as ll
loader = ll.Loader(ll.HDF5Source({"x": (sys.argv[1], "x")}), batch_size=16, shuffle=True,
                   num_threads=2, prefetch=4, output="numpy")
for i, batch in enumerate(loader):
    if i == 2:
        break
print("left the pass open")
"""


def test_a_program_that_exits_in_the_middle_of_a_pass_exits_cleanly(tmp_path):
    """Reading threads still taking h5py's lock (so the GIL) when the program
    exited were ended by CPython's finalization with pthread_exit, whose
    unwinding through the engine's thread frame aborted the process (rc 134
    in 6 of 7 runs). Open loaders are now closed by an exit handler first."""
    path = tmp_path / "x.h5"
    with h5py.File(path, "w") as f:  # fletcher32: read by the HDF5 library, chunk by chunk
        f.create_dataset("x", data=np.ones((1024, 4096), np.float32), chunks=(64, 4096),
                         compression="gzip", compression_opts=1, fletcher32=True)  # fmt: skip
    for _ in range(4):
        result = subprocess.run([sys.executable, "-c", EXIT_MID_PASS_SCRIPT, str(path)],
                                capture_output=True, text=True, timeout=60)  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "left the pass open"


def test_index_must_be_integers(tmp_path):
    with h5py.File(tmp_path / "x.h5", "w") as f:
        f.create_dataset("x", data=np.zeros((3, 2), np.float32))
    with pytest.raises(TypeError, match="1-D integer array"):
        ll.HDF5Source({"x": (str(tmp_path / "x.h5"), "x", np.array([0.0, 1.0]))})
    with pytest.raises(ValueError, match="disagree on the number of samples"):
        ll.HDF5Source(
            {"x": (str(tmp_path / "x.h5"), "x"), "y": (str(tmp_path / "x.h5"), "x", [0, 1])}
        )


def test_chunk_cache_is_budgeted(tmp_path):
    data = sample_array((40, 64, 64), np.float32)
    with h5py.File(tmp_path / "x.h5", "w") as f:
        f.create_dataset("x", data=data, chunks=(4, 64, 64), compression="gzip")
    source = ll.HDF5Source({"x": (str(tmp_path / "x.h5"), "x")}, chunk_cache="256KiB")
    assert source.chunk_cache_budget == 256 * 1024
    np.testing.assert_array_equal(read_field(source, "x", batch_size=8), data)
    assert 0 < source.chunk_cache_bytes <= 256 * 1024
    # The cache's budget is part of the loader's memory bill.
    uncached = ll.HDF5Source({"x": (str(tmp_path / "x.h5"), "x")}, chunk_cache=0)
    bill = ll.Loader(source, batch_size=8).memory_bill()
    assert bill - ll.Loader(uncached, batch_size=8).memory_bill() == 256 * 1024


def test_audit_points_h5py_handles_to_hdf5source(tmp_path):
    path = tmp_path / "x.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.zeros((3, 2), np.float32))

    class Dataset:
        def __init__(self):
            self.file = h5py.File(path, "r")

    dataset = Dataset()
    try:
        text = str(ll.audit(dataset))
    finally:
        dataset.file.close()
    assert "ll.HDF5Source" in text


def _scenario_totals(function, context):
    """(rows, sum of fmri, sum of images) over every batch a bench loader yields."""
    from leanloader.bench.scenarios import EPOCH_END

    fmri = image = 0.0
    rows = 0
    for batch in function(context):
        if batch is EPOCH_END:
            continue
        fmri += float(np.asarray(batch["fmri"], dtype=np.float64).sum())
        image += float(np.asarray(batch["image"], dtype=np.float64).sum())
        rows += len(batch["fmri"])
    return rows, fmri, image


def test_bench_scenario_loaders_read_the_same_trials(tmp_path):
    from leanloader.bench.scenarios import LoaderContext, get_scenario
    from leanloader.bench.scenarios import hdf5 as scenario_module

    scenario = get_scenario("hdf5")
    size = {"sessions": 2, "trials": 5, "trial_shape": [6, 5, 4], "images": 3, "epochs": 1}
    data = scenario.prepare(tmp_path, size)
    assert scenario.prepare(tmp_path, size) == data  # generated once, reused

    def totals(function, options):
        return _scenario_totals(
            function, LoaderContext(size=size, data=data, options=options, seed=1)
        )

    expected = totals(scenario_module.iterate_pread, {})
    assert expected[0] == 10
    for variant in ("raw", "gzip"):
        got = totals(scenario_module.iterate_leanloader, {"output": "numpy", "variant": variant})
        assert got[0] == expected[0]
        assert got[1] == pytest.approx(expected[1]) and got[2] == expected[2]


def test_largebatch_scenario_loaders_read_the_same_trials(tmp_path):
    from leanloader.bench.scenarios import LoaderContext, get_scenario, largebatch
    from leanloader.bench.scenarios import hdf5 as hdf5_module

    scenario = get_scenario("largebatch")
    size = {"sessions": 2, "trials": 5, "trial_shape": [6, 5, 4], "images": 3, "epochs": 1}
    data = scenario.prepare(tmp_path, size)

    def totals(function, options):
        return _scenario_totals(
            function, LoaderContext(size=size, data=data, options=options, seed=1)
        )

    expected = totals(hdf5_module.iterate_pread, {})
    runs = [
        (largebatch.iterate_leanloader, {"workers": 2, "mode": "thread"}),
        (largebatch.iterate_leanloader, {"workers": 2, "mode": "process"}),
        (largebatch.iterate_torch, {"workers": 2, "start": "fork"}),
    ]
    for function, options in runs:
        got = totals(function, options)
        assert got[0] == expected[0], options
        assert got[1] == pytest.approx(expected[1]) and got[2] == expected[2], options
