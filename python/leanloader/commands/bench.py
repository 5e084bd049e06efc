"""`leanloader bench SCENARIO`: leanloader against a baseline, side by side."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from leanloader.bench.harness import (
    MIN_ROUNDS,
    BenchError,
    default_data_dir,
    format_report,
    run_scenario,
)
from leanloader.bench.scenarios import get_scenario, scenario_names


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="compare leanloader with a baseline loader, side by side",
        description=(
            "Runs each loader of SCENARIO in its own process, the order rotated each round, "
            f"for at least {MIN_ROUNDS} rounds; each round a timing pass (no memory sampler) "
            "and a memory pass (the process tree sampled every 50 ms). Reports medians: "
            "samples/s, time to first batch and CPU seconds per 1,000 samples from the timing "
            "pass; steady-state (median over the epoch), start-up peak and peak unreclaimable "
            "memory (Pss_Anon + Pss_Shmem + shared memory held by descriptors) and peak PSS "
            "from the memory pass; and leanloader's throughput as a fraction of this "
            "machine's memcpy."
        ),
    )
    parser.add_argument(
        "scenario",
        choices=[*scenario_names(), "yolo"],
        help="what to load (yolo: Ultralytics training, from its own environment: make bench-yolo)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--quick", action="store_true", help="a smaller variant that finishes within a minute"
    )
    parser.add_argument(
        "--rounds", type=int, default=MIN_ROUNDS, help=f"rounds (at least {MIN_ROUNDS})"
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help=f"where generated data is kept and reused (default: {default_data_dir()})",
    )
    parser.add_argument(
        "--plot",
        metavar="FILE.png",
        help="write a PNG of samples/s and memory over time per loader (needs matplotlib)",
    )
    parser.add_argument(
        "--cold",
        action="store_true",
        help="data not in the page cache: the scenario's files are evicted before every pass, "
        "and fio (when installed) reads them at random in the same block size, with one and "
        "with 32 reads in flight per thread, as yardsticks; samples/s then counts the whole "
        "pass, first batch included",
    )
    parser.add_argument(
        "--only",
        metavar="LOADER[,LOADER]",
        help="run only these loaders (the keys the report names, e.g. leanloader-2,torch-fork-2)",
    )
    # For tests: overrides one size parameter of the scenario, e.g. --set rows=128.
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help=argparse.SUPPRESS
    )
    parser.set_defaults(func=run)


def parse_size_overrides(assignments: list[str]) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    for assignment in assignments:
        key, separator, value = assignment.partition("=")
        if not separator or not key:
            raise SystemExit(f"leanloader bench: --set expects KEY=VALUE, got {assignment!r}")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    return overrides


def run(args: argparse.Namespace) -> int:
    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    if args.scenario == "yolo":
        from leanloader.bench import yolo

        arguments = ["--rounds", str(args.rounds)]
        if args.data_dir is not None:
            arguments += ["--data-dir", str(args.data_dir)]
        if args.only:
            arguments += ["--caches", args.only]  # none,ram
        return yolo.main(arguments)
    try:
        report = run_scenario(
            get_scenario(args.scenario),
            "quick" if args.quick else "full",
            rounds=args.rounds,
            data_dir=args.data_dir,
            size_overrides=parse_size_overrides(args.set),
            progress=progress,
            only=args.only.split(",") if args.only else None,
            cold=args.cold,
        )
    except (BenchError, ValueError) as error:
        print(f"leanloader bench: {error}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(format_report(report))
    if args.plot:
        from leanloader.bench.plot import plot_timelines

        try:
            plot_timelines(report, args.plot)
        except ImportError:
            print("leanloader bench: --plot needs matplotlib", file=sys.stderr)
            return 1
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0
