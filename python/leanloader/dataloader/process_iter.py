"""The multi-process iterator: spawned workers, task bookkeeping as torch's
_MultiProcessingDataLoaderIter, batches returned through shared slots."""

from __future__ import annotations

import atexit
import itertools
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import time
import warnings
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from leanloader.dataloader.front import DataLoader

from leanloader import _core
from leanloader.dataloader.worker import (
    rebuild_error,
    segment_reference,
    unpack_batch,
    worker_main,
)

# How often the main process checks worker liveness while it waits.
POLL_S = 0.1
# A dead worker is reported within this time when timeout is 0.
DEATH_REPORT_S = 5.0
# Slots beyond the prefetch depth, for batches the user keeps alive.
EXTRA_SLOTS = 4
# A slot is this much larger than the largest batch seen (batches vary).
SLOT_HEADROOM = 1.25


class _Dead(Exception):
    pass


class _WorkerError:
    def __init__(self, info: dict[str, Any]) -> None:
        self.info = info


class ProcessIterator:
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

    def __iter__(self) -> ProcessIterator:
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
_live_iterators: weakref.WeakSet[ProcessIterator] = weakref.WeakSet()


def _shutdown_all() -> None:
    for iterator in list(_live_iterators):
        iterator.shutdown()


atexit.register(_shutdown_all)
