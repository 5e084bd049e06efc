"""ll.DataLoader against torch's DataLoader where a torch user can see it:
defaults, seeds over epochs, validation errors and warnings, datasets holding
multiprocessing objects, uneven iterable datasets, IterDataPipe sharding,
nested tensors, worker lifetime, threads, unguarded scripts, ll.install().

torch is the spec: each test runs torch beside leanloader (torch with its
default start method, fork: same batches as spawn, faster) and compares.
Datasets are module-level classes so that spawned workers can import them.
"""

from __future__ import annotations

import functools
import gc
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import (  # noqa: E402
    BatchSampler,
    Dataset,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
    get_worker_info,
)

import leanloader as ll  # noqa: E402
from leanloader.dataloader.single_iter import SingleProcessIterator  # noqa: E402
from processes import alive, wait_gone  # noqa: E402

# --- datasets -------------------------------------------------------------------------------


class Numbers(Dataset):
    def __init__(self, n: int = 13) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return torch.tensor([i, 10 * i])


class Seeds(Dataset):
    """What a worker sees each epoch: its id, seed, RNG draws, init calls and
    whether its dataset copy is fresh."""

    def __init__(self) -> None:
        self.touched = 0

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        import random

        import numpy as np

        info = get_worker_info()
        self.touched += 1  # a fresh copy per epoch starts from 0 again
        return torch.tensor(
            [i, info.id, info.seed % 2**31, INIT_CALLS, self.touched,
             int(random.random() * 1e6), int(np.random.rand() * 1e6),
             int(torch.rand(()) * 1e6)]
        )  # fmt: skip


INIT_CALLS = 0


def count_init(worker_id: int) -> None:
    global INIT_CALLS
    INIT_CALLS += 1


class Uneven(IterableDataset):
    """Worker 0 yields nothing, worker 1 four samples, worker 2 twenty; it
    reports a length of 10 (torch warns once more are fetched)."""

    COUNTS = (0, 4, 20)

    def __len__(self) -> int:
        return 10

    def __iter__(self):
        info = get_worker_info()
        worker = 2 if info is None else info.id
        for k in range(self.COUNTS[worker]):
            yield torch.tensor([worker, k])


class Counting(Dataset):
    """Holds multiprocessing objects of the spawn context: a Value counter, an
    Event stop flag, a Lock, a Semaphore and a Queue."""

    def __init__(self, n: int = 12) -> None:
        context = multiprocessing.get_context("spawn")
        self.n = n
        self.count = context.Value("i", 0)
        self.stop = context.Event()
        self.lock = context.Lock()
        self.slots = context.Semaphore(2)
        self.queue = context.Queue()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        with self.slots, self.lock:
            self.count.value += 1
        if i == self.n - 1:
            self.stop.set()
            self.queue.put(i)
        process = multiprocessing.current_process()
        # What the worker's Process object still holds of what it was sent.
        holding = sum(len(arg) for arg in process._args if isinstance(arg, (list, bytes)))
        return torch.tensor([i, holding])


class Holding(Dataset):
    """No multiprocessing objects: pickled once into bytes for all workers."""

    def __init__(self) -> None:
        import numpy as np

        self.table = np.arange(1 << 18, dtype=np.float64)  # 2 MiB: shared, not pickled

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int):
        process = multiprocessing.current_process()
        holding = sum(len(arg) for arg in process._args if isinstance(arg, (list, bytes)))
        return torch.tensor([i, holding, int(self.table[i])])


def nested_collate(batch):
    return torch.nested.nested_tensor([torch.arange(int(x[0]) % 3 + 1) for x in batch])


# --- helpers ----------------------------------------------------------------------------------


def _epochs(loader, epochs: int):
    return [[_plain(b) for b in loader] for _ in range(epochs)]


def _plain(batch):
    if isinstance(batch, torch.Tensor):
        if batch.is_nested:
            return [t.tolist() for t in batch.unbind()]
        return batch.tolist()
    if isinstance(batch, dict):
        return {k: _plain(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return [_plain(b) for b in batch]
    return batch


def _torch(dataset, **kwargs):
    if kwargs.get("num_workers"):
        kwargs.setdefault("multiprocessing_context", "fork")
    return torch.utils.data.DataLoader(dataset, **kwargs)


def _warnings_of(run):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run()
    return result, [str(w.message) for w in caught]


# --- 1. defaults and seeds per epoch ------------------------------------------------------


def test_defaults_are_torchs():
    ours, theirs = ll.DataLoader(Numbers()), torch.utils.data.DataLoader(Numbers())
    for name in ("persistent_workers", "prefetch_factor", "pin_memory_device", "in_order",
                 "timeout", "batch_size", "drop_last", "multiprocessing_context"):  # fmt: skip
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ll.DataLoader(Numbers(), num_workers=2).persistent_workers is False
    assert ll.DataLoader(Numbers(), num_workers=2).prefetch_factor == 2
    assert isinstance(ours, torch.utils.data.DataLoader)


def test_seeds_init_calls_and_fresh_dataset_each_epoch_like_torch():
    # Non-persistent workers: a new base seed from the generator each epoch,
    # worker_init_fn called each epoch, a fresh copy of the dataset each epoch.
    kwargs = dict(batch_size=2, shuffle=True, num_workers=2, worker_init_fn=count_init)
    ours = ll.DataLoader(Seeds(), generator=torch.Generator().manual_seed(3), **kwargs)
    theirs = _torch(Seeds(), generator=torch.Generator().manual_seed(3), **kwargs)
    got, want = _epochs(ours, 2), _epochs(theirs, 2)
    assert got == want
    assert got[0] != got[1]  # epoch 2 has its own seeds
    rows = [row for batch in got[1] for row in batch]
    assert {row[3] for row in rows} == {1}  # init ran once in each epoch's workers
    assert max(row[4] for row in rows) <= 4  # each epoch's dataset copy started fresh


def test_persistent_workers_keep_torchs_persistent_order():
    kwargs = dict(batch_size=2, shuffle=True, num_workers=2, persistent_workers=True,
                  worker_init_fn=count_init)  # fmt: skip
    ours = ll.DataLoader(Seeds(), generator=torch.Generator().manual_seed(5), **kwargs)
    theirs = _torch(Seeds(), generator=torch.Generator().manual_seed(5), **kwargs)
    assert _epochs(ours, 2) == _epochs(theirs, 2)
    ours.close()


# --- 2. parity over epochs, torch's defaults --------------------------------------------------

PARITY = {
    "sequential-0": dict(batch_size=4),
    "shuffle-0": dict(batch_size=4, shuffle=True),
    "shuffle-drop-last-0": dict(batch_size=4, shuffle=True, drop_last=True),
    "no-batching-0": dict(batch_size=None, shuffle=True),
    "random-sampler-replacement-2": lambda: dict(
        batch_size=4,
        num_workers=2,
        sampler=RandomSampler(
            range(13), replacement=True, num_samples=17, generator=torch.Generator().manual_seed(9)
        ),
    ),
    "batch-sampler-0": lambda: dict(
        batch_sampler=BatchSampler(SequentialSampler(range(13)), batch_size=5, drop_last=True)
    ),
    "collate-0": dict(batch_size=3, collate_fn=lambda b: torch.stack(b).sum(0)),
    "out-of-order-2": dict(batch_size=2, num_workers=2, in_order=False, shuffle=True),
}


@pytest.mark.parametrize("name", sorted(PARITY))
def test_epochs_match_torch(name):
    make = PARITY[name]
    args = make() if callable(make) else dict(make)
    ours = ll.DataLoader(Numbers(), generator=torch.Generator().manual_seed(11), **args)
    args = make() if callable(make) else dict(make)
    theirs = _torch(Numbers(), generator=torch.Generator().manual_seed(11), **args)
    got, want = _epochs(ours, 2), _epochs(theirs, 2)
    if args.get("in_order") is False:  # the order depends on timing; the content does not
        got, want = [sorted(map(str, e)) for e in got], [sorted(map(str, e)) for e in want]
    assert got == want
    assert got[0]


def test_single_process_loader_runs_leanloaders_iterator():
    loader = ll.DataLoader(Numbers(), batch_size=4)
    iterator = iter(loader)
    assert isinstance(iterator._inner, SingleProcessIterator)
    assert not isinstance(iterator._inner, torch.utils.data.dataloader._BaseDataLoaderIter)
    assert len(list(iterator)) == 4


# --- 3. datasets holding multiprocessing objects -----------------------------------------------


def test_dataset_with_multiprocessing_objects_works_with_two_workers():
    dataset = Counting()
    loader = ll.DataLoader(dataset, batch_size=3, num_workers=2)
    batches = list(loader)
    assert sorted(int(i) for b in batches for i in b[:, 0]) == list(range(12))
    assert dataset.count.value == 12  # the workers' increments reached this process
    assert dataset.stop.is_set()
    assert dataset.queue.get(timeout=5) == 11
    # Once unpickled, the worker kept none of the bytes it was sent.
    assert all(int(h) == 0 for b in batches for h in b[:, 1])


def test_dataset_bytes_are_let_go_by_workers_and_main_process():
    loader = ll.DataLoader(Holding(), batch_size=2, num_workers=2, persistent_workers=True)
    iterator = iter(loader)
    rows = torch.cat(list(iterator))
    assert rows[:, 0].tolist() == list(range(6)) and rows[:, 2].tolist() == list(range(6))
    assert rows[:, 1].tolist() == [0] * 6  # the workers' Process._args hold nothing
    # nor does the main process: its Process objects dropped their arguments
    # once started, and the loader keeps no pickled copy
    assert not any(hasattr(worker, "_args") for worker in iterator._workers)
    assert not any(isinstance(v, bytes) for v in vars(loader).values())
    loader.close()


# --- 4. uneven iterable datasets ------------------------------------------------------------


def test_uneven_iterable_dataset_runs_twenty_epochs_like_torch():
    kwargs = dict(batch_size=None, num_workers=3)
    ours = ll.DataLoader(Uneven(), persistent_workers=True, **kwargs)
    expected = sorted(map(str, [[1, k] for k in range(4)] + [[2, k] for k in range(20)]))
    for _ in range(20):
        assert sorted(map(str, _plain(list(ours)))) == expected
    ours.close()
    # torch's defaults, one epoch: the same samples in the same order
    (got, want) = (_epochs(ll.DataLoader(Uneven(), **kwargs), 1),
                   _epochs(_torch(Uneven(), **kwargs), 1))  # fmt: skip
    assert got == want


class _SlowSecondWorker(IterableDataset):
    """Three samples per worker; worker 1 slow, so that worker 0's stream has
    ended while tasks are still queued to it."""

    def _next(self) -> int:
        if self.pos >= 3:
            self.ended()
            raise StopIteration
        self.pos += 1
        if get_worker_info().id == 1:
            time.sleep(0.2)
        return self.pos


class Rewinding(_SlowSecondWorker):
    """Iterates itself and rewinds at its end (re-iterable without __iter__)."""

    def __init__(self) -> None:
        self.pos = 0

    def __iter__(self):
        return self

    def __next__(self) -> int:
        return self._next()

    def ended(self) -> None:
        self.pos = 0


class ClosingReader(_SlowSecondWorker):
    """Refuses next() once its stream has ended, as a closed file does."""

    def __iter__(self):
        self.pos, self.closed = 0, False
        return self

    def __next__(self) -> int:
        if self.closed:
            raise ValueError("I/O operation on closed file")
        return self._next()

    def ended(self) -> None:
        self.closed = True


@pytest.mark.parametrize("dataset", [Rewinding, ClosingReader])
@pytest.mark.parametrize("persistent", [False, True])
def test_a_worker_whose_stream_ended_asks_it_for_nothing_more_as_torch(dataset, persistent):
    """torch's worker skips the tasks queued behind the end of its stream
    (iteration_end); ours called next() again for each: a rewinding iterator
    leaked a second round into the pass, a closed reader raised."""
    kwargs = dict(batch_size=None, num_workers=2, prefetch_factor=4, persistent_workers=persistent)
    ours = _epochs(ll.DataLoader(dataset(), **kwargs), 2)
    assert ours == _epochs(_torch(dataset(), **kwargs), 2)
    assert ours[0] == [1, 1, 2, 2, 3, 3]


@pytest.mark.parametrize("workers", [0, 3])
def test_iterable_length_warning_is_torchs(workers):
    def run(cls):
        loader = cls(Uneven(), batch_size=None, num_workers=workers)
        assert len(loader) == 10  # (torch warns only after len() was asked)
        return len(list(loader))

    (count, ours) = _warnings_of(lambda: run(ll.DataLoader))
    (torch_count, theirs) = _warnings_of(lambda: run(lambda *a, **k: _torch(*a, **k)))
    assert count == torch_count
    length = [m for m in ours if m.startswith("Length of IterableDataset")]
    assert len(length) == count - 10  # one per sample past the reported length
    assert [m.split(" was reported")[1] for m in length] == [
        m.split(" was reported")[1] for m in theirs if m.startswith("Length of IterableDataset")
    ]


def test_iterable_length_warning_points_at_the_users_loop_as_torchs():
    def where(cls, workers):
        loader = cls(Uneven(), batch_size=None, num_workers=workers)
        len(loader)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in loader:  # the line the warning must name
                pass
        length = [w for w in caught if str(w.message).startswith("Length of IterableDataset")]
        return {(w.filename, w.lineno) for w in length}

    for workers in (0, 3):
        ours, theirs = where(ll.DataLoader, workers), where(_torch, workers)
        assert ours == theirs and len(ours) == 1, (workers, ours, theirs)
        assert ours.pop()[0] == __file__


# --- 5. IterDataPipe ----------------------------------------------------------------------------


def _datapipe():
    from torch.utils.data.datapipes.iter import IterableWrapper

    return IterableWrapper(range(20)).shuffle().sharding_filter()


@pytest.mark.parametrize("workers", [0, 2])
def test_datapipe_sharded_and_shuffled_like_torch(workers):
    kwargs = dict(batch_size=4, shuffle=True, num_workers=workers)
    got = _epochs(
        ll.DataLoader(_datapipe(), generator=torch.Generator().manual_seed(2), **kwargs), 2
    )
    want = _epochs(_torch(_datapipe(), generator=torch.Generator().manual_seed(2), **kwargs), 2)
    assert got == want
    for epoch in got:  # every sample once per epoch, not once per worker
        assert sorted(x for batch in epoch for x in batch) == list(range(20))
    assert got[0] != got[1]


# --- 6. nested tensors ---------------------------------------------------------------------


def clone_collate(batch):
    return [x.clone() for x in batch]


def test_nested_tensor_batches():
    kwargs = dict(batch_size=3, num_workers=2, collate_fn=nested_collate)
    got = _epochs(ll.DataLoader(Numbers(), **kwargs), 1)
    assert got == _epochs(_torch(Numbers(), **kwargs), 1)
    assert got[0][0] == [[0], [0, 1], [0, 1, 2]]
    # a dataset of nested tensors, one of them large (past share_threshold)
    dataset = [torch.nested.nested_tensor([torch.randn(5), torch.randn(3)]) for _ in range(4)]
    dataset.append(torch.nested.nested_tensor([torch.randn(300_000), torch.randn(2)]))
    loader = ll.DataLoader(dataset, batch_size=1, num_workers=2, collate_fn=clone_collate)
    for i, batch in enumerate(loader):
        assert batch[0].is_nested
        assert all(
            torch.equal(a, b) for a, b in zip(batch[0].unbind(), dataset[i].unbind(), strict=True)
        )
    # torch's default collate refuses nested tensors: the same error comes back
    with pytest.raises(RuntimeError, match="not currently supported by the default collate_fn"):
        next(iter(ll.DataLoader(dataset, batch_size=1, num_workers=2)))


# --- 7. worker lifetime without the garbage collector ----------------------------------------


def test_deleting_iterator_and_loader_ends_workers_without_gc():
    gc.disable()
    try:
        loader = ll.DataLoader(Numbers(), batch_size=2, num_workers=2, persistent_workers=True)
        iterator = iter(loader)
        next(iterator)
        pids = [w.pid for w in iterator._workers]
        del iterator
        assert all(alive(p) for p in pids)  # persistent: the loader keeps them (as torch)
        del loader
        assert wait_gone(pids), "persistent workers outlived their loader"

        loader = ll.DataLoader(Numbers(), batch_size=2, num_workers=2)
        iterator = iter(loader)
        next(iterator)
        pids = [w.pid for w in iterator._workers]
        del iterator
        assert wait_gone(pids), "workers outlived their iterator"
    finally:
        gc.enable()


class FlakySampler(torch.utils.data.Sampler):
    """Raises once, at position 5 (an index service's hiccup)."""

    def __iter__(self):
        for i in range(8):
            if i == 5:
                raise ConnectionError("index service hiccup")
            yield i

    def __len__(self) -> int:
        return 8


class SlowFirstOfFour(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        if i == 0:
            time.sleep(2.5)
        return i


def _drain(iterator, calls: int) -> list:
    out = []
    for _ in range(calls):
        try:
            out.append(_plain(next(iterator)))
        except StopIteration:
            out.append("StopIteration")
            break
        except Exception as error:
            out.append(f"{type(error).__name__}: {str(error)[:36]}")
    return out


class EagerSampler(Sampler):
    """Draws its order in __iter__ itself (not a generator function), as a
    sampler written ``return iter(torch.randperm(n).tolist())`` does."""

    def __iter__(self):
        return iter(torch.randperm(8).tolist())

    def __len__(self):
        return 8


class EagerBatchSampler(Sampler):
    def __iter__(self):
        order = torch.randperm(8).tolist()
        return iter([order[:3], order[3:6], order[6:]])

    def __len__(self):
        return 3


@pytest.mark.parametrize(("workers", "mode"), [(0, None), (2, "thread"), (2, "process")])
def test_a_sampler_drawing_in_iter_gives_torchs_order(workers, mode):
    """torch calls iter(sampler) before drawing its base seed, and a worker
    iterator calls it again at the end of its __init__: a sampler drawing in
    __iter__ draws there. Ours drew at the first index, after the base seed
    (another order for the same torch.manual_seed), and once with workers."""

    def run(make):
        torch.manual_seed(0)
        order = [int(x) for x in make(list(range(8)), sampler=EagerSampler(), batch_size=None)]
        batches = [b.tolist() for b in make(list(range(8)), batch_sampler=EagerBatchSampler())]
        return order, batches, torch.randint(0, 1 << 30, (1,)).item()

    extra = {"num_workers": workers} | ({"worker_mode": mode} if mode else {})
    ours = run(functools.partial(ll.DataLoader, **extra))
    theirs = run(functools.partial(_torch, num_workers=workers))
    assert ours == theirs


def _first_error_line(make, dataset, **kwargs):
    try:
        list(make(dataset, num_workers=1, **kwargs))
    except Exception as error:
        return type(error).__name__, str(error).splitlines()[0]
    return None


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_errors_of_c_level_datasets_and_callables_read_as_torchs(mode):
    """A list or a tensor as the dataset, or a worker_init_fn that is not
    callable, raises from C code, with no frame of its own: the error was
    taken for leanloader's and re-raised bare ("list index out of range")
    where torch says "Caught IndexError in DataLoader worker process 0."."""
    cases = [
        ([10, 11, 12], dict(sampler=[0, 5], batch_size=2)),
        (torch.arange(4), dict(sampler=[0, 9], batch_size=2)),
        ([1, 2], dict(worker_init_fn=5)),
    ]
    for dataset, kwargs in cases:
        theirs = _first_error_line(_torch, dataset, **kwargs)
        ours = _first_error_line(
            functools.partial(ll.DataLoader, worker_mode=mode), dataset, **kwargs
        )
        assert theirs is not None and theirs[1].startswith("Caught ")
        assert ours == (theirs[0], theirs[1].replace(" process ", f" {mode} ")), kwargs


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_an_error_of_the_sampler_or_a_timeout_leaves_the_iterator_usable_as_torch(mode):
    """torch's iterator goes on after its sampler raised or a timeout expired:
    a skip-and-continue loop finishes the pass, a retry gets the slow batch.
    Ours shut its workers down on any error raised in the main process and
    raised "shut down" from then on, never StopIteration; the thread mode
    lost the batch it timed out on."""
    flaky = dict(batch_size=1, sampler=FlakySampler(), num_workers=2)
    ours = _drain(iter(ll.DataLoader(Numbers(), worker_mode=mode, **flaky)), 8)
    assert ours == _drain(iter(_torch(Numbers(), **flaky)), 8)
    assert ours[-1] == "StopIteration" and "ConnectionError" in ours[1]
    slow = dict(batch_size=1, num_workers=1, timeout=1)
    ours = _drain(iter(ll.DataLoader(SlowFirstOfFour(), worker_mode=mode, **slow)), 8)
    assert ours == _drain(iter(_torch(SlowFirstOfFour(), **slow)), 8)
    assert ours[-5:] == [[0], [1], [2], [3], "StopIteration"]


# --- 8. torch's guards, validation and warnings -----------------------------------------------


def test_attribute_guard_generic_class_and_pin_memory_device():
    loader = ll.DataLoader(Numbers(), batch_size=2, pin_memory_device="cpu")
    for name, value in (("batch_size", 5), ("sampler", None), ("dataset", Numbers()),
                        ("drop_last", True), ("persistent_workers", True)):  # fmt: skip
        with pytest.raises(ValueError) as ours:
            setattr(loader, name, value)
        theirs = torch.utils.data.DataLoader(Numbers(), batch_size=2)
        with pytest.raises(ValueError) as want:
            setattr(theirs, name, value)
        assert str(ours.value) == str(want.value)
    loader.timeout = 3  # not guarded, as in torch
    assert ll.DataLoader[int] is not None
    assert loader.pin_memory_device == "cpu"


BAD_ARGUMENTS = {
    "negative-workers": dict(num_workers=-1),
    "negative-timeout": dict(timeout=-1),
    "prefetch-without-workers": dict(prefetch_factor=2),
    "negative-prefetch": dict(num_workers=1, prefetch_factor=-1),
    "persistent-without-workers": dict(persistent_workers=True),
    "sampler-and-shuffle": dict(sampler=[0, 1], shuffle=True),
    "batch-sampler-and-batch-size": dict(batch_sampler=[[0, 1]], batch_size=2),
    "no-batching-drop-last": dict(batch_size=None, drop_last=True),
    "context-without-workers": dict(multiprocessing_context="spawn"),
    "unknown-context": dict(num_workers=1, multiprocessing_context="nope"),
    "context-of-wrong-type": dict(num_workers=1, multiprocessing_context=3),
    "iterable-with-shuffle": dict(dataset=Uneven(), shuffle=True),
    "iterable-with-sampler": dict(dataset=Uneven(), sampler=[0]),
    "workers-none": dict(num_workers=None),
    "workers-string": dict(num_workers="2"),
}


@pytest.mark.parametrize("name", sorted(BAD_ARGUMENTS))
def test_constructor_errors_are_torchs(name):
    kwargs = dict(BAD_ARGUMENTS[name])
    dataset = kwargs.pop("dataset", Numbers())
    with pytest.raises(Exception) as want:
        torch.utils.data.DataLoader(dataset, **kwargs)
    with pytest.raises(Exception) as ours:
        ll.DataLoader(dataset, **kwargs)
    assert type(ours.value) is type(want.value)
    assert str(ours.value) == str(want.value)


def test_a_generator_that_is_not_one_fails_as_in_torch():
    # torch's TypeError from random_(generator=5), not an AttributeError of ours
    with pytest.raises(Exception) as want:
        list(torch.utils.data.DataLoader(Numbers(), shuffle=True, generator=5))
    with pytest.raises(Exception) as ours:
        list(ll.DataLoader(Numbers(), shuffle=True, generator=5))
    assert type(ours.value) is type(want.value) is TypeError
    assert str(ours.value) == str(want.value)


def test_too_many_workers_warns_like_torch():
    workers = (os.cpu_count() or 1) + 3
    _, ours = _warnings_of(lambda: ll.DataLoader(Numbers(), num_workers=workers))
    _, theirs = _warnings_of(lambda: torch.utils.data.DataLoader(Numbers(), num_workers=workers))
    assert ours == theirs and len(ours) == 1
    assert f"will create {workers} worker processes" in ours[0]


def test_a_plain_loop_warns_nothing():
    loader = ll.DataLoader(Numbers(64), batch_size=2, num_workers=2)
    batches, caught = _warnings_of(lambda: list(loader))
    assert len(batches) == 32
    assert caught == []


# --- 9. pin_memory ------------------------------------------------------------------------------


def test_pin_memory_without_an_accelerator_is_torchs_warning_and_no_pinning():
    if torch.accelerator.is_available():
        pytest.skip("an accelerator is present: batches are pinned")
    ours, got = _warnings_of(lambda: list(ll.DataLoader(Numbers(), batch_size=4, pin_memory=True)))
    theirs, want = _warnings_of(
        lambda: list(torch.utils.data.DataLoader(Numbers(), batch_size=4, pin_memory=True))
    )
    assert got == want and len(got) == 1
    assert not any(b.is_pinned() for b in ours)
    assert _plain(ours) == _plain(theirs)


# --- 11. threads ----------------------------------------------------------------------------------


class ThreadInfo(Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int):
        info = get_worker_info()
        return torch.tensor([i, info.id, info.num_workers, info.seed, THREAD_INITS.get(info.id, 0)])


THREAD_INITS: dict[int, int] = {}


def thread_init(worker_id: int) -> None:
    info = get_worker_info()
    assert info.id == worker_id
    THREAD_INITS[worker_id] = THREAD_INITS.get(worker_id, 0) + 1


@pytest.mark.parametrize("persistent", [False, True])
def test_thread_workers_have_worker_info_init_and_torchs_order(persistent):
    THREAD_INITS.clear()
    kwargs = dict(batch_size=2, shuffle=True, num_workers=2, persistent_workers=persistent)
    ours = ll.DataLoader(ThreadInfo(), generator=torch.Generator().manual_seed(4),
                         worker_mode="thread", worker_init_fn=thread_init, **kwargs)  # fmt: skip
    theirs = _torch(Numbers(16), generator=torch.Generator().manual_seed(4), **kwargs)
    for epoch in range(3):
        got = list(ours)
        want = list(theirs)
        assert [b[:, 0].tolist() for b in got] == [b[:, 0].tolist() for b in want]
        rows = torch.cat(got)
        # batch i is worker i % 2's, as torch deals them
        assert [set(b[:, 1].tolist()) for b in got] == [{i % 2} for i in range(len(got))]
        assert set(rows[:, 2].tolist()) == {2}
        for row in rows.tolist():  # seed = base seed + worker id, one base seed for all
            assert row[3] - row[1] == rows[0, 3] - rows[0, 1]
        # init ran once per worker per epoch (non-persistent) or once in all
        assert THREAD_INITS == dict.fromkeys((0, 1), 1 if persistent else epoch + 1)
        # each batch saw its worker's init done (this pass's, unless persistent)
        assert set(rows[:, 4].tolist()) == {1 if persistent else epoch + 1}
    assert get_worker_info() is None  # the main thread is no worker
    ours.close()


def _mark_init(directory: Path, worker_id: int) -> None:
    info = get_worker_info()  # a file per call (thread idents are reused)
    os.close(tempfile.mkstemp(dir=directory, prefix=f"{worker_id}-{info.id}-")[0])


@pytest.mark.parametrize("persistent", [False, True])
def test_every_thread_worker_runs_its_init_even_without_a_sample_as_torch(tmp_path, persistent):
    """One batch, two workers: torch's second worker process takes no batch
    and still runs worker_init_fn; so does our second thread."""
    kwargs = dict(batch_size=16, num_workers=2, persistent_workers=persistent)

    def torchs(init):
        return _torch(Numbers(16), worker_init_fn=init, **kwargs)

    def ours(init):
        return ll.DataLoader(Numbers(16), worker_mode="thread", worker_init_fn=init, **kwargs)

    for name, make in [("torch", torchs), ("ours", ours)]:
        directory = tmp_path / name
        directory.mkdir()
        loader = make(functools.partial(_mark_init, directory))
        for _ in range(2):
            assert [b[:, 0].tolist() for b in loader] == [list(range(16))]
        calls = sorted(path.name.split("-")[:2] for path in directory.iterdir())
        once_each = [["0", "0"], ["1", "1"]]
        assert calls == (once_each if persistent else sorted(once_each * 2)), name


class SlowFirst(Dataset):
    """Sample 0 takes a second; the others none."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        if i == 0:
            time.sleep(1.0)
        return i


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_in_order_false_returns_the_batches_ready_first_as_torch(mode):
    kwargs = dict(batch_size=1, num_workers=2)
    for in_order in (True, False):
        theirs = [b.tolist() for b in _torch(SlowFirst(), in_order=in_order, **kwargs)]
        ours = [b.tolist() for b in ll.DataLoader(SlowFirst(), worker_mode=mode,
                                                   in_order=in_order, **kwargs)]  # fmt: skip
        assert sorted(theirs) == sorted(ours) == [[i] for i in range(8)]
        if in_order:
            assert theirs == ours == [[i] for i in range(8)]
        else:  # the slow first batch is not waited for
            assert theirs[0] != [0] and ours[0] != [0], (theirs, ours)


def _fail_init_of_worker_one(worker_id: int) -> None:
    if worker_id == 1:
        raise ValueError("worker 1 cannot start")


def _outcomes(iterator, batches):
    """Each batch's first column, or the type of what next() raised."""
    got = []
    for _ in range(batches):
        try:
            got.append(next(iterator)[:, 0].tolist())
        except Exception as error:
            got.append(type(error))
            if len(got) == 2:  # the first failure carries the init's own error
                assert isinstance(error, ValueError) and "worker 1 cannot start" in str(error)
    with pytest.raises(StopIteration):
        next(iterator)
    return got


@pytest.mark.parametrize("mode", ["thread", "process"])
@pytest.mark.parametrize("persistent", [False, True])
def test_a_failed_worker_init_fails_that_workers_batches_as_torch(persistent, mode):
    """torch deals batches round-robin; a worker whose init failed hands the
    init's error to its first batch and fails every later one of the pass
    (it has no fetcher), while the other workers' batches arrive. A
    persistent worker rebuilds its fetcher for the next pass and loads."""
    kwargs = dict(batch_size=2, num_workers=2, worker_init_fn=_fail_init_of_worker_one,
                  persistent_workers=persistent)  # fmt: skip
    outcomes = []
    for loader in (
        _torch(Numbers(8), **kwargs),
        ll.DataLoader(Numbers(8), worker_mode=mode, **kwargs),
    ):
        outcomes.append([_outcomes(iter(loader), len(loader)) for _ in range(2)])
        if persistent:
            loader._iterator._shutdown_workers()
    theirs, ours = outcomes
    for epoch in range(2):
        if persistent and epoch == 1:
            assert theirs[1] == ours[1] == [[0, 1], [2, 3], [4, 5], [6, 7]]
            continue
        assert theirs[epoch][0] == ours[epoch][0] == [0, 1]
        assert theirs[epoch][2] == ours[epoch][2] == [4, 5]
        assert theirs[epoch][1] is ours[epoch][1] is ValueError
        assert theirs[epoch][3] is UnboundLocalError  # torch's accident; ours names the cause
        # threads: a RuntimeError naming the init's error; processes: that error again
        assert ours[epoch][3] is (RuntimeError if mode == "thread" else ValueError)


# --- 12. a script without a main guard ------------------------------------------------------------

UNGUARDED = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    import leanloader as ll
    from test_dataloader_parity import Numbers
    print("top level ran")
    loader = ll.DataLoader(Numbers(), batch_size=2, num_workers=2)
    print(len(list(loader)))
    """
)

UNGUARDED_OWN_DATASET = textwrap.dedent(
    """
    import torch
    import leanloader as ll


    class Mine(torch.utils.data.Dataset):
        def __len__(self):
            return 6

        def __getitem__(self, i):
            return i


    print("top level ran")
    loader = ll.DataLoader(Mine(), batch_size=2, num_workers=2)
    print(len(list(loader)))
    """
)


def test_an_unguarded_script_runs_once_when_workers_need_nothing_from_it(tmp_path):
    # Ultralytics' examples have no main guard. The dataset lives in another
    # module: workers do not import the script, so it runs once, as with fork.
    script = tmp_path / "train.py"
    script.write_text(UNGUARDED.format(tests=str(Path(__file__).parent)))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["top level ran", "7"], result.stdout


def test_an_unguarded_script_whose_dataset_lives_in_it_runs_once_from_a_forked_server(tmp_path):
    # Without a GPU runtime the fork server is a fork of the main process:
    # its workers have `__main__` already and import nothing again.
    script = tmp_path / "train.py"
    script.write_text(UNGUARDED_OWN_DATASET)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["top", "level", "ran", "3"], result.stdout


def test_an_unguarded_script_whose_dataset_lives_in_it_is_stopped_before_workers_start(tmp_path):
    # With a GPU runtime initialised the fork server is a new interpreter,
    # whose workers would import (and run) the script again.
    fresh_server = "import torch\ntorch.cuda.is_initialized = lambda: True\n"
    script = tmp_path / "train.py"
    script.write_text(fresh_server + UNGUARDED_OWN_DATASET)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert result.returncode != 0
    assert result.stdout.count("top level ran") == 1, result.stdout  # no worker re-ran it
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError"), result.stderr
    line = (fresh_server + UNGUARDED_OWN_DATASET).splitlines().index("print(len(list(loader)))") + 1
    assert f"{script} (line {line})" in last
    assert 'if __name__ == "__main__":' in last and 'worker_mode="thread"' in last
    # the same code works once guarded, and unguarded with threads
    guarded = UNGUARDED_OWN_DATASET.replace('print("top level ran")', 'if __name__ == "__main__":')
    guarded = guarded.replace("\nloader = ", "\n    loader = ").replace(
        "\nprint(len", "\n    print(len"
    )
    for text in (
        guarded,
        UNGUARDED_OWN_DATASET.replace("num_workers=2)", 'num_workers=2, worker_mode="thread")'),
    ):
        script.write_text(fresh_server + text)
        result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                                timeout=120)  # fmt: skip
        assert result.returncode == 0 and result.stdout.strip().splitlines()[-1] == "3", (
            result.stdout + result.stderr
        )


# --- 13. ll.install() -----------------------------------------------------------------------------

FRAMEWORK = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    {install}
    import torch
    from torch.utils.data import DataLoader, dataloader
    from test_dataloader_parity import Numbers


    class _RepeatSampler:
        def __init__(self, sampler):
            self.sampler = sampler

        def __iter__(self):
            while True:
                yield from iter(self.sampler)


    class InfiniteDataLoader(dataloader.DataLoader):  # as YOLO trainers define it
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            object.__setattr__(self, "batch_sampler", _RepeatSampler(self.batch_sampler))
            self.iterator = super().__iter__()

        def __len__(self):
            return len(self.batch_sampler.sampler)

        def __iter__(self):
            for _ in range(len(self)):
                yield next(self.iterator)


    if __name__ == "__main__":
        loader = InfiniteDataLoader(Numbers(), batch_size=2, num_workers=2)
        batches = [b[:, 0].tolist() for b in loader] + [b[:, 0].tolist() for b in loader]
        names = sorted(open(f"/proc/{{w.pid}}/comm").read().strip()
                       for w in loader.iterator._workers)
        import leanloader as ll
        print(type(loader).__mro__[1].__module__, isinstance(loader, ll.DataLoader),
              ",".join(names), len(batches), batches[7])
        {uninstall}
    """
)


@pytest.mark.parametrize("how", ["install", "run"])
def test_install_turns_framework_subclasses_into_leanloader_loaders(tmp_path, how):
    install = "import leanloader as ll; ll.install()" if how == "install" else ""
    uninstall = (
        "ll.uninstall(); assert torch.utils.data.DataLoader is torch.utils.data.dataloader."
        "DataLoader and not issubclass(torch.utils.data.DataLoader, ll.DataLoader)"
        if how == "install" else ""
    )  # fmt: skip
    script = tmp_path / "train.py"
    script.write_text(FRAMEWORK.format(tests=str(Path(__file__).parent), install=install,
                                       uninstall=uninstall))  # fmt: skip
    command = [sys.executable, str(script)]
    if how == "run":
        command = [sys.executable, "-m", "leanloader.run", str(script)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    # an ll.DataLoader subclass, its workers leanloader's, its batches
    # continuing across passes of the repeating sampler (batch 7 starts the second pass)
    assert result.stdout.split() == [
        "leanloader.dataloader.front",
        "True",
        "ll_data_worker,ll_data_worker",
        "14",
        "[0,",
        "1]",
    ], result.stdout + result.stderr


class PinRecorder(Dataset):
    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int):
        return torch.full((256,), float(i))


@pytest.mark.skipif(
    not torch.accelerator.is_available(), reason="pinning needs an accelerator (CUDA)"
)
@pytest.mark.parametrize("workers", [0, 2])
def test_pin_memory_pins_in_a_pin_thread_in_order(workers, monkeypatch):
    import threading

    from torch.utils.data._utils import pin_memory as torch_pin

    pinning_threads = set()
    pin = torch_pin.pin_memory

    def recording_pin(data, device=None):  # torch's function, its threads recorded
        pinning_threads.add(threading.current_thread().name)
        return pin(data, device)

    monkeypatch.setattr(torch_pin, "pin_memory", recording_pin)
    loader = ll.DataLoader(PinRecorder(), batch_size=2, num_workers=workers, pin_memory=True)
    batches = list(loader)
    assert all(b.is_pinned() for b in batches)
    assert [int(b[0, 0]) for b in batches] == list(range(0, 12, 2))
    assert pinning_threads == {"leanloader-pin-memory"}


def test_an_iterator_outlives_its_loader_and_workers_exit_cleanly():
    # iter(DataLoader(...)) is a common idiom: the loader is dropped at once,
    # its shared copies of the dataset's arrays must outlive it.
    for persistent in (False, True):
        iterator = iter(ll.DataLoader(Holding(), batch_size=2, num_workers=2,
                                      persistent_workers=persistent))  # fmt: skip
        rows = torch.cat(list(iterator))
        assert rows[:, 2].tolist() == list(range(6))
        workers = iterator._workers
        del iterator
        for worker in workers:
            worker.join(10)
            assert worker.exitcode == 0  # (torch's tests check it)


class Raising(Dataset):
    def __len__(self) -> int:
        return 41

    def __getitem__(self, i: int):
        raise NotImplementedError


def test_errors_in_workers_raise_per_batch_and_the_pass_goes_on_like_torch():
    def count(loader):
        iterator, errors = iter(loader), 0
        while True:
            try:
                next(iterator)
            except NotImplementedError:
                errors += 1
            except StopIteration:
                return errors

    kwargs = dict(batch_size=2, shuffle=True, num_workers=2)
    assert count(ll.DataLoader(Raising(), **kwargs)) == count(_torch(Raising(), **kwargs)) == 21


class BatchedFetch(Dataset):
    """A dataset with torch's batched fetch hook: __getitems__ gives what
    __getitem__ does not, so the batches tell which one was called."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int):
        return torch.tensor(i)

    def __getitems__(self, indices):
        return [torch.tensor(i * 100) for i in indices]


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_getitems_fetches_the_batch_in_both_worker_modes_as_torch(mode):
    kwargs = dict(batch_size=3, num_workers=2)
    ours = [b.tolist() for b in ll.DataLoader(BatchedFetch(), worker_mode=mode, **kwargs)]
    assert ours == [b.tolist() for b in _torch(BatchedFetch(), **kwargs)]
    assert ours == [[0, 100, 200], [300, 400, 500]]


class TwoArgumentError(Exception):
    def __init__(self, first, second):
        super().__init__(first)


class RaisingKinds(Dataset):
    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int):
        raise KeyError("k") if self.kind == "key" else TwoArgumentError("a", "b")


@pytest.mark.parametrize("mode", ["thread", "process"])
@pytest.mark.parametrize("kind", ["key", "two_arguments"])
def test_a_workers_error_is_reraised_in_torchs_form(mode, kind):
    """torch's main process re-raises a worker's error through
    ExceptionWrapper: "Caught KeyError in DataLoader worker process 0." with
    the original traceback, and a RuntimeError for a type that cannot be
    built from one message. Thread workers say "worker thread"."""

    def first_error(loader):
        with pytest.raises(Exception) as caught:
            next(iter(loader))
        return caught.value

    ours = first_error(ll.DataLoader(RaisingKinds(kind), batch_size=2, num_workers=1,
                                     worker_mode=mode))  # fmt: skip
    theirs = first_error(_torch(RaisingKinds(kind), batch_size=2, num_workers=1))
    assert type(ours) is type(theirs)
    noun = "thread" if mode == "thread" else "process"
    expected = str(theirs).splitlines()[0].replace("worker process", f"worker {noun}")
    assert str(ours).splitlines()[0] == expected
    assert "Original Traceback" in str(ours) and "__getitem__" in str(ours)


# torch's iterator, refused in its __init__, fails again in its __del__ (no
# _shutdown yet): torch's own noise at collection, not the test's outcome.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("mode", ["thread", "process"])
def test_prefetch_factor_zero_is_refused_when_iterated_as_torch(mode):
    loader = ll.DataLoader(Numbers(), batch_size=2, num_workers=2, prefetch_factor=0,
                           worker_mode=mode)  # fmt: skip
    reference = _torch(Numbers(), batch_size=2, num_workers=2, prefetch_factor=0)
    with pytest.raises(AssertionError) as theirs:
        iter(reference)
    with pytest.raises(AssertionError) as ours:
        iter(loader)
    assert str(ours.value) == str(theirs.value)


class ViewsAndFlags(Dataset):
    """Tensors a contiguous copy would change: torch's pickled batch keeps
    their strides, shared storage, identity, requires_grad and class."""

    def __len__(self) -> int:
        return 3

    def __getitem__(self, i: int):
        import numpy as np

        base = torch.arange(6.0).reshape(2, 3) + i
        return {
            "transposed": base.t(),
            "a": base,
            "same": base,
            "row": base[1],
            "bytes": base.view(torch.uint8)[4:12],
            "channels_last": torch.arange(24.0)
            .reshape(1, 2, 3, 4)
            .to(memory_format=torch.channels_last),
            "grad": torch.ones(2).requires_grad_(),
            "parameter": torch.nn.Parameter(torch.full((2,), float(i))),
            "fortran": np.asfortranarray(np.arange(6, dtype=np.int32).reshape(2, 3) + i),
            "plain": torch.arange(4) + i,
        }


def _describe(batch):
    import numpy as np

    def storage(key):
        return batch[key].untyped_storage().data_ptr()

    return {
        "values": {
            k: (v.detach().numpy() if isinstance(v, torch.Tensor) else v).tolist()
            for k, v in batch.items()
        },
        "strides": {
            k: tuple(v.stride()) if isinstance(v, torch.Tensor) else v.strides
            for k, v in batch.items()
        },
        "types": {k: type(v).__name__ for k, v in batch.items()},
        "requires_grad": {
            k: v.requires_grad for k, v in batch.items() if isinstance(v, torch.Tensor)
        },
        "a is same": batch["a"] is batch["same"],
        "views share a's storage": [
            storage(k) == storage("a") for k in ("transposed", "row", "bytes")
        ],
        "channels_last": batch["channels_last"].is_contiguous(memory_format=torch.channels_last),
        "fortran": isinstance(batch["fortran"], np.ndarray) and batch["fortran"].flags.f_contiguous,
    }


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_batch_keeps_strides_shared_storage_identity_and_grad_as_torchs(mode):
    kwargs = dict(batch_size=None, num_workers=2)
    ours = [_describe(b) for b in ll.DataLoader(ViewsAndFlags(), worker_mode=mode, **kwargs)]
    theirs = [_describe(b) for b in _torch(ViewsAndFlags(), **kwargs)]
    assert ours == theirs
    assert theirs[0]["a is same"] and all(theirs[0]["views share a's storage"])


def test_batches_and_views_held_at_exit_are_released_without_a_leak_report(tmp_path):
    """A program that ends holding batches, or views of them, in globals or
    in reference cycles exits quietly: no "nanobind: leaked" (torch keeps a
    view's base alive past the extension module; the segments under it must
    not hold a Python object of ours)."""
    script = tmp_path / "cycle.py"
    script.write_text(
        textwrap.dedent("""
        import torch
        import leanloader as ll

        class Data(torch.utils.data.Dataset):
            def __len__(self):
                return 8

            def __getitem__(self, i):
                return {"x": torch.arange(6.0).reshape(2, 3).t() + i, "y": torch.ones(3)}

        def as_is(batch):
            return batch

        def keep(batch):
            def walk():
                return walk, batch  # a cycle: walk's cell holds walk
            return walk

        if __name__ == "__main__":
            loader = ll.DataLoader(Data(), batch_size=None, num_workers=2, collate_fn=as_is)
            held = [keep(b) for b in loader]
            views = [b["y"][:1] for b in loader]
            print(len(held), len(views))
    """)
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "8 8"
    assert "leaked" not in done.stderr, done.stderr


class NeedsGrad(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        return {"x": torch.ones(2).requires_grad_(), "i": i}


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_default_collate_of_samples_that_require_grad_fails_in_workers_as_torch(mode):
    """torch's default_collate stacks into shared memory in a worker
    (stack(out=)), which autograd refuses: the batch fails there, not quietly
    without its grad."""

    def error(loader):
        with pytest.raises(RuntimeError) as caught:
            next(iter(loader))
        return str(caught.value).splitlines()[-1]

    kwargs = dict(batch_size=2, num_workers=1)
    ours = error(ll.DataLoader(NeedsGrad(), worker_mode=mode, **kwargs))
    assert ours == error(_torch(NeedsGrad(), **kwargs))
    assert "requires grad" in ours


class ZeroDimArrays(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        return {"label": np.array(i, dtype=np.int64), "weight": np.array(0.5)}


def _count_and_stack(samples):
    return {"n": np.array(len(samples)), "x": np.stack([s["weight"] for s in samples])}


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_zero_dim_arrays_keep_their_shape_as_torch(mode):
    """A 0-d NumPy array in a batch crossed the process boundary as shape
    (1,) (np.ascontiguousarray gives at least one dimension): labels came out
    (B, 1) where torch's come out (B,)."""

    def shapes(loader):
        return [{k: (type(v).__name__, tuple(v.shape)) for k, v in b.items()} for b in loader]

    for kwargs in (dict(batch_size=2), dict(batch_size=2, collate_fn=_count_and_stack),
                   dict(batch_size=None)):  # fmt: skip
        ours = shapes(ll.DataLoader(ZeroDimArrays(), num_workers=1, worker_mode=mode, **kwargs))
        assert ours == shapes(_torch(ZeroDimArrays(), num_workers=1, **kwargs)), kwargs


class ComplexSamples(Dataset):
    def __init__(self) -> None:
        self.values = np.arange(64).reshape(16, 4) + 1j * np.arange(64)[::-1].reshape(16, 4)

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int):
        row = self.values[i]
        return row, row.astype(np.complex64), torch.from_numpy(row)


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_complex_samples_batch_as_torchs(mode):
    """complex64 and complex128 rows (NumPy and tensors) stack into the
    batch slots: the same values and dtypes as torch's batches."""
    for workers in (0, 2):
        ours = list(ll.DataLoader(ComplexSamples(), batch_size=4, num_workers=workers,
                                  worker_mode=mode))  # fmt: skip
        theirs = list(_torch(ComplexSamples(), batch_size=4, num_workers=workers))
        assert len(ours) == len(theirs) == 4
        for mine, reference in zip(ours, theirs, strict=True):
            for got, expected in zip(mine, reference, strict=True):
                assert got.dtype == expected.dtype and torch.equal(got, expected), workers


_LEFT_UNFINISHED = """
import torch, leanloader as ll
class Numbers(torch.utils.data.Dataset):
    def __len__(self): return 23
    def __getitem__(self, i): return i
it = iter(ll.DataLoader(Numbers(), batch_size=4, shuffle=True, num_workers=2, worker_mode="thread"))
"""


def test_a_pass_left_unfinished_on_threads_exits_cleanly():
    """A program that exits with a thread-mode pass under way: a worker thread
    asking for the GIL while the interpreter finalized was ended by CPython,
    and the process aborted (rc 134) in about half the runs."""
    codes = [
        subprocess.run(
            [sys.executable, "-c", _LEFT_UNFINISHED], capture_output=True, timeout=120
        ).returncode
        for _ in range(8)
    ]
    assert codes == [0] * 8


class ImageTensor(torch.Tensor):
    """A tensor subclass, as torchvision's tv_tensors.Image."""


class BoxesTensor(torch.Tensor):
    """A subclass with metadata in attributes, as tv_tensors.BoundingBoxes."""


class SubclassSamples(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        return torch.full((3,), float(i)).as_subclass(ImageTensor)


def _detection_collate(samples):
    boxes = torch.tensor([[0.0, 0.0, 4.0, 4.0]] * len(samples)).as_subclass(BoxesTensor)
    boxes.format, boxes.canvas_size = "XYXY", (32, 32)
    images = torch.stack([s.as_subclass(torch.Tensor) for s in samples]).as_subclass(ImageTensor)
    return {"images": images, "boxes": boxes}


class Float8Samples(Dataset):
    def __init__(self, dtype) -> None:
        self.dtype = dtype

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        return torch.full((2,), float(i + 1)).to(self.dtype)


def test_tensor_subclasses_and_dtypes_no_slot_holds_arrive_as_torchs():
    """From worker processes, a tensor subclass's instance (tv_tensors) came
    back a plain Tensor without its attributes, and a batch of only float8
    or complex32 tensors failed to unpickle (AttributeError)."""

    def describe(batch):
        if isinstance(batch, dict):
            return {k: describe(v) for k, v in batch.items()}
        state = {k: v for k, v in vars(batch).items()} if type(batch) is not torch.Tensor else {}
        return (type(batch).__name__, str(batch.dtype), batch.float().tolist(), state)

    for dataset, kwargs in ((SubclassSamples(), {}),
                            (SubclassSamples(), dict(collate_fn=_detection_collate)),
                            (Float8Samples(torch.float8_e4m3fn), {}),
                            (Float8Samples(torch.float8_e5m2), {})):  # fmt: skip
        loader_kwargs = dict(batch_size=2, num_workers=1, **kwargs)
        ours = [describe(b) for b in ll.DataLoader(dataset, **loader_kwargs)]
        assert ours == [describe(b) for b in _torch(dataset, **loader_kwargs)]
    first = describe(next(iter(ll.DataLoader(SubclassSamples(), batch_size=2, num_workers=1,
                                             collate_fn=_detection_collate))))  # fmt: skip
    assert first["boxes"][0] == "BoxesTensor" and first["boxes"][3]["format"] == "XYXY"


class RefilledBuffers(Dataset):
    """Samples whose memory the dataset keeps and rewrites: one buffer filled
    for every sample (returned whole, as a strided view, as a tensor), rows
    of an array it holds (indices repeat), and fresh arrays whose freed
    memory the next sample's allocation may reuse."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.buffer = np.zeros((2, 3), np.float32)
        self.tensor = torch.zeros(2, 3, dtype=torch.bfloat16)
        self.rows = np.arange(48, dtype=np.int16).reshape(8, 6)

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        if self.kind == "buffer":
            self.buffer[:] = i
            return {"x": self.buffer, "label": i}
        if self.kind == "strided view":
            self.buffer[:] = i
            return self.buffer.T[1:]
        if self.kind == "tensor":
            self.tensor[:] = i
            return self.tensor, self.tensor[0]
        if self.kind == "held rows":
            return self.rows[i % 3]
        return np.full(4096, i, np.float32)


def test_a_buffer_the_dataset_refills_batches_as_torchs_collate_reads_it():
    """Torch's collate stacks the samples after the batch's last __getitem__:
    a dataset that refills one buffer gets the last values in every row.
    Worker processes copied each sample as it came and gave other values
    than torch's (and than num_workers=0 and thread workers)."""
    for kind in ("buffer", "strided view", "tensor", "held rows", "fresh"):
        dataset = RefilledBuffers(kind)
        expected = [repr(batch) for batch in _torch(dataset, batch_size=4)]
        for workers in (0, 2):
            ours = ll.DataLoader(dataset, batch_size=4, num_workers=workers)
            assert [repr(batch) for batch in ours] == expected, (kind, workers)


def test_a_thread_mode_iterator_copied_into_a_forked_child_neither_hangs_nor_runs():
    """A child forked while a thread-mode pass is live (torch's own fork
    workers, multiprocessing) has a copy of the iterator but none of its
    threads: next() there waited forever, and finalizing the copy could hang
    on a lock a parent's thread held at the fork (a torch worker was seen
    stuck in gc). Now next() raises, naming the cause, and the copy closes."""
    loader = ll.DataLoader(Numbers(), batch_size=2, num_workers=2, worker_mode="thread")
    iterator = iter(loader)
    next(iterator)
    child = os.fork()
    if child == 0:
        signal.alarm(20)  # a hang ends the child by SIGALRM
        code = 3
        try:
            next(iterator)
        except Exception as error:
            code = 0 if "forked child" in str(error) else 2
        del iterator
        gc.collect()
        os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert len(list(iterator)) > 0  # the parent's pass goes on


class GetitemsReturns(Dataset):
    """A __getitems__ that returns something other than a list of samples."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        return torch.tensor([i])

    def __getitems__(self, indices):
        if self.kind == "tuple":
            return tuple(torch.tensor([i]) for i in indices)
        if self.kind == "generator":
            return (torch.tensor([i]) for i in indices)
        if self.kind == "stacked array":
            return np.stack([np.array([i]) for i in indices])
        if self.kind == "dict":
            return {"x": torch.tensor(indices)}
        return torch.tensor(indices)


def test_whatever_getitems_returns_goes_to_torchs_collate():
    """A __getitems__ returning one stacked array or tensor failed in worker
    processes with 'The truth value of an array ... is ambiguous', and a
    generator or a dict with an error raised from leanloader's code, not
    torch's "Caught TypeError in DataLoader worker process 0"."""

    def outcome(loader):
        try:
            return [repr(batch) for batch in loader]
        except Exception as error:
            return type(error).__name__, str(error).splitlines()[0]

    for kind in ("tuple", "generator", "stacked array", "dict", "tensor"):
        expected = outcome(_torch(GetitemsReturns(kind), batch_size=4, num_workers=2))
        ours = outcome(ll.DataLoader(GetitemsReturns(kind), batch_size=4, num_workers=2))
        assert ours == expected, kind
