"""The main process's batch segments: which shared segment each task's batch
is written into, which segments are kept for reuse, and when workers are
told to wait for one or to make their own.

torch's workers put every batch into fresh shared memory that is freed when
the consumer drops it. Ours write into a segment the main process offers
when one is free (a kept segment the consumer let go), else into one they
make and the main process adopts. The plan, like ll.Loader's slots: at most
prefetch_factor x workers (in flight) + 1 (held by the consumer) segments
kept, none above KEEP_SEGMENT_MAX_BYTES, and no more bytes than the loader's
memory_budget; a segment beyond that is freed when its batch is dropped.

ProcessIterator (process_iter.py) keeps torch's task bookkeeping and asks
this class, per task, for a slot (`slot_for`), and per result, for the
batch (`batch_in_slot`, `batch_in_segment`). Messages to workers (Offer,
Forget) go through the `send` callable it is given.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from leanloader import _core
from leanloader.dataloader.batch_template import unpack_batch
from leanloader.dataloader.protocol import WAIT_FOR_SLOT, Forget, Offer, SlotOffer
from leanloader.dataloader.segments import segment_reference

# Batch segments larger than this are not kept for reuse: each is freed when
# the consumer drops its batch, as torch frees its shared batches. A kept
# segment is a whole batch of memory while it waits for its next batch (up
# to one per task sent ahead), memory torch would not hold. The planner bills
# both cases (src/memory/loader_memory_plan.cc, where the size is chosen).
KEEP_SEGMENT_MAX_BYTES = _core.KEPT_BATCH_SEGMENT_MAX_BYTES


class _Kept:
    """A batch segment kept for reuse, and the id workers cache it under."""

    __slots__ = ("pool", "pool_id")

    def __init__(self, pool: Any, pool_id: int) -> None:
        self.pool, self.pool_id = pool, pool_id


class BatchSegments:
    """The segments batches travel in, for one set of workers.

    `send(worker, message)` delivers a message to a worker (never blocking);
    `pinning` is dataloader.pin.InPlacePinning when segments are page-locked
    in place (pin_memory=True on a GPU), else None."""

    def __init__(
        self,
        num_workers: int,
        prefetch_factor: int,
        memory_budget: Any,
        pinning: Any,
        send: Callable[[int, Any], None],
    ) -> None:
        self._num_workers = num_workers
        self._send = send
        self._pinning = pinning
        # Segments page-locked in place come back when the device's copies
        # from them have run (dataloader/pin.py).
        self.fence = pinning.fence if pinning is not None else None
        self._kept: list[_Kept] = []
        self._cap = prefetch_factor * num_workers + 1
        budget_ok = isinstance(memory_budget, int) and memory_budget > 0
        self._budget = memory_budget if budget_ok else None
        self._pool_id = 0
        self._epoch = 0
        # (epoch, task) -> (pool, slot) for tasks offered a kept segment.
        self._task_slot: dict[tuple[int, int], tuple[Any, int]] = {}
        # task -> worker for tasks of this epoch not yet offered a segment.
        self._unoffered: dict[int, int] = {}
        # Tasks of this epoch whose worker makes the segment (the pool is
        # still growing): they count towards the planned number of segments.
        self._creating: set[int] = set()
        # Tasks sent with WAIT_FOR_SLOT; once such a wait goes unanswered (the
        # consumer keeps its batches: list(loader)), workers stop waiting
        # until the consumer drops a segment again.
        self._waiting: set[int] = set()
        self._hoarding = False

    @property
    def kept_pools(self) -> tuple[Any, ...]:
        """The segments kept for reuse now (each a one-slot SlotPool)."""
        return tuple(kept.pool for kept in self._kept)

    def start_epoch(self, epoch: int) -> None:
        """Tasks of earlier epochs keep their slots until their (stale)
        results arrive: a worker may still be writing into them."""
        self._epoch = epoch
        self._unoffered = {}
        self._creating = set()
        self._waiting = set()

    def slot_for(self, task: int, worker: int) -> SlotOffer | str | None:
        """What a new task's Fetch carries: a free kept segment's slot; else
        WAIT_FOR_SLOT when the plan is full (the worker waits a moment for a
        segment the consumer drops), or None (the worker makes its own)."""
        slot = self._take_slot(task)
        if slot is not None:
            return slot
        self._unoffered[task] = worker
        if not self._plan_full():
            self._creating.add(task)
            return None
        if self._hoarding:
            return None
        self._waiting.add(task)
        return WAIT_FOR_SLOT

    def answered(self, epoch: int, task: int) -> None:
        """A worker answered `task`: it needs no offer any more."""
        if epoch == self._epoch:
            self._unoffered.pop(task, None)
            self._creating.discard(task)

    def drop(self, task: int, epoch: int | None = None) -> None:
        """The task's result carries no batch (or is stale): its slot goes back."""
        held = self._task_slot.pop((self._epoch if epoch is None else epoch, task), None)
        if held is not None:
            held[0].release(held[1])

    def batch_in_slot(self, task: int, template: Any) -> Any:
        """The batch a worker wrote into the slot offered for `task`."""
        pool, slot = self._task_slot.pop((self._epoch, task))
        return unpack_batch(template, pool.hold(slot, self.fence))

    def batch_in_segment(self, task: int, segment: Any, size: int, template: Any) -> Any:
        """The batch a worker wrote into a segment of its own (none was free
        when the task was sent, or the offered one was too small), attached
        here as `segment`: adopted, and kept for reuse when the plan allows."""
        offered = self._task_slot.pop((self._epoch, task), None)
        if task in self._waiting and offered is None:
            self._hoarding = True  # the wait was in vain
        self._waiting.discard(task)
        if self._pinning is not None:
            pool = self._pinning.adopt(segment, size)
        else:
            pool = _core.SlotPool.adopt(segment, size, 1)
        if offered is not None:
            offered[0].release(offered[1])
            if offered[0].slot_bytes < size:
                self._forget(offered[0])  # too small for these batches
        self._keep(pool)
        slot = pool.acquire()
        return unpack_batch(template, pool.hold(slot, self.fence))

    def offer_free(self) -> None:
        """Segments the consumer dropped go to tasks sent while none was
        free (the worker takes the offer if it has not written its batch
        yet, else it made its own segment). Pinned segments whose device
        copies have run are collected first."""
        self.collect_pinned()
        for task, worker in list(self._unoffered.items()):
            slot = self._take_slot(task)
            if slot is None:
                return
            del self._unoffered[task]
            self._send(worker, Offer(self._epoch, task, slot))

    def collect_pinned(self) -> None:
        """Takes back the pinned segments whose device copies have run (their
        slots become free for offers, or the segments are freed)."""
        if self.fence is not None:
            self.fence.collect()

    def release_kept(self) -> None:
        """Frees the segments kept for reuse (those still viewed by a batch
        are freed when it is dropped), as torch holds nothing between epochs.
        Pinned segments whose copies have run go too (those the device still
        reads go at the next call)."""
        self.collect_pinned()
        for kept in list(self._kept):
            self._forget(kept.pool)

    def close(self) -> None:
        """The workers are gone: nothing is offered or kept any more."""
        for pool, slot in self._task_slot.values():
            pool.release(slot)
        self._task_slot = {}
        self._kept = []
        self._unoffered = {}
        self.collect_pinned()

    def _keep(self, pool: Any) -> None:
        """Keeps `pool` for reuse when the cap and the budget allow; else it
        is freed once its batch is dropped."""
        if len(self._kept) >= self._cap or pool.slot_bytes > KEEP_SEGMENT_MAX_BYTES:
            return
        if self._budget is not None:
            held = sum(kept.pool.slot_bytes for kept in self._kept)
            if held + pool.slot_bytes > self._budget:
                return
        self._pool_id += 1
        self._kept.append(_Kept(pool, self._pool_id))

    def _forget(self, pool: Any) -> None:
        """Stops reusing `pool`; the workers unmap it."""
        for kept in self._kept:
            if kept.pool is pool:
                self._kept.remove(kept)
                for worker in range(self._num_workers):
                    self._send(worker, Forget(kept.pool_id))
                return

    def _plan_full(self) -> bool:
        """Whether the segments kept and being made reach the plan."""
        planned = len(self._kept) + len(self._creating)
        if planned >= self._cap:
            return True
        if self._budget is None or not self._kept:
            return False
        largest = max(kept.pool.slot_bytes for kept in self._kept)
        held = sum(kept.pool.slot_bytes for kept in self._kept)
        return held + largest * (len(self._creating) + 1) > self._budget

    def _take_slot(self, task: int) -> SlotOffer | None:
        """The smallest free kept segment for `task`, as the worker needs it,
        or None. A worker whose batch does not fit makes its own, and the
        main process stops keeping the one that was too small."""
        free = [kept for kept in self._kept if kept.pool.slots_in_use == 0]
        if not free:
            return None
        kept = min(free, key=lambda k: k.pool.slot_bytes)
        pool = kept.pool
        slot_id = pool.acquire()
        if slot_id is None:
            return None
        self._hoarding = False  # the consumer let a segment go
        self._task_slot[(self._epoch, task)] = (pool, slot_id)
        return SlotOffer(kept.pool_id, segment_reference(pool.segment), slot_id, pool.slot_bytes,
                         pool.slot_offset(slot_id))  # fmt: skip
