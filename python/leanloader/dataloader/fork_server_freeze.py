"""Imported last by the fork server (see fork_server.ensure_fork_server):
moves every object the server holds after its preloads (torch, numpy,
leanloader, the dataset's module) out of the garbage collector's reach, so
that workers forked from it do not write to those objects' pages when they
collect: a collection writes into the header of every object it examines,
and each page it writes becomes a private copy in the worker (measured: 129
MiB of private memory per worker after a pass, as much as importing torch
anew; Python's documentation recommends gc.freeze() before fork for this)."""

import gc

gc.collect()
gc.freeze()
