"""worker_mode="thread": the dataset runs on native threads owned by the engine."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from leanloader.dataloader.front import DataLoader


# --- threads --------------------------------------------------------------------------------


def _fetch_in_thread(task: tuple[DataLoader, Any], worker: int) -> Any:
    loader, index = task
    if loader._auto_collation:
        return loader.collate_fn([loader.dataset[i] for i in index])
    return loader.collate_fn(loader.dataset[index])


class ThreadIterator:
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

    def __iter__(self) -> ThreadIterator:
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
