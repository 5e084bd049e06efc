"""``python -m leanloader.run [--set name=value ...] script.py [args...]``:
runs a training script with ``ll.install()`` applied first, so every torch
DataLoader the script and its framework build (subclasses defined by modules
it imports included) is an ``ll.DataLoader``; each ``--set`` is a default
for one of ll.DataLoader's own options (``--set worker_mode=thread``:
dataloader/options.py). ``python -m leanloader.run -m package.module
[args...]`` runs a module the same way."""

from __future__ import annotations

import os
import runpy
import sys

USAGE = (
    "usage: python -m leanloader.run [--set name=value ...] script.py [args...] | "
    "-m module [args...]"
)


def _usage_error() -> None:
    print(USAGE, file=sys.stderr)
    raise SystemExit(2)


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        _usage_error()
    import leanloader
    from leanloader.dataloader.options import (
        ENVIRONMENT_VARIABLE,
        format_options,
        from_environment,
        parse,
    )

    options: dict = {}
    while args and args[0] == "--set":
        if len(args) < 2:
            _usage_error()
        options.update(parse(args[1], "--set"))
        args = args[2:]
    if not args or (args[0] == "-m" and len(args) < 2):
        _usage_error()
    if options:
        # child interpreters (torchrun, DDP launchers) that install get them too
        os.environ[ENVIRONMENT_VARIABLE] = format_options({**from_environment(), **options})
    leanloader.install(**options)
    if args[0] == "-m":
        sys.argv = args[1:]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        return
    sys.argv = args
    sys.path.insert(0, os.path.dirname(os.path.abspath(args[0])))
    runpy.run_path(args[0], run_name="__main__")


if __name__ == "__main__":
    main()
