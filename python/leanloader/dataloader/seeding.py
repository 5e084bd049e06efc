"""torch's draws and datapipe settings for a pass, shared by the three
iterators (single_iter, thread_iter, process_iter): the IterDataPipe's shared
seed, the base seed, the distributed settings, in torch's order."""

from __future__ import annotations

from typing import Any


def is_datapipe(dataset: Any) -> bool:
    from torch.utils.data.datapipes.datapipe import IterDataPipe, MapDataPipe

    return isinstance(dataset, (IterDataPipe, MapDataPipe))


def datapipe_seed(loader: Any, dataset: Any) -> tuple[Any, int | None]:
    """torch's _BaseDataLoaderIter: an IterDataPipe gets a shuffle seed shared
    by every worker (and every rank), drawn first from the generator."""
    import torch
    from torch.utils.data import IterDataPipe
    from torch.utils.data.graph_settings import apply_random_seed

    if not isinstance(dataset, IterDataPipe):
        return dataset, None
    from torch.utils.data.dataloader import _share_dist_seed

    seed = _share_dist_seed(loader.generator, None)
    shared_rng = torch.Generator()
    shared_rng.manual_seed(seed)
    return apply_random_seed(dataset, shared_rng), seed


def draw_base_seed(generator: Any) -> int:
    import torch

    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def distributed_settings() -> tuple[int, int]:
    from torch.utils.data.dataloader import _get_distributed_settings

    return _get_distributed_settings()
