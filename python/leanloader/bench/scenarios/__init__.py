"""Benchmark scenarios: what `leanloader bench SCENARIO` can run.

A scenario is one small module in this package that defines ``SCENARIO``, a
:class:`Scenario` saying

- how to generate its data (``prepare``: cached in the data dir, reused when
  already there),
- the loaders it compares (:class:`LoaderRun`: a name and a generator function
  that the child process runs to build the loader and yield its batches),
- its sizes (``"quick"`` and ``"full"``, optionally ``"demo"``),
- which ratios to print (numerator, denominator pairs of loader names) and the
  goals they are held to.

The harness (``leanloader.bench.harness``) does everything else: subprocesses,
alternation, memory sampling, medians, ratios, reports. Modules are imported by
name on demand, so the parent never imports what only a child needs (torch).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Scenario name -> module that defines SCENARIO. Add a line per new scenario.
SCENARIO_MODULES: dict[str, str] = {
    "arrays": "leanloader.bench.scenarios.arrays",
    "gpu": "leanloader.bench.scenarios.gpu",
    "hdf5": "leanloader.bench.scenarios.hdf5",
    "images": "leanloader.bench.scenarios.images",
    "largebatch": "leanloader.bench.scenarios.largebatch",
    "latents": "leanloader.bench.scenarios.latents",
    "pydataset": "leanloader.bench.scenarios.pydataset",
}


@dataclass(frozen=True)
class LoaderContext:
    """What a loader function receives in the child process (all JSON-able)."""

    size: Mapping[str, Any]  # the scenario's size parameters (quick/full/demo + overrides)
    data: Mapping[str, Any]  # what the scenario's prepare() returned (paths, shapes)
    options: Mapping[str, Any]  # this LoaderRun's options
    seed: int  # shuffling seed; the same for every loader and round
    # What the run's `setup` returned (built before the timer starts), or None.
    prepared: Any = None


# A loader function builds its loader (inside the generator, so that
# construction counts towards time to first batch), yields every batch of the
# measured run, and shuts its loader down (workers joined) before returning, so
# that their CPU time is counted. A function that runs several epochs yields
# EPOCH_END after each, and the child reports samples/s per epoch besides.
LoaderFunction = Callable[[LoaderContext], Iterator[Any]]


class _EpochEnd:
    """What a loader function yields between epochs (not a batch)."""

    def __repr__(self) -> str:
        return "EPOCH_END"


EPOCH_END = _EpochEnd()


@dataclass(frozen=True)
class LoaderRun:
    """One loader in a scenario, run in its own child process each round."""

    name: str  # "leanloader", "torch", ... the row's "loader" key
    function: LoaderFunction
    # Threads or worker processes that do the loading: the memcpy yardstick is
    # measured with the same count.
    threads: int
    # Imported in the child before timing starts (their import time is not the
    # loader's). The run is skipped when one of them is not installed.
    imports: tuple[str, ...] = ()
    # JSON-able options passed to the function and copied into the result row
    # (e.g. {"workers": 4} for runs of one loader at several worker counts).
    options: Mapping[str, Any] = field(default_factory=dict)
    # Keys of `options` that appear as columns in the result row.
    row_options: tuple[str, ...] = ()
    # How a newcomer reads the name: "torch DataLoader, 2 worker processes".
    label: str = ""
    # Identifies the run among the scenario's runs (in ratios, round orders and
    # the child's command line) when one loader runs in several configurations,
    # e.g. "torch-4" for the torch run with 4 workers. Defaults to the name.
    key: str = ""
    # Work done in the child before the timer starts, alike for every loader
    # that needs it (e.g. loading an in-RAM cache, as the leanloader side's
    # cache is built untimed by prepare()): setup(context) -> context.prepared.
    setup: Callable[[LoaderContext], Any] | None = None

    @property
    def run_key(self) -> str:
        return self.key or self.name

    def missing_imports(self) -> list[str]:
        return [name for name in self.imports if not _is_importable(name)]


@dataclass(frozen=True)
class Goal:
    """A target the issue sets for one figure, checked in every report."""

    description: str  # "samples/s ≥ 3× torch"
    figure: str  # a result figure, e.g. "samples_per_s"
    at_least: float | None = None
    at_most: float | None = None
    ratio: str | None = None  # "leanloader/torch": the goal is on that ratio
    loader: str | None = None  # otherwise: on this run's own figure (a run key)
    # A run that does only the work no loader can avoid (the copy-and-read
    # yardstick: one copy per batch and the consumer's read), put in
    # leanloader's place: the report shows what it reaches on this goal, so
    # a goal past the machine's reach reads as such.
    yardstick: str | None = None


def peer_goals(
    peers: tuple[tuple[str, str], ...], where: str = "", yardstick: str | None = "copy-and-read"
) -> tuple[Goal, ...]:
    """Issue 26's goals against each peer, given as (name, run key): samples/s
    at least 2× theirs and CPU seconds per sample at most ½ theirs, each also
    shown for `yardstick` (a run key) in leanloader's place."""
    suffix = f" {where}" if where else ""
    return (
        *(
            Goal(
                f"samples/s ≥ 2× {name}{suffix}",
                "samples_per_s",
                at_least=2.0,
                ratio=f"leanloader/{key}",
                yardstick=yardstick,
            )
            for name, key in peers
        ),
        *(
            Goal(
                f"CPU s per 1k samples ≤ ½ {name}{suffix}",
                "cpu_s_per_1k_samples",
                at_most=0.5,
                ratio=f"leanloader/{key}",
                yardstick=yardstick,
            )
            for name, key in peers
        ),
    )


DerivedRatios = dict[str, dict[str, float]]


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    # "quick" and "full" are required; "demo" is used by `leanloader demo`.
    sizes: Mapping[str, Mapping[str, Any]]
    # prepare(data_dir, size) -> data description (JSON-able, paths as str).
    # Must reuse data already in data_dir when it matches `size`.
    prepare: Callable[[Path, Mapping[str, Any]], dict[str, Any]]
    loaders: tuple[LoaderRun, ...]
    ratios: tuple[tuple[str, str], ...]  # (numerator, denominator) run keys
    goals: tuple[Goal, ...] = ()
    # Files whose pages the harness reads once before the first round, so that
    # no loader alone pays for cold reads (the data dir may be old).
    warm_files: Callable[[Mapping[str, Any]], list[str]] = lambda data: []
    # Describes a size for reports: "8192 rows × 256 KiB float32, batch 64".
    describe_size: Callable[[Mapping[str, Any]], str] = lambda size: str(dict(size))
    # Ratios that need more than two runs (e.g. a slope over worker counts):
    # derive_ratios(results) -> {"name": {figure: value}}, merged into "ratios"
    # before the goals are checked.
    derive_ratios: Callable[[list[dict[str, Any]]], DerivedRatios] = lambda results: {}
    # With --cold: the file a run reads and the bytes of one random read
    # (a row), for fio's yardstick: cold_read(data, run) -> (path, block) or
    # None for a run that fio cannot stand for.
    cold_read: Callable[[Mapping[str, Any], LoaderRun], tuple[str, int] | None] | None = None

    def __post_init__(self) -> None:
        keys = [run.run_key for run in self.loaders]
        if len(set(keys)) != len(keys):
            raise ValueError(f"scenario {self.name!r}: run keys must be unique, got {keys}")
        if not {"quick", "full"} <= set(self.sizes):
            raise ValueError(f"scenario {self.name!r} needs a 'quick' and a 'full' size")

    def loader(self, key: str) -> LoaderRun:
        for run in self.loaders:
            if run.run_key == key:
                return run
        raise KeyError(f"scenario {self.name!r} has no loader run {key!r}")


def scenario_names() -> list[str]:
    return sorted(SCENARIO_MODULES)


def get_scenario(name: str) -> Scenario:
    try:
        module_name = SCENARIO_MODULES[name]
    except KeyError:
        known = ", ".join(scenario_names())
        raise ValueError(f"unknown scenario {name!r} (known: {known})") from None
    return importlib.import_module(module_name).SCENARIO


def _is_importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
