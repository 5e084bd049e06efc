"""ll.DataLoader: torch's DataLoader (a subclass of it) over an existing
Python dataset, with one copy of the dataset instead of one per worker.

torch is the spec: arguments, defaults (``persistent_workers=False``...),
validation errors, the attribute guard, warnings, the batches and their order
are torch's: the same samplers, the same draws from ``generator`` in the same
order (an IterDataPipe's shared seed, the sampler, the base seed: a new one
each pass unless workers are persistent), batch i sent to worker i %
num_workers, the same fetchers, the same per-worker seeding of random / numpy
/ torch, ``worker_init_fn`` and a fresh copy of the dataset in every pass's
workers, IterDataPipe sharding across workers. What differs:

- Workers are started by forkserver (default) or spawn; fork only when asked
  for by name (``multiprocessing_context="fork"``), and then refused once a
  GPU runtime is initialised in the process unless ``force_fork=True`` (fork
  deadlocks then). The fork server is a fork of the main process when no
  GPU runtime is initialised at the first pass of such a loader (its workers
  have the program's modules, ``__main__`` included), else a fresh
  interpreter; workers of a fresh one import the main script only when what
  they receive is defined there, and a loader started from the unguarded
  top level of such a script stops in the main process with an error naming
  the line and the fixes.
- The dataset is pickled once per pass, in the main process, into bytes that
  every worker receives through ``Process(args=...)`` and lets go once
  unpickled; NumPy arrays and CPU tensors of at least ``share_threshold``
  bytes travel as references to one shared copy the loader makes the first
  time (the dataset object is left as it was; in-place changes the main
  process makes to those arrays later are not seen by workers: pass
  ``share_in_place=True`` to move them into shared memory in place instead).
  ``np.memmap`` arrays are re-mapped from their file, ``ll.SharedRecords``
  travel as a reference. A dataset holding multiprocessing objects (Value,
  Event, Lock, Queue...) is pickled by each ``Process.start()`` instead, as
  those objects require.
- Collated batches come back through shared-memory segments written by the
  worker (sized to the batch, recycled while the consumer drops batches): the
  main process wraps them without copying. Only batches without any numeric
  array travel pickled through the worker's pipe; leaves that are not a
  strided CPU tensor / numeric NumPy array (strings, nested tensors, Python
  objects) travel pickled beside them.
- ``worker_mode="thread"`` runs the workers as native threads (map-style
  datasets): per-thread ``get_worker_info()``, ``worker_init_fn`` and seeds,
  but the process-wide random generators are shared and not reseeded.
- ``pin_memory=True`` pins in a pin thread, as torch does.
- A worker killed by a signal raises ``RuntimeError`` naming the worker, the
  signal and its samples within ``timeout`` (or 5 s); an exception in the
  dataset or collate_fn is re-raised with its own type, args and the worker's
  traceback (as a note).
- Shared memory never has a name (memfds, or O_TMPFILE files in a chosen
  ``shm_dir``): nothing is left behind after any exit, SIGKILL included, and
  Docker's 64 MiB /dev/shm does not limit it; workers die with the main
  process.
"""

__all__ = ["DataLoader"]


def __getattr__(name: str) -> object:
    if name == "DataLoader":
        from leanloader.dataloader.front import DataLoader

        return DataLoader
    raise AttributeError(f"module 'leanloader.dataloader' has no attribute {name!r}")
