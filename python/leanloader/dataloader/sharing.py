"""Sharing a dataset once: large arrays and CPU tensors copied into shared
segments (or, opted in, moved there in place), and a pickler that sends
references to those segments instead of their bytes.

The dataset object the user passed is left as it was: the pickler sends a
reference to a shared *copy* of each large array or tensor, made the first
time it is pickled and reused by later passes only while the array still
holds the copy's bytes (a pass sees what the main process wrote before it,
as torch's workers do; persistent workers keep what they received, as
torch's). Where the array's memory is a whole block that glibc's malloc
mapped on its own (NumPy's and torch's large arrays), the array's pages are
then mapped from the copy, copy-on-write (``_core.shared_copy``,
src/workers/shared_copy.cc): the same bytes at the same addresses, and one
copy in all instead of two. Other threads writing the array meanwhile wait
while each chunk's pages change hands (src/workers/held_writes.h).
``share_in_place=True`` instead moves the arrays (attributes replaced by
equal arrays backed by shared memory) and tensors (their storage moved, as
``Tensor.share_memory_()``) of the dataset itself: its later writes are
seen. Tensors already in torch's shared memory are sent as that memory.
Subclasses of ndarray (MaskedArray, matrix) pickle as NumPy pickles them."""

from __future__ import annotations

import copyreg
import io
import mmap
import multiprocessing.heap
import os
import pickle
import sys
import weakref
from typing import Any

from leanloader import _core
from leanloader.dataloader.segments import (
    NUMPY_TO_NAME,
    range_reference,
    rebuild_arena_array,
    rebuild_array,
    rebuild_file_array,
    rebuild_file_tensor,
    rebuild_tensor,
    torch_dtype_names,
)
from leanloader.dataloader.worker import identity

# --- sharing the dataset once -------------------------------------------------------------

# LEANLOADER_SHARE_PAGES=0: shared copies never take the dataset's pages (two
# copies of each large array, the user's and the workers').
SHARE_PAGES = os.environ.get("LEANLOADER_SHARE_PAGES", "1") != "0"


class _Copy:
    """A shared copy of one array or storage: the source's owner (weakly: the
    copy serves while it lives), the copy, its segment, and what to compare
    to tell whether the source changed since (see DatasetSharing._current)."""

    __slots__ = ("address", "nbytes", "owner", "pages_shared", "segment", "shared")

    def __init__(
        self, owner: Any, shared: Any, segment: Any, address: int, nbytes: int, pages_shared: bool
    ) -> None:
        self.owner, self.shared, self.segment = owner, shared, segment
        self.address, self.nbytes = address, nbytes
        # Whether the source's pages were mapped from the copy: only then can
        # copy_is_current tell from the written pages (else it compares all).
        self.pages_shared = pages_shared


class DatasetSharing:
    """Moves large arrays of a dataset into shared memory and pickles it with
    references to those segments.

    A shared copy is made the first time an array or tensor is pickled and
    reused by later pickles (each pass of non-persistent workers) only while
    the source still holds the copy's bytes: a pass sees what the main
    process wrote before it, as torch's workers do. A superseded copy, a
    copy the last pickle did not refer to, and the copy of a source that is
    gone leave this object; an iterator holds the segments its workers
    attach (take_used) until its workers are gone."""

    def __init__(self, threshold: int, shm_dir: str | None) -> None:
        self.threshold = threshold
        self.shm_dir = shm_dir
        self.in_place_segments: list[Any] = []  # share_in_place: for the loader's lifetime
        self.in_place = False
        # key -> _Copy: ("block", address, bytes) for a block its allocator
        # returned, ("array", id) for any other array, ("storage", address,
        # bytes) for a tensor's storage
        self.copies: dict[tuple, _Copy] = {}
        # Bytes of the user's arrays and tensors now mapped from their shared
        # copies (the rest of each copy is a second copy of its bytes).
        self.shared_page_bytes = 0
        self.torch = sys.modules.get("torch")
        self._used: dict[int, Any] = {}  # segments referenced since take_used()
        # During a dump: the keys of the copies it refers to. The copies it
        # does not refer to serve no later pass and are dropped after it (a
        # tensor given a new storage, a growing prefix of a buffer).
        self._dump_keys: set[tuple] | None = None
        self._moved: dict[int, Any] = {}  # during one dump: old storage address -> moved
        # Where this dump's new copies go: one file (one descriptor here and
        # in each worker) for all of them (_core.SharedArena). A new arena per
        # dump, so that a pass's copies are freed together with their file.
        self._arena: Any = None

    @property
    def segments(self) -> list[Any]:
        """The segments this object keeps: the dataset's own arrays moved in
        place, and the current shared copies."""
        self._drop_orphans()
        unique = {id(s): s for s in self.in_place_segments}
        unique.update((id(c.segment), c.segment) for c in self.copies.values())
        return list(unique.values())

    def take_used(self) -> list[Any]:
        """The segments the pickles since the last call refer to (what their
        receivers attach), forgotten here."""
        used, self._used = list(self._used.values()), {}
        return used

    def _drop_orphans(self) -> None:
        for key in [k for k, c in self.copies.items() if c.owner() is None]:
            del self.copies[key]

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
            shared, segment = self._to_segment(value, np)
            if isinstance(container, (dict, list)):
                container[key] = shared
            else:
                try:
                    setattr(container, key, shared)
                except (AttributeError, TypeError):
                    continue  # read-only attribute: the pickler copies it instead
            self.in_place_segments.append(segment)
            moved += int(value.nbytes)
        return moved

    def share_ahead(self, dataset: Any) -> int:
        """Makes now the shared copies the first pickle would make, of the
        large arrays and tensors reachable from `dataset`, where a copy
        costs no memory: their pages then become the copy's (see
        _copy_sharing_pages). Run on a thread of its own from the loader's
        construction (SharingAhead), so that the copying overlaps what the
        program does before its first pass; that pass's pickle reuses each
        copy the source still matches. Anything else (a copy that would be
        a second copy, a file's bytes, tensors already shared) is left to
        the pickle. Returns the bytes copied."""
        import numpy as np

        from leanloader.audit import walk

        if not SHARE_PAGES or self.in_place:
            return 0
        candidates: list[tuple[Any, int, int]] = []  # (array or tensor, address, bytes)
        for _path, value, _container, _key in walk(dataset):
            candidate = self._candidate_ahead(value, np)
            if candidate is not None:
                candidates.append((value, *candidate))
        # Which of them malloc mapped on its own: the process's mappings read once.
        reasons = _core.page_sharing_refusals([(a, n) for _, a, n in candidates])
        copied = 0
        for (value, _address, nbytes), reason in zip(candidates, reasons, strict=True):
            if reason:
                continue
            if isinstance(value, np.ndarray):
                self._shared_copy(value, np)
            else:
                self._copy_storage(value)
            copied += nbytes
        return copied

    def _candidate_ahead(self, value: Any, np: Any) -> tuple[int, int] | None:
        """(address, bytes) of the block the first pickle would copy for
        `value` with the tests that need no system call (those of
        reduce_array, reduce_tensor, _shared_copy and _copy_storage), when
        it is an array or CPU tensor that might have its pages shared; else
        None. What is a file's bytes is not malloc's block: the refusal
        check that follows rules it out."""
        if type(value) is np.ndarray:
            if value.nbytes < self.threshold or not _in_memory_order(value)[0].flags.c_contiguous:
                return None
            if value.dtype.str not in NUMPY_TO_NAME or _numpy_block_owner(value, np) is None:
                return None
            address = value.__array_interface__["data"][0]
            nbytes = int(value.nbytes)
        else:
            torch = self.torch
            if torch is None or not isinstance(value, torch.Tensor):
                return None
            if not _plain_cpu_tensor(value, torch):
                return None
            storage = value.untyped_storage()
            address, nbytes = storage.data_ptr(), storage.nbytes()
            if nbytes < self.threshold or storage.is_shared() or _pinned(storage):
                return None
        if _core.find_shared_segment(address) is not None:
            return None
        return address, nbytes

    def _should_move_array(self, value: Any, np: Any) -> bool:
        return (
            type(value) is np.ndarray
            and value.nbytes >= self.threshold
            and value.dtype.str in NUMPY_TO_NAME
            and _owns_its_bytes(value, np)
            and _core.find_shared_segment(value.__array_interface__["data"][0]) is None
        )

    def _arena_now(self) -> Any:
        if self._arena is None:
            self._arena = _core.SharedArena(self.shm_dir)
        return self._arena

    def _new_segment(self, nbytes: int) -> Any:
        return self._arena_now().allocate(max(1, int(nbytes)))

    def _to_segment(self, array: Any, np: Any) -> tuple[Any, Any]:
        """An equal array in a new segment, in `array`'s memory order (a
        Fortran-ordered array stays Fortran-ordered, as pickle keeps it) and
        read-only where `array` is."""
        in_order, fortran = _in_memory_order(array)
        segment = self._new_segment(array.nbytes)
        segment.write(0, np.ascontiguousarray(in_order))
        name = NUMPY_TO_NAME[array.dtype.str]
        shared = segment.array(0, name, list(in_order.shape), "numpy").view(array.dtype)
        if fortran:
            shared = shared.T
        if not array.flags.writeable:
            shared.flags.writeable = False
        return shared, segment

    def dumps(self, obj: Any, forking: bool = False) -> bytes:
        """`obj` pickled with references to shared segments. With `forking`
        (inside Process.start()), multiprocessing's own reducers apply too:
        Value, Lock, Event, Queue... are sent as the start method sends them."""
        self._drop_orphans()
        self._arena = None  # (its segments keep it while they live)
        buffer = io.BytesIO()
        self._dump_keys = set()
        try:
            SharingPickler(buffer, self, forking).dump(obj)
            # (the segments of earlier passes stay with their iterators: take_used)
            for key in [k for k in self.copies if k not in self._dump_keys]:
                del self.copies[key]
        finally:
            self._moved = {}  # (an address freed later may come back as another storage)
            self._dump_keys = None
        return buffer.getvalue()

    def _served(self, key: tuple, copy: _Copy) -> _Copy:
        """`copy`, kept under `key` and noted as referred to by this dump."""
        self.copies[key] = copy
        if self._dump_keys is not None:
            self._dump_keys.add(key)
        return copy

    def _use(self, segment: Any) -> Any:
        self._used[id(segment)] = segment
        return segment

    def _current(self, key: tuple, source_address: int) -> _Copy | None:
        """The kept copy for `key` when its source lives and still holds the
        copy's bytes; else None (a stale copy is dropped)."""
        kept = self.copies.get(key)
        if kept is None:
            return None
        if kept.owner() is not None and _core.copy_is_current(
            source_address, kept.address, kept.nbytes, kept.pages_shared
        ):
            return kept
        del self.copies[key]
        return None

    def _copy_sharing_pages(self, address: int, nbytes: int) -> tuple[Any, int, bool]:
        """A shared copy of the block at `address` (the pointer its allocator
        returned) whose pages the block then shares where that is safe:
        (segment, offset of the copy in it, whether pages are shared)."""
        # Other threads may write the block meanwhile: their writes wait
        # while a chunk's pages change hands (src/workers/held_writes.h).
        segment, offset, shared = _core.shared_copy(address, nbytes, self._arena_now(), SHARE_PAGES)
        self.shared_page_bytes += shared
        return segment, offset, shared > 0

    def _shared_copy(self, array: Any, np: Any) -> Any:
        """The shared copy of `array` in its memory order (see
        _in_memory_order: the copy is C-contiguous, of the transposed shape
        for a Fortran-ordered array): made once, and again after the main
        process wrote the array."""
        in_order, _fortran = _in_memory_order(array)
        address = array.__array_interface__["data"][0]
        owner = (
            _numpy_block_owner(array, np) if array.nbytes and in_order.flags.c_contiguous else None
        )
        if owner is not None:
            key: tuple = ("block", address, int(array.nbytes))
            kept = self._current(key, address)
            if kept is not None:
                return self._served(key, kept).shared
            segment, offset, pages_shared = self._copy_sharing_pages(address, int(array.nbytes))
            name = NUMPY_TO_NAME[array.dtype.str]
            shared = segment.array(offset, name, list(in_order.shape), "numpy").view(array.dtype)
            reference = weakref.ref(owner)
        else:
            key = ("array", id(array))
            kept = self.copies.get(key)
            if (
                kept is not None
                and kept.owner() is array
                and _same_values(in_order, kept.shared, np)
            ):
                return self._served(key, kept).shared
            self.copies.pop(key, None)
            shared, segment = self._to_segment(in_order, np)
            shared.flags.writeable = True  # (the copy itself; rebuild_array sets the flag)
            pages_shared = False
            try:
                reference = weakref.ref(array)
            except TypeError:
                return shared  # an array type without weak references: copied each time
        self._served(
            key,
            _Copy(
                reference,
                shared,
                segment,
                shared.__array_interface__["data"][0],
                int(array.nbytes),
                pages_shared,
            ),
        )
        return shared

    def reduce_array(self, array: Any) -> Any:
        import numpy as np

        reference = file_array_reference(array, self.threshold)
        if reference is not None:
            return (rebuild_file_array, reference)  # the file is mapped again: nothing copied
        reference = arena_array_reference(array)
        if reference is not None:
            return (rebuild_arena_array, reference)  # (RawArray: workers write into it)
        if type(array) not in (np.ndarray, np.memmap):
            # MaskedArray, matrix, recarray...: pickled as NumPy pickles
            # them (a copy per worker, as torch sends them), with their type
            return NotImplemented
        if array.dtype.str not in NUMPY_TO_NAME or array.nbytes < self.threshold:
            return NotImplemented
        in_order, fortran = _in_memory_order(array)
        address = array.__array_interface__["data"][0]
        segment = _core.find_shared_segment(address)
        copy = segment is None or not in_order.flags.c_contiguous
        if copy:
            shared = self._shared_copy(array, np)  # one copy for all workers
            address = shared.__array_interface__["data"][0]
            segment = _core.find_shared_segment(address)
        offset = address - segment.address
        return (
            rebuild_array,
            (range_reference(self._use(segment)), offset, array.dtype.str, in_order.shape, copy,
             fortran, bool(array.flags.writeable)),
        )  # fmt: skip

    def reduce_tensor(self, tensor: Any) -> Any:
        torch = self.torch
        if not _plain_cpu_tensor(tensor, torch):
            return NotImplemented  # (sparse, nested and quantized tensors pickle as torch does)
        storage = tensor.untyped_storage()
        # A file's bytes are mapped again at any size where torch shared them
        # (share_memory_() under the file_system strategy: a file in
        # /dev/shm): the workers' writes must reach the program's tensor.
        if storage.nbytes() >= self.threshold or (storage.nbytes() and storage.is_shared()):
            backing = _core.file_backing(storage.data_ptr(), storage.nbytes())
            if backing is not None:  # torch.load(mmap=True), safetensors: mapped again
                return (
                    rebuild_file_tensor,
                    (backing, storage.nbytes(), str(tensor.dtype).removeprefix("torch."),
                     tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()),
                     bool(tensor.requires_grad), isinstance(tensor, torch.nn.Parameter)),
                )  # fmt: skip
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
            tensor, range_reference(self._use(segment)), offset, storage.nbytes(), copy=copy
        )

    def _copy_storage(self, tensor: Any) -> Any:
        """A shared copy of the tensor's storage: made once, and again after
        the main process wrote the storage; the tensor is left as it was."""
        torch = self.torch
        old = tensor.untyped_storage()
        key = ("storage", old.data_ptr(), old.nbytes())
        kept = self._current(key, old.data_ptr())
        if kept is not None:
            return self._served(key, kept).shared
        if old.nbytes() and not _pinned(old):
            # Its pages are taken where the storage is a whole block glibc's
            # malloc mapped (make_shared_copy checks the block's malloc
            # header): torch's CPU allocator's storages, and non-resizable
            # ones over such a block (torch.from_numpy of a NumPy array that
            # owns it, as YOLO's RAM image cache); else a plain copy.
            segment, offset, pages_shared = self._copy_sharing_pages(old.data_ptr(), old.nbytes())
            raw = segment.array(offset, "U8", [old.nbytes()], "torch")
        else:
            # pinned (page-locked memory is not remapped): a plain copy
            segment = self._new_segment(old.nbytes())
            raw = segment.array(0, "U8", [old.nbytes()], "torch")
            raw.copy_(torch.empty(0, dtype=torch.uint8).set_(old))
            pages_shared = False
        shared_storage = raw.untyped_storage()
        # the copy serves while the pickled tensor (and so the storage) lives:
        # its address cannot be another storage's meanwhile
        self._served(
            key,
            _Copy(
                weakref.ref(tensor),
                shared_storage,
                segment,
                shared_storage.data_ptr(),
                old.nbytes(),
                pages_shared,
            ),
        )
        return shared_storage

    def _move_tensor(self, tensor: Any) -> Any:
        """Moves the tensor's storage into a segment in place (as
        Tensor.share_memory_() does): the tensor object, its values and its
        views in the main process stay as they were. Views of the same
        storage pickled in the same dump move to the same segment."""
        torch = self.torch
        old = tensor.untyped_storage()
        shared_storage = self._moved.get(old.data_ptr())
        if shared_storage is None:
            segment = self._new_segment(old.nbytes())
            self.in_place_segments.append(segment)
            raw = segment.array(0, "U8", [old.nbytes()], "torch")
            raw.copy_(torch.empty(0, dtype=torch.uint8).set_(old))
            shared_storage = raw.untyped_storage()
            self._moved[old.data_ptr()] = shared_storage
        with torch.no_grad():
            moved = torch.empty(0, dtype=tensor.dtype).set_(
                shared_storage, tensor.storage_offset(), tensor.shape, tensor.stride()
            )
            tensor.data = moved
        return shared_storage


class SharingAhead:
    """DatasetSharing.share_ahead on a daemon thread of its own, started at a
    loader's construction; wait() before the sharing is used (the sharing
    is not thread-safe). What it does is an optimisation only: a dataset
    that changes meanwhile, or anything the walk raises, leaves the rest to
    the first pass's pickle, which checks every copy it reuses."""

    def __init__(self, sharing: DatasetSharing, dataset: Any) -> None:
        import threading

        self._sharing = sharing
        self._thread = threading.Thread(
            target=self._run, args=(dataset,), name="leanloader-share-ahead", daemon=True
        )
        self._thread.start()

    def _run(self, dataset: Any) -> None:
        try:
            self._sharing.share_ahead(dataset)
        except Exception:  # the first pass pickles (and reports) anything
            pass

    def wait(self) -> DatasetSharing:
        self._thread.join()
        return self._sharing


def file_array_reference(array: Any, min_bytes: int) -> tuple | None:
    """How a worker maps `array` from the file it is a view of (an np.memmap,
    any slice or reshape of one, np.load(mmap_mode=...)): the arguments of
    rebuild_file_array, or None when it is not a file's bytes (the rule of
    src/workers/file_backing.cc; ll.audit uses it too). Arrays under
    `min_bytes` that are not memmaps are not looked up (pickled by value)."""
    import numpy as np

    try:
        from numpy.lib.array_utils import byte_bounds
    except ImportError:  # NumPy < 2.0
        from numpy import byte_bounds

    if array.size == 0 or array.dtype.hasobject:
        return None
    if array.nbytes < min_bytes and not isinstance(array, np.memmap):
        if not isinstance(_final_base(array, np), mmap.mmap):
            return None  # (a SharedMemory's small arrays are looked up: their writes are shared)
    low, high = byte_bounds(array)
    backing = _core.file_backing(low, high - low)
    if backing is None:
        return None
    start = array.__array_interface__["data"][0] - low
    return (backing, high - low, start, array.dtype, array.shape, array.strides,
            isinstance(array, np.memmap), bool(array.flags.writeable))  # fmt: skip


def arena_array_reference(array: Any) -> tuple | None:
    """How a worker maps `array` when it views a multiprocessing RawArray or
    Array (np.frombuffer(RawArray(...))): memory the program shares on
    purpose, in an arena file of multiprocessing.heap whose descriptor this
    process holds. The worker maps the arena file shared, so its writes
    reach every process, as with fork. The arguments of rebuild_arena_array,
    or None for any other array."""
    import ctypes

    import numpy as np

    wrapper = getattr(_final_base(array, np), "_wrapper", None)
    state = getattr(wrapper, "_state", None)
    if not isinstance(wrapper, multiprocessing.heap.BufferWrapper) or state is None:
        return None
    (arena, start, _stop), _size = state
    if getattr(arena, "fd", -1) < 0 or array.size == 0 or array.dtype.hasobject:
        return None
    block = ctypes.addressof(_final_base(array, np))
    offset = start + array.__array_interface__["data"][0] - block
    reference = (os.getpid(), arena.fd, os.fstat(arena.fd).st_ino, 0, int(arena.size))
    return (reference, offset, array.dtype, array.shape, array.strides,
            bool(array.flags.writeable))  # fmt: skip


def _final_base(array: Any, np: Any) -> Any:
    """The object at the end of `array`'s chain of bases (the buffer's
    owner for an array made with np.frombuffer or buffer=)."""
    base = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return base.obj if isinstance(base, memoryview) else base


def _tensor_reduction(
    tensor: Any, reference: tuple[int, ...], offset: int, storage_bytes: int, copy: bool
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


def _in_memory_order(array: Any) -> tuple[Any, bool]:
    """`array` as workers receive its bytes, and whether they transpose it
    back: a Fortran-ordered array (not also C-ordered) as its transpose, a
    C-contiguous view of the same memory, so that it arrives Fortran-ordered
    as pickle and fork deliver it; any other array as it is (copied in C
    order where not contiguous, as pickle copies it)."""
    if array.flags.f_contiguous and not array.flags.c_contiguous:
        return array.T, True
    return array, False


def _numpy_block_owner(array: Any, np: Any) -> Any:
    """The ndarray that owns `array`'s memory when `array` starts at the
    pointer NumPy's default allocator (malloc) returned for it (it owns its
    data, or is a view from the start of the array that does:
    ``np.arange(n).reshape(...)``) and no handler replaced malloc; else None.
    While that owner lives, the block's address is the block's."""
    owner = array
    while isinstance(owner.base, np.ndarray):
        owner = owner.base
    if type(owner) is not np.ndarray or not owner.flags.owndata:
        return None
    if owner.__array_interface__["data"][0] != array.__array_interface__["data"][0]:
        return None
    try:
        from numpy._core.multiarray import get_handler_name  # NumPy 2 (1.26: a shim)
    except ImportError:  # NumPy < 1.26
        from numpy.core.multiarray import get_handler_name
    if get_handler_name(owner) != "default_allocator":
        return None
    return owner


def _same_values(array: Any, copy: Any, np: Any) -> bool:
    """Whether `array` (any strides) still holds its contiguous `copy`'s
    bytes, compared as unsigned integers of the item size."""
    unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}.get(array.dtype.itemsize)
    if unsigned is None or array.shape != copy.shape:
        return False  # (compared as bytes only where a view allows it: copied again)
    return bool(np.array_equal(array.view(unsigned), copy.view(unsigned)))


def _plain_cpu_tensor(tensor: Any, torch: Any) -> bool:
    """Whether reduce_tensor sends `tensor` through shared memory: a dense
    CPU Tensor or Parameter (not a subclass) of a dtype workers rebuild,
    outside autograd's graph. Others pickle as torch pickles them."""
    return (
        type(tensor) in (torch.Tensor, torch.nn.Parameter)
        and tensor.device.type == "cpu"
        and tensor.layout == torch.strided
        and not tensor.is_quantized
        and not tensor.is_nested
        and tensor.grad_fn is None
        and tensor.dtype in torch_dtype_names()
    )


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


def pickling_error(setup: Any, error: Exception) -> pickle.PicklingError:
    from leanloader.audit import _unpicklable_fix, find_unpicklable

    for name, value in (("dataset", setup.dataset), ("collate_fn", setup.collate_fn),
                        ("worker_init_fn", setup.worker_init_fn)):  # fmt: skip
        failing = find_unpicklable(value, name)
        if failing is not None:
            path, message, culprit = failing
            return pickle.PicklingError(
                f"cannot send the dataset to worker processes: {path} cannot be pickled "
                f"({message}); {_unpicklable_fix(culprit)}, or use num_workers=0"
            )
    return pickle.PicklingError(f"cannot send the dataset to worker processes: {error}")
