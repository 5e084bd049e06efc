"""Scripts without `if __name__ == "__main__":`: spawn and forkserver
workers import the main module, so a script whose top level builds and runs
a loader would run again in every worker. Said in the main process, before
any worker starts, with the fix (torch says nothing and trains again in each
worker)."""

from __future__ import annotations

import multiprocessing
import sys
from typing import Any

# Exit status of a spawned process that was asked to start workers while it
# re-imported an unguarded main script (refuse_unguarded_main).
UNGUARDED_EXIT = 76

UNGUARDED_MAIN = (
    "ll.DataLoader was asked to start worker processes while {script} was being re-imported "
    "by a worker process: with the spawn start method every worker imports the main module, "
    "so a script whose loader code runs at the top level starts loaders again in each worker. "
    "Fix: put the code that builds and iterates the loader under "
    '`if __name__ == "__main__":`, or pass worker_mode="thread" (no worker processes).'
)
UNGUARDED_MAIN_NEEDED = (
    "ll.DataLoader cannot start worker processes from the top level of {script} (line "
    '{line}), outside `if __name__ == "__main__":`: the dataset, collate_fn or '
    "worker_init_fn is defined in that script, so every worker would import it and run the "
    "script's top level, training included, again. Fix: put the code that builds and "
    'iterates the loader under `if __name__ == "__main__":`, move what the workers need into '
    'a module of its own, or pass worker_mode="thread" (no worker processes).'
)


def refuse_unguarded_main() -> None:
    """In a spawned process that is still importing the main module (a worker
    re-running a script without a main guard), starting workers again cannot
    work: say why and how to fix it, in this process and (through the exit
    status) in the one that started it."""
    process = multiprocessing.current_process()
    if not getattr(process, "_inheriting", False):
        return
    main = sys.modules.get("__main__")
    script = (
        getattr(main, "__file__", None) or (sys.argv[0] if sys.argv else "") or "the main module"
    )
    sys.stderr.write(UNGUARDED_MAIN.format(script=script) + "\n")
    sys.stderr.flush()
    import os

    os._exit(UNGUARDED_EXIT)


def unguarded_main_line() -> tuple[str, int] | None:
    """(script, line) when the main script's top level is running right now
    outside an `if __name__ == "__main__":` block (the caller is that code),
    else None."""
    main = sys.modules.get("__main__")
    script = getattr(main, "__file__", None)
    if main is None or not script:
        return None
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals is main.__dict__:
            break
        frame = frame.f_back
    if frame is None:
        return None
    line = frame.f_lineno
    try:
        import ast

        with open(script, encoding="utf-8") as source:
            tree = ast.parse(source.read())
    except (OSError, SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_main_guard(node.test):
            first, last = node.body[0].lineno, node.body[-1].end_lineno or node.body[-1].lineno
            if first <= line <= last:
                return None
    return script, line


def _is_main_guard(test: Any) -> bool:
    import ast

    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and len(test.comparators) == 1):
        return False
    sides = [test.left, test.comparators[0]]
    names = [side.id for side in sides if isinstance(side, ast.Name)]
    constants = [side.value for side in sides if isinstance(side, ast.Constant)]
    return names == ["__name__"] and constants == ["__main__"] and isinstance(test.ops[0], ast.Eq)
