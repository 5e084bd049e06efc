"""The attributes torch's DataLoader iterators carry, on ours.

torch's ``_BaseDataLoaderIter`` (and its multiprocessing subclass) copy the
loader's settings into private attributes that code around a loader reads
(``loader._iterator._persistent_workers``, a framework's ``_dataset``).
Ours compute what they need in their own names; this sets torch's names
from the loader as torch's constructors do, without drawing random numbers
or touching the sampler, and leaves alone an attribute the iterator has
already set.
"""

from __future__ import annotations

from typing import Any


def set_torch_iterator_attributes(iterator: Any, loader: Any, workers: bool) -> None:
    import torch
    from torch.utils.data.dataloader import _get_distributed_settings

    world_size, rank = _get_distributed_settings()
    pin_memory = bool(loader.pin_memory) and torch.accelerator.is_available()
    accelerator = torch.accelerator.current_accelerator() if pin_memory else None
    values = {
        "_dataset": loader.dataset,
        "_dataset_kind": loader._dataset_kind,
        "_IterableDataset_len_called": loader._IterableDataset_len_called,
        "_auto_collation": loader._auto_collation,
        "_drop_last": loader.drop_last,
        "_num_workers": loader.num_workers,
        "_world_size": world_size,
        "_rank": rank,
        "_pin_memory": pin_memory,
        "_pin_memory_device": accelerator.type if accelerator is not None else None,
        "_timeout": loader.timeout,
        "_collate_fn": loader.collate_fn,
        "_persistent_workers": loader.persistent_workers,
    }
    if workers:
        values |= {
            "_prefetch_factor": loader.prefetch_factor,
            "_in_order": loader.in_order,
            "_worker_init_fn": loader.worker_init_fn,
        }
    for name, value in values.items():
        if not hasattr(iterator, name):
            setattr(iterator, name, value)
