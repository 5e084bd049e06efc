"""ll.Loader over arrays, .npy files and raw files: order, zero copy, errors, shutdown."""

from __future__ import annotations

import glob
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import numpy as np
import pytest

import leanloader as ll
from conftest import write_sample_dir


def ids_of(loader):
    return [int(i) for batch in loader for i in np.asarray(batch["id"])]


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_every_index_once_per_epoch(id_arrays, shuffle, drop_last):
    loader = ll.Loader(
        id_arrays, batch_size=64, shuffle=shuffle, drop_last=drop_last, output="numpy"
    )
    ids = ids_of(loader)
    expected = 1000 // 64 * 64 if drop_last else 1000
    assert len(ids) == expected
    assert len(set(ids)) == expected
    assert len(loader) == (1000 // 64 if drop_last else -(-1000 // 64))
    if not shuffle:
        assert ids == list(range(expected))


def test_same_order_for_any_thread_count_and_new_order_per_epoch(id_arrays):
    orders = []
    for threads in (1, 2, 8):
        loader = ll.Loader(id_arrays, batch_size=50, shuffle=True, seed=3, num_threads=threads)
        loader.set_epoch(7)
        orders.append(ids_of(loader))
    assert orders[0] == orders[1] == orders[2]
    loader = ll.Loader(id_arrays, batch_size=50, shuffle=True, seed=3)
    loader.set_epoch(8)
    assert ids_of(loader) != orders[0]
    reseeded = ll.Loader(id_arrays, batch_size=50, shuffle=True, seed=4)
    reseeded.set_epoch(7)
    assert ids_of(reseeded) != orders[0]


def test_rows_match_their_samples_in_torch(id_arrays):
    torch = pytest.importorskip("torch")
    loader = ll.Loader(id_arrays, batch_size=32, shuffle=True, output="torch")
    for batch in loader:
        assert isinstance(batch["x"], torch.Tensor)
        assert batch["x"].shape[1:] == (8,) and batch["x"].dtype == torch.float32
        assert torch.equal(batch["x"][:, 0].long(), batch["id"] * 8)
        assert loader.last_indices == batch["id"].tolist()


def test_user_arrays_are_viewed_not_copied(id_arrays):
    loader = ll.Loader(id_arrays, batch_size=1000, output="numpy")
    id_arrays["x"][5, 0] = -1.0  # after the source was built
    batch = next(iter(loader))
    assert batch["x"][5, 0] == -1.0


def test_batches_view_recycled_slots(id_arrays):
    torch = pytest.importorskip("torch")
    loader = ll.Loader(id_arrays, batch_size=100, shuffle=True, prefetch=2, output="torch")
    pointers = set()
    for _ in range(5):
        for batch in loader:
            pointers.add(batch["x"].data_ptr())
            assert batch["x"].is_contiguous()
        del batch
    stats = loader.stats()
    assert len(pointers) <= stats["slots_total"]
    assert stats["overflow_slots_total"] == 0
    assert torch.from_dlpack  # the tensors came through DLPack


def _unreclaimable_bytes():
    fields = {}
    with open(f"/proc/{os.getpid()}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if parts and parts[0].endswith(":") and len(parts) >= 2 and parts[1].isdigit():
                fields[parts[0][:-1]] = int(parts[1]) * 1024
    return fields["Pss_Anon"] + fields.get("Pss_Shmem", 0)


def test_memory_stays_flat_over_30_epochs(tmp_path):
    features = np.lib.format.open_memmap(
        tmp_path / "features.npy", mode="w+", dtype=np.float32, shape=(2048, 4096)
    )
    features[:] = 1.0
    features.flush()
    del features
    loader = ll.Loader(
        ll.NpySource(tmp_path / "features.npy"), batch_size=64, shuffle=True, output="numpy"
    )
    for _ in loader:  # warm up: slots created
        pass
    del _
    before = _unreclaimable_bytes()
    for _ in range(30):
        for batch in loader:
            assert batch["features"].shape == (64, 4096)
        del batch
    growth = _unreclaimable_bytes() - before
    # 30 epochs moved 30 x 32 MiB; the process grew by less than one batch.
    assert growth < 16 * 2**20, growth
    assert loader.stats()["batches_delivered"] == 31 * 32


def test_worker_error_names_sample_file_and_stage(tmp_path):
    write_sample_dir(tmp_path / "s", 40, bad={17})
    loader = ll.Loader(ll.NpySource(tmp_path / "s"), batch_size=5, output="numpy")
    seen = 0
    with pytest.raises(ll.FormatError) as raised:
        for _batch in loader:
            seen += 1
    assert seen == 3
    error = raised.value
    assert isinstance(error, ValueError)
    assert error.sample_index == 17
    assert error.stage == "read"
    assert "s0017.npy" in str(error) and "sample 17" in str(error)


def test_missing_file_raises_file_not_found(tmp_path):
    loader = ll.Loader(
        ll.FileSource([str(tmp_path / "nope.bin")]), batch_size=1, collate="list", output="numpy"
    )
    with pytest.raises(FileNotFoundError, match=r"nope\.bin"):
        next(iter(loader))


def skipping_loader(directory, **options):
    """A Loader over the .npy files of `directory` that skips bad samples."""
    return ll.Loader(ll.NpySource(directory), on_error="skip", output="numpy", **options)


def test_skip_reports_bad_samples_at_epoch_end(tmp_path):
    write_sample_dir(tmp_path / "s", 100, bad={3, 50})
    loader = skipping_loader(tmp_path / "s", batch_size=10)
    with pytest.warns(RuntimeWarning, match=r"skipped 2 bad sample"):
        values = [int(v) for batch in loader for v in batch["s"][:, 0]]
    assert len(values) == 98 and 3 not in values and 50 not in values
    assert loader.stats()["samples_skipped"] == 2
    too_many = skipping_loader(tmp_path / "s", batch_size=10, max_skip_fraction=0.01)
    with pytest.raises(ll.FormatError, match="max_skip_fraction"):
        list(too_many)


def test_a_batch_whose_every_sample_was_skipped_is_not_delivered(tmp_path):
    # An empty batch reached the training step (a mean over no samples is NaN).
    write_sample_dir(tmp_path / "s", 12, bad={4, 5, 6, 7})
    loader = skipping_loader(tmp_path / "s", batch_size=4, max_skip_fraction=0.5)
    with pytest.warns(RuntimeWarning, match=r"skipped 4 bad sample"):
        batches = [batch["s"][:, 0].tolist() for batch in loader]
    assert batches == [[0, 1, 2, 3], [8, 9, 10, 11]]
    # Sharded, every rank takes as many steps as the others (or DDP hangs):
    # rank 1's first batch (global batch 1) arrives empty.
    per_rank = []
    for rank in range(2):
        sharded = skipping_loader(
            tmp_path / "s", batch_size=4, rank=rank, world_size=2, max_skip_fraction=0.7
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            per_rank.append([batch["s"][:, 0].tolist() for batch in sharded])
    # (12 samples, 2 ranks of batches of 4: rank 1's second batch is padding)
    assert per_rank == [[[0, 1, 2, 3], [8, 9, 10, 11]], [[], [0, 1, 2, 3]]]


def test_list_collate_for_variable_length_files(tmp_path):
    paths = []
    for i in range(10):
        path = tmp_path / f"f{i}.bin"
        path.write_bytes(bytes([i]) * (i * 37))
        paths.append(path)
    with pytest.raises(ValueError, match="collate='list'"):
        ll.Loader(ll.FileSource(paths), batch_size=4)
    loader = ll.Loader(
        ll.FileSource(str(tmp_path / "*.bin")), batch_size=4, collate="list", output="numpy"
    )
    items = [item for batch in loader for item in batch["data"]]
    assert [len(item) for item in items] == [i * 37 for i in range(10)]
    assert all((item == i).all() for i, item in enumerate(items))


def test_a_folder_of_npy_files_reads_as_numpy_loads_sorted_glob(tmp_path):
    """A per-sample folder against its reference, sorted(glob("*.npy")) +
    np.load: files in C and Fortran order (np.save of a transposed array),
    hidden files (a backup, a macOS AppleDouble file) not among the samples."""
    rng = np.random.default_rng(3)
    for i in range(6):
        array = rng.standard_normal((4, 3, 5)).astype(np.float32)
        np.save(tmp_path / f"s{i}.npy", array if i % 2 else array.T.copy().T)  # F-contiguous
    np.save(tmp_path / ".s0.backup.npy", np.zeros((4, 3, 5), np.float32))
    (tmp_path / "._s1.npy").write_bytes(b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X")
    expected = [np.load(path) for path in sorted(glob.glob(str(tmp_path / "*.npy")))]
    assert [np.isfortran(np.load(tmp_path / f"s{i}.npy")) for i in range(2)] == [True, False]
    loader = ll.Loader(ll.NpySource(tmp_path, name="x"), batch_size=4, output="numpy")
    got = [row for batch in loader for row in batch["x"]]
    assert len(got) == len(expected) == 6
    for row, reference in zip(got, expected, strict=True):
        assert row.dtype == reference.dtype and row.shape == reference.shape
        assert row.tobytes() == np.ascontiguousarray(reference).tobytes()


def test_memory_budget_caps_the_bill(id_arrays):
    loader = ll.Loader(id_arrays, batch_size=100, prefetch=8, memory_budget="64KiB")
    assert loader.memory_bill() <= 64 * 1024
    assert len(ids_of(loader)) == 1000
    with pytest.raises(ValueError, match="memory_budget"):
        ll.Loader(id_arrays, batch_size=1000, memory_budget=1000)


def test_breaking_out_and_iterating_again(id_arrays):
    loader = ll.Loader(id_arrays, batch_size=10, shuffle=True)
    for i, _ in enumerate(loader):
        if i == 3:
            break
    del _  # holding a batch of the old pass would be a batch beyond the pool
    loader.set_epoch(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the cancelled pass gave its slots back
        assert sorted(ids_of(loader)) == list(range(1000))


def test_consumer_wait_releases_the_gil(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    loader = ll.Loader(ll.FileSource([str(fifo)]), batch_size=1, collate="list", output="numpy")
    ticks = []
    stop = threading.Event()

    def count():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.001)

    counter = threading.Thread(target=count)
    counter.start()
    result = {}

    def consume():
        result["batch"] = next(iter(loader))

    consumer = threading.Thread(target=consume)
    consumer.start()
    time.sleep(0.3)
    before = len(ticks)
    time.sleep(0.3)
    assert len(ticks) > before + 50  # the other thread ran while the consumer waited
    with open(fifo, "wb"):  # unblock the worker (a FIFO has no size: an empty sample)
        pass
    consumer.join(5)
    stop.set()
    counter.join()
    assert len(result["batch"]["data"]) == 1
    loader.close()


CTRL_C_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    # Ctrl-C raises KeyboardInterrupt even when the suite runs as a background
    # job, whose children start with SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import leanloader as ll
    fifo = sys.argv[1]
    loader = ll.Loader(ll.FileSource([fifo]), batch_size=1, collate="list", output="numpy")
    print("ready", flush=True)
    for batch in loader:
        pass
    """
)


def test_ctrl_c_while_workers_are_blocked_exits_promptly(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    process = subprocess.Popen(
        [sys.executable, "-c", CTRL_C_SCRIPT, str(fifo)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout.readline().strip() == "ready"
    time.sleep(0.3)  # the worker is now blocked opening the FIFO
    started = time.monotonic()
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=10)
    elapsed = time.monotonic() - started
    assert elapsed < 5, elapsed  # (blocked for good would be never)
    assert "KeyboardInterrupt" in stderr
    assert "Fatal Python error" not in stderr
    assert stderr.count("Traceback") == 1


def test_close_while_worker_blocked_returns_promptly(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    loader = ll.Loader(ll.FileSource([str(fifo)]), batch_size=1, collate="list", output="numpy")
    iterator = iter(loader)
    outcome = {}

    def consume():
        try:
            outcome["batch"] = next(iterator, None)
        except ll.Error as error:
            outcome["error"] = error

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    time.sleep(0.2)
    started = time.monotonic()
    loader.close()
    assert time.monotonic() - started < 3
    thread.join(5)
    # The consumer that was waiting is told the pass ended with the loader.
    assert "closed" in str(outcome.get("error")), outcome
    with open(fifo, "wb"):  # let the detached worker finish
        pass


def test_numpy_output_works_without_torch(tmp_path):
    script = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None  # torch cannot be imported
        import numpy as np
        import leanloader as ll
        loader = ll.Loader({"x": np.arange(10)}, batch_size=4)
        assert loader.output == "numpy"
        batches = [b["x"] for b in loader]
        assert isinstance(batches[0], np.ndarray)
        assert [int(v) for b in batches for v in b] == list(range(10))
        print("ok")
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_forked_child_gets_a_clear_error_not_a_hang(id_arrays):
    loader = ll.Loader(id_arrays, batch_size=10, output="numpy")
    iterator = iter(loader)
    next(iterator)  # worker threads are running in the parent
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no worker threads exist here
        os.close(read)
        try:
            next(iterator)
            message = b"no error"
        except ll.Error as error:
            message = str(error).encode()
        try:
            list(loader)
        except ll.Error as error:
            message += b"|" + str(error).encode()
        os.write(write, message)
        os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    message = os.read(read, 4096).decode()
    os.close(read)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert message.count("forked child") == 2, message
    assert len([b for b in iterator]) == 99  # the parent goes on


def test_core_lists_every_safetensors_dtype_and_ships_type_stubs():
    import pathlib

    from leanloader import _core

    names = _core.dtype_names()
    assert {"BOOL", "U8", "I64", "F16", "BF16", "F32", "F64", "F8_E4M3", "F8_E5M2"} <= set(names)
    assert (pathlib.Path(_core.__file__).parent / "_core.pyi").is_file()


@pytest.mark.parametrize("dtype", ["c8", "c16"])
def test_complex_rows_from_arrays_and_npy_equal_numpys(tmp_path, dtype):
    values = (np.arange(24).reshape(6, 4) + 0.5j * np.arange(24)[::-1].reshape(6, 4)).astype(dtype)
    np.save(tmp_path / "z.npy", values)
    for source in (ll.ArraySource({"z": values}), ll.NpySource({"z": tmp_path / "z.npy"})):
        loader = ll.Loader(source, batch_size=4, output="numpy")
        rows = np.concatenate([batch["z"] for batch in loader])
        assert rows.dtype == values.dtype and rows.tobytes() == values.tobytes()
    torch = pytest.importorskip("torch")
    batch = next(iter(ll.Loader(ll.ArraySource({"z": values}), batch_size=6, output="torch")))
    assert batch["z"].dtype == {"c8": torch.complex64, "c16": torch.complex128}[dtype]
    assert torch.equal(batch["z"], torch.from_numpy(values))
    if dtype == "c16":  # safetensors has no complex128: refused naming it
        with pytest.raises(ValueError, match="'z' is C128, which safetensors has no dtype for"):
            ll.save_safetensors(tmp_path / "z.safetensors", {"z": values})


def test_array_source_rejects_a_dtype_it_cannot_carry():
    for dtype in ("datetime64[s]", "U2", object, np.longdouble, [("a", "i4")]):
        with pytest.raises(ValueError, match=r"'z': dtype .* cannot become a tensor"):
            ll.ArraySource({"z": np.zeros(4, dtype=dtype)})
    # the other byte order is named with the fix (it had been the binding's
    # "incompatible function arguments")
    with pytest.raises(ValueError, match=r"'>f4' is in the other byte order.*astype"):
        ll.ArraySource({"z": np.zeros(4, dtype=">f4")})


def test_seeds_and_epochs_outside_the_engine_s_range_are_value_errors():
    arrays = {"x": np.zeros((4, 2), np.float32)}
    with pytest.raises(ValueError, match=r"seed must be in \[0, 2\*\*64\), got -1"):
        ll.Loader(arrays, batch_size=2, seed=-1)
    with pytest.raises(ValueError, match="epoch must be"):
        ll.Loader(arrays, batch_size=2).set_epoch(2**64)
    assert ll.Loader(arrays, batch_size=2, seed=2**64 - 1).state_dict()["seed"] == 2**64 - 1


def test_arguments_of_the_wrong_type_are_named_with_what_was_given():
    """A str batch_size, a float num_threads, a str seed and a list in an
    ArraySource raised the binding's "incompatible function arguments" with
    its whole signature; NumPy integers and truthy flags are taken, as
    torch's DataLoader takes them."""
    arrays = {"x": np.arange(8, dtype=np.float32).reshape(4, 2)}
    for kwargs, message in (
        ({"batch_size": "2"}, "batch_size must be an int, got str '2'"),
        ({"batch_size": True}, "batch_size must be an int, got a bool"),
        ({"batch_size": 2, "num_threads": 1.5}, "num_threads must be an int, got float 1.5"),
        ({"batch_size": 2, "prefetch": None}, "prefetch must be an int, got NoneType"),
        ({"batch_size": 2, "seed": "1"}, "seed must be an int, got str '1'"),
    ):
        with pytest.raises(TypeError, match=re.escape(message)):
            ll.Loader(arrays, output="numpy", **kwargs)
    with pytest.raises(TypeError, match="'y': a list is not an array"):
        ll.ArraySource({"x": arrays["x"], "y": [1, 2, 3, 4]})
    loader = ll.Loader(arrays, batch_size=np.int64(2), shuffle=1, seed=np.uint64(3), output="numpy")
    assert sorted(int(v) for b in loader for v in b["x"][:, 0]) == [0, 2, 4, 6]


def test_npy_source_names_what_it_was_given_instead_of_a_path(tmp_path):
    # An array where a path goes was "expected str, bytes or os.PathLike";
    # a bytes path, the binding's signature.
    with pytest.raises(TypeError, match=r"field 'x'.*got an array \(ndarray\).*ll.ArraySource"):
        ll.NpySource({"x": np.zeros((2, 2))})
    with pytest.raises(TypeError, match="got int"):
        ll.NpySource(3)
    np.save(tmp_path / "x.npy", np.arange(6, dtype=np.int32).reshape(3, 2))
    source = ll.NpySource(os.fsencode(tmp_path / "x.npy"))
    assert len(source) == 3


def _evicted(path):
    """Drops the file's pages from the page cache; False where they stay
    (tmpfs keeps every page)."""
    with open(path, "rb") as file:
        os.fsync(file.fileno())  # dirty pages cannot be dropped
        os.posix_fadvise(file.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    completed = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return (
        completed.returncode == 0 and int(completed.stdout.split()[0]) < os.path.getsize(path) // 2
    )


@pytest.mark.parametrize("row_values", [1024, 65536])  # 4 KiB rows (mapped), 256 KiB (pread)
def test_rows_read_from_a_cold_page_cache_equal_numpys(tmp_path, row_values):
    """From a cold page cache the loader announces the next rows and the
    storage around them (noticed by pread misses, or by page faults for rows
    copied out of the mapping): the batches are still numpy's rows, byte for
    byte, in a file numpy wrote."""
    rows = 64 * 1024 * 1024 // (row_values * 4)  # 64 MiB
    rng = np.random.default_rng(3)
    np.save(tmp_path / "x.npy", rng.standard_normal((rows, row_values), dtype=np.float32))
    np.save(tmp_path / "id.npy", np.arange(rows, dtype=np.int64))
    if not _evicted(tmp_path / "x.npy"):
        pytest.skip("the file system keeps the file in memory, or fincore is missing")
    expected = np.load(tmp_path / "x.npy", mmap_mode="r")
    loader = ll.Loader(
        ll.NpySource({"x": tmp_path / "x.npy", "id": tmp_path / "id.npy"}),
        batch_size=16, shuffle=True, num_threads=2, output="numpy",
    )  # fmt: skip
    seen = 0
    for batch in loader:
        ids = np.asarray(batch["id"])
        assert np.asarray(batch["x"]).tobytes() == np.ascontiguousarray(expected[ids]).tobytes()
        seen += len(ids)
    assert seen == rows


DAEMON_CONSUMER_SCRIPT = """
import sys, threading, time, numpy as np, leanloader as ll
x = np.zeros((64, 1 << 20), dtype=np.uint8)
loader = ll.Loader(ll.ArraySource({"x": x}), batch_size=16, num_threads=1, output="numpy")
def consume():
    while True:
        for batch in loader:
            pass
threading.Thread(target=consume, daemon=True).start()
time.sleep(0.3)
sys.setswitchinterval(1.0)  # the exiting main thread keeps the GIL: the consumer waits for it
"""


def test_a_program_exits_cleanly_while_a_daemon_thread_waits_for_a_batch():
    """The exit handler cancels open passes; a daemon thread waiting in next()
    then took the GIL back while CPython finalized, and was ended with
    pthread_exit through the engine's frames (abort, rc 134, in some runs;
    in the others its "iteration was cancelled" traceback at exit). It now
    waits for the exit without a word."""
    for _ in range(3):
        result = subprocess.run([sys.executable, "-c", DAEMON_CONSUMER_SCRIPT],
                                capture_output=True, text=True, timeout=60)  # fmt: skip
        assert (result.returncode, result.stderr) == (0, ""), result.stderr[-2000:]


def test_a_batch_whose_warning_raises_is_not_counted_as_delivered():
    """With warnings as errors, a batch carrying a warning (here: the consumer
    holds more batches than the slots) raised instead of being returned, yet
    state_dict() counted it: resuming never delivered its samples."""
    x = np.arange(103 * 8).reshape(103, 8)
    x[:, 0] = np.arange(103)
    loader = ll.Loader(ll.ArraySource({"x": x}), batch_size=8, output="numpy", num_threads=1,
                       prefetch=1)  # fmt: skip
    held = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeWarning, match="holds more batches"):
            for batch in loader:
                held.append(batch)
    fresh = ll.Loader(ll.ArraySource({"x": x}), batch_size=8, output="numpy")
    fresh.load_state_dict(loader.state_dict())
    rest = [int(i) for batch in fresh for i in batch["x"][:, 0]]
    seen = [int(i) for batch in held for i in batch["x"][:, 0]]
    assert sorted(seen + rest) == list(range(103))
    assert loader.state_dict()["samples_consumed"] == len(seen)
