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
  call (``from ultralytics import YOLO`` first) has that name rebound to
  ``ll.DataLoader``, and classes defined before the call that subclass
  torch's class directly are re-based onto ``ll.DataLoader`` (a class that
  cannot be is named in a warning); loaders built before the call stay
  torch's. Calling ``install()`` first thing (or running the script with
  ``python -m leanloader.run script.py``) needs none of that;
- ``isinstance(loader, torch.utils.data.DataLoader)`` after install asks
  about ``ll.DataLoader``; every ``ll.DataLoader`` is also an instance of
  torch's original class.

``uninstall()`` puts torch's class back, and the names and bases install()
changed (loaders made in between stay leanloader's).

``install(**options)`` sets defaults for ll.DataLoader's own options in
every loader built while installed (``worker_mode="thread"``,
``multiprocessing_context="fork"``...: ``dataloader/options.py``), as do
``LEANLOADER_OPTIONS`` and ``python -m leanloader.run --set name=value``.

``LEANLOADER_INSTALL=1`` in the environment installs in every Python process
that imports torch's DataLoader, child interpreters of torchrun or a
framework's DDP launcher included (``leanloader_install.pth``, installed with
the package, checks the variable at interpreter start).
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

from leanloader.dataloader.options import clear_defaults, from_environment, set_defaults

_original: Any = None
# What install() changed besides torch's two names, for uninstall().
_rebased: list[tuple[type, tuple]] = []
_rebound: list[tuple[Any, str]] = []


def _subclasses(cls: type) -> list[type]:
    found, stack = [], list(cls.__subclasses__())
    while stack:
        sub = stack.pop()
        found.append(sub)
        stack.extend(sub.__subclasses__())
    return found


def _adopt_existing(torch_class: type, ours: type) -> None:
    """Re-bases classes and rebinds names made from torch's DataLoader before
    install() was called."""
    for cls in _subclasses(torch_class):
        if issubclass(cls, ours) or torch_class not in cls.__bases__:
            continue
        bases = cls.__bases__
        try:
            cls.__bases__ = tuple(ours if base is torch_class else base for base in bases)
            _rebased.append((cls, bases))
        except TypeError as error:
            warnings.warn(
                f"ll.install(): {cls.__module__}.{cls.__qualname__} was defined before "
                f"install() and stays a subclass of torch's DataLoader ({error}); call "
                "ll.install() before importing it, or run the script with "
                "python -m leanloader.run",
                stacklevel=3,
            )
    for module in list(sys.modules.values()):
        name = getattr(module, "__name__", "") or ""
        if name == "torch" or name.startswith(("torch.", "leanloader")):
            continue
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for attribute, value in list(namespace.items()):
            if value is torch_class:
                namespace[attribute] = ours
                _rebound.append((module, attribute))


def install(**options: Any) -> None:
    """Replaces torch.utils.data.DataLoader by ll.DataLoader (idempotent).
    `options` (and LEANLOADER_OPTIONS, which they override) become the
    defaults of ll.DataLoader's own options for every loader built while
    installed: worker_mode, force_fork, share_threshold, share_in_place,
    shm_dir, warn_copy_bytes, multiprocessing_context (a start method's
    name); see dataloader/options.py. A later call replaces them."""
    global _original
    import torch.utils.data
    import torch.utils.data.dataloader

    from leanloader.dataloader.front import DataLoader, _TorchDataLoader

    set_defaults({**from_environment(), **options})

    if _original is None:
        _original = _TorchDataLoader
        _adopt_existing(_TorchDataLoader, DataLoader)
    torch.utils.data.DataLoader = DataLoader
    torch.utils.data.dataloader.DataLoader = DataLoader


def uninstall() -> None:
    """Puts torch's own DataLoader back (idempotent)."""
    global _original
    clear_defaults()
    if _original is None:
        return
    import torch.utils.data
    import torch.utils.data.dataloader

    torch.utils.data.DataLoader = _original
    torch.utils.data.dataloader.DataLoader = _original
    for cls, bases in _rebased:
        cls.__bases__ = bases
    for module, attribute in _rebound:
        module.__dict__[attribute] = _original
    _rebased.clear()
    _rebound.clear()
    _original = None


def installed() -> bool:
    return _original is not None
