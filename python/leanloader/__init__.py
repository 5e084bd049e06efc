"""leanloader: a data-loading engine for ML training.

Native threads instead of worker processes, batch memory planned and recycled,
memory-mapped tensor caches shared by every reader, and the memory bill shown.
"""

from __future__ import annotations

from leanloader._core import DecompressionBombWarning, Error, FormatError
from leanloader.audit import audit
from leanloader.autobatch import AutoBatch
from leanloader.cache import TensorCache
from leanloader.hdf5 import HDF5Source, hdf5_library
from leanloader.image import (
    CenterCrop,
    ImageFolder,
    Images,
    Normalize,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    decode_image,
)
from leanloader.loader import Loader
from leanloader.memory import memory_report
from leanloader.packed import PackedTensor
from leanloader.planner import batch_defaults, estimate_memory, regularization_cost
from leanloader.safetensors import load_safetensors, save_safetensors
from leanloader.shared_records import SharedRecords
from leanloader.sources import ArraySource, FileSource, NpySource, Source

__all__ = [
    "ArraySource",
    "AutoBatch",
    "CenterCrop",
    "DataLoader",
    "DecompressionBombWarning",
    "Error",
    "FileSource",
    "FormatError",
    "HDF5Source",
    "ImageFolder",
    "Images",
    "Loader",
    "Normalize",
    "NpySource",
    "PackedTensor",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "Resize",
    "SharedRecords",
    "Source",
    "TensorCache",
    "audit",
    "batch_defaults",
    "decode_image",
    "estimate_memory",
    "hdf5_library",
    "load_safetensors",
    "memory_report",
    "regularization_cost",
    "save_safetensors",
]
__all__ += ["install", "uninstall"]
__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # ll.DataLoader subclasses torch's DataLoader: torch is imported when it
    # is first used, so that leanloader's own loaders work without torch.
    if name == "DataLoader":
        from leanloader.dataloader.front import DataLoader

        return DataLoader
    if name in ("install", "uninstall"):
        from leanloader.dataloader import install as installing

        return getattr(installing, name)
    raise AttributeError(f"module 'leanloader' has no attribute {name!r}")
