"""pin_memory=True: torch's checks and warnings, and a pin thread (as torch's
``_pin_memory_loop``) that pins the next batches while the training loop
works on the current one, so that no pinning copy runs in the consumer's
thread. Batches keep their order."""

from __future__ import annotations

import queue
import threading
import warnings
from typing import Any

# A pin thread runs at most this many pinned batches ahead of the consumer.
PIN_AHEAD = 2
_POLL_S = 0.1


def pin_device(loader: Any) -> str | None:
    """The accelerator batches are pinned for, or None when nothing is pinned."""
    import torch

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
    if loader.pin_memory and not torch.accelerator.is_available():
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
    pinning = PinThread(iterator, device)
    if loader.persistent_workers:
        loader.__dict__["_pin_thread"] = pinning
    return pinning


class PinThread:
    """Reads `inner` in a thread, pins each batch, and hands them over in order."""

    def __init__(self, inner: Any, device: str) -> None:
        import torch

        self._inner = inner
        self._queue: queue.Queue = queue.Queue(maxsize=PIN_AHEAD)
        self._done = threading.Event()
        self._finished = False
        device_index = torch.accelerator.current_device_index()
        self._thread = threading.Thread(
            target=_pin_loop, args=(inner, self._queue, self._done, device, device_index),
            name="leanloader-pin-memory", daemon=True,
        )  # fmt: skip
        self._thread.start()

    def __iter__(self) -> PinThread:
        return self

    def __len__(self) -> int:
        return len(self._inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_inner"], name)

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
            return value
        self._finished = True
        self._thread.join()
        if kind == "end":
            raise StopIteration
        raise value

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
    torch.accelerator.set_device_index(device_index)
    while not done.is_set():
        try:
            item = ("batch", pin_memory(next(inner), device))
        except StopIteration:
            item = ("end", None)
        except BaseException as error:
            item = ("error", error)
        while not done.is_set():
            try:
                out.put(item, timeout=_POLL_S)
                break
            except queue.Full:
                continue
        if item[0] != "batch":
            return
