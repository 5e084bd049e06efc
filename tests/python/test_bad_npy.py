"""Crafted .npy files: each is a FormatError naming the file, never a crash.

Each case runs in a subprocess, so a crash (SIGSEGV, an abort in torch) fails
the test instead of killing pytest.
"""

from __future__ import annotations

import struct
import subprocess
import sys
import textwrap

import pytest


def npy_bytes(descr: str, fortran: bool, shape: tuple[int, ...], total: int | None = None) -> bytes:
    """A version-1 .npy header for (descr, fortran, shape), padded with zeros to `total` bytes."""
    header = f"{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {shape!r}, }}"
    encoded = header.encode("latin1")
    pad = (64 - (10 + len(encoded) + 1) % 64) % 64
    encoded += b" " * pad + b"\n"
    data = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(encoded)) + encoded
    if total is not None:
        data += b"\x00" * max(0, total - len(data))
    return data


CASES = {
    # numel x itemsize wraps to 0 mod 2**64: looked like an empty array.
    "wrap_fortran_i4": npy_bytes("<i4", True, (2**62,), total=4096),
    "wrap_c_f8": npy_bytes("<f8", False, (1, 2**61), total=4096),
    "wrap_c_rows": npy_bytes("<f4", False, (2**62, 2), total=4096),
    # A plausible shape whose rows run past the end of the file.
    "rows_past_eof_c": npy_bytes("<f4", False, (100, 64), total=1024),
    "rows_past_eof_fortran": npy_bytes("<f4", True, (100, 64), total=1024),
    # A void dtype with an itemsize far beyond the file (or not supported at all).
    "huge_void": npy_bytes("|V9223372036854775807", False, (4,), total=4096),
    "huge_void_row": npy_bytes("|V4611686018427387904", False, (2, 4), total=4096),
    # No element, but the other dimensions (the strides' factors) overflow.
    "empty_with_overflowing_dims": npy_bytes("<f8", False, (2**40, 0, 2**40), total=4096),
}


def test_numpy_refuses_an_empty_shape_whose_other_dimensions_overflow(tmp_path):
    # The reference reader's verdict on the case above ("array is too big").
    np = pytest.importorskip("numpy")
    path = tmp_path / "empty.npy"
    path.write_bytes(CASES["empty_with_overflowing_dims"])
    with pytest.raises(ValueError, match="too big"):
        np.load(path)


# The end of each script: exit 0 after a FormatError, 3 without one.
EXPECT_A_FORMAT_ERROR = """
    except ll.FormatError as error:
        print("FormatError:", error)
        sys.exit(0)
    print("no error")
    sys.exit(3)
    """

SCRIPT = textwrap.dedent(
    """
    import sys
    import leanloader as ll
    path, output = sys.argv[1], sys.argv[2]
    try:
        loader = ll.Loader(ll.NpySource(path), batch_size=2, shuffle=True, seed=1,
                           num_threads=2, output=output)
        for batch in loader:
            pass
    """
    + EXPECT_A_FORMAT_ERROR
)


@pytest.mark.parametrize("output", ["numpy", "torch"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_crafted_npy_is_a_format_error_naming_the_file(tmp_path, case, output):
    path = tmp_path / f"{case}.npy"
    path.write_bytes(CASES[case])
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(path), output],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, (
        f"exit {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr[-2000:]}"
    )
    assert "FormatError:" in result.stdout
    assert str(path) in result.stdout, result.stdout


REWRITE_SCRIPT = textwrap.dedent(
    """
    import faulthandler, sys
    import numpy as np
    import leanloader as ll
    path, row_values = sys.argv[1], int(sys.argv[2])
    faulthandler.enable()  # as pytest and many trainers do: our SIGBUS guard chains to it
    loader = ll.Loader(ll.NpySource(path), batch_size=4, shuffle=False, num_threads=2,
                       output="numpy")
    first = next(iter(loader))
    # The file is rewritten in place (np.save truncates, then writes) with fewer rows.
    np.save(path, np.zeros((2, row_values), np.float32))
    try:
        for batch in loader:
            pass
    """
    + EXPECT_A_FORMAT_ERROR
)


@pytest.mark.parametrize("row_values", [1024, 65536])  # 4 KiB rows (mapped), 256 KiB (pread)
def test_an_array_rewritten_while_loading_is_an_error_not_a_crash(tmp_path, row_values):
    np = pytest.importorskip("numpy")
    path = tmp_path / "rows.npy"
    np.save(path, np.ones((64, row_values), np.float32))
    result = subprocess.run(
        [sys.executable, "-c", REWRITE_SCRIPT, str(path), str(row_values)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, (
        f"exit {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr[-2000:]}"
    )
    assert "FormatError:" in result.stdout and str(path) in result.stdout, result.stdout


def test_valid_headers_leanloader_does_not_read_are_refused_naming_the_cause(tmp_path):
    """Files numpy reads (some only with max_header_size=) that we refuse: the
    message names why, not "runs past the end of the file" or "not a valid
    .npy header"."""
    import numpy as np

    import leanloader as ll

    long_header = b"{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }"
    long_header += b" " * 70000 + b"\n"
    data = np.arange(12, dtype="<f4").tobytes()
    cases = {
        "long_header": (
            b"\x93NUMPY\x02\x00" + struct.pack("<I", len(long_header)) + long_header + data,
            "longer than the 64 KiB leanloader reads",
        ),
        "big_endian": (npy_bytes(">f4", False, (3, 4)) + data, "big-endian dtype '>f4'"),
        "dtype_name": (npy_bytes("float32", False, (3, 4)) + data, "dtype 'float32' is not one"),
    }
    for name, (contents, cause) in cases.items():
        path = tmp_path / f"{name}.npy"
        path.write_bytes(contents)
        assert np.load(path, max_header_size=10**6).shape == (3, 4)  # numpy reads each
        with pytest.raises(ll.FormatError) as caught:
            ll.NpySource(path)
        message = str(caught.value)
        assert str(path) in message and cause in message, message
        assert "not a valid" not in message and "past the end" not in message, message
