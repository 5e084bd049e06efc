"""leanloader: a data-loading engine for ML training.

Native threads instead of worker processes, batch memory planned and recycled,
memory-mapped tensor caches shared by every reader, and the memory bill shown.
"""

from __future__ import annotations

from leanloader._core import Error, FormatError
from leanloader.loader import Loader
from leanloader.sources import ArraySource, FileSource, NpySource, Source

__all__ = [
    "ArraySource",
    "Error",
    "FileSource",
    "FormatError",
    "Loader",
    "NpySource",
    "Source",
]
__version__ = "0.1.0"
