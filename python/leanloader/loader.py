"""ll.Loader: batches from a Source, assembled by native threads into planned slots."""

from __future__ import annotations

import atexit
import importlib.util
import os
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

from leanloader import _core
from leanloader.arguments import integer
from leanloader.distributed import resolve_rank, state_from_dict, state_to_dict
from leanloader.sources import as_source


def _default_output() -> str:
    return "torch" if importlib.util.find_spec("torch") is not None else "numpy"


def _default_threads() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(8, cores))


def _device_index(device: Any) -> int | None:
    """The CUDA device index `device` names ("cuda", "cuda:1", torch.device), or
    None for the CPU stand-in ("host-stand-in")."""
    text = str(device)
    if text == "host-stand-in":
        return None
    kind, _, index = text.partition(":")
    if kind != "cuda" or (index and not index.isdigit()):
        raise ValueError(
            f"device must be 'cuda', 'cuda:N' or a torch.device of type cuda, got {device!r}"
        )
    if index:
        return int(index)
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.current_device()
    except ImportError:
        pass
    return 0


def _device_runtime(device: Any, output: str) -> Any:
    index = _device_index(device)
    if index is None:
        return _core.host_stand_in_runtime()
    if output != "torch":
        raise ValueError("device='cuda' gives torch tensors: use output='torch'")
    return _core.cuda_runtime(index)  # a clear RuntimeError without CUDA


def _consumer_stream(runtime: Any) -> int:
    """The stream the training loop's work runs on now: torch's current stream on
    the device (0, CUDA's default stream, without torch's CUDA)."""
    if not runtime.is_cuda:
        return 0
    import torch

    if not torch.cuda.is_available():
        return 0
    index = int(runtime.name.partition(":")[2])
    return int(torch.cuda.current_stream(index).cuda_stream)


def _budget_bytes(memory_budget: int | str | None, what: str = "memory_budget") -> int | None:
    if memory_budget is None:
        return None
    if isinstance(memory_budget, bool):
        raise TypeError(f"{what} must be a byte count or a size string like '2GiB'")
    if isinstance(memory_budget, str) and memory_budget.strip() == "auto":
        return _core.auto_memory_budget()
    if isinstance(memory_budget, float):
        if not memory_budget.is_integer():
            raise ValueError(f"{what} must be a whole number of bytes, got {memory_budget!r}")
        value = int(memory_budget)
    elif isinstance(memory_budget, str):
        try:
            value = _core.parse_byte_size(memory_budget.strip())
        except ValueError as error:
            raise ValueError(f"{what}: {error}") from None
    else:
        value = integer(what, memory_budget)
    if not 0 < value < 2**64:
        raise ValueError(f"{what} must be positive and below 2**64 bytes, got {memory_budget!r}")
    return value


def _unsigned_64(what: str, value: Any) -> int:
    """`value` when it is an int the engine takes (0 <= value < 2**64);
    else a ValueError or TypeError that says so."""
    value = integer(what, value)
    if not 0 <= value < 2**64:
        raise ValueError(f"{what} must be in [0, 2**64), got {value}")
    return value


class Loader:
    """Iterates batches of ``source``: a dict ``name -> tensor`` per batch.

    Batches are assembled by ``num_threads`` native threads straight into a
    fixed set of batch slots (``memory_bill()`` bytes, planned before the first
    batch) and handed over without a copy: each tensor views its slot, and the
    slot is reused once every tensor of the batch is gone.

    The order is a function of ``(seed, epoch)`` only, never of the thread
    count. Each ``iter(loader)`` runs the current epoch and then advances it;
    ``set_epoch(e)`` picks the epoch of the next iteration (as
    ``DistributedSampler.set_epoch``).

    ``output``: ``"torch"`` (default when torch is installed) or ``"numpy"``.
    ``collate``: ``"stack"`` (one tensor per field) or ``"list"`` (one tensor per
    sample, for samples of different shapes). ``on_error``: ``"raise"`` or
    ``"skip"`` (bad samples are dropped and reported at the end of the epoch, a
    batch left with none is not delivered, except with ``world_size`` > 1,
    where it arrives empty so that every rank takes the same steps; more than
    ``max_skip_fraction`` of the epoch raises).

    ``prefetch``: the most batches prepared ahead of the one delivered. The
    loader starts one batch ahead (with the batch the loop holds: two slots
    of memory) and goes one deeper, up to ``prefetch``, each time the consumer
    had to wait for a batch after the threads had spent at least 5% of their
    time held back by the window: a consumer whose steps vary around the
    loader's pace gets the depth, a loop that always waits for the loader (or
    never does) keeps the memory. ``stats()["window"]`` is the depth now.

    ``memory_budget``: bytes (``4 << 30``), a size (``"2GiB"``) or ``"auto"`` (a
    quarter of the memory still available to this process, cgroup-aware); it
    caps ``memory_bill()``: what the source holds comes first, the batch slots
    get the rest (at least two, else a ValueError says what took the budget).
    ``pressure_threshold``: when available memory falls
    below it (default: a tenth of the memory this process can use), the loader
    keeps one batch in flight, gives idle slots back, says so once, and returns
    to its prefetch depth when memory recovers.

    ``rank``/``world_size``: this process's share of each epoch. When not
    given, they come from an initialised ``torch.distributed`` process group,
    else from ``RANK``/``WORLD_SIZE``, else a single process. Rank *r* takes
    global batches *r*, *r + W*, ... of the epoch's global order, so global
    batch *k* is the same samples whatever the world size, and ranks never
    communicate. ``drop_last=False`` pads the last round with whole batches
    that wrap to the epoch's start (as ``DistributedSampler``); ``True`` trims
    to whole global batches, a multiple of the world size of them. See
    docs/distributed.md.

    ``state_dict()``/``load_state_dict()``: save and resume the position
    (epoch, global samples consumed) in O(1) time and space.

    ``device``: ``"cuda"``, ``"cuda:N"`` or a ``torch.device``: batch slots are
    page-locked in place (no pinned copy per batch) and each batch is copied to
    the GPU on a stream of its own, up to ``prefetch_to_device`` batches ahead
    of the one delivered; the stream current at ``next()`` waits for the copy
    (no host sync), and a host slot is reused once its copy is done.
    ``device_bill()`` is the GPU memory this takes: ``prefetch_to_device + 2``
    batches (those copied ahead, the one delivered and the previous one the
    loop still holds). Use each batch on the stream that was current when it
    was delivered. Needs the CUDA runtime (a CUDA build of torch or libcudart);
    without it ``device="cuda"`` raises ``RuntimeError``. See docs/gpu.md.

    ``follow_updates``: a source that can change (a ``TensorCache`` rebuilt
    with more entries, HDF5 files written since they were opened) is read
    through immutable snapshots, one per epoch. ``True`` (default): each
    epoch starts on the source's current contents; ``len()`` changes then,
    and the epoch's first batch warns once (with ``world_size`` > 1 a new size
    is a ``ValueError``: ranks would take different numbers of steps). ``False``: the loader keeps
    reading the snapshot it was made with (an HDF5 file written since is
    then a ``FormatError``: its old rows are gone).
    """

    def __init__(
        self,
        source: Any,
        batch_size: int = 1,
        shuffle: bool = False,
        seed: int = 0,
        num_threads: int | None = None,
        prefetch: int = 2,
        memory_budget: int | str | None = None,
        drop_last: bool = False,
        output: str | None = None,
        on_error: str = "raise",
        max_skip_fraction: float = 0.05,
        collate: str = "stack",
        pressure_threshold: int | str | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        follow_updates: bool = True,
        device: Any = None,
        prefetch_to_device: int = 1,
    ) -> None:
        self.source = as_source(source)
        self.output = output or _default_output()
        if self.output not in ("torch", "numpy"):
            raise ValueError(f"output must be 'torch' or 'numpy', got {self.output!r}")
        if self.output == "torch":
            import torch  # noqa: F401  (fail here, clearly, when torch is missing)
        self.batch_size = batch_size
        self.rank, self.world_size = resolve_rank(rank, world_size)
        self._feed = None
        self._runtime = None
        self._pinning = None
        if device is not None:
            if collate != "stack":
                raise ValueError("device= needs collate='stack' (one tensor per field)")
            if isinstance(prefetch_to_device, bool) or not isinstance(prefetch_to_device, int):
                raise TypeError("prefetch_to_device must be an int")
            if prefetch_to_device < 0:
                raise ValueError(f"prefetch_to_device must be >= 0, got {prefetch_to_device}")
            self._runtime = _device_runtime(device, self.output)
            self._pinning = _core.HostPinning(self._runtime)
        self._core = _core.Loader(
            self.source,
            batch_size=integer("batch_size", batch_size),
            shuffle=bool(shuffle),
            seed=_unsigned_64("seed", seed),
            num_threads=integer("num_threads", num_threads)
            if num_threads is not None
            else _default_threads(),
            prefetch=integer("prefetch", prefetch),
            memory_budget=_budget_bytes(memory_budget),
            drop_last=bool(drop_last),
            on_error=on_error,
            max_skip_fraction=max_skip_fraction,
            collate=collate,
            pressure_threshold=_budget_bytes(pressure_threshold, "pressure_threshold"),
            rank=self.rank,
            world_size=self.world_size,
            follow_updates=bool(follow_updates),
            pinning=self._pinning,
        )
        if not _open_loaders:
            # (again at each first loader: exit handlers run last-registered
            # first, so ours then runs before those of modules imported
            # since, h5py's among them)
            atexit.unregister(_close_open_loaders)
            atexit.register(_close_open_loaders)
        _open_loaders.add(self)
        if self._runtime is not None:
            self._feed = _core.DeviceFeed(self._runtime, self._core.slot_bytes, prefetch_to_device)
        self.last_indices: list[int] = []

    def __len__(self) -> int:
        return len(self._core)

    def set_epoch(self, epoch: int) -> None:
        self._core.set_epoch(_unsigned_64("epoch", epoch))

    @property
    def epoch(self) -> int:
        """The epoch the next iteration will run."""
        return self._core.epoch

    def state_dict(self) -> dict[str, Any]:
        """Where this loader stands, as a small dict of numbers and a fingerprint.

        ``epoch`` and ``samples_consumed`` (of that epoch's global order, by all
        ranks together: this rank's delivered batches × ``world_size`` ×
        ``batch_size``, as in lockstep training) locate the next undelivered
        batch; ``seed``, ``shuffle``, ``num_samples`` and ``source_fingerprint``
        make sure the position means the same samples when loaded. The size
        does not depend on the dataset's size.

        After a pass left early (a ``break``), the state still locates the
        rest of that pass: a restart from it continues there. Iterating this
        loader again instead starts its next epoch, as a new pass over torch's
        DataLoader does; ``load_state_dict(state_dict())`` first continues the
        pass here.
        """
        return state_to_dict(self._core.state())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state``: the next iteration continues that epoch from its
        saved global position, with the same batches an uninterrupted run would
        have given. The world size (and batch size) may differ from the saver's:
        the same global order continues from the same global position. A state
        from another source or order raises ``ValueError``. O(1)."""
        self._core.load_state(state_from_dict(state))

    def memory_bill(self) -> int:
        """Planned bytes, known before any batch: batch slots (slots × slot bytes) plus
        what the source holds: its cache budget (``HDF5Source``'s decoded chunks)
        and, per thread, what one read may hold besides the batch (an
        ``HDF5Source``'s stored chunk before it is decoded and a decoded chunk
        of several rows, or three chunks of a dataset the HDF5 library reads;
        an image's file bytes, decoded pixels and resize buffers). With
        ``collate="list"`` a sample larger than what is left of its slot is
        held outside it (warned once; ``stats()["heap_fallback_bytes"]``)."""
        return self._core.memory_bill()

    def device_bill(self) -> int:
        """Planned device bytes with ``device=``: ``(prefetch_to_device + 2) ×`` the
        batch slot size; 0 without a device."""
        return self._feed.device_bill if self._feed is not None else 0

    def stats(self) -> dict[str, Any]:
        """Time per stage (seconds), slots in use, bytes in flight, samples skipped;
        with ``device=``: ``pinned_bytes`` (slots page-locked now),
        ``device_resident_bytes``, ``device_copies_completed``."""
        stats = self._core.stats()
        if self._feed is not None:
            stats["pinned_bytes"] = self._pinning.pinned_bytes
            stats["device_resident_bytes"] = self._feed.device_resident_bytes
            stats["device_copies_completed"] = self._feed.copies_completed
            stats["device_overflow_total"] = self._feed.overflow_total
        return stats

    def __iter__(self) -> Iterator[dict[str, Any]]:
        iterator = self._core.iterate()
        feed = self._feed
        if feed is not None:
            feed.reset()
        try:
            while True:
                if feed is None:
                    item = iterator.next_batch(self.source, self.output)
                else:
                    stream = _consumer_stream(self._runtime)
                    item = iterator.next_batch(self.source, self.output, feed, stream)
                    if not self._runtime.is_cuda:
                        # The stand-in's "device" is host memory read by this
                        # thread: wait as a stream would.
                        self._runtime.drain(stream)
                if item is None:
                    break
                batch, self.last_indices = item
                yield batch
            skipped = iterator.skipped_count
            if skipped:
                details = "\n".join(f"  {message}" for _, message in iterator.skipped()[:10])
                warnings.warn(
                    f"epoch {iterator.epoch}: skipped {skipped} bad sample(s):\n{details}",
                    RuntimeWarning,
                    stacklevel=2,
                )
        finally:
            iterator.cancel()

    def close(self) -> None:
        """Stops the worker threads; the loader cannot iterate afterwards."""
        self._feed = None  # waits for its copies in flight
        self._core.close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        core = getattr(self, "_core", None)
        if core is not None:
            core.close()


# Loaders still open when the program exits are closed by an exit handler,
# which runs before the interpreter starts finalizing: a reading thread that
# asked for the GIL after that point (h5py's lock around every HDF5 call is
# taken with it) was ended by CPython with pthread_exit, whose unwinding
# through the engine's noexcept thread frame aborted the process (rc 134 in
# 6 of 7 runs of a script that left an HDF5 pass unfinished).
_open_loaders: weakref.WeakSet[Loader] = weakref.WeakSet()


def _close_open_loaders() -> None:
    # A daemon thread waiting for a batch wakes when its pass is cancelled;
    # it must not take the GIL back then (CPython may be finalizing).
    _core.mark_interpreter_exiting()
    for loader in list(_open_loaders):
        try:
            loader.close()
        except Exception:
            pass  # at exit: the others still get closed
