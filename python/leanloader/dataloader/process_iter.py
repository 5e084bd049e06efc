"""The multi-process iterator: worker processes (forkserver by default, or
spawn), task bookkeeping as torch's _MultiProcessingDataLoaderIter, batches
returned through shared slots."""

from __future__ import annotations

import atexit
import errno
import itertools
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import sys
import time
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from leanloader.dataloader.front import DataLoader

from leanloader import _core
from leanloader.dataloader.batch_segments import BatchSegments
from leanloader.dataloader.fork_server import (
    ensure_fork_server,
    forked_from_this_process,
    main_module_hidden,
)
from leanloader.dataloader.iterator_attributes import set_torch_iterator_attributes
from leanloader.dataloader.pin import in_place_pinning
from leanloader.dataloader.protocol import (
    SHUTDOWN,
    BatchReady,
    Close,
    Config,
    Exhausted,
    Failed,
    Fetch,
    InSegment,
    InSlot,
    Resume,
)
from leanloader.dataloader.script_guard import (
    UNGUARDED_EXIT,
    UNGUARDED_MAIN_NEEDED,
    unguarded_main_line,
)
from leanloader.dataloader.seeding import (
    datapipe_seed,
    distributed_settings,
    draw_base_seed,
    is_datapipe,
)
from leanloader.dataloader.sharing import PickledAtStart, pickling_error
from leanloader.dataloader.state import first_sampler_iter
from leanloader.dataloader.task_sender import TaskSender
from leanloader.dataloader.worker import rebuild_error, worker_main

# torch's words when the main process runs out of descriptors (each batch
# held by the consumer keeps one open, as torch's shared tensors do), but
# not its advice to change torch's sharing strategy: batches come through
# leanloader's own segments, which that setting does not reach.
TOO_MANY_OPEN_FILES = (
    "Too many open files. Communication with the workers is no longer possible. Please "
    "increase the limit using `ulimit -n` in the shell, or hold fewer batches at once (keep "
    "copies, `.clone()`, of those you keep): each batch held from leanloader's worker "
    "processes keeps a descriptor open, and torch.multiprocessing.set_sharing_strategy does "
    "not change that"
)

# How often the main process checks worker liveness while it waits.
POLL_S = 0.1
# A dead worker is reported within this time when timeout is 0.
DEATH_REPORT_S = 5.0
# How long shut-down workers get to exit on their own.
SHUTDOWN_JOIN_S = 5.0
# ... after a timeout, a dead worker or an interrupt (a worker may be stuck).
ERROR_JOIN_S = 0.2


class _Dead(Exception):
    """A worker died. `lost`: the pass goes on without it and its batches,
    as torch's does; else the iterator shuts down."""

    def __init__(self, message: str, lost: bool = False) -> None:
        super().__init__(message)
        self.lost = lost


class _TimedOut(Exception):
    """No batch within `timeout`: the iterator stays usable (torch's does;
    the slow batch is returned by a later next())."""


class _SamplerRaised(Exception):
    """The sampler raised: nothing was sent for it, the iterator stays usable
    as torch's (a skip-and-continue loop finishes the pass)."""

    def __init__(self, error: Exception) -> None:
        self.error = error


class _WorkerError:
    def __init__(self, info: dict[str, Any]) -> None:
        self.info = info


class ProcessIterator:
    """One set of worker processes and the bookkeeping of torch's
    _MultiProcessingDataLoaderIter (task order, prefetch depth, iterable
    datasets running out per worker), with results through batch slots."""

    def __init__(self, loader: DataLoader) -> None:
        self._num_workers = loader.num_workers
        self._prefetch = loader.prefetch_factor
        self._in_order = loader.in_order
        self._timeout = loader.timeout
        self._iterable = loader._dataset_kind == 1  # _DatasetKind.Iterable
        self._persistent = loader.persistent_workers
        # Same draws from the generator, in the same order, as torch's
        # _BaseDataLoaderIter: an IterDataPipe's shared seed, the sampler
        # iterator, then the base seed.
        self._datapipe = is_datapipe(loader.dataset)
        dataset, shared_seed = datapipe_seed(loader, loader.dataset)
        self._index_sampler = loader._index_sampler
        self._sampler_iter = first_sampler_iter(self._index_sampler)
        self._base_seed = draw_base_seed(loader.generator)
        sharding = distributed_settings() if self._datapipe else None
        setup = loader.worker_setup(dataset)
        setup.sharding = sharding
        self._epoch = 0
        # The dataset's shared copies this pass's workers attached.
        self._attached_segments: list[Any] = []
        self._answered: set[int] = set()  # workers that sent anything
        self._shutdown = False
        # The pass ended normally: later next() calls raise StopIteration
        # again, as torch's iterator does (Lightning's CombinedLoader relies on it).
        self._exhausted = False
        # Ctrl-C arrived while next() waited for a result (nothing was half
        # received): the iterator goes on, as torch's does.
        self._interrupted_waiting = False
        self._lost: set[int] = set()  # workers that died
        self._workers: list[Any] = []
        self._task_conns: list[Any] = []
        self._result_conns: list[Any] = []
        # Every message to a worker goes through this thread (never a
        # blocking write from here: see task_sender.py).
        self._sender = TaskSender("leanloader-task-sender")
        # send(worker, message), through the sender (a dead worker: _check_workers)
        self._send = _sending_to(self._sender, self._task_conns)
        # Which shared segment each batch is written into (batch_segments.py);
        # pin_memory=True on a GPU: segments are page-locked as they arrive,
        # and a dropped batch's segment is fenced until the device's copies
        # from it have run (dataloader/pin.py).
        self.batch_segments = BatchSegments(
            self._num_workers,
            self._prefetch,
            getattr(loader, "memory_budget", None),
            in_place_pinning(loader),
            self._send,
        )
        self._start_workers(loader, setup, shared_seed)
        # torch's _MultiProcessingDataLoaderIter ends its __init__ with
        # _reset(first_iter=True): a new sampler iterator, then (for an
        # IterDataPipe) one more shared seed, drawn and applied here only: the
        # generator moves on as it does in torch.
        self._sampler_iter = iter(self._index_sampler)
        if self._datapipe:
            datapipe_seed(loader, loader.dataset)
        set_torch_iterator_attributes(self, loader, workers=True)
        _live_iterators.add(self)
        self._start_epoch()

    def _start_workers(self, loader: DataLoader, setup: Any, shared_seed: Any) -> None:
        """Starts the workers through the context's own Process machinery.
        The dataset is pickled once into bytes that every worker receives,
        large arrays and tensors as references to shared copies. A dataset
        that only the start method can send (multiprocessing Value, Lock,
        Event, Queue... are shared by inheritance) is pickled by each
        Process.start() instead, as torch's workers receive it; with fork
        nothing is pickled. Each worker lets its copy go once unpickled, and
        the main process keeps none."""
        context = loader._context
        method = context.get_start_method()
        # The shared copies the workers attach (when they unpickle, and for
        # their life) live as long as this iterator, even without its loader.
        self._sharing = loader.dataset_sharing()
        payload: Any
        if method == "fork":
            payload = setup
        else:
            try:
                payload = loader.setup_bytes(setup)
            except pickle.PicklingError:
                # mp objects refuse to be pickled outside Process.start();
                # a genuinely unpicklable dataset fails there again (below)
                payload = PickledAtStart(setup, loader.dataset_sharing())
        if method == "forkserver" and not multiprocessing.current_process().daemon:
            # (a worker's loader: Process.start() refuses it below, as torch's)
            ensure_fork_server(type(loader.dataset).__module__, context)
        # A worker of spawn or of a fresh fork server imports the main script
        # (running its top level again, unless guarded) only when what it
        # receives needs something defined there; one of a fork server forked
        # from this process has `__main__` already.
        needs_main = method != "fork" and (not isinstance(payload, bytes) or b"__main__" in payload)
        if needs_main and not (method == "forkserver" and forked_from_this_process(context)):
            unguarded = unguarded_main_line()
            if unguarded is not None:
                raise RuntimeError(
                    UNGUARDED_MAIN_NEEDED.format(script=unguarded[0], line=unguarded[1])
                )
        hide_main = method != "fork" and not needs_main
        # A forkserver worker is the forkserver's child, not ours: it cannot
        # check its parent's pid; it watches ours (exit_with_process).
        parent = 0 if method == "forkserver" else os.getpid()
        try:
            for worker_id in range(self._num_workers):
                task_read, task_write = context.Pipe(duplex=False)
                result_read, result_write = context.Pipe(duplex=False)
                holder = [payload]  # emptied by the worker, and here once started
                process = context.Process(
                    target=worker_main,
                    args=(worker_id, self._num_workers, holder, self._base_seed, shared_seed,
                          parent, task_read, result_write, os.getpid()),
                    daemon=True,
                    name=f"leanloader-worker-{worker_id}",
                )  # fmt: skip
                try:
                    with main_module_hidden(hide_main):
                        process.start()
                except Exception as error:
                    task_write.close()
                    result_read.close()
                    if isinstance(payload, PickledAtStart):
                        raise pickling_error(setup, error) from error
                    raise
                finally:
                    holder.clear()
                    task_read.close()
                    result_write.close()
                task_write.send(Config(loader.shm_dir))
                self._workers.append(process)
                self._task_conns.append(task_write)
                self._result_conns.append(result_read)
            # The segments this pass's workers attach stay while they may
            # (a later pass may supersede a copy the main process wrote).
            self._attached_segments = self._sharing.take_used()
        except BaseException:
            self.shutdown()
            raise
        finally:
            del payload, setup

    @property
    def alive(self) -> bool:
        """Whether another pass can run on these workers (none died)."""
        return not self._shutdown and not self._lost

    def __iter__(self) -> ProcessIterator:
        return self

    def __len__(self) -> int:
        return len(self._index_sampler)

    def _reset(self, loader: DataLoader) -> None:
        """A new epoch on the same (persistent) workers: no new base seed, a
        new shared seed for an IterDataPipe (torch's _reset)."""
        self._index_sampler = loader._index_sampler
        self._sampler_iter = iter(self._index_sampler)
        shared_seed = datapipe_seed(loader, loader.dataset)[1] if self._datapipe else None
        self._epoch += 1
        for worker in range(len(self._task_conns)):
            self._send(worker, Resume(self._epoch, shared_seed))
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
        self.batch_segments.start_epoch(self._epoch)
        try:
            for _ in range(self._prefetch * self._num_workers):
                self._try_put_index()
        except _SamplerRaised as sampler:
            raised = sampler.error
        else:
            return
        try:
            raise raised  # the sampler's own error, as torch's iter() raises it
        finally:
            del raised

    def _try_put_index(self) -> None:
        max_tasks = self._prefetch * self._num_workers
        try:
            index = next(self._sampler_iter)
        except StopIteration:
            return
        except Exception as error:
            raise _SamplerRaised(error) from None
        for _ in range(self._num_workers):
            worker = next(self._worker_cycle)
            if self._workers_status[worker]:
                if self._in_order:
                    break
                if self._workers_num_tasks[worker] < max_tasks // sum(self._workers_status):
                    break
        else:
            return
        slot = self.batch_segments.slot_for(self._send_idx, worker)
        self._send(worker, Fetch(self._epoch, self._send_idx, index, slot))
        self._task_info[self._send_idx] = (worker,)
        self._task_index[self._send_idx] = index
        self._workers_num_tasks[worker] += 1
        self._tasks_outstanding += 1
        self._send_idx += 1

    def __next__(self) -> Any:
        if self._shutdown:
            if self._exhausted:
                raise StopIteration
            raise RuntimeError("this DataLoader iterator was shut down after an error")
        try:
            # Segments the consumer dropped since the last call go to tasks
            # sent while none was free.
            self.batch_segments.offer_free()
            return self._next_data()
        except StopIteration:
            raise
        except _TimedOut as timed_out:
            raise RuntimeError(str(timed_out)) from None
        except _SamplerRaised as sampler:
            raised = sampler.error
        except _Dead as dead:
            if not dead.lost:
                self.shutdown(grace=ERROR_JOIN_S)
            raise RuntimeError(str(dead)) from None
        except KeyboardInterrupt:
            if not self._interrupted_waiting:
                self.shutdown(grace=ERROR_JOIN_S)
            self._interrupted_waiting = False
            raise
        except BaseException as error:
            if not isinstance(error, _WorkerRaised):
                self.shutdown(grace=ERROR_JOIN_S)
                raise
            raised = error.error
        # Raised outside the except clause, and let go of here: raised inside
        # it, the worker's error would hold the _WorkerRaised as its context,
        # which holds it back (a cycle through this frame and the iterator,
        # its batch segments included, until the garbage collector ran).
        try:
            raise raised
        finally:
            del raised

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
                    self._exhausted = True
                    self.shutdown()
                else:
                    self.batch_segments.release_kept()
                raise StopIteration
            if len(self._task_info[self._rcvd_idx]) == 2:
                worker, data = self._task_info.pop(self._rcvd_idx)
                self._rcvd_idx += 1
                return self._process(data, worker)
            task, data = self._get_data()
            self._tasks_outstanding -= 1
            if isinstance(data, _Stop):
                # (its later tasks, already sent, answer "stop" too: they
                # were dropped from _task_info above or are dropped here)
                self._workers_status[data.worker] = False
                self._task_info.pop(task, None)
                self._try_put_index()
                continue
            if task not in self._task_info:
                continue  # a task of a worker that ran out (cannot carry a batch)
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
        sentinels = {w.sentinel: i for i, w in enumerate(self._workers) if i not in self._lost}
        conns = {c: i for i, c in enumerate(self._result_conns) if i not in self._lost}
        # Pinned segments come back when the device's copies from them have
        # run: the fence's descriptor is readable then.
        device_fence = self.batch_segments.fence
        fence = [device_fence.ready_fd] if device_fence is not None else []
        while True:
            try:
                ready = multiprocessing.connection.wait(
                    [*conns, *sentinels, *fence], timeout=POLL_S
                )
            except KeyboardInterrupt:
                self._interrupted_waiting = True
                raise
            if fence and fence[0] in ready:
                self.batch_segments.offer_free()
            for item in ready:
                if item in conns:
                    try:
                        message = item.recv()
                    except (EOFError, OSError):
                        self._check_workers(grace=True)
                        continue
                    result = self._accept(message, conns[item])
                    if result is not None:
                        return result
            if any(item in sentinels for item in ready):
                self._check_workers(grace=True)
            if limit is not None and time.monotonic() - start > limit:
                raise _TimedOut(
                    f"DataLoader timed out after {self._timeout} seconds waiting for batch "
                    f"{self._rcvd_idx} from worker {self._task_info.get(self._rcvd_idx, ('?',))[0]}"
                )

    def _accept(
        self, message: BatchReady | Exhausted | Failed, worker: int
    ) -> tuple[int, Any] | None:
        epoch, task = message.epoch, message.task
        self._answered.add(worker)
        segments = self.batch_segments
        segments.answered(epoch, task)
        if epoch != self._epoch:
            # A result of an epoch the user left early: its slot goes back,
            # and a segment the worker made for it is let go.
            segments.drop(task, epoch)
            if isinstance(message, BatchReady) and isinstance(message.payload, InSegment):
                self._send(worker, Close(message.payload.segment[1]))
            return None
        if isinstance(message, Exhausted):
            segments.drop(task)
            return task, _Stop(worker)
        if isinstance(message, Failed):
            segments.drop(task)
            return task, _WorkerError(message.error)
        payload = message.payload
        if isinstance(payload, InSlot):
            return task, segments.batch_in_slot(task, payload.template)
        if isinstance(payload, InSegment):
            # The worker wrote into a segment of its own (no segment was free
            # when the task was sent, or the offered one was too small).
            (owner, fd, inode), size, template = payload
            try:
                segment = _core.SharedSegment.attach(f"/proc/{owner}/fd/{fd}")
            except OSError as error:
                if error.errno in (errno.EMFILE, errno.ENFILE):
                    raise RuntimeError(TOO_MANY_OPEN_FILES) from None
                # The worker died after sending the batch, and its descriptors
                # with it: report its death as any other.
                self._workers[worker].join(1.0)
                self._check_workers(grace=True)
                raise _Dead(
                    f"leanloader DataLoader worker {worker} (pid {owner}) sent a batch segment "
                    "that is gone"
                ) from None
            finally:
                self._send(worker, Close(fd))  # the worker's descriptor goes
            if os.fstat(segment.fd).st_ino != inode:
                raise _Dead(f"leanloader DataLoader worker {worker} (pid {owner}) sent a batch "
                            "segment that is gone")  # fmt: skip
            return task, segments.batch_in_segment(task, segment, size, template)
        segments.drop(task)
        return task, pickle.loads(payload.data)

    # --- workers ---------------------------------------------------------------------

    def _check_workers(self, grace: bool) -> None:
        for worker_id, process in enumerate(self._workers):
            # (as torch's: a worker that ran out, or one already reported dead, is not checked)
            if not self._workers_status[worker_id]:
                continue
            if process.exitcode is None and grace:
                process.join(0)
            if process.exitcode is None:
                continue
            code = process.exitcode
            # torch's words first (code that matches on them keeps working),
            # then which worker, how and what it held.
            if code < 0:
                try:
                    name = signal.Signals(-code).name
                    description = signal.strsignal(-code) or name
                except ValueError:
                    name = description = str(-code)
                torch_words = (
                    f"DataLoader worker (pid {process.pid}) is killed by signal: {description}."
                )
                how = f"was killed by signal {name}"
            else:
                torch_words = (
                    f"DataLoader worker (pid(s) {process.pid}) exited unexpectedly with exit code "
                    f"{code}."
                )
                how = f"exited with status {code}"
            pending = [self._task_index[task] for task in self._tasks_loading(worker_id)]
            script = getattr(sys.modules.get("__main__"), "__file__", None) or "the script"
            if code == UNGUARDED_EXIT:
                raise _Dead(
                    f"{torch_words} leanloader DataLoader worker {worker_id} exited while "
                    f"starting: it re-ran the top level of {script}, which started a "
                    "DataLoader again (spawn imports the main module in every worker). Put the "
                    "code that builds and iterates the loader under "
                    '`if __name__ == "__main__":`, or pass worker_mode="thread" to '
                    "ll.DataLoader (no worker processes)."
                )
            hint = ""
            if code == -signal.SIGKILL:
                hint = " (SIGKILL usually means the OOM killer: check `dmesg` and memory use)"
            elif code == -signal.SIGBUS:
                hint = " (SIGBUS: shared memory ran out)"
            elif code > 0 and worker_id not in self._answered:
                hint = (
                    " before answering any task: its output above says why (if it failed while "
                    f"starting: spawn re-imports {script} in each worker, and a script without "
                    '`if __name__ == "__main__":` fails there; or use worker_mode="thread")'
                )
            self._lose_worker(worker_id)
            raise _Dead(
                f"{torch_words} leanloader DataLoader worker {worker_id} (pid {process.pid}) "
                f"{how} while loading samples {pending}{hint}",
                lost=True,
            )

    def _lose_worker(self, worker_id: int) -> None:
        """As torch's _mark_worker_as_unavailable after a death: no more tasks
        for the worker, and the batches it was loading are left out of the
        pass (their slots go back)."""
        self._workers_status[worker_id] = False
        self._lost.add(worker_id)
        for task in self._tasks_loading(worker_id):
            del self._task_info[task]
            self.batch_segments.drop(task)
            self._tasks_outstanding -= 1
        self._workers_num_tasks[worker_id] = 0

    def _tasks_loading(self, worker_id: int) -> list[int]:
        """The tasks sent to `worker_id` that it has not answered, in order."""
        return [task for task, info in sorted(self._task_info.items())
                if info[0] == worker_id and len(info) == 1]  # fmt: skip

    def shutdown(self, grace: float = 0.0) -> None:
        """Stops the workers: each gets `grace` seconds (SHUTDOWN_JOIN_S by
        default) to exit on its own before it is killed."""
        grace = grace or SHUTDOWN_JOIN_S
        if self._shutdown:
            return
        self._shutdown = True
        _live_iterators.discard(self)
        for worker in range(len(self._task_conns)):
            self._send(worker, SHUTDOWN)  # workers skip the tasks queued before it
        # as torch's _shutdown_workers: workers get MP_STATUS_CHECK_INTERVAL
        # (5 s) to exit on their own (exit code 0) before they are killed
        deadline = time.monotonic() + grace
        for process in self._workers:
            process.join(max(0.0, deadline - time.monotonic()))
        for process in self._workers:
            if process.exitcode is None:
                process.kill()
                process.join(1.0)
        # The sender's writes to dead workers fail at once: it ends before
        # the connections close (no write to a descriptor reused meanwhile).
        self._sender.close(timeout=5.0)
        for conn in (*self._task_conns, *self._result_conns):
            conn.close()
        self.batch_segments.close()
        self._attached_segments = []  # (the workers are gone)

    # torch's name, called by frameworks (e.g. to end a subclass's iterator)
    _shutdown_workers = shutdown

    def __del__(self) -> None:
        try:
            self.shutdown()
        except Exception:
            pass


class _WorkerRaised(Exception):
    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class _Stop:
    """A worker's iterable dataset ran out."""

    __slots__ = ("worker",)

    def __init__(self, worker: int) -> None:
        self.worker = worker


def _sending_to(sender: TaskSender, task_conns: list[Any]) -> Any:
    """A send(worker, message) that does not hold the iterator (no cycle:
    an iterator dropped without the garbage collector still ends its workers)."""

    def send(worker: int, message: Any) -> None:
        sender.send(task_conns[worker], message)

    return send


_live_iterators: weakref.WeakSet[ProcessIterator] = weakref.WeakSet()


def _shutdown_all() -> None:
    for iterator in list(_live_iterators):
        iterator.shutdown()


atexit.register(_shutdown_all)
