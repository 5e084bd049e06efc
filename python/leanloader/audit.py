"""ll.audit: what a dataset costs each worker process, and what should never
travel to one.

``audit(dataset)`` walks the dataset's attributes (object ``__dict__`` and
``__slots__``, dicts, lists, tuples) and reports, per attribute path, the
bytes each worker receives — under ``torch.utils.data.DataLoader`` (the
object pickled by value into every spawn/forkserver worker; NumPy arrays
copied, CPU tensors moved to shared memory) and under ``ll.DataLoader``
(large arrays shared once, memory-mapped arrays re-mapped) — and flags what
should not travel at all, with the fix:

- ``torch.nn.Module``: drop it in ``__getstate__``;
- CUDA tensors: keep them on the CPU or cache them to disk (``TensorCache``);
- open file handles (files, h5py, sqlite, sockets) and locks: open lazily
  (h5py datasets: ``ll.HDF5Source``);
- large lists / dicts of Python objects: ``ll.SharedRecords``;
- objects that cannot be pickled at all (lambdas, local classes).
"""

from __future__ import annotations

import io
import pickle
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from leanloader import _core
from leanloader.units import format_bytes

# Arrays and tensors at least this large are shared once by ll.DataLoader.
SHARE_THRESHOLD_BYTES = 1 << 20
# Lists / dicts whose pickled size is at least this are reported.
REPORT_THRESHOLD_BYTES = 1 << 20
# Containers longer than this are sized from a sample, not walked whole.
MAX_WALK_ITEMS = 10_000
MAX_DEPTH = 12

_LOCK_TYPES = (type(threading.Lock()), type(threading.RLock()))


def walk(root: Any, root_path: str = "dataset") -> Iterator[tuple[str, Any, Any, Any]]:
    """Yields (path, value, container, key) for every object reachable from
    `root` through attributes, dict values and list/tuple items (each object
    once, depth ≤ MAX_DEPTH, containers of ≤ MAX_WALK_ITEMS items). `container`
    and `key` say where the value lives so that callers can replace it
    (container is a dict, a list, or an object whose attribute `key` it is)."""
    seen: set[int] = set()
    stack: list[tuple[str, Any, Any, Any, int]] = [(root_path, root, None, None, 0)]
    while stack:
        path, value, container, key, depth = stack.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        yield path, value, container, key
        if depth >= MAX_DEPTH or _is_leaf(value):
            continue
        children: list[tuple[str, Any, Any, Any]] = []
        if isinstance(value, dict):
            if len(value) <= MAX_WALK_ITEMS:
                for k, v in value.items():
                    children.append((f"{path}[{k!r}]", v, value, k))
        elif isinstance(value, (list, tuple)):
            if len(value) <= MAX_WALK_ITEMS:
                for i, v in enumerate(value):
                    children.append((f"{path}[{i}]", v, value, i))
        else:
            attributes = getattr(value, "__dict__", None)
            if isinstance(attributes, dict):
                for k, v in attributes.items():
                    children.append((f"{path}.{k}", v, value, k))
            for name in _slot_names(type(value)):
                if hasattr(value, name):
                    children.append((f"{path}.{name}", getattr(value, name), value, name))
        for child in reversed(children):
            stack.append((*child, depth + 1))


def _slot_names(cls: type) -> list[str]:
    names = []
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        if isinstance(slots, str):
            slots = (slots,)
        names.extend(s for s in slots if s not in ("__dict__", "__weakref__"))
    return names


def _is_leaf(value: Any) -> bool:
    if isinstance(value, (str, bytes, bytearray, int, float, complex, bool, type(None))):
        return True
    if isinstance(value, type) or (callable(value) and not hasattr(value, "__dict__")):
        return True
    module = type(value).__module__ or ""
    if module.startswith(("numpy", "torch", "h5py")) or _is_module(value):
        return True
    from leanloader.shared_records import SharedRecords

    return isinstance(value, (SharedRecords, io.IOBase, socket.socket, *_LOCK_TYPES))


def _is_module(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.nn.Module)


@dataclass
class AuditEntry:
    path: str  # "dataset.features"
    what: str  # "numpy.ndarray float32 (262144, 1024)"
    bytes_torch: int  # per worker under torch.utils.data.DataLoader
    bytes_leanloader: int  # per worker under ll.DataLoader
    problem: str  # "" when it is fine to send
    fix: str
    never_send: bool = False  # a model, a CUDA tensor, an open handle, unpicklable

    def __str__(self) -> str:
        flag = "NEVER SEND " if self.never_send else ""
        text = (
            f"{self.path}: {self.what}: {format_bytes(self.bytes_torch)} per worker with torch, "
            f"{format_bytes(self.bytes_leanloader)} with ll.DataLoader"
        )
        if self.problem:
            text += f"\n    {flag}{self.problem}"
        if self.fix:
            text += f"\n    fix: {self.fix}"
        return text


@dataclass
class AuditReport:
    entries: list[AuditEntry] = field(default_factory=list)
    pickled_bytes_torch: int = 0  # the whole dataset pickled by value
    error: str = ""  # the dataset cannot be pickled at all

    def entry(self, path: str) -> AuditEntry:
        for e in self.entries:
            if e.path == path:
                return e
        raise KeyError(path)

    @property
    def never_send(self) -> list[AuditEntry]:
        return [e for e in self.entries if e.never_send]

    def __str__(self) -> str:
        lines = [
            "leanloader audit: what each worker process receives",
            f"whole dataset pickled by value: {format_bytes(self.pickled_bytes_torch)}",
        ]
        if self.error:
            lines.append(f"cannot be pickled: {self.error}")
        if not self.entries:
            lines.append("nothing large or unsafe found")
        lines += [str(e) for e in self.entries]
        return "\n".join(lines)


def _pickled_size(value: Any) -> int:
    """Bytes of `value` pickled by value (lists sized from a sample)."""
    if isinstance(value, (list, tuple)) and len(value) > MAX_WALK_ITEMS:
        step = len(value) // 1000
        sample = [value[i] for i in range(0, len(value), step)][:1000]
        return int(len(pickle.dumps(sample, protocol=5)) * len(value) / len(sample))
    return len(pickle.dumps(value, protocol=5))


def _tensor_bytes(tensor: Any) -> int:
    return int(tensor.untyped_storage().nbytes())


def _module_bytes(module: Any) -> int:
    storages = {}
    for t in list(module.parameters()) + list(module.buffers()):
        storages[t.untyped_storage().data_ptr()] = _tensor_bytes(t)
    return sum(storages.values())


def audit(dataset: Any, *, threshold: int = REPORT_THRESHOLD_BYTES) -> AuditReport:
    """Reports what each worker would receive of `dataset`, per attribute
    path, and what should never travel to a worker (see the module doc)."""
    import numpy as np

    torch = sys.modules.get("torch")
    report = AuditReport()
    failing = find_unpicklable(dataset)
    if failing is not None:
        report.error = failing[1]
    for path, value, _container, _key in walk(dataset):
        entry = _audit_value(path, value, threshold, np, torch)
        if entry is not None:
            report.entries.append(entry)
    if failing is not None and not any(e.path == failing[0] for e in report.entries):
        report.entries.append(
            AuditEntry(failing[0], type(failing[2]).__qualname__, 0, 0,
                       f"cannot be pickled: {failing[1]}", _unpicklable_fix(failing[2]), True)
        )  # fmt: skip
    if failing is None:
        try:
            report.pickled_bytes_torch = len(pickle.dumps(dataset, protocol=5))
        except Exception:
            report.pickled_bytes_torch = 0
    return report


def _audit_value(path: str, value: Any, threshold: int, np: Any, torch: Any) -> AuditEntry | None:
    if isinstance(value, np.ndarray):
        from leanloader.dataloader.sharing import arena_array_reference, file_array_reference

        if file_array_reference(value, threshold) is not None:
            return None  # mapped again by each worker under ll.DataLoader (page cache)
        if arena_array_reference(value) is not None:
            return None  # a RawArray's arena file, mapped shared by each worker
        if value.nbytes < threshold:
            return None
        what = f"numpy.ndarray {value.dtype} {tuple(value.shape)}"
        shared = value.dtype.hasobject is False
        return AuditEntry(
            path, what, int(value.nbytes), 0 if shared else int(value.nbytes),
            "a NumPy array is pickled by value into every spawn/forkserver worker by torch",
            "ll.DataLoader shares it once in shared memory; or cache it to disk "
            "(ll.TensorCache / np.save) and memory-map it",
        )  # fmt: skip
    if torch is not None and isinstance(value, torch.nn.Module):
        size = _module_bytes(value)
        return AuditEntry(
            path, f"torch.nn.Module {type(value).__qualname__}", size, size,
            "a model should never travel to a data-loading worker "
            "(workers rarely need it; its weights are sent and its CUDA state is unsafe)",
            "drop it in __getstate__: def __getstate__(self): state = self.__dict__.copy(); "
            f"state.pop({path.rsplit('.', 1)[-1]!r}, None); return state",
            True,
        )  # fmt: skip
    if torch is not None and isinstance(value, torch.Tensor):
        size = _tensor_bytes(value)
        if value.device.type != "cpu":
            return AuditEntry(
                path, f"torch.Tensor on {value.device}", size, size,
                "a CUDA tensor in a worker initialises CUDA in every worker (and breaks fork)",
                "keep it on the CPU (.cpu()), or cache it to disk with ll.TensorCache",
                True,
            )  # fmt: skip
        if size < threshold:
            return None
        storage = value.untyped_storage()
        if _core.file_backing(storage.data_ptr(), storage.nbytes()) is not None:
            how = "mapped again from its file by ll.DataLoader's workers: nothing copied"
        else:
            how = "shared once in shared memory (by torch and by ll.DataLoader)"
        return AuditEntry(
            path, f"torch.Tensor {value.dtype} {tuple(value.shape)}", 0, 0, "", how,
        )  # fmt: skip
    if _is_handle(value):
        fix = (
            "open it lazily on first use in __getitem__ (each worker opens its own) and drop "
            "it in __getstate__"
        )
        if (type(value).__module__ or "").startswith("h5py"):
            fix = (
                "read the datasets with ll.HDF5Source({name: (files, dataset[, index])}) and "
                "ll.Loader: files opened once, rows read by native threads past HDF5's lock, "
                "no handle in any worker; or " + fix
            )
        return AuditEntry(
            path, f"open handle {type(value).__module__}.{type(value).__qualname__}", 0, 0,
            "open files, HDF5 handles, connections and locks cannot be sent to a worker "
            "(and are unsafe to share across fork)",
            fix,
            True,
        )  # fmt: skip
    from leanloader.shared_records import SharedRecords

    if isinstance(value, SharedRecords):
        return AuditEntry(
            path, f"ll.SharedRecords of {len(value)} records", 0, 0, "",
            f"already shared once ({format_bytes(value.nbytes)} in shared memory)",
        )  # fmt: skip
    if isinstance(value, (list, tuple, dict)) and len(value) > 0:
        if not _holds_python_objects(value):
            return None
        try:
            size = _pickled_size(value if not isinstance(value, dict) else list(value.items()))
        except Exception:
            return None
        if size < threshold:
            return None
        return AuditEntry(
            path, f"{type(value).__name__} of {len(value)} Python objects", size, size,
            "a list of Python objects is copied into every worker (pickled under "
            "spawn/forkserver, copied on read under fork)",
            f"wrap it once: self.{path.rsplit('.', 1)[-1]} = ll.SharedRecords(...) "
            "(one shared buffer, records decoded on access)",
        )  # fmt: skip
    return None


def _holds_python_objects(value: Any) -> bool:
    items = value.values() if isinstance(value, dict) else value
    for item in list(items)[:16]:
        if isinstance(item, (dict, tuple, list, str, bytes, int, float)):
            return True
        if hasattr(item, "__dict__") and not _is_module(item):
            return True
    return False


def _is_handle(value: Any) -> bool:
    if isinstance(value, (io.IOBase, socket.socket, *_LOCK_TYPES)):
        return True
    module = type(value).__module__ or ""
    if module.startswith("h5py") and type(value).__name__ in ("File", "Dataset", "Group"):
        return True
    return module == "sqlite3" and type(value).__name__ == "Connection"


def _unpicklable_fix(value: Any) -> str:
    name = getattr(value, "__qualname__", type(value).__qualname__)
    if "<lambda>" in name:
        return "replace the lambda with a function defined at module level"
    if "<locals>" in name:
        return "define the class or function at module level, not inside a function"
    return "make it picklable, or create it lazily in each worker and drop it in __getstate__"


class _CheapPickler(pickle.Pickler):
    """Pickles structure only: arrays and tensors become None (fast probing)."""

    def reducer_override(self, obj: Any) -> Any:
        module = type(obj).__module__ or ""
        if module.startswith("numpy") and hasattr(obj, "nbytes"):
            return (type(None), ())
        if module.startswith("torch") and hasattr(obj, "untyped_storage"):
            return (type(None), ())
        return NotImplemented


def _try_pickle(value: Any) -> Exception | None:
    try:
        _CheapPickler(io.BytesIO(), protocol=5).dump(value)
    except RecursionError:
        return None
    except Exception as error:
        return error
    return None


def find_unpicklable(root: Any, root_path: str = "dataset") -> tuple[str, str, Any] | None:
    """(path, error, value) of the deepest attribute that cannot be pickled,
    or None when `root` pickles."""
    error = _try_pickle(root)
    if error is None:
        return None
    path, value = root_path, root
    while True:
        for child_path, child, _container, _key in _children(value, path):
            child_error = _try_pickle(child)
            if child_error is not None:
                path, value, error = child_path, child, child_error
                break
        else:
            return path, f"{type(error).__name__}: {error}", value


def _children(value: Any, path: str) -> Callable[[], Any] | list[tuple[str, Any, Any, Any]]:
    if isinstance(value, dict):
        return [(f"{path}[{k!r}]", v, value, k) for k, v in value.items()]
    if isinstance(value, (list, tuple)):
        return [(f"{path}[{i}]", v, value, i) for i, v in enumerate(value)]
    if _is_leaf(value) and not hasattr(value, "__dict__"):
        return []
    attributes = getattr(value, "__dict__", None)
    out = []
    if isinstance(attributes, dict):
        out = [(f"{path}.{k}", v, value, k) for k, v in attributes.items()]
    for name in _slot_names(type(value)):
        if hasattr(value, name):
            out.append((f"{path}.{name}", getattr(value, name), value, name))
    return out
