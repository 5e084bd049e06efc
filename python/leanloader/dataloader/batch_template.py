"""Batches in shared memory: a batch's tensors and arrays are written into
a segment and only a template (structure, dtypes, shapes, offsets) travels
through the pipe (``plan_batch`` / ``unpack_batch``); with torch's default
collate, samples are written straight into their rows of the batch
(``StreamedFetch``, ``UncollatedBatch`` / ``plan_stacked``), so that the
batch never exists twice in a worker."""

from __future__ import annotations

import copy
import weakref
from collections.abc import Sequence
from typing import Any

from leanloader.dataloader.protocol import sample_of
from leanloader.dataloader.segments import NUMPY_TO_NAME

ALIGNMENT = 64

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
        return "numpy", NUMPY_TO_NAME[value.dtype.str], np.asarray(value, order="C")
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


class TensorLeaf:
    """A torch tensor of a batch that a plain SlotLeaf would change: a view
    with its own strides (a transpose, channels_last), one sharing its
    storage with another tensor of the batch, one that requires grad, an
    ``nn.Parameter``, an instance of a subclass (torchvision's tv_tensors).
    It is rebuilt as torch's pickled tensor is: over a region of the slot
    holding the bytes of its storage that the batch's tensors use (one region
    per storage, so views still share it), with its strides, storage offset,
    requires_grad and class; a subclass's instance with its state (its
    ``__dict__``: a BoundingBoxes' format and canvas_size), as torch's
    ``_rebuild_from_type_v2`` restores it."""

    __slots__ = ("byte_start", "dtype", "parameter", "region", "requires_grad", "shape",
                 "strides", "subclass")  # fmt: skip

    def __init__(self, region: SlotLeaf, byte_start: int, dtype: str, shape: tuple,
                 strides: tuple, requires_grad: bool, parameter: bool,
                 subclass: tuple[type, Any] | None = None) -> None:  # fmt: skip
        self.region, self.byte_start, self.dtype = region, byte_start, dtype
        self.shape, self.strides = shape, strides
        self.requires_grad, self.parameter = requires_grad, parameter
        self.subclass = subclass  # (class, torch._utils._get_obj_state(tensor)) or None

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (TensorLeaf, (self.region, self.byte_start, self.dtype, self.shape, self.strides,
                             self.requires_grad, self.parameter, self.subclass))  # fmt: skip


class FortranLeaf:
    """A NumPy array in Fortran order, kept so as pickle keeps it: its
    transpose (C order) in the slot, transposed back when unpacked."""

    __slots__ = ("transposed",)

    def __init__(self, transposed: SlotLeaf) -> None:
        self.transposed = transposed

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (FortranLeaf, (self.transposed,))


def is_tensor_subclass(value: Any) -> bool:
    """An instance of a torch.Tensor subclass other than nn.Parameter."""
    import torch

    return isinstance(value, torch.Tensor) and type(value) not in (
        torch.Tensor,
        torch.nn.Parameter,
    )


def _tensor_span(tensor: Any) -> tuple[int, int]:
    """The bytes [start, end) of its storage that `tensor` reads."""
    size = tensor.element_size()
    start = tensor.storage_offset() * size
    if tensor.numel() == 0:
        return start, start
    last = sum((n - 1) * stride for n, stride in zip(tensor.shape, tensor.stride(), strict=True))
    return start, start + (last + 1) * size


class _BatchLayout(_SlotLayout):
    """_SlotLayout for a whole collated batch: an object met twice is one
    leaf (unpacked as one object, as pickle's memo keeps it), and tensors that
    a contiguous copy would change (TensorLeaf) share a region per storage."""

    def __init__(self, batch: Any, torch_names: dict | None) -> None:
        super().__init__()
        self.torch_names = torch_names
        self.seen: dict[int, tuple[Any, Any]] = {}  # id -> (value kept alive, its leaf)
        # storage data_ptr -> [tensors of the batch over it]
        self.storages: dict[int, list[Any]] = {}
        self.regions: dict[int, tuple[SlotLeaf, int]] = {}  # data_ptr -> (region, its start)
        if torch_names is not None:
            _map_structure(batch, self._note_storage)

    def _note_storage(self, value: Any) -> Any:
        import torch

        if isinstance(value, torch.Tensor) and slot_array(value, self.torch_names) is not None:
            tensors = self.storages.setdefault(value.untyped_storage().data_ptr(), [])
            if not any(t is value for t in tensors):
                tensors.append(value)
        return value

    def leaf(self, value: Any, torch_names: dict | None) -> Any:
        remembered = self.seen.get(id(value))
        if remembered is not None and remembered[0] is value:
            return remembered[1]
        made = self._leaf(value)
        if made is not value:
            self.seen[id(value)] = (value, made)
        return made

    def _leaf(self, value: Any) -> Any:
        import numpy as np

        if self.torch_names is not None:
            import torch

            if isinstance(value, torch.Tensor) and self._needs_tensor_leaf(value):
                return self._tensor_leaf(value)
        if (
            type(value) is np.ndarray
            and value.ndim > 1
            and value.flags.f_contiguous
            and not value.flags.c_contiguous
            and value.dtype.str in NUMPY_TO_NAME
        ):
            return FortranLeaf(super().leaf(value.T, self.torch_names))
        return super().leaf(value, self.torch_names)

    def _needs_tensor_leaf(self, tensor: Any) -> bool:
        import torch

        if slot_array(tensor, self.torch_names) is None or tensor.is_conj() or tensor.is_neg():
            return False
        shared = len(self.storages.get(tensor.untyped_storage().data_ptr(), ())) > 1
        return (
            shared
            or not tensor.is_contiguous()
            or tensor.requires_grad
            or isinstance(tensor, torch.nn.Parameter)
            or is_tensor_subclass(tensor)
        )

    def _tensor_leaf(self, tensor: Any) -> TensorLeaf:
        import torch

        pointer = tensor.untyped_storage().data_ptr()
        if pointer not in self.regions:
            spans = [_tensor_span(t) for t in self.storages[pointer]]
            start, end = min(s for s, _ in spans), max(e for _, e in spans)
            offset = self.place(end - start)
            if end > start:
                raw = torch.empty(0, dtype=torch.uint8)
                raw.set_(tensor.untyped_storage(), start, (end - start,))
                self.copies.append((offset, raw))
            self.regions[pointer] = (SlotLeaf(offset, "U8", (end - start,), "torch"), start)
        region, start = self.regions[pointer]
        return TensorLeaf(
            region,
            tensor.storage_offset() * tensor.element_size() - start,
            self.torch_names[tensor.dtype],  # type: ignore[index]
            tuple(tensor.shape),
            tuple(tensor.stride()),
            bool(tensor.requires_grad),
            isinstance(tensor, torch.nn.Parameter),
            (type(tensor), torch._utils._get_obj_state(tensor))
            if is_tensor_subclass(tensor)
            else None,
        )


def plan_batch(batch: Any, torch_names: dict | None) -> tuple[Any, list[tuple[int, Any]], int]:
    """Template of `batch` with SlotLeaf for every array the slot can hold,
    the (offset, contiguous array) copies to make, and the bytes needed."""
    layout = _BatchLayout(batch, torch_names)
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
    if type(samples) not in (list, tuple) or len(samples) == 0:
        # what a __getitems__ may return besides samples (a generator, one
        # stacked array, a dict): torch's collate decides, its result or error
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

    if isinstance(sample, torch.Tensor) and (sample.requires_grad or is_tensor_subclass(sample)):
        # default_collate in a worker stacks into shared memory with out=,
        # which autograd refuses: torch's collate decides (its error). A
        # subclass's stack is its own (__torch_function__): collated by it.
        raise _NotStackable
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
        if getattr(sample, "requires_grad", False) or is_tensor_subclass(sample):
            return False  # (as in _plan_rows)
        found = slot_array(sample, torch_names)
        if found is None or found[0] != skeleton.kind or found[1] != skeleton.name:
            return False
        if tuple(found[2].shape) != skeleton.shape:
            return False
        out.append((skeleton, found[2], sample))
        return True
    if isinstance(skeleton, _ValueColumn):
        if isinstance(sample, (dict, list, tuple)) or slot_array(sample, torch_names) is not None:
            return False
        out.append((skeleton, sample, None))
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


def _take_sample(sample: Any, position: int, skeleton: Any, torch_names: dict, put: Any,
                 watch: _SourceWatch | None = None) -> bool:  # fmt: skip
    """Sample `position` of the batch into its rows: put(offset, array) for
    each array leaf (and `watch` told where it came from), its values kept
    for the rest; False (nothing put) when it does not match the skeleton."""
    leaves: list = []
    if not _match_rows(sample, skeleton, torch_names, leaves):
        return False
    for column, value, source in leaves:
        if isinstance(column, _ArrayColumn):
            if column.row:
                offset = column.offset + position * column.row
                address = put(offset, value)
                if watch is not None:
                    watch.note(offset, source, value, address)
        else:
            column.values.append(value)
    return True


class _SourceWatch:
    """Torch's collate stacks the samples at the batch's end, after every
    __getitem__; a stream copies each sample's arrays as it comes. The two
    differ where a dataset keeps an array's memory and a later fetch
    rewrites it (one buffer filled for every sample: torch's batch repeats
    the last values). The owner of each row's memory (a NumPy view's base
    array, a tensor's storage) is watched through a weak reference, so that
    no sample's memory is kept alive; at the batch's end, the rows whose
    memory is still alive and overlaps another row's are copied again from
    it, as torch's collate reads them."""

    __slots__ = ("rows",)

    def __init__(self) -> None:
        # (offset in the slot, owner's weak reference, low, high, layout):
        # layout None for a contiguous source (the bytes [low, high)), else
        # NumPy's array interface of its strided memory
        self.rows: list[tuple[int, Any, int, int, dict | None]] = []

    def note(self, offset: int, source: Any, written: Any, address: int) -> None:
        """Row `offset` (of at least one byte) was copied from `written` (at
        `address`), the array or contiguous copy of the sample's leaf
        `source`."""
        import numpy as np

        if type(source) is np.ndarray:
            owner = source
            while isinstance(owner.base, np.ndarray):
                owner = owner.base
            if written is source:
                low, high, layout = address, address + source.nbytes, None
            elif min(source.strides) < 0:
                return
            else:
                address = source.__array_interface__["data"][0]
                shape, strides = source.shape, source.strides
                low, high, layout = _strided_memory(address, source.itemsize, shape, strides)
        else:  # a tensor
            if source.is_conj() or source.is_neg():
                return  # its row is not its memory's bytes
            owner = source.untyped_storage()
            low, size = source.data_ptr(), source.element_size()
            if source.is_contiguous():
                high, layout = low + source.numel() * size, None
            else:
                strides = tuple(s * size for s in source.stride())
                low, high, layout = _strided_memory(low, size, tuple(source.shape), strides)
        try:
            self.rows.append((offset, weakref.ref(owner), low, high, layout))
        except TypeError:
            pass  # an owner nothing can watch: not memory a dataset keeps

    def copy_shared_rows(self, put: Any) -> None:
        """put(offset, bytes) again for each row whose memory another row shares."""
        if len(self.rows) < 2:
            return
        alive = [(row, owner) for row in self.rows if (owner := row[1]()) is not None]
        alive.sort(key=lambda entry: entry[0][2])
        shared: set[int] = set()
        reach, reaching = -1, -1
        for index, ((_, _, low, high, _), _) in enumerate(alive):
            if low < reach:
                shared.update((index, reaching))
            if high > reach:
                reach, reaching = high, index
        if not shared:
            return
        import numpy as np

        for index in sorted(shared):
            offset, _, low, high, layout = alive[index][0]  # (its owner held in `alive`)
            memory = _ArrayInterface(layout or {"data": (low, True), "typestr": "|u1",
                                                "shape": (high - low,), "version": 3})  # fmt: skip
            put(offset, np.ascontiguousarray(np.asarray(memory)).view(np.uint8).reshape(-1))


class _ArrayInterface:
    __slots__ = ("__array_interface__",)

    def __init__(self, interface: dict) -> None:
        self.__array_interface__ = interface


def _strided_memory(address: int, itemsize: int, shape: tuple, strides: tuple) -> tuple:
    """(low, high, array interface) of strided memory with non-negative strides."""
    span = sum((n - 1) * s for n, s in zip(shape, strides, strict=True))
    interface = {"data": (address, True), "typestr": f"|V{itemsize}", "shape": shape,
                 "strides": strides, "version": 3}  # fmt: skip
    return address, address + span + itemsize, interface


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
        sample = sample_of(dataset, indices[0])
        batch_size = len(indices)
        layout = _SlotLayout()
        try:
            skeleton = _plan_rows(sample, batch_size, layout, self.torch_names)
        except _NotStackable:
            skeleton = None
        if skeleton is None or layout.used == 0:
            samples = [sample, *(sample_of(dataset, i) for i in indices[1:])]
            return UncollatedBatch(samples, self.collate, self.whole)
        target = destination(layout.used)
        segment, base = target.segment, target.base

        def put(offset: int, array: Any) -> int:
            return segment.write(base + offset, array)

        watch = _SourceWatch()
        position = 0
        while True:
            if not _take_sample(sample, position, skeleton, self.torch_names, put, watch):
                watch.copy_shared_rows(put)
                samples = [_rebuild_sample(skeleton, i, segment, base) for i in range(position)]
                target.discard()
                samples.append(sample)
                samples.extend(sample_of(dataset, i) for i in indices[position + 1 :])
                return UncollatedBatch(samples, self.collate, self.whole)
            del sample
            position += 1
            if position == batch_size:
                break
            sample = sample_of(dataset, indices[position])
        watch.copy_shared_rows(put)
        template = _row_template(skeleton, batch_size, self.collate, put, self.torch_names)
        return target.finish(template)


def _torch_dtypes() -> dict[str, Any]:
    from leanloader.dataloader.segments import torch_dtype_names

    return {name: dtype for dtype, name in torch_dtype_names().items()}


def unpack_batch(template: Any, hold: Any) -> Any:
    """The batch of `template` with zero-copy tensors over the held slot; a
    leaf met twice gives the same object twice."""
    made: dict[int, Any] = {}
    regions: dict[int, Any] = {}

    def slot_leaf(value: SlotLeaf) -> Any:
        return hold.tensor(value.offset, value.dtype, list(value.shape), value.kind)

    def tensor_leaf(value: TensorLeaf) -> Any:
        import torch

        region = regions.get(id(value.region))
        if region is None:
            region = regions[id(value.region)] = slot_leaf(value.region)
        dtype = _torch_dtypes()[value.dtype]
        size = torch.empty(0, dtype=dtype).element_size()
        byte_start = region.storage_offset() + value.byte_start
        tensor = torch.empty(0, dtype=dtype)
        if byte_start % size == 0:
            tensor.set_(region.untyped_storage(), byte_start // size, value.shape, value.strides)
        else:
            # Tensors of different dtypes over one storage, this one at a
            # place its element size does not divide: its own aligned copy.
            reach = 1 + sum((n - 1) * st for n, st in zip(value.shape, value.strides, strict=True))
            raw = region[value.byte_start : value.byte_start + reach * size].clone()
            tensor = torch.as_strided(raw.view(dtype), value.shape, value.strides)
        if value.parameter:
            return torch.nn.Parameter(tensor, requires_grad=value.requires_grad)
        tensor.requires_grad_(value.requires_grad)
        if value.subclass is not None:
            cls, state = value.subclass
            tensor = tensor.as_subclass(cls)
            torch._utils._set_obj_state(tensor, state)
        return tensor

    def leaf(value: Any) -> Any:
        if not isinstance(value, (SlotLeaf, TensorLeaf, FortranLeaf)):
            return value
        known = made.get(id(value))
        if known is not None:
            return known
        if isinstance(value, SlotLeaf):
            result = slot_leaf(value)
        elif isinstance(value, TensorLeaf):
            result = tensor_leaf(value)
        else:
            result = slot_leaf(value.transposed).T
        made[id(value)] = result
        return result

    return _map_structure(template, leaf)
