"""Sharing a dataset once: large arrays and CPU tensors moved into shared
segments, and a pickler that sends references to those segments instead of
their bytes."""

from __future__ import annotations

import io
import pickle
import sys
from typing import Any

from leanloader import _core
from leanloader.dataloader.worker import (
    NUMPY_TO_NAME,
    rebuild_array,
    rebuild_memmap,
    rebuild_tensor,
    segment_reference,
    torch_dtype_names,
)

# --- sharing the dataset once -------------------------------------------------------------


class DatasetSharing:
    """Moves large arrays of a dataset into shared memory and pickles it with
    references to those segments. Holds every segment it created (and so the
    descriptors that workers attach through) for the loader's lifetime."""

    def __init__(self, threshold: int, shm_dir: str | None) -> None:
        self.threshold = threshold
        self.shm_dir = shm_dir
        self.segments: list[Any] = []
        self.moved_tensors: dict[int, Any] = {}  # old storage address -> shared storage
        self.torch = sys.modules.get("torch")

    def share_in_place(self, dataset: Any) -> int:
        """Replaces large NumPy arrays held in attributes, dicts and lists by
        equal arrays in shared memory. Returns the bytes moved."""
        import numpy as np

        from leanloader.audit import walk

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

    def dumps(self, obj: Any) -> bytes:
        buffer = io.BytesIO()
        SharingPickler(buffer, self).dump(obj)
        return buffer.getvalue()

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
        if segment is None or not array.flags.c_contiguous:
            shared = self._to_segment(array, np)  # one copy for all workers
            address = shared.__array_interface__["data"][0]
            segment = _core.find_shared_segment(address)
        offset = address - segment.address
        return (rebuild_array, (segment_reference(segment), offset, array.dtype.str, array.shape))

    def reduce_tensor(self, tensor: Any) -> Any:
        torch = self.torch
        if tensor.device.type != "cpu" or tensor.is_sparse or tensor.is_quantized:
            return NotImplemented
        if tensor.grad_fn is not None or tensor.dtype not in torch_dtype_names():
            return NotImplemented
        storage = tensor.untyped_storage()
        if storage.nbytes() < self.threshold:
            return NotImplemented
        segment = _core.find_shared_segment(storage.data_ptr())
        if segment is None:
            storage = self._move_tensor(tensor)
            segment = _core.find_shared_segment(storage.data_ptr())
        offset = storage.data_ptr() - segment.address
        dtype = str(tensor.dtype).removeprefix("torch.")
        parameter = isinstance(tensor, torch.nn.Parameter)
        return (
            rebuild_tensor,
            (segment_reference(segment), offset, storage.nbytes(), dtype,
             tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()),
             bool(tensor.requires_grad), parameter),
        )  # fmt: skip

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


class SharingPickler(pickle.Pickler):
    def __init__(self, file: Any, sharing: DatasetSharing) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
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
