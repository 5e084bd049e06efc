"""Rank sharding and resumable state of ll.Loader: exactly once across ranks,
resume in a fresh process, elastic world-size changes, torchrun (gloo on the
loopback) with the process group destroyed mid-epoch."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import leanloader as ll

SIZE = 103  # divisible by neither 2, 3 nor the batch size
BATCH = 4


def write_npy(directory):
    path = directory / "ids.npy"
    np.save(path, np.arange(SIZE, dtype=np.int64))
    return path


def build_cache(directory):
    cache = ll.TensorCache(directory / "cache", shard_bytes=256, output="numpy")
    cache.build(
        ll.ArraySource({"v": np.arange(SIZE, dtype=np.int64)}),
        encode=lambda b: {"id": b["v"]},
        batch_size=16,
        progress=False,
    )
    return directory / "cache"


def open_source(kind, directory):
    if kind == "npy":
        return ll.NpySource({"id": str(directory / "ids.npy")})
    return ll.TensorCache(directory / "cache", output="numpy")


@pytest.fixture
def data(tmp_path):
    write_npy(tmp_path)
    build_cache(tmp_path)
    return tmp_path


def batches(loader, count=None):
    out = []
    for batch in loader:
        out.append(np.asarray(batch["id"]).reshape(-1).tolist())
        if count is not None and len(out) == count:
            break
    return out


def loader(source, **kw):
    kw.setdefault("batch_size", BATCH)
    kw.setdefault("shuffle", True)
    kw.setdefault("seed", 11)
    return ll.Loader(source, output="numpy", num_threads=2, **kw)


@pytest.mark.parametrize("kind", ["npy", "cache"])
@pytest.mark.parametrize("drop_last", [False, True])
def test_three_ranks_take_each_sample_once(data, kind, drop_last):
    ranks = [
        batches(loader(open_source(kind, data), rank=r, world_size=3, drop_last=drop_last))
        for r in range(3)
    ]
    assert len({len(r) for r in ranks}) == 1  # every rank takes as many steps
    seen = [i for r in ranks for b in r for i in b]
    if drop_last:
        # 25 full batches trimmed to 24 (a multiple of 3): 96 samples, none twice
        assert len(seen) == 96 and len(set(seen)) == 96
        assert all(len(b) == BATCH for r in ranks for b in r)
    else:
        # 26 batches (the last has 3 rows) padded to 27 with a wrapped one
        assert set(seen) == set(range(SIZE))
        assert len(seen) == SIZE + BATCH
    # global batch k is the same samples as in a single process
    single = batches(loader(open_source(kind, data), rank=0, world_size=1, drop_last=drop_last))
    for k, batch in enumerate(single[: 3 * len(ranks[0])]):
        assert ranks[k % 3][k // 3] == batch


def test_rank_and_world_size_from_the_environment(data, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    ranked = loader(open_source("npy", data))
    assert (ranked.rank, ranked.world_size) == (1, 2)
    assert len(ranked) == 13
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    alone = loader(open_source("npy", data))
    assert (alone.rank, alone.world_size) == (0, 1)
    assert len(alone) == 26
    with pytest.raises(ValueError, match="outside world_size"):
        loader(open_source("npy", data), rank=2, world_size=2)
    with pytest.raises(ValueError, match="world_size must be at least 1"):
        loader(open_source("npy", data), rank=0, world_size=0)


def test_an_initialised_process_group_wins_over_the_environment(data, monkeypatch):
    dist = pytest.importorskip("torch.distributed")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        grouped = loader(open_source("npy", data))
        assert (grouped.rank, grouped.world_size) == (0, 1)
        with pytest.raises(ValueError, match="outside world_size 1"):
            loader(open_source("npy", data), rank=1)  # world_size from the group
    finally:
        dist.destroy_process_group()


_RESUME = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import leanloader as ll

    directory, kind, states = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    results = []
    for state in states:
        source = (ll.NpySource({"id": directory + "/ids.npy"}) if kind == "npy"
                  else ll.TensorCache(directory + "/cache", output="numpy"))
        loader = ll.Loader(source, batch_size=4, shuffle=True, seed=11, output="numpy",
                           rank=0, world_size=1)
        loader.load_state_dict(state)
        loader.set_epoch(state["epoch"])  # as a training loop does: keeps the position
        results.append([np.asarray(b["id"]).tolist() for b in loader])
    print(json.dumps(results))
    """
)


@pytest.mark.parametrize("kind", ["npy", "cache"])
def test_resume_in_a_fresh_process_gives_the_rest_of_the_epoch(data, kind):
    reference = loader(open_source(kind, data))
    reference.set_epoch(4)
    whole = batches(reference)
    stops = [0, 1, 7, len(whole) - 1, len(whole)]
    states = []
    for k in stops:
        first = loader(open_source(kind, data))
        first.set_epoch(4)
        if k:
            assert batches(first, k) == whole[:k]
        state = first.state_dict()
        json.dumps(state)  # plain data
        states.append(state)
    assert [s["samples_consumed"] for s in states[:-1]] == [k * BATCH for k in stops[:-1]]
    assert (states[-1]["epoch"], states[-1]["samples_consumed"]) == (5, 0)  # epoch done
    out = subprocess.run(
        [sys.executable, "-c", _RESUME, str(data), kind, json.dumps(states)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    results = json.loads(out.stdout)
    for k, rest in zip(stops[:-1], results[:-1], strict=True):
        assert rest == whole[k:], k
    # resuming after the last batch starts the next epoch, a new order
    nxt = loader(open_source(kind, data))
    nxt.set_epoch(5)
    assert results[-1] == batches(nxt)


def test_elastic_resume_from_two_ranks_to_three(data):
    source = open_source("npy", data)
    whole = batches(loader(source))
    consumed = []
    for r in range(2):
        ranked = loader(source, rank=r, world_size=2)
        consumed += [i for b in batches(ranked, 5) for i in b]
        state = ranked.state_dict()
    assert state["samples_consumed"] == 2 * 5 * BATCH and state["world_size"] == 2
    rest = []
    for r in range(3):
        ranked = loader(source, rank=r, world_size=3)
        ranked.load_state_dict(state)
        rest.append(batches(ranked))
    assert len({len(r) for r in rest}) == 1
    for local in range(len(rest[0])):
        for r in range(3):
            k = 10 + 3 * local + r
            if k < len(whole):
                assert rest[r][local] == whole[k]
    real = [i for local in range(len(rest[0])) for r in range(3) if 10 + 3 * local + r < len(whole)
            for i in rest[r][local]]  # fmt: skip
    assert sorted(consumed + real) == list(range(SIZE))


def test_a_state_from_another_source_or_order_is_an_error(data):
    state = loader(open_source("npy", data)).state_dict()
    with pytest.raises(ValueError, match="another source"):
        loader(open_source("cache", data)).load_state_dict(state)
    with pytest.raises(ValueError, match="seed=11"):
        loader(open_source("npy", data), seed=12).load_state_dict(state)
    with pytest.raises(ValueError, match=r"lacks .*samples_consumed"):
        loader(open_source("npy", data)).load_state_dict({"epoch": 0})
    # Values a state_dict() never writes: named, not truncated or taken as truthy
    # (a negative count raised the binding's signature; 1.7 was epoch 1,
    # "false" was shuffle=True, batch_size=0 was taken).
    for key, value, said in (
        ("samples_consumed", -4, "samples_consumed = -4 is out of range"),
        ("epoch", 1.7, "epoch must be an int, got float 1.7"),
        ("shuffle", "false", "shuffle must be a bool, got str 'false'"),
        ("batch_size", 0, "batch_size = 0 is out of range"),
        ("world_size", 0, "world_size = 0 is out of range"),
    ):
        with pytest.raises(ValueError, match=re.escape(f"malformed loader state: {said}")):
            loader(open_source("npy", data)).load_state_dict({**state, key: value})
    numpy_typed = {**state, "epoch": np.int64(0), "shuffle": np.bool_(state["shuffle"])}
    loader(open_source("npy", data)).load_state_dict(numpy_typed)
    assert ll.Loader(open_source("npy", data), rank=np.int64(1), world_size=np.int32(2))


def test_state_size_is_independent_of_the_dataset_and_restore_is_fast(data):
    small = loader(ll.ArraySource({"id": np.arange(1000, dtype=np.int64)}), batch_size=8)
    huge_array = np.broadcast_to(np.int64(0), (10**9,))  # 10^9 samples, 8 bytes of data
    huge = loader(ll.ArraySource({"id": huge_array}), batch_size=8)
    batches(huge, 3)
    state = huge.state_dict()
    assert state["num_samples"] == 10**9 and state["samples_consumed"] == 24
    size_small = len(json.dumps(small.state_dict()))
    size_huge = len(json.dumps(state))
    assert size_huge - size_small <= 12  # only the digits of the numbers grow
    fresh = loader(ll.ArraySource({"id": huge_array}), batch_size=8)
    start = time.perf_counter()
    for _ in range(100):
        fresh.load_state_dict(state)
    per_restore = (time.perf_counter() - start) / 100
    assert per_restore < 1e-3, per_restore
    assert fresh.state_dict()["samples_consumed"] == 24


_TORCHRUN = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    import torch.distributed as dist
    import leanloader as ll

    directory = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    out = {}
    for kind in ("npy", "cache"):
        source = (ll.NpySource({"id": directory + "/ids.npy"}) if kind == "npy"
                  else ll.TensorCache(directory + "/cache", output="numpy"))
        loader = ll.Loader(source, batch_size=4, shuffle=True, seed=11, output="numpy")
        assert (loader.rank, loader.world_size) == (rank, 2)
        got = []
        for batch in loader:
            got.append(np.asarray(batch["id"]).tolist())
            if kind == "npy" and len(got) == 5:
                out["state"] = loader.state_dict()
            if kind == "cache" and len(got) == 1:
                dist.destroy_process_group()  # no communication after construction
        out[kind] = got
    with open(os.path.join(directory, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    """
)


def test_torchrun_two_ranks_over_npy_and_cache(data):
    pytest.importorskip("torch.distributed")
    script = data / "ranks.py"
    script.write_text(_TORCHRUN)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(script), str(data)],
        capture_output=True, text=True, timeout=180, env=env,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    ranks = [json.loads((data / f"rank{r}.json").read_text()) for r in range(2)]
    for kind in ("npy", "cache"):
        per_rank = [[i for b in rank[kind] for i in b] for rank in ranks]
        assert len(ranks[0][kind]) == len(ranks[1][kind]) == 13
        # 26 global batches: no padding needed, so the ranks are disjoint
        assert not set(per_rank[0]) & set(per_rank[1])
        assert sorted(per_rank[0] + per_rank[1]) == list(range(SIZE))
    # the state saved by both ranks after 5 steps is the same global position;
    # three ranks continue it (elastic 2 -> 3) and finish the epoch exactly once
    state = ranks[0]["state"]
    assert state == ranks[1]["state"] and state["samples_consumed"] == 40
    consumed = [i for rank in ranks for b in rank["npy"][:5] for i in b]
    rest = []
    for r in range(3):
        ranked = loader(open_source("npy", data), rank=r, world_size=3)
        ranked.load_state_dict(state)
        rest.append([i for b in batches(ranked) for i in b])
    remaining = SIZE - 40  # 63 samples: 16 batches, padded to 18
    assert sorted(set(consumed) | {i for r in rest for i in r}) == list(range(SIZE))
    assert len(consumed) + sum(map(len, rest)) == SIZE + 2 * BATCH
    assert remaining == sum(map(len, rest)) - 2 * BATCH


def test_a_pass_left_early_is_what_its_state_resumes_and_not_what_iterating_again_gives():
    """After a `break`, state_dict() still locates the rest of the pass (what
    a restart from the checkpoint gives: the "stop at max_steps, save, exit"
    loop), while iterating the same loader again starts its next epoch, as
    a new pass over torch's DataLoader does; loading its own state first
    continues the pass in this process."""

    def make():
        return ll.Loader(ll.ArraySource({"id": np.arange(50)}), batch_size=5, shuffle=True,
                         seed=7, num_threads=2, output="numpy")  # fmt: skip

    def ids(loader):
        return [np.asarray(b["id"]).tolist() for b in loader]

    epochs = []
    for epoch in (0, 1):
        reference = make()
        reference.set_epoch(epoch)
        epochs.append(ids(reference))

    def left_after_three():
        loader = make()
        for taken, _ in enumerate(loader, start=1):
            if taken == 3:
                break
        return loader

    live = left_after_three()
    state = live.state_dict()
    assert (state["epoch"], state["samples_consumed"]) == (0, 15)
    assert ids(live) == epochs[1]
    resumed = make()
    resumed.load_state_dict(state)
    assert ids(resumed) == epochs[0][3:]
    same = left_after_three()
    same.load_state_dict(same.state_dict())
    assert ids(same) == epochs[0][3:]
