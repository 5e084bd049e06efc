"""ll.DataLoader: torch's DataLoader API over an existing Python dataset, with
one copy of the dataset instead of one per worker.

What differs from ``torch.utils.data.DataLoader`` (the batches and their order
do not: the same samplers, the same base seed drawn from ``generator`` at the
same moment, batch i sent to worker i % num_workers, the same fetchers, the
same per-worker seeding of random / numpy / torch):

- Workers are started by spawn (default) or forkserver, never by fork:
  ``multiprocessing_context="fork"`` is refused unless ``force_fork=True``
  (fork deadlocks once CUDA, OpenMP or any thread exists). Workers are
  persistent unless ``persistent_workers=False``; they start in the
  background while the first batches are requested.
- The dataset is pickled once, in the main process, into bytes that every
  worker receives. Before that, NumPy arrays of at least ``share_threshold``
  bytes reachable through its attributes are moved into shared memory (the
  attribute is replaced by an equal array backed by the shared segment) and
  CPU tensors are moved like ``Tensor.share_memory_()`` would; workers map
  those segments instead of receiving the bytes. ``np.memmap`` arrays are
  re-mapped from their file. ``ll.SharedRecords`` travel as a reference.
- Collated batches come back through shared-memory batch slots (a SlotPool
  reserved with posix_fallocate, sized from the first batch): the main process
  wraps them without copying; a slot is reused when the batch is dropped.
  The first ``prefetch_factor * num_workers`` batches, batches larger than a
  slot, batches sent while every slot is held by the user, and any leaf that
  is not a CPU tensor / numeric NumPy array (strings, Python objects) travel
  pickled through the worker's pipe.
- A worker killed by a signal raises ``RuntimeError`` naming the worker, the
  signal and its samples within ``timeout`` (or 5 s); an exception in the
  dataset or collate_fn is re-raised with its own type, args and the worker's
  traceback (as a note).
- Shared memory is unlinked as soon as it is created: nothing is left in
  /dev/shm after any exit, SIGKILL included; workers die with the main
  process (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import io
import itertools
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import sys
import time
import warnings
import weakref
from typing import Any

from leanloader import _core
from leanloader.workers import (
    NUMPY_TO_NAME,
    WorkerSetup,
    rebuild_array,
    rebuild_error,
    rebuild_memmap,
    rebuild_tensor,
    segment_reference,
    torch_dtype_names,
    unpack_batch,
    worker_main,
)

FORK_REFUSED = (
    "ll.DataLoader does not start workers with fork: a forked worker inherits the parent's "
    "threads' locks (OpenMP, CUDA/ROCm contexts, allocator, OpenCV pools) and deadlocks at "
    "random batches once any of them exists (see pytorch/pytorch#45198, #40403). Use 'spawn' "
    "(the default) or 'forkserver'; pass force_fork=True to use fork anyway."
)
# How often the main process checks worker liveness while it waits.
POLL_S = 0.1
# A dead worker is reported within this time when timeout is 0.
DEATH_REPORT_S = 5.0
# Slots beyond the prefetch depth, for batches the user keeps alive.
EXTRA_SLOTS = 4
# A slot is this much larger than the largest batch seen (batches vary).
SLOT_HEADROOM = 1.25
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


# --- sharing the dataset once -------------------------------------------------------------


class _Sharing:
    """Moves large arrays of a dataset into shared memory and pickles it with
    references to those segments. Holds every segment it created (and so the
    descriptors that workers attach through) for the loader's lifetime."""

    def __init__(self, threshold: int, shm_dir: str | None) -> None:
        self.threshold = threshold
        self.shm_dir = shm_dir
        self.segments: list[Any] = []
        self.moved_tensors: dict[int, Any] = {}  # old storage address -> shared storage
        self.torch = sys.modules.get("torch")

    def share_in_place(self, dataset: Any) -> int:
        """Replaces large NumPy arrays held in attributes, dicts and lists by
        equal arrays in shared memory. Returns the bytes moved."""
        import numpy as np

        from leanloader.audit import walk

        moved = 0
        replacements = []
        for _path, value, container, key in walk(dataset):
            if container is None or isinstance(container, tuple):
                continue
            if self._should_move_array(value, np):
                replacements.append((container, key, value))
        for container, key, value in replacements:
            shared = self._to_segment(value, np)
            if isinstance(container, (dict, list)):
                container[key] = shared
            else:
                try:
                    setattr(container, key, shared)
                except (AttributeError, TypeError):
                    continue  # read-only attribute: the pickler copies it instead
            moved += int(value.nbytes)
        return moved

    def _should_move_array(self, value: Any, np: Any) -> bool:
        return (
            type(value) is np.ndarray
            and value.nbytes >= self.threshold
            and value.dtype.str in NUMPY_TO_NAME
            and _owns_its_bytes(value, np)
            and _core.find_shared_segment(value.__array_interface__["data"][0]) is None
        )

    def _to_segment(self, array: Any, np: Any) -> Any:
        segment = _core.SharedSegment.create(max(1, int(array.nbytes)), self.shm_dir)
        self.segments.append(segment)
        segment.write(0, np.ascontiguousarray(array))
        shared = segment.array(0, NUMPY_TO_NAME[array.dtype.str], list(array.shape), "numpy")
        return shared.view(array.dtype)

    def dumps(self, obj: Any) -> bytes:
        buffer = io.BytesIO()
        _SharingPickler(buffer, self).dump(obj)
        return buffer.getvalue()

    def reduce_array(self, array: Any) -> Any:
        import mmap

        import numpy as np

        if isinstance(array, np.memmap) and isinstance(array.base, mmap.mmap) and array.filename:
            mode = "r" if array.mode in ("r", "c") else "r+"
            order = "F" if array.flags.f_contiguous and not array.flags.c_contiguous else "C"
            return (
                rebuild_memmap,
                (array.filename, array.dtype.str, mode, int(array.offset), array.shape, order),
            )
        if array.dtype.str not in NUMPY_TO_NAME or array.nbytes < self.threshold:
            return NotImplemented
        address = array.__array_interface__["data"][0]
        segment = _core.find_shared_segment(address)
        if segment is None or not array.flags.c_contiguous:
            shared = self._to_segment(array, np)  # one copy for all workers
            address = shared.__array_interface__["data"][0]
            segment = _core.find_shared_segment(address)
        offset = address - segment.address
        return (rebuild_array, (segment_reference(segment), offset, array.dtype.str, array.shape))

    def reduce_tensor(self, tensor: Any) -> Any:
        torch = self.torch
        if tensor.device.type != "cpu" or tensor.is_sparse or tensor.is_quantized:
            return NotImplemented
        if tensor.grad_fn is not None or tensor.dtype not in torch_dtype_names():
            return NotImplemented
        storage = tensor.untyped_storage()
        if storage.nbytes() < self.threshold:
            return NotImplemented
        segment = _core.find_shared_segment(storage.data_ptr())
        if segment is None:
            storage = self._move_tensor(tensor)
            segment = _core.find_shared_segment(storage.data_ptr())
        offset = storage.data_ptr() - segment.address
        dtype = str(tensor.dtype).removeprefix("torch.")
        parameter = isinstance(tensor, torch.nn.Parameter)
        return (
            rebuild_tensor,
            (segment_reference(segment), offset, storage.nbytes(), dtype,
             tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()),
             bool(tensor.requires_grad), parameter),
        )  # fmt: skip

    def _move_tensor(self, tensor: Any) -> Any:
        """Moves the tensor's storage into a segment in place (as
        Tensor.share_memory_() does): the tensor object, its values and its
        views in the main process stay as they were."""
        torch = self.torch
        old = tensor.untyped_storage()
        shared_storage = self.moved_tensors.get(old.data_ptr())
        if shared_storage is None:
            segment = _core.SharedSegment.create(max(1, old.nbytes()), self.shm_dir)
            self.segments.append(segment)
            raw = segment.array(0, "U8", [old.nbytes()], "torch")
            raw.copy_(torch.empty(0, dtype=torch.uint8).set_(old))
            shared_storage = raw.untyped_storage()
            self.moved_tensors[old.data_ptr()] = shared_storage
        with torch.no_grad():
            moved = torch.empty(0, dtype=tensor.dtype).set_(
                shared_storage, tensor.storage_offset(), tensor.shape, tensor.stride()
            )
            tensor.data = moved
        return shared_storage


def _owns_its_bytes(array: Any, np: Any) -> bool:
    """True when no other array sees `array`'s bytes except through a
    same-sized view (``np.arange(n).reshape(...)``): replacing it then
    breaks no aliasing the user relies on."""
    base = array.base
    while isinstance(base, np.ndarray):
        if base.nbytes != array.nbytes or isinstance(base, np.memmap):
            return False
        base = base.base
    return base is None


class _SharingPickler(pickle.Pickler):
    def __init__(self, file: Any, sharing: _Sharing) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._sharing = sharing
        self._np = sys.modules.get("numpy")
        self._torch = sys.modules.get("torch")

    def reducer_override(self, obj: Any) -> Any:
        if self._np is not None and isinstance(obj, self._np.ndarray):
            return self._sharing.reduce_array(obj)
        if self._torch is not None and isinstance(obj, self._torch.Tensor):
            return self._sharing.reduce_tensor(obj)
        return NotImplemented


# --- the loader ---------------------------------------------------------------------------


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
        self._sharing: _Sharing | None = None
        self._setup_bytes: bytes | None = None
        self._iterator: _ProcessIter | None = None
        self._warned_pin = False

    # torch's attributes that code reads off a DataLoader.
    @property
    def _index_sampler(self) -> Any:
        return self._spec._index_sampler

    @property
    def _dataset_kind(self) -> int:
        return self._spec._dataset_kind

    @property
    def _auto_collation(self) -> bool:
        return self._spec._auto_collation

    def __len__(self) -> int:
        return len(self._spec)

    def __iter__(self) -> Any:
        if self.num_workers == 0:
            return self._pinned(iter(self._spec))
        if self.worker_mode == "thread":
            return self._pinned(_ThreadIter(self))
        if self.persistent_workers and self._iterator is not None and self._iterator.alive:
            self._iterator.reset()
            return self._pinned(self._iterator)
        iterator = _ProcessIter(self)
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
            sharing = _Sharing(self.share_threshold, self.shm_dir)
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


class _Dead(Exception):
    pass


class _WorkerError:
    def __init__(self, info: dict[str, Any]) -> None:
        self.info = info


class _ProcessIter:
    """One set of worker processes and the bookkeeping of torch's
    _MultiProcessingDataLoaderIter (task order, prefetch depth, iterable
    datasets running out per worker), with results through batch slots."""

    def __init__(self, loader: DataLoader) -> None:
        import torch

        self._loader = loader
        self._num_workers = loader.num_workers
        self._prefetch = loader.prefetch_factor
        self._in_order = loader.in_order
        self._timeout = loader.timeout
        self._iterable = loader._dataset_kind == 1  # _DatasetKind.Iterable
        self._persistent = loader.persistent_workers
        setup = loader.setup_bytes()
        # Same draws from the generator, in the same order, as torch's
        # _BaseDataLoaderIter: the sampler iterator first, then the base seed.
        self._sampler_iter = iter(loader._index_sampler)
        self._base_seed = (
            torch.empty((), dtype=torch.int64).random_(generator=loader.generator).item()
        )
        self._epoch = 0
        # (epoch, task) -> (pool, slot) for tasks sent with a slot.
        self._task_slot: dict[tuple[int, int], tuple[Any, int]] = {}
        self._pool: Any = None
        self._pool_id = 0
        self._slot_warned = False
        self._shutdown = False
        self._workers: list[Any] = []
        self._task_conns: list[Any] = []
        self._result_conns: list[Any] = []
        context = loader.multiprocessing_context
        # A forkserver worker is the forkserver's child, not ours: it cannot
        # check its parent's pid (the forkserver dies with us, and so do its
        # children through PR_SET_PDEATHSIG and the closed task pipe).
        parent = 0 if context.get_start_method() == "forkserver" else os.getpid()
        for worker_id in range(self._num_workers):
            task_read, task_write = context.Pipe(duplex=False)
            result_read, result_write = context.Pipe(duplex=False)
            process = context.Process(
                target=worker_main,
                args=(worker_id, self._num_workers, setup, self._base_seed, parent,
                      task_read, result_write),
                daemon=True,
                name=f"leanloader-worker-{worker_id}",
            )  # fmt: skip
            process.start()
            task_read.close()
            result_write.close()
            self._workers.append(process)
            self._task_conns.append(task_write)
            self._result_conns.append(result_read)
        _live_iterators.add(self)
        self._start_epoch()

    @property
    def alive(self) -> bool:
        return not self._shutdown

    def __iter__(self) -> _ProcessIter:
        return self

    def __len__(self) -> int:
        return len(self._loader)

    def reset(self) -> None:
        """A new epoch on the same (persistent) workers."""
        self._sampler_iter = iter(self._loader._index_sampler)
        self._epoch += 1
        for conn in self._task_conns:
            conn.send(("resume", self._epoch))
        self._start_epoch()

    def _start_epoch(self) -> None:
        # Slots of tasks still in flight from the previous epoch stay acquired
        # until their stale results arrive (a worker may still be writing).
        self._send_idx = 0
        self._rcvd_idx = 0
        self._task_info: dict[int, tuple] = {}
        self._task_index: dict[int, Any] = {}
        self._tasks_outstanding = 0
        self._workers_status = [True] * self._num_workers
        self._workers_num_tasks = [0] * self._num_workers
        self._worker_cycle = itertools.cycle(range(self._num_workers))
        for _ in range(self._prefetch * self._num_workers):
            self._try_put_index()

    def _release_pending(self) -> None:
        for pool, slot in self._task_slot.values():
            pool.release(slot)
        self._task_slot = {}

    def _try_put_index(self) -> None:
        max_tasks = self._prefetch * self._num_workers
        try:
            index = next(self._sampler_iter)
        except StopIteration:
            return
        for _ in range(self._num_workers):
            worker = next(self._worker_cycle)
            if self._workers_status[worker]:
                if self._in_order:
                    break
                if self._workers_num_tasks[worker] < max_tasks // sum(self._workers_status):
                    break
        else:
            return
        slot = None
        if self._pool is not None:
            slot_id = self._pool.acquire()
            if slot_id is None:
                if not self._slot_warned:
                    self._slot_warned = True
                    warnings.warn(
                        f"all {self._pool.num_slots} shared-memory batch slots are held by "
                        "batches still alive; further batches are copied through the pipe "
                        "until some are dropped",
                        stacklevel=4,
                    )
            else:
                pool = self._pool
                self._task_slot[(self._epoch, self._send_idx)] = (pool, slot_id)
                slot = (self._pool_id, segment_reference(pool.segment), slot_id,
                        pool.slot_bytes, pool.slot_offset(slot_id))  # fmt: skip
        self._task_conns[worker].send(("fetch", self._epoch, self._send_idx, index, slot))
        self._task_info[self._send_idx] = (worker,)
        self._task_index[self._send_idx] = index
        self._workers_num_tasks[worker] += 1
        self._tasks_outstanding += 1
        self._send_idx += 1

    def __next__(self) -> Any:
        if self._shutdown:
            raise RuntimeError("this DataLoader iterator was shut down after an error")
        try:
            return self._next_data()
        except StopIteration:
            raise
        except _Dead as dead:
            self.shutdown()
            raise RuntimeError(str(dead)) from None
        except BaseException as error:
            if not isinstance(error, _WorkerRaised):
                self.shutdown()
                raise
            raise error.error from None

    def _next_data(self) -> Any:
        while True:
            while self._rcvd_idx < self._send_idx:
                info = self._task_info.get(self._rcvd_idx)
                if info:
                    if len(info) == 2 or self._workers_status[info[0]]:
                        break
                    del self._task_info[self._rcvd_idx]
                self._rcvd_idx += 1
            else:
                if not self._persistent:
                    self.shutdown()
                raise StopIteration
            if len(self._task_info[self._rcvd_idx]) == 2:
                worker, data = self._task_info.pop(self._rcvd_idx)
                self._rcvd_idx += 1
                return self._process(data, worker)
            task, data = self._get_data()
            self._tasks_outstanding -= 1
            if data is _STOP:
                self._workers_status[self._task_info[task][0]] = False
                self._try_put_index()
                continue
            if task != self._rcvd_idx:
                if not self._in_order:
                    worker = self._task_info.pop(task)[0]
                    return self._process(data, worker)
                self._task_info[task] += (data,)
            else:
                worker = self._task_info.pop(task)[0]
                self._rcvd_idx += 1
                return self._process(data, worker)

    def _process(self, data: Any, worker: int) -> Any:
        self._workers_num_tasks[worker] -= 1
        self._try_put_index()
        if isinstance(data, _WorkerError):
            raise _WorkerRaised(rebuild_error(data.info))
        return data

    def _get_data(self) -> tuple[int, Any]:
        """The next result of the current epoch from any worker, checking
        worker liveness every POLL_S."""
        limit = self._timeout if self._timeout > 0 else None
        start = time.monotonic()
        sentinels = {w.sentinel: i for i, w in enumerate(self._workers)}
        conns = {c: i for i, c in enumerate(self._result_conns)}
        while True:
            ready = multiprocessing.connection.wait([*conns, *sentinels], timeout=POLL_S)
            for item in ready:
                if item in conns:
                    try:
                        message = item.recv()
                    except (EOFError, OSError):
                        self._check_workers(grace=True)
                        continue
                    result = self._accept(message)
                    if result is not None:
                        return result
            if any(item in sentinels for item in ready):
                self._check_workers(grace=True)
            if limit is not None and time.monotonic() - start > limit:
                raise _Dead(
                    f"DataLoader timed out after {self._timeout} seconds waiting for batch "
                    f"{self._rcvd_idx} from worker {self._task_info.get(self._rcvd_idx, ('?',))[0]}"
                )

    def _accept(self, message: tuple) -> tuple[int, Any] | None:
        kind, epoch, task = message[0], message[1], message[2]
        if epoch != self._epoch:
            # A result of an epoch the user left early: its slot goes back.
            self._drop_slot(task, epoch)
            return None
        if kind == "stop":
            self._drop_slot(task)
            return task, _STOP
        if kind == "error":
            self._drop_slot(task)
            return task, _WorkerError(message[3])
        payload = message[3]
        if payload[0] == "slot":
            pool, slot = self._task_slot.pop((epoch, task))
            return task, unpack_batch(payload[3], pool.hold(slot))
        self._drop_slot(task)
        needed = payload[2]
        data = pickle.loads(payload[1])
        self._grow_pool(needed)
        return task, data

    def _drop_slot(self, task: int, epoch: int | None = None) -> None:
        held = self._task_slot.pop((self._epoch if epoch is None else epoch, task), None)
        if held is not None:
            held[0].release(held[1])

    def _grow_pool(self, needed: int) -> None:
        if needed <= 0 or (self._pool is not None and needed <= self._pool.slot_bytes):
            return
        slot_bytes = int(needed * SLOT_HEADROOM)
        if self._pool is not None:
            slot_bytes = max(slot_bytes, 2 * self._pool.slot_bytes)
        num_slots = self._prefetch * self._num_workers + EXTRA_SLOTS
        self._pool = _core.SlotPool.create(slot_bytes, num_slots, self._loader.shm_dir)
        self._pool_id += 1

    def _check_workers(self, grace: bool) -> None:
        for worker_id, process in enumerate(self._workers):
            if process.exitcode is None and grace:
                process.join(0)
            if process.exitcode is None:
                continue
            code = process.exitcode
            if code < 0:
                try:
                    how = f"was killed by signal {signal.Signals(-code).name}"
                except ValueError:
                    how = f"was killed by signal {-code}"
            else:
                how = f"exited with status {code}"
            pending = [self._task_index[t] for t, info in sorted(self._task_info.items())
                       if info[0] == worker_id and len(info) == 1]  # fmt: skip
            hint = ""
            if code == -signal.SIGKILL:
                hint = " (SIGKILL usually means the OOM killer: check `dmesg` and memory use)"
            elif code == -signal.SIGBUS:
                hint = " (SIGBUS: shared memory ran out)"
            raise _Dead(
                f"leanloader DataLoader worker {worker_id} (pid {process.pid}) {how} while "
                f"loading samples {pending}{hint}"
            )

    def shutdown(self) -> None:
        if self._shutdown:
            return
        self._shutdown = True
        _live_iterators.discard(self)
        for conn in self._task_conns:
            try:
                conn.send(None)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + 1.0
        for process in self._workers:
            process.join(max(0.0, deadline - time.monotonic()))
        for process in self._workers:
            if process.exitcode is None:
                process.kill()
                process.join(1.0)
        for conn in (*self._task_conns, *self._result_conns):
            conn.close()
        self._release_pending()
        self._pool = None

    def __del__(self) -> None:
        try:
            self.shutdown()
        except Exception:
            pass


class _WorkerRaised(Exception):
    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


_STOP = object()
_live_iterators: weakref.WeakSet[_ProcessIter] = weakref.WeakSet()


def _shutdown_all() -> None:
    for iterator in list(_live_iterators):
        iterator.shutdown()


import atexit  # noqa: E402

atexit.register(_shutdown_all)


# --- threads --------------------------------------------------------------------------------


def _fetch_in_thread(task: tuple[DataLoader, Any]) -> Any:
    loader, index = task
    if loader._auto_collation:
        return loader.collate_fn([loader.dataset[i] for i in index])
    return loader.collate_fn(loader.dataset[index])


class _ThreadIter:
    """worker_mode="thread": __getitem__ and collate_fn run in native threads
    owned by leanloader (its Executor), for map-style datasets that release
    the GIL. Same order, same base seed draw, no pickling and no copies."""

    def __init__(self, loader: DataLoader) -> None:
        import torch

        from leanloader import _core

        if loader._dataset_kind != 0:
            raise ValueError("worker_mode='thread' supports map-style datasets only")
        self._loader = loader
        self._sampler_iter = iter(loader._index_sampler)
        torch.empty((), dtype=torch.int64).random_(generator=loader.generator)
        self._pool = _core.PythonTaskPool(loader.num_workers)
        self._pending: list[int] = []
        self._depth = loader.prefetch_factor * loader.num_workers
        for _ in range(self._depth):
            self._submit()

    def _submit(self) -> None:
        try:
            index = next(self._sampler_iter)
        except StopIteration:
            return
        # The task must not reference this iterator: a queued task held in
        # C++ would keep it alive in a cycle the garbage collector cannot see.
        self._pending.append(self._pool.submit(_fetch_in_thread, (self._loader, index)))

    def __iter__(self) -> _ThreadIter:
        return self

    def __next__(self) -> Any:
        if not self._pending:
            self._pool.close()
            raise StopIteration
        task = self._pending.pop(0)
        result = self._pool.result(task, timeout=float(self._loader.timeout or 0))
        self._submit()
        return result

    def __del__(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.close()
