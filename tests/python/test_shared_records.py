"""ll.SharedRecords: one shared buffer of records, read by other processes."""

from __future__ import annotations

import multiprocessing
import os
import pickle

import pytest

import leanloader as ll

RECORDS = [{"path": f"/data/{i}.png", "caption": "a cat " * (i % 7), "size": i} for i in range(500)]


def test_records_read_back_equal():
    records = ll.SharedRecords(RECORDS)
    assert len(records) == 500
    assert records[0] == RECORDS[0] and records[-1] == RECORDS[-1]
    assert records[10:13] == RECORDS[10:13]
    assert list(records) == RECORDS
    with pytest.raises(IndexError):
        records[500]


def test_records_are_decoded_fresh_on_each_access():
    records = ll.SharedRecords([{"a": 1}, ("t", 2), "text", None])
    first = records[0]
    first["a"] = 99
    assert records[0] == {"a": 1}
    assert records[1] == ("t", 2) and records[2] == "text" and records[3] is None


def test_pickle_is_a_small_reference():
    records = ll.SharedRecords(RECORDS)
    data = pickle.dumps(records)
    assert len(data) < 300
    assert records.nbytes > 10_000
    assert list(pickle.loads(data)) == RECORDS


def _read_in_child(records, queue) -> None:
    queue.put((os.getpid(), records[123], len(records)))


def test_spawned_process_maps_the_same_records():
    records = ll.SharedRecords(RECORDS)
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_read_in_child, args=(records, queue))
    child.start()
    pid, record, count = queue.get(timeout=60)
    child.join(10)
    assert pid != os.getpid()
    assert record == RECORDS[123] and count == 500


def test_full_shm_dir_is_an_error(tmp_path):
    import errno
    import subprocess

    target = tmp_path / "tiny"
    target.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(target)],
                      capture_output=True).returncode != 0:  # fmt: skip
        pytest.skip("cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN)")
    try:
        with pytest.raises(OSError) as caught:
            ll.SharedRecords(RECORDS * 10, dir=str(target))
        assert caught.value.errno == errno.ENOSPC
        assert str(target) in str(caught.value)
    finally:
        subprocess.run(["umount", str(target)], check=False)
