"""ll.DataLoader's own options for code one does not edit: defaults that
``ll.install(**options)`` sets for every ll.DataLoader built while installed
(a framework's loaders included), from

- ``ll.install(worker_mode="thread", ...)``,
- ``python -m leanloader.run --set worker_mode=thread script.py``,
- ``LEANLOADER_OPTIONS="worker_mode=thread,share_threshold=4194304"`` in the
  environment, read by every install() (child interpreters of torchrun or a
  framework's DDP launcher inherit it, with ``LEANLOADER_INSTALL=1``).

An argument the code passes itself wins over a default set here; an option
set here wins over the environment's. ``multiprocessing_context`` takes a
start method's name ("fork", "spawn", "forkserver") and applies where the
code passes none; fork is still refused once a GPU runtime is initialised.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

ENVIRONMENT_VARIABLE = "LEANLOADER_OPTIONS"

# Each option and its value when nothing sets it (ll.DataLoader's documented defaults).
BUILT_IN: dict[str, Any] = {
    "worker_mode": "process",
    "force_fork": False,
    "share_threshold": 1 << 20,
    "share_in_place": False,
    "shm_dir": None,
    "warn_copy_bytes": 64 << 20,
    "multiprocessing_context": None,
}
_TYPES: dict[str, tuple[type, ...]] = {
    "worker_mode": (str,),
    "force_fork": (bool,),
    "share_threshold": (int,),
    "share_in_place": (bool,),
    "shm_dir": (str, type(None)),
    "warn_copy_bytes": (int,),
    "multiprocessing_context": (str, type(None)),
}
START_METHODS = ("fork", "spawn", "forkserver")

_installed: dict[str, Any] = {}


def option(name: str, passed: Any) -> Any:
    """What an ll.DataLoader uses for `name`: the argument its caller passed
    (anything but None), else the installed default, else the built-in one."""
    if passed is not None:
        return passed
    return _installed.get(name, BUILT_IN[name])


def set_defaults(options: Mapping[str, Any]) -> None:
    """Validates `options` and makes them the installed defaults (replacing
    earlier ones)."""
    checked = {name: _checked(name, value) for name, value in options.items()}
    _installed.clear()
    _installed.update(checked)


def clear_defaults() -> None:
    _installed.clear()


def from_environment() -> dict[str, Any]:
    """The options of LEANLOADER_OPTIONS ("name=value,name=value")."""
    return parse(os.environ.get(ENVIRONMENT_VARIABLE, ""), ENVIRONMENT_VARIABLE)


def parse(text: str, where: str) -> dict[str, Any]:
    """ "name=value" items separated by commas: integers, true/false and none
    are read as such, anything else is a string."""
    options: dict[str, Any] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, equals, value = item.partition("=")
        if not equals or not name.strip():
            raise ValueError(f"{where}: {item!r} is not name=value")
        options[name.strip()] = _value(value.strip())
    return options


def format_options(options: Mapping[str, Any]) -> str:
    """The text parse() reads back as `options`."""

    def text(value: Any) -> str:
        if value is None or isinstance(value, bool):
            return str(value).lower()
        return str(value)

    return ",".join(f"{name}={text(value)}" for name, value in options.items())


def _value(text: str) -> Any:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered == "none":
        return None
    try:
        return int(text, 0)
    except ValueError:
        return text


def _checked(name: str, value: Any) -> Any:
    if name not in BUILT_IN:
        raise TypeError(
            f"ll.install() got an unknown ll.DataLoader option {name!r}; options: "
            + ", ".join(BUILT_IN)
        )
    types = _TYPES[name]
    if not isinstance(value, types) or (int in types and isinstance(value, bool)):
        wanted = " or ".join("None" if t is type(None) else t.__name__ for t in types)
        raise TypeError(f"ll.install(): option {name} must be {wanted}, got {value!r}")
    if name == "worker_mode" and value not in ("process", "thread"):
        raise ValueError(f"ll.install(): worker_mode must be 'process' or 'thread', got {value!r}")
    if name == "multiprocessing_context" and value is not None and value not in START_METHODS:
        raise ValueError(
            "ll.install(): multiprocessing_context must be one of "
            f"{', '.join(START_METHODS)}, got {value!r}"
        )
    return value
