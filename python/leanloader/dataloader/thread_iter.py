"""worker_mode="thread": the dataset runs on native threads owned by the engine.

Each thread is a worker as torch's processes are: worker i has its
``get_worker_info()`` (id, num_workers, seed = base seed + i, the dataset)
and runs ``worker_init_fn(i)`` on its own thread before its first sample, once
per pass (non-persistent) or once in the iterator's life
(``persistent_workers=True``), whether or not it then takes a sample.
The base seed is drawn from the generator when torch draws it: every pass,
or once with persistent workers. What threads cannot have is a random state
of their own: ``random``, ``numpy.random`` and torch's global generator are
the process's, shared by the threads and not reseeded (the training loop's
draws would change); a dataset that needs per-worker randomness seeds its own
generator from ``get_worker_info().seed``.
"""

from __future__ import annotations

import atexit
import threading
import traceback
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from leanloader.dataloader.front import DataLoader

from leanloader.dataloader.iterator_attributes import set_torch_iterator_attributes
from leanloader.dataloader.protocol import raised_by_user_code
from leanloader.dataloader.seeding import draw_base_seed
from leanloader.dataloader.state import first_sampler_iter
from leanloader.dataloader.worker import describe_error, rebuild_error

# --- get_worker_info() per thread -----------------------------------------------------------

_THREAD_INFO = threading.local()
_PATCH_LOCK = threading.Lock()

_GET_WORKER_INFO = """
def get_worker_info():
    info = getattr(_leanloader_thread_info, "info", None)
    return _worker_info if info is None else info
"""


def _thread_aware_worker_info() -> None:
    """Makes torch's get_worker_info() answer the calling thread's worker info
    when it runs in a leanloader worker thread (torch keeps one module global,
    right for processes only). The function object is kept, so every name
    already bound to it (``from torch.utils.data import get_worker_info``)
    sees the change; outside worker threads it returns what it always did."""
    from torch.utils.data._utils import worker as torch_worker

    with _PATCH_LOCK:
        if getattr(torch_worker, "_leanloader_thread_info", None) is _THREAD_INFO:
            return
        torch_worker._leanloader_thread_info = _THREAD_INFO
        namespace: dict[str, Any] = {}
        exec(_GET_WORKER_INFO, torch_worker.__dict__, namespace)
        torch_worker.get_worker_info.__code__ = namespace["get_worker_info"].__code__


class ThreadWorkers:
    """What the worker threads of one set share: the dataset, collate_fn,
    each worker's info and the error its init function raised, if any (an
    entry is touched by that worker's thread, and between passes by the
    main thread). Holds no loader and no iterator (a queued task held by C++
    must not form a cycle)."""

    def __init__(self, loader: DataLoader, base_seed: int) -> None:
        from torch.utils.data._utils.worker import WorkerInfo

        self.dataset = loader.dataset
        self.collate_fn = loader.collate_fn
        self.auto_collation = loader._auto_collation
        self.worker_init_fn = loader.worker_init_fn
        n = loader.num_workers
        self.infos = [
            WorkerInfo(id=i, num_workers=n, seed=base_seed + i, dataset=self.dataset)
            for i in range(n)
        ]
        self.init_errors: list[Exception | None] = [None] * n
        self.init_error_reported = [False] * n

    def start(self, pool: Any) -> list[int]:
        """Queues worker_init_fn(i) on thread i, ahead of its samples: every
        worker runs it once, as each of torch's worker processes does,
        including a worker that ends up with no batch. Returns the task ids."""
        if self.worker_init_fn is None:
            return []
        return [
            pool.submit(_init_in_thread, self, worker=worker) for worker in range(len(self.infos))
        ]

    def resume(self) -> None:
        """A new pass of persistent workers: a worker whose failed init was
        reported loads again, as torch's worker rebuilds its fetcher on
        _ResumeIteration; one not yet reported still fails its next batch."""
        for worker, reported in enumerate(self.init_error_reported):
            if reported:
                self.init_errors[worker] = None
                self.init_error_reported[worker] = False

    def enter(self, worker: int) -> None:
        _THREAD_INFO.info = self.infos[worker]
        error = self.init_errors[worker]
        if error is None:
            return
        # torch's worker loop hands a failed init's error to that worker's
        # first task, and every later task of that worker fails too (it has
        # no fetcher): the worker loads nothing.
        if not self.init_error_reported[worker]:
            self.init_error_reported[worker] = True
            raise error
        raise RuntimeError(
            f"DataLoader worker {worker} did not start: its worker_init_fn raised {error!r}"
        ) from error


def _init_in_thread(workers: ThreadWorkers, worker: int) -> None:
    _THREAD_INFO.info = workers.infos[worker]
    try:
        workers.worker_init_fn(worker)
    except Exception as error:
        # Kept with its traceback as text, not frames (they hold `workers`:
        # a cycle that would keep the dataset until the garbage collector
        # ran), as torch's ExceptionWrapper keeps the text only.
        where = "".join(traceback.format_exception(error))
        error.__traceback__ = None
        error.add_note(f"raised by worker_init_fn in DataLoader worker thread {worker}:\n{where}")
        workers.init_errors[worker] = error
    finally:
        _THREAD_INFO.info = None


def _fetch_in_thread(task: tuple[ThreadWorkers, Any], worker: int) -> Any:
    """torch's _MapDatasetFetcher.fetch on worker `worker`'s thread; an error
    is raised as torch's main process re-raises a worker's
    (ExceptionWrapper: "Caught KeyError in DataLoader worker thread 0...")."""
    workers, index = task
    try:
        workers.enter(worker)
        dataset = workers.dataset
        if not workers.auto_collation:
            return workers.collate_fn(dataset[index])
        if getattr(dataset, "__getitems__", None):
            return workers.collate_fn(dataset.__getitems__(index))
        return workers.collate_fn([dataset[i] for i in index])
    except Exception as error:
        # Everything above is the dataset's, collate_fn's or worker_init_fn's.
        raise rebuild_error(
            describe_error(raised_by_user_code(error), f"in DataLoader worker thread {worker}")
        ) from None
    finally:
        _THREAD_INFO.info = None


class ThreadIterator:
    """worker_mode="thread": __getitem__ and collate_fn run in native threads
    owned by leanloader (its Executor), for map-style datasets that release
    the GIL. Same order, same base seed draws, no pickling and no copies."""

    def __init__(self, loader: DataLoader) -> None:
        from leanloader import _core

        if loader._dataset_kind != 0:
            raise ValueError("worker_mode='thread' supports map-style datasets only")
        _thread_aware_worker_info()
        self._num_workers = loader.num_workers
        self._prefetch_factor = loader.prefetch_factor
        self._depth = loader.prefetch_factor * loader.num_workers
        self._timeout = float(loader.timeout or 0)
        self._in_order = loader.in_order
        self._index_sampler = loader._index_sampler
        self._sampler_iter = first_sampler_iter(self._index_sampler)
        self._base_seed = draw_base_seed(loader.generator)
        self._workers = ThreadWorkers(loader, self._base_seed)
        # torch's _reset(first_iter=True), before any thread runs user code.
        self._sampler_iter = iter(self._index_sampler)
        self._pool = _core.PythonTaskPool(loader.num_workers)
        _live_iterators.add(self)
        self._init_tasks = self._workers.start(self._pool)
        # task id -> its worker, in the order the batches were sent
        self._pending: dict[int, int] = {}
        self._next_worker = 0  # torch's _worker_queue_idx_cycle
        self.alive = True
        set_torch_iterator_attributes(self, loader, workers=True)
        self._prime()

    def _reset(self, loader: DataLoader) -> None:
        """A new pass on the same (persistent) threads: no new base seed, no
        new init calls, as torch's persistent workers."""
        for task in self._pending:
            try:
                self._pool.result(task, timeout=self._timeout)
            except Exception:
                pass  # a sample of the pass left early
        self._pending = {}
        self._next_worker = 0  # torch starts the cycle again each pass
        self._workers.resume()
        self._index_sampler = loader._index_sampler
        self._sampler_iter = iter(self._index_sampler)
        self._prime()

    def _prime(self) -> None:
        for _ in range(self._depth):
            self._submit()

    def _submit(self) -> None:
        try:
            index = next(self._sampler_iter)
        except StopIteration:
            return
        # As torch's _try_put_index deals a pass's batches to its workers:
        # round-robin (in order, batch i is worker i % num_workers's, with
        # that worker's info and seed, whatever the threads' timing); with
        # in_order=False the next worker in the cycle that has fewer than
        # prefetch_factor batches outstanding.
        outstanding = [] if self._in_order else list(self._pending.values())
        for _ in range(self._num_workers):
            worker = self._next_worker
            self._next_worker = (worker + 1) % self._num_workers
            if self._in_order or outstanding.count(worker) < self._prefetch_factor:
                break
        task = self._pool.submit(_fetch_in_thread, (self._workers, index), worker=worker)
        self._pending[task] = worker

    def __iter__(self) -> ThreadIterator:
        return self

    def __len__(self) -> int:
        return len(self._index_sampler)

    def __next__(self) -> Any:
        if not self.alive:
            raise RuntimeError("this DataLoader iterator was shut down")
        if not self._pending:
            # leanloader's guarantee: a pass ends with every worker's init
            # run (torch's worker processes each run theirs when started; a
            # thread that got no batch may not have reached it yet). Claimed
            # one by one, so a timeout or Ctrl-C here leaves the rest to wait
            # for at the next call.
            while self._init_tasks:
                self._pool.result(self._init_tasks[0], timeout=self._timeout)
                self._init_tasks.pop(0)
            raise StopIteration
        # in_order=False: the first batch ready, as torch's iterator then
        # returns whatever data arrives first.
        waiting_for = [next(iter(self._pending))] if self._in_order else list(self._pending)
        try:
            task = self._pool.wait_any(waiting_for, timeout=self._timeout)
        except TimeoutError:
            # torch's words; the batch stays pending, for a later next().
            raise RuntimeError(f"DataLoader timed out after {self._timeout:g} seconds") from None
        del self._pending[task]
        try:
            return self._pool.result(task)
        finally:
            # The next index goes out whether this batch failed or not, as
            # torch's _process_data puts one before it re-raises.
            self._submit()

    def _shutdown_workers(self) -> None:
        if self.alive:
            self.alive = False
            self._pool.close()

    def __del__(self) -> None:
        pool = self.__dict__.get("_pool")
        if pool is not None:
            pool.close()


# The pools of iterators still alive when the program exits are closed by an exit
# handler, which runs before the interpreter starts finalizing: a worker
# thread that asked for the GIL after that point was ended by CPython with
# pthread_exit, whose unwinding through the engine's noexcept thread frame
# aborted the process (rc 134 in about half the runs of a script that left a
# pass unfinished).
_live_iterators: weakref.WeakSet[ThreadIterator] = weakref.WeakSet()


def _shutdown_all() -> None:
    for iterator in list(_live_iterators):
        iterator._shutdown_workers()


atexit.register(_shutdown_all)
