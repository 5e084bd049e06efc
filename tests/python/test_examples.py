"""The examples run end to end (so they cannot silently rot)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_train_from_cache_runs(tmp_path):
    pytest.importorskip("torch")
    result = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "train_from_cache.py"),
            "--samples",
            "96",
            "--epochs",
            "2",
            "--dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "96 cached samples" in result.stdout
    assert "epoch 1: mean loss" in result.stdout
