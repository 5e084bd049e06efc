"""Starting workers from the fork server (the default start method).

The server is multiprocessing's forkserver, serving its own protocol. Where it
is safe (no GPU runtime initialised, the main thread, a Python whose
forkserver internals are the ones read here) it is forked from this process
at the first pass of a process-worker loader: it then holds what the
program has imported (torch, the framework, the dataset's module) in pages
shared with this process, and its workers share them too, as fork's workers
share the main process's, while each worker still starts from a process
without the program's threads or GPU runtime. Elsewhere it is a fresh
interpreter that preloads torch, numpy, leanloader and the dataset's module
(then a frozen heap: fork_server_freeze.py), started deaf to Ctrl-C when the
loader is built. Also:
keeping the main script out of what a worker imports when nothing it
receives lives there.

That server is leanloader's own (`private_fork_server`, started through
`LeanForkServerContext`), the context of a loader that names none: a loader
given `multiprocessing_context="forkserver"` (or a program that set that
start method) gets multiprocessing's own fork server, a fresh interpreter, as
torch's would, and the program's other forkserver processes never see ours
(they would have run with the main process's state as of our first pass)."""

from __future__ import annotations

import contextlib
import gc
import io
import os
import signal
import socket
import sys
import threading
from multiprocessing import context as mp_context
from multiprocessing import forkserver as mp_forkserver
from multiprocessing import popen_forkserver, reduction, spawn, util
from typing import Any

_private_server: Any = None


def private_fork_server() -> Any:
    """leanloader's fork server: a multiprocessing ForkServer of its own, not
    the module's singleton that the program's other forkserver processes use."""
    global _private_server
    if _private_server is None:
        _private_server = mp_forkserver.ForkServer()
    return _private_server


class _PrivatePopen(popen_forkserver.Popen):
    def _launch(self, process_obj: Any) -> None:
        # popen_forkserver.Popen._launch (Python 3.11 and 3.12), connecting to
        # leanloader's server instead of the module's.
        prep_data = spawn.get_preparation_data(process_obj._name)
        buf = io.BytesIO()
        mp_context.set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            mp_context.set_spawning_popen(None)
        self.sentinel, w = private_fork_server().connect_to_new_process(self._fds)
        # The child's sentinel of this process, as multiprocessing keeps it.
        parent_w = os.dup(w)
        self.finalizer = util.Finalize(self, util.close_fds, (parent_w, self.sentinel))
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = mp_forkserver.read_signed(self.sentinel)


class _PrivateForkServerProcess(mp_context.ForkServerProcess):
    @staticmethod
    def _Popen(process_obj: Any) -> Any:
        return _PrivatePopen(process_obj)


class LeanForkServerContext(mp_context.ForkServerContext):
    """The "forkserver" start method on leanloader's own server."""

    Process = _PrivateForkServerProcess


def default_context() -> Any:
    """The context of a loader that names none (where torch would fork):
    leanloader's fork server where its internals are the ones read here,
    else multiprocessing's forkserver."""
    if _internals_as_read(private_fork_server()):
        return LeanForkServerContext()
    import multiprocessing

    return multiprocessing.get_context("forkserver")


def _server_of(context: Any) -> Any:
    return (
        private_fork_server()
        if isinstance(context, LeanForkServerContext)
        else mp_forkserver._forkserver  # the module's singleton (no public getter)
    )


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


def initialised_gpu_runtime() -> str | None:
    """The GPU runtime this process has initialised (CUDA/ROCm, XPU), if any."""
    import torch

    if torch.cuda.is_initialized():
        return "HIP" if torch.version.hip else "CUDA"
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and getattr(xpu, "is_initialized", lambda: False)():
        return "XPU"
    return None


def start_fork_server_early(dataset_module: str, context: Any) -> None:
    """At a loader's construction: a fork server that must be a fresh
    interpreter (a GPU runtime is initialised) starts now, so that its
    imports overlap the program's work until the first pass. One forked from
    this process waits for the first pass (ensure_fork_server): forked
    after the dataset's arrays were shared, it maps their shared copies
    instead of keeping the pages they were copied from."""
    if initialised_gpu_runtime() is not None:
        ensure_fork_server(dataset_module, context)


def ensure_fork_server(dataset_module: str, context: Any) -> None:
    """Starts the fork server of `context` if it is not running: leanloader's
    own (LeanForkServerContext) forked from this process where that is safe
    (no GPU runtime initialised here, the main thread), else a fresh
    interpreter with torch, numpy, leanloader and the dataset's module added
    to its preload list (kept: whatever the user preloads). A running server
    keeps what it has."""
    server = _server_of(context)
    if _running(server):
        return
    if (
        isinstance(context, LeanForkServerContext)
        and initialised_gpu_runtime() is None
        and start_fork_server_from_this_process(server)
    ):
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
    server.set_forkserver_preload(modules)
    start_fork_server_deaf_to_ctrl_c(server)


def start_fork_server_deaf_to_ctrl_c(server: Any) -> None:
    """Starts the fork server with SIGINT blocked, a mask it keeps through
    exec: it ignores Ctrl-C only once it has imported its preload modules,
    so a Ctrl-C while it imports torch printed a second traceback, the
    server's. This process unblocks at once; a Ctrl-C that arrived meanwhile
    is delivered here."""
    from multiprocessing import resource_tracker

    if threading.current_thread() is not threading.main_thread():
        server.ensure_running()
        return
    # The resource tracker unblocks SIGINT after starting itself: started
    # first, its later ensure_running() calls leave the mask alone.
    resource_tracker.ensure_running()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        server.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


# The pid of the fork server forked from this process (0: none).
_forked_server_pid = 0


def forked_from_this_process(context: Any) -> bool:
    """Whether the running fork server of `context` is a fork of this
    process: its workers then have the program's modules, `__main__`
    included, without importing anything again."""
    server = _server_of(context)
    return _forked_server_pid != 0 and server._forkserver_pid == _forked_server_pid


def _running(server: Any) -> bool:
    """Whether multiprocessing's fork server is running; one that died is
    forgotten as ensure_running() forgets it (its pid reaped here, so that
    call must not wait for it again), and the next start begins afresh."""
    pid = getattr(server, "_forkserver_pid", None)
    if pid is None:
        return False
    try:
        done, _status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        done = pid
    if done == 0:
        return True
    if server._forkserver_alive_fd is not None:
        os.close(server._forkserver_alive_fd)
    server._forkserver_address = None
    server._forkserver_alive_fd = None
    server._forkserver_pid = None
    return False


def _internals_as_read(server: Any) -> bool:
    """multiprocessing's forkserver as this module reads it (Python 3.11 and
    3.12): the attributes ensure_running() sets, no authentication step."""
    return (
        sys.platform.startswith("linux")
        and all(
            hasattr(server, name)
            for name in ("_forkserver_address", "_forkserver_alive_fd", "_forkserver_pid", "_lock")
        )
        and not hasattr(server, "_forkserver_authkey")
    )


def start_fork_server_from_this_process(server: Any) -> bool:
    """multiprocessing.forkserver.ForkServer.ensure_running() of `server`,
    with the server forked from this process instead of started as a new
    interpreter. False (nothing started) where that is not safe here: not the
    main thread, or another Python's forkserver."""
    global _forked_server_pid
    from multiprocessing import connection, resource_tracker

    if threading.current_thread() is not threading.main_thread() or not _internals_as_read(server):
        return False
    with server._lock:
        if _running(server):
            return True
        resource_tracker.ensure_running()
        with socket.socket(socket.AF_UNIX) as listener:
            address = connection.arbitrary_address("AF_UNIX")
            listener.bind(address)
            if not util.is_abstract_socket_namespace(address):
                os.chmod(address, 0o600)
            listener.listen()
            # Every client owns the write end: the server ends when all are gone.
            alive_r, alive_w = os.pipe()
            # As multiprocessing's fork start does: nothing buffered here is
            # inherited, to be written again by a forked process.
            util._flush_std_streams()
            # Ctrl-C (the terminal signals the whole group) must not reach
            # the server before it ignores SIGINT itself.
            previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:
                pid = os.fork()
                if pid == 0:
                    # The lock this process holds was copied held: the server
                    # and every worker forked from it would wait on it forever
                    # at their own first forkserver start.
                    server._lock = threading.Lock()
                    _serve_as_fork_server(listener.fileno(), alive_r)  # never returns
                from leanloader import _core

                # Its workers map what they read by reference: the ranges it
                # shares with this process may be punched when released.
                _core.forget_fork_of_a_child_that_reads_no_released_range()
            except BaseException:
                os.close(alive_w)
                raise
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
                os.close(alive_r)
        server._forkserver_address = address
        server._forkserver_alive_fd = alive_w
        server._forkserver_pid = pid
        _forked_server_pid = pid
    return True


def _serve_as_fork_server(listener_fd: int, alive_r: int) -> None:
    """The forked server's life: multiprocessing's forkserver loop, then
    os._exit: the program's exit handlers, atexit functions and finalizers
    are the main process's and never run here."""
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        _release_inherited_descriptors(keep={0, 1, 2, listener_fd, alive_r})
        # The objects inherited from the main process leave the collector's
        # reach without being visited (a collection writes into every
        # object's header: each page it touched would become a private copy
        # here and in every worker).
        gc.freeze()
        from multiprocessing import forkserver

        forkserver.main(listener_fd, alive_r, [], main_path=None, sys_path=None)
        code = 0
    except SystemExit:
        code = 0  # the loop's end: every client is gone
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def _release_inherited_descriptors(keep: set[int]) -> None:
    """Points every inherited descriptor but `keep` at /dev/null: the server
    must not hold the main process's pipes, sockets and shared memory (a
    worker's end of a pipe, an arena the main process frees), and the
    numbers stay taken, so an inherited Python object that closes its old
    descriptor cannot close one opened since."""
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for name in os.listdir(f"/proc/{os.getpid()}/fd"):
            fd = int(name)
            if fd in keep or fd == null:
                continue
            try:
                os.dup2(null, fd, inheritable=False)
            except OSError:
                pass  # the listing's own descriptor, already closed
    finally:
        os.close(null)
