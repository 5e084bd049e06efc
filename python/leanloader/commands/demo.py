"""`leanloader demo`: a short side-by-side a newcomer can read in a minute."""

from __future__ import annotations

import argparse
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from leanloader.bench.harness import BenchError, format_table, run_scenario
from leanloader.bench.scenarios import get_scenario
from leanloader.units import format_bytes

SCENARIO = "arrays"
DEMO_LOADERS = ("leanloader", "torch", "torch-forkserver")
ROUNDS = 3

EXPLANATION = (
    "Both loaders read the same shuffled rows of a memory-mapped .npy file, each in a process "
    'that has imported the same libraries. "Private memory" is what the operating system '
    "cannot take back while the loader runs (anonymous and shared-memory pages, Pss_Anon + "
    "Pss_Shmem, summed over the process and its workers, each shared page counted once): it is "
    "the part that gets a training job killed when memory runs out. Part of it is Python and "
    "its libraries, there before any loader starts; the rest is the loader's. \"Shared file "
    'cache" is the pages of files the processes have mapped, the data and the libraries '
    "(Pss_File): shared with every other reader and reclaimable, so not a cost that adds up."
)
BASELINE_EXPLANATION = (
    "The torch DataLoader runs worker processes, each with its own Python interpreter, and "
    "passes every batch between processes through shared memory; leanloader copies each row "
    "once, with native threads, into a batch buffer it reuses."
)


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="a short side-by-side of leanloader and torch's DataLoader",
        description=(
            "Generates a small dataset, loads it with leanloader and with "
            "torch.utils.data.DataLoader, and prints speed and memory side by side."
        ),
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="where to generate the data (default: a temporary folder, removed afterwards)",
    )
    # For tests: a smaller dataset.
    parser.add_argument("--rows", type=int, default=None, help=argparse.SUPPRESS)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    scenario = get_scenario(SCENARIO)
    overrides = {} if args.rows is None else {"rows": args.rows}
    size = {**scenario.sizes["demo"], **overrides}
    print(f"leanloader demo: {scenario.describe_size(size)}.")
    print(f"Each loader runs {ROUNDS} times in its own process, taking turns; medians shown.\n")

    def progress(message: str) -> None:
        print(f"  {message}", flush=True)

    started = time.perf_counter()
    try:
        if args.dir is not None:
            report = _run(scenario, args.dir, overrides, progress)
        else:
            with tempfile.TemporaryDirectory(prefix="leanloader-demo-") as folder:
                report = _run(scenario, Path(folder), overrides, progress)
    except BenchError as error:
        print(f"leanloader demo: {error}", file=sys.stderr)
        return 1
    print()
    print(format_demo_table(report, scenario))
    print()
    explanation = EXPLANATION if report["skipped"] else f"{EXPLANATION} {BASELINE_EXPLANATION}"
    print(textwrap.fill(explanation, width=88))
    for skipped in report["skipped"]:
        label = _label(scenario, skipped["loader"])
        print(
            f"\nThe baseline ({label}) was not run: it {skipped['reason']} "
            "(pip install torch to see the comparison)."
        )
    print(f"\n(finished in {time.perf_counter() - started:.0f} s)")
    return 0


def _run(scenario: Any, folder: Path, overrides: dict[str, Any], progress: Any) -> dict[str, Any]:
    return run_scenario(
        scenario,
        "demo",
        rounds=ROUNDS,
        data_dir=folder,
        size_overrides=overrides,
        progress=progress,
        separate_passes=False,  # a demo: one pass per loader and round
        only=DEMO_LOADERS,  # the row-size sweep's runs are the bench's, not the demo's
    )


# Rows of the demo table: (label, figure, how to print it).
DEMO_ROWS: tuple[tuple[str, str, Callable[[float], str]], ...] = (
    ("samples per second", "samples_per_s", lambda value: f"{value:,.0f}"),
    ("time to first batch", "first_batch_s", lambda value: f"{value:.2f} s"),
    ("private memory, peak", "peak_unreclaimable_bytes", format_bytes),
    ("  Python and libraries, at start", "start_unreclaimable_bytes", format_bytes),
    ("  added by the loader", "loader_unreclaimable_bytes", format_bytes),
    ("shared file cache, peak", "peak_pss_file_bytes", format_bytes),
    ("processes", "peak_processes", lambda value: f"{value:.0f}"),
    ("CPU seconds per 1,000 samples", "cpu_s_per_1k_samples", lambda value: f"{value:.2f}"),
)


def format_demo_table(report: dict[str, Any], scenario: Any) -> str:
    results = report["results"]
    labels = (_label(scenario, result.get("key", result["loader"])) for result in results)
    rows = [("", *labels)]
    for label, figure, show in DEMO_ROWS:
        rows.append((label, *(show(result[figure]) for result in results)))
    lines = format_table(rows)
    for name, ratios in report["ratios"].items():
        numerator, denominator = name.split("/")
        lines.append("")
        summary = (
            f"{numerator} vs {denominator}: {ratios['samples_per_s']:.1f}× the samples per second, "
            f"first batch in {_times(ratios['first_batch_s'])} the time, "
            f"{_times(ratios['peak_unreclaimable_bytes'])} the private memory "
            f"({_times(ratios['loader_unreclaimable_bytes'])} counting only what the loader added)."
        )
        lines.extend(textwrap.wrap(summary, width=88))
    return "\n".join(lines)


def _times(ratio: float) -> str:
    """A ratio with two decimals, or two significant digits below 0.1 (a first
    batch 250 times sooner is 0.004×, not 0.00×)."""
    return f"{ratio:.2f}×" if ratio >= 0.1 else f"{ratio:.2g}×"


def _label(scenario: Any, run_key: str) -> str:
    return scenario.loader(run_key).label or run_key
