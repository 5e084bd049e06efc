"""`leanloader cache inspect|verify|build`: look into, check and fill a TensorCache."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import Any

_MIB = 1 << 20


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "cache",
        help="inspect, verify or build a tensor cache",
        description="Inspect, verify or build a leanloader TensorCache (a directory of "
        "safetensors shards plus manifest.json), a folder of one .safetensors per sample, "
        "or one .safetensors file.",
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

    inspect = actions.add_parser(
        "inspect", help="entries, tensor names, dtypes, shapes, bytes, fingerprints"
    )
    inspect.add_argument("path", help="cache directory, per-sample folder or .safetensors file")
    inspect.add_argument("--limit", type=int, default=20, help="entries listed (0: all)")
    inspect.add_argument("--json", action="store_true", help="print everything as JSON")
    inspect.set_defaults(func=run_inspect)

    verify = actions.add_parser(
        "verify",
        help="check every file and entry; exit 1 naming each invalid, stale or partial one",
    )
    verify.add_argument("path")
    verify.add_argument(
        "--no-sources", dest="sources", action="store_false",
        help="do not compare entries with their source files",
    )  # fmt: skip
    verify.add_argument(
        "--data", action="store_true",
        help="also read every tensor and compare it with its checksum (reads the whole cache)",
    )  # fmt: skip
    verify.add_argument("--json", action="store_true")
    verify.set_defaults(func=run_verify)

    build = actions.add_parser("build", help="encode files into a cache (resumable)")
    build.add_argument("--source", required=True, help="glob of input files (** recurses)")
    build.add_argument(
        "--encode", required=True, metavar="MODULE:FUNCTION",
        help="encode(batch) -> dict of batched tensors; batch = {'data': [uint8 tensor per file]}",
    )  # fmt: skip
    build.add_argument("--out", required=True, help="cache directory")
    build.add_argument("--batch-size", type=int, default=16)
    build.add_argument("--config", default=None, help="JSON encode configuration (hashed)")
    build.add_argument("--content-hash", action="store_true", help="fingerprint by content")
    build.add_argument("--shard-bytes", type=int, default=256 << 20)
    build.add_argument("--threads", type=int, default=None)
    build.add_argument("--no-progress", dest="progress", action="store_false")
    build.set_defaults(func=run_build)


def _shape(shape: Any) -> str:
    return "varies" if shape is None else "[" + ", ".join(str(d) for d in shape) + "]"


def _open(path: str) -> Any:
    from leanloader.cache import TensorCache

    if not os.path.exists(path):
        raise FileNotFoundError(f"no such cache: {path}")
    # Looking must not change anything: no clean-up of leftovers.
    return TensorCache(path, cleanup=False, output="numpy")


def run_inspect(args: argparse.Namespace) -> int:
    try:
        info = _open(args.path).inspect()
    except (OSError, ValueError) as error:
        print(f"leanloader cache inspect: {error}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(info, indent=2, default=list))
        return 0
    print(f"{info['path']}: {info['layout']} cache, {info['entries']} entries in "
          f"{len(info['shards'])} {'shards' if info['layout'] == 'sharded' else 'files'}, "
          f"{info['bytes'] / _MIB:,.1f} MiB of tensors ({info['file_bytes'] / _MIB:,.1f} MiB "
          "on disk)")  # fmt: skip
    print("fields:")
    for field in info["fields"]:
        print(f"  {field['name']:<24} {field['dtype']:<6} {_shape(field['shape'])}")
    limit = len(info["items"]) if args.limit == 0 else args.limit
    if info["items"]:
        print("entries:")
    for entry in info["items"][:limit]:
        shard = info["shards"][entry["shard"]]["file"]
        nbytes = sum(t["nbytes"] for t in entry["tensors"])
        print(f"  {entry['key']}  ({shard}, {nbytes:,} bytes)")
        for t in entry["tensors"]:
            print(f"      {t['name']:<20} {t['dtype']:<6} {_shape(t['shape'])} @ {t['offset']}")
        fp = entry["fingerprint"]
        parts = []
        if fp["path"]:
            parts.append(f"path={fp['path']} size={fp['size']} mtime_ns={fp['mtime_ns']}")
        if fp["content_hash"]:
            parts.append(f"content={fp['content_hash']}")
        if fp["config"]:
            parts.append(f"config={fp['config']}")
        if parts and info["layout"] == "sharded":
            print("      fingerprint: " + " ".join(parts))
    if len(info["items"]) > limit:
        print(f"  ... {len(info['items']) - limit} more (--limit 0 lists all)")
    return 0


def run_verify(args: argparse.Namespace) -> int:
    try:
        cache = _open(args.path)
        problems = cache.verify(
            check_sources=args.sources, include_garbage=True, check_data=args.data
        )
    except (OSError, ValueError) as error:
        # A manifest that does not parse, a missing directory: the cache is invalid.
        if args.json:
            print(json.dumps([{"kind": "invalid", "where": args.path, "message": str(error)}]))
        else:
            print(f"invalid: {args.path}: {error}")
        return 1
    failures = [p for p in problems if p["kind"] != "garbage"]
    if args.json:
        print(json.dumps(problems, indent=2))
    else:
        for problem in problems:
            print(f"{problem['kind']}: {problem['where']}: {problem['message']}")
        status = "OK" if not failures else f"{len(failures)} problem(s)"
        print(f"{args.path}: {len(cache)} entries, {status}")
    return 1 if failures else 0


def _load_function(spec: str) -> Any:
    module_name, separator, function_name = spec.partition(":")
    if not separator or not module_name or not function_name:
        raise ValueError(f"--encode expects MODULE:FUNCTION, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    return getattr(importlib.import_module(module_name), function_name)


def run_build(args: argparse.Namespace) -> int:
    import leanloader as ll

    try:
        encode = _load_function(args.encode)
        config = json.loads(args.config) if args.config else None
        source = ll.FileSource(args.source)
        cache = ll.TensorCache(args.out, shard_bytes=args.shard_bytes)
        stats = cache.build(
            source,
            encode=encode,
            batch_size=args.batch_size,
            progress=args.progress,
            config=config,
            content_hash=args.content_hash,
            num_threads=args.threads,
        )
    except (OSError, ValueError, TypeError, ImportError, AttributeError) as error:
        print(f"leanloader cache build: {error}", file=sys.stderr)
        return 1
    print(f"{args.out}: built {stats['built']}, already fresh {stats['fresh']}, "
          f"{len(cache)} entries")  # fmt: skip
    return 0
