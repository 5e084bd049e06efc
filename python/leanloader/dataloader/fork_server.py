"""Starting workers from the fork server (the default start method): what
the server preloads so that its workers share those pages (torch, numpy,
leanloader, the dataset's module, then a frozen heap: fork_server_freeze.py),
starting it deaf to Ctrl-C, and keeping the main script out of what a worker
imports when nothing it receives lives there."""

from __future__ import annotations

import contextlib
import signal
import sys
from typing import Any


@contextlib.contextmanager
def main_module_hidden(hide: bool) -> Any:
    """While a worker starts: the main module's file and spec out of sight of
    multiprocessing's preparation data, so the worker does not import (and
    run) the main script; used when nothing it receives lives there."""
    main = sys.modules.get("__main__")
    if not hide or main is None:
        yield
        return
    saved = {
        name: main.__dict__[name] for name in ("__file__", "__spec__") if name in main.__dict__
    }
    try:
        main.__dict__.pop("__file__", None)
        main.__spec__ = None
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


# What every worker imports anyway: loaded once in the fork server, so that
# the workers forked from it share those pages (copy-on-write) instead of
# each importing its own copy, as spawned workers do.
FORK_SERVER_PRELOAD = ("torch", "numpy", "leanloader")
FORK_SERVER_FREEZE = "leanloader.dataloader.fork_server_freeze"


def preload_in_fork_server(dataset_module: str) -> None:
    """Adds torch, numpy, leanloader and the dataset's module to the fork
    server's preload list (kept: whatever the user preloads) while the
    server is not running yet; a running server keeps what it has."""
    from multiprocessing import forkserver

    server = forkserver._forkserver  # the module's singleton (no public getter)
    if getattr(server, "_forkserver_pid", None) is not None:
        return
    modules = list(getattr(server, "_preload_modules", ["__main__"]))
    wanted = [*FORK_SERVER_PRELOAD]
    if dataset_module not in ("__main__", "__mp_main__", "builtins"):
        wanted.append(dataset_module)
    for module in wanted:
        if module not in modules:
            modules.append(module)
    # last: freezes what the modules above made (fork_server_freeze.py)
    modules = [m for m in modules if m != FORK_SERVER_FREEZE] + [FORK_SERVER_FREEZE]
    forkserver.set_forkserver_preload(modules)
    start_fork_server_deaf_to_ctrl_c()


def start_fork_server_deaf_to_ctrl_c() -> None:
    """Starts the fork server with SIGINT blocked, a mask it keeps through
    exec: it ignores Ctrl-C only once it has imported its preload modules,
    so a Ctrl-C while it imports torch printed a second traceback, the
    server's. This process unblocks at once; a Ctrl-C that arrived meanwhile
    is delivered here."""
    import threading
    from multiprocessing import forkserver, resource_tracker

    if threading.current_thread() is not threading.main_thread():
        forkserver.ensure_running()
        return
    # The resource tracker unblocks SIGINT after starting itself: started
    # first, its later ensure_running() calls leave the mask alone.
    resource_tracker.ensure_running()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
