"""pin_memory=True: torch's checks and warnings, and a pin thread (as torch's
``_pin_memory_loop``) that pins the next batches while the training loop
works on the current one, so that no pinning copy runs in the consumer's
thread. Batches keep their order.

With worker processes on a CUDA GPU, the shared segments the workers write
batches into are page-locked in place (``InPlacePinning``): torch's pin
function then finds their tensors pinned already and copies nothing. A
segment goes back to the workers only after the copies the consumer queued
from it have run (``_core.DeviceReadFence``, src/device/device_read_fence.cc).
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from leanloader import _core

# A pin thread runs at most this many pinned batches ahead of the consumer.
PIN_AHEAD = 2
_POLL_S = 0.1


# LEANLOADER_PIN_IN_PLACE=1 opts in to page-locking batch segments in place.
# Off by default: on an H200 a batch copied under a side stream the fence had
# never seen and dropped outside its `with` block was overwritten before the
# copy ran (tests/gpu, docs/gpu.md). By default the pin thread copies every
# batch into torch's pinned memory, which torch fences on the copy's stream,
# as torch does. Read when a loader first pins.
def pin_in_place_enabled() -> bool:
    return os.environ.get("LEANLOADER_PIN_IN_PLACE", "0") == "1"


# The stand-in device of the tests (use_stand_in): (runtime, current stream).
_stand_in: tuple[Any, Callable[[], int]] | None = None
STAND_IN = "host-stand-in"


@contextlib.contextmanager
def use_stand_in(runtime: Any, current_stream: Callable[[], int]) -> Iterator[None]:
    """For tests on machines without a GPU: pin_memory=True pins batch
    segments through `runtime` (_core.host_stand_in_runtime(): CUDA's stream
    and event semantics on the CPU) as it would through CUDA, with
    `current_stream()` as torch's current stream; torch's own pin function
    (which needs an accelerator) is not called."""
    global _stand_in
    previous, _stand_in = _stand_in, (runtime, current_stream)
    try:
        yield
    finally:
        _stand_in = previous


def pin_device(loader: Any) -> str | None:
    """The accelerator batches are pinned for, or None when nothing is pinned."""
    import torch

    if loader.pin_memory and _stand_in is not None:
        return STAND_IN
    if not loader.pin_memory or not torch.accelerator.is_available():
        return None
    accelerator = torch.accelerator.current_accelerator()
    if accelerator is None or accelerator.type == "mps":
        return None
    return accelerator.type


def pin_setup(loader: Any) -> None:
    """torch's warnings when a pass starts (_BaseDataLoaderIter.__init__ / _reset)."""
    import torch

    if loader.pin_memory and loader.pin_memory_device:
        warnings.warn(
            "pin_memory_device is deprecated, the current accelerator will be used as the device,"
            f"ignore pin_memory_device='{loader.pin_memory_device}'.",
            stacklevel=4,
        )
    if loader.pin_memory and _stand_in is None and not torch.accelerator.is_available():
        warnings.warn(
            "'pin_memory' argument is set as true but no accelerator is found, "
            "then device pinned memory won't be used.",
            stacklevel=4,
        )
    accelerator = torch.accelerator.current_accelerator() if loader.pin_memory else None
    if loader.pin_memory and accelerator is not None and accelerator.type == "mps":
        warnings.warn(
            "'pin_memory' argument is set as true but not supported on MPS now, "
            "device pinned memory won't be used.",
            stacklevel=4,
        )


class InPlacePinning:
    """Page-locks the loader's batch segments where the workers wrote them,
    and holds a dropped batch's segment back from the workers until the
    device has run the copies queued from it on the consumer's streams (the
    streams current when next() returned a batch, and where it was dropped)."""

    def __init__(self, runtime: Any, current_stream: Callable[[], int]) -> None:
        self.runtime = runtime
        self.pinning = _core.HostPinning(runtime)
        self.fence = _core.DeviceReadFence(runtime, current_stream)
        self._current_stream = current_stream
        # Segments the runtime refused to page-lock (the pin thread copies
        # their batches instead, as torch does).
        self.refused = 0

    def adopt(self, segment: Any, size: int) -> Any:
        """A one-slot pool over a worker's batch segment, page-locked."""
        try:
            return _core.SlotPool.adopt(segment, size, 1, pinning=self.pinning)
        except RuntimeError:
            self.refused += 1
            return _core.SlotPool.adopt(segment, size, 1)

    def consumer_took_a_batch(self) -> None:
        self.fence.note_consumer_stream(self._current_stream())

    @property
    def pinned_bytes(self) -> int:
        """Bytes of batch segments page-locked now."""
        return self.pinning.pinned_bytes


def in_place_pinning(loader: Any) -> InPlacePinning | None:
    """The loader's in-place pinning of worker batch segments, when pinning
    applies to a CUDA device (made once per loader)."""
    device = pin_device(loader)
    if device is None or not pin_in_place_enabled() or loader.num_workers == 0:
        return None
    if device not in (STAND_IN, "cuda"):
        return None
    existing = loader.__dict__.get("_in_place_pinning")
    if existing is not None:
        return existing
    if device == STAND_IN:
        assert _stand_in is not None
        runtime, current_stream = _stand_in
    else:
        import torch

        index = torch.cuda.current_device()
        try:
            runtime = _core.cuda_runtime(index)
        except RuntimeError:
            return None  # torch's pin function pins a copy of each batch instead

        def current_stream() -> int:
            return torch.cuda.current_stream(index).cuda_stream

    made = InPlacePinning(runtime, current_stream)
    loader.__dict__["_in_place_pinning"] = made
    return made


def stop_previous_pass(loader: Any) -> None:
    """Ends the pin thread of a persistent iterator's previous pass (left
    early) before the iterator is reset."""
    previous = loader.__dict__.get("_pin_thread")
    if previous is not None:
        previous.stop()
        loader.__dict__["_pin_thread"] = None


def pinned(loader: Any, iterator: Any) -> Any:
    """`iterator`, its batches pinned by a pin thread when pinning applies."""
    device = pin_device(loader)
    if device is None:
        return iterator
    if loader.num_workers == 0:
        # torch's single-process iterator fetches and pins in the caller's
        # thread: no_grad, autocast, the default device and the order of the
        # global RNG's draws stay the caller's.
        return InlinePin(iterator, device)
    pinning = PinThread(iterator, device, loader.__dict__.get("_in_place_pinning"))
    if loader.persistent_workers:
        loader.__dict__["_pin_thread"] = pinning
    return pinning


class _Pinning:
    """An iterator over `_inner`'s batches that answers for it otherwise."""

    _inner: Any

    def __iter__(self) -> Any:
        return self

    def __len__(self) -> int:
        return len(self._inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_inner"], name)


class InlinePin(_Pinning):
    """Pins each batch of `inner` in the consumer's thread (num_workers=0)."""

    def __init__(self, inner: Any, device: str) -> None:
        self._inner = inner
        self._device = device

    def __next__(self) -> Any:
        batch = next(self._inner)
        if self._device == STAND_IN:
            return batch
        from torch.utils.data._utils.pin_memory import pin_memory

        return pin_memory(batch, self._device)

    def stop(self) -> None:
        pass


class PinThread(_Pinning):
    """Reads `inner` in a thread, pins each batch, and hands them over in order."""

    def __init__(self, inner: Any, device: str, in_place: InPlacePinning | None = None) -> None:
        import torch

        self._inner = inner
        self._in_place = in_place
        self._queue: queue.Queue = queue.Queue(maxsize=PIN_AHEAD)
        self._done = threading.Event()
        self._finished = False
        device_index = -1 if device == STAND_IN else torch.accelerator.current_device_index()
        self._thread = threading.Thread(
            target=_pin_loop, args=(inner, self._queue, self._done, device, device_index),
            name="leanloader-pin-memory", daemon=True,
        )  # fmt: skip
        self._thread.start()

    def __next__(self) -> Any:
        if self._finished:
            raise StopIteration
        while True:
            try:
                kind, value = self._queue.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    self._finished = True
                    raise RuntimeError("the pin_memory thread exited unexpectedly") from None
        if kind == "batch":
            if self._in_place is not None:
                self._in_place.consumer_took_a_batch()
            return value
        if kind == "error":
            raise value  # the pass goes on, as torch's pin thread passes errors through
        self._finished = True
        self._thread.join()
        raise StopIteration

    def stop(self) -> None:
        """Ends the thread (a pass left early); waits for the batch it is reading."""
        self._done.set()
        while self._thread.is_alive():
            try:
                self._queue.get(timeout=_POLL_S)
            except queue.Empty:
                pass
        self._finished = True

    def __del__(self) -> None:
        done = self.__dict__.get("_done")
        if done is not None:
            done.set()


def _pin_loop(inner: Any, out: queue.Queue, done: threading.Event, device: str,
              device_index: int) -> None:  # fmt: skip
    import torch
    from torch.utils.data._utils.pin_memory import pin_memory

    torch.set_num_threads(1)
    if device == STAND_IN:
        pin_memory = _unpinned
    else:
        torch.accelerator.set_device_index(device_index)
    while not done.is_set():
        try:
            item = ("batch", pin_memory(next(inner), device))
        except StopIteration:
            item = ("end", None)
        except BaseException as error:
            item = ("error", error)
        kind = item[0]
        while not done.is_set():
            try:
                out.put(item, timeout=_POLL_S)
                break
            except queue.Full:
                continue
        # The consumer holds the batch now: it, not this thread, drops it
        # last, on the consumer's streams (which a pinned segment's fence
        # records on).
        item = None
        if kind == "end":
            return


def _unpinned(batch: Any, _device: str) -> Any:
    return batch
