"""memory_report, process_tree_memory and `leanloader mem` on live processes and fake trees."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import leanloader as ll
from leanloader import _core
from leanloader.cli import main
from leanloader.memory import BYTE_KEYS, TOTAL_KEYS, process_tree_memory

MIB = 1 << 20
GIB = 1 << 30

# A parent that allocates anonymous memory, maps a file and a shared anonymous
# region, and forks a child that touches the shared region; it prints
# "ready <child pid>" and waits for a line on stdin.
TREE_SCRIPT = textwrap.dedent(
    """
    import mmap, os, sys
    anon_mib, file_path, shared_mib = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    anon = bytearray(anon_mib << 20)
    for i in range(0, len(anon), 4096):
        anon[i] = 1
    with open(file_path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    total = sum(mapped[i] for i in range(0, len(mapped), 4096))
    shared = mmap.mmap(-1, shared_mib << 20, flags=mmap.MAP_SHARED)
    for i in range(0, len(shared), 4096):
        shared[i] = 1
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(write_end)
        total += sum(shared[i] for i in range(0, len(shared), 4096))
        os.write(1, b"child-ready\\n")
        os.read(read_end, 1)
        os._exit(0)
    os.close(read_end)
    sys.stdout.write(f"ready {child}\\n")
    sys.stdout.flush()
    sys.stdin.readline()
    os.close(write_end)
    os.waitpid(child, 0)
    """
)


@pytest.fixture
def process_tree(tmp_path):
    """Starts TREE_SCRIPT (200 MiB anonymous, a 256 MiB mapped file, 64 MiB shared
    with its child); yields (parent pid, child pid); stops both."""
    data = tmp_path / "mapped.bin"
    with open(data, "wb") as f:
        for _ in range(256):
            f.write(b"x" * MIB)
    proc = subprocess.Popen(
        [sys.executable, "-c", TREE_SCRIPT, "200", str(data), "64"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    lines = [proc.stdout.readline(), proc.stdout.readline()]
    ready = next(line for line in lines if line.startswith("ready"))
    child = int(ready.split()[1])
    try:
        yield proc.pid, child
    finally:
        proc.stdin.write("\n")
        proc.stdin.flush()
        proc.wait(timeout=30)


def within(value: int, expected: int, tolerance: float = 0.10) -> bool:
    return abs(value - expected) <= tolerance * expected


def test_report_of_this_process_has_the_documented_shape():
    report = ll.memory_report()
    assert set(report) == {"processes", "total", "shared_files", "system", "cgroup", "gpu"}
    me = report["processes"][0]
    assert me["pid"] == os.getpid()
    assert list(me) == ["pid", "name", *BYTE_KEYS, "gpu_bytes"]
    assert me["pss_bytes"] > 0 and me["rss_bytes"] >= me["pss_bytes"]
    assert list(report["total"]) == [*BYTE_KEYS, *TOTAL_KEYS, "gpu_bytes"]
    if report["gpu"] is None:  # no NVML: no GPU figure, not a zero
        assert me["gpu_bytes"] is None and report["total"]["gpu_bytes"] is None
    else:
        assert all("processes" in gpu for gpu in report["gpu"])
    assert set(report["system"]) == {"mem_total_bytes", "mem_available_bytes"}
    assert 0 < report["system"]["mem_available_bytes"] <= report["system"]["mem_total_bytes"]
    if report["cgroup"] is not None:
        assert set(report["cgroup"]) == {"memory_max_bytes", "memory_current_bytes"}
    assert report["gpu"] is None or isinstance(report["gpu"], list)
    json.dumps(report)


def test_live_tree_anonymous_file_child_and_shared_pages(process_tree):
    parent, child = process_tree
    report = ll.memory_report(parent)
    assert [p["pid"] for p in report["processes"]] == [parent, child]
    total = report["total"]
    # Parent and child share the parent's pages copy-on-write, so only the tree's
    # total is 200 MiB anonymous / 256 MiB file; the interpreter adds < 16 MiB.
    assert 200 * MIB * 0.95 <= total["pss_anon_bytes"] <= 200 * MIB * 1.1 + 16 * MIB, total
    assert 256 * MIB * 0.9 <= total["pss_file_bytes"] <= 256 * MIB * 1.1 + 16 * MIB, total
    # 64 MiB mapped by both: each holds half in PSS, all of it in RSS; the total once.
    assert within(total["pss_shmem_bytes"], 64 * MIB), total
    for process in report["processes"]:
        assert within(process["pss_shmem_bytes"], 32 * MIB), process
        assert process["rss_bytes"] >= 64 * MIB
    assert total["rss_bytes"] > total["pss_bytes"] + 64 * MIB
    only_parent = ll.memory_report(parent, tree=False)
    assert [p["pid"] for p in only_parent["processes"]] == [parent]

    summed = process_tree_memory(parent)
    assert summed["num_processes"] == 2
    assert set(summed) == {*BYTE_KEYS, *TOTAL_KEYS, "num_processes"}
    assert summed["unreclaimable_bytes"] == (
        summed["pss_anon_bytes"] + summed["pss_shmem_bytes"] + summed["fd_shmem_bytes"]
    )
    assert within(summed["pss_shmem_bytes"], 64 * MIB)


def test_process_tree_memory_of_a_missing_pid_and_of_churning_children():
    assert _core.process_tree_memory(2**22 + 12345)["num_processes"] == 0
    with pytest.raises(FileNotFoundError):
        ll.memory_report(2**22 + 12345)
    # Children that start and exit while the tree is sampled are skipped, never an error.
    churn = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, time\n"
         "end = time.time() + 1.5\n"
         "while time.time() < end:\n"
         "    subprocess.run(['true'])\n"],
    )  # fmt: skip
    try:
        samples = 0
        start = time.monotonic()
        while churn.poll() is None and time.monotonic() - start < 10:
            reading = process_tree_memory(churn.pid)
            assert reading["num_processes"] in (0, 1, 2)
            samples += 1
        assert samples > 10
    finally:
        churn.wait(timeout=30)


def write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def fake_machine(root: Path) -> None:
    """A 128 GiB host, little MemFree but much MemAvailable, in a 4 GiB v2 cgroup."""
    rollup = (
        "00400000-7fff0000 ---p 00000000 00:00 0 [rollup]\n"
        "Rss: {rss} kB\nPss: {pss} kB\nPss_Anon: {anon} kB\nPss_File: {file} kB\n"
        "Pss_Shmem: {shmem} kB\nPrivate_Clean: 0 kB\nPrivate_Dirty: {anon} kB\nSwap: 0 kB\n"
    )
    write(root, "proc/10/stat", "10 (trainer) S 1 1 1\n")
    write(root, "proc/10/smaps_rollup", rollup.format(rss=3000, pss=2000, anon=1000,
                                                      file=900, shmem=100))  # fmt: skip
    write(root, "proc/11/stat", "11 (pt_data_worker) S 10 1 1\n")
    write(root, "proc/11/smaps_rollup", rollup.format(rss=2500, pss=1000, anon=500,
                                                      file=400, shmem=100))  # fmt: skip
    write(root, "proc/meminfo", f"MemTotal: {128 * 1024 * 1024} kB\nMemFree: {10 * 1024 * 1024} "
          f"kB\nMemAvailable: {70 * 1024 * 1024} kB\n")  # fmt: skip
    write(root, "proc/10/cgroup", "0::/job\n")
    write(root, "proc/self/cgroup", "0::/job\n")
    write(root, "proc/self/mountinfo",
          "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n")  # fmt: skip
    write(root, "sys/fs/cgroup/job/memory.max", f"{4 * GIB}\n")
    write(root, "sys/fs/cgroup/job/memory.current", f"{GIB}\n")


def test_report_from_a_fake_tree(tmp_path):
    fake_machine(tmp_path)
    report = ll.memory_report(10, root=str(tmp_path), gpu=False)
    assert [p["name"] for p in report["processes"]] == ["trainer", "pt_data_worker"]
    assert report["total"]["pss_bytes"] == 3000 * 1024
    assert report["total"]["rss_bytes"] == 5500 * 1024
    assert report["total"]["pss_shmem_bytes"] == 200 * 1024
    assert report["total"]["uss_bytes"] == 1500 * 1024
    assert report["system"] == {"mem_total_bytes": 128 * GIB, "mem_available_bytes": 70 * GIB}
    assert report["cgroup"] == {"memory_max_bytes": 4 * GIB, "memory_current_bytes": GIB}
    assert report["gpu"] is None
    # The budget the loader takes: min(MemAvailable, cgroup headroom) = 3 GiB, not MemFree.
    assert _core.available_memory_bytes(str(tmp_path)) == 3 * GIB
    assert _core.total_memory_bytes(str(tmp_path)) == 4 * GIB


def test_cli_mem_json_and_table(capsys, process_tree):
    parent, child = process_tree
    assert main(["mem", "--pid", str(parent), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [p["pid"] for p in report["processes"]] == [parent, child]
    assert set(report) == {"processes", "total", "shared_files", "system", "cgroup", "gpu"}
    assert main(["mem", "--pid", str(parent)]) == 0
    table = capsys.readouterr().out
    assert "PRIVATE" in table and "SHARED" in table and "FILE" in table
    assert "TOTAL" in table and "2 processes" in table
    assert "MemAvailable" in table


def test_cli_mem_watch_plot(tmp_path, capsys, process_tree):
    parent, _ = process_tree
    plot = tmp_path / "mem.png"
    code = main(["mem", "--pid", str(parent), "--watch", "0.05", "--count", "4", "--json",
                 "--plot", str(plot)])  # fmt: skip
    assert code == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4
    assert all(json.loads(line)["total"]["pss_bytes"] > 0 for line in lines)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_mem_missing_pid(capsys):
    assert main(["mem", "--pid", str(2**22 + 12345)]) == 1
    assert "no process" in capsys.readouterr().err


def test_shared_memory_held_by_a_descriptor_is_unreclaimable():
    # A memfd with 64 MiB allocated and mapped by no one: smaps shows nothing
    # of it, yet it holds memory until the descriptor closes.
    before = process_tree_memory()
    fd = os.memfd_create("leanloader-test")
    try:
        os.posix_fallocate(fd, 0, 64 * MIB)
        after = process_tree_memory()
        assert after["fd_shmem_bytes"] - before["fd_shmem_bytes"] == 64 * MIB
        assert after["unreclaimable_bytes"] - before["unreclaimable_bytes"] >= 60 * MIB
        report = ll.memory_report(gpu=False)
        held = report["shared_files"]
        assert held["unmapped_bytes"] >= 64 * MIB
        assert report["total"]["fd_shmem_bytes"] == held["unmapped_bytes"]
        owner = held["owners"][0]
        assert owner["pid"] == os.getpid() and owner["held_bytes"] >= 64 * MIB
        from leanloader.commands.mem import format_report

        table = format_report(report)
        assert "held by descriptors" in table and f"{os.getpid():>11}" in table
    finally:
        os.close(fd)
    assert process_tree_memory()["fd_shmem_bytes"] == before["fd_shmem_bytes"]
