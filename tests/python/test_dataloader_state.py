"""ll.DataLoader.state_dict()/load_state_dict(): stop after k batches, save,
resume in a fresh loader (and a fresh process) -> the rest of the
uninterrupted run; 0 and 2 worker processes, threads, DistributedSampler,
iterable datasets with and without their own state."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import Dataset, DistributedSampler, IterableDataset, Sampler  # noqa: E402

import leanloader as ll  # noqa: E402

SIZE = 50


class Indices(Dataset):
    """Sample i is i (module level: spawned workers import it)."""

    def __len__(self):
        return SIZE

    def __getitem__(self, i):
        return i


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(SIZE))


class StatefulStream(IterableDataset):
    """Knows where it is: resumes itself from state_dict()."""

    def __init__(self):
        self.start = 0

    def __iter__(self):
        return iter(range(self.start, SIZE))

    def state_dict(self):
        return {"start": self.start}

    def load_state_dict(self, state):
        self.start = state["start"]


def ids(batches):
    return [b.tolist() for b in batches]


def take(loader, k):
    out = []
    if k == 0:
        return out
    for batch in loader:
        out.append(batch.tolist())
        if len(out) == k:
            break
    return out


def make(workers=0, seeded=True, **kw):
    generator = torch.Generator().manual_seed(5) if seeded else None
    kw.setdefault("num_workers", workers)
    return ll.DataLoader(Indices(), batch_size=4, shuffle=True, generator=generator, **kw)


@pytest.mark.parametrize(
    ("workers", "seeded", "stops"),
    [
        (0, True, (1, 6, 12, 13)),
        (0, False, (1, 6, 12, 13)),
        # worker processes are slow to start here: the end of a pass on
        # persistent workers (mid-pass with 2 workers: the fresh-process test)
        (2, True, (13,)),
    ],
)
def test_resume_gives_the_rest_of_the_pass(workers, seeded, stops):
    torch.manual_seed(1)
    reference = make(workers, seeded)
    first_pass = ids(reference)
    second_pass = ids(reference)
    assert len(first_pass) == 13
    for k in stops:
        torch.manual_seed(1)
        run = make(workers, seeded)
        assert take(run, k) == first_pass[:k]
        state = pickle.loads(pickle.dumps(run.state_dict()))
        assert state["batches_yielded"] == (k if k < len(first_pass) else 0), k
        torch.manual_seed(99)  # the resumed process's global RNG is elsewhere
        resumed = make(workers, seeded)
        resumed.load_state_dict(state)
        rest = ids(resumed)
        if k < len(first_pass):
            assert rest == first_pass[k:], k
        elif seeded:  # a complete pass: the next one, drawn from the saved generator
            assert rest == second_pass


class EagerSampler(Sampler):
    """Draws its order from torch's global RNG in __iter__ itself (not a
    generator function): the draw happens at iter(loader), as in torch."""

    def __iter__(self):
        return iter(torch.randperm(13).tolist())

    def __len__(self):
        return 13


@pytest.mark.parametrize("kw", [dict(num_workers=0), dict(num_workers=2, worker_mode="thread")])
def test_resume_when_the_sampler_draws_in_iter(kw):
    def make():
        return ll.DataLoader(list(range(13)), sampler=EagerSampler(), batch_size=None, **kw)

    torch.manual_seed(1)
    first_pass = [int(x) for x in make()]
    for k in (1, 6):
        torch.manual_seed(1)
        run = make()
        iterator = iter(run)
        assert [int(next(iterator)) for _ in range(k)] == first_pass[:k]
        state = pickle.loads(pickle.dumps(run.state_dict()))
        del iterator
        torch.manual_seed(99)  # the resumed process's global RNG is elsewhere
        resumed = make()
        resumed.load_state_dict(state)
        assert [int(x) for x in resumed] == first_pass[k:], k


@pytest.mark.parametrize("kw", [dict(num_workers=0), dict(num_workers=2, worker_mode="thread")])
def test_a_state_saved_before_the_first_batch_resumes_the_whole_pass(kw):
    """Saved after iter() but before any batch: with num_workers=0 the
    iterator has drawn its base seed and the sampler nothing yet; the state
    held the generator after that draw, and the resumed pass drew its seed
    from there, giving another order."""
    reference = make(seeded=True, **kw)
    expected = ids(reference) + ids(reference)
    run = make(seeded=True, **kw)
    iterator = iter(run)
    state = pickle.loads(pickle.dumps(run.state_dict()))
    del iterator
    resumed = make(seeded=True, **kw)
    resumed.load_state_dict(state)
    assert ids(resumed) + ids(resumed) == expected


def test_resume_with_threads_and_a_distributed_sampler():
    sampler = DistributedSampler(Indices(), num_replicas=2, rank=1, shuffle=True, seed=3)
    sampler.set_epoch(7)
    reference = ids(ll.DataLoader(Indices(), batch_size=3, sampler=sampler))
    run = ll.DataLoader(Indices(), batch_size=3, sampler=sampler, num_workers=2,
                        worker_mode="thread")  # fmt: skip
    assert take(run, 4) == reference[:4]
    state = run.state_dict()
    assert state["sampler_epoch"] == 7
    other = DistributedSampler(Indices(), num_replicas=2, rank=1, shuffle=True, seed=3)
    resumed = ll.DataLoader(Indices(), batch_size=3, sampler=other)
    resumed.load_state_dict(state)
    assert other.epoch == 7
    assert ids(resumed) == reference[4:]


def test_iterable_datasets_resume_by_reading_or_by_their_own_state():
    whole = ids(ll.DataLoader(Stream(), batch_size=4))
    run = ll.DataLoader(Stream(), batch_size=4)
    take(run, 3)
    resumed = ll.DataLoader(Stream(), batch_size=4)
    resumed.load_state_dict(run.state_dict())
    assert ids(resumed) == whole[3:]  # read and dropped

    dataset = StatefulStream()
    dataset.start = 12  # as the dataset would record what it has produced
    state = ll.DataLoader(dataset, batch_size=4).state_dict()
    assert state["dataset_state"] == {"start": 12}
    fresh = StatefulStream()
    resumed = ll.DataLoader(fresh, batch_size=4)
    resumed.load_state_dict(state)
    assert fresh.start == 12 and ids(resumed) == whole[3:]


def test_a_state_of_another_generator_kind_is_an_error():
    state = make(0, seeded=False).state_dict()
    with pytest.raises(ValueError, match="generator"):
        make(0, seeded=True).load_state_dict(state)
    with pytest.raises(ValueError, match="version"):
        make(0, seeded=True).load_state_dict({"version": 99})


_FRESH = textwrap.dedent(
    """
    import json, pickle, sys
    import torch
    import leanloader as ll
    sys.path.insert(0, sys.argv[1])
    from test_dataloader_state import Indices
    state = pickle.loads(bytes.fromhex(sys.argv[2]))
    loader = ll.DataLoader(Indices(), batch_size=4, shuffle=True, num_workers=2,
                           generator=torch.Generator())
    loader.load_state_dict(state)
    print(json.dumps([b.tolist() for b in loader]))
    """
)


def test_resume_with_two_workers_in_a_fresh_process():
    reference = make(2, seeded=True)
    whole = ids(reference)
    run = make(2, seeded=True)
    take(run, 5)
    state = pickle.dumps(run.state_dict()).hex()
    out = subprocess.run(
        [sys.executable, "-c", _FRESH, str(__import__("pathlib").Path(__file__).parent), state],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout) == whole[5:]


def _sampler_owned(seed: int, workers: int = 0):
    sampler = torch.utils.data.RandomSampler(
        Indices(), generator=torch.Generator().manual_seed(seed)
    )
    return ll.DataLoader(Indices(), batch_size=4, sampler=sampler, num_workers=workers)


@pytest.mark.parametrize("k", [1, 6, 12])
def test_resume_when_the_sampler_owns_its_generator(k):
    # RandomSampler(generator=g): the order comes from g, not from the
    # loader's generator nor torch's global RNG.
    reference = _sampler_owned(5)
    first_pass, second_pass = ids(reference), ids(reference)
    run = _sampler_owned(5)
    assert take(run, k) == first_pass[:k]
    state = pickle.loads(pickle.dumps(run.state_dict()))
    assert state["generator"] == "sampler"
    resumed = _sampler_owned(99)  # its sampler's generator starts elsewhere
    resumed.load_state_dict(state)
    assert ids(resumed) == first_pass[k:]
    # between passes: the next pass is the one an uninterrupted run gives
    between = _sampler_owned(5)
    ids(between)
    state = between.state_dict()
    later = _sampler_owned(99)
    later.load_state_dict(state)
    assert ids(later) == second_pass
