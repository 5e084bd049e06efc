"""ll.DataLoader.state_dict()/load_state_dict(), in the spirit of torchdata's
StatefulDataLoader.

What a pass's batch order depends on, and what is saved for it:

- the sampler's random draws: mid-pass, the RNG state (the sampler's own
  ``generator`` when it has one, as ``RandomSampler(generator=g)``; else the
  loader's ``generator``, or torch's global RNG when there is none) at the moment the
  sampler started drawing, recorded each pass by wrapping the index sampler's
  iterator; between passes, the loader's ``generator`` as it is (restored at
  load, or at the next pass's first draw with persistent worker processes,
  which draw no new base seed);
- the sampler's own state: ``sampler.state_dict()`` when it has one, and the
  ``epoch`` of a ``DistributedSampler``-like sampler (``set_epoch``);
- the batches already yielded in the pass;
- the dataset's state, ``dataset.state_dict()``, when it implements it.

Resuming restores the RNG state right before the sampler draws (torch's
global RNG is put back afterwards, so the caller's own restored RNG is left
alone), then skips the batches already yielded: a map-style dataset skips
their *indices* (nothing is read); an iterable dataset without a
``load_state_dict`` reads and discards them.

Worker processes receive the dataset (and its loaded state) when they start;
state a dataset changes inside a worker process stays there and is not
collected (with ``num_workers=0`` or ``worker_mode="thread"`` the dataset is
this process's own and its state is exact).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from torch.utils.data.dataloader import _BaseDataLoaderIter

if TYPE_CHECKING:
    from leanloader.dataloader.front import DataLoader

STATE_VERSION = 1
_END = object()


def order_generator(loader: Any) -> Any:
    """The generator the pass's order is drawn from: the sampler's own when it
    has one (RandomSampler(generator=g), also inside a BatchSampler), else the
    loader's (None: torch's global RNG)."""
    import torch

    for sampler in (loader.sampler, getattr(loader.batch_sampler, "sampler", None)):
        generator = getattr(sampler, "generator", None)
        if isinstance(generator, torch.Generator):
            return generator
    # Anything else given as generator= is torch's to refuse when it draws.
    return loader.generator if isinstance(loader.generator, torch.Generator) else None


def _generator_kind(loader: Any) -> str:
    generator = order_generator(loader)
    if generator is None:
        return "torch-global"
    return "loader" if generator is loader.generator else "sampler"


def _rng_state(generator: Any) -> Any:
    import torch

    return generator.get_state() if generator is not None else torch.get_rng_state()


def _set_rng_state(generator: Any, state: Any) -> None:
    import torch

    if generator is not None:
        generator.set_state(state)
    else:
        torch.set_rng_state(state)


def first_sampler_iter(index_sampler: Any) -> Iterator:
    """The sampler iterator a worker iterator makes in its __init__ and
    replaces at the end of it, as torch's _MultiProcessingDataLoaderIter does
    (its _reset(first_iter=True) calls iter(sampler) again): a sampler whose
    __iter__ draws draws twice, as in torch, and the pass (and a pending
    resume) uses the second."""
    unrecorded = getattr(index_sampler, "unrecorded_iter", None)
    return unrecorded() if unrecorded is not None else iter(index_sampler)


def _same_state(a: Any, b: Any) -> bool:
    import torch

    return bool(torch.equal(a, b))


class _RecordedSampler:
    """The index sampler as seen by one pass: records the RNG state when the
    sampler starts drawing and, for a resumed pass, restores it and skips."""

    def __init__(self, progress: PassProgress, sampler: Iterable) -> None:
        self._progress = progress
        self._sampler = sampler

    def __iter__(self) -> Iterator:
        return self._progress.recorded(lambda: iter(self._sampler))

    def unrecorded_iter(self) -> Iterator:
        """iter() of the sampler, for an iterator torch makes and drops (a
        worker iterator's first, before its _reset(first_iter=True)): its
        draws happen as in torch, and a pending resume waits for the next."""
        return iter(self._sampler)

    def __len__(self) -> int:
        return len(self._sampler)  # type: ignore[arg-type]


class PassProgress:
    """Bookkeeping of one ll.DataLoader: the pass in progress and a pending resume."""

    def __init__(self) -> None:
        self.rng_at_start: Any = None  # RNG state when the current pass's sampler began
        self.yielded = 0  # batches yielded in the current pass
        self.active = False  # a pass started and has not ended
        self._resume: dict[str, Any] | None = None  # applied when the sampler starts
        self._discard = 0  # batches an iterable dataset reads and drops on resume
        self._generator: Any = None
        self.generator_at_begin: Any = None  # the order generator's state when the pass began

    # -- hooks used by front.py -------------------------------------------------------------

    def index_sampler(self, loader: DataLoader, sampler: Iterable) -> _RecordedSampler:
        self._generator = order_generator(loader)
        return _RecordedSampler(self, sampler)

    def begin(self, loader: DataLoader) -> None:
        """A pass starts (before its iterator is built)."""
        self._generator = order_generator(loader)
        self.active = True
        self.yielded = 0
        self.rng_at_start = None
        # The iterator draws its base seed before the sampler draws (with
        # num_workers=0, at the first next()): a state saved in between
        # gives the generator as the pass found it, so that a resumed pass
        # draws that seed and then the same order.
        generator = self._generator
        self.generator_at_begin = generator.get_state() if generator is not None else None

    def counted(self, loader: DataLoader, iterator: Iterator) -> Iterator:
        """The pass's batches, counted; an iterable dataset without its own
        state skips the batches already yielded by reading them."""
        discard, self._discard = self._discard, 0
        counted = _Counted(self, iterator, discard)
        if loader._dataset_kind == 1:  # torch's check of an IterableDataset's __len__
            counted.length_check = (
                loader._IterableDataset_len_called,
                loader.dataset,
                loader.num_workers,
            )
        return counted

    # -- the sampler side -----------------------------------------------------------------

    def recorded(self, make_iter: Any) -> Iterator:
        resume = self._resume
        self._resume = None
        generator = self._generator
        rng_state = resume.get("rng_state") if resume is not None else None
        found = _rng_state(generator)
        if rng_state is not None:
            _set_rng_state(generator, rng_state)
        start = _rng_state(generator)
        # As torch's iterators call iter(sampler) before drawing their base
        # seed, the sampler's __iter__ runs now: one that is not a generator
        # function (``return iter(torch.randperm(n).tolist())``) draws here.
        iterator = make_iter()
        if _same_state(_rng_state(generator), start):
            # Nothing drawn: the sampler draws at the pass's first index.
            if rng_state is not None:
                _set_rng_state(generator, found)
            return self._recorded(iterator, resume, drawn=False)
        self.rng_at_start = start
        if rng_state is not None and generator is None:
            _set_rng_state(None, found)  # the resumed draw done, the global RNG as it was
        return self._recorded(iterator, resume, drawn=True)

    def _recorded(self, iterator: Iterator, resume: dict[str, Any] | None, drawn: bool) -> Iterator:
        # A generator: unless the sampler drew in iter() (`drawn`), nothing
        # happens until the pass asks for its first index, which is when the
        # wrapped sampler draws.
        saved_global = None
        if not drawn:
            generator = self._generator
            if resume is not None and resume.get("rng_state") is not None:
                if generator is None:
                    saved_global = _rng_state(None)
                _set_rng_state(generator, resume["rng_state"])
            self.rng_at_start = _rng_state(generator)
        first = next(iterator, _END)  # a sampler drawing per pass draws now
        if saved_global is not None:
            _set_rng_state(None, saved_global)
        skip = int(resume["batches_yielded"]) if resume is not None else 0
        if skip:
            self.yielded = skip
            first = (
                _END if first is _END else next(itertools.islice(iterator, skip - 1, None), _END)
            )
        if first is _END:
            return
        yield first
        yield from iterator


class _Counted(_BaseDataLoaderIter):
    """Counts the batches a pass yields; forwards everything else. A
    _BaseDataLoaderIter, as torch's iterators are, for code that tells a
    loader's iterator by that class (Lightning's CombinedLoader leaves them
    out of its pickled state), and unpicklable as torch's (its
    NotImplementedError); torch's constructor is not run (the inner
    iterator is the pass)."""

    def __init__(self, progress: PassProgress, inner: Iterator, discard: int) -> None:
        self._progress = progress
        self._inner = inner
        self._discard = discard
        self._num_yielded = 0
        self.length_check: tuple[int | None, Any, int] | None = None

    def __iter__(self) -> _Counted:
        return self

    def __next__(self) -> Any:
        progress = self._progress
        while self._discard:
            self._discard -= 1
            next(self._inner)
            progress.yielded += 1
        try:
            batch = next(self._inner)
        except StopIteration:
            progress.active = False
            progress.yielded = 0
            raise
        progress.yielded += 1
        self._num_yielded += 1
        if self.length_check is not None and self.length_check[0] is not None:
            self._warn_length()
        return batch

    def _warn_length(self) -> None:
        """torch's warning, in torch's words and under its condition."""
        import warnings

        reported, dataset, num_workers = self.length_check  # type: ignore[misc]
        if self._num_yielded <= reported:
            return
        message = (
            f"Length of IterableDataset {dataset} was reported to be {reported}"
            f"(when accessing len(dataloader)), but {self._num_yielded} samples have been "
            "fetched. "
        )
        if num_workers > 0:
            message += (
                "For multiprocessing data-loading, this could be caused by not properly "
                "configuring the IterableDataset replica at each worker. Please see "
                "https://pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset "
                "for examples."
            )
        # Pointing at the user's loop, as torch's (warn, __next__, the loop).
        warnings.warn(message, stacklevel=3)

    def __len__(self) -> int:
        return len(self._inner)  # type: ignore[arg-type]

    # torch's methods of the base class, forwarded as every other attribute
    def _reset(self, *args: Any, **kwargs: Any) -> Any:
        return self._inner._reset(*args, **kwargs)  # type: ignore[attr-defined]

    def _next_index(self) -> Any:
        return self._inner._next_index()  # type: ignore[attr-defined]

    def _next_data(self) -> Any:
        return self._inner._next_data()  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_inner"], name)


def state_dict(loader: DataLoader) -> dict[str, Any]:
    progress: PassProgress = loader._progress
    # a pass whose sampler has drawn: its order comes from the RNG state then
    mid_pass = progress.active and progress.rng_at_start is not None
    if mid_pass and loader._dataset_kind == 0 and progress.yielded >= len(loader):
        mid_pass = False  # every batch of the pass was yielded: the pass is complete
    sampler = loader.sampler
    dataset = loader.dataset
    generator = order_generator(loader)
    state: dict[str, Any] = {
        "version": STATE_VERSION,
        "batches_yielded": progress.yielded if mid_pass else 0,
        "samples_yielded": (progress.yielded * (loader.batch_size or 1)) if mid_pass else 0,
        # mid-pass: the RNG state this pass's sampler drew its order from
        "rng_state": progress.rng_at_start if mid_pass else None,
        # between passes: the loader's generator as it is, which the next pass
        # draws from (torch's global RNG is the caller's to save and restore)
        "generator_state": (
            progress.generator_at_begin
            if progress.active and progress.rng_at_start is None
            else generator.get_state()
            if generator is not None and not mid_pass
            else None
        ),
        "generator": _generator_kind(loader),
        "num_workers": loader.num_workers,
        "sampler_epoch": getattr(sampler, "epoch", None),
        "sampler_state": sampler.state_dict() if hasattr(sampler, "state_dict") else None,
        "dataset_state": dataset.state_dict() if hasattr(dataset, "state_dict") else None,
    }
    return state


def load_state_dict(loader: DataLoader, state: dict[str, Any]) -> None:
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise ValueError(
            f"not a DataLoader state of version {STATE_VERSION}: "
            f"{state.get('version') if isinstance(state, dict) else type(state).__name__}"
        )
    expected = _generator_kind(loader)
    if state["generator"] != expected:
        raise ValueError(
            f"the state was saved with generator={state['generator']!r} but this DataLoader "
            f"uses {expected!r}: the order would differ"
        )
    sampler = loader.sampler
    if state.get("sampler_epoch") is not None and hasattr(sampler, "set_epoch"):
        sampler.set_epoch(state["sampler_epoch"])
    if state.get("sampler_state") is not None and hasattr(sampler, "load_state_dict"):
        sampler.load_state_dict(state["sampler_state"])
    dataset = loader.dataset
    if state.get("dataset_state") is not None and hasattr(dataset, "load_state_dict"):
        dataset.load_state_dict(state["dataset_state"])
    done = int(state["batches_yielded"])
    progress: PassProgress = loader._progress
    if state.get("generator_state") is not None:
        if loader.num_workers > 0 and loader.persistent_workers:
            # persistent workers (processes or threads) draw no new base seed after the first pass:
            # the next pass's sampler draws straight from this state
            progress._resume = {"rng_state": state["generator_state"], "batches_yielded": 0}
            progress._discard = 0
            return
        order_generator(loader).set_state(state["generator_state"])
    if loader._dataset_kind == 1:  # iterable: the sampler yields no positions to skip
        progress._resume = {"rng_state": state["rng_state"], "batches_yielded": 0}
        # a dataset with its own state resumes itself; others are read and dropped
        progress._discard = 0 if hasattr(dataset, "load_state_dict") else done
    else:
        progress._resume = {"rng_state": state["rng_state"], "batches_yielded": done}
        progress._discard = 0
    progress.active = False
    progress.yielded = 0
