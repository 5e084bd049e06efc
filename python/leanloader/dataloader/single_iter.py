"""num_workers=0: batches fetched in the calling thread, with torch's
draws from the generator (the IterDataPipe shared seed, the sampler, the
base seed) in torch's order."""

from __future__ import annotations

from typing import Any

from leanloader.dataloader.iterator_attributes import set_torch_iterator_attributes
from leanloader.dataloader.seeding import (
    datapipe_seed,
    distributed_settings,
    draw_base_seed,
    is_datapipe,
)


class SingleProcessIterator:
    """One pass in this thread: torch's _SingleProcessDataLoaderIter."""

    def __init__(self, loader: Any) -> None:
        from torch.utils.data import _DatasetKind
        from torch.utils.data.graph_settings import apply_sharding

        if loader.timeout != 0:
            raise AssertionError("_SingleProcessDataLoaderIter requires timeout == 0")
        self._dataset, _ = datapipe_seed(loader, loader.dataset)
        self._index_sampler = loader._index_sampler
        self._sampler_iter = iter(self._index_sampler)
        self._base_seed = draw_base_seed(loader.generator)
        if is_datapipe(self._dataset):
            world_size, rank = distributed_settings()
            apply_sharding(self._dataset, world_size, rank)
        self._fetcher = _DatasetKind.create_fetcher(
            loader._dataset_kind, self._dataset, loader._auto_collation, loader.collate_fn,
            loader.drop_last,
        )  # fmt: skip
        self.alive = True
        set_torch_iterator_attributes(self, loader, workers=False)

    def __iter__(self) -> SingleProcessIterator:
        return self

    def __len__(self) -> int:
        return len(self._index_sampler)

    def __next__(self) -> Any:
        index = next(self._sampler_iter)  # may raise StopIteration
        return self._fetcher.fetch(index)  # may raise StopIteration
