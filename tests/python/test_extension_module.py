"""The built extension module as other native code in the process sees it."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from leanloader import _core


def _exported_symbols() -> list[str]:
    if shutil.which("nm") is None:
        pytest.skip("needs binutils' nm")
    listing = subprocess.run(
        ["nm", "-D", "--defined-only", "-C", _core.__file__],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return [line.split(" ", 2)[2] for line in listing.splitlines() if line.count(" ") >= 2]


def test_the_module_exports_nothing_of_the_archives_it_links():
    # Where a toolchain links libstdc++ statically (the GCC of the lent GPU
    # machines did), exported copies of its locale code took over the
    # process's libstdc++, and `import torch` after `import leanloader`
    # aborted with "free(): invalid pointer". Our core's own functions are
    # internal too.
    symbols = _exported_symbols()
    assert "PyInit__core" in symbols
    leaked = [s for s in symbols if s.startswith(("leanloader::", "std::locale", "std::ios_base"))]
    assert leaked == []


def test_torch_imports_after_leanloader():
    pytest.importorskip("torch")
    code = "import leanloader, torch; print(torch.ones(2).sum().item())"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "2.0"
