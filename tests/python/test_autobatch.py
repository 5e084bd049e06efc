"""AutoBatch: shrink by 25% on out-of-memory, retry the same samples, grow back."""

from __future__ import annotations

import pytest
import torch

import leanloader as ll


class OomAbove:
    """A training step that raises the real torch.OutOfMemoryError above `limit` samples."""

    def __init__(self, limit: int, error=torch.OutOfMemoryError) -> None:
        self.limit = limit
        self.error = error
        self.calls: list[list[int]] = []  # every attempt, failed or not
        self.done: list[list[int]] = []  # the micro-batches that succeeded

    def __call__(self, chunk):
        samples = chunk.tolist() if hasattr(chunk, "tolist") else list(chunk)
        self.calls.append(samples)
        if len(samples) > self.limit:
            raise self.error("CUDA out of memory. Tried to allocate 2.00 GiB")
        self.done.append(samples)
        return len(samples)


def test_shrinks_by_a_quarter_and_retries_the_same_samples():
    step = OomAbove(5)
    auto = ll.AutoBatch(step, start=8, warmup_steps=1000)
    batch = torch.arange(20)
    results = auto(batch)
    # 8 fails -> 6 fails -> 4 fits (8 x 0.75 = 6, 6 x 0.75 = 4).
    assert [len(c) for c in step.calls[:3]] == [8, 6, 4]
    assert step.calls[0][:4] == step.calls[2]  # the same data retried
    assert auto.size == 4 and auto.oom_count == 2
    # Every sample processed exactly once, in order.
    assert [s for chunk in step.done for s in chunk] == list(range(20))
    assert results == [4, 4, 4, 4, 4]


def test_grows_back_after_a_stable_warmup_and_shrinks_again():
    step = OomAbove(5)
    auto = ll.AutoBatch(step, start=4, max_size=16, warmup_steps=3)
    for _ in range(4):
        auto(torch.arange(12))
    sizes = [len(c) for c in step.calls]
    # Three successes at 4 -> grows to 5 (4 x 1.25); three at 5 -> 6 fails -> back to 4.
    assert sizes[:3] == [4, 4, 4]
    assert 5 in sizes and 6 in sizes
    assert auto.oom_count >= 1
    assert max(len(c) for c in step.done) == 5
    assert [s for chunk in step.done for s in chunk] == list(range(12)) * 4


def test_growth_stops_at_max_size():
    step = OomAbove(100)
    auto = ll.AutoBatch(step, start=2, max_size=5, warmup_steps=1)
    for _ in range(10):
        auto(list(range(10)))
    assert auto.size == 5
    assert max(len(c) for c in step.calls) == 5
    assert auto.oom_count == 0


def test_memory_error_and_runtime_out_of_memory_count_as_oom():
    step = OomAbove(2, error=MemoryError)
    auto = ll.AutoBatch(step, start=4, warmup_steps=100)
    assert auto(list(range(6))) == [2, 2, 2]
    assert auto.oom_count == 2  # 4 -> 3 -> 2
    mps = OomAbove(1, error=RuntimeError)  # "MPS backend out of memory" style
    assert ll.AutoBatch(mps, start=2)(list(range(3))) == [1, 1, 1]


def test_oom_at_min_size_is_raised():
    step = OomAbove(0)
    auto = ll.AutoBatch(step, start=3, min_size=2)
    with pytest.raises(torch.OutOfMemoryError):
        auto(torch.arange(6))
    assert auto.size == 2
    assert [len(c) for c in step.calls] == [3, 2]


def test_other_errors_propagate_unchanged():
    def step(chunk):
        raise KeyError("not memory")

    auto = ll.AutoBatch(step, start=4)
    with pytest.raises(KeyError, match="not memory"):
        auto(list(range(8)))
    assert auto.size == 4 and auto.oom_count == 0

    def bad_shapes(chunk):
        raise RuntimeError("shape mismatch")  # a RuntimeError that is not about memory

    with pytest.raises(RuntimeError, match="shape mismatch"):
        ll.AutoBatch(bad_shapes, 2)([1, 2])


def test_dict_batches_are_sliced_field_by_field():
    seen = []

    def step(chunk):
        assert chunk["image"].shape[0] == chunk["label"].shape[0]
        if chunk["image"].shape[0] > 3:
            raise torch.OutOfMemoryError("out of memory")
        seen.extend(chunk["label"].tolist())

    batch = {"image": torch.zeros(10, 3, 8, 8), "label": torch.arange(10)}
    auto = ll.AutoBatch(step, start=5)
    auto(batch)
    assert seen == list(range(10))
    assert auto.size == 3
    with pytest.raises(ValueError, match="differ in length"):
        auto({"a": torch.zeros(3), "b": torch.zeros(4)})


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="min_size"):
        ll.AutoBatch(print, start=1, min_size=0)
    with pytest.raises(ValueError, match="start"):
        ll.AutoBatch(print, start=10, max_size=4)
    with pytest.raises(ValueError, match="max_size"):
        ll.AutoBatch(print, start=2, min_size=3, max_size=2)
    with pytest.raises(ValueError, match="warmup_steps"):
        ll.AutoBatch(print, start=2, warmup_steps=0)
