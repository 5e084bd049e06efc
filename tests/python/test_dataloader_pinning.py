"""ll.DataLoader(pin_memory=True) with worker processes: batch segments are
page-locked where the workers wrote them (no pin copy), and a dropped batch's
segment goes back to the workers only after the device copies queued from it
have run. The device here is the CPU stand-in runtime (CUDA's stream and event
semantics, host threads for streams); tests/gpu/ runs the same on CUDA."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import threading
import time

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import Dataset  # noqa: E402

import leanloader as ll  # noqa: E402
from leanloader import _core  # noqa: E402
from leanloader.dataloader import pin  # noqa: E402

ROW = 2048  # float32 values a sample


class Numbered(Dataset):
    def __len__(self) -> int:
        return 48

    def __getitem__(self, i: int):
        return torch.full((ROW,), float(i)), i


def wait_until(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


class CurrentStream(threading.local):
    """torch's current stream: per thread, the default stream until a thread
    sets another (`with torch.cuda.stream(side)`)."""

    def __init__(self, default: int) -> None:
        self.stream = default

    def __call__(self) -> int:
        return self.stream


@pytest.fixture(autouse=True)
def _in_place_opted_in(monkeypatch):
    """In-place pinning is opt-in until it has run on a GPU; these tests opt in."""
    monkeypatch.setenv("LEANLOADER_PIN_IN_PLACE", "1")


@pytest.fixture
def stand_in():
    """A stand-in device with a default and a side stream."""
    runtime = _core.host_stand_in_runtime()
    streams = {"default": runtime.create_stream(), "side": runtime.create_stream()}
    current = CurrentStream(streams["default"])
    with pin.use_stand_in(runtime, current):
        yield runtime, streams, current
    gc.collect()
    for stream in streams.values():
        runtime.drain(stream)
        runtime.destroy_stream(stream)


def test_batch_segments_are_page_locked_in_place_and_released_with_the_loader(stand_in):
    runtime, _streams, _current = stand_in
    loader = ll.DataLoader(Numbered(), batch_size=4, num_workers=2, pin_memory=True)
    reference = torch.utils.data.DataLoader(Numbered(), batch_size=4)
    for _epoch in range(3):
        for (values, labels), (want_values, want_labels) in zip(loader, reference, strict=True):
            assert torch.equal(values, want_values) and torch.equal(labels, want_labels)
            # The batch is the segment the worker wrote: pinned there, not copied.
            assert _core.find_shared_segment(values.data_ptr()) is not None
            pinning = loader._in_place_pinning
            assert runtime.registered_bytes == pinning.pinned_bytes > 0
    assert pinning.refused == 0
    assert pinning.fence.fenced_total > 0
    # Kept segments stay registered for the next pass, within the plan.
    assert runtime.registrations >= 1
    del loader, values, labels, pinning
    gc.collect()
    assert wait_until(lambda: runtime.registered_bytes == 0)


def _copy_every_batch(runtime, loader, device_stream, current, copy_stream):
    """Queues a slow copy of each batch's values on `copy_stream` (as
    `.to(device, non_blocking=True)` with a busy GPU), drops the batch at once,
    and returns (device block, expected first value) per batch."""
    copies = []
    for values, labels in loader:
        current.stream = copy_stream
        block = runtime.allocate(values.nbytes)
        runtime.delay(copy_stream, 20)
        runtime.copy_to_device(block, values.data_ptr(), values.nbytes, copy_stream)
        copies.append((block, labels.tolist(), values.nbytes))
        del values, labels  # dropped while the copy is still queued
        current.stream = device_stream
    return copies


def _check_copies(runtime, copies, stream):
    runtime.drain(stream)
    import numpy as np

    for block, labels, nbytes in copies:
        got = np.frombuffer(runtime.read(block, nbytes), dtype=np.float32).reshape(len(labels), ROW)
        assert got[:, 0].tolist() == [float(i) for i in labels]
        assert (got == got[:, :1]).all()
        runtime.free(block)


@pytest.mark.parametrize("stream", ["default", "side"])
def test_a_dropped_batch_is_not_overwritten_before_the_copy_queued_from_it_ran(stand_in, stream):
    # "default": the copy on the stream current when next() returned the
    # batch; "side": a prefetcher's copy and drop under another stream.
    runtime, streams, current = stand_in
    loader = ll.DataLoader(Numbered(), batch_size=2, num_workers=1, pin_memory=True,
                           prefetch_factor=2)  # fmt: skip
    copies = _copy_every_batch(runtime, loader, streams["default"], current, streams[stream])
    assert len(copies) == 24
    # Few segments served 24 batches: they were reused, each after its copy.
    assert runtime.registrations < 24
    _check_copies(runtime, copies, streams[stream])


def test_without_in_place_pinning_nothing_is_registered(stand_in, monkeypatch):
    runtime, _streams, _current = stand_in
    monkeypatch.setenv("LEANLOADER_PIN_IN_PLACE", "0")
    loader = ll.DataLoader(Numbered(), batch_size=4, num_workers=1, pin_memory=True)
    assert sum(len(labels) for _values, labels in loader) == 48
    assert runtime.registrations == 0
    assert "_in_place_pinning" not in loader.__dict__


# Run as scripts, each with a deadline: a deadlock fails the test instead of
# hanging the suite, and the interpreter's exit is part of what is checked.
SCRIPT = textwrap.dedent(
    """
    import functools, sys
    import torch
    from torch.utils.data import Dataset
    import leanloader as ll
    from leanloader import _core
    from leanloader.dataloader import pin

    class Rows(Dataset):
        def __init__(self, values, rows=12):
            self.values, self.rows = values, rows
        def __len__(self):
            return self.rows
        def __getitem__(self, i):
            return torch.full((self.values,), float(i)), i

    if __name__ == "__main__":
        runtime = _core.host_stand_in_runtime()
        stream = runtime.create_stream()
        current = functools.partial(int, stream)
        with pin.use_stand_in(runtime, current):
            {body}
        print("finished", flush=True)
    """
)


def run_script(tmp_path, body: str) -> subprocess.CompletedProcess:
    script = tmp_path / "pinning.py"
    script.write_text(SCRIPT.format(body=textwrap.indent(textwrap.dedent(body), " " * 8).strip()))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "finished" in result.stdout
    assert "leaked" not in result.stderr, result.stderr  # nanobind's count at exit
    return result


def test_large_segments_freed_per_batch_while_the_consumer_takes_the_next(tmp_path):
    # 96 MiB batches: above the size kept for reuse, each segment is
    # unregistered and freed when its fence passes, while the consumer thread
    # takes batches and the fence's thread waits.
    run_script(tmp_path, """
        loader = ll.DataLoader(Rows(8 << 20, 48), batch_size=3, num_workers=2, pin_memory=True)
        for epoch in range(2):
            for values, labels in loader:
                runtime.delay(stream, 5)
                assert values[:, 0].tolist() == [float(i) for i in labels]
        del values, labels
        assert loader._in_place_pinning.refused == 0
    """)  # fmt: skip


def test_dropping_the_loader_with_releases_pending_and_exiting_with_batches_alive(tmp_path):
    run_script(tmp_path, """
        loader = ll.DataLoader(Rows(1024), batch_size=4, num_workers=1, pin_memory=True)
        batches = list(loader)  # kept at exit (module level, as scripts do)
        runtime.delay(stream, 200)  # the device is still busy
        del batches[:2]
        del loader  # the fence goes with releases pending
        fence = _core.DeviceReadFence(runtime, current)
        fence.note_consumer_stream(stream)
        pool = _core.SlotPool.adopt(_core.SharedSegment.create(1 << 16), 1 << 16, 1,
                                    pinning=_core.HostPinning(runtime))
        hold = pool.hold(pool.acquire(), fence)
        del pool
        runtime.delay(stream, 200)
        del hold  # released under a pending read...
        del fence  # ...and the fence (its last reference) goes before it completes
    """)  # fmt: skip
