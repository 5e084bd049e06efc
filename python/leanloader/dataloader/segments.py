"""How shared memory and file ranges of the main process reach a worker:
references (pid, descriptor, inode, offset) that pickles carry, and the
functions that map them again on the other side (``rebuild_array``,
``rebuild_tensor``, ``rebuild_file_array``, ``rebuild_file_tensor``),
attached through ``/proc/<owner pid>/fd/<fd>``: one copy for all workers."""

from __future__ import annotations

import atexit
import os
from typing import Any

from leanloader import _core

# numpy dtype.str -> safetensors name, for arrays that slots and shared
# segments can hold.
NUMPY_TO_NAME = {
    "|b1": "BOOL", "|u1": "U8", "|i1": "I8", "<u2": "U16", "<i2": "I16", "<u4": "U32",
    "<i4": "I32", "<u8": "U64", "<i8": "I64", "<f2": "F16", "<f4": "F32", "<f8": "F64",
    "<c8": "C64", "<c16": "C128",
}  # fmt: skip


def torch_dtype_names() -> dict[Any, str]:
    import torch

    return {
        torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.uint16: "U16",
        torch.int16: "I16", torch.uint32: "U32", torch.int32: "I32", torch.uint64: "U64",
        torch.int64: "I64", torch.float16: "F16", torch.bfloat16: "BF16",
        torch.float32: "F32", torch.float64: "F64", torch.complex64: "C64",
        torch.complex128: "C128",
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
    fortran: bool = False,
    writeable: bool = True,
) -> Any:
    """A NumPy array in a shared segment of the main process, mapped
    copy-on-write: like the pickled copy torch gives each worker, writes stay
    in the worker, but only the pages written are copied. In the owner
    process an array moved into the segment (not a `copy` of one) is the
    segment itself. `shape` is the C-ordered shape of the bytes; a `fortran`
    array is its transpose. A read-only array stays read-only, as fork
    keeps it."""
    import numpy as np

    mode = "shared" if reference[0] == os.getpid() and not copy else "private"
    segment = attach_segment(*reference, mode=mode)
    array = segment.array(offset, NUMPY_TO_NAME[dtype], list(shape), "numpy")
    array = array.view(np.dtype(dtype))
    if fortran:
        array = array.T
    if not writeable:
        array.flags.writeable = False
    return array


def rebuild_arena_array(
    reference: tuple[int, int, int, int, int], offset: int, dtype: Any, shape: tuple,
    strides: tuple, writeable: bool,
) -> Any:  # fmt: skip
    """An array over a multiprocessing RawArray of the main process (see
    sharing.arena_array_reference): its arena file mapped shared, so that
    writes reach every process as they do from a forked worker."""
    import numpy as np

    segment = attach_segment(*reference, mode="shared")
    base = segment.array(0, "U8", [reference[4]], "numpy")
    array = np.ndarray(shape, np.dtype(dtype), buffer=base, offset=offset, strides=strides)
    if not writeable:
        array.flags.writeable = False
    return array


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
