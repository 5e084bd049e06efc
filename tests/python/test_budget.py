"""The loader's memory budget: "auto", a hard cap that measurement confirms, pressure back-off."""

from __future__ import annotations

import os
import threading
import time
import warnings

import numpy as np
import pytest

import leanloader as ll
from leanloader import _core


def _write_rows(path, rows, row_floats):
    array = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, row_floats))
    for start in range(0, rows, 256):
        array[start : start + 256] = start
    array.flush()
    del array


class PeakSampler:
    """Samples this process's unreclaimable memory (Pss_Anon + Pss_Shmem) every 5 ms."""

    def __init__(self):
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(
                self.peak, _core.process_tree_memory(os.getpid())["unreclaimable_bytes"]
            )
            time.sleep(0.005)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def test_auto_budget_is_a_quarter_of_available_memory():
    # The budget reads the available memory again, and tests running beside
    # this one allocate and free meanwhile: compare with readings taken just
    # before and after, and retry until the two agree.
    for _ in range(20):
        before = _core.available_memory_bytes()
        budget = _core.auto_memory_budget()
        after = _core.available_memory_bytes()
        if before == after:
            break
    assert 0 < budget <= max(before, after) // 4 + 1
    loader = ll.Loader({"x": np.zeros((100, 10), np.float32)}, batch_size=10, memory_budget="auto")
    assert loader.memory_bill() <= _core.auto_memory_budget()


def test_budget_is_never_exceeded_measured(tmp_path):
    # 4 MiB rows, batch 4: 16 MiB per slot; the budget allows 3 slots of the
    # 6 that prefetch=4 would want.
    _write_rows(tmp_path / "rows.npy", 256, 1 << 20)
    budget = 3 * 16 * 2**20 + 2**20
    loader = ll.Loader(
        ll.NpySource(tmp_path / "rows.npy"),
        batch_size=4,
        shuffle=True,
        prefetch=4,
        memory_budget=budget,
        output="numpy",
    )
    assert loader.memory_bill() <= budget
    baseline = _core.process_tree_memory(os.getpid())["unreclaimable_bytes"]
    with PeakSampler() as sampler:
        for batch in loader:
            assert batch["rows"].shape == (4, 1 << 20)
        del batch
    growth = sampler.peak - baseline
    assert growth <= budget + 4 * 2**20, (growth, budget)  # + interpreter noise
    assert loader.stats()["resident_bytes"] <= budget


def test_backs_off_when_available_memory_is_below_the_threshold(tmp_path):
    _write_rows(tmp_path / "rows.npy", 256, 1 << 14)
    loader = ll.Loader(
        ll.NpySource(tmp_path / "rows.npy"),
        batch_size=8,
        prefetch=4,
        pressure_threshold="1000TB",  # far above what any machine has: always under pressure
        output="numpy",
    )
    with pytest.warns(RuntimeWarning, match="memory pressure") as caught:
        for _ in loader:
            assert loader.stats()["batches_in_flight"] <= 1
        del _
    assert sum("memory pressure" in str(w.message) for w in caught) == 1  # said once
    stats = loader.stats()
    assert stats["under_pressure"] and stats["window"] == 1 and stats["pressure_events"] == 1
    relaxed = ll.Loader(ll.NpySource(tmp_path / "rows.npy"), batch_size=8, prefetch=4)
    for _ in relaxed:
        pass
    stats = relaxed.stats()
    # Without pressure the window is the prefetch depth: one batch ahead,
    # deepened up to prefetch when the consumer waited (timing-dependent).
    assert not stats["under_pressure"] and 1 <= stats["window"] <= stats["prefetch"] == 4


def test_budget_is_kept_with_an_hdf5_source_of_multi_row_chunks(tmp_path):
    # h5py's gzip chunks of 8 rows x 1 MiB: besides the slots, the loader holds
    # the source's chunk cache and, per thread, a stored and a decoded chunk
    # (8 MiB). The budget covers all of it: 2 threads leave room for 3 slots.
    h5py = pytest.importorskip("h5py")
    rows, row_floats = 64, 1 << 18
    data = np.arange(rows * row_floats, dtype=np.float32).reshape(rows, row_floats) % 977
    with h5py.File(tmp_path / "x.h5", "w") as f:
        f.create_dataset("x", data=data, chunks=(8, row_floats), compression="gzip")
    source = ll.HDF5Source({"x": (str(tmp_path / "x.h5"), "x")}, chunk_cache="32MiB")
    slot = 4 * row_floats * 4
    held = 32 * 2**20 + 2 * source.per_thread_scratch_bytes
    assert source.per_thread_scratch_bytes > 8 * 2**20
    budget = held + 3 * slot
    loader = ll.Loader(
        source, batch_size=4, shuffle=True, num_threads=2, prefetch=4, memory_budget=budget,
        output="numpy",
    )  # fmt: skip
    assert loader.memory_bill() == budget
    baseline = _core.process_tree_memory(os.getpid())["unreclaimable_bytes"]
    with PeakSampler() as sampler:
        seen = 0
        for batch in loader:
            seen += batch["x"].shape[0]
        del batch
    assert seen == rows
    growth = sampler.peak - baseline
    assert growth <= budget + 4 * 2**20, (growth, budget)  # + interpreter noise
    with pytest.raises(ValueError, match="bytes per thread for 2 threads"):
        ll.Loader(source, batch_size=4, num_threads=2, memory_budget=held + slot)


def test_the_bill_holds_what_threads_decoding_images_hold(tmp_path):
    """Each thread holds an image's file bytes and its decoded pixels while it
    decodes; the bill counted only the batch slots (an 8 MiB budget was
    exceeded 20x by 4000x3000 PNGs, without a word)."""
    Image = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(0)
    (tmp_path / "c").mkdir()
    for i in range(6):
        pixels = rng.integers(0, 256, (1200, 1600, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(tmp_path / "c" / f"{i}.png", compress_level=0)
    file_bytes = (tmp_path / "c" / "0.png").stat().st_size
    source = ll.ImageFolder(tmp_path, transform=[ll.RandomResizedCrop(32)])
    assert source.per_thread_scratch_bytes >= file_bytes + 1200 * 1600 * 3
    loader = ll.Loader(source, batch_size=2, num_threads=2, prefetch=1, output="numpy")
    assert loader.memory_bill() >= 2 * source.per_thread_scratch_bytes
    baseline = _core.process_tree_memory(os.getpid())["unreclaimable_bytes"]
    with PeakSampler() as sampler:
        for _ in range(2):
            for batch in loader:
                assert batch["image"].shape == (2, 3, 32, 32)
    growth = sampler.peak - baseline
    # (growth can be smaller: memory earlier tests left in malloc's arenas is reused)
    assert growth <= loader.memory_bill() + 4 * 2**20, (growth, loader.memory_bill())
    with pytest.raises(ValueError, match="per thread"):
        ll.Loader(source, batch_size=2, num_threads=2, memory_budget="8MiB")
    # A JPEG is decoded at the DCT scale its resize allows: billed as such,
    # not as a full-size decode (which refused budgets that were enough).
    y, x = np.mgrid[0:1800, 0:2400]
    gradient = np.stack([x % 256, y % 256, (x + y) % 256], -1).astype(np.uint8)
    (tmp_path / "j" / "c").mkdir(parents=True)
    Image.fromarray(gradient).save(tmp_path / "j" / "c" / "0.jpg", quality=80)
    jpegs = ll.ImageFolder(tmp_path / "j", transform=[ll.RandomResizedCrop(64)])
    assert jpegs.per_thread_scratch_bytes < 1800 * 2400 * 3 // 4
    no_scaling = ll.ImageFolder(tmp_path / "j", transform=[ll.RandomResizedCrop(64)],
                                dct_scaling=False)  # fmt: skip
    assert no_scaling.per_thread_scratch_bytes > 2 * 1800 * 2400 * 3


def test_the_bill_holds_what_the_hdf5_library_holds_for_a_chunk_it_reads(tmp_path):
    """A dataset the HDF5 library reads (Fletcher-32 here) goes through
    H5Dread, which holds the stored chunk and its filters' output for each
    read: that was billed as nothing (16 MiB chunks, 8 MiB budget: measured
    +51-56 MiB, no word). The library's own state for a file it opened (its
    metadata cache, free lists: ~10 MiB measured) is left out of the bill."""
    h5py = pytest.importorskip("h5py")
    rng = np.random.default_rng(0)
    with h5py.File(tmp_path / "x.h5", "w") as f:
        x = f.create_dataset("x", (256, 16384), np.float32, chunks=(128, 16384),
                             compression="gzip", compression_opts=1, fletcher32=True)  # fmt: skip
        x[:] = rng.integers(0, 16, (256, 16384))
    source = ll.HDF5Source({"x": (str(tmp_path / "x.h5"), "x")}, chunk_cache="1MiB")
    assert source.layout(0)[0].startswith("library")
    loader = ll.Loader(source, batch_size=4, shuffle=True, num_threads=2, output="numpy")
    chunk = 128 * 16384 * 4
    assert source.per_thread_scratch_bytes == 3 * chunk
    baseline = _core.process_tree_memory(os.getpid())["unreclaimable_bytes"]
    with PeakSampler() as sampler:
        for i, batch in enumerate(loader):
            assert batch["x"].shape == (4, 16384)
            if i == 8:
                break
        del batch
    growth = sampler.peak - baseline
    assert growth <= loader.memory_bill() + 12 * 2**20, (growth, loader.memory_bill())


def test_a_sample_held_outside_the_planned_memory_is_told_once(tmp_path):
    """collate='list' plans slots from a typical sample; one much larger goes
    to the heap, outside memory_bill() and memory_budget. That was only a
    counter in stats(); the first such sample now warns, naming itself."""
    for i in range(40):
        (tmp_path / f"{i:02d}.bin").write_bytes(bytes(4 << 20 if i in (13, 33) else 1024))
    loader = ll.Loader(ll.FileSource(str(tmp_path / "*.bin")), batch_size=8, collate="list",
                       output="numpy")  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            sizes = [len(data) for batch in loader for data in batch["data"]]
            assert sizes.count(4 << 20) == 2 and len(sizes) == 40
    told = [str(w.message) for w in caught if "outside the planned memory" in str(w.message)]
    assert len(told) == 1, told
    named = [i for i in (13, 33) if f"sample {i} (" in told[0] and f"{i}.bin" in told[0]]
    assert len(named) == 1 and "4194304 bytes" in told[0], told
    assert loader.stats()["heap_fallback_bytes"] == 4 * (4 << 20)


def test_budget_values_are_read_alike_or_refused_naming_the_argument():
    source = ll.ArraySource({"x": np.zeros((100, 4), np.float32)})
    for budget in (" 2GiB ", "2GiB", 2 * 2**30, np.int64(2 * 2**30)):  # " 2GiB " was refused
        assert ll.Loader(source, batch_size=4, memory_budget=budget).memory_bill() > 0
    # "0" reached the slot arithmetic ("below two batch slots"), 2**70 the
    # binding's "incompatible function arguments"
    for budget in ("0", 0, -1, 2**70, 1e20):
        with pytest.raises(ValueError, match="memory_budget must be positive and below 2"):
            ll.Loader(source, batch_size=4, memory_budget=budget)
    assert ll.Loader(source, batch_size=4, memory_budget=1e9).memory_bill() > 0
    with pytest.raises(ValueError, match="memory_budget must be a whole number of bytes"):
        ll.Loader(source, batch_size=4, memory_budget=2.5)  # was 2 bytes
    with pytest.raises(ValueError, match="memory_budget: not a byte size"):
        ll.Loader(source, batch_size=4, memory_budget="inf")
    with pytest.raises(ValueError, match="pressure_threshold must be positive"):
        ll.Loader(source, batch_size=4, pressure_threshold=0)
