"""TensorCache: build, resume, staleness, reading (zero-copy, Loader), per-sample
folders, sharing between processes, distributed builds."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import leanloader as ll


def write_inputs(directory, count, size=64):
    """`count` small files; file i holds bytes (i + j) % 251."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        path = directory / f"img{i:03d}.bin"
        path.write_bytes(bytes((i + j) % 251 for j in range(size)))
        paths.append(path)
    return paths


def encode_files(batch):
    """A stand-in model: the mean and the first 4 bytes of each file, as tensors."""
    import torch

    data = batch["data"]
    return {
        "mean": torch.stack([d.float().mean().reshape(1) for d in data]),
        "head": torch.stack([d[:4].to(torch.int32) for d in data]),
    }


def expected_head(path):
    return list(path.read_bytes()[:4])


def test_build_resume_and_read(tmp_path):
    paths = write_inputs(tmp_path / "in", 23)
    source = ll.FileSource(str(tmp_path / "in" / "*.bin"))
    cache = ll.TensorCache(tmp_path / "cache", shard_bytes=100)
    calls = []

    def encode(batch):
        calls.append(len(batch["data"]))
        return encode_files(batch)

    stats = cache.build(source, encode=encode, batch_size=4, progress=False)
    assert stats == {"built": 23, "fresh": 0, "total": 23}
    assert len(cache) == 23
    assert sorted(cache.keys()) == sorted(str(p) for p in paths)
    assert [f[:2] for f in cache.fields] == [("mean", "F32"), ("head", "I32")]
    entry = cache[str(paths[5])]
    assert entry["head"].tolist() == expected_head(paths[5])
    assert cache[0].keys() == entry.keys()
    with pytest.raises(KeyError):
        cache["nope"]
    with pytest.raises(IndexError):
        cache[23]
    assert cache.verify() == []
    # Many shards were published (100-byte target).
    assert len(cache.inspect()["shards"]) >= 4

    # Re-running resumes: nothing left to do, encode is not called.
    calls.clear()
    assert cache.build(source, encode=encode, batch_size=4, progress=False)["built"] == 0
    assert calls == []

    # A Loader reads the cache like any Source.
    seen = {}
    loader = ll.Loader(cache, batch_size=4, shuffle=True, num_threads=3, output="numpy")
    for batch in loader:
        for row, index in enumerate(loader.last_indices):
            seen[cache.key(index)] = batch["head"][row].tolist()
    assert seen == {str(p): expected_head(p) for p in paths}


def test_touching_or_rewriting_a_source_makes_its_entry_stale(tmp_path):
    paths = write_inputs(tmp_path / "in", 6)
    source = ll.FileSource(str(tmp_path / "in" / "*.bin"))
    cache = ll.TensorCache(tmp_path / "cache", output="numpy")
    cache.build(source, encode=encode_files, batch_size=4, progress=False)

    stat = os.stat(paths[1])
    os.utime(paths[1], ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # touch
    paths[4].write_bytes(b"\x07" * 64)  # rewrite (same size)
    stale = {p["where"].split(" key ")[-1] for p in cache.verify() if p["kind"] == "stale"}
    assert stale == {str(paths[1]), str(paths[4])}

    rebuilt = []

    def encode(batch):
        rebuilt.extend(bytes(d[:4].numpy()).hex() for d in batch["data"])
        return encode_files(batch)

    source = ll.FileSource(str(tmp_path / "in" / "*.bin"))
    stats = cache.build(source, encode=encode, batch_size=4, progress=False)
    assert stats["built"] == 2 and stats["fresh"] == 4
    assert cache[str(paths[4])]["head"].tolist() == [7, 7, 7, 7]
    assert cache.verify() == []
    assert len(cache) == 6

    # Another encode configuration makes every entry stale.
    stats = cache.build(source, encode=encode_files, config={"scale": 2}, progress=False)
    assert stats["built"] == 6
    assert (
        cache.build(source, encode=encode_files, config={"scale": 2}, progress=False)["built"] == 0
    )


def test_content_hash_ignores_a_touch_but_not_an_edit(tmp_path):
    paths = write_inputs(tmp_path / "in", 3)
    source = ll.FileSource(str(tmp_path / "in" / "*.bin"))
    cache = ll.TensorCache(tmp_path / "cache")
    cache.build(source, encode=encode_files, content_hash=True, progress=False)
    assert cache.manifest()["entries"][0]["fingerprint"]["content_hash"].startswith("xxh64:")
    os.utime(paths[0], ns=(0, 12345))
    assert cache.build(source, encode=encode_files, content_hash=True, progress=False)["built"] == 0
    paths[0].write_bytes(b"\x01" * 64)
    assert cache.build(source, encode=encode_files, content_hash=True, progress=False)["built"] == 1


def test_build_from_an_iterable_of_dicts_and_bad_encoders(tmp_path):
    items = [{"key": f"s{i}", "value": i} for i in range(10)]

    def encode(batch):
        return {"x": np.array([[v, v * 2] for v in batch["value"]], dtype=np.float32)}

    cache = ll.TensorCache(tmp_path / "cache", output="numpy", shard_bytes=64)
    assert cache.build(items, encode=encode, batch_size=3, progress=False)["built"] == 10
    assert cache["s7"]["x"].tolist() == [7.0, 14.0]

    def wrong_rows(batch):
        return {"x": np.zeros((1, 2), dtype=np.float32)}

    with pytest.raises(ValueError, match="rows"):
        cache.build([{"key": "t0"}, {"key": "t1"}], encode=wrong_rows, progress=False)

    # An encoder that fails part-way keeps what it encoded before.
    def failing(batch):
        if "u6" in batch["key"]:
            raise RuntimeError("model exploded")
        return {"x": np.zeros((len(batch["key"]), 2), dtype=np.float32)}

    with pytest.raises(RuntimeError):
        cache.build([{"key": f"u{i}"} for i in range(9)], encode=failing, batch_size=3,
                    progress=False)  # fmt: skip
    assert "u5" in cache and "u6" not in cache
    assert cache.verify() == []


def test_a_cache_opened_by_a_relative_path_stays_that_cache_after_a_chdir(tmp_path, monkeypatch):
    """Shards are mapped when first read: a later os.chdir() must not make
    them another directory's cache of the same name (as an open h5py.File
    stays the file it opened)."""
    items = [{"key": f"s{i}"} for i in range(6)]
    for name, value in (("a", 1.0), ("b", 2.0)):
        (tmp_path / name).mkdir()
        monkeypatch.chdir(tmp_path / name)

        def encode(batch, value=value):
            return {"x": np.full((len(batch["key"]), 3), value, dtype=np.float32)}

        ll.TensorCache("cache", shard_bytes=64).build(items, encode=encode, progress=False)
    monkeypatch.chdir(tmp_path / "a")
    cache = ll.TensorCache("cache", output="numpy")
    assert cache.path == str(tmp_path / "a" / "cache")
    monkeypatch.chdir(tmp_path / "b")
    assert {float(cache[f"s{i}"]["x"][0]) for i in range(6)} == {1.0}
    batches = ll.Loader(cache, batch_size=6, output="numpy")
    assert {float(v) for batch in batches for v in batch["x"].ravel()} == {1.0}


def test_entries_are_zero_copy_views_of_the_shard(tmp_path):
    cache = ll.TensorCache(tmp_path / "cache", output="numpy")
    items = [{"key": f"k{i}"} for i in range(4)]
    cache.build(items, encode=lambda b: {"x": np.ones((len(b["key"]), 1024), np.float32)},
                progress=False)  # fmt: skip
    a, b = cache["k1"]["x"], cache["k2"]["x"]
    assert not a.flags.owndata
    # Both views point into one mapping: their addresses are 4 KiB apart.
    distance = abs(b.__array_interface__["data"][0] - a.__array_interface__["data"][0])
    assert distance == 4096


def test_reads_a_folder_of_per_sample_files_written_by_the_reference(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    folder = tmp_path / "_latent_cache"
    folder.mkdir()
    for i in range(5):
        save_file({"latent": torch.full((4, 8, 8), float(i), dtype=torch.float16)},
                  str(folder / f"img{i}_abc.safetensors"), metadata={"format": "pt"})  # fmt: skip
    cache = ll.TensorCache(folder)
    assert cache.layout == "per-sample"
    assert cache.keys() == [f"img{i}_abc" for i in range(5)]
    assert cache["img3_abc"]["latent"].dtype == torch.float16
    batches = list(ll.Loader(cache, batch_size=5, output="torch"))
    assert batches[0]["latent"].shape == (5, 4, 8, 8)
    assert batches[0]["latent"][:, 0, 0, 0].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    # A file cut short (a trainer killed mid-write) is named, never loaded.
    data = (folder / "img2_abc.safetensors").read_bytes()
    (folder / "img2_abc.safetensors").write_bytes(data[:-10])
    problems = ll.TensorCache(folder).verify()
    assert [p["kind"] for p in problems] == ["invalid"]
    assert "img2_abc.safetensors" in problems[0]["where"]
    with pytest.raises(ll.FormatError, match="img2_abc"):
        list(ll.Loader(ll.TensorCache(folder), batch_size=5))


def test_shards_are_valid_for_the_reference_reader(tmp_path):
    from safetensors.numpy import load_file

    cache = ll.TensorCache(tmp_path / "cache", output="numpy")
    cache.build([{"key": "a", "v": 3}, {"key": "b", "v": 4}],
                encode=lambda b: {"x": np.array([[v] * 3 for v in b["v"]], np.int64)},
                progress=False)  # fmt: skip
    shard = cache.shard_path(0)
    loaded = load_file(shard)
    assert sorted(loaded) == ["0/x", "1/x"]
    assert loaded["1/x"].tolist() == [4, 4, 4]


# -- sharing: four processes, eight threads each -------------------------------

_READER = textwrap.dedent(
    """
    import json, os, sys
    import leanloader as ll
    from leanloader import _core

    def cache_mappings(directory):
        rss = pss = 0
        current = None
        with open("/proc/self/smaps") as smaps:
            for line in smaps:
                fields = line.split()
                if fields and "-" in fields[0] and len(fields) >= 5:
                    current = fields[-1] if len(fields) >= 6 else ""
                elif current and current.startswith(directory):
                    if fields[0] == "Rss:":
                        rss += int(fields[1]) * 1024
                    elif fields[0] == "Pss:":
                        pss += int(fields[1]) * 1024
        return rss, pss

    directory = sys.argv[1]
    cache = ll.TensorCache(directory, output="numpy")
    before = _core.process_tree_memory(os.getpid())["unreclaimable_bytes"]
    loader = ll.Loader(cache, batch_size=4, shuffle=True, num_threads=8, output="numpy")
    total = 0
    for epoch in range(2):
        for batch in loader:
            total += int(batch["x"][:, 0].sum())
    after = _core.process_tree_memory(os.getpid())["unreclaimable_bytes"]
    # Zero-copy views of every entry: the mapping's pages are touched here.
    touched = sum(float(cache[i]["x"][::1024].sum()) for i in range(len(cache)))
    rss, pss = cache_mappings(directory)
    print(json.dumps({"delta": after - before, "bill": loader.memory_bill(), "total": total,
                      "touched": touched, "cache_rss": rss}), flush=True)
    sys.stdin.readline()  # stay alive (and mapped) until the parent has measured
    """
)


def _cache_pss(pid, directory):
    """Pss and Rss of the mappings of files under `directory` in process `pid`."""
    rss = pss = 0
    current = ""
    with open(f"/proc/{pid}/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if fields and "-" in fields[0] and len(fields) >= 5:
                current = fields[-1] if len(fields) >= 6 else ""
            elif current.startswith(directory):
                if fields[0] == "Rss:":
                    rss += int(fields[1]) * 1024
                elif fields[0] == "Pss:":
                    pss += int(fields[1]) * 1024
    return rss, pss


def test_four_processes_share_one_mapped_cache(tmp_path):
    samples, values = 96, 1 << 18  # 1 MiB per sample, 96 MiB in all
    directory = str(tmp_path / "cache")
    cache = ll.TensorCache(directory, shard_bytes=8 << 20, output="numpy")
    cache.build(
        [{"key": f"k{i:02d}", "i": i} for i in range(samples)],
        encode=lambda b: {"x": np.stack([np.full(values, i, np.float32) for i in b["i"]])},
        batch_size=8,
        progress=False,
    )
    del cache
    cache_bytes = sum(
        os.path.getsize(os.path.join(directory, n))
        for n in os.listdir(directory)
        if n.endswith(".safetensors")
    )
    readers = [
        subprocess.Popen(
            [sys.executable, "-c", _READER, directory],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    try:
        reports = [json.loads(r.stdout.readline()) for r in readers]
        mapped = [_cache_pss(r.pid, directory) for r in readers]
    finally:
        for r in readers:
            r.stdin.close()
            r.wait(timeout=60)
    expected_total = 2 * sum(range(samples))
    assert all(report["total"] == expected_total for report in reports)
    rss_sum = sum(rss for rss, _ in mapped)
    pss_sum = sum(pss for _, pss in mapped)
    # The mapped file is counted once: its PSS over all readers is the file,
    # while RSS counts it in every process (the false alarm of pain A2).
    assert pss_sum <= cache_bytes * 1.05 + (1 << 20), (pss_sum, cache_bytes)
    assert rss_sum >= 3 * cache_bytes, (rss_sum, cache_bytes)
    # Unreclaimable memory added by each reader stays near its batch slots.
    delta_sum = sum(report["delta"] for report in reports)
    bill_sum = sum(report["bill"] for report in reports)
    print(f"sharing: cache {cache_bytes >> 20} MiB, readers' PSS of it {pss_sum >> 20} MiB, "
          f"RSS {rss_sum >> 20} MiB; unreclaimable added {delta_sum >> 20} MiB for "
          f"{bill_sum >> 20} MiB of batch slots")  # fmt: skip
    assert delta_sum <= bill_sum + 4 * (16 << 20), (delta_sum, bill_sum)
    assert delta_sum < cache_bytes


# -- torch.distributed: two ranks, gloo on the loopback -------------------------

_RANK = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import torch.distributed as dist
    import leanloader as ll

    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[2],
                            rank=int(sys.argv[3]), world_size=2)
    source = ll.ArraySource({"v": np.arange(30, dtype=np.int64)})
    cache = ll.TensorCache(sys.argv[1], shard_bytes=64, output="numpy")
    stats = cache.build(source, encode=lambda b: {"sq": b["v"] * b["v"]}, batch_size=4,
                        progress=False)
    print(json.dumps({"stats": stats, "len": len(cache)}), flush=True)
    dist.destroy_process_group()
    """
)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_distributed_ranks_build_disjoint_parts_and_merge(tmp_path):
    pytest.importorskip("torch.distributed")
    directory = str(tmp_path / "cache")
    port = str(_free_port())
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", _RANK, directory, port, str(r)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    outputs = [r.communicate(timeout=120) for r in ranks]
    for r, (_out, err) in zip(ranks, outputs, strict=True):
        assert r.returncode == 0, err
    reports = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert [rep["stats"]["built"] for rep in reports] == [15, 15]
    assert all(rep["len"] == 30 for rep in reports)
    assert not [n for n in os.listdir(directory) if n.startswith("manifest.rank")]
    names = [n for n in os.listdir(directory) if n.startswith("shard-")]
    assert any(n.startswith("shard-r0-") for n in names)
    assert any(n.startswith("shard-r1-") for n in names)
    cache = ll.TensorCache(directory, output="numpy")
    assert sorted(cache.keys()) == sorted(f"row {i}" for i in range(30))
    assert all(cache[f"row {i}"]["sq"].tolist() == i * i for i in range(30))
    assert cache.verify() == []


def test_a_second_reader_waits_for_no_one(tmp_path):
    """Opening a cache that another process is reading neither blocks nor
    removes anything."""
    cache = ll.TensorCache(tmp_path / "c", output="numpy")
    cache.build([{"key": "a"}], encode=lambda b: {"x": np.zeros((1, 2), np.float32)},
                progress=False)  # fmt: skip
    start = time.monotonic()
    other = ll.TensorCache(tmp_path / "c")
    assert time.monotonic() - start < 5
    assert other.removed_on_open == []
    assert len(other) == 1


def test_a_copy_opened_before_its_manifest_arrived_keeps_its_shards(tmp_path):
    """Shards copied first, manifest.json last (as a copy in name order does):
    an open in between sees an empty cache and deletes nothing; they used to
    be deleted as leftovers of a crashed build, losing the whole copy."""
    original = ll.TensorCache(tmp_path / "original", output="numpy", shard_bytes=4096)
    original.build(
        [{"key": f"k{i}"} for i in range(20)],
        encode=lambda b: {"x": np.full((len(b["key"]), 256), 7, np.float32)},
        progress=False,
    )
    copy = tmp_path / "copy"
    copy.mkdir()
    shards = sorted(n for n in os.listdir(original.path) if n.startswith("shard-"))
    assert len(shards) > 1
    for name in shards:
        (copy / name).write_bytes((Path(original.path) / name).read_bytes())
    verify = subprocess.run(
        [sys.executable, "-m", "leanloader.cli", "cache", "verify", str(copy)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert verify.returncode == 1, verify.stdout
    assert verify.stdout.count("unreferenced: ") == len(shards), verify.stdout
    early = ll.TensorCache(copy)
    assert len(early) == 0 and early.removed_on_open == []
    del early
    (copy / "manifest.json").write_bytes((Path(original.path) / "manifest.json").read_bytes())
    complete = ll.TensorCache(copy, output="numpy")
    assert sorted(complete.keys()) == sorted(original.keys())
    for key in original.keys():
        assert np.array_equal(complete[key]["x"], original[key]["x"])
    assert complete.verify(include_garbage=True) == []


BUILDER = """
import sys, time
import numpy as np
import leanloader as ll

directory, tag = sys.argv[1], sys.argv[2]

def encode(batch):
    time.sleep(0.005)  # builds interleave: each publishes many times
    return {"x": np.array([[float(k.split("-")[1])] * 4 for k in batch["key"]], np.float32)}

cache = ll.TensorCache(directory, shard_bytes=256, output="numpy")
print(cache.build([{"key": f"{tag}-{i}"} for i in range(120)], encode=encode, batch_size=4,
                  progress=False)["built"])
"""


def test_two_processes_building_one_cache_keep_each_others_entries(tmp_path):
    """Each publish merges into manifest.json as it is on disk, one writer at
    a time: a writer's copy read at its start, written back whole, had
    dropped every entry the other published meanwhile."""
    directory = tmp_path / "cache"
    ll.TensorCache(directory)
    command = [sys.executable, "-c", BUILDER, str(directory)]
    builders = [
        subprocess.Popen([*command, tag], stdout=subprocess.PIPE, text=True) for tag in ("a", "b")
    ]
    assert [b.communicate(timeout=120)[0].strip() for b in builders] == ["120", "120"]
    cache = ll.TensorCache(directory, output="numpy")
    assert sorted(cache.keys()) == sorted(f"{t}-{i}" for t in "ab" for i in range(120))
    assert all(cache[key]["x"][0] == float(key.split("-")[1]) for key in cache.keys())
    assert cache.verify() == []
