"""The DataLoader class: a subclass of ``torch.utils.data.DataLoader`` (torch's
arguments, validation, attribute guard, warnings and generic type), with
leanloader's iterators: worker processes sharing one copy of the dataset,
native threads, or the single-process iterator."""

from __future__ import annotations

import multiprocessing
import warnings
from typing import Any, TypeVar

try:
    import torch
    from torch.utils.data import DataLoader as _TorchDataLoader
except ImportError:  # pragma: no cover - exercised without torch only
    raise ImportError(
        "ll.DataLoader wraps torch.utils.data datasets and needs torch; "
        "install torch, or use ll.Loader for leanloader's own sources"
    ) from None

from leanloader.dataloader import state as loader_state
from leanloader.dataloader.fork_server import (
    default_context,
    initialised_gpu_runtime,
    start_fork_server_early,
)
from leanloader.dataloader.options import option
from leanloader.dataloader.pin import pin_setup, pinned, stop_previous_pass
from leanloader.dataloader.process_iter import ProcessIterator
from leanloader.dataloader.script_guard import refuse_unguarded_main
from leanloader.dataloader.sharing import pickling_error
from leanloader.dataloader.single_iter import SingleProcessIterator
from leanloader.dataloader.thread_iter import ThreadIterator
from leanloader.dataloader.worker import WorkerSetup

FORK_REFUSED = (
    "ll.DataLoader does not fork workers from a process whose {runtime} runtime is initialised: "
    "a forked worker inherits the parent's GPU context and its threads' locks and deadlocks or "
    "fails at random batches (see pytorch/pytorch#45198, #40403). Use 'forkserver' (the "
    "default) or 'spawn', create the loader's workers before the first GPU call, or pass "
    "force_fork=True to fork anyway."
)
_T_co = TypeVar("_T_co", covariant=True)


class DataLoader(_TorchDataLoader[_T_co]):
    """``torch.utils.data.DataLoader``'s arguments, defaults and batches, one
    copy of the dataset (see the package documentation for what differs).

    Extra keyword arguments: ``worker_mode`` (``"process"``, or ``"thread"``
    for map-style datasets whose ``__getitem__`` releases the GIL),
    ``force_fork``, ``share_threshold`` (bytes; arrays and tensors at least
    this large reach the workers through one shared copy), ``share_in_place``
    (move those arrays and tensors of the dataset itself into shared memory
    instead of sharing a copy: no second copy in the main process, but the
    dataset's arrays are replaced and its tensors' storage moved), ``shm_dir``
    (a tmpfs directory for shared memory; default ``$LEANLOADER_SHM_DIR``,
    else anonymous shared memory (memfd), which no /dev/shm size limits), ``warn_copy_bytes`` (warn
    once when each worker would receive more than this many pickled bytes of
    dataset). Each is None by default: what ``ll.install(**options)`` set
    (``dataloader/options.py``), else ``worker_mode="process"``,
    ``force_fork=False``, ``share_threshold=1 MiB``, ``share_in_place=False``,
    ``warn_copy_bytes=64 MiB``; ``multiprocessing_context=None`` too takes an
    installed default.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int = 0,
        collate_fn: Any = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Any = None,
        multiprocessing_context: Any = None,
        generator: Any = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        worker_mode: str | None = None,
        force_fork: bool | None = None,
        share_threshold: int | None = None,
        share_in_place: bool | None = None,
        shm_dir: str | None = None,
        warn_copy_bytes: int | None = None,
    ) -> None:
        # None: what ll.install(**options) set (dataloader/options.py), else
        # the documented default.
        worker_mode = option("worker_mode", worker_mode)
        # (a num_workers torch refuses reaches its check below first)
        if isinstance(num_workers, int | float) and num_workers > 0 and worker_mode == "process":
            # (torch refuses a context without workers: an installed start
            # method is for loaders that start processes)
            multiprocessing_context = option("multiprocessing_context", multiprocessing_context)
        if worker_mode not in ("process", "thread"):
            raise ValueError(f"worker_mode must be 'process' or 'thread', got {worker_mode!r}")
        self._progress = loader_state.PassProgress()
        self._default_context: Any = None
        self.worker_mode = worker_mode
        super().__init__(
            dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn,
            pin_memory, drop_last, timeout, worker_init_fn, multiprocessing_context, generator,
            prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device, in_order=in_order,
        )  # fmt: skip
        self.force_fork = option("force_fork", force_fork)
        self._refuse_fork()
        self.share_threshold = option("share_threshold", share_threshold)
        self.share_in_place = option("share_in_place", share_in_place)
        self.shm_dir = option("shm_dir", shm_dir)
        self.warn_copy_bytes = option("warn_copy_bytes", warn_copy_bytes)
        self._sharing: Any = None
        self._sharing_ahead: Any = None
        self._warned_copy = False
        if self.worker_mode == "process" and self.num_workers > 0:
            method = self._context.get_start_method()
            if method == "forkserver":
                # A fresh fork server imports torch and the dataset's module
                # while the program goes on (a framework builds its model and
                # optimizer between making the loader and iterating it): the
                # first pass's workers fork from a server that is ready.
                start_fork_server_early(type(dataset).__module__, self._context)
            if method != "fork" and not self.share_in_place:
                # Likewise the shared copies of large arrays and tensors
                # (those that cost no memory: sharing.py, SharingAhead).
                from leanloader.dataloader.sharing import DatasetSharing, SharingAhead

                self._sharing_ahead = SharingAhead(
                    DatasetSharing(self.share_threshold, self.shm_dir), dataset
                )

    # torch's attribute that the batch order comes from, recorded for state_dict().
    @property
    def _index_sampler(self) -> Any:
        return self._progress.index_sampler(self, super()._index_sampler)

    def _refuse_fork(self) -> None:
        """fork asked for by name is honoured, as torch honours it (its own
        tests and frameworks ask for it), unless a GPU runtime is already
        initialised in this process: that is the deadlock of seed 003."""
        context = self.multiprocessing_context
        if (
            context is not None
            and self.worker_mode == "process"
            and context.get_start_method() == "fork"
            and not self.force_fork
        ):
            runtime = initialised_gpu_runtime()
            if runtime is not None:
                raise ValueError(FORK_REFUSED.format(runtime=runtime))

    @property
    def _context(self) -> Any:
        """The start method's context the workers are started with. As in
        torch, the loader's own, else the start method the program set with
        multiprocessing.set_start_method() (spawn or forkserver); else, where
        torch would fork, leanloader's own fork server (fork_server.py). Where
        no GPU runtime is initialised at the first pass of such a loader, that
        server is a fork of this process: it holds what the program imported,
        in pages shared with this process, and its workers start from a
        process without the program's threads or GPU runtime. Else, and for a
        forkserver asked for by name, it is a fresh interpreter (as safe as
        spawn) that preloads torch, numpy, leanloader and the dataset's module
        once, so workers share those pages instead of each importing its own
        copy."""
        context = self.multiprocessing_context
        if context is not None:
            return context
        chosen = multiprocessing.get_start_method(allow_none=True)
        if chosen in ("spawn", "forkserver"):
            return multiprocessing.get_context(chosen)
        if self._default_context is None:
            self._default_context = default_context()
        return self._default_context

    def state_dict(self) -> dict[str, Any]:
        """Where this loader stands (see ``dataloader/state.py``): the RNG state its
        sampler drew the current pass from, batches yielded, the sampler's and the
        dataset's own state when they have one."""
        return loader_state.state_dict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next pass gives the batches an uninterrupted run would
        have given after the saved point."""
        loader_state.load_state_dict(self, state)

    def __iter__(self) -> Any:
        # torch's hook: a subclass's _get_iterator() (frameworks wrap batches
        # there) is what a pass iterates, as in torch.
        return self._get_iterator()

    def _get_iterator(self) -> Any:
        """The iterator over one pass: new workers, or the persistent ones
        reset (torch's __iter__ does that part; here every pass goes
        through this hook, so a subclass's override sees each pass)."""
        self._progress.begin(self)
        stop_previous_pass(self)
        if self.persistent_workers and self.num_workers > 0:
            if self._iterator is None or not self._iterator.alive:
                if self._iterator is not None:
                    self._iterator.shutdown()  # (a worker died: the others go too)
                self._iterator = self._new_iterator()
            else:
                self._iterator._reset(self)  # (torch's pin warnings come once, not here)
            inner = self._iterator
        else:
            inner = self._new_iterator()
        return self._progress.counted(self, pinned(self, inner))

    def _new_iterator(self) -> Any:
        pin_setup(self)
        if self.num_workers == 0:
            return SingleProcessIterator(self)
        self.check_worker_number_rationality()
        if self.prefetch_factor is not None and self.prefetch_factor <= 0:
            # torch accepts 0 when built and refuses it here (no batch would
            # ever be asked for: an epoch of nothing, silently).
            raise AssertionError(
                "prefetch_factor must be greater than 0 for MultiProcessingDataLoaderIter"
            )
        if self.worker_mode == "thread":
            return ThreadIterator(self)
        refuse_unguarded_main()
        self._refuse_fork()  # (the context may have been set after construction)
        return ProcessIterator(self)

    # --- what worker processes receive ------------------------------------------------------

    def dataset_sharing(self) -> Any:
        """The loader's shared copies of large arrays and tensors (kept for
        its lifetime, reused by every pass)."""
        if self._sharing is None and self._sharing_ahead is not None:
            self._sharing, self._sharing_ahead = self._sharing_ahead.wait(), None
        if self._sharing is None:
            from leanloader.dataloader.sharing import DatasetSharing

            self._sharing = DatasetSharing(self.share_threshold, self.shm_dir)
            if self.share_in_place:
                self._sharing.share_in_place(self.dataset)
        return self._sharing

    def worker_setup(self, dataset: Any = None, worker_init_fn: Any = None) -> WorkerSetup:
        return WorkerSetup(
            self.dataset if dataset is None else dataset, self._dataset_kind,
            self._auto_collation, self.collate_fn, self.drop_last,
            self.worker_init_fn if worker_init_fn is None else worker_init_fn,
        )  # fmt: skip

    def setup_bytes(self, setup: WorkerSetup | None = None) -> bytes:
        """The dataset (with collate_fn and worker_init_fn) pickled once, large
        arrays and tensors replaced by references to shared copies. Raises
        pickle.PicklingError naming the attribute path that cannot be pickled."""
        setup = self.worker_setup() if setup is None else setup
        sharing = self.dataset_sharing()
        try:
            data = sharing.dumps(setup)
        except Exception as error:
            raise pickling_error(setup, error) from error
        if len(data) > self.warn_copy_bytes and not self._warned_copy:
            self._warned_copy = True
            self._warn_copy(len(data))
        return data

    def _warn_copy(self, size: int) -> None:
        from leanloader.audit import audit
        from leanloader.units import format_bytes

        report = audit(self.dataset, threshold=max(1, min(1 << 20, self.warn_copy_bytes // 8)))
        worst = sorted(report.entries, key=lambda e: -e.bytes_leanloader)[:3]
        details = "; ".join(
            f"{e.path} ({format_bytes(e.bytes_leanloader)}): {e.fix}" for e in worst
        )
        warnings.warn(
            f"each of the {self.num_workers} workers receives its own {format_bytes(size)} copy of "
            f"the dataset. Largest parts: {details or 'see ll.audit(dataset)'}",
            stacklevel=5,
        )

    def close(self) -> None:
        """Stops persistent workers now. Without it they stop when their
        iterator is collected: with the loader, unless the user still holds
        the iterator (as torch's, it keeps working without its loader)."""
        iterator = self.__dict__.get("_iterator")
        if iterator is not None:
            iterator._shutdown_workers()
            self.__dict__["_iterator"] = None


__all__ = ["DataLoader", "torch"]
