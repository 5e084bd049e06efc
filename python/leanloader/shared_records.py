"""ll.SharedRecords: a list of Python records packed once into shared memory.

A Python list of dicts read by worker processes is the classic copy-on-read
trap (pytorch/pytorch#13246): under fork every worker ends up with a private
copy of every page it reads (CPython writes reference counts into each object
it touches); under spawn/forkserver the whole list is pickled into every
worker. ``SharedRecords`` serializes each record once (pickle) into one shared
buffer with an offset index (C++: ``include/leanloader/shared_records.h``);
every process maps the same pages and decodes only the record it reads.

Pickling a ``SharedRecords`` (as ``ll.DataLoader`` and ``torch``'s DataLoader
do when they start workers) sends a reference of a few bytes, not the records:
the receiving process maps the buffer through ``/proc/<owner pid>/fd/<fd>``,
so it must run on the same host while the creating process is alive.
"""

from __future__ import annotations

import atexit
import os
import pickle
import weakref
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from leanloader import _core


class SharedRecords(Sequence):
    """A read-only sequence of records (dicts, tuples, strings, numbers...).

    ``records[i]`` decodes and returns a fresh object each time: mutating it
    does not change the stored record. ``dir`` is a shared-memory (tmpfs)
    directory (default ``$LEANLOADER_SHM_DIR``, else anonymous shared memory,
    a memfd); its space is reserved up front, so a full directory is an
    ``OSError`` here.
    """

    def __init__(self, records: Iterable[Any], *, dir: str | None = None) -> None:
        blobs = [pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL) for record in records]
        self._buffer = _core.SharedRecordsBuffer.pack(blobs, dir)
        self._owner = os.getpid()
        _LIVE.add(self)

    @classmethod
    def _from_buffer(cls, buffer: Any, owner: int) -> SharedRecords:
        self = cls.__new__(cls)
        self._buffer = buffer
        self._owner = owner
        _LIVE.add(self)
        return self

    def __len__(self) -> int:
        return len(self._buffer)

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [pickle.loads(self._buffer.get(i)) for i in range(*index.indices(len(self)))]
        return pickle.loads(self._buffer.get(int(index)))

    def __iter__(self) -> Iterator[Any]:
        get = self._buffer.get
        for i in range(len(self._buffer)):
            yield pickle.loads(get(i))

    @property
    def nbytes(self) -> int:
        """Bytes of shared memory the records occupy (index included)."""
        return int(self._buffer.segment.size)

    def __repr__(self) -> str:
        return f"SharedRecords({len(self)} records, {self.nbytes:,} bytes shared)"

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        segment = self._buffer.segment
        inode = os.fstat(segment.fd).st_ino
        return (_attach_records, (self._owner, segment.fd, inode))


# (owner pid, fd, inode) -> records buffer, so that every SharedRecords
# unpickled in this process shares one mapping.
_ATTACHED: dict[tuple[int, int, int], Any] = {}
# Every SharedRecords of this process; their buffers are dropped before
# interpreter finalization (objects still alive then, e.g. a dataset held by
# torch's worker info, would otherwise outlive the extension module).
_LIVE: weakref.WeakSet[SharedRecords] = weakref.WeakSet()


def _release_all() -> None:
    for records in list(_LIVE):
        records._buffer = None
    _ATTACHED.clear()


atexit.register(_release_all)


def _attach_records(owner: int, fd: int, inode: int) -> SharedRecords:
    key = (owner, fd, inode)
    buffer = _ATTACHED.get(key)
    if buffer is None:
        from leanloader.dataloader.segments import attach_segment

        segment = attach_segment(owner, fd, inode, mode="read")
        buffer = _core.SharedRecordsBuffer.attach(segment)
        _ATTACHED[key] = buffer
    return SharedRecords._from_buffer(buffer, owner)
