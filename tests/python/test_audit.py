"""ll.audit and `leanloader audit`: per-path bytes per worker and what must not travel."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import leanloader as ll  # noqa: E402


class SeedDataset:
    """Seed 000 in miniature: features, records, a model, a handle, a lock."""

    def __init__(self, handle_path: str | None = None) -> None:
        self.features = np.zeros((256, 1024), dtype=np.float32)  # 1 MiB
        self.records = [{"path": f"/d/{i}.png", "caption": f"{i} " + "x" * 60, "size": i}
                        for i in range(30_000)]  # fmt: skip
        self.sd = torch.nn.Linear(512, 1024)
        self.small = [1, 2, 3]
        self.handle = open(handle_path, "rb") if handle_path else None
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return 256


def make_dataset() -> SeedDataset:
    return SeedDataset()


def test_audit_names_each_part_with_size_and_fix(tmp_path):
    (tmp_path / "h.bin").write_bytes(b"x")
    dataset = SeedDataset(str(tmp_path / "h.bin"))
    report = ll.audit(dataset)
    features = report.entry("dataset.features")
    assert features.bytes_torch == 1 << 20 and features.bytes_leanloader == 0
    assert "shares it once" in features.fix
    records = report.entry("dataset.records")
    assert records.bytes_torch > 1 << 20
    assert "SharedRecords" in records.fix
    model = report.entry("dataset.sd")
    assert model.never_send and model.bytes_torch == (512 * 1024 + 1024) * 4
    assert "__getstate__" in model.fix
    handle = report.entry("dataset.handle")
    assert handle.never_send and "lazily" in handle.fix
    assert report.entry("dataset.lock").never_send
    with pytest.raises(KeyError):
        report.entry("dataset.small")
    text = str(report)
    assert "dataset.features" in text and "NEVER SEND" in text
    dataset.handle.close()


def test_audit_reports_the_unpicklable_path():
    dataset = SeedDataset()
    del dataset.lock
    dataset.transform = {"resize": lambda x: x}
    report = ll.audit(dataset)
    assert "lambda" in report.error
    entry = report.entry("dataset.transform['resize']")
    assert entry.never_send and "module level" in entry.fix


def test_shared_records_are_reported_as_shared():
    dataset = SeedDataset()
    del dataset.lock
    dataset.records = ll.SharedRecords(dataset.records)
    entry = ll.audit(dataset).entry("dataset.records")
    assert entry.bytes_torch == 0 and not entry.never_send


def test_cli_audit_prints_the_report():
    tests = str(Path(__file__).parent)
    result = subprocess.run(
        [sys.executable, "-m", "leanloader.cli", "audit", "test_audit:make_dataset"],
        capture_output=True, text=True, env={"PYTHONPATH": tests, "PATH": "/usr/bin:/bin"},
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "dataset.features" in result.stdout
    assert "dataset.sd" in result.stdout and "__getstate__" in result.stdout
    assert "SharedRecords" in result.stdout
