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


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr)
        raise SystemExit(2)
    import leanloader
    from leanloader.dataloader.options import ENVIRONMENT_VARIABLE, format_options, parse

    options: dict = {}
    while args and args[0] == "--set":
        if len(args) < 2:
            print(USAGE, file=sys.stderr)
            raise SystemExit(2)
        options.update(parse(args[1], "--set"))
        args = args[2:]
    if not args:
        print(USAGE, file=sys.stderr)
        raise SystemExit(2)
    if options:
        # child interpreters (torchrun, DDP launchers) that install get them too
        inherited = parse(os.environ.get(ENVIRONMENT_VARIABLE, ""), ENVIRONMENT_VARIABLE)
        os.environ[ENVIRONMENT_VARIABLE] = format_options({**inherited, **options})
    leanloader.install(**options)
    if args[0] == "-m":
        if len(args) < 2:
            print(USAGE, file=sys.stderr)
            raise SystemExit(2)
        sys.argv = args[1:]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        return
    sys.argv = args
    sys.path.insert(0, os.path.dirname(os.path.abspath(args[0])))
    runpy.run_path(args[0], run_name="__main__")


if __name__ == "__main__":
    main()
