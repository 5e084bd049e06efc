"""Worker processes of ``ll.DataLoader`` (``worker_mode="process"``).

A worker is started by spawn or forkserver (fork only when forced), receives
the dataset through Process(args=...) as bytes pickled once in the main
process (or pickled by Process.start() when it holds multiprocessing
objects; the object itself under fork), lets them go once unpickled, and
then answers tasks from its own pipe:

    ("fetch", epoch, task, index, slot)  ->  ("batch", epoch, task, payload)
                                             ("stop", epoch, task)   # iterable exhausted
                                             ("error", epoch, task, error info)
    ("offer", epoch, task, slot)             # a slot for a task sent without one
    ("close", fd)                            # the main process attached our segment
    ("forget", pool_id)                      # the main process no longer reuses a slot
    ("config", options)                      # once, first: {"shm_dir": ...}
    ("resume", epoch, shared_seed)           # persistent workers: a new epoch
    None                                     # shut down

Batch memory (planned like ll.Loader's slots, see process_iter.py): the
collated batch's tensors / arrays go into shared memory and only a template
(offsets, dtypes, shapes) goes through the pipe. ``slot`` names a batch
segment the main process keeps for reuse (or is None); before writing, the
worker reads the offers that arrived meanwhile. With a slot that fits, it
copies the batch there (``payload[0] == "slot"``); otherwise it creates a
segment of its own sized to the batch, writes it and sends its reference
(``payload[0] == "segment"``); the main process attaches and adopts it, then
sends "close" so that the worker drops its descriptor. So the first batches
never wait for a pool and never travel pickled. Only batches with no numeric
array at all go through the pipe pickled (``payload[0] == "pickle"``); other
leaves (strings, Python objects of a custom collate's output) stay in the
template and are pickled with it.

Large arrays of the dataset arrive as references to shared segments of the
main process (see ``rebuild_array`` / ``rebuild_tensor``), attached through
``/proc/<main pid>/fd/<fd>``: one copy for all workers.
"""

from __future__ import annotations

import atexit
import collections
import copy
import functools
import os
import pickle
import random
import signal
import sys
import time
import traceback
from collections.abc import Sequence
from typing import Any

from leanloader import _core

ALIGNMENT = 64
# Batch segments are whole pages.
PAGE = 4096
# A task's slot when the main process's pool is full: before making a segment
# of its own, the worker waits up to WAIT_FOR_SLOT_S for the main process to
# offer one that the consumer dropped (as ll.Loader's workers wait 100 ms).
WAIT_FOR_SLOT = "wait"
WAIT_FOR_SLOT_S = 0.1
# What ps and top show for a worker (torch's are "pt_data_worker").
WORKER_NAME = "ll_data_worker"
# Exit status of a spawned process that was asked to start workers while it
# re-imported an unguarded main script (see front._refuse_unguarded_main).
UNGUARDED_EXIT = 76

# numpy dtype.str -> safetensors name, for arrays that slots and shared
# segments can hold.
NUMPY_TO_NAME = {
    "|b1": "BOOL", "|u1": "U8", "|i1": "I8", "<u2": "U16", "<i2": "I16", "<u4": "U32",
    "<i4": "I32", "<u8": "U64", "<i8": "I64", "<f2": "F16", "<f4": "F32", "<f8": "F64",
    "<c8": "C64",
}  # fmt: skip


def torch_dtype_names() -> dict[Any, str]:
    import torch

    return {
        torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.uint16: "U16",
        torch.int16: "I16", torch.uint32: "U32", torch.int32: "I32", torch.uint64: "U64",
        torch.int64: "I64", torch.float16: "F16", torch.bfloat16: "BF16",
        torch.float32: "F32", torch.float64: "F64", torch.complex64: "C64",
    }  # fmt: skip


# --- shared segments ------------------------------------------------------------------

# (owner pid, fd, inode, file offset, mode) -> SharedSegment mapped in this process.
_SEGMENTS: dict[tuple[int, int, int, int, str], Any] = {}
atexit.register(_SEGMENTS.clear)  # released while the extension module is intact


def segment_reference(segment: Any) -> tuple[int, int, int]:
    """How another process finds `segment` (created in this process and the
    whole of its file: a batch pool, a worker's batch)."""
    return (os.getpid(), int(segment.fd), os.fstat(segment.fd).st_ino)


def range_reference(segment: Any) -> tuple[int, int, int, int, int]:
    """How another process finds `segment`, a range of an arena's file (a
    shared copy of a dataset's array) created in this process:
    attach_segment's first five arguments."""
    return (*segment_reference(segment), int(segment.file_offset), int(segment.size))


def attach_segment(
    owner: int, fd: int, inode: int, file_offset: int = 0, size: int = 0, mode: str = "shared"
) -> Any:
    """Maps `size` bytes from `file_offset` of the file behind descriptor `fd`
    of process `owner` (size 0: the whole file), once per process and `mode`:
    "shared" (read-write, writes reach every process), "read" (read-only) or
    "private" (copy-on-write: writes stay in this process). Ranges of one
    file share one descriptor here."""
    key = (owner, fd, inode, file_offset, mode)
    segment = _SEGMENTS.get(key)
    if segment is not None:
        return segment
    path = f"/proc/{owner}/fd/{fd}"
    try:
        segment = _core.SharedSegment.attach(
            path, mode != "read", mode == "private", file_offset, size
        )
    except FileNotFoundError:
        why = (
            "closed it (the object that shared it was dropped)"
            if os.path.exists(f"/proc/{owner}")
            else "has exited"
        )
        raise RuntimeError(
            f"shared memory segment {path} is gone: the process that created it (pid {owner}) "
            f"{why}; leanloader shared data can only be unpickled while its owner holds it"
        ) from None
    if os.fstat(segment.fd).st_ino != inode:
        raise RuntimeError(
            f"{path} is not the shared memory segment that was pickled (process {owner} "
            "reused the descriptor); leanloader shared data can only be unpickled while its "
            "owner lives"
        )
    _SEGMENTS[key] = segment
    return segment


def rebuild_array(
    reference: tuple[int, int, int, int, int],
    offset: int,
    dtype: str,
    shape: tuple,
    copy: bool = False,
) -> Any:
    """A NumPy array in a shared segment of the main process, mapped
    copy-on-write: like the pickled copy torch gives each worker, writes stay
    in the worker, but only the pages written are copied. In the owner
    process an array moved into the segment (not a `copy` of one) is the
    segment itself."""
    import numpy as np

    mode = "shared" if reference[0] == os.getpid() and not copy else "private"
    segment = attach_segment(*reference, mode=mode)
    array = segment.array(offset, NUMPY_TO_NAME[dtype], list(shape), "numpy")
    return array.view(np.dtype(dtype))


def rebuild_tensor(
    reference: tuple[int, int, int, int, int],
    offset: int,
    storage_bytes: int,
    dtype: str,
    storage_offset: int,
    size: tuple,
    stride: tuple,
    requires_grad: bool,
    parameter: bool,
    copy: bool = False,
) -> Any:
    """A CPU tensor whose storage is a shared segment of the main process:
    a tensor moved there (share_in_place) is shared like torch's own worker
    tensors (writes are visible to all); a `copy` of the user's tensor is
    mapped copy-on-write, as a copy behaves (the user's tensor may share the
    copy's pages: see sharing.py)."""

    segment = attach_segment(*reference, mode="private" if copy else "shared")
    raw = segment.array(offset, "U8", [storage_bytes], "torch")
    return _tensor_over(raw, dtype, storage_offset, size, stride, requires_grad, parameter)


def _tensor_over(
    raw: Any, dtype: str, storage_offset: int, size: tuple, stride: tuple,
    requires_grad: bool, parameter: bool,
) -> Any:  # fmt: skip
    """A tensor of `dtype` viewing the bytes of `raw` (a uint8 tensor) as
    its storage."""
    import torch

    torch_dtype = getattr(torch, dtype)
    tensor = torch.empty(0, dtype=torch_dtype).set_(
        raw.untyped_storage(), storage_offset, size, stride
    )
    if parameter:
        return torch.nn.Parameter(tensor, requires_grad=requires_grad)
    if requires_grad:
        tensor.requires_grad_(True)
    return tensor


def _map_file_range(backing: tuple, extent: int) -> Any:
    """The `extent` bytes of a file range another process had mapped, as a
    uint8 np.memmap: shared (writes reach the file) when the original
    mapping was, else copy-on-write (writes stay here), as a forked worker
    would have them. The file must be the one that was mapped."""
    import numpy as np

    path, offset, device, inode, shared = backing
    try:
        st = os.stat(path)
    except OSError as error:
        raise RuntimeError(f"cannot map '{path}' as the main process had it: {error}") from None
    if (st.st_dev, st.st_ino) != (device, inode):
        raise RuntimeError(
            f"'{path}' is another file than the one the main process mapped (replaced since); "
            "its bytes as the main process sees them are gone"
        )
    return np.memmap(path, dtype=np.uint8, mode="r+" if shared else "c", offset=offset,
                     shape=(extent,))  # fmt: skip


def rebuild_file_array(
    backing: tuple, extent: int, start: int, dtype: str, shape: tuple, strides: tuple,
    memmap: bool, writeable: bool,
) -> Any:  # fmt: skip
    """An array over a file range that the main process had mapped (a memmap
    or any view of one): the worker maps the same range, nothing is copied.
    `start` is the first element's offset in the range."""
    import numpy as np

    base = _map_file_range(backing, extent)
    cls = np.memmap if memmap else np.ndarray
    array = np.ndarray.__new__(cls, shape, np.dtype(dtype), buffer=base, offset=start,
                               strides=strides)  # fmt: skip
    if memmap:
        array._mmap, array.filename, array.mode = base._mmap, base.filename, base.mode
        array.offset = backing[1] + start
    if not writeable:
        array.flags.writeable = False
    return array


def rebuild_file_tensor(
    backing: tuple, storage_bytes: int, dtype: str, storage_offset: int, size: tuple,
    stride: tuple, requires_grad: bool, parameter: bool,
) -> Any:  # fmt: skip
    """A CPU tensor whose storage is a file range the main process had
    mapped (torch.load(mmap=True), safetensors): mapped here, not copied."""
    import warnings

    import torch

    base = _map_file_range(backing, storage_bytes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # (a read-only mapping: "not writable")
        raw = torch.from_numpy(base)
    return _tensor_over(raw, dtype, storage_offset, size, stride, requires_grad, parameter)


# --- batches through slots -------------------------------------------------------------


class SlotLeaf:
    """A tensor or array of a batch, as (offset in slot, dtype, shape, kind)."""

    __slots__ = ("dtype", "kind", "offset", "shape")

    def __init__(self, offset: int, dtype: str, shape: tuple, kind: str) -> None:
        self.offset, self.dtype, self.shape, self.kind = offset, dtype, shape, kind

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (SlotLeaf, (self.offset, self.dtype, self.shape, self.kind))


def _map_structure(batch: Any, leaf: Any) -> Any:
    """Rebuilds dicts, lists, tuples and namedtuples with leaf(x) for the rest."""
    if isinstance(batch, dict):
        items = {key: _map_structure(value, leaf) for key, value in batch.items()}
        if type(batch) is dict:
            return items
        # A subclass keeps its type and state (defaultdict's factory, the
        # instance's attributes), as torch's pickled batch does: a copy made
        # through its own __reduce_ex__, with the values replaced.
        try:
            rebuilt = copy.copy(batch)
            for key, value in items.items():
                rebuilt[key] = value
            return rebuilt
        except Exception:
            pass
        try:
            return type(batch)(items)
        except TypeError:
            return items
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(_map_structure(value, leaf) for value in batch))
    if type(batch) in (list, tuple):
        return type(batch)(_map_structure(value, leaf) for value in batch)
    return leaf(batch)


def slot_array(value: Any, torch_names: dict | None) -> tuple[str, str, Any] | None:
    """(kind, dtype name, contiguous array) when a batch slot can hold `value`:
    a strided CPU tensor of a dtype in `torch_names`, or a NumPy array of a
    dtype in NUMPY_TO_NAME. None for anything else (it stays in the template)."""
    if torch_names is not None:
        import torch

        if (
            isinstance(value, torch.Tensor)
            and value.device.type == "cpu"
            and value.layout == torch.strided
            and not value.is_nested
        ):
            name = torch_names.get(value.dtype)
            if name is not None and not value.is_quantized:
                return "torch", name, value.detach().resolve_conj().resolve_neg().contiguous()
    import numpy as np

    if type(value) is np.ndarray and value.dtype.str in NUMPY_TO_NAME:
        return "numpy", NUMPY_TO_NAME[value.dtype.str], np.ascontiguousarray(value)
    return None


def _nbytes(array: Any) -> int:
    return int(array.element_size() * array.numel() if hasattr(array, "numel") else array.nbytes)


class _SlotLayout:
    """Aligned places in a batch slot and the (offset, array) copies to make."""

    def __init__(self) -> None:
        self.copies: list[tuple[int, Any]] = []
        self.used = 0

    def place(self, nbytes: int) -> int:
        offset = self.used
        self.used = offset + (nbytes + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
        return offset

    def leaf(self, value: Any, torch_names: dict | None) -> Any:
        """A SlotLeaf for an array the slot can hold (and its copy), else `value`."""
        found = slot_array(value, torch_names)
        if found is None:
            return value
        kind, name, array = found
        nbytes = _nbytes(array)
        offset = self.place(nbytes)
        if nbytes:
            self.copies.append((offset, array))
        return SlotLeaf(offset, name, tuple(array.shape), kind)


def plan_batch(batch: Any, torch_names: dict | None) -> tuple[Any, list[tuple[int, Any]], int]:
    """Template of `batch` with SlotLeaf for every array the slot can hold,
    the (offset, contiguous array) copies to make, and the bytes needed."""
    layout = _SlotLayout()
    template = _map_structure(batch, lambda value: layout.leaf(value, torch_names))
    return template, layout.copies, layout.used


class UncollatedBatch:
    """The samples of a batch for torch's default collate, not yet stacked:
    plan_stacked writes each sample's arrays straight into their rows of the
    batch's shared segment, so the batch never exists twice in the worker (a
    private stacked copy, then the segment). torch's workers avoid that copy
    the same way: default_collate stacks into shared memory."""

    __slots__ = ("collate", "samples", "whole")

    def __init__(self, samples: list, collate: Any, whole: Any = None) -> None:
        self.samples, self.collate = samples, collate
        # what collates samples that are not stacked here: torch's collate as
        # its workers run it (stacking into the first sample's dtype, as
        # torch.stack(out=) does there)
        self.whole = whole or collate

    def collated(self) -> Any:
        return self.whole(self.samples)


def plan_stacked(
    batch: UncollatedBatch, torch_names: dict
) -> tuple[Any, list[tuple[int, Any]], int] | None:
    """plan_batch's (template, copies, bytes) for default_collate(samples),
    with one copy per sample and array (its row) instead of a stacked array:
    the rows StreamedFetch writes as samples come, planned here for samples
    fetched together (iterable datasets, ``__getitems__``). None when the
    samples do not stack that way (the caller collates them whole)."""
    samples = batch.samples
    if not samples:
        return None
    layout = _SlotLayout()
    try:
        skeleton = _plan_rows(samples[0], len(samples), layout, torch_names)
    except _NotStackable:
        return None
    copies: list[tuple[int, Any]] = []

    def put(offset: int, array: Any) -> None:
        copies.append((offset, array))

    for position, sample in enumerate(samples):
        if not _take_sample(sample, position, skeleton, torch_names, put):
            return None
    template = _row_template(skeleton, len(samples), batch.collate, put, torch_names)
    return template, copies, layout.used


class _NotStackable(Exception):
    pass


# A number leaf (int, float, bool, NumPy scalar) of a sample collates to a
# tensor of at most this many bytes per sample; its place is reserved so
# that the collated column lands in the batch's segment too.
NUMBER_BYTES = 8


class _ArrayColumn:
    """An array leaf of the samples: one row per sample in a B-row region."""

    __slots__ = ("kind", "name", "offset", "row", "shape")

    def __init__(self, kind: str, name: str, shape: tuple, row: int, offset: int) -> None:
        self.kind, self.name, self.shape, self.row, self.offset = kind, name, shape, row, offset


class _ValueColumn:
    """Any other leaf: its values are kept and collated at the end (a small
    batch of their own), into `capacity` reserved bytes
    when the collated column is an array that fits, else in the template."""

    __slots__ = ("capacity", "in_sequence", "offset", "values")

    def __init__(self, offset: int, capacity: int, in_sequence: bool) -> None:
        self.offset, self.capacity, self.values = offset, capacity, []
        # default_collate hands a sequence's columns over as tuples (zip),
        # a dict's and the samples themselves as lists
        self.in_sequence = in_sequence


def _plan_rows(
    sample: Any, batch_size: int, layout: _SlotLayout, torch_names: dict, in_sequence: bool = False
) -> Any:
    """The skeleton of `sample` (dicts, lists and tuples with columns at the
    leaves), each column placed for `batch_size` samples. Raises
    _NotStackable where the samples cannot be stacked into rows."""
    import numpy as np
    import torch

    found = slot_array(sample, torch_names)
    if found is not None:
        kind, name, array = found
        row = _nbytes(array)
        return _ArrayColumn(kind, name, tuple(array.shape), row, layout.place(row * batch_size))
    if type(sample) is dict:
        return (dict, tuple(sample), [_plan_rows(v, batch_size, layout, torch_names)
                                      for v in sample.values()])  # fmt: skip
    if type(sample) in (list, tuple):
        return (type(sample), len(sample), [_plan_rows(v, batch_size, layout, torch_names, True)
                                            for v in sample])  # fmt: skip
    if isinstance(sample, (torch.Tensor, np.ndarray, dict, list, tuple)):
        raise _NotStackable
    if isinstance(sample, (int, float, np.number, np.bool_)):
        capacity = NUMBER_BYTES * batch_size
        return _ValueColumn(layout.place(capacity), capacity, in_sequence)
    return _ValueColumn(0, 0, in_sequence)


def _match_rows(sample: Any, skeleton: Any, torch_names: dict, out: list) -> bool:
    """Appends (column, contiguous array or value) for each leaf of `sample`
    to `out`; False when `sample` does not have the skeleton's structure,
    dtypes and shapes (default_collate then decides, with every sample)."""
    if isinstance(skeleton, _ArrayColumn):
        found = slot_array(sample, torch_names)
        if found is None or found[0] != skeleton.kind or found[1] != skeleton.name:
            return False
        if tuple(found[2].shape) != skeleton.shape:
            return False
        out.append((skeleton, found[2]))
        return True
    if isinstance(skeleton, _ValueColumn):
        if isinstance(sample, (dict, list, tuple)) or slot_array(sample, torch_names) is not None:
            return False
        out.append((skeleton, sample))
        return True
    kind, keys, children = skeleton
    if type(sample) is not kind:
        return False
    if kind is dict:
        if tuple(sample) != keys:
            return False
        values: Any = sample.values()
    else:
        if len(sample) != keys:
            return False
        values = sample
    return all(
        _match_rows(value, child, torch_names, out)
        for value, child in zip(values, children, strict=True)
    )


def _take_sample(sample: Any, position: int, skeleton: Any, torch_names: dict, put: Any) -> bool:
    """Sample `position` of the batch into its rows: put(offset, array) for
    each array leaf, its values kept for the rest; False (nothing put) when it
    does not match the skeleton."""
    leaves: list = []
    if not _match_rows(sample, skeleton, torch_names, leaves):
        return False
    for column, value in leaves:
        if isinstance(column, _ArrayColumn):
            if column.row:
                put(column.offset + position * column.row, value)
        else:
            column.values.append(value)
    return True


def _rebuild_sample(skeleton: Any, index: int, segment: Any, base: int) -> Any:
    """Sample `index` as it was fetched, from its rows (copied out) and kept
    values: used when a later sample does not match and every sample goes to
    the collate as torch gives them."""
    import numpy as np
    import torch

    if isinstance(skeleton, _ArrayColumn):
        view = segment.array(base + skeleton.offset + index * skeleton.row, skeleton.name,
                             list(skeleton.shape), skeleton.kind)  # fmt: skip
        return view.clone() if isinstance(view, torch.Tensor) else np.array(view)
    if isinstance(skeleton, _ValueColumn):
        return skeleton.values[index]
    kind, keys, children = skeleton
    rebuilt = [_rebuild_sample(child, index, segment, base) for child in children]
    if kind is dict:
        return dict(zip(keys, rebuilt, strict=True))
    return kind(rebuilt)


def _row_template(skeleton: Any, batch_size: int, collate: Any, write: Any, torch_names: dict):
    """The batch's template: SlotLeaf for every column in the segment."""
    if isinstance(skeleton, _ArrayColumn):
        return SlotLeaf(skeleton.offset, skeleton.name, (batch_size, *skeleton.shape), "torch")
    if isinstance(skeleton, _ValueColumn):
        values = skeleton.values
        collated = collate(tuple(values) if skeleton.in_sequence else values)
        found = slot_array(collated, torch_names)
        if found is None or _nbytes(found[2]) > skeleton.capacity:
            return collated  # strings, objects...: they travel in the template
        kind, name, array = found
        if _nbytes(array):
            write(skeleton.offset, array)
        return SlotLeaf(skeleton.offset, name, tuple(array.shape), kind)
    kind, keys, children = skeleton
    items = [_row_template(child, batch_size, collate, write, torch_names) for child in children]
    # as default_collate: dicts stay dicts, sequences become lists
    return dict(zip(keys, items, strict=True)) if kind is dict else items


class StreamedFetch:
    """A map-style dataset's batch for torch's default collate, fetched one
    sample at a time straight into its rows of the batch's segment: the
    worker holds the segment and one sample, never the batch's samples and
    the batch (torch's fetcher keeps every sample until the collate, whose
    stacked copy coexists with them). The dataset sees the same calls in the
    same order as torch's _MapDatasetFetcher; when a sample does not match
    the first one's structure, dtypes or shapes, the samples so far are
    rebuilt from their rows and default_collate gets them all, as in torch
    (its result or its error)."""

    def __init__(self, dataset: Any, collate: Any, whole: Any, torch_names: dict) -> None:
        self.dataset, self.collate, self.torch_names = dataset, collate, torch_names
        self.whole = whole

    def fetch(self, indices: Sequence[int], destination: Any) -> tuple | UncollatedBatch:
        """The payload of the batch of `indices`, or the UncollatedBatch of
        its samples when they do not stream. `destination(needed)` gives the
        (segment, base offset, finish) to write to; finish(template) makes
        the payload, discard() gives up the destination."""
        dataset = self.dataset
        sample = dataset[indices[0]]
        batch_size = len(indices)
        layout = _SlotLayout()
        try:
            skeleton = _plan_rows(sample, batch_size, layout, self.torch_names)
        except _NotStackable:
            skeleton = None
        if skeleton is None or layout.used == 0:
            samples = [sample, *(dataset[i] for i in indices[1:])]
            return UncollatedBatch(samples, self.collate, self.whole)
        target = destination(layout.used)
        segment, base = target.segment, target.base

        def put(offset: int, array: Any) -> None:
            segment.write(base + offset, array)

        position = 0
        while True:
            if not _take_sample(sample, position, skeleton, self.torch_names, put):
                samples = [_rebuild_sample(skeleton, i, segment, base) for i in range(position)]
                target.discard()
                samples.append(sample)
                samples.extend(dataset[i] for i in indices[position + 1 :])
                return UncollatedBatch(samples, self.collate, self.whole)
            del sample
            position += 1
            if position == batch_size:
                break
            sample = dataset[indices[position]]
        template = _row_template(skeleton, batch_size, self.collate, put, self.torch_names)
        return target.finish(template)


def unpack_batch(template: Any, hold: Any) -> Any:
    """The batch of `template` with zero-copy tensors over the held slot."""

    def leaf(value: Any) -> Any:
        if isinstance(value, SlotLeaf):
            return hold.tensor(value.offset, value.dtype, list(value.shape), value.kind)
        return value

    return _map_structure(template, leaf)


# --- errors ------------------------------------------------------------------------------


_MACHINERY_DIR = os.path.dirname(os.path.abspath(__file__))


def _raised_by_leanloader(error: BaseException) -> bool:
    """True when the innermost frame of `error` is the DataLoader machinery's
    own code (a full shared-memory directory, a segment that cannot be made),
    not the dataset's or the collate function's (leanloader functions a
    dataset calls, such as ll.decode_image, count as the dataset's)."""
    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and os.path.abspath(frames[-1].filename).startswith(_MACHINERY_DIR + os.sep)


def describe_error(error: BaseException, where: str) -> dict[str, Any]:
    """What the main process needs to re-raise `error` as torch re-raises a
    worker's exception: its type, and its traceback text. `where` is torch's
    phrase ("in DataLoader worker process 0"). leanloader's own errors travel
    whole (type, errno, message), with the traceback as a note."""
    info: dict[str, Any] = {
        "module": type(error).__module__,
        "qualname": type(error).__qualname__,
        "message": str(error),
        "traceback": "".join(traceback.format_exception(error)),
        "where": where,
    }
    if _raised_by_leanloader(error):
        try:
            info["own"] = pickle.dumps(error)
        except Exception:
            pass
    return info


def rebuild_error(info: dict[str, Any]) -> BaseException:
    """The exception torch's ExceptionWrapper.reraise() raises for the
    worker's: the same type built from "Caught ValueError in DataLoader
    worker process 0.\nOriginal Traceback (most recent call last): ..."
    (KeyError's message kept readable, a type that cannot be built from one
    message becomes RuntimeError), made by torch's own code."""
    from torch._utils import ExceptionWrapper

    if info.get("own") is not None:
        try:
            error = pickle.loads(info["own"])
            error.add_note(f"Raised {info['where']}:\n{info['traceback']}")
            return error
        except Exception:
            pass
    try:
        module = sys.modules.get(info["module"]) or __import__(info["module"])
        cls: Any = module
        for part in info["qualname"].split("."):
            cls = getattr(cls, part)
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            raise TypeError(cls)
    except Exception:
        cls = RuntimeError
    wrapper = ExceptionWrapper.__new__(ExceptionWrapper)
    wrapper.exc_type = cls
    wrapper.exc_msg = info["traceback"]
    wrapper.where = info["where"]
    try:
        wrapper.reraise()
    except BaseException as error:  # the exception torch would raise
        error.__traceback__ = None
        return error
    return RuntimeError(f"Caught {info['qualname']} {info['where']}.\n{info['traceback']}")


# --- the worker ---------------------------------------------------------------------------


class WorkerSetup:
    """Everything a worker needs, pickled once by the main process."""

    def __init__(
        self, dataset: Any, dataset_kind: int, auto_collation: bool, collate_fn: Any,
        drop_last: bool, worker_init_fn: Any,
    ) -> None:  # fmt: skip
        self.dataset = dataset
        self.dataset_kind = dataset_kind
        self.auto_collation = auto_collation
        self.collate_fn = collate_fn
        self.drop_last = drop_last
        self.worker_init_fn = worker_init_fn
        # (world size, rank) for an IterDataPipe sharded across workers, else None
        self.sharding: tuple[int, int] | None = None
        # torch's process-wide settings as the main process has them when the
        # pass starts: a forked worker (torch's default) inherits them; a
        # worker from the fork server or spawn gets them here.
        import torch

        self.torch_state = {
            "default_dtype": torch.get_default_dtype(),
            "grad_enabled": torch.is_grad_enabled(),
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        }


def apply_torch_state(state: dict[str, Any] | None) -> None:
    """Sets a worker's torch settings to the main process's (WorkerSetup)."""
    if not state:
        return
    import torch

    torch.set_default_dtype(state["default_dtype"])
    torch.set_grad_enabled(state["grad_enabled"])
    wanted = (state["deterministic"], state["deterministic_warn_only"])
    if wanted != (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    ):
        # Only when it changes something: the call imports torch._inductor
        # (sympy and ~800 modules: 100 MiB of private memory and seconds of
        # start-up in every worker).
        torch.use_deterministic_algorithms(wanted[0], warn_only=wanted[1])


def identity(value: Any) -> Any:
    return value


def _seed(base_seed: int, worker_id: int) -> int:
    """Seeds random, numpy and torch exactly as torch's _worker_loop does."""
    seed = base_seed + worker_id
    random.seed(seed)
    import torch
    from torch.utils.data._utils.worker import _generate_state

    torch.manual_seed(seed)
    try:
        import numpy as np
    except ImportError:
        return seed
    np.random.seed(_generate_state(base_seed, worker_id))
    return seed


def _apply_shared_seed(dataset: Any, shared_seed: Any) -> Any:
    """torch's worker: an IterDataPipe's random parts seeded from the seed
    shared by all workers."""
    if shared_seed is None:
        return dataset
    import torch
    from torch.utils.data.graph_settings import apply_random_seed

    shared_rng = torch.Generator()
    shared_rng.manual_seed(shared_seed)
    return apply_random_seed(dataset, shared_rng)


def worker_main(
    worker_id: int,
    num_workers: int,
    holder: list,
    base_seed: int,
    shared_seed: Any,
    parent_pid: int,
    tasks: Any,
    results: Any,
    main_pid: int = 0,
) -> None:
    """Entry point of a worker process (the target of multiprocessing.Process)."""
    # Ctrl-C goes to the whole process group; the main process handles it and
    # shuts the workers down, so a worker must not die of it mid-write.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # (fork server: blocked)
    # As torch names its workers pt_data_worker: visible in ps and top.
    try:
        _core.set_process_name(WORKER_NAME)
    except OSError:
        pass
    if not _core.set_parent_death_signal(signal.SIGKILL, parent_pid):
        os._exit(0)  # the main process is already gone
    # A fork server's child outlives a killed main process while the server
    # lingers (it and its children hold each other's pipes): watch the main
    # process itself.
    if not _core.exit_with_process(main_pid):
        os._exit(0)
    where = f"in DataLoader worker process {worker_id}"  # torch's words
    import torch
    from torch.utils.data._utils import worker as torch_worker
    from torch.utils.data._utils.collate import default_collate, default_convert
    from torch.utils.data.dataloader import _DatasetKind

    torch.set_num_threads(1)
    torch_names = torch_dtype_names()
    init_error: dict[str, Any] | None = None
    fetcher = None
    streamed: StreamedFetch | None = None
    setup: WorkerSetup | None = None
    try:
        # The dataset as bytes (pickled once by the main process, or by
        # Process.start() for datasets holding multiprocessing objects) or,
        # with fork, the object itself. The bytes are let go once unpickled:
        # the holder list is what Process._args keeps for the worker's life.
        received = holder.pop()
        setup = pickle.loads(received) if isinstance(received, bytes) else received
        del received
        apply_torch_state(getattr(setup, "torch_state", None))
        seed = _seed(base_seed, worker_id)
        setup.dataset = _apply_shared_seed(setup.dataset, shared_seed)
        torch_worker._worker_info = torch_worker.WorkerInfo(
            id=worker_id, num_workers=num_workers, seed=seed, dataset=setup.dataset
        )
        collate = setup.collate_fn
        if collate is default_collate or collate is default_convert:
            # torch's default collate allocates torch shared memory when it
            # sees it is in a worker; here the batch goes into a slot instead.
            collate = _outside_worker_info(collate, torch_worker)
        if setup.collate_fn is default_collate:
            # Stacked straight into the batch's segment (see UncollatedBatch).
            collate = functools.partial(UncollatedBatch, collate=collate, whole=default_collate)
        if setup.sharding is not None:
            # torch's _sharding_worker_init_fn: ranks first, then workers
            from torch.utils.data.graph_settings import apply_sharding

            world_size, rank = setup.sharding
            apply_sharding(setup.dataset, num_workers * world_size, worker_id * world_size + rank)
        if setup.worker_init_fn is not None:
            setup.worker_init_fn(worker_id)

        def make_fetcher() -> Any:
            return _DatasetKind.create_fetcher(
                setup.dataset_kind, setup.dataset, setup.auto_collation, collate, setup.drop_last
            )

        fetcher = make_fetcher()
        if (
            setup.collate_fn is default_collate
            and setup.auto_collation
            and setup.dataset_kind == _DatasetKind.Map
            and not getattr(setup.dataset, "__getitems__", None)
        ):
            # torch's _MapDatasetFetcher, one sample at a time into the batch's rows
            streamed = StreamedFetch(
                setup.dataset, collate.keywords["collate"], default_collate, torch_names
            )
    except Exception as error:
        init_error = describe_error(error, where)

    slots = _BatchMemory()
    pending: collections.deque = collections.deque()
    while True:
        if pending:
            message = pending.popleft()
        else:
            try:
                message = tasks.recv()
            except (EOFError, OSError):
                break  # the main process closed the pipe or died
            if slots.control(message):
                continue
        if message is None:
            break
        if message[0] == "resume":
            if init_error is None:
                try:
                    setup.dataset = _apply_shared_seed(setup.dataset, message[2])
                    fetcher = make_fetcher()
                    if streamed is not None:
                        streamed.dataset = setup.dataset
                except Exception as error:
                    init_error = describe_error(error, where)
            continue
        _, epoch, task, index, slot = message
        # A shutdown queued behind this task: skip it and what follows, as
        # torch's workers skip their queue once the loader is done.
        slots.drain(tasks, pending)
        if any(queued is None for queued in pending):
            break
        if init_error is not None:
            results.send(("error", epoch, task, init_error))
            continue
        task_slot = _TaskSlot(slots, tasks, pending, epoch, task, slot)
        streaming = streamed is not None and type(index) in (list, tuple) and len(index) > 0
        try:
            if streaming:
                batch = streamed.fetch(index, task_slot.destination)
            else:
                batch = fetcher.fetch(index)
        except StopIteration as stop:
            # The end of an iterable dataset's stream; from a map-style
            # dataset it is a bug raised by __getitem__, an error as in torch.
            if setup.dataset_kind == _DatasetKind.Iterable:
                results.send(("stop", epoch, task))
            else:
                results.send(("error", epoch, task, describe_error(stop, where)))
            continue
        except Exception as error:
            results.send(("error", epoch, task, describe_error(error, where)))
            continue
        try:
            if streaming and not isinstance(batch, UncollatedBatch):
                payload = batch  # streamed into its segment: the payload already
            else:
                payload = slots.payload(batch, task_slot.resolve(), torch_names)
            del batch
        except Exception as error:
            results.send(("error", epoch, task, describe_error(error, where)))
            continue
        results.send(("batch", epoch, task, payload))
    # Leave without interpreter finalization: nothing of the worker's state
    # needs tearing down (the main process owns every shared segment), and the
    # dataset's destructors must not run with half-finalized modules.
    # multiprocessing's exit handlers run first, as at a normal exit: a Queue
    # the dataset put items in flushes them from its feeder thread.
    try:
        import multiprocessing.util

        multiprocessing.util._exit_function()
    except Exception:
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _outside_worker_info(collate: Any, torch_worker: Any) -> Any:
    def collate_here(batch: Any) -> Any:
        info = torch_worker._worker_info
        torch_worker._worker_info = None
        try:
            return collate(batch)
        finally:
            torch_worker._worker_info = info

    return collate_here


class _BatchMemory:
    """A worker's side of the batch memory: offers of the main process's
    segments, segments of the main process mapped here (by pool id), and
    segments this worker created until the main process has attached them."""

    def __init__(self) -> None:
        self.shm_dir: str | None = None
        self.offers: dict[tuple[int, int], tuple] = {}
        self.attached: dict[int, Any] = {}
        self.created: dict[int, Any] = {}
        self.last_task = (-1, -1)

    def control(self, message: Any) -> bool:
        """Handles a control message; False for fetch / resume / None."""
        if message is None:
            return False
        kind = message[0]
        if kind == "offer":
            if (message[1], message[2]) > self.last_task:
                self.offers[(message[1], message[2])] = message[3]
        elif kind == "close":
            self.created.pop(message[1], None)
        elif kind == "forget":
            self.attached.pop(message[1], None)
        elif kind == "config":
            self.shm_dir = message[1].get("shm_dir")
        else:
            return False
        return True

    def drain(self, tasks: Any, pending: collections.deque) -> None:
        """Reads what the main process sent so far without waiting."""
        try:
            while tasks.poll():
                message = tasks.recv()
                if not self.control(message):
                    pending.append(message)
        except (EOFError, OSError):
            pass  # the next recv reports it

    def wait_for_offer(self, tasks: Any, pending: collections.deque, epoch: int, task: int) -> Any:
        """The offer for (epoch, task) if one comes within WAIT_FOR_SLOT_S."""
        deadline = time.monotonic() + WAIT_FOR_SLOT_S
        while (epoch, task) not in self.offers:
            left = deadline - time.monotonic()
            try:
                if left <= 0 or not tasks.poll(left):
                    break
                message = tasks.recv()
            except (EOFError, OSError):
                break
            if not self.control(message):
                pending.append(message)
        return None

    def slot_for(self, epoch: int, task: int, slot: Any) -> Any:
        self.last_task = (epoch, task)
        offered = self.offers.pop((epoch, task), None)
        for key in [key for key in self.offers if key < self.last_task]:
            del self.offers[key]
        return slot if slot is not None else offered

    def payload(self, batch: Any, slot: Any, torch_names: dict) -> tuple:
        planned = None
        if isinstance(batch, UncollatedBatch):
            planned = plan_stacked(batch, torch_names)
            if planned is None or planned[2] == 0:
                batch, planned = batch.collated(), None
        template, copies, needed = planned or plan_batch(batch, torch_names)
        if needed == 0:
            return ("pickle", pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL), 0)
        target = self.destination(slot, needed)
        for offset, array in copies:
            target.segment.write(target.base + offset, array)
        return target.finish(template)

    def destination(self, slot: Any, needed: int) -> _Destination:
        """Where a batch of `needed` bytes goes: the offered slot when it fits,
        else a new segment of this worker's, sized to the batch."""
        if slot is not None and needed <= slot[3]:
            pool_id, (owner, fd, inode), slot_id, _slot_bytes, slot_offset = slot
            segment = self.attached.get(pool_id)
            if segment is None:
                segment = _core.SharedSegment.attach(f"/proc/{owner}/fd/{fd}")
                if os.fstat(segment.fd).st_ino != inode:
                    raise RuntimeError(f"batch slot /proc/{owner}/fd/{fd} was replaced")
                self.attached[pool_id] = segment
            return _Destination(self, segment, slot_offset, ("slot", pool_id, slot_id))
        size = (needed + PAGE - 1) // PAGE * PAGE
        return _Destination(self, _core.SharedSegment.create(size, self.shm_dir), 0, None)


class _TaskSlot:
    """A task's slot, resolved once, when the batch is about to be written:
    offers that came meanwhile, or a wait for one (WAIT_FOR_SLOT)."""

    def __init__(
        self, memory: _BatchMemory, tasks: Any, pending: Any, epoch: int, task: int, slot: Any
    ) -> None:
        self.memory, self.tasks, self.pending = memory, tasks, pending
        self.epoch, self.task, self.slot = epoch, task, slot
        self.resolved = False

    def resolve(self) -> Any:
        if not self.resolved:
            memory = self.memory
            memory.drain(self.tasks, self.pending)
            if self.slot == WAIT_FOR_SLOT:
                self.slot = memory.wait_for_offer(self.tasks, self.pending, self.epoch, self.task)
            self.slot = memory.slot_for(self.epoch, self.task, self.slot)
            self.resolved = True
        return self.slot

    def destination(self, needed: int) -> _Destination:
        return self.memory.destination(self.resolve(), needed)


class _Destination:
    """A batch's place: `base` in `segment`, a slot the main process offered
    (`slot` = ("slot", pool id, slot id)) or a segment of this worker's."""

    __slots__ = ("base", "memory", "segment", "slot")

    def __init__(self, memory: _BatchMemory, segment: Any, base: int, slot: tuple | None) -> None:
        self.memory, self.segment, self.base, self.slot = memory, segment, base, slot

    def finish(self, template: Any) -> tuple:
        """The payload that tells the main process where the batch is."""
        if self.slot is not None:
            return (*self.slot, template)
        self.memory.created[int(self.segment.fd)] = self.segment
        return ("segment", segment_reference(self.segment), self.segment.size, template)

    def discard(self) -> None:
        """Gives up the place (the batch is written again elsewhere); a
        segment of this worker's is freed."""
        self.segment = None
