"""`leanloader cache inspect|verify|build`, run as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import leanloader as ll

ENCODER = textwrap.dedent(
    """
    import numpy as np

    def encode(batch):
        data = batch["data"]
        return {
            "latent": np.stack([np.full((2, 3), float(d[0]), np.float16) for d in data]),
            "length": np.array([[len(d)] for d in data], np.int64),
        }
    """
)


def cli(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "leanloader.cli", "cache", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def make_project(tmp_path, count=5):
    (tmp_path / "in").mkdir()
    for i in range(count):
        (tmp_path / "in" / f"f{i}.bin").write_bytes(bytes([i + 1]) * (10 + i))
    (tmp_path / "my_encoder.py").write_text(ENCODER)


def test_build_then_inspect_and_verify(tmp_path):
    make_project(tmp_path)
    built = cli("build", "--source", "in/*.bin", "--encode", "my_encoder:encode", "--out",
                "cache", "--no-progress", "--batch-size", "2", "--shard-bytes", "40",
                cwd=tmp_path)  # fmt: skip
    assert built.returncode == 0, built.stderr
    assert "built 5" in built.stdout
    again = cli("build", "--source", "in/*.bin", "--encode", "my_encoder:encode", "--out",
                "cache", "--no-progress", cwd=tmp_path)  # fmt: skip
    assert "built 0, already fresh 5" in again.stdout

    inspected = cli("inspect", "cache", "--limit", "0", cwd=tmp_path)
    assert inspected.returncode == 0, inspected.stderr
    out = inspected.stdout
    assert "sharded cache, 5 entries" in out
    assert "latent" in out and "F16" in out and "[2, 3]" in out
    assert "length" in out and "I64" in out
    assert "in/f3.bin" in out and "mtime_ns=" in out

    shard = sorted(n for n in os.listdir(tmp_path / "cache") if n.startswith("shard-"))[0]
    one_file = cli("inspect", f"cache/{shard}", cwd=tmp_path)
    assert one_file.returncode == 0, one_file.stderr
    assert "per-sample cache, 1 entries" in one_file.stdout
    assert "0/latent" in one_file.stdout

    verified = cli("verify", "cache", cwd=tmp_path)
    assert verified.returncode == 0, verified.stdout
    assert "5 entries, OK" in verified.stdout


def test_verify_names_stale_invalid_and_partial_files(tmp_path):
    make_project(tmp_path)
    cli("build", "--source", "in/*.bin", "--encode", "my_encoder:encode", "--out", "cache",
        "--no-progress", "--batch-size", "2", "--shard-bytes", "40", cwd=tmp_path)  # fmt: skip
    (tmp_path / "in" / "f2.bin").write_bytes(b"changed!!!!!!")
    stale = cli("verify", "cache", cwd=tmp_path)
    assert stale.returncode == 1
    assert "stale:" in stale.stdout and "in/f2.bin" in stale.stdout

    cache = tmp_path / "cache"
    shard = sorted(n for n in os.listdir(cache) if n.startswith("shard-"))[0]
    with open(cache / shard, "r+b") as file:
        file.truncate(os.path.getsize(cache / shard) - 3)
    (cache / "manifest.json.tmp.99.abcdef").write_text("{")
    broken = cli("verify", "cache", "--no-sources", cwd=tmp_path)
    assert broken.returncode == 1
    lines = broken.stdout.splitlines()
    assert any(line.startswith("invalid:") and shard in line for line in lines), broken.stdout
    assert any(line.startswith("partial:") and ".tmp." in line for line in lines), broken.stdout
    assert not any(line.startswith("stale:") for line in lines)

    missing = cli("verify", "nowhere", cwd=tmp_path)
    assert missing.returncode == 1


def test_verify_data_finds_a_flipped_byte_the_file_structure_hides(tmp_path):
    """A byte changed on disk inside a tensor still reads as valid
    safetensors with other values: `verify` reported the cache OK. With
    --data (``check_data=True``) every tensor is hashed against the XXH64
    written with it, and the entry is named."""
    make_project(tmp_path)
    cli("build", "--source", "in/*.bin", "--encode", "my_encoder:encode", "--out", "cache",
        "--no-progress", "--batch-size", "2", "--shard-bytes", "40", cwd=tmp_path)  # fmt: skip
    assert cli("verify", "cache", "--data", cwd=tmp_path).returncode == 0
    manifest = json.loads((tmp_path / "cache" / "manifest.json").read_text())
    entry = next(e for e in manifest["entries"] if e["key"].endswith("f3.bin"))
    latent = next(t for t in entry["tensors"] if t["name"] == "latent")
    assert latent["checksum"].startswith("xxh64:")
    shard = tmp_path / "cache" / manifest["shards"][entry["shard"]]["file"]
    with open(shard, "r+b") as file:
        file.seek(latent["offset"] + 1)
        byte = file.read(1)
        file.seek(latent["offset"] + 1)
        file.write(bytes([byte[0] ^ 0x10]))
    assert cli("verify", "cache", cwd=tmp_path).returncode == 0  # the structure is intact
    found = cli("verify", "cache", "--data", cwd=tmp_path)
    assert found.returncode == 1
    lines = [line for line in found.stdout.splitlines() if line.startswith("corrupt:")]
    assert len(lines) == 1 and "f3.bin" in lines[0] and "tensor 'latent'" in lines[0], found.stdout
    problems = ll.TensorCache(tmp_path / "cache").verify(check_sources=False, check_data=True)
    assert [p["kind"] for p in problems] == ["corrupt"]


def test_sources_given_relative_are_told_apart_across_working_directories(tmp_path):
    """Keys and source paths given relative ("in/f0.bin") were fingerprinted
    as given: a build from a second copy of the dataset (other bytes, the
    same sizes and mtimes, as rsync -a or tar leave them) found every entry
    fresh and kept the first copy's values."""
    for copy, first_byte in (("a", 1), ("b", 100)):
        (tmp_path / copy).mkdir()
        make_project(tmp_path / copy)
        for i in range(5):
            (tmp_path / copy / "in" / f"f{i}.bin").write_bytes(bytes([first_byte + i]) * (10 + i))
    for i in range(5):
        stat = os.stat(tmp_path / "a" / "in" / f"f{i}.bin")
        os.utime(tmp_path / "b" / "in" / f"f{i}.bin", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    cache = str(tmp_path / "cache")
    for copy in ("a", "b"):
        built = cli("build", "--source", "in/*.bin", "--encode", "my_encoder:encode", "--out",
                    cache, "--no-progress", cwd=tmp_path / copy)  # fmt: skip
        assert built.returncode == 0, built.stderr
        assert "built 5" in built.stdout, (copy, built.stdout)
    opened = ll.TensorCache(cache)
    first_bytes = sorted(int(opened[key]["latent"][0, 0]) for key in opened.keys())
    assert first_bytes == [100, 101, 102, 103, 104]  # the second copy's
    again = cli("build", "--source", "in/*.bin", "--encode", "my_encoder:encode", "--out",
                cache, "--no-progress", cwd=tmp_path / "b")  # fmt: skip
    assert "built 0, already fresh 5" in again.stdout
    assert cli("verify", cache, cwd=tmp_path / "b").returncode == 0


def test_verify_a_per_sample_folder(tmp_path):
    import numpy as np
    from safetensors.numpy import save_file

    folder = tmp_path / "_latent_cache"
    folder.mkdir()
    for i in range(3):
        save_file({"latent": np.zeros((4, 4), np.float32) + i}, str(folder / f"a{i}.safetensors"))
    assert cli("verify", str(folder), cwd=tmp_path).returncode == 0
    data = (folder / "a1.safetensors").read_bytes()
    (folder / "a1.safetensors").write_bytes(data[:-1])
    result = cli("verify", str(folder), cwd=tmp_path)
    assert result.returncode == 1
    assert "a1.safetensors" in result.stdout and "MetadataIncompleteBuffer" in result.stdout
