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

from leanloader.dataloader.front import DataLoader

__all__ = ["DataLoader"]
