"""The `leanloader` command line: one module per subcommand in leanloader.commands."""

from __future__ import annotations

import argparse
import importlib
import sys

# Each module leanloader.commands.<name> defines `add_parser(subparsers)`,
# which registers the subcommand and sets `func(args) -> int` as its default.
COMMANDS = ("demo", "bench", "estimate", "mem", "cache", "audit")


def _version() -> str:
    from leanloader import __version__

    return __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="leanloader",
        description="leanloader: data loading with native threads and a known memory bill.",
    )
    parser.add_argument("--version", action="version", version=f"leanloader {_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"leanloader.commands.{name}").add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
