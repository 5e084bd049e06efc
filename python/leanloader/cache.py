"""TensorCache: tensors computed once (latents, text embeddings), read by every
thread and process from shared memory-mapped safetensors shards.

    cache = ll.TensorCache("cache/latents")
    cache.build(ll.Images("data/*.png", transform=[ll.Resize(1024)]), encode=vae_encode,
                batch_size=16)
    loader = ll.Loader(cache, batch_size=4, shuffle=True)   # a Source like any other
    cache["data/0001.png"]                                   # {name: zero-copy tensor}

The directory holds ``manifest.json`` and ``shard-*.safetensors`` files (many
samples per shard, ``shard_bytes`` each, default 256 MiB). Everything on disk is
published atomically (temp file, fsync, rename, fsync of the directory), so a
crash at any moment leaves the old entries or the new ones, never a partial one;
leftovers of a crashed build are removed the next time the cache is opened by a
process that has it to itself. Only the builder's own leftovers are: a shard that
no manifest references and that no build here marked as its own (a copy whose
``manifest.json`` has not arrived yet) is kept, and ``verify`` reports it as
``"unreferenced"``. A folder of one ``.safetensors`` per sample, as
trainers write them (e.g. ``_latent_cache/``), opens as a cache too, read-only
(its files sorted by name; hidden ones, named ``.*``, skipped as ``glob`` does).

Entries are keyed by where the sample came from, and carry a fingerprint: the
source file's path, size and mtime_ns (or its XXH64 content hash with
``content_hash=True``) and a hash of the encode ``config``. ``build`` skips
fresh entries and rebuilds stale ones, so re-running it resumes.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from leanloader import _core

__all__ = ["TensorCache"]

DEFAULT_SHARD_BYTES = 256 << 20


def _default_output() -> str:
    return "torch" if importlib.util.find_spec("torch") is not None else "numpy"


def config_fingerprint(config: Any) -> str:
    """A stable hash of the encode configuration (JSON-able values; others by repr)."""
    if config is None:
        return ""
    text = json.dumps(config, sort_keys=True, default=repr, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _distributed() -> Any:
    """torch.distributed when a process group with more than one rank is up."""
    if "torch" not in sys.modules:
        return None
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist
    return None


def _source_plan(
    source: _core.Source, content_hash: bool, config: str
) -> list[tuple[int, str, dict]]:
    """(index, key, fingerprint) per sample of a leanloader Source. The key is
    the sample's location (a file path, or "<file> row <i>" / "row <i>"); a
    file's stat (or content hash) is its fingerprint, an array file's for all
    of its rows."""
    plan = []
    file_fingerprints: dict[str, dict] = {}
    for index in range(len(source)):
        location = source.sample_location(index)
        path = location
        if not os.path.isfile(path):
            head, separator, _row = location.rpartition(" row ")
            path = head if separator and os.path.isfile(head) else ""
        if path:
            fingerprint = file_fingerprints.get(path)
            if fingerprint is None:
                fingerprint = _core.fingerprint_file(path, content_hash, config)
                file_fingerprints[path] = fingerprint
        else:
            fingerprint = {"config": config}
        plan.append((index, location, fingerprint))
    return plan


def _rows(value: Any) -> int:
    if isinstance(value, (list, tuple)):
        return len(value)
    shape = getattr(value, "shape", None)
    if not shape:
        raise ValueError("encode must return a dict of batched tensors (first dim = samples)")
    return int(shape[0])


class TensorCache(_core.TensorCache):
    """A directory of cached tensors, usable as a ``Source`` for ``ll.Loader``.

    ``TensorCache(path)`` opens (or, for a new path, creates) the cache.
    ``len(cache)``, ``cache.keys()``, ``cache[i]`` / ``cache[key]`` (a dict of
    zero-copy tensors viewing the mapped shard), ``cache.build(...)``,
    ``cache.verify()``, ``cache.inspect()``.

    ``output``: ``"torch"`` (default when installed) or ``"numpy"`` for
    ``cache[...]``; NumPy has no bfloat16.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        shard_bytes: int = DEFAULT_SHARD_BYTES,
        output: str | None = None,
        cleanup: bool = True,
    ) -> None:
        path = os.fspath(path)
        if not os.path.exists(path) and not path.endswith(".safetensors"):
            os.makedirs(path, exist_ok=True)
        super().__init__(path, cleanup)
        if shard_bytes <= 0:
            raise ValueError(f"shard_bytes must be positive, got {shard_bytes}")
        self.shard_bytes = int(shard_bytes)
        self.output = output or _default_output()

    # -- reading -------------------------------------------------------------

    def __getitem__(self, item: int | str) -> dict[str, Any]:
        if isinstance(item, str):
            index = self.find(item)
            if index is None:
                raise KeyError(item)
        else:
            index = int(item)
            if index < 0:
                index += len(self)
            if not 0 <= index < len(self):
                raise IndexError(f"index {item} out of range for {len(self)} entries")
        return self.entry(index, self.output)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.find(key) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def verify(  # type: ignore[override]
        self, check_sources: bool = True, include_garbage: bool = False, check_data: bool = False
    ) -> list[dict[str, str]]:
        """Every problem found: ``{"kind": "invalid" | "stale" | "partial" |
        "unreferenced" | "corrupt", "where", "message"}``; an empty list when
        all is well. ``check_sources`` also compares each entry's source file
        with its fingerprint. ``check_data`` reads every tensor and compares
        its bytes with the XXH64 checksum written with them (``"corrupt"``:
        the shard changed on disk; entries built before checksums were
        written are not checked). ``"unreferenced"``: a shard no manifest
        references that no build here left behind (e.g. a copy missing its
        manifest), kept. ``include_garbage`` adds shards no entry references
        (``"garbage"``: invisible to readers, removed by a later open; not an
        error)."""
        return [
            {"kind": kind, "where": where, "message": message}
            for kind, where, message in super().verify(check_sources, check_data)
            if include_garbage or kind != "garbage"
        ]

    def inspect(self) -> dict[str, Any]:
        """Layout, shards, fields and every entry (key, shard, tensors, fingerprint)."""
        manifest = self.manifest()
        entries = manifest["entries"]
        return {
            "path": self.path,
            "layout": self.layout,
            "entries": len(entries),
            "fields": [
                {"name": name, "dtype": dtype, "shape": None if shape is None else tuple(shape)}
                for name, dtype, shape in self.fields
            ],
            "shards": manifest["shards"],
            "bytes": sum(t["nbytes"] for e in entries for t in e["tensors"]),
            "file_bytes": sum(s["bytes"] for s in manifest["shards"]),
            "items": entries,
        }

    # -- building ------------------------------------------------------------

    def build(
        self,
        source_or_iterable: Any,
        encode: Callable[[Any], Mapping[str, Any]],
        batch_size: int = 16,
        progress: bool = True,
        config: Any = None,
        content_hash: bool = False,
        num_threads: int | None = None,
        output: str | None = None,
    ) -> dict[str, int]:
        """Computes ``encode(batch)`` for every sample without a fresh entry and
        stores the result, one entry per sample.

        ``source_or_iterable``:

        - a leanloader ``Source`` (``FileSource``, ``NpySource``, ...): batches
          come from an ``ll.Loader`` over the samples still to build, exactly
          as the loader would yield them (dict of batched tensors, or of lists
          for fields of varying shape). Keys are the samples' locations (file
          paths; ``"row <i>"`` for array rows); files are fingerprinted.
        - an iterable of dicts, each with a ``"key"`` (str) and optionally a
          ``"path"`` (a file to fingerprint) and a ``"version"`` (any string
          that changes when the sample does); batches are dicts of lists of the
          items' values, ``"key"`` and ``"path"`` included.

        ``encode`` runs in the calling thread (it may use the GPU) and returns
        a dict of tensors whose first dimension is the batch (or lists with one
        tensor per sample); CUDA tensors are copied to the host. ``config`` (a
        JSON-able dict: model name, resolution, dtype...) is hashed into every
        fingerprint, so changing it makes every entry stale. Under
        ``torch.distributed`` each rank builds every world_size-th missing
        sample and rank 0 merges the ranks' manifests after a barrier.

        Returns ``{"built", "fresh", "total"}``.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        config_hash = config_fingerprint(config)
        if isinstance(source_or_iterable, _core.ImageSource):
            # Decoded pixels depend on the transform: changing it makes entries stale.
            config_hash = config_fingerprint(
                {"config": config, "image_transform": source_or_iterable.transform_description}
            )
        dist = _distributed()
        rank = dist.get_rank() if dist else None
        world = dist.get_world_size() if dist else 1
        writer = _core.CacheWriter(self.path, self.shard_bytes, rank)
        try:
            if isinstance(source_or_iterable, _core.Source):
                stats = self._build_from_source(
                    writer, source_or_iterable, encode, batch_size, progress, config_hash,
                    content_hash, num_threads, output, rank or 0, world,
                )  # fmt: skip
            else:
                stats = self._build_from_iterable(
                    writer, source_or_iterable, encode, batch_size, progress, config_hash,
                    content_hash, rank or 0, world,
                )  # fmt: skip
        finally:
            # What was encoded is kept even when encode (or Ctrl-C) stopped the build.
            try:
                writer.flush()
            finally:
                del writer  # releases the writer's lock on the directory
                self.reload()
        if dist:
            dist.barrier()
            if rank == 0:
                _core.merge_cache_rank_manifests(self.path)
            dist.barrier()
        self.reload()
        return stats

    def _progress(self, total: int | None, progress: bool, fresh: int) -> Any:
        if not progress:
            return None
        try:
            from tqdm.auto import tqdm
        except ImportError:
            return None
        bar = tqdm(total=total, unit="sample", desc=f"caching {os.path.basename(self.path)}")
        if fresh:
            bar.set_postfix(fresh=fresh)
        return bar

    def _build_from_source(
        self, writer, source, encode, batch_size, progress, config, content_hash, num_threads,
        output, rank, world,
    ) -> dict[str, int]:  # fmt: skip
        from leanloader.loader import Loader

        plan = _source_plan(source, content_hash, config)
        todo = [item for item in plan if not writer.is_fresh(item[1], item[2])]
        fresh = len(plan) - len(todo)
        todo = todo[rank::world]
        if not todo:
            return {"built": 0, "fresh": fresh, "total": len(plan)}
        subset = _core.SubsetSource(source, [index for index, _, _ in todo])
        collate = "list" if any(shape is None for _, _, shape in source.fields) else "stack"
        loader = Loader(
            subset,
            batch_size=batch_size,
            shuffle=False,
            num_threads=num_threads,
            output=output or _default_output(),
            collate=collate,
            rank=0,  # `todo` is this rank's part already: no second sharding
            world_size=1,
        )
        bar = self._progress(len(todo), progress, fresh)
        built = 0
        try:
            for batch in loader:
                items = [todo[position] for position in loader.last_indices]
                self._store(writer, [(key, fp) for _, key, fp in items], encode(batch))
                built += len(items)
                if bar is not None:
                    bar.update(len(items))
        finally:
            loader.close()
            if bar is not None:
                bar.close()
        return {"built": built, "fresh": fresh, "total": len(plan)}

    def _build_from_iterable(
        self, writer, items, encode, batch_size, progress, config, content_hash, rank, world,
    ) -> dict[str, int]:  # fmt: skip
        total = len(items) if hasattr(items, "__len__") else None
        bar = self._progress(total, progress, 0)
        built = fresh = 0
        pending: list[tuple[str, dict, Mapping[str, Any]]] = []

        def run_batch() -> None:
            nonlocal built
            batch: dict[str, list[Any]] = {}
            for _, _, item in pending:
                for name, value in item.items():
                    batch.setdefault(name, []).append(value)
            self._store(writer, [(key, fp) for key, fp, _ in pending], encode(batch))
            built += len(pending)
            if bar is not None:
                bar.update(len(pending))
            pending.clear()

        try:
            for position, item in enumerate(items):
                if position % world != rank:
                    continue
                if not isinstance(item, Mapping) or not isinstance(item.get("key"), str):
                    raise TypeError("each item must be a dict with a str 'key'")
                key = item["key"]
                if item.get("path") is not None:
                    fingerprint = _core.fingerprint_file(
                        os.fspath(item["path"]), content_hash, config
                    )
                else:
                    fingerprint = {"config": config, "content_hash": str(item.get("version", ""))}
                if writer.is_fresh(key, fingerprint):
                    fresh += 1
                    if bar is not None:
                        bar.update(1)
                    continue
                pending.append((key, fingerprint, item))
                if len(pending) == batch_size:
                    run_batch()
            if pending:
                run_batch()
        finally:
            if bar is not None:
                bar.close()
        return {"built": built, "fresh": fresh, "total": built + fresh}

    @staticmethod
    def _store(writer: Any, keyed: list[tuple[str, dict]], encoded: Mapping[str, Any]) -> None:
        from leanloader.safetensors import _as_cpu_array

        if not isinstance(encoded, Mapping) or not encoded:
            raise TypeError("encode must return a non-empty dict of name -> batched tensor")
        columns = {}
        for name, value in encoded.items():
            if _rows(value) != len(keyed):
                raise ValueError(
                    f"encode returned {_rows(value)} rows for {name!r}, expected {len(keyed)} "
                    "(one per sample of the batch)"
                )
            if hasattr(value, "detach"):  # one device-to-host copy per batch
                value = value.detach().cpu()
            columns[name] = value
        for row, (key, fingerprint) in enumerate(keyed):
            tensors = {name: _as_cpu_array(name, value[row]) for name, value in columns.items()}
            writer.add(key, fingerprint, tensors)
