"""The messages between ll.DataLoader's main process and its worker processes.

Each worker has two pipes: tasks (main -> worker), written only by the main
process's TaskSender thread (task_sender.py: the main process never blocks
on a write to a worker), and results (worker -> main)::

    main -> worker                             worker -> main
    Config(shm_dir)            once, first
    Fetch(epoch, task, index, slot)        ->  BatchReady(epoch, task, payload)
                                               Exhausted(epoch, task)   # iterable's end
                                               Failed(epoch, task, error)
    Offer(epoch, task, slot)   a slot for a task sent without one
    Close(fd)                  the main process attached the worker's segment
    Forget(pool_id)            the main process no longer reuses that pool
    Resume(epoch, shared_seed) persistent workers: a new epoch
    SHUTDOWN                   skip what is queued and exit

A batch travels in shared memory; its payload says where:

    InSlot(pool_id, slot_id, template)      a slot the main process offered
    InSegment(reference, size, template)    a segment the worker made for it
    Pickled(data)                           no numeric array at all: pickled

`template` describes the batch's structure, dtypes, shapes and offsets
(worker.py: plan_batch / unpack_batch). Messages are named tuples: they
pickle as small tuples and read by field name on both sides.
"""

from __future__ import annotations

from typing import Any, NamedTuple

# --- whose error --------------------------------------------------------------------------


def raised_by_user_code(error: BaseException) -> BaseException:
    """Marks `error` as raised by the dataset, collate_fn or worker_init_fn
    the machinery called, and returns it: re-raised in torch's form ("Caught
    IndexError in DataLoader worker process 0."), never as leanloader's own,
    even when the callable is C code (a list, a tensor) whose error has no
    frame of its own, only the machinery's line that called it."""
    try:
        error._leanloader_raised_by_user_code = True  # type: ignore[attr-defined]
    except AttributeError:
        pass  # an exception type without instance attributes: the frames decide
    return error


def was_raised_by_user_code(error: BaseException) -> bool:
    return bool(getattr(error, "_leanloader_raised_by_user_code", False))


def sample_of(dataset: Any, index: Any) -> Any:
    """dataset[index], its error marked as the dataset's."""
    try:
        return dataset[index]
    except BaseException as error:
        raise raised_by_user_code(error)  # noqa: B904 - the same error, marked


# --- main -> worker -----------------------------------------------------------------------


class SlotOffer(NamedTuple):
    """A slot of one of the main process's batch pools: where a worker may
    write a batch (the pool's segment, attached once per worker)."""

    pool_id: int
    segment: tuple[int, int, int]  # worker.segment_reference of the pool's segment
    slot_id: int
    slot_bytes: int
    slot_offset: int


# Fetch.slot when the pool is full: wait a moment for an Offer before the
# worker makes a segment of its own.
WAIT_FOR_SLOT = "wait"


class Config(NamedTuple):
    shm_dir: str | None


class Fetch(NamedTuple):
    epoch: int
    task: int
    index: Any  # a list of sample indices, one index, or None (iterable datasets)
    slot: SlotOffer | str | None  # a SlotOffer, WAIT_FOR_SLOT or None


class Offer(NamedTuple):
    epoch: int
    task: int
    slot: SlotOffer


class Close(NamedTuple):
    fd: int


class Forget(NamedTuple):
    pool_id: int


class Resume(NamedTuple):
    epoch: int
    shared_seed: Any


SHUTDOWN = None

# --- worker -> main -----------------------------------------------------------------------


class InSlot(NamedTuple):
    pool_id: int
    slot_id: int
    template: Any


class InSegment(NamedTuple):
    segment: tuple[int, int, int]  # worker.segment_reference of the worker's segment
    size: int
    template: Any


class Pickled(NamedTuple):
    data: bytes


class BatchReady(NamedTuple):
    epoch: int
    task: int
    payload: InSlot | InSegment | Pickled


class Exhausted(NamedTuple):
    epoch: int
    task: int


class Failed(NamedTuple):
    epoch: int
    task: int
    error: dict  # worker.describe_error


# The messages the worker handles between tasks (they need no answer).
CONTROL = (Offer, Close, Forget, Config)
