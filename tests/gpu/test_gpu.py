"""GPU tests of the device feed (`make test-gpu`; not part of `make test`).

They need a CUDA build of torch and an NVIDIA GPU, and skip with a reason
otherwise. Run them on a machine with a GPU and quote the results.
"""

from __future__ import annotations

import gc
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import leanloader as ll  # noqa: E402

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA build of torch and an NVIDIA GPU"
)


def arrays(n: int = 512, width: int = 1 << 16) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "x": rng.standard_normal((n, width), dtype=np.float32),
        "label": np.arange(n, dtype=np.int64),
    }


def test_batches_on_the_device_equal_the_host_batches():
    data = arrays()
    on_device = ll.Loader(data, batch_size=64, shuffle=True, seed=1, device="cuda")
    on_host = ll.Loader(data, batch_size=64, shuffle=True, seed=1)
    for _epoch in range(2):
        for device_batch, host_batch in zip(on_device, on_host, strict=True):
            assert device_batch["x"].is_cuda
            assert torch.equal(device_batch["x"].cpu(), host_batch["x"])
            assert torch.equal(device_batch["label"].cpu(), host_batch["label"])


def test_slots_are_page_locked_in_place_not_copied():
    loader = ll.Loader(arrays(), batch_size=64, device="cuda")
    host = ll.Loader(arrays(), batch_size=64)
    for _batch in loader:
        pass
    stats = loader.stats()
    assert stats["pinned_bytes"] == stats["resident_bytes"] > 0
    # The same slot memory is registered: no pinned staging buffer exists.
    assert stats["pinned_bytes"] <= loader.memory_bill()
    del host


def test_copies_overlap_with_a_busy_compute_stream():
    data = arrays(n=512, width=1 << 18)  # 64 MiB batches of 64, 8 a pass
    loader = ll.Loader(data, batch_size=64, device="cuda", prefetch_to_device=1)
    a = torch.randn(4096, 4096, device="cuda")

    def step(batch_x: torch.Tensor) -> None:
        nonlocal a
        for _ in range(4):
            a = a @ a / 4096  # a busy kernel on the current stream
        batch_x.sum()

    for batch in loader:  # the first pass pins the slots and allocates device blocks
        step(batch["x"])
    torch.cuda.synchronize()
    start = time.perf_counter()
    steps = 0
    for batch in loader:
        step(batch["x"])
        steps += 1
    torch.cuda.synchronize()
    with_loader = time.perf_counter() - start
    resident_batch = torch.from_numpy(data["x"][:64].copy()).cuda()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step(resident_batch)
    torch.cuda.synchronize()
    resident_time = time.perf_counter() - start
    print(f"step time with the loader {with_loader / steps * 1e3:.2f} ms, data resident "
          f"{resident_time / steps * 1e3:.2f} ms")  # fmt: skip
    assert with_loader <= resident_time * 1.5


def test_no_pinned_memory_leaks_over_thirty_epochs():
    loader = ll.Loader(arrays(n=256), batch_size=64, device="cuda")
    peaks = []
    for _epoch in range(30):
        for _batch in loader:
            pass
        stats = loader.stats()
        # Every pinned byte is a slot the pool holds now, within the bill.
        assert stats["pinned_bytes"] == stats["resident_bytes"] <= loader.memory_bill()
        peaks.append(stats["pinned_bytes"])
    # Slots are made (and pinned) when first needed: an epoch may need one
    # more than the first did (an H200 run: 2 slots in epoch 1, 3 from epoch
    # 2 on), and then no growth.
    assert max(peaks[10:]) <= max(peaks[:10])
    loader.close()
    del loader, _batch
    gc.collect()


def _nvml_figures() -> tuple[int, int | None]:
    """(device used bytes, this process's used bytes or None) from NVML."""
    import os

    gpu = ll.memory_report()["gpu"][torch.cuda.current_device()]
    mine = [p["used_bytes"] for p in gpu["processes"] if p["pid"] == os.getpid()]
    return gpu["used_bytes"], (mine[0] if mine else None)


def test_nvml_process_figure_is_close_to_torchs():
    if ll.memory_report()["gpu"] is None:
        pytest.skip("no NVML")
    torch.cuda.init()
    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    _, context = _nvml_figures()  # the CUDA context and torch's first small block
    context_reserved = torch.cuda.memory_reserved()
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    used, mine = _nvml_figures()
    mib = 2**20
    print(f"NVML device used {used / mib:.0f} MiB, this process {mine and mine / mib} MiB; "
          f"torch allocated {torch.cuda.memory_allocated() / mib:.0f} MiB, reserved "
          f"{torch.cuda.memory_reserved() / mib:.0f} MiB, "
          f"context {context and context / mib} MiB")  # fmt: skip
    assert used >= torch.cuda.memory_allocated()
    if mine is None or context is None:
        pytest.skip("NVML gives no per-process figure here (a container's PID namespace)")
    expected = context + torch.cuda.memory_reserved() - context_reserved
    assert abs(mine - expected) <= 0.05 * expected
    del x


# --- ll.DataLoader(pin_memory=True): worker segments page-locked in place --------------
# (opt-in, LEANLOADER_PIN_IN_PLACE=1, until these have passed on a GPU)


@pytest.fixture(autouse=True)
def _in_place_opted_in(monkeypatch):
    monkeypatch.setenv("LEANLOADER_PIN_IN_PLACE", "1")


class Numbered(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 96

    def __getitem__(self, i: int):
        return torch.full((1 << 16,), float(i)), i


def test_dataloader_pin_memory_pins_worker_segments_in_place():
    from leanloader import _core

    loader = ll.DataLoader(Numbered(), batch_size=8, num_workers=2, pin_memory=True)
    for values, labels in loader:
        assert values.is_pinned() and labels.is_pinned()
        # The tensor is the segment the worker wrote: torch's pin function
        # found it pinned and copied nothing.
        assert _core.find_shared_segment(values.data_ptr()) is not None
        on_device = values.to("cuda", non_blocking=True)
        assert torch.equal(on_device[:, 0].cpu(), labels.float())
    pinning = loader._in_place_pinning
    assert pinning.refused == 0 and pinning.pinned_bytes > 0


@pytest.mark.parametrize("pattern", ["current", "side"])
def test_dataloader_non_blocking_copies_are_not_overwritten_by_later_batches(pattern):
    # "current": copy on the stream current at next(); "side": a prefetcher's
    # copy and drop under `with torch.cuda.stream(side)`.
    loader = ll.DataLoader(Numbered(), batch_size=4, num_workers=1, pin_memory=True)
    side = torch.cuda.Stream()
    copies = []
    for _epoch in range(3):
        for values, labels in loader:
            # Keep the GPU busy (~tens of ms): each copy queues behind, while
            # the worker writes the next batches at once.
            torch.cuda._sleep(50_000_000)
            if pattern == "side":
                with torch.cuda.stream(side):
                    side.wait_stream(torch.cuda.current_stream())
                    copies.append((values.to("cuda", non_blocking=True), labels.tolist()))
                    del values, labels  # the batch is dropped on the side stream
            else:
                copies.append((values.to("cuda", non_blocking=True), labels.tolist()))
                del values, labels
    torch.cuda.synchronize()
    for on_device, labels in copies:
        expected = torch.tensor(labels, dtype=torch.float32, device="cuda")[:, None]
        assert torch.equal(on_device, expected.expand_as(on_device))


@pytest.mark.parametrize(
    ("in_place", "busy"),
    [
        ("0", "compute"),
        ("0", "side"),
        # Measured on an H200 (2026-11-27): 63 of 72 copies differ. The fence
        # never saw the side stream (next() and the drop ran on the current
        # one), so it let the segment go before the copy queued there ran.
        # In-place pinning stays opt-in while this holds.
        pytest.param(
            "1", "side",
            marks=pytest.mark.xfail(strict=True, reason="in-place pinning: side-stream copy "
                                    "of a batch dropped outside the block is not fenced"),
        ),
    ],
)  # fmt: skip
def test_side_stream_copies_of_batches_dropped_outside_the_block(monkeypatch, in_place, busy):
    # The pattern of issue 27: copy under `with torch.cuda.stream(side)`, drop
    # the batch after the block, with a busy kernel queued before the copy on
    # the compute stream or on the side stream itself.
    monkeypatch.setenv("LEANLOADER_PIN_IN_PLACE", in_place)
    loader = ll.DataLoader(Numbered(), batch_size=4, num_workers=1, pin_memory=True,
                           persistent_workers=True)  # fmt: skip
    side = torch.cuda.Stream()
    copies = []
    for _epoch in range(3):
        for values, labels in loader:
            if busy == "compute":
                torch.cuda._sleep(20_000_000)
            with torch.cuda.stream(side):
                side.wait_stream(torch.cuda.current_stream())
                if busy == "side":
                    torch.cuda._sleep(20_000_000)
                copies.append((values.to("cuda", non_blocking=True), labels.tolist()))
            del values, labels  # outside the block
    torch.cuda.synchronize()
    differ = 0
    for on_device, labels in copies:
        expected = torch.tensor(labels, dtype=torch.float32, device="cuda")[:, None]
        differ += not torch.equal(on_device, expected.expand_as(on_device))
    assert differ == 0, f"{differ} of {len(copies)} copied batches differ from their source"


def test_dataloader_pinned_segments_do_not_grow_over_thirty_epochs():
    loader = ll.DataLoader(Numbered(), batch_size=8, num_workers=2, pin_memory=True,
                           persistent_workers=True)  # fmt: skip
    pinned = []
    for _epoch in range(30):
        most = 0
        for values, _labels in loader:
            values.to("cuda", non_blocking=True)
            most = max(most, loader._in_place_pinning.pinned_bytes)
        pinned.append(most)
    # The most pinned during an epoch: the segments kept and those in flight.
    assert 0 < max(pinned[5:]) <= max(pinned[:5])
    del loader, values
    gc.collect()
