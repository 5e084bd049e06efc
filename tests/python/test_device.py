"""ll.Loader(device=...): the device feed through the CPU stand-in runtime (same
C++ ordering code as CUDA, host memory and threads for the GPU), and the clear
errors without CUDA. The GPU itself is tested by `make test-gpu` (tests/gpu/)."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

import leanloader as ll


def arrays(n: int = 200) -> dict[str, np.ndarray]:
    return {
        "x": np.arange(n * 6, dtype=np.float32).reshape(n, 2, 3),
        "label": np.arange(n, dtype=np.int64),
    }


@pytest.mark.parametrize("prefetch_to_device", [0, 1, 3])
def test_device_batches_equal_host_batches_over_epochs(prefetch_to_device):
    data = arrays()
    on_device = ll.Loader(data, batch_size=32, shuffle=True, seed=3, device="host-stand-in",
                          prefetch_to_device=prefetch_to_device)  # fmt: skip
    on_host = ll.Loader(data, batch_size=32, shuffle=True, seed=3)
    for _epoch in range(3):
        count = 0
        for device_batch, host_batch in zip(on_device, on_host, strict=True):
            assert torch.equal(device_batch["x"], host_batch["x"])
            assert torch.equal(device_batch["label"], host_batch["label"])
            count += 1
        assert count == 7
    stats = on_device.stats()
    assert stats["device_overflow_total"] == 0
    assert stats["device_copies_completed"] <= 21
    assert on_device.device_bill() == (prefetch_to_device + 2) * stats["slot_bytes"]
    assert stats["device_resident_bytes"] <= on_device.device_bill()


def test_pinned_bytes_are_the_slots_and_are_released_with_the_loader():
    loader = ll.Loader(arrays(), batch_size=16, device="host-stand-in")
    runtime = loader._runtime
    for _epoch in range(30):
        for _batch in loader:
            pass
        stats = loader.stats()
        # Every slot the pool made is page-locked once, in place; nothing more.
        assert stats["pinned_bytes"] == stats["resident_bytes"]
        assert stats["pinned_bytes"] <= loader.memory_bill()
        assert runtime.registered_bytes == stats["pinned_bytes"]
    assert runtime.registrations <= loader.stats()["slots_total"]
    loader.close()
    del loader
    gc.collect()
    assert runtime.registered_bytes == 0
    # The last batch is still held: its device block outlives the loader...
    assert runtime.allocated_bytes > 0
    del _batch
    assert runtime.allocated_bytes == 0  # ...and is freed with it


def test_breaking_out_of_an_epoch_and_starting_again():
    loader = ll.Loader(arrays(), batch_size=16, device="host-stand-in", prefetch_to_device=2)
    reference = ll.Loader(arrays(), batch_size=16)
    for device_batch, host_batch in zip(loader, reference, strict=False):
        assert torch.equal(device_batch["x"], host_batch["x"])
        break
    # The batches copied ahead of the abandoned pass are dropped.
    assert [b["label"].tolist() for b in loader] == [b["label"].tolist() for b in reference]


def test_cuda_without_a_usable_gpu_is_a_clear_error():
    if ll._core.cuda_device_count() > 0:
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError, match=r"device='cuda' needs the CUDA runtime"):
        ll.Loader(arrays(), batch_size=4, device="cuda")
    with pytest.raises(RuntimeError, match=r"device='cuda' needs the CUDA runtime"):
        ll.Loader(arrays(), batch_size=4, device=torch.device("cuda", 0))


@pytest.mark.parametrize(
    "options,error,match",
    [
        ({"device": "tpu"}, ValueError, "device must be 'cuda'"),
        ({"device": "cuda:x"}, ValueError, "device must be 'cuda'"),
        ({"device": "cuda", "output": "numpy"}, ValueError, "output='torch'"),
        ({"device": "host-stand-in", "collate": "list"}, ValueError, "collate='stack'"),
        ({"device": "host-stand-in", "prefetch_to_device": -1}, ValueError, ">= 0"),
        ({"device": "host-stand-in", "prefetch_to_device": 1.5}, TypeError, "an int"),
    ],
)
def test_bad_device_options_are_refused(options, error, match):
    with pytest.raises(error, match=match):
        ll.Loader(arrays(), batch_size=4, **options)


def test_without_a_device_there_is_no_device_bill():
    loader = ll.Loader(arrays(), batch_size=4)
    assert loader.device_bill() == 0
    assert "pinned_bytes" not in loader.stats()


def test_bench_gpu_says_it_needs_a_gpu(tmp_path):
    import subprocess
    import sys

    if ll._core.cuda_device_count() > 0:
        pytest.skip("a GPU is present")
    result = subprocess.run(
        [sys.executable, "-m", "leanloader.cli", "bench", "gpu", "--quick", "--data-dir",
         str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1
    assert "bench gpu needs a CUDA device" in result.stderr
