"""A TensorCache never changes under a running Loader: each epoch reads one
immutable snapshot, a rebuild is picked up at the next epoch (or never, when
pinned), and a snapshot's shards survive another process's clean-up."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import leanloader as ll


def build(cache, count, version="v1", offset=0.0):
    """Entries "s<i>" with x = [i + offset, i] and id = i."""
    items = [{"key": f"s{i}", "version": version, "i": i} for i in range(count)]

    def encode(batch):
        ids = np.array(batch["i"], dtype=np.int64)
        x = np.stack([ids + offset, ids]).T.astype(np.float32)
        return {"x": x, "id": ids.reshape(-1, 1)}

    return cache.build(items, encode=encode, batch_size=8, progress=False)


def run(script, timeout=120):
    """Runs `script` in a fresh interpreter (a hang or a crash fails the test
    instead of stopping pytest); returns its stdout."""
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.abspath(__file__))},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_a_cache_grown_under_a_live_shuffled_loader_reads_one_snapshot_per_epoch(tmp_path):
    # This used to hang for ever: the sampler was sized for 30 samples, the
    # epoch for 70, and positions past the Feistel domain (64) never left the
    # cycle walk. Run in a subprocess so that a hang fails after the timeout.
    out = run(
        f"""
        import collections, warnings
        import numpy as np
        import leanloader as ll
        from test_cache_snapshot import build
        cache = ll.TensorCache({str(tmp_path / "c")!r}, output="numpy", shard_bytes=256)
        build(cache, 30)
        loader = ll.Loader(cache, batch_size=4, shuffle=True, num_threads=3, output="numpy")
        print("len", len(loader))
        # Grown while an epoch is running: that epoch keeps its snapshot.
        seen = collections.Counter()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for n, batch in enumerate(loader):
                seen.update(batch["id"][:, 0].tolist())
                if n == 1:
                    build(cache, 70)
        print("epoch0", sorted(seen) == list(range(30)), max(seen.values()))
        print("len", len(loader), len(cache))
        for epoch in (1, 2, 3):
            seen = collections.Counter()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for batch in loader:
                    seen.update(batch["id"][:, 0].tolist())
            print(f"epoch{{epoch}}", sorted(seen) == list(range(70)), max(seen.values()),
                  [str(w.message) for w in caught])
        print("len", len(loader))
        """
    )
    lines = out.splitlines()
    assert lines[0] == "len 8"
    assert lines[1] == "epoch0 True 1"
    assert lines[2] == "len 8 70"  # len() changes when the next epoch starts
    assert lines[3].startswith("epoch1 True 1 [") and "from 30 to 70 samples" in lines[3]
    assert lines[4] == "epoch2 True 1 []"  # said once
    assert lines[5] == "epoch3 True 1 []"
    assert lines[6] == "len 18"


def test_a_cache_grown_by_another_process_or_object_is_followed(tmp_path):
    # Only a build through the object the loader held was followed: a cache
    # grown by another process kept its old size in the loader for ever.
    cache = ll.TensorCache(tmp_path / "c", output="numpy", shard_bytes=256)
    build(cache, 12)
    loader = ll.Loader(cache, batch_size=5, shuffle=True, output="numpy")
    assert sorted(i for b in loader for i in b["id"][:, 0].tolist()) == list(range(12))
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(ll.__file__)))
    tests = os.path.dirname(os.path.abspath(__file__))
    subprocess.run(
        [sys.executable, "-c", "import sys, leanloader as ll; from test_cache_snapshot import "
         f"build; build(ll.TensorCache({str(tmp_path / 'c')!r}, shard_bytes=256), 30)"],
        check=True, timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(
            [package_parent, tests])},
    )  # fmt: skip
    with pytest.warns(RuntimeWarning, match="from 12 to 30 samples"):
        assert sorted(i for b in loader for i in b["id"][:, 0].tolist()) == list(range(30))
    build(ll.TensorCache(tmp_path / "c", output="numpy", shard_bytes=256), 41)  # another object
    with pytest.warns(RuntimeWarning, match="from 30 to 41 samples"):
        assert sorted(i for b in loader for i in b["id"][:, 0].tolist()) == list(range(41))
    assert len(loader) == 9 and len(cache) == 41


def test_a_state_at_an_epochs_start_resumes_on_a_grown_cache(tmp_path):
    # A preempted job restarting after the cache grew could not resume at
    # all ("saved for another source"), even between epochs, where the live
    # loader would have gone on with the grown cache.
    cache = ll.TensorCache(tmp_path / "c", output="numpy", shard_bytes=256)
    build(cache, 20)
    loader = ll.Loader(cache, batch_size=4, shuffle=True, output="numpy")
    assert sum(len(b["id"]) for b in loader) == 20
    at_epoch_start = loader.state_dict()
    iterator = iter(loader)
    next(iterator)
    mid_epoch = loader.state_dict()
    del iterator
    assert (at_epoch_start["epoch"], at_epoch_start["samples_consumed"]) == (1, 0)
    build(cache, 30)
    restarted = ll.Loader(ll.TensorCache(tmp_path / "c", output="numpy"), batch_size=4,
                          shuffle=True, output="numpy")  # fmt: skip
    restarted.load_state_dict(at_epoch_start)
    assert restarted.epoch == 1
    assert sorted(i for b in restarted for i in b["id"][:, 0].tolist()) == list(range(30))
    with pytest.raises(ValueError, match="saved for another source"):
        restarted.load_state_dict(mid_epoch)  # its position names samples of 20


def test_a_pinned_loader_keeps_the_snapshot_it_was_made_with(tmp_path):
    cache = ll.TensorCache(tmp_path / "c", output="numpy", shard_bytes=256)
    build(cache, 12)
    loader = ll.Loader(cache, batch_size=5, shuffle=True, output="numpy", follow_updates=False)
    build(cache, 40)
    assert len(cache) == 40
    for _ in range(2):
        ids = sorted(i for batch in loader for i in batch["id"][:, 0].tolist())
        assert ids == list(range(12))
    assert len(loader) == 3


def test_a_second_processs_cleanup_leaves_a_live_snapshots_shards(tmp_path):
    path = tmp_path / "c"
    cache = ll.TensorCache(path, output="numpy")
    build(cache, 6, version="v1", offset=0.0)
    old_shards = sorted(p.name for p in path.glob("shard-*.safetensors"))
    loader = ll.Loader(cache, batch_size=3, output="numpy", follow_updates=False)
    # Every entry rebuilt: the old shard is referenced by no manifest now, and
    # the pinned loader has not mapped it yet.
    build(cache, 6, version="v2", offset=100.0)
    cleanup = f"""
        import leanloader as ll
        print(sorted(ll.TensorCache({str(path)!r}).removed_on_open))
    """
    assert run(cleanup).strip() == "[]"
    assert all((path / name).exists() for name in old_shards)
    x = np.concatenate([batch["x"] for batch in loader])
    assert x[:, 0].tolist() == list(range(6))  # the old snapshot's values
    assert cache["s3"]["x"].tolist() == [103.0, 3.0]
    loader.close()
    del loader, cache
    import gc

    gc.collect()
    assert eval(run(cleanup)) == old_shards
    assert not any((path / name).exists() for name in old_shards)


def test_a_cache_without_a_writable_lock_file_is_an_error(tmp_path):
    path = tmp_path / "c"
    build(ll.TensorCache(path, output="numpy"), 2)
    (path / ".lock").unlink()
    (path / ".lock").mkdir()  # cannot be opened for writing, even by root
    with pytest.raises(OSError, match=r"\.lock"):
        ll.TensorCache(path)
