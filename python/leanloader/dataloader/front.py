"""The DataLoader class: torch's arguments, validation and the choice of
iterator (worker processes or native threads)."""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import pickle
import warnings
from typing import Any

from leanloader.dataloader import state as loader_state
from leanloader.dataloader.process_iter import ProcessIterator
from leanloader.dataloader.sharing import DatasetSharing
from leanloader.dataloader.thread_iter import ThreadIterator
from leanloader.dataloader.worker import (
    WorkerSetup,
)

FORK_REFUSED = (
    "ll.DataLoader does not start workers with fork: a forked worker inherits the parent's "
    "threads' locks (OpenMP, CUDA/ROCm contexts, allocator, OpenCV pools) and deadlocks at "
    "random batches once any of them exists (see pytorch/pytorch#45198, #40403). Use 'spawn' "
    "(the default) or 'forkserver'; pass force_fork=True to use fork anyway."
)
DEFAULT_WARN_COPY_BYTES = 64 << 20


def _import_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise ImportError(
            "ll.DataLoader wraps torch.utils.data datasets and needs torch; "
            "install torch, or use ll.Loader for leanloader's own sources"
        ) from None
    return torch


def _resolve_context(context: Any, force_fork: bool) -> Any:
    if context is None:
        context = "spawn"
    if isinstance(context, str):
        method = context
        context = multiprocessing.get_context(method)
    else:
        method = context.get_start_method()
    if method == "fork" and not force_fork:
        raise ValueError(FORK_REFUSED)
    return context


class DataLoader:
    """``torch.utils.data.DataLoader``'s arguments and batches, one copy of
    the dataset (see the module documentation).

    Extra keyword arguments: ``worker_mode`` (``"process"``, or ``"thread"``
    for map-style datasets whose ``__getitem__`` releases the GIL),
    ``force_fork``, ``share_threshold`` (bytes; arrays at least this large are
    shared once), ``shm_dir`` (default ``$LEANLOADER_SHM_DIR`` or /dev/shm),
    ``warn_copy_bytes`` (warn once when each worker would receive more than
    this many pickled bytes of dataset).
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
        persistent_workers: bool | None = None,
        in_order: bool = True,
        worker_mode: str = "process",
        force_fork: bool = False,
        share_threshold: int = 1 << 20,
        shm_dir: str | None = None,
        warn_copy_bytes: int = DEFAULT_WARN_COPY_BYTES,
    ) -> None:
        torch = _import_torch()
        if num_workers < 0:
            raise ValueError(f"num_workers must be non-negative, got {num_workers}")
        if timeout < 0:
            raise ValueError(f"timeout must be non-negative, got {timeout}")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError(
                "prefetch_factor option could only be specified in multiprocessing. "
                "let num_workers > 0 to enable multiprocessing, otherwise set prefetch_factor "
                "to None."
            )
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        if prefetch_factor is not None and prefetch_factor < 1:
            raise ValueError(f"prefetch_factor must be at least 1, got {prefetch_factor}")
        if worker_mode not in ("process", "thread"):
            raise ValueError(f"worker_mode must be 'process' or 'thread', got {worker_mode!r}")
        # torch's own DataLoader (never iterated, no workers) resolves and
        # validates sampler, batch_sampler, collate_fn and the dataset kind
        # exactly as torch does: the source of the batch order's parity.
        self._spec = torch.utils.data.DataLoader(
            dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler,
            batch_sampler=batch_sampler, num_workers=0, collate_fn=collate_fn,
            drop_last=drop_last, generator=generator,
        )  # fmt: skip
        self.dataset = dataset
        self.batch_size = self._spec.batch_size
        self.drop_last = drop_last
        self.sampler = self._spec.sampler
        self.batch_sampler = self._spec.batch_sampler
        self.generator = generator
        self.collate_fn = self._spec.collate_fn
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.prefetch_factor = prefetch_factor if prefetch_factor is not None else 2
        self.persistent_workers = (
            num_workers > 0 if persistent_workers is None else bool(persistent_workers)
        )
        self.in_order = in_order
        self.worker_mode = worker_mode
        self.share_threshold = share_threshold
        self.shm_dir = shm_dir
        self.warn_copy_bytes = warn_copy_bytes
        self.multiprocessing_context = (
            _resolve_context(multiprocessing_context, force_fork)
            if num_workers > 0 and worker_mode == "process"
            else None
        )
        self._sharing: DatasetSharing | None = None
        self._setup_bytes: bytes | None = None
        self._iterator: ProcessIterator | None = None
        self._warned_pin = False
        self._progress = loader_state.PassProgress()

    # torch's attributes that code reads off a DataLoader.
    @property
    def _index_sampler(self) -> Any:
        return self._progress.index_sampler(self, self._spec._index_sampler)

    @property
    def _dataset_kind(self) -> int:
        return self._spec._dataset_kind

    @property
    def _auto_collation(self) -> bool:
        return self._spec._auto_collation

    def __len__(self) -> int:
        return len(self._spec)

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
        self._progress.begin(self)
        return self._progress.counted(self, self._batches())

    def _batches(self) -> Any:
        if self.num_workers == 0:
            return self._pinned(self._progress.single_process(self, iter(self._spec)))
        if self.worker_mode == "thread":
            return self._pinned(ThreadIterator(self))
        if self.persistent_workers and self._iterator is not None and self._iterator.alive:
            self._iterator.reset()
            return self._pinned(self._iterator)
        iterator = ProcessIterator(self)
        if self.persistent_workers:
            self._iterator = iterator
        return self._pinned(iterator)

    def _pinned(self, iterator: Any) -> Any:
        if not self.pin_memory:
            return iterator
        import torch

        if not torch.cuda.is_available():
            if not self._warned_pin:
                self._warned_pin = True
                warnings.warn(
                    "pin_memory=True has no effect: CUDA is not available here",
                    stacklevel=3,
                )
            return iterator
        from torch.utils.data._utils.pin_memory import pin_memory

        return (pin_memory(batch) for batch in iterator)

    def setup_bytes(self) -> bytes:
        """The dataset (with collate_fn and worker_init_fn) pickled once, large
        arrays replaced by references to shared memory. Raises
        pickle.PicklingError naming the attribute path that cannot be pickled."""
        if self._setup_bytes is None:
            sharing = DatasetSharing(self.share_threshold, self.shm_dir)
            sharing.share_in_place(self.dataset)
            setup = WorkerSetup(
                self.dataset, self._dataset_kind, self._auto_collation, self.collate_fn,
                self.drop_last, self.worker_init_fn,
            )  # fmt: skip
            try:
                data = sharing.dumps(setup)
            except Exception as error:
                raise _pickling_error(setup, error) from error
            self._sharing, self._setup_bytes = sharing, data
            if len(data) > self.warn_copy_bytes:
                self._warn_copy(len(data))
        return self._setup_bytes

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
            stacklevel=4,
        )

    def close(self) -> None:
        """Stops persistent workers (also done when the loader is collected)."""
        if self._iterator is not None:
            self._iterator.shutdown()
            self._iterator = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def _pickling_error(setup: WorkerSetup, error: Exception) -> pickle.PicklingError:
    from leanloader.audit import _unpicklable_fix, find_unpicklable

    for name, value in (("dataset", setup.dataset), ("collate_fn", setup.collate_fn),
                        ("worker_init_fn", setup.worker_init_fn)):  # fmt: skip
        failing = find_unpicklable(value, name)
        if failing is not None:
            path, message, culprit = failing
            return pickle.PicklingError(
                f"cannot send the dataset to worker processes: {path} cannot be pickled "
                f"({message}); {_unpicklable_fix(culprit)}, or use num_workers=0"
            )
    return pickle.PicklingError(f"cannot send the dataset to worker processes: {error}")


# --- the multi-process iterator ----------------------------------------------------------
