"""Shared fixtures: small real datasets written to temporary directories."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def id_arrays():
    """1,000 samples: "id" (int64, = index) and "x" (8 float32, = index * 8 + column)."""
    n = 1000
    return {
        "id": np.arange(n, dtype=np.int64),
        "x": np.arange(n * 8, dtype=np.float32).reshape(n, 8),
    }


def write_sample_dir(directory, count, bad=(), shape=(8,)):
    """One .npy per sample (value = index); the files at `bad` are truncated."""
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        path = directory / f"s{i:04d}.npy"
        np.save(path, np.full(shape, i, dtype=np.int32))
        if i in bad:
            data = path.read_bytes()
            path.write_bytes(data[: len(data) - 8])
    return directory
