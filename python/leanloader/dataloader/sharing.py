"""Sharing a dataset once: large arrays and CPU tensors copied into shared
segments (or, opted in, moved there in place), and a pickler that sends
references to those segments instead of their bytes.

The dataset object the user passed is left as it was: the pickler sends a
reference to a shared *copy* of each large array or tensor, made the first
time it is pickled and reused for the loader's lifetime (so writes the main
process makes to that array later are not seen by workers started after
them; torch would pickle them again). Where the array's memory is a whole
block that glibc's malloc mapped on its own (NumPy's and torch's large
arrays), the array's pages are then mapped from the copy, copy-on-write
(``_core.shared_copy``, src/workers/shared_copy.cc): the same bytes at the
same addresses, and one copy in all instead of two. ``share_in_place=True``
instead moves the arrays (attributes replaced by equal arrays backed by
shared memory) and tensors (their storage moved, as
``Tensor.share_memory_()``) of the dataset itself: its later writes are
seen. Tensors already in torch's shared memory are sent as that memory."""

from __future__ import annotations

import copyreg
import io
import os
import pickle
import sys
import weakref
from typing import Any

from leanloader import _core
from leanloader.dataloader.worker import (
    NUMPY_TO_NAME,
    identity,
    rebuild_array,
    rebuild_memmap,
    rebuild_tensor,
    segment_reference,
    torch_dtype_names,
)

# --- sharing the dataset once -------------------------------------------------------------

# LEANLOADER_SHARE_PAGES=0: shared copies never take the dataset's pages (two
# copies of each large array, the user's and the workers').
SHARE_PAGES = os.environ.get("LEANLOADER_SHARE_PAGES", "1") != "0"


class DatasetSharing:
    """Moves large arrays of a dataset into shared memory and pickles it with
    references to those segments. Holds every segment it created (and so the
    descriptors that workers attach through) for the loader's lifetime."""

    def __init__(self, threshold: int, shm_dir: str | None) -> None:
        self.threshold = threshold
        self.shm_dir = shm_dir
        self.segments: list[Any] = []
        self.moved_tensors: dict[int, Any] = {}  # old storage address -> shared storage
        self.in_place = False
        # id(array) -> (weak reference to it, its shared copy)
        self.array_copies: dict[int, tuple[Any, Any]] = {}
        # (storage address, bytes) -> (weak reference to the storage's tensor, shared storage)
        self.storage_copies: dict[tuple[int, int], Any] = {}
        # Bytes of the user's arrays and tensors now mapped from their shared
        # copies (the rest of each copy is a second copy of its bytes).
        self.shared_page_bytes = 0
        self.torch = sys.modules.get("torch")

    def share_in_place(self, dataset: Any) -> int:
        """Replaces large NumPy arrays held in attributes, dicts and lists by
        equal arrays in shared memory. Returns the bytes moved."""
        import numpy as np

        from leanloader.audit import walk

        self.in_place = True
        moved = 0
        replacements = []
        for _path, value, container, key in walk(dataset):
            if container is None or isinstance(container, tuple):
                continue
            if self._should_move_array(value, np):
                replacements.append((container, key, value))
        for container, key, value in replacements:
            shared = self._to_segment(value, np)
            if isinstance(container, (dict, list)):
                container[key] = shared
            else:
                try:
                    setattr(container, key, shared)
                except (AttributeError, TypeError):
                    continue  # read-only attribute: the pickler copies it instead
            moved += int(value.nbytes)
        return moved

    def _should_move_array(self, value: Any, np: Any) -> bool:
        return (
            type(value) is np.ndarray
            and value.nbytes >= self.threshold
            and value.dtype.str in NUMPY_TO_NAME
            and _owns_its_bytes(value, np)
            and _core.find_shared_segment(value.__array_interface__["data"][0]) is None
        )

    def _to_segment(self, array: Any, np: Any) -> Any:
        segment = _core.SharedSegment.create(max(1, int(array.nbytes)), self.shm_dir)
        self.segments.append(segment)
        segment.write(0, np.ascontiguousarray(array))
        shared = segment.array(0, NUMPY_TO_NAME[array.dtype.str], list(array.shape), "numpy")
        return shared.view(array.dtype)

    def dumps(self, obj: Any, forking: bool = False) -> bytes:
        """`obj` pickled with references to shared segments. With `forking`
        (inside Process.start()), multiprocessing's own reducers apply too:
        Value, Lock, Event, Queue... are sent as the start method sends them."""
        buffer = io.BytesIO()
        SharingPickler(buffer, self, forking).dump(obj)
        return buffer.getvalue()

    def _copy_sharing_pages(self, address: int, nbytes: int) -> tuple[Any, int]:
        """A shared copy of the block at `address` (the pointer its allocator
        returned) whose pages the block then shares where that is safe:
        (segment, offset of the copy in it)."""
        segment, offset, shared = _core.shared_copy(address, nbytes, self.shm_dir, SHARE_PAGES)
        self.segments.append(segment)
        self.shared_page_bytes += shared
        return segment, offset

    def _shared_copy(self, array: Any, np: Any) -> Any:
        """The shared copy of `array`, made once per array object."""
        kept = self.array_copies.get(id(array))
        if kept is not None and kept[0]() is array:
            return kept[1]
        if array.nbytes and array.flags.c_contiguous and _allocated_by_numpy(array, np):
            segment, offset = self._copy_sharing_pages(
                array.__array_interface__["data"][0], int(array.nbytes)
            )
            name = NUMPY_TO_NAME[array.dtype.str]
            shared = segment.array(offset, name, list(array.shape), "numpy").view(array.dtype)
        else:
            shared = self._to_segment(array, np)
        try:
            self.array_copies[id(array)] = (weakref.ref(array), shared)
        except TypeError:
            pass  # an array type without weak references: copied each time
        return shared

    def reduce_array(self, array: Any) -> Any:
        import mmap

        import numpy as np

        if isinstance(array, np.memmap) and isinstance(array.base, mmap.mmap) and array.filename:
            mode = "r" if array.mode in ("r", "c") else "r+"
            order = "F" if array.flags.f_contiguous and not array.flags.c_contiguous else "C"
            return (
                rebuild_memmap,
                (array.filename, array.dtype.str, mode, int(array.offset), array.shape, order),
            )
        if array.dtype.str not in NUMPY_TO_NAME or array.nbytes < self.threshold:
            return NotImplemented
        address = array.__array_interface__["data"][0]
        segment = _core.find_shared_segment(address)
        copy = segment is None or not array.flags.c_contiguous
        if copy:
            shared = self._shared_copy(array, np)  # one copy for all workers
            address = shared.__array_interface__["data"][0]
            segment = _core.find_shared_segment(address)
        offset = address - segment.address
        return (
            rebuild_array,
            (segment_reference(segment), offset, array.dtype.str, array.shape, copy),
        )

    def reduce_tensor(self, tensor: Any) -> Any:
        torch = self.torch
        if tensor.device.type != "cpu" or tensor.layout != torch.strided or tensor.is_quantized:
            return NotImplemented  # (sparse, nested and quantized tensors pickle as torch does)
        if tensor.is_nested or type(tensor) not in (torch.Tensor, torch.nn.Parameter):
            return NotImplemented
        if tensor.grad_fn is not None or tensor.dtype not in torch_dtype_names():
            return NotImplemented
        storage = tensor.untyped_storage()
        segment = _core.find_shared_segment(storage.data_ptr())
        if segment is None and storage.is_shared():
            # Already in torch's shared memory (share_memory_(), a cache the
            # workers fill): its workers write into it, and so do ours.
            reference = _torch_shared_memory(storage)
            if reference is not None:
                return _tensor_reduction(tensor, reference, 0, storage.nbytes(), copy=False)
        if storage.nbytes() < self.threshold:
            return NotImplemented
        copy = segment is None and not self.in_place
        if segment is None:
            storage = self._move_tensor(tensor) if self.in_place else self._copy_storage(tensor)
            segment = _core.find_shared_segment(storage.data_ptr())
        offset = storage.data_ptr() - segment.address
        return _tensor_reduction(
            tensor, segment_reference(segment), offset, storage.nbytes(), copy=copy
        )

    def _copy_storage(self, tensor: Any) -> Any:
        """A shared copy of the tensor's storage, made once per storage while
        that storage lives; the tensor itself is left as it was."""
        torch = self.torch
        old = tensor.untyped_storage()
        key = (old.data_ptr(), old.nbytes())
        kept = self.storage_copies.get(key)
        if kept is not None and kept[0]() is not None:
            return kept[1]
        if old.nbytes() and old.resizable() and not _pinned(old):
            # made by torch's CPU allocator: the pointer it returned
            segment, offset = self._copy_sharing_pages(old.data_ptr(), old.nbytes())
            raw = segment.array(offset, "U8", [old.nbytes()], "torch")
        else:
            segment = _core.SharedSegment.create(max(1, old.nbytes()), self.shm_dir)
            self.segments.append(segment)
            raw = segment.array(0, "U8", [old.nbytes()], "torch")
            raw.copy_(torch.empty(0, dtype=torch.uint8).set_(old))
        shared_storage = raw.untyped_storage()
        # the copy stays valid while the original storage is alive (a tensor
        # viewing it); a new storage at the same address gets a new copy
        self.storage_copies[key] = (weakref.ref(tensor), shared_storage)
        return shared_storage

    def _move_tensor(self, tensor: Any) -> Any:
        """Moves the tensor's storage into a segment in place (as
        Tensor.share_memory_() does): the tensor object, its values and its
        views in the main process stay as they were."""
        torch = self.torch
        old = tensor.untyped_storage()
        shared_storage = self.moved_tensors.get(old.data_ptr())
        if shared_storage is None:
            segment = _core.SharedSegment.create(max(1, old.nbytes()), self.shm_dir)
            self.segments.append(segment)
            raw = segment.array(0, "U8", [old.nbytes()], "torch")
            raw.copy_(torch.empty(0, dtype=torch.uint8).set_(old))
            shared_storage = raw.untyped_storage()
            self.moved_tensors[old.data_ptr()] = shared_storage
        with torch.no_grad():
            moved = torch.empty(0, dtype=tensor.dtype).set_(
                shared_storage, tensor.storage_offset(), tensor.shape, tensor.stride()
            )
            tensor.data = moved
        return shared_storage


def _tensor_reduction(
    tensor: Any, reference: tuple[int, int, int], offset: int, storage_bytes: int, copy: bool
) -> tuple[Any, tuple[Any, ...]]:
    import torch

    dtype = str(tensor.dtype).removeprefix("torch.")
    parameter = isinstance(tensor, torch.nn.Parameter)
    return (
        rebuild_tensor,
        (reference, offset, storage_bytes, dtype, tensor.storage_offset(), tuple(tensor.shape),
         tuple(tensor.stride()), bool(tensor.requires_grad), parameter, copy),
    )  # fmt: skip


def _torch_shared_memory(storage: Any) -> tuple[int, int, int] | None:
    """How a worker maps the shared-memory file a torch storage lives in (a
    segment reference: this pid, a descriptor of the file, its inode), when
    this process holds a descriptor of it (torch's file_descriptor strategy
    keeps one) and the storage starts the file's mapping; else None."""
    fd = _core.shared_mapping_descriptor(storage.data_ptr(), storage.nbytes())
    return None if fd < 0 else (os.getpid(), fd, os.fstat(fd).st_ino)


def _allocated_by_numpy(array: Any, np: Any) -> bool:
    """True when `array` starts at the pointer NumPy's default allocator
    (malloc) returned: it owns its data, or is a view from the start of the
    array that does (``np.arange(n).reshape(...)``), and no handler replaced
    malloc."""
    owner = array
    while isinstance(owner.base, np.ndarray):
        owner = owner.base
    if type(owner) is not np.ndarray or not owner.flags.owndata:
        return False
    if owner.__array_interface__["data"][0] != array.__array_interface__["data"][0]:
        return False
    multiarray = getattr(np, "_core", None) or np.core
    get_handler_name = getattr(multiarray.multiarray, "get_handler_name", None)
    return get_handler_name is not None and get_handler_name(owner) == "default_allocator"


def _pinned(storage: Any) -> bool:
    try:
        return bool(storage.is_pinned())
    except RuntimeError:  # no accelerator to ask
        return False


def _owns_its_bytes(array: Any, np: Any) -> bool:
    """True when no other array sees `array`'s bytes except through a
    same-sized view (``np.arange(n).reshape(...)``): replacing it then
    breaks no aliasing the user relies on."""
    base = array.base
    while isinstance(base, np.ndarray):
        if base.nbytes != array.nbytes or isinstance(base, np.memmap):
            return False
        base = base.base
    return base is None


class PickledAtStart:
    """A worker's setup for datasets that only Process.start() can pickle
    (they hold multiprocessing objects): pickled, with references to shared
    segments, while the start method sends the Process, and received by the
    worker as bytes."""

    def __init__(self, setup: Any, sharing: DatasetSharing) -> None:
        self.setup, self.sharing = setup, sharing

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (identity, (self.sharing.dumps(self.setup, forking=True),))


def _forking_dispatch_table() -> dict:
    """multiprocessing's reducers (connections, shared ctypes, ...) without
    torch's, which would move tensors into torch's shared memory in place."""
    from multiprocessing.reduction import ForkingPickler

    table = copyreg.dispatch_table.copy()
    for cls, reduce in ForkingPickler._extra_reducers.items():
        if not getattr(reduce, "__module__", "").startswith("torch"):
            table[cls] = reduce
    return table


class SharingPickler(pickle.Pickler):
    def __init__(self, file: Any, sharing: DatasetSharing, forking: bool = False) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        if forking:
            self.dispatch_table = _forking_dispatch_table()
        self._sharing = sharing
        self._np = sys.modules.get("numpy")
        self._torch = sys.modules.get("torch")

    def reducer_override(self, obj: Any) -> Any:
        if self._np is not None and isinstance(obj, self._np.ndarray):
            return self._sharing.reduce_array(obj)
        if self._torch is not None and isinstance(obj, self._torch.Tensor):
            return self._sharing.reduce_tensor(obj)
        return NotImplemented


# --- the loader ---------------------------------------------------------------------------
