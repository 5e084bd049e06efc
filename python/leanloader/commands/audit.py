"""`leanloader audit module:factory`: what each DataLoader worker would receive."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from dataclasses import asdict


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "audit",
        help="bytes each DataLoader worker receives of a dataset, and what must not travel",
        description=(
            "Builds the dataset with MODULE:FACTORY (a function or class called with no "
            "arguments), walks its attributes and reports, per attribute path, the bytes each "
            "worker process receives under torch's DataLoader and under ll.DataLoader, and "
            "flags what should never travel to a worker (models, CUDA tensors, open handles, "
            "unpicklable objects) with the fix."
        ),
    )
    parser.add_argument("target", metavar="MODULE:FACTORY", help="e.g. mytrain.data:make_dataset")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from leanloader.audit import audit

    module_name, _, factory_name = args.target.partition(":")
    if not module_name or not factory_name:
        print(f"expected MODULE:FACTORY, got {args.target!r}", file=sys.stderr)
        return 2
    sys.path.insert(0, os.getcwd())
    factory = importlib.import_module(module_name)
    for part in factory_name.split("."):
        factory = getattr(factory, part)
    report = audit(factory())
    if args.json:
        print(json.dumps({"pickled_bytes_torch": report.pickled_bytes_torch,
                          "error": report.error,
                          "entries": [asdict(e) for e in report.entries]}, indent=2))  # fmt: skip
    else:
        print(report)
    return 0
