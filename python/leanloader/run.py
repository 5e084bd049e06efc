"""``python -m leanloader.run script.py [args...]``: runs a training script
with ``ll.install()`` applied first, so every torch DataLoader the script and
its framework build (subclasses defined by modules it imports included) is an
``ll.DataLoader``. ``python -m leanloader.run -m package.module [args...]``
runs a module the same way."""

from __future__ import annotations

import runpy
import sys

USAGE = "usage: python -m leanloader.run script.py [args...] | -m module [args...]"


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr)
        raise SystemExit(2)
    import leanloader

    leanloader.install()
    if args[0] == "-m":
        if len(args) < 2:
            print(USAGE, file=sys.stderr)
            raise SystemExit(2)
        sys.argv = args[1:]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        return
    sys.argv = args
    sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(args[0])))
    runpy.run_path(args[0], run_name="__main__")


if __name__ == "__main__":
    main()
