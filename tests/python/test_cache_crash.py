"""Crash safety: a cache builder killed with SIGKILL at many moments leaves a
cache whose readers see complete entries only, that verifies clean once
reopened, and that a re-run completes."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np

import leanloader as ll

SAMPLES = 300
VALUES = 16

# Builds the cache of SAMPLES rows with tiny shards (2 samples each), so that a
# shard and a manifest are published every other sample. Row i encodes to
# i * 1000 + arange(VALUES). Prints "started" once the build begins.
_BUILDER = textwrap.dedent(
    f"""
    import sys
    import time
    import numpy as np
    import leanloader as ll

    source = ll.ArraySource({{"i": np.arange({SAMPLES}, dtype=np.int64)}})
    cache = ll.TensorCache(sys.argv[1], shard_bytes=2 * {VALUES} * 8, output="numpy")

    def encode(batch):
        time.sleep(0.015)  # a model takes time: kills land all through the build
        return {{"x": batch["i"][:, None] * 1000 + np.arange({VALUES}, dtype=np.int64)}}

    print("started", flush=True)
    cache.build(source, encode=encode, batch_size=3, progress=False, num_threads=2,
                output="numpy")
    print("done", flush=True)
    """
)


def expected(key):
    row = int(key.split()[-1])
    return (row * 1000 + np.arange(VALUES)).tolist()


def check_cache(directory):
    """Reopens the cache as a new user would, and checks every entry it shows."""
    cache = ll.TensorCache(directory, output="numpy")
    assert cache.verify() == [], cache.verify()
    leftovers = [n for n in os.listdir(directory) if ".tmp." in n]
    assert leftovers == []
    for key in cache.keys():
        assert cache[key]["x"].tolist() == expected(key), key
    if len(cache):
        rows = sum(len(b["x"]) for b in ll.Loader(cache, batch_size=8, output="numpy"))
        assert rows == len(cache)
    return len(cache)


def test_sigkill_at_many_points_never_leaves_a_partial_entry(tmp_path):
    directory = str(tmp_path / "cache")
    rng = random.Random(1234)
    counts = []
    kills = 0
    for _ in range(30):
        builder = subprocess.Popen(
            [sys.executable, "-c", _BUILDER, directory],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert builder.stdout.readline().strip() == "started"
        time.sleep(rng.uniform(0.0, 0.12))
        builder.send_signal(signal.SIGKILL)
        builder.wait(timeout=30)
        kills += builder.returncode == -signal.SIGKILL
        counts.append(check_cache(directory))
        if counts[-1] == SAMPLES:
            break
    print("entries after each kill:", counts)
    # The builder really was killed mid-build, and progress survived the kills.
    assert kills >= 3, counts
    assert any(0 < count < SAMPLES for count in counts), counts
    assert counts == sorted(counts), counts

    # A final, uninterrupted run completes the cache.
    builder = subprocess.run(
        [sys.executable, "-c", _BUILDER, directory], capture_output=True, text=True, timeout=120
    )
    assert builder.returncode == 0, builder.stderr
    assert check_cache(directory) == SAMPLES
    names = os.listdir(directory)
    assert not [n for n in names if ".tmp." in n or n.startswith("manifest.rank")]
    # Every shard a killed builder left behind was marked as its own: an open
    # alone removes them all, and nothing is left unreferenced.
    assert ll.TensorCache(directory).verify(include_garbage=True) == []
    assert not [n for n in os.listdir(directory) if n.endswith(".discardable")]
