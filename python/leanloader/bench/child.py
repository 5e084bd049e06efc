"""Child process of the benchmark harness: runs one loader once.

    python -m leanloader.bench.child --scenario arrays --loader torch --params JSON|-

Prints one JSON line with the loader's figures on stdout, last. The parent
samples this process tree's memory while it runs; this process measures time
and CPU itself.

Definitions (the harness quotes medians of these over rounds):
- first_batch_s: from calling the loader function (loader construction, worker
  start-up) to the first batch in hand.
- samples_per_s, bytes_per_s: steady state, from the first batch in hand to the
  last, over the samples and bytes of every batch after the first.
- start_unreclaimable_bytes, start_pss_bytes: this process tree after imports
  (Python, numpy, torch), before the loader exists: the part of every peak
  that is not the loader's.
- cpu_s: user + system CPU of this process and its reaped children (worker
  processes) from loader construction until the loader has shut down.
- epoch_samples_per_s: for a run that yields EPOCH_END between epochs,
  samples/s of each epoch: the first from its first batch in hand to its
  last (as samples_per_s), each later one from the previous epoch's last
  batch to its own last (the pass's restart included, as a training loop
  sees it).
- first_batch_wall, last_batch_wall: time.time() of the first and the last
  batch in hand, so that the parent's memory samples can be split into
  start-up and steady state.

The consumer reads every byte of every batch (``touch_batch``), for every
loader alike, on one thread: with torch imported, its intra-op pool is set
to one thread here, since its OpenMP threads spin-wait after every parallel
sum and took the CPU of in-process loader threads (leanloader's arrays row:
22k samples/s with torch's default pool, 40k with one thread; torch's worker
processes, which set one thread themselves, were not slowed). A run's
``setup`` (work both sides do before timing, such as loading an in-RAM
cache) runs before the timer starts.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import multiprocessing
import os
import resource
import sys
import time
from collections.abc import Iterator
from typing import Any

from leanloader import _core
from leanloader.bench.scenarios import EPOCH_END, LoaderContext, get_scenario


def touch_batch(batch: Any) -> tuple[int, int]:
    """Reads every byte of every array in `batch` (a sum over its bytes), so
    that a loader that defers work until the data is read cannot look faster
    than it is, and every loader's batches are read alike. Returns (samples,
    bytes): the leading dimension of the first array and the bytes of all
    arrays."""
    samples = 0
    total_bytes = 0
    for array in _arrays_in(batch):
        if samples == 0 and len(array.shape) > 0:
            samples = int(array.shape[0])
        total_bytes += int(array.nbytes)
        if array.nbytes:
            _read_every_byte(array)
    return samples, total_bytes


def _read_every_byte(array: Any) -> int:
    """A wrapping sum over the array's bytes, read as 64-bit words (plus the
    last few bytes one by one): every byte is loaded, at memory speed. (A
    uint8 sum widened to int64 ran at 0.5 GB/s here and made the consumer,
    not the loader, the limit of every run.)"""
    if hasattr(array, "untyped_storage"):  # a torch tensor
        import torch

        flat = array.detach().contiguous().reshape(-1).view(torch.uint8)
        words = flat.numel() // 8
        total = int(flat[: words * 8].view(torch.int64).sum().item()) if words else 0
        return (total + int(flat[words * 8 :].sum(dtype=torch.int64).item())) % 2**64
    import numpy as np

    flat = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    words = flat.size // 8
    total = int(flat[: words * 8].view(np.uint64).sum(dtype=np.uint64)) if words else 0
    return (total + int(flat[words * 8 :].sum(dtype=np.uint64))) % 2**64


def _arrays_in(batch: Any) -> Iterator[Any]:
    if isinstance(batch, dict):
        for value in batch.values():
            yield from _arrays_in(value)
    elif isinstance(batch, (list, tuple)):
        for value in batch:
            yield from _arrays_in(value)
    elif hasattr(batch, "shape") and hasattr(batch, "nbytes"):
        yield batch


def cpu_seconds() -> float:
    """CPU of this process (all threads) and of its children that have been
    waited for."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _stop_fork_server() -> None:
    """Stops multiprocessing's fork server, if one was started, and waits for
    it: workers started with "forkserver" are its children, not ours, so
    their CPU reaches this process's RUSAGE_CHILDREN only through it."""
    from multiprocessing import forkserver

    server = forkserver._forkserver  # the module's singleton; no public API stops it
    if getattr(server, "_forkserver_pid", None) is not None:
        server._stop()


def run_loader(scenario_name: str, run_key: str, params: dict[str, Any]) -> dict[str, Any]:
    scenario = get_scenario(scenario_name)
    run = scenario.loader(run_key)
    for module in params["imports"]:
        importlib.import_module(module)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)  # the consumer's sum: see the module docstring
    context = LoaderContext(
        size=params["size"],
        data=params["data"],
        options=params["options"],
        seed=int(params["seed"]),
    )
    if run.setup is not None:
        context = dataclasses.replace(context, prepared=run.setup(context))
    memory_at_start = _core.process_tree_memory(os.getpid())

    cpu_start = cpu_seconds()
    start = time.perf_counter()
    first_batch_at = last_batch_at = first_batch_wall = last_batch_wall = 0.0
    batches = samples = total_bytes = 0
    first_samples = first_bytes = 0
    # (wall time, samples so far) after each batch: the run's timeline.
    progress: list[tuple[float, int]] = []
    # (time, samples so far) at the last batch of each epoch.
    epoch_ends: list[tuple[float, int]] = []
    for batch in run.function(context):
        if batch is EPOCH_END:
            epoch_ends.append((last_batch_at, samples))
            continue
        batch_samples, batch_bytes = touch_batch(batch)
        del batch  # lets a loader reuse the batch's memory before the next one
        last_batch_at = time.perf_counter()
        last_batch_wall = time.time()
        progress.append((last_batch_wall, samples + batch_samples))
        if batches == 0:
            first_batch_at = last_batch_at
            first_batch_wall = last_batch_wall
            first_samples, first_bytes = batch_samples, batch_bytes
        batches += 1
        samples += batch_samples
        total_bytes += batch_bytes
    # Workers that the loader did not join itself are reaped here, so that
    # their CPU time is counted.
    for process in multiprocessing.active_children():
        process.join()
    _stop_fork_server()
    cpu_s = cpu_seconds() - cpu_start
    if batches == 0:
        raise RuntimeError(f"loader run {run_key!r} yielded no batches")

    steady_s = last_batch_at - first_batch_at
    steady_samples = samples - first_samples
    steady_bytes = total_bytes - first_bytes
    if steady_s <= 0 or steady_samples <= 0:
        # One batch only: the best estimate is the whole run.
        steady_s = last_batch_at - start
        steady_samples, steady_bytes = samples, total_bytes
    figures: dict[str, Any] = {
        "loader": run.name,
        "batches": batches,
        "samples": samples,
        "bytes": total_bytes,
        "first_batch_s": first_batch_at - start,
        "first_batch_wall": first_batch_wall,
        "last_batch_wall": last_batch_wall,
        "run_s": last_batch_at - start,
        "samples_per_s": steady_samples / steady_s,
        "bytes_per_s": steady_bytes / steady_s,
        "start_unreclaimable_bytes": int(memory_at_start["unreclaimable_bytes"]),
        "start_pss_bytes": int(memory_at_start["pss_bytes"]),
        "cpu_s": cpu_s,
        "cpu_s_per_1k_samples": cpu_s / samples * 1000.0,
        "progress": _thin(progress),
    }
    if epoch_ends:
        if epoch_ends[-1][1] != samples:
            epoch_ends.append((last_batch_at, samples))
        figures["epoch_samples_per_s"] = _per_epoch(
            epoch_ends, first_batch_at, first_samples, steady_samples / steady_s
        )
    return figures


def _per_epoch(
    ends: list[tuple[float, int]], first_at: float, first_samples: int, whole_rate: float
) -> list[float]:
    """Samples/s of each epoch, from the (time, samples so far) at the end
    of each: the first epoch from its first batch in hand, each later one
    from the previous epoch's end."""
    rates = []
    since, counted = first_at, first_samples
    for at, samples in ends:
        rates.append((samples - counted) / (at - since) if at > since else whole_rate)
        since, counted = at, samples
    return rates


def _thin(points: list[tuple[float, int]], limit: int = 2000) -> list[tuple[float, int]]:
    """At most `limit` points of a timeline, evenly spaced, the last one kept."""
    if len(points) <= limit:
        return points
    step = len(points) / limit
    return [points[int(i * step)] for i in range(limit - 1)] + [points[-1]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", required=True)
    parser.add_argument("--loader", required=True, help="the run's key in the scenario")
    parser.add_argument(
        "--params", required=True, help="JSON: size, data, seed, options, imports ('-': stdin)"
    )
    args = parser.parse_args(argv)
    params = sys.stdin.read() if args.params == "-" else args.params
    figures = run_loader(args.scenario, args.loader, json.loads(params))
    sys.stdout.write(json.dumps(figures) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
