"""The `leanloader` command itself (each subcommand has its own tests)."""

from __future__ import annotations

import subprocess
import sys

import leanloader as ll


def test_version_prints_the_package_version():
    result = subprocess.run(
        [sys.executable, "-m", "leanloader.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"leanloader {ll.__version__}"


def test_stats_report_only_what_is_measured(id_arrays):
    loader = ll.Loader(ll.ArraySource(id_arrays), batch_size=100, output="numpy")
    for _ in loader:
        pass
    stats = loader.stats()
    assert "transform_s" not in stats
    assert stats["read_s"] > 0
