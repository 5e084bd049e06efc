"""ll.DataLoader: torch parity, worker processes, shared memory, failures.

Real worker processes (spawn), real shared memory, real signals. Datasets are
module-level classes so that spawned workers can import them.
"""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import (  # noqa: E402
    BatchSampler,
    Dataset,
    IterableDataset,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
    get_worker_info,
)
from torch.utils.data._utils.collate import default_collate  # noqa: E402

import leanloader as ll  # noqa: E402
from leanloader import _core  # noqa: E402
from leanloader.dataloader import batch_template, segments  # noqa: E402
from leanloader.memory import process_tree_memory  # noqa: E402
from processes import alive, run_to_the_end, wait_gone  # noqa: E402

# --- datasets -------------------------------------------------------------------------------


class Squares(Dataset):
    def __init__(self, n: int = 23) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return {"x": np.array([i, i * i], dtype=np.float32), "i": i, "name": f"s{i}"}


class Stream(IterableDataset):
    """Shards itself over workers through get_worker_info(), as torch documents."""

    def __init__(self, n: int = 17) -> None:
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, self.n, step):
            yield torch.tensor([i, -i])


def sum_collate(batch):
    return {"total": sum(item["i"] for item in batch), "names": [item["name"] for item in batch]}


class BadSample(Exception):
    """An exception whose __init__ needs two arguments (does not round-trip pickle)."""

    def __init__(self, a: int, b: int) -> None:
        super().__init__(f"bad sample a={a} b={b}")
        self.a, self.b = a, b


class Failing(Dataset):
    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int):
        if i == 5:
            raise BadSample(1, 2)
        return i


class KeyFailing(Dataset):
    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int):
        return {"a": i}["b"] if i == 3 else i


def failing_collate(batch):
    raise ValueError(f"cannot collate {batch}")


class Slow(Dataset):
    def __init__(self, seconds: float, n: int = 64) -> None:
        self.seconds, self.n = seconds, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(self.seconds)
        return torch.full((4,), i)


class Big(Dataset):
    """Batches of 2 MiB samples."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        return torch.full((512 * 1024,), float(i))


class Features(Dataset):
    """Holds a large array, a small one, a memory-mapped one and a model."""

    def __init__(self, rows: int, cols: int, memmap_path: str | None = None) -> None:
        self.features = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols)
        self.small = np.ones(4, dtype=np.int64)
        self.mapped = np.load(memmap_path, mmap_mode="r") if memmap_path else None
        self.model = torch.nn.Linear(512, 1024)

    def __len__(self) -> int:
        return len(self.features)

    def __getitem__(self, i: int):
        row = self.features[i].copy()
        self.features[i, 0] = -1.0  # a worker's write must stay in that worker
        mapped = float(self.mapped[i].sum()) if self.mapped is not None else 0.0
        return {
            "row": row,
            "weight_sum": float(self.model.weight.detach().sum()),
            "mapped": mapped,
            "owns_features": bool(self.features.flags.writeable),
        }


def _assert_same(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_same(x, y)
    else:
        assert a == b


def _both(dataset, epochs: int = 1, seed: int = 7, **kwargs):
    """Batches of ll.DataLoader and of torch's DataLoader with the same
    arguments and generator seed, both with torch's defaults."""
    workers = kwargs.get("num_workers", 0)
    ours = ll.DataLoader(dataset, generator=torch.Generator().manual_seed(seed), **kwargs)
    theirs = torch.utils.data.DataLoader(
        dataset,
        generator=torch.Generator().manual_seed(seed),
        multiprocessing_context="fork" if workers else None,  # fast, same batches
        **kwargs,
    )
    try:
        return (
            [list(ours) for _ in range(epochs)],
            [list(theirs) for _ in range(epochs)],
        )
    finally:
        ours.close()


# --- parity ---------------------------------------------------------------------------------

PARITY = [
    pytest.param({"batch_size": 4}, id="sequential"),
    pytest.param({"batch_size": 4, "shuffle": True, "drop_last": True}, id="shuffle-drop-last"),
    pytest.param({"batch_size": 4, "shuffle": True, "num_workers": 1}, id="shuffle-1-worker"),
    pytest.param({"batch_size": 4, "shuffle": True, "num_workers": 2}, id="shuffle-2-workers"),
    pytest.param({"batch_size": 5, "drop_last": True, "num_workers": 2}, id="drop-last-2"),
    pytest.param({"batch_size": None, "num_workers": 2}, id="no-batching-2"),
    pytest.param({"batch_size": 3, "collate_fn": sum_collate, "num_workers": 2}, id="collate-2"),
]


@pytest.mark.parametrize("kwargs", PARITY)
def test_batches_match_torch(kwargs):
    ours, theirs = _both(Squares(), epochs=2, **kwargs)
    _assert_same(ours, theirs)
    assert len(ours[0]) > 0


class Mixed(Dataset):
    """Every kind of leaf torch's default_collate stacks or collates: tensors
    (0-d, bool, bfloat16, non-contiguous), NumPy arrays, numbers, strings,
    tuples (which collate to lists) and nested dicts."""

    def __len__(self) -> int:
        return 11

    def __getitem__(self, i: int):
        grid = torch.arange(12, dtype=torch.float32).reshape(3, 4) + i
        return (
            grid.t(),  # not contiguous
            torch.tensor(i % 2 == 0),
            {"half": torch.full((2,), float(i), dtype=torch.bfloat16), "n": np.float64(i / 3)},
            [np.arange(3, dtype=np.int16) * i, f"s{i}"],
            i,
        )


class MixedBatched(Mixed):
    """Mixed, fetched a batch at a time (__getitems__)."""

    def __getitems__(self, indices):
        return [self[i] for i in indices]


class MixedStream(IterableDataset):
    """Mixed as an iterable dataset, split between workers."""

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        step, first = (info.num_workers, info.id) if info else (1, 0)
        return (Mixed()[i] for i in range(first, 11, step))


@pytest.mark.parametrize("dataset", [Mixed(), MixedBatched(), MixedStream()],
                         ids=["one-at-a-time", "getitems", "iterable"])  # fmt: skip
def test_default_collate_written_into_the_slot_equals_torchs(dataset):
    # samples fetched one at a time stream into their rows; samples fetched
    # together (__getitems__, iterable datasets) are planned into them
    ours, theirs = _both(dataset, batch_size=4, num_workers=2)
    _assert_same(ours, theirs)
    samples = [Mixed()[i] for i in range(4)]
    planned = batch_template.plan_stacked(
        batch_template.UncollatedBatch(samples, default_collate), segments.torch_dtype_names()
    )
    assert planned is not None and planned[2] > 0  # rows, not a whole collate


class Ragged(Dataset):
    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int):
        return torch.zeros(i + 1)


def test_samples_default_collate_cannot_stack_raise_torchs_error():
    loader = ll.DataLoader(Ragged(), batch_size=3, num_workers=1)
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        list(loader)
    loader.close()


class CountsLiveSamples(Dataset):
    """Each sample says how many samples this process returned before it are
    still alive: torch's fetcher keeps a batch's samples in a list until the
    collate (sample k sees k), leanloader's workers write each sample into its
    rows of the batch's segment and let it go before the next."""

    def __init__(self) -> None:
        self.returned: list = []

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int):
        import weakref

        kept = sum(ref() is not None for ref in self.returned)
        row = np.full(1024, i, dtype=np.float32)
        self.returned.append(weakref.ref(row))
        return {"row": row, "alive": kept, "i": i}


def test_workers_hold_one_sample_at_a_time_while_filling_a_batch():
    ours, theirs = _both(CountsLiveSamples(), batch_size=6, num_workers=2, shuffle=True)
    for batch_ours, batch_theirs in zip(ours[0], theirs[0], strict=True):
        assert torch.equal(batch_ours["row"][:, 0], batch_ours["i"].float())
        assert torch.equal(batch_ours["row"], batch_theirs["row"])
        assert batch_ours["alive"].tolist() == [0] * 6
        assert batch_theirs["alive"].tolist() == list(range(6))  # what torch keeps


class ArrayBatches:
    """A batch sampler that yields NumPy arrays of indices: torch's fetcher
    takes any sequence it can iterate."""

    def __iter__(self):
        for start in range(0, 23, 5):
            yield np.arange(start, min(start + 5, 23))

    def __len__(self) -> int:
        return 5


def test_batches_of_numpy_index_arrays_match_torch():
    ours, theirs = _both(Squares(), batch_sampler=ArrayBatches(), num_workers=2)
    _assert_same(ours, theirs)
    assert len(ours[0]) == 5


class Pairs(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        return torch.full((3,), float(i)), i


def tuple_collate(samples):
    return tuple(samples)


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"batch_size": None}, id="unbatched-tuples"),
        pytest.param({"batch_size": 2, "collate_fn": tuple_collate}, id="collate-to-tuple"),
    ],
)
def test_batches_that_are_tuples_match_torch(kwargs):
    ours, theirs = _both(Pairs(), num_workers=2, **kwargs)
    _assert_same(ours, theirs)
    assert len(ours[0]) > 0


class ChangesMidBatch(Dataset):
    """Samples that default_collate accepts although they differ from the
    first sample of their batch: a NumPy array then tensors (converted), a
    float32 row then a float64 one (stacked into float32 in torch's workers),
    an int then a float."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int):
        row = np.arange(4, dtype=np.float32 if i % 4 != 2 else np.float64) + i
        value = torch.from_numpy(row) if i % 4 == 3 else row
        return value, (i if i % 4 != 1 else i + 0.5)


def test_samples_unlike_the_first_are_collated_as_torch_does():
    ours, theirs = _both(ChangesMidBatch(), batch_size=4, num_workers=2)
    _assert_same(ours, theirs)


SAMPLERS = {
    "subset-random": lambda: {
        "sampler": SubsetRandomSampler(
            list(range(3, 20)), generator=torch.Generator().manual_seed(3)
        ),
        "batch_size": 4,
    },
    "weighted": lambda: {
        "sampler": WeightedRandomSampler(
            [1.0] * 23, 30, generator=torch.Generator().manual_seed(4)
        ),
        "batch_size": 4,
    },
    "batch-sampler": lambda: {
        "batch_sampler": BatchSampler(SequentialSampler(range(23)), batch_size=6, drop_last=False)
    },
}


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_samplers_match_torch(name, workers):
    # Each loader gets its own sampler: samplers with a generator are stateful.
    ours = ll.DataLoader(Squares(), num_workers=workers, **SAMPLERS[name]())
    theirs = torch.utils.data.DataLoader(
        Squares(), num_workers=workers, multiprocessing_context="fork" if workers else None,
        **SAMPLERS[name](),
    )  # fmt: skip
    _assert_same(list(ours), list(theirs))
    ours.close()


@pytest.mark.parametrize(("workers", "drop_last"), [(0, False), (1, True), (2, False)])
def test_iterable_sharding_matches_torch(workers, drop_last):
    ours, theirs = _both(Stream(), epochs=2, batch_size=3, num_workers=workers, drop_last=drop_last)
    _assert_same(ours, theirs)
    if not drop_last:  # every sample exactly once per epoch
        seen = sorted(int(v) for batch in ours[0] for v in batch[:, 0])
        assert seen == list(range(17))


def test_thread_mode_matches_torch():
    dataset = Squares()
    ours = ll.DataLoader(
        dataset, batch_size=4, shuffle=True, num_workers=2, worker_mode="thread",
        generator=torch.Generator().manual_seed(1),
    )  # fmt: skip
    theirs = torch.utils.data.DataLoader(
        dataset, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(1)
    )
    _assert_same(list(ours), list(theirs))


class ThreadRecording(torch.utils.data.Dataset):
    """Records which thread ran each __getitem__; raises at index 13."""

    def __init__(self):
        self.threads = set()

    def __len__(self):
        return 24

    def __getitem__(self, index):
        self.threads.add(threading.current_thread())
        if index == 13:
            raise KeyError(f"no sample {index}")
        return torch.tensor([index])


def test_thread_mode_runs_in_native_threads_and_reraises_with_type():
    dataset = ThreadRecording()
    loader = ll.DataLoader(dataset, batch_size=4, num_workers=2, worker_mode="thread")
    with pytest.raises(KeyError, match="no sample 13"):
        list(loader)
    assert dataset.threads
    # Threads Python did not start show up as threading._DummyThread.
    assert all(isinstance(t, threading._DummyThread) for t in dataset.threads)
    assert threading.main_thread() not in dataset.threads


# --- start methods ----------------------------------------------------------------------------


def test_fork_by_name_is_honoured_unless_a_gpu_runtime_is_initialised(monkeypatch):
    # Asked for by name, fork is used as torch uses it: the batches are torch's.
    kwargs = dict(batch_size=4, num_workers=2, shuffle=True, multiprocessing_context="fork")
    ours = ll.DataLoader(Squares(), generator=torch.Generator().manual_seed(3), **kwargs)
    theirs = torch.utils.data.DataLoader(
        Squares(), generator=torch.Generator().manual_seed(3), **kwargs
    )
    _assert_same(list(ours), list(theirs))
    ours.close()
    # Once CUDA is initialised in this process, fork is the deadlock of seed
    # 003: refused with the reason (no GPU here: torch's own flag is set).
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(ValueError, match="CUDA runtime is initialised"):
        ll.DataLoader(Squares(), num_workers=2, multiprocessing_context="fork")
    loader = ll.DataLoader(
        Squares(), batch_size=4, num_workers=1, multiprocessing_context="fork", force_fork=True
    )
    assert len(list(loader)) == 6
    loader.close()
    loader = ll.DataLoader(Squares(), batch_size=4, num_workers=1,
                           multiprocessing_context="forkserver")  # fmt: skip
    assert len(list(loader)) == 6
    loader.close()


_FORK_SERVER_SCRIPT = """
import multiprocessing.forkserver as forkserver
import sys
import numpy as np
import torch
import leanloader as ll
from leanloader.dataloader import fork_server

class Rows:
    def __len__(self):
        return 8
    def __getitem__(self, i):
        import gc, sys
        # torch loaded by the server; torch._inductor (sympy, ~800 modules,
        # 100 MiB a worker) never imported by a worker that does not need it;
        # the server's objects frozen, so collections do not copy their pages
        return np.array([int("torch" in sys.modules), int("torch._inductor" in sys.modules),
                         int(gc.get_freeze_count() > 0)])

if __name__ == "__main__":
    if sys.argv[1] == "fresh":  # as where CUDA is initialised: a new interpreter
        torch.cuda.is_initialized = lambda: True
    # "named": forkserver asked for by name, multiprocessing's own server
    context = "forkserver" if sys.argv[1] == "named" else None
    loader = ll.DataLoader(Rows(), batch_size=4, num_workers=2,
                           multiprocessing_context=context)
    batches = [b for b in loader]
    server = fork_server._server_of(loader._context)
    assert (server is forkserver._forkserver) == (sys.argv[1] == "named")
    preload = server._preload_modules
    rows = np.concatenate(batches)
    print(sorted(set(preload)), int(fork_server.forked_from_this_process(loader._context)),
          int(rows[:, 0].sum()), int((rows[:, 1] == 0).sum()), int(rows[:, 2].sum()))
"""


@pytest.mark.parametrize("server", ["forked", "fresh", "named"])
def test_forkserver_workers_share_what_every_worker_imports(tmp_path, server):
    # Without a GPU runtime leanloader's fork server is forked from the main
    # process (it has what the program imported); with one, or when the
    # loader names forkserver (multiprocessing's own server, as torch's), it
    # is a new interpreter that preloads torch, numpy, leanloader (and the
    # dataset's module when importable). Either way the workers it forks
    # share those pages.
    script = tmp_path / "forkserver_preload.py"
    script.write_text(_FORK_SERVER_SCRIPT)
    result = subprocess.run(
        [sys.executable, str(script), server], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    modules, counts = result.stdout.split("]")
    forked, with_torch, without_inductor, frozen = map(int, counts.split())
    assert forked == (server == "forked"), result.stdout
    if server != "forked":
        for module in ("__main__", "torch", "numpy", "leanloader"):
            assert f"'{module}'" in modules, result.stdout
    assert with_torch == 8  # every sample came from a worker with torch loaded
    assert without_inductor == 8, result.stdout
    assert frozen == 8, result.stdout


# Four rows of two values: the batches of 2 sum to 12 over a pass.
_FOUR_ROWS = """
import numpy as np

class Rows:
    def __len__(self):
        return 4
    def __getitem__(self, i):
        return np.full(2, i)
"""

_FORKED_SERVER_HYGIENE_SCRIPT = (
    _FOUR_ROWS
    + """
import atexit, os, sys
import numpy as np
import leanloader as ll
from multiprocessing import forkserver
from leanloader.dataloader import fork_server

atexit.register(lambda: print("atexit ran", flush=True))
read_end, write_end = os.pipe()  # the program's own pipe and memfd
memfd = os.memfd_create("program-memory")

if __name__ == "__main__":
    loader = ll.DataLoader(Rows(), batch_size=2, num_workers=2)
    assert sum(int(b.sum()) for b in loader) == 12
    assert fork_server.forked_from_this_process(loader._context)
    server = fork_server.private_fork_server()._forkserver_pid
    ours = {os.readlink(f"/proc/self/fd/{fd}") for fd in (read_end, write_end, memfd)}
    held = {os.readlink(f"/proc/{server}/fd/{fd}") for fd in os.listdir(f"/proc/{server}/fd")}
    print("held", len(ours & held), sorted(t.split(":")[0] for t in held))
"""
)


def test_a_fork_server_forked_from_the_program_holds_none_of_its_descriptors_nor_runs_its_exit(
    tmp_path,
):
    # The server forked from the main process must not keep the program's
    # pipes or shared memory alive, and never runs its atexit functions
    # (nor do its workers): "atexit ran" once, from the main process.
    script = tmp_path / "hygiene.py"
    script.write_text(_FORKED_SERVER_HYGIENE_SCRIPT)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "held 0 " in result.stdout, result.stdout
    assert result.stdout.count("atexit ran") == 1, result.stdout


_FORK_SERVER_RESTART_SCRIPT = (
    _FOUR_ROWS
    + """
import os, signal, sys, time
import numpy as np
import torch
import leanloader as ll
from leanloader.dataloader.fork_server import private_fork_server

if __name__ == "__main__":
    if sys.argv[1] == "fresh":
        torch.cuda.is_initialized = lambda: True
    loader = ll.DataLoader(Rows(), batch_size=2, num_workers=2)
    sums = [sum(int(b.sum()) for b in loader)]
    first = private_fork_server()._forkserver_pid
    os.kill(first, signal.SIGKILL)
    while os.path.exists(f"/proc/{first}/status") and "zombie" not in open(
            f"/proc/{first}/status").read():
        time.sleep(0.01)
    sums.append(sum(int(b.sum()) for b in loader))  # a new pass: a new server
    print(sums, private_fork_server()._forkserver_pid != first)
"""
)


@pytest.mark.parametrize("server", ["forked", "fresh"])
def test_a_fork_server_that_died_is_started_again(tmp_path, server):
    script = tmp_path / "restart.py"
    script.write_text(_FORK_SERVER_RESTART_SCRIPT)
    result = subprocess.run([sys.executable, str(script), server], capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["[12,", "12]", "True"], result.stdout


_SERVER_ISOLATION_SCRIPT = """
import multiprocessing as mp
import torch
from torch.utils.data import Dataset
import leanloader as ll
import isolation_state  # STATE = "import-time"

class Inner(Dataset):
    def __len__(self):
        return 4
    def __getitem__(self, i):
        return i

class Outer(Dataset):
    def __len__(self):
        return 2
    def __getitem__(self, i):
        try:
            return str(list(ll.DataLoader(Inner(), batch_size=2, num_workers=2)))
        except AssertionError as error:
            return str(error)

class ReadsState(Dataset):
    def __len__(self):
        return 2
    def __getitem__(self, i):
        return isolation_state.STATE

def leaf():
    pass

def middle(queue):
    process = mp.get_context("forkserver").Process(target=leaf)
    process.start()
    process.join(60)
    queue.put(process.exitcode)

if __name__ == "__main__":
    isolation_state.STATE = "set by main"
    def states(loader_class, **context):
        return sorted(set(loader_class(ReadsState(), batch_size=None, num_workers=1, **context)))
    print(states(ll.DataLoader))  # leanloader's server: a fork of this process
    named = {"multiprocessing_context": "forkserver"}
    print(states(ll.DataLoader, **named), states(torch.utils.data.DataLoader, **named))
    print(sorted(set(ll.DataLoader(Outer(), batch_size=None, num_workers=2))))
    queue = mp.get_context("forkserver").SimpleQueue()
    process = mp.get_context("forkserver").Process(target=middle, args=(queue,))
    process.start()
    process.join(60)
    print(process.exitcode, queue.get() if process.exitcode == 0 else None)
"""


def test_leanloaders_fork_server_is_its_own(tmp_path):
    # Forked from the main process at the first pass, leanloader's server had
    # been multiprocessing's own, with its lock copied held: a loader named
    # "forkserver" (torch's too, and any other forkserver process) then ran
    # on it with the main process's state, and a loader in a worker, or a
    # forkserver process started by a forkserver process, waited forever.
    (tmp_path / "isolation_state.py").write_text('STATE = "import-time"\n')
    script = tmp_path / "isolation.py"
    script.write_text(_SERVER_ISOLATION_SCRIPT)
    result = run_to_the_end([sys.executable, str(script)], timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == [
        "['set by main']",
        "['import-time'] ['import-time']",
        "['daemonic processes are not allowed to have children']",  # as torch
        "0 0",
    ], result.stdout


class ParentPids(Dataset):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> int:
        return os.getppid()


@pytest.mark.parametrize("chosen", [None, "spawn", "forkserver", "fork"])
def test_a_start_method_the_program_chose_is_used_as_torch_does(chosen):
    # torch starts workers with multiprocessing's start method when the
    # loader has none; leanloader too, except that fork becomes forkserver.
    previous = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method(chosen, force=True)
    try:
        loader = ll.DataLoader(ParentPids(), batch_size=2, num_workers=1)
        method = "spawn" if chosen == "spawn" else "forkserver"
        assert loader._context.get_start_method() == method
        parents = next(iter(loader)).tolist()
    finally:
        multiprocessing.set_start_method(previous, force=True)
    # a spawned worker is this process's child, a fork server's is the server's
    assert (parents == [os.getpid()] * 2) == (method == "spawn"), parents


# --- shared memory ----------------------------------------------------------------------------


def test_batches_arrive_in_slots_without_copies_and_slots_recycle():
    loader = ll.DataLoader(Squares(64), batch_size=4, num_workers=2)
    iterator = iter(loader)
    batches = [next(iterator) for _ in range(10)]
    later = batches[-1]["x"]
    assert _core.find_shared_segment(later.data_ptr()) is not None  # views the slot
    pools = iterator.batch_segments.kept_pools
    held = sum(pool.slots_in_use for pool in pools)
    del batches, later
    assert sum(pool.slots_in_use for pool in pools) < held  # dropping batches freed slots
    rest = list(iterator)
    assert len(rest) == 6
    loader.close()


class Blocks(Dataset):
    """Samples of 256 KiB: a batch of 8 is 2 MiB."""

    def __len__(self) -> int:
        return 96

    def __getitem__(self, i: int):
        return torch.full((65536,), float(i)), i


def _batch_segments(batch) -> set:
    segment = _core.find_shared_segment(batch[0].data_ptr())
    assert segment is not None, "the batch did not arrive in a shared segment"
    return {os.fstat(segment.fd).st_ino}


def test_batch_memory_is_planned_like_the_loaders_slots():
    # prefetch 2 x 2 workers in flight + 1 held by the consumer = 5 segments,
    # each the size of the batch actually produced (2 MiB of blocks + 64 bytes
    # of indices, page-rounded).
    loader = ll.DataLoader(Blocks(), batch_size=8, num_workers=2, persistent_workers=True)
    batch_bytes = 8 * 65536 * 4 + 4096
    iterator = iter(loader)
    inodes: set = set()
    seen = 0
    for batch in iterator:
        # Every batch, the first ones included, comes in a shared segment,
        # never pickled through the pipe while a pool is being prepared.
        inodes |= _batch_segments(batch)
        assert torch.equal(batch[1], torch.arange(seen * 8, seen * 8 + 8))
        assert torch.equal(batch[0][:, 0], batch[1].float())
        seen += 1
        kept = iterator.batch_segments.kept_pools
        assert len(kept) <= 2 * 2 + 1
        assert all(pool.slot_bytes == batch_bytes for pool in kept)
    assert seen == 12
    # A plain loop recycles: no new segment per batch once the pool is full
    # (a few extra when a worker wrote before a slot came back).
    assert len(inodes) <= 8, inodes
    # Between epochs nothing is kept (torch holds nothing there either).
    assert iterator.batch_segments.kept_pools == ()
    assert len(list(loader)) == 12  # the next epoch builds them again
    loader.close()


def test_kept_segments_stay_within_the_memory_budget():
    loader = ll.DataLoader(Blocks(), batch_size=8, num_workers=2, persistent_workers=True)
    segment_bytes = 8 * 65536 * 4 + 4096
    loader.memory_budget = 2 * segment_bytes  # read by the process iterator
    iterator = iter(loader)
    count = 0
    for batch in iterator:
        _batch_segments(batch)  # still no batch through the pipe
        kept = iterator.batch_segments.kept_pools
        assert sum(pool.slot_bytes for pool in kept) <= 2 * segment_bytes
        count += 1
    assert count == 12
    loader.close()


def test_hoarded_batches_stay_in_segments_and_are_freed_when_dropped():
    loader = ll.DataLoader(Blocks(), batch_size=8, num_workers=2)
    # Before the workers start: once they run, the batches they prefetch at
    # once would count as "before" (a warm fork server starts them in
    # milliseconds).
    before = process_tree_memory()["fd_shmem_bytes"] + process_tree_memory()["pss_shmem_bytes"]
    iterator = iter(loader)
    hoard = [next(iterator) for _ in range(10)]  # twice the pool's size
    for batch in hoard:
        _batch_segments(batch)
    assert len(iterator.batch_segments.kept_pools) <= 5
    assert len({next(iter(_batch_segments(b))) for b in hoard}) == 10
    # The segments are counted as the tree's memory, mapped or not.
    report = ll.memory_report(gpu=False)
    assert report["shared_files"]["held_bytes"] >= 10 * 8 * 65536 * 4
    held = process_tree_memory()
    assert held["fd_shmem_bytes"] + held["pss_shmem_bytes"] - before >= 9 * 8 * 65536 * 4
    del hoard, batch
    rest = list(iterator)
    assert len(rest) == 2
    loader.close()


def test_workers_are_named_for_ps_and_top():
    loader = ll.DataLoader(Squares(16), batch_size=4, num_workers=2, persistent_workers=True)
    iterator = iter(loader)
    # Batches come in order, one worker each: the second is worker 1's, so
    # both workers have started (and named themselves) by then.
    next(iterator)
    next(iterator)
    names = [open(f"/proc/{w.pid}/comm").read().strip() for w in iterator._workers]
    assert names == ["ll_data_worker", "ll_data_worker"]
    loader.close()


@pytest.mark.parametrize("in_place", [False, True], ids=["copy", "in-place"])
def test_large_arrays_and_tensors_are_shared_once(tmp_path, in_place):
    np.save(tmp_path / "mapped.npy", np.ones((64, 1024), dtype=np.float32))
    dataset = Features(64, 16384, str(tmp_path / "mapped.npy"))  # 4 MiB of features
    features = dataset.features
    original = features.copy()
    weight = dataset.model.weight.detach().clone()
    weight_address = dataset.model.weight.untyped_storage().data_ptr()
    loader = ll.DataLoader(dataset, batch_size=8, num_workers=2, share_in_place=in_place)
    batches = list(loader)
    # Each worker received a reference, not the 4 MiB array, the memmap's
    # contents or the model's weights.
    assert len(loader.setup_bytes()) < 64 * 1024
    features_shared = _core.find_shared_segment(dataset.features.__array_interface__["data"][0])
    weight_shared = _core.find_shared_segment(dataset.model.weight.untyped_storage().data_ptr())
    if in_place:  # opted in: the dataset's own array and tensor were moved
        assert features_shared and weight_shared
    else:  # the dataset is left as it was: the shared copies are the loader's
        assert dataset.features is features and not features_shared
        assert dataset.model.weight.untyped_storage().data_ptr() == weight_address
        assert not weight_shared
        segments = len(loader.dataset_sharing().segments)
        assert segments == 2
        assert len(list(loader)) == 8  # the next pass reuses the copies
        assert len(loader.dataset_sharing().segments) == segments
    assert isinstance(dataset.model.weight, torch.nn.Parameter)
    np.testing.assert_array_equal(dataset.features, original)  # worker writes stayed there
    assert torch.equal(dataset.model.weight.detach(), weight)
    rows = torch.cat([b["row"] for b in batches])
    np.testing.assert_array_equal(rows.numpy(), original)
    assert all(float(s) == pytest.approx(float(weight.sum()), rel=1e-5)
               for b in batches for s in b["weight_sum"])  # fmt: skip
    assert all(float(m) == 1024.0 for b in batches for m in b["mapped"])
    assert all(bool(w) for b in batches for w in b["owns_features"])
    loader.close()


class LargeBlocks(Dataset):
    """A 64 MiB array (a view of the array that owns it, as reshape gives) and
    a 48 MiB tensor: blocks that malloc maps on their own."""

    def __init__(self) -> None:
        self.features = np.arange(1 << 24, dtype=np.float32).reshape(1024, -1)
        self.weight = torch.arange(12 << 20, dtype=torch.float32)

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int):
        sample = self.features[i * 64, :4].copy(), self.weight[i << 19 : (i << 19) + 4].clone()
        # a worker's writes stay in that worker (the main process's blocks
        # share their pages with the copies the workers map)
        self.features[i * 64 + 1, 0] = -7.0
        self.weight[(i << 19) + 8] = -7.0
        return sample


def _mapped_from_segment(address: int) -> bool:
    with open("/proc/self/maps") as maps:
        for line in maps:
            start, end = (int(x, 16) for x in line.split()[0].split("-"))
            if start <= address < end:
                return "leanloader-" in line
    return False


def test_shared_copies_take_the_dataset_pages_instead_of_a_second_copy():
    dataset = LargeBlocks()
    features, weight = dataset.features, dataset.weight
    features_address = features.__array_interface__["data"][0]
    weight_address = weight.untyped_storage().data_ptr()
    expected_features = features.copy()
    expected_weight = weight.clone()
    blocks = features.nbytes + weight.untyped_storage().nbytes()
    if "allocator" in _core.page_sharing_refusal(features_address, features.nbytes):
        pytest.skip("this process's malloc is not glibc's: copies stay plain copies")
    before = _smaps_rollup(os.getpid())["Anonymous"]
    loader = ll.DataLoader(dataset, batch_size=4, num_workers=2)
    try:
        _check_pages_shared(loader, dataset, before, blocks, expected_features, expected_weight)
    finally:
        loader.close()
    assert dataset.features is features and dataset.weight is weight
    assert features.__array_interface__["data"][0] == features_address
    assert weight.untyped_storage().data_ptr() == weight_address


def _check_pages_shared(loader, dataset, before, blocks, expected_features, expected_weight):
    features, weight = dataset.features, dataset.weight
    features_address = features.__array_interface__["data"][0]
    weight_address = weight.untyped_storage().data_ptr()
    first = list(loader)
    sharing = loader.dataset_sharing()
    # Every whole page of both blocks is mapped from its shared copy: one
    # copy in all, the dataset's objects, addresses and values as they were.
    assert sharing.shared_page_bytes > blocks - 4 * 4096
    assert _mapped_from_segment(features_address + features.nbytes // 2)
    assert _mapped_from_segment(weight_address + (24 << 20))
    np.testing.assert_array_equal(features, expected_features)
    assert torch.equal(weight, expected_weight)
    anonymous_drop = before - _smaps_rollup(os.getpid())["Anonymous"]
    assert anonymous_drop > blocks - (16 << 20), (before, anonymous_drop)
    assert first[1][0][0, 0].item() == expected_features[4 * 64, 0]
    # The main process's later writes are seen by the next pass's (new)
    # workers, as torch's see them: the copies are made again, and the
    # blocks' pages taken from the new ones.
    features[:] = -1.0
    weight.fill_(-1.0)
    second = list(loader)
    assert all(bool((x == -1.0).all()) and bool((w == -1.0).all()) for x, w in second)
    assert _mapped_from_segment(features_address + features.nbytes // 2)
    assert len(sharing.segments) == 2  # the first copies were let go


class SharedCounts(Dataset):
    """Counts its reads in a tensor the program put in shared memory, as
    torch users share a cache or counters between workers and the main
    process."""

    def __init__(self, size: int) -> None:
        self.counts = torch.zeros(size, dtype=torch.int64).share_memory_()
        self.private = torch.zeros(size, dtype=torch.int64)

    def __len__(self) -> int:
        return len(self.counts)

    def __getitem__(self, i: int) -> int:
        self.counts[i] += 1
        self.private[i] += 1
        return i


@pytest.mark.parametrize("make", [ll.DataLoader, torch.utils.data.DataLoader], ids=["ll", "torch"])
def test_tensors_in_shared_memory_are_shared_with_workers_as_torch_does(make):
    dataset = SharedCounts(8)
    loader = make(dataset, batch_size=2, num_workers=2, multiprocessing_context="spawn")
    assert sorted(int(i) for batch in loader for i in batch) == list(range(8))
    # the workers' increments reach the main process's shared tensor
    assert dataset.counts.tolist() == [1] * 8
    # torch moves the dataset's other tensors into shared memory too (so its
    # workers' writes reach the main process); leanloader leaves the dataset
    # as it was and each worker writes its own copy (the README names this)
    assert dataset.private.tolist() == [1 if make is torch.utils.data.DataLoader else 0] * 8
    assert sorted(int(i) for batch in loader for i in batch) == list(range(8))
    assert dataset.counts.tolist() == [2] * 8


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                            capture_output=True)  # fmt: skip
    return result.returncode == 0


def test_full_shm_is_a_clear_error_at_start(tmp_path):
    shm = tmp_path / "tiny-shm"
    if not _mount_tmpfs(shm, "1m"):
        pytest.skip("cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN)")
    try:
        loader = ll.DataLoader(Big(), batch_size=2, num_workers=1, shm_dir=str(shm))
        start = time.monotonic()
        with pytest.raises(OSError) as caught:
            list(loader)
        assert caught.value.errno == errno.ENOSPC
        assert str(shm) in str(caught.value)
        assert "free of" in str(caught.value)
        assert time.monotonic() - start < 30
        assert os.listdir(shm) == []
        loader.close()
    finally:
        subprocess.run(["umount", str(shm)], check=False)


MAIN_KILLED_SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, {tests!r})
    import leanloader as ll
    from test_dataloader import Slow, Features
    dataset = Features(32, 65536)   # 8 MiB, moved into shared memory
    loader = ll.DataLoader(dataset, batch_size=4, num_workers=2, shm_dir={shm!r})
    iterator = iter(loader)
    next(iterator); next(iterator)
    print(" ".join(str(w.pid) for w in iterator._workers), flush=True)
    time.sleep(60)
    """
)


def _shm_holders(directory: Path) -> dict[int, str]:
    """pid -> command line of every process with a descriptor or a mapping of
    a file under `directory` (unlinked files included: "(deleted)")."""
    prefix = str(directory) + "/"
    holders = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
            links = [os.readlink(f"/proc/{entry}/fd/{fd}") for fd in fds]
            with open(f"/proc/{entry}/maps") as maps:
                links += [line.split(maxsplit=5)[-1] for line in maps]
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                command = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
        except (FileNotFoundError, ProcessLookupError, PermissionError, OSError):
            continue
        if any(link.startswith(prefix) for link in links):
            holders[int(entry)] = command[:120]
    return holders


def test_no_shm_left_after_main_process_is_killed(tmp_path):
    shm = tmp_path / "shm"
    mounted = _mount_tmpfs(shm, "256m")
    shm.mkdir(exist_ok=True)
    tests = str(Path(__file__).parent)
    child = subprocess.Popen(
        [sys.executable, "-c", MAIN_KILLED_SCRIPT.format(tests=tests, shm=str(shm))],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        workers = [int(p) for p in child.stdout.readline().split()]
        assert len(workers) == 2
        # The segments exist now, held by the main process and its workers.
        holders = _shm_holders(shm)
        assert child.pid in holders and set(workers) <= set(holders), holders
        if mounted:
            assert os.statvfs(shm).f_bfree < os.statvfs(shm).f_blocks  # in use now
        child.kill()
        child.wait()
        deadline = time.monotonic() + 15  # generous: a loaded 2-core host

        def in_use() -> bool:
            # the kernel frees an unlinked file's pages after its last holder
            # is gone, not always before that holder is reaped
            usage = os.statvfs(shm)
            return mounted and usage.f_bfree != usage.f_blocks

        while time.monotonic() < deadline and (
            any(alive(p) for p in workers) or _shm_holders(shm) or in_use()
        ):
            time.sleep(0.05)
        assert not any(alive(p) for p in workers), "workers outlived the main process"
        assert _shm_holders(shm) == {}, "shared memory still held after the main process died"
        assert os.listdir(shm) == []  # nothing was ever left with a name
        if mounted:
            usage = os.statvfs(shm)
            assert usage.f_bfree == usage.f_blocks  # every reserved page is back
    finally:
        if child.poll() is None:
            child.kill()
        if mounted:
            subprocess.run(["umount", str(shm)], check=False)


# --- failures ---------------------------------------------------------------------------------


def test_killed_worker_raises_naming_worker_signal_and_samples():
    loader = ll.DataLoader(Slow(0.1), batch_size=2, num_workers=2)
    iterator = iter(loader)
    next(iterator)
    victim = iterator._workers[1]
    os.kill(victim.pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(RuntimeError) as caught:
        for _ in iterator:
            pass
    assert time.monotonic() - start < 5
    message = str(caught.value)
    assert f"worker 1 (pid {victim.pid})" in message
    assert "SIGKILL" in message
    assert "samples [[" in message  # the index lists it held
    # the pass goes on with worker 0, as torch's, and ends with every worker gone
    assert len(list(iterator)) > 0
    assert all(not w.is_alive() for w in iterator._workers)
    loader.close()


def _raised(loader) -> BaseException:
    try:
        list(loader)
    except Exception as error:
        # The traceback holds the iterator in a reference cycle; torch's
        # iterator, freed later by the garbage collector, takes 10 s to stop
        # its workers (in whichever test the collection happens to run).
        error.__traceback__ = None
        return error
    raise AssertionError("no error")


@pytest.mark.parametrize("dataset", [Failing(), KeyFailing()], ids=["two-args", "key-error"])
def test_dataset_exception_is_reraised_as_torch_reraises_it(dataset):
    # torch's text ("Caught BadSample in DataLoader worker process 0.
    # Original Traceback ..."), and its type where one message builds it
    # (BadSample needs two arguments: RuntimeError, as torch).
    ours = ll.DataLoader(dataset, batch_size=2, num_workers=2)
    theirs = torch.utils.data.DataLoader(dataset, batch_size=2, num_workers=2,
                                         multiprocessing_context="fork")  # fmt: skip
    got, expected = _raised(ours), _raised(theirs)
    ours.close()
    assert type(got) is type(expected)
    assert str(got).splitlines()[:2] == str(expected).splitlines()[:2]
    assert str(got).startswith("Caught ")
    assert "in __getitem__" in str(got) and "Original Traceback" in str(got)


def test_collate_exception_is_reraised():
    loader = ll.DataLoader(Squares(), batch_size=2, num_workers=1, collate_fn=failing_collate)
    with pytest.raises(ValueError, match="cannot collate"):
        next(iter(loader))
    loader.close()


def test_timeout_raises():
    # The sample takes a minute: the error comes from the timeout, long
    # before, however slow the machine is to start the worker (start-up
    # counts against the timeout, as in torch).
    loader = ll.DataLoader(Slow(60.0, n=4), batch_size=1, num_workers=1, timeout=1)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="timed out after 1 seconds"):
        next(iter(loader))
    assert time.monotonic() - start < 30
    loader.close()


class WithLambda(Squares):
    def __init__(self) -> None:
        super().__init__()
        self.transform = lambda x: x


def test_unpicklable_attribute_is_named():
    with pytest.raises(pickle.PicklingError, match=r"dataset\.transform .*lambda"):
        next(iter(ll.DataLoader(WithLambda(), num_workers=1)))

    class Local(Squares):
        pass

    with pytest.raises(pickle.PicklingError, match=r"dataset .*<locals>.*module level"):
        next(iter(ll.DataLoader(Local(), num_workers=1)))


class Records(Squares):
    def __init__(self) -> None:
        super().__init__()
        self.records = [{"path": f"/data/{i}.png", "caption": "x" * 40} for i in range(20000)]


def test_large_per_worker_copy_warns_once_with_the_fix():
    import warnings

    loader = ll.DataLoader(Records(), batch_size=4, num_workers=1, warn_copy_bytes=100_000)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):  # two passes, two sets of workers: one warning
            next(iter(loader))
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1, messages
    assert "dataset.records" in messages[0] and "SharedRecords" in messages[0]
    loader.close()


def test_pin_memory_without_cuda_is_a_noted_no_op():
    if torch.cuda.is_available():
        pytest.skip("CUDA is present: pin_memory pins")
    loader = ll.DataLoader(Squares(), batch_size=4, pin_memory=True)
    with pytest.warns(UserWarning, match="pin_memory"):
        assert len(list(loader)) == 6


INTERRUPT_SCRIPT = textwrap.dedent(
    """
    import signal, sys
    # Ctrl-C raises KeyboardInterrupt even when the suite runs as a background
    # job, whose children start with SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.path.insert(0, {tests!r})
    import leanloader as ll
    from test_dataloader import Slow
    loader = ll.DataLoader(Slow(0.2), batch_size=1, num_workers=2)
    iterator = iter(loader)
    next(iterator)
    print(" ".join(str(w.pid) for w in iterator._workers), flush=True)
    for batch in iterator:
        pass
    """
)


def test_ctrl_c_stops_every_worker_cleanly():
    tests = str(Path(__file__).parent)
    child = subprocess.Popen(
        [sys.executable, "-c", INTERRUPT_SCRIPT.format(tests=tests)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    workers = [int(p) for p in child.stdout.readline().split()]
    os.killpg(child.pid, signal.SIGINT)  # as a terminal does: the whole group
    try:
        _, stderr = child.communicate(timeout=5)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode != 0
    assert stderr.count("KeyboardInterrupt") == 1, stderr
    assert "Fatal Python error" not in stderr
    assert wait_gone(workers)


INTERRUPTED_NEXT_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, threading
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.path.insert(0, {tests!r})
    import torch
    import leanloader as ll
    from test_dataloader import Slow
    for loader_class in (torch.utils.data.DataLoader, ll.DataLoader):
        iterator = iter(loader_class(Slow(0.5, 6), batch_size=1, num_workers=2))
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
        try:
            next(iterator)
        except KeyboardInterrupt:
            print("interrupted", end=" ")
        print(sum(1 for _ in iterator), flush=True)
    """
)


def test_ctrl_c_during_next_leaves_the_iterator_usable_as_torchs():
    # The iterator was shut down: every later next() raised "shut down after
    # an error" where torch's goes on with the pass.
    tests = str(Path(__file__).parent)
    result = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_NEXT_SCRIPT.format(tests=tests)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["interrupted 6"] * 2, result.stdout


WORKER_DEATH_SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys
    from torch.utils.data import Dataset
    import leanloader as ll

    class DiesAtFour(Dataset):
        def __len__(self):
            return 16
        def __getitem__(self, i):
            if i == 4 and not os.path.exists(sys.argv[1]):
                open(sys.argv[1], "w").close()  # once: a later pass has all its workers
                os.kill(os.getpid(), signal.SIGKILL)
            return i

    def one_pass(loader):
        seen, iterator = [], iter(loader)
        while True:
            try:
                seen.append(next(iterator).tolist()[0])
            except StopIteration:
                return seen
            except RuntimeError as error:
                seen.append("died" if "(pid" in str(error) else str(error))
            if len(seen) > 40:
                return seen  # (an iterator that raises at every call)

    loader = ll.DataLoader(DiesAtFour(), batch_size=2, num_workers=2, persistent_workers=True)
    print(json.dumps([one_pass(loader), one_pass(loader)]))
    """
)


def test_a_worker_that_dies_is_reported_once_and_the_pass_goes_on_as_torchs(tmp_path):
    # Batch [4, 5] kills worker 0. torch's iterator (_try_get_data,
    # _mark_worker_as_unavailable) raises once and goes on with worker 1, the
    # tasks sent to worker 0 left out; leanloader shut the iterator down
    # (every later next() raised: a loop that skips errors never ended).
    # (torch itself is not run: a worker SIGKILLed while its queue's feeder
    # thread held the shared lock can hang torch's other worker.)
    result = subprocess.run(
        [sys.executable, "-c", WORKER_DEATH_SCRIPT, str(tmp_path / "died")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    seen, next_pass = json.loads(result.stdout)
    assert seen.count("died") == 1, seen
    batches = [first for first in seen if first != "died"]
    assert batches == sorted(batches) and 4 not in batches, seen
    # worker 1's batches; worker 0's first, [0, 1], is there only when its
    # answer left the worker before the kill (the dead worker's unanswered
    # tasks are left out, as torch's are): on a loaded machine it may not
    assert {2, 6, 14} <= set(batches), seen
    # a persistent leanloader loader starts new workers for the next pass
    assert next_pass == list(range(0, 16, 2)), next_pass


# --- memory -----------------------------------------------------------------------------------


class LatentsAndRecords(Dataset):
    """512 MB of NumPy latents and ~100 MB of records in SharedRecords."""

    def __init__(self) -> None:
        rows = 1024
        self.latents = np.ones((rows, 131072), dtype=np.float32)  # 512 MiB
        caption = "a photo of " + "x" * 440
        self.records = ll.SharedRecords(
            {"path": f"/data/{i:07d}.png", "caption": caption, "size": i} for i in range(200_000)
        )

    def __len__(self) -> int:
        return len(self.latents)

    def __getitem__(self, i: int):
        record = self.records[i * 100]
        return self.latents[i][:256].copy(), record["size"]


def _peak_unreclaimable(run) -> tuple[int, int]:
    """(before, peak) unreclaimable bytes of this process tree around run()."""
    before = _core.process_tree_memory(os.getpid())["unreclaimable_bytes"]
    peak = before
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.wait(0.05):
            try:
                memory = _core.process_tree_memory(os.getpid())["unreclaimable_bytes"]
            except (OSError, RuntimeError):
                continue
            peak = max(peak, memory)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        run()
    finally:
        stop.set()
        sampler.join()
    return before, peak


def test_four_workers_share_one_copy_of_the_dataset(record_property):
    dataset = LatentsAndRecords()
    dataset_bytes = dataset.latents.nbytes + dataset.records.nbytes
    assert dataset_bytes > 600e6
    # share_in_place: the latents move into shared memory instead of being
    # copied there (the default keeps the dataset as it was, at the cost of
    # one more copy in the main process).
    loader = ll.DataLoader(dataset, batch_size=16, num_workers=4, share_in_place=True)

    def move() -> None:  # the one-time move of the latents into shared memory
        loader.setup_bytes()

    before, move_peak = _peak_unreclaimable(move)
    after_move = _core.process_tree_memory(os.getpid())["unreclaimable_bytes"]

    per_worker: list[dict[str, int]] = []

    def run_ours() -> None:
        iterator = iter(loader)
        count = len(next(iterator)[0])
        for worker in iterator._workers:
            per_worker.append(_smaps_rollup(worker.pid))
        count += sum(len(b[0]) for b in iterator)
        assert count == 1024
        loader.close()

    _, peak = _peak_unreclaimable(run_ours)
    ours = max(peak, move_peak) - before
    workers_part = peak - after_move

    def run_torch() -> None:
        theirs = torch.utils.data.DataLoader(
            dataset, batch_size=16, num_workers=4, multiprocessing_context="spawn"
        )
        assert sum(len(b[0]) for b in theirs) == 1024

    before, peak = _peak_unreclaimable(run_torch)
    theirs = peak - before
    mib = 2**20
    report = (
        f"4 workers over {dataset_bytes / mib:.0f} MiB of dataset (512 MiB latents + "
        f"{dataset.records.nbytes / mib:.0f} MiB SharedRecords): unreclaimable memory (PSS) of "
        f"the process tree grew {ours / mib:.0f} MiB with ll.DataLoader ({workers_part / mib:.0f} "
        f"MiB for the 4 workers and their batches, the rest the one-time move of the latents "
        f"into shared memory) and {theirs / mib:.0f} MiB with torch's DataLoader (spawn)"
    )
    print(report)
    record_property("memory", report)
    # No worker holds a private copy of the latents or the records: what a
    # worker adds is its interpreter (Python, numpy, torch), not the dataset.
    for memory in per_worker:
        assert memory["Pss_Anon"] < dataset.latents.nbytes / 2, (memory, report)
        assert memory["Pss_Shmem"] < dataset.records.nbytes / 2, (memory, report)
    # The whole run stays far below 4 copies (4 x 612 MB) and torch's bill.
    assert ours < 0.4 * 4 * dataset_bytes, report
    assert ours < theirs / 3, report


def _smaps_rollup(pid: int) -> dict[str, int]:
    """Bytes per field of /proc/PID/smaps_rollup."""
    fields = {}
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                fields[parts[0].rstrip(":")] = int(parts[1]) * 1024
    return fields
