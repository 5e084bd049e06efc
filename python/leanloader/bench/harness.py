"""Side-by-side benchmark harness: runs a scenario's loaders and compares them.

Each loader runs in its own child process (``python -m leanloader.bench.child``),
one after the other, for at least 3 rounds; the order rotates by one loader
each round (A B C, B C A, C A B, …), so that neither drift of the shared host
nor running first favours a loader. Each round runs every loader twice:

- a timing pass with no memory sampler (reading ``smaps`` of a process tree
  costs milliseconds per process and slows some loaders more than others):
  samples/s, time to first batch and CPU come from it;
- a memory pass, while a sampler thread here reads the memory of the child's
  whole process tree every 50 ms (``leanloader._core.process_tree_memory``:
  Pss_Anon + Pss_Shmem + shared memory held by descriptors and not mapped,
  summed over the child and its workers): the memory figures come from it.

Memory is reported as the peak, the start-up peak (before the first batch),
and the steady state: the median over the samples taken between the first
and the last batch. Each round also measures this machine's memcpy bandwidth
with the loader's thread count, the ceiling for batch assembly (the faster
of glibc's memcpy and a copy with streaming stores). Reported
figures are medians over rounds; ratios divide them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from leanloader.bench.machine import describe_machine
from leanloader.bench.scenarios import Goal, LoaderRun, Scenario
from leanloader.units import format_bytes

MIN_ROUNDS = 3
SAMPLE_INTERVAL_S = 0.05
CHILD_TIMEOUT_S = 1800.0
SEED = 0

# Peaks kept by the sampler: report key -> process_tree_memory key.
PEAK_KEYS = {
    "peak_unreclaimable_bytes": "unreclaimable_bytes",
    "peak_pss_bytes": "pss_bytes",
    "peak_pss_anon_bytes": "pss_anon_bytes",
    "peak_pss_shmem_bytes": "pss_shmem_bytes",
    "peak_pss_file_bytes": "pss_file_bytes",
    "peak_fd_shmem_bytes": "fd_shmem_bytes",
    "peak_rss_bytes": "rss_bytes",
    "peak_processes": "num_processes",
}

# Figures of the timing pass (no sampler running).
TIMING_FIGURES = (
    "samples_per_s",
    "first_batch_s",
    "cpu_s_per_1k_samples",
    "bytes_per_s",
    "run_s",
)

# Figures of the memory pass (the sampler running).
MEMORY_FIGURES = (
    *PEAK_KEYS,
    "start_unreclaimable_bytes",
    "loader_unreclaimable_bytes",
    "startup_peak_unreclaimable_bytes",
    "steady_unreclaimable_bytes",
    "loader_steady_unreclaimable_bytes",
)

# Figures whose median over rounds is reported.
MEDIAN_FIGURES = (*TIMING_FIGURES, *MEMORY_FIGURES)

# Figures that every ratio numerator/denominator is given for.
RATIO_FIGURES = (
    "samples_per_s",
    "first_batch_s",
    "peak_unreclaimable_bytes",
    "loader_unreclaimable_bytes",
    "steady_unreclaimable_bytes",
    "startup_peak_unreclaimable_bytes",
    "peak_pss_bytes",
    "cpu_s_per_1k_samples",
)


class BenchError(RuntimeError):
    """A child failed or the scenario cannot run."""


def default_data_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "leanloader" / "bench"


Progress = Callable[[str], None]


def _quiet(_message: str) -> None:
    pass


def run_scenario(
    scenario: Scenario,
    size_name: str,
    *,
    rounds: int = MIN_ROUNDS,
    data_dir: Path | None = None,
    size_overrides: Mapping[str, Any] | None = None,
    progress: Progress = _quiet,
    separate_passes: bool = True,
    only: Sequence[str] | None = None,
    cold: bool = False,
) -> dict[str, Any]:
    """Runs every available loader of `scenario` `rounds` times, order rotated,
    and returns the report (the JSON that `leanloader bench --json` prints).
    With `separate_passes` False (`leanloader demo`: half the time), each
    round runs a loader once, its memory sampled while it is timed. `only`
    names the loaders (run keys) to run; ratios and goals that need another
    are left out of the report. With `cold` (one epoch unless the size says
    otherwise through `size_overrides`), every pass starts with the
    scenario's files evicted from the page cache (posix_fadvise DONTNEED), and
    each round fio reads the same files at random in the runs' block size,
    once with one read in flight per thread and once with 32 (io_uring): the
    yardsticks for reading from storage; samples/s and bytes/s then count the
    whole pass, first batch included (`_whole_pass_rates`)."""
    if rounds < MIN_ROUNDS:
        raise ValueError(f"rounds must be at least {MIN_ROUNDS}, got {rounds}")
    if size_name not in scenario.sizes:
        raise ValueError(f"scenario {scenario.name!r} has no size {size_name!r}")
    size = {**scenario.sizes[size_name], **(size_overrides or {})}
    if cold and "epochs" in size and "epochs" not in (size_overrides or {}):
        size["epochs"] = 1  # a second epoch would find the first one's pages cached

    if only is not None:
        unknown = sorted(set(only) - {run.run_key for run in scenario.loaders})
        if unknown:
            known = ", ".join(run.run_key for run in scenario.loaders)
            raise ValueError(f"scenario {scenario.name!r} has no loader {unknown[0]!r} ({known})")
    runs: list[LoaderRun] = []
    skipped: list[dict[str, str]] = []
    for run in scenario.loaders:
        if only is not None and run.run_key not in only:
            continue
        missing = run.missing_imports()
        if missing:
            skipped.append({"loader": run.run_key, "reason": f"needs {', '.join(missing)}"})
            progress(f"skipping {run.run_key}: needs {', '.join(missing)}")
        else:
            runs.append(run)
    if not runs:
        raise BenchError(f"no loader of scenario {scenario.name!r} can run here")

    data_dir = Path(data_dir) if data_dir is not None else default_data_dir()
    progress(f"preparing data in {data_dir} ({scenario.describe_size(size)})")
    data = scenario.prepare(data_dir, size)
    files = scenario.warm_files(data)
    if cold:
        if scenario.cold_read is None:
            raise BenchError(f"scenario {scenario.name!r} has no cold mode")
        progress("cold page cache: files evicted before every pass")
    else:
        for path in files:
            _read_once(path)
    fio = shutil.which("fio") if cold else None
    if cold and fio is None:
        progress("fio is not installed: no storage yardstick (apt-get install fio)")
    fio_by_run: dict[str, dict[str, list[float]]] = {run.run_key: {} for run in runs}

    params = {"size": size, "data": data, "seed": SEED}
    figures_by_run: dict[str, list[dict[str, Any]]] = {run.run_key: [] for run in runs}
    memcpy_by_threads: dict[int, list[float]] = {run.threads: [] for run in runs}
    order: list[list[str]] = []
    timelines: dict[str, dict[str, list[tuple[float, int]]]] = {}
    for round_index in range(rounds):
        for threads, measurements in memcpy_by_threads.items():
            measurements.append(_measure_memcpy(threads))
        if fio is not None:
            _measure_fio_round(fio, scenario, data, runs, files, fio_by_run)
        order.append([])
        shift = round_index % len(runs)
        for run in runs[shift:] + runs[:shift]:
            if cold:
                _evict(files)
            memory = run_child(scenario.name, run, params, sample=True)
            if cold and separate_passes:
                _evict(files)
            timing = (
                run_child(scenario.name, run, params, sample=False) if separate_passes else memory
            )
            if cold:
                timing = _whole_pass_rates(timing)
            timeline = memory.pop("timeline", None)
            if timeline is not None and run.run_key not in timelines:
                timelines[run.run_key] = timeline  # the first round's memory pass
            figures = {**memory, **{key: timing[key] for key in TIMING_FIGURES}}
            for epoch, rate in enumerate(timing.get("epoch_samples_per_s", ()), start=1):
                figures[f"epoch{epoch}_samples_per_s"] = rate
            figures["samples"] = timing["samples"]
            figures_by_run[run.run_key].append(figures)
            order[-1].append(run.run_key)
            progress(
                f"round {round_index + 1}/{rounds} {run.run_key}: "
                f"{figures['samples_per_s']:.0f} samples/s, "
                f"first batch {figures['first_batch_s']:.3f} s, "
                f"peak unreclaimable {format_bytes(figures['peak_unreclaimable_bytes'])}"
            )

    results = []
    for run in runs:
        rows = figures_by_run[run.run_key]
        memcpy = statistics.median(memcpy_by_threads[run.threads])
        # "loader" is unique among the rows; "family" names the loader itself.
        result: dict[str, Any] = {"loader": run.run_key, "family": run.name}
        if run.run_key != run.name:
            result["key"] = run.run_key
        result.update({key: run.options[key] for key in run.row_options})
        result["threads"] = run.threads
        result["rounds"] = len(rows)
        result["samples"] = rows[0]["samples"]
        for figure in (*MEDIAN_FIGURES, *_epoch_figures(rows)):
            result[figure] = statistics.median(row[figure] for row in rows)
        result["memcpy_bytes_per_s"] = memcpy
        result["fraction_of_memcpy"] = result["bytes_per_s"] / memcpy
        for name, values in fio_by_run[run.run_key].items():
            result[f"{name}_bytes_per_s"] = fio_rate = statistics.median(values)
            result[f"fraction_of_{name}"] = result["bytes_per_s"] / fio_rate
        results.append(result)

    ratios = _ratios(scenario, results)
    for name, figures in scenario.derive_ratios(results).items():
        ratios.setdefault(name, {}).update(figures)
    return {
        "scenario": scenario.name,
        "size": size_name,
        "description": scenario.describe_size(size),
        "machine": describe_machine(),
        "results": results,
        "ratios": ratios,
        # The yardstick copies from RAM: no ceiling for a cold pass.
        "goals": _check_goals(scenario.goals, results, ratios, yardsticks=not cold),
        "rounds": order,
        "separate_passes": separate_passes,
        "cold": cold,
        "skipped": skipped,
        "timelines": timelines,
    }


def run_child(
    scenario_name: str, run: LoaderRun, params: Mapping[str, Any], *, sample: bool = True
) -> dict[str, Any]:
    """Runs `run` once in a child process, sampling its tree's memory when
    `sample`. Returns the child's figures, plus the memory figures when
    sampled (the peaks, the start-up peak and the steady-state median)."""
    command = [
        sys.executable,
        "-m",
        "leanloader.bench.child",
        "--scenario",
        scenario_name,
        "--loader",
        run.run_key,
        "--params",
        "-",  # on stdin: a scenario's data description may be long (file lists)
    ]
    # The run's options and imports as this process decided them (a child
    # may see other installed modules, e.g. when a test hides torch here).
    params_json = json.dumps({**params, "options": dict(run.options), "imports": list(run.imports)})
    # Its own session, so that a timeout can stop the child and its workers.
    child = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_child_environment(),
        start_new_session=True,
        text=True,
    )
    started_wall = time.time()
    sampler = TreeMemorySampler(child.pid)
    if sample:
        sampler.start()
    try:
        stdout, stderr = child.communicate(input=params_json, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _stop_session(child)
        raise BenchError(f"{run.run_key} ran longer than {CHILD_TIMEOUT_S:.0f} s") from None
    except BaseException:
        # Ctrl-C reaches only this process (the child has its own session).
        _stop_session(child)
        raise
    finally:
        if sample:
            sampler.stop()
    if child.returncode != 0 or not stdout.strip():
        tail = "\n".join(stderr.strip().splitlines()[-20:])
        raise BenchError(f"{run.run_key} failed (exit status {child.returncode}):\n{tail}")
    figures = json.loads(stdout.strip().splitlines()[-1])
    progress = figures.pop("progress", [])
    if not sample:
        return figures
    # The run over time, in seconds since the child started: samples
    # delivered and unreclaimable memory (for `leanloader bench --plot`).
    figures["timeline"] = {
        "samples": [(round(at - started_wall, 4), count) for at, count in progress],
        "unreclaimable_bytes": [
            (round(at - started_wall, 4), value) for at, value in sampler.timeline
        ],
    }
    if sampler.samples == 0:
        raise BenchError(f"{run.run_key}: no memory sample was taken while it ran")
    figures.update(sampler.peaks)
    figures.update(sampler.phases(figures["first_batch_wall"], figures["last_batch_wall"]))
    # The loader's own share: the peak (and the steady state) above what the
    # process held before it.
    start = figures["start_unreclaimable_bytes"]
    figures["loader_unreclaimable_bytes"] = max(0, figures["peak_unreclaimable_bytes"] - start)
    figures["loader_steady_unreclaimable_bytes"] = max(
        0, figures["steady_unreclaimable_bytes"] - start
    )
    return figures


def _stop_session(child: subprocess.Popen[str]) -> None:
    """Kills a child started with start_new_session and its workers, and reaps it."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    child.communicate()


class TreeMemorySampler:
    """Samples the memory of a process tree every SAMPLE_INTERVAL_S on a
    thread and keeps the peak of each figure (each peak on its own: they may
    come from different moments)."""

    def __init__(self, pid: int, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        from leanloader import _core

        self._read_tree = _core.process_tree_memory
        self._pid = pid
        self._interval_s = interval_s
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._sample_until_stopped, name="leanloader-memory-sampler", daemon=True
        )
        self.peaks = dict.fromkeys(PEAK_KEYS, 0)
        self.samples = 0
        # (time.time(), unreclaimable bytes) of every sample.
        self.timeline: list[tuple[float, int]] = []

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join()

    def _sample_until_stopped(self) -> None:
        while True:
            self._sample()
            if self._stopping.wait(self._interval_s):
                return

    def _sample(self) -> None:
        try:
            memory = self._read_tree(self._pid)
        except (OSError, RuntimeError, ValueError):
            return  # the child is exiting: its /proc entries are going away
        if memory.get("num_processes", 1) == 0:
            return
        self.samples += 1
        self.timeline.append((time.time(), int(memory["unreclaimable_bytes"])))
        for peak, key in PEAK_KEYS.items():
            self.peaks[peak] = max(self.peaks[peak], int(memory[key]))

    def phases(self, first_batch_wall: float, last_batch_wall: float) -> dict[str, int]:
        """The start-up peak (samples before the first batch) and the steady
        state (median of the samples from the first batch to the last) of
        unreclaimable memory. A run too short to be sampled in steady state
        gets the sample closest to its first batch."""
        startup = [value for at, value in self.timeline if at < first_batch_wall]
        steady = [value for at, value in self.timeline if first_batch_wall <= at <= last_batch_wall]
        if not steady:
            closest = min(self.timeline, key=lambda sample: abs(sample[0] - first_batch_wall))
            steady = [closest[1]]
        return {
            "startup_peak_unreclaimable_bytes": max(startup) if startup else steady[0],
            "steady_unreclaimable_bytes": int(statistics.median(steady)),
        }


def _child_environment() -> dict[str, str]:
    # The child must import the same leanloader as this process, even when it
    # was found through sys.path changes rather than an installation.
    import leanloader

    package_root = os.path.dirname(os.path.dirname(os.path.abspath(leanloader.__file__)))
    environment = dict(os.environ)
    existing = environment.get("PYTHONPATH")
    environment["PYTHONPATH"] = package_root + (os.pathsep + existing if existing else "")
    return environment


def _measure_memcpy(threads: int) -> float:
    from leanloader import _core

    return float(_core.measure_memcpy_bandwidth(threads))


def _evict(paths: Sequence[str]) -> None:
    """Drops the files' pages from the page cache (clean pages: no root
    needed), so that the next reader gets them from storage."""
    for path in paths:
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.fsync(descriptor)  # dirty pages cannot be dropped
            os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(descriptor)


def _whole_pass_rates(timing: dict[str, Any]) -> dict[str, Any]:
    """samples/s and bytes/s over the whole pass, from the loader's
    construction to its last batch: from a cold page cache, what a loader
    reads before its first batch is part of the pass (a mapped reader's
    first faults read megabytes around each row; leanloader reads the first
    batch's rows alone), and a rate from the first batch on would count a
    loader's head start as speed."""
    return {
        **timing,
        "samples_per_s": timing["samples"] / timing["run_s"],
        "bytes_per_s": timing["bytes"] / timing["run_s"],
    }


# fio yardsticks: report name -> (ioengine, reads in flight per thread).
FIO_YARDSTICKS = {"fio": ("psync", 1), "fio_deep": ("io_uring", 32)}


def _measure_fio_round(
    fio: str,
    scenario: Scenario,
    data: Mapping[str, Any],
    runs: Sequence[LoaderRun],
    files: Sequence[str],
    fio_by_run: dict[str, dict[str, list[float]]],
) -> None:
    """One measurement of each fio yardstick per distinct (file, block,
    threads) among the runs, the files evicted first."""
    measured: dict[tuple[str, int, int, str], float] = {}
    for run in runs:
        assert scenario.cold_read is not None
        target = scenario.cold_read(data, run)
        if target is None:
            continue
        path, block = target
        for name, (engine, depth) in FIO_YARDSTICKS.items():
            key = (path, block, run.threads, name)
            if key not in measured:
                _evict(files)
                measured[key] = _run_fio(fio, path, block, run.threads, engine, depth)
            fio_by_run[run.run_key].setdefault(name, []).append(measured[key])


def _run_fio(fio: str, path: str, block: int, jobs: int, engine: str, depth: int) -> float:
    """Bytes/s of random `block`-byte reads of `path` through the page cache
    by `jobs` fio jobs (each its own part of the file, so that no job finds
    another's pages), `depth` reads in flight each."""
    size = os.path.getsize(path)
    part = max(block, size // jobs // block * block)
    command = [
        fio, "--name=cold", f"--filename={path}", "--rw=randread", f"--bs={block}",
        f"--ioengine={engine}", f"--iodepth={depth}", f"--numjobs={jobs}",
        f"--size={part}", f"--offset_increment={part}", "--direct=0", "--invalidate=1",
        "--group_reporting", "--output-format=json",
    ]  # fmt: skip
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise BenchError(f"fio failed: {completed.stderr.strip()[-500:]}")
    return float(json.loads(completed.stdout)["jobs"][0]["read"]["bw_bytes"])


def _read_once(path: str, chunk_bytes: int = 8 << 20) -> None:
    """Reads a file through the page cache once, so that every loader finds it
    cached (the machine evicts pages that are not re-read within minutes)."""
    buffer = bytearray(chunk_bytes)
    with open(path, "rb", buffering=0) as file:
        while file.readinto(buffer):
            pass


def _ratios(scenario: Scenario, results: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    by_key = {result.get("key", result["loader"]): result for result in results}
    ratios = {}
    for numerator, denominator in scenario.ratios:
        if numerator not in by_key or denominator not in by_key:
            continue  # a run was skipped
        top, bottom = by_key[numerator], by_key[denominator]
        ratios[f"{numerator}/{denominator}"] = {
            figure: (top[figure] / bottom[figure] if bottom[figure] else float("inf"))
            for figure in (*RATIO_FIGURES, *_epoch_figures([top, bottom]))
        }
    return ratios


_EPOCH_FIGURE = re.compile(r"epoch[0-9]+_samples_per_s")


def _epoch_figures(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The per-epoch samples/s figures every one of `rows` has."""
    if not rows:
        return []
    names = [name for name in rows[0] if _EPOCH_FIGURE.fullmatch(name)]
    return [name for name in names if all(name in row for row in rows)]


def _check_goals(
    goals: tuple[Goal, ...],
    results: list[dict[str, Any]],
    ratios: Mapping[str, Mapping[str, float]],
    yardsticks: bool = True,
) -> list[dict[str, Any]]:
    by_key = {result.get("key", result["loader"]): result for result in results}

    def value_for(goal: Goal, subject: str | None) -> float | None:
        """The goal's figure with the run `subject` (None: the goal's own)
        in leanloader's place."""
        if goal.ratio is not None:
            if subject is None:
                return ratios.get(goal.ratio, {}).get(goal.figure)
            top = by_key.get(subject, {}).get(goal.figure)
            bottom = by_key.get(goal.ratio.split("/", 1)[1], {}).get(goal.figure)
            if top is None or bottom is None:
                return None
            return top / bottom if bottom else float("inf")
        return by_key.get(subject or goal.loader or "", {}).get(goal.figure)

    checked = []
    for goal in goals:
        value = value_for(goal, None)
        met = None
        if value is not None:
            met = (goal.at_least is None or value >= goal.at_least) and (
                goal.at_most is None or value <= goal.at_most
            )
        yardstick_value = value_for(goal, goal.yardstick) if goal.yardstick and yardsticks else None
        checked.append(
            {
                "goal": goal.description,
                "figure": goal.figure,
                "of": goal.ratio or goal.loader,
                "value": value,
                "at_least": goal.at_least,
                "at_most": goal.at_most,
                "met": met,
                "yardstick": goal.yardstick if yardstick_value is not None else None,
                "yardstick_value": yardstick_value,
            }
        )
    return checked


def format_report(report: Mapping[str, Any]) -> str:
    """The human-readable form of a report: a table per loader, ratios, goals."""
    machine = report["machine"]
    memory = machine.get("memory_total_bytes")
    lines = [
        f"leanloader bench {report['scenario']} ({report['size']}): {report['description']}",
        f"machine: {machine['cpu_model']}, {machine['cpu_cores_usable']} cores, "
        f"{format_bytes(memory) if memory else '? memory'}, {machine['kernel']}, "
        f"Python {machine['python']}, numpy {machine['numpy']}, torch {machine['torch']}",
        f"rounds: {len(report['rounds'])}, order rotated each round (first: "
        + ", ".join(report["rounds"][0])
        + (
            "); each a timing pass without the memory sampler and a memory pass with it; "
            if report.get("separate_passes", True)
            else "); one pass each, memory sampled while timed; "
        )
        + "medians",
        "",
    ]
    header = (
        "loader",
        "samples/s",
        "first batch",
        "steady unreclaimable",
        "start-up peak",
        "peak unreclaimable",
        "above start",
        "peak PSS",
        "CPU s/1k samples",
        "GB/s",
        "of memcpy",
    )
    cold = bool(report.get("cold"))
    if cold:
        header = (*header, "of fio (1 / 32 in flight a thread)")
    table = [header]
    for result in report["results"]:
        table.append(
            (
                result.get("key", result["loader"]),
                f"{result['samples_per_s']:,.0f}",
                f"{result['first_batch_s']:.3f} s",
                format_bytes(result["steady_unreclaimable_bytes"]),
                format_bytes(result["startup_peak_unreclaimable_bytes"]),
                format_bytes(result["peak_unreclaimable_bytes"]),
                format_bytes(result["loader_unreclaimable_bytes"]),
                format_bytes(result["peak_pss_bytes"]),
                f"{result['cpu_s_per_1k_samples']:.2f}",
                f"{result['bytes_per_s'] / 1e9:.2f}",
                f"{result['fraction_of_memcpy']:.0%} of {result['memcpy_bytes_per_s'] / 1e9:.1f}",
                *((_fio_cell(result),) if cold else ()),
            )
        )
    derived: list[str] = []
    for name, figures in report["ratios"].items():

        def ratio(figure: str, figures: Mapping[str, float] = figures) -> str:
            value = figures.get(figure)
            return "" if value is None else f"{value:.2f}×"

        table.append(
            (
                name,
                ratio("samples_per_s"),
                ratio("first_batch_s"),
                ratio("steady_unreclaimable_bytes"),
                ratio("startup_peak_unreclaimable_bytes"),
                ratio("peak_unreclaimable_bytes"),
                ratio("loader_unreclaimable_bytes"),
                ratio("peak_pss_bytes"),
                ratio("cpu_s_per_1k_samples"),
                "",
                "",
                *(("",) if cold else ()),
            )
        )
        for figure, value in figures.items():
            if figure not in RATIO_FIGURES:
                derived.append(f"{name} {figure}: {value:.3f}")
    lines.extend(format_table(table))
    for result in report["results"]:
        per_epoch = [f"{result[name]:,.0f}" for name in _epoch_figures([result])]
        if per_epoch:
            derived.insert(0, f"{result.get('key', result['loader'])} samples/s by epoch: "
                           + ", ".join(per_epoch))  # fmt: skip
    lines.extend(derived)
    lines.append(
        "unreclaimable = Pss_Anon + Pss_Shmem + shared memory held by descriptors and not "
        "mapped, over the process tree; steady = median from the first batch to the last; "
        "start-up peak = before the first batch; above start = the peak minus the tree "
        "after imports, before the loader"
    )
    for skipped in report["skipped"]:
        lines.append(f"skipped {skipped['loader']}: {skipped['reason']}")
    if report["goals"]:
        lines.append("")
        lines.append("goals:")
        lines.extend(format_goals(report["goals"]))
    return "\n".join(lines)


def format_goals(goals: Sequence[Mapping[str, Any]]) -> list[str]:
    """A line per checked goal: the value, the verdict and, where the goal
    has one, what the yardstick reaches in leanloader's place."""
    lines = []
    for goal in goals:
        if goal["met"] is None:
            verdict, value = "not measured", ""
        else:
            verdict = "met" if goal["met"] else "NOT met"
            value = f"{goal['value']:.2f}"
        line = f"  {goal['goal']:<40} {value:>8}  {verdict}"
        if goal.get("yardstick_value") is not None:
            line += f"  ({goal['yardstick']}: {goal['yardstick_value']:.2f})"
        lines.append(line)
    return lines


def _fio_cell(result: Mapping[str, Any]) -> str:
    if "fio_bytes_per_s" not in result:
        return ""
    return (
        f"{result['fraction_of_fio']:.0%} of {result['fio_bytes_per_s'] / 1e9:.2f} / "
        f"{result['fraction_of_fio_deep']:.0%} of {result['fio_deep_bytes_per_s'] / 1e9:.2f}"
    )


def format_table(rows: list[tuple[str, ...]]) -> list[str]:
    """Left-aligned first column, right-aligned others."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [row[0].ljust(widths[0])]
        cells += [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells).rstrip())
    return lines
