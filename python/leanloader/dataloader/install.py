"""ll.install() / ll.uninstall(): ll.DataLoader in place of torch's, for code
that builds its own loaders (training frameworks, scripts one does not edit).

``install()`` rebinds ``torch.utils.data.DataLoader`` and
``torch.utils.data.dataloader.DataLoader`` to ``ll.DataLoader``. What is
affected and what is not:

- code that looks the name up after the call (``DataLoader(...)`` after
  ``from torch.utils.data import DataLoader`` or ``import torch.utils.data as
  data; data.DataLoader(...)`` run later) builds ``ll.DataLoader``s;
- classes defined after the call that subclass ``DataLoader`` (a framework's
  ``class InfiniteDataLoader(DataLoader)`` in a module imported after it)
  are ``ll.DataLoader`` subclasses;
- a module that ran ``from torch.utils.data import DataLoader`` *before* the
  call keeps torch's class under that name, and classes defined before the
  call stay torch subclasses: call ``install()`` first thing (or run the
  script with ``python -m leanloader.run script.py``);
- ``isinstance(loader, torch.utils.data.DataLoader)`` after install asks
  about ``ll.DataLoader``; every ``ll.DataLoader`` is also an instance of
  torch's original class.

``uninstall()`` puts torch's class back (loaders and subclasses made in
between stay leanloader's).
"""

from __future__ import annotations

from typing import Any

_original: Any = None


def install() -> None:
    """Replaces torch.utils.data.DataLoader by ll.DataLoader (idempotent)."""
    global _original
    import torch.utils.data
    import torch.utils.data.dataloader

    from leanloader.dataloader.front import DataLoader, _TorchDataLoader

    if _original is None:
        _original = _TorchDataLoader
    torch.utils.data.DataLoader = DataLoader
    torch.utils.data.dataloader.DataLoader = DataLoader


def uninstall() -> None:
    """Puts torch's own DataLoader back (idempotent)."""
    global _original
    if _original is None:
        return
    import torch.utils.data
    import torch.utils.data.dataloader

    torch.utils.data.DataLoader = _original
    torch.utils.data.dataloader.DataLoader = _original
    _original = None


def installed() -> bool:
    return _original is not None
