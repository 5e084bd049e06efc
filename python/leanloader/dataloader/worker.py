"""Worker processes of ``ll.DataLoader`` (``worker_mode="process"``).

A worker is started by spawn or forkserver (fork only when forced), receives
the dataset through Process(args=...) as bytes pickled once in the main
process (or pickled by Process.start() when it holds multiprocessing
objects; the object itself under fork), lets them go once unpickled, and
then answers tasks from its own pipe (the messages: protocol.py).

Batch memory (planned like ll.Loader's slots, see process_iter.py): the
collated batch's tensors / arrays go into shared memory and only a template
(offsets, dtypes, shapes) goes through the pipe. ``slot`` names a batch
segment the main process keeps for reuse (or is None); before writing, the
worker reads the offers that arrived meanwhile. With a slot that fits, it
copies the batch there (``InSlot``); otherwise it creates a segment of its
own sized to the batch, writes it and sends its reference (``InSegment``);
the main process attaches and adopts it, then sends ``Close`` so that the
worker drops its descriptor. So the first batches never wait for a pool and
never travel pickled. Only batches with no numeric array at all go through
the pipe pickled (``Pickled``); other
leaves (strings, Python objects of a custom collate's output) stay in the
template and are pickled with it.

Large arrays of the dataset arrive as references to shared segments of the
main process (see ``segments.py``: ``rebuild_array`` / ``rebuild_tensor``), attached through
``/proc/<main pid>/fd/<fd>``: one copy for all workers.
"""

from __future__ import annotations

import collections
import functools
import os
import pickle
import random
import signal
import sys
import time
import traceback
from multiprocessing.reduction import ForkingPickler
from typing import Any

from leanloader import _core
from leanloader.dataloader.batch_template import (
    StreamedFetch,
    UncollatedBatch,
    plan_batch,
    plan_stacked,
)
from leanloader.dataloader.protocol import (
    CONTROL,
    SHUTDOWN,
    WAIT_FOR_SLOT,
    BatchReady,
    Close,
    Config,
    Exhausted,
    Failed,
    Fetch,
    Forget,
    InSegment,
    InSlot,
    Offer,
    Pickled,
    Resume,
    raised_by_user_code,
    was_raised_by_user_code,
)
from leanloader.dataloader.segments import segment_reference, torch_dtype_names

# Batch segments are whole pages.
PAGE = 4096
# A task's slot when the main process's pool is full: before making a segment
# of its own, the worker waits up to WAIT_FOR_SLOT_S for the main process to
# offer one that the consumer dropped (as ll.Loader's workers wait 100 ms).
WAIT_FOR_SLOT_S = 0.1
# What ps and top show for a worker (torch's are "pt_data_worker").
WORKER_NAME = "ll_data_worker"

# --- errors ------------------------------------------------------------------------------


_MACHINERY_DIR = os.path.dirname(os.path.abspath(__file__))


def _raised_by_leanloader(error: BaseException) -> bool:
    """True when the innermost frame of `error` is the DataLoader machinery's
    own code (a full shared-memory directory, a segment that cannot be made),
    not the dataset's or the collate function's (leanloader functions a
    dataset calls, such as ll.decode_image, count as the dataset's)."""
    if was_raised_by_user_code(error):
        return False
    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and os.path.abspath(frames[-1].filename).startswith(_MACHINERY_DIR + os.sep)


def describe_error(error: BaseException, where: str) -> dict[str, Any]:
    """What the main process needs to re-raise `error` as torch re-raises a
    worker's exception: its type, and its traceback text. `where` is torch's
    phrase ("in DataLoader worker process 0"). leanloader's own errors travel
    whole (type, errno, message), with the traceback as a note."""
    info: dict[str, Any] = {
        "module": type(error).__module__,
        "qualname": type(error).__qualname__,
        "message": str(error),
        "traceback": "".join(traceback.format_exception(error)),
        "where": where,
    }
    if _raised_by_leanloader(error):
        try:
            info["own"] = pickle.dumps(error)
        except Exception:
            pass
    return info


def rebuild_error(info: dict[str, Any]) -> BaseException:
    """The exception torch's ExceptionWrapper.reraise() raises for the
    worker's: the same type built from "Caught ValueError in DataLoader
    worker process 0.\nOriginal Traceback (most recent call last): ..."
    (KeyError's message kept readable, a type that cannot be built from one
    message becomes RuntimeError), made by torch's own code."""
    from torch._utils import ExceptionWrapper

    if info.get("own") is not None:
        try:
            error = pickle.loads(info["own"])
            error.add_note(f"Raised {info['where']}:\n{info['traceback']}")
            return error
        except Exception:
            pass
    try:
        module = sys.modules.get(info["module"]) or __import__(info["module"])
        cls: Any = module
        for part in info["qualname"].split("."):
            cls = getattr(cls, part)
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            raise TypeError(cls)
    except Exception:
        cls = RuntimeError
    wrapper = ExceptionWrapper.__new__(ExceptionWrapper)
    wrapper.exc_type = cls
    wrapper.exc_msg = info["traceback"]
    wrapper.where = info["where"]
    try:
        wrapper.reraise()
    except BaseException as error:  # the exception torch would raise
        error.__traceback__ = None
        return error
    return RuntimeError(f"Caught {info['qualname']} {info['where']}.\n{info['traceback']}")


# --- the worker ---------------------------------------------------------------------------


class WorkerSetup:
    """Everything a worker needs, pickled once by the main process."""

    def __init__(
        self, dataset: Any, dataset_kind: int, auto_collation: bool, collate_fn: Any,
        drop_last: bool, worker_init_fn: Any,
    ) -> None:  # fmt: skip
        self.dataset = dataset
        self.dataset_kind = dataset_kind
        self.auto_collation = auto_collation
        self.collate_fn = collate_fn
        self.drop_last = drop_last
        self.worker_init_fn = worker_init_fn
        # (world size, rank) for an IterDataPipe sharded across workers, else None
        self.sharding: tuple[int, int] | None = None
        # torch's process-wide settings as the main process has them when the
        # pass starts: a forked worker (torch's default) inherits them; a
        # worker from the fork server or spawn gets them here.
        import torch

        self.torch_state = {
            "default_dtype": torch.get_default_dtype(),
            "grad_enabled": torch.is_grad_enabled(),
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        }


def apply_torch_state(state: dict[str, Any] | None) -> None:
    """Sets a worker's torch settings to the main process's (WorkerSetup)."""
    if not state:
        return
    import torch

    torch.set_default_dtype(state["default_dtype"])
    torch.set_grad_enabled(state["grad_enabled"])
    wanted = (state["deterministic"], state["deterministic_warn_only"])
    if wanted != (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    ):
        # Only when it changes something: the call imports torch._inductor
        # (sympy and ~800 modules: 100 MiB of private memory and seconds of
        # start-up in every worker).
        torch.use_deterministic_algorithms(wanted[0], warn_only=wanted[1])


def identity(value: Any) -> Any:
    return value


def _seed(base_seed: int, worker_id: int) -> int:
    """Seeds random, numpy and torch exactly as torch's _worker_loop does."""
    seed = base_seed + worker_id
    random.seed(seed)
    import torch
    from torch.utils.data._utils.worker import _generate_state

    torch.manual_seed(seed)
    try:
        import numpy as np
    except ImportError:
        return seed
    np.random.seed(_generate_state(base_seed, worker_id))
    return seed


def _apply_shared_seed(dataset: Any, shared_seed: Any) -> Any:
    """torch's worker: an IterDataPipe's random parts seeded from the seed
    shared by all workers."""
    if shared_seed is None:
        return dataset
    import torch
    from torch.utils.data.graph_settings import apply_random_seed

    shared_rng = torch.Generator()
    shared_rng.manual_seed(shared_seed)
    return apply_random_seed(dataset, shared_rng)


def worker_main(
    worker_id: int,
    num_workers: int,
    holder: list,
    base_seed: int,
    shared_seed: Any,
    parent_pid: int,
    tasks: Any,
    results: Any,
    main_pid: int = 0,
) -> None:
    """Entry point of a worker process (the target of multiprocessing.Process)."""
    # Ctrl-C goes to the whole process group; the main process handles it and
    # shuts the workers down, so a worker must not die of it mid-write.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # (fork server: blocked)
    # As torch names its workers pt_data_worker: visible in ps and top.
    try:
        _core.set_process_name(WORKER_NAME)
    except OSError:
        pass
    if not _core.set_parent_death_signal(signal.SIGKILL, parent_pid):
        os._exit(0)  # the main process is already gone
    # A fork server's child outlives a killed main process while the server
    # lingers (it and its children hold each other's pipes): watch the main
    # process itself.
    if not _core.exit_with_process(main_pid):
        os._exit(0)
    where = f"in DataLoader worker process {worker_id}"  # torch's words
    import torch
    from torch.utils.data._utils import worker as torch_worker
    from torch.utils.data._utils.collate import default_collate, default_convert
    from torch.utils.data.dataloader import _DatasetKind

    torch.set_num_threads(1)
    torch_names = torch_dtype_names()
    init_error: dict[str, Any] | None = None
    init_error_sent = False
    reached_init = False
    fetcher = None
    streamed: StreamedFetch | None = None
    setup: WorkerSetup | None = None
    try:
        # The dataset as bytes (pickled once by the main process, or by
        # Process.start() for datasets holding multiprocessing objects) or,
        # with fork, the object itself. The bytes are let go once unpickled:
        # the holder list is what Process._args keeps for the worker's life.
        received = holder.pop()
        setup = pickle.loads(received) if isinstance(received, bytes) else received
        del received
        apply_torch_state(getattr(setup, "torch_state", None))
        seed = _seed(base_seed, worker_id)
        setup.dataset = _apply_shared_seed(setup.dataset, shared_seed)
        torch_worker._worker_info = torch_worker.WorkerInfo(
            id=worker_id, num_workers=num_workers, seed=seed, dataset=setup.dataset
        )
        collate = setup.collate_fn
        if collate is default_collate or collate is default_convert:
            # torch's default collate allocates torch shared memory when it
            # sees it is in a worker; here the batch goes into a slot instead.
            collate = _outside_worker_info(collate, torch_worker)
        if setup.collate_fn is default_collate:
            # Stacked straight into the batch's segment (see UncollatedBatch).
            collate = functools.partial(UncollatedBatch, collate=collate, whole=default_collate)

        def make_fetcher() -> Any:
            return _DatasetKind.create_fetcher(
                setup.dataset_kind, setup.dataset, setup.auto_collation, collate, setup.drop_last
            )

        if setup.sharding is not None:
            # torch's _sharding_worker_init_fn: ranks first, then workers
            from torch.utils.data.graph_settings import apply_sharding

            world_size, rank = setup.sharding
            apply_sharding(setup.dataset, num_workers * world_size, worker_id * world_size + rank)
        reached_init = True
        if setup.worker_init_fn is not None:
            try:
                setup.worker_init_fn(worker_id)
            except BaseException as error:
                raise raised_by_user_code(error)  # noqa: B904 - the same error, marked

        fetcher = make_fetcher()
        if (
            setup.collate_fn is default_collate
            and setup.auto_collation
            and setup.dataset_kind == _DatasetKind.Map
            and not getattr(setup.dataset, "__getitems__", None)
        ):
            # torch's _MapDatasetFetcher, one sample at a time into the batch's rows
            streamed = StreamedFetch(
                setup.dataset, collate.keywords["collate"], default_collate, torch_names
            )
    except Exception as error:
        init_error = describe_error(error, where)

    slots = _BatchMemory()
    pending: collections.deque = collections.deque()
    # torch's iteration_end: once an iterable dataset's stream has ended, the
    # tasks still queued to this worker are answered "ended" without calling
    # next() again (an iterator that rewinds itself at its end gave samples
    # of a second round; one that refuses next() once closed, an error).
    iteration_end = False
    while True:
        if pending:
            message = pending.popleft()
        else:
            try:
                message = tasks.recv()
            except (EOFError, OSError):
                break  # the main process closed the pipe or died
            if slots.control(message):
                continue
        if message is SHUTDOWN:
            break
        if isinstance(message, Resume):
            iteration_end = False
            if init_error is not None and init_error_sent and reached_init:
                # torch's worker builds its fetcher again on _ResumeIteration
                # even after a failed worker_init_fn: a persistent worker
                # whose failure was reported loads in the next pass. (A
                # failure before the init, such as unpickling, stays.)
                init_error, init_error_sent = None, False
            if init_error is None:
                try:
                    setup.dataset = _apply_shared_seed(setup.dataset, message.shared_seed)
                    fetcher = make_fetcher()
                    if streamed is not None:
                        streamed.dataset = setup.dataset
                except Exception as error:
                    init_error = describe_error(error, where)
            continue
        assert isinstance(message, Fetch), message
        epoch, task, index, slot = message
        # A shutdown queued behind this task: skip it and what follows, as
        # torch's workers skip their queue once the loader is done.
        slots.drain(tasks, pending)
        if any(queued is SHUTDOWN for queued in pending):
            break
        if init_error is not None:
            results.send(Failed(epoch, task, init_error))
            init_error_sent = True
            continue
        if iteration_end:
            results.send(Exhausted(epoch, task))
            continue
        task_slot = _TaskSlot(slots, tasks, pending, epoch, task, slot)
        streaming = streamed is not None and type(index) in (list, tuple) and len(index) > 0
        try:
            if streaming:
                batch = streamed.fetch(index, task_slot.destination)
            else:
                batch = fetcher.fetch(index)
        except StopIteration as stop:
            # The end of an iterable dataset's stream; from a map-style
            # dataset it is a bug raised by __getitem__, an error as in torch.
            if setup.dataset_kind == _DatasetKind.Iterable:
                iteration_end = True
                results.send(Exhausted(epoch, task))
            else:
                results.send(Failed(epoch, task, describe_error(stop, where)))
            continue
        except Exception as error:
            results.send(Failed(epoch, task, describe_error(error, where)))
            continue
        try:
            if streaming and not isinstance(batch, UncollatedBatch):
                payload = batch  # streamed into its segment: the payload already
            else:
                payload = slots.payload(batch, task_slot.resolve(), torch_names)
            del batch
        except Exception as error:
            results.send(Failed(epoch, task, describe_error(error, where)))
            continue
        results.send(BatchReady(epoch, task, payload))
    # Leave without interpreter finalization: nothing of the worker's state
    # needs tearing down (the main process owns every shared segment), and the
    # dataset's destructors must not run with half-finalized modules.
    # multiprocessing's exit handlers run first, as at a normal exit: a Queue
    # the dataset put items in flushes them from its feeder thread.
    try:
        import multiprocessing.util

        multiprocessing.util._exit_function()
    except Exception:
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _outside_worker_info(collate: Any, torch_worker: Any) -> Any:
    def collate_here(batch: Any) -> Any:
        info = torch_worker._worker_info
        torch_worker._worker_info = None
        try:
            return collate(batch)
        finally:
            torch_worker._worker_info = info

    return collate_here


class _BatchMemory:
    """A worker's side of the batch memory: offers of the main process's
    segments, segments of the main process mapped here (by pool id), and
    segments this worker created until the main process has attached them."""

    def __init__(self) -> None:
        self.shm_dir: str | None = None
        self.offers: dict[tuple[int, int], tuple] = {}
        self.attached: dict[int, Any] = {}
        self.created: dict[int, Any] = {}
        self.last_task = (-1, -1)

    def control(self, message: Any) -> bool:
        """Handles a control message (protocol.CONTROL); False for the others
        (Fetch, Resume, SHUTDOWN)."""
        if not isinstance(message, CONTROL):
            return False
        if isinstance(message, Offer):
            if (message.epoch, message.task) > self.last_task:
                self.offers[(message.epoch, message.task)] = message.slot
        elif isinstance(message, Close):
            self.created.pop(message.fd, None)
        elif isinstance(message, Forget):
            self.attached.pop(message.pool_id, None)
        elif isinstance(message, Config):
            self.shm_dir = message.shm_dir
        return True

    def drain(self, tasks: Any, pending: collections.deque) -> None:
        """Reads what the main process sent so far without waiting."""
        try:
            while tasks.poll():
                message = tasks.recv()
                if not self.control(message):
                    pending.append(message)
        except (EOFError, OSError):
            pass  # the next recv reports it

    def wait_for_offer(self, tasks: Any, pending: collections.deque, epoch: int, task: int) -> Any:
        """The offer for (epoch, task) if one comes within WAIT_FOR_SLOT_S."""
        deadline = time.monotonic() + WAIT_FOR_SLOT_S
        while (epoch, task) not in self.offers:
            left = deadline - time.monotonic()
            try:
                if left <= 0 or not tasks.poll(left):
                    break
                message = tasks.recv()
            except (EOFError, OSError):
                break
            if not self.control(message):
                pending.append(message)
        return None

    def slot_for(self, epoch: int, task: int, slot: Any) -> Any:
        self.last_task = (epoch, task)
        offered = self.offers.pop((epoch, task), None)
        for key in [key for key in self.offers if key < self.last_task]:
            del self.offers[key]
        return slot if slot is not None else offered

    def payload(self, batch: Any, slot: Any, torch_names: dict) -> tuple:
        planned = None
        if isinstance(batch, UncollatedBatch):
            planned = plan_stacked(batch, torch_names)
            if planned is None or planned[2] == 0:
                batch, planned = batch.collated(), None
        template, copies, needed = planned or plan_batch(batch, torch_names)
        if needed == 0:
            # Through multiprocessing's ForkingPickler, as torch's result
            # queue sends a batch: tensors of a dtype no slot holds (float8,
            # complex32) go by torch's shared-memory reductions; plain pickle
            # took its legacy storage path, which cannot load them.
            data = ForkingPickler.dumps(batch, pickle.HIGHEST_PROTOCOL)
            return Pickled(bytes(data))
        target = self.destination(slot, needed)
        for offset, array in copies:
            target.segment.write(target.base + offset, array)
        return target.finish(template)

    def destination(self, slot: Any, needed: int) -> _Destination:
        """Where a batch of `needed` bytes goes: the offered slot when it fits,
        else a new segment of this worker's, sized to the batch."""
        if slot is not None and needed <= slot.slot_bytes:
            segment = self.attached.get(slot.pool_id)
            if segment is None:
                owner, fd, inode = slot.segment
                segment = _core.SharedSegment.attach(f"/proc/{owner}/fd/{fd}")
                if os.fstat(segment.fd).st_ino != inode:
                    raise RuntimeError(f"batch slot /proc/{owner}/fd/{fd} was replaced")
                self.attached[slot.pool_id] = segment
            return _Destination(self, segment, slot.slot_offset, slot)
        size = (needed + PAGE - 1) // PAGE * PAGE
        return _Destination(self, _core.SharedSegment.create(size, self.shm_dir), 0, None)


class _TaskSlot:
    """A task's slot, resolved once, when the batch is about to be written:
    offers that came meanwhile, or a wait for one (WAIT_FOR_SLOT)."""

    def __init__(
        self, memory: _BatchMemory, tasks: Any, pending: Any, epoch: int, task: int, slot: Any
    ) -> None:
        self.memory, self.tasks, self.pending = memory, tasks, pending
        self.epoch, self.task, self.slot = epoch, task, slot
        self.resolved = False

    def resolve(self) -> Any:
        if not self.resolved:
            memory = self.memory
            memory.drain(self.tasks, self.pending)
            if self.slot == WAIT_FOR_SLOT:
                self.slot = memory.wait_for_offer(self.tasks, self.pending, self.epoch, self.task)
            self.slot = memory.slot_for(self.epoch, self.task, self.slot)
            self.resolved = True
        return self.slot

    def destination(self, needed: int) -> _Destination:
        return self.memory.destination(self.resolve(), needed)


class _Destination:
    """A batch's place: `base` in `segment`, a slot the main process offered
    (`slot`, a SlotOffer) or a segment of this worker's (`slot` None)."""

    __slots__ = ("base", "memory", "segment", "slot")

    def __init__(self, memory: _BatchMemory, segment: Any, base: int, slot: Any) -> None:
        self.memory, self.segment, self.base, self.slot = memory, segment, base, slot

    def finish(self, template: Any) -> tuple:
        """The payload that tells the main process where the batch is."""
        if self.slot is not None:
            return InSlot(self.slot.pool_id, self.slot.slot_id, template)
        self.memory.created[int(self.segment.fd)] = self.segment
        return InSegment(segment_reference(self.segment), self.segment.size, template)

    def discard(self) -> None:
        """Gives up the place (the batch is written again elsewhere); a
        segment of this worker's is freed."""
        self.segment = None
