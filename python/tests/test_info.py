"""`python -m dash_attn.info`, run as a user runs it (a subprocess), and the C-ABI queries it prints. It must exit
non-zero with the reason where DASH cannot run: no library, a library without a usable device (this machine when
it has no GPU), or no torch at all, which it does not need. Where the library can run, it must exit 0 and name
the device. Nothing here needs torch or a GPU; the library tests skip where libdash_attn_c.so is not found.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import dash_attn
from dash_attn import _library

CANNOT_RUN = "dash_attn cannot run here: "


def run_info(*, library: str | None, without_torch: bool = False) -> subprocess.CompletedProcess:
    """Runs `python -m dash_attn.info` on the package under test, with $DASH_ATTN_LIBRARY set to `library` (or
    unset); without_torch makes `import torch` fail in the child, as on a machine without it."""
    package_parent = str(Path(dash_attn.__file__).resolve().parents[1])
    env = {k: v for k, v in os.environ.items() if k != _library.LIBRARY_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (package_parent, os.environ.get("PYTHONPATH"))))
    if library is not None:
        env[_library.LIBRARY_ENV] = library
    if without_torch:
        command = [
            sys.executable,
            "-c",
            "import runpy, sys; sys.modules['torch'] = None; runpy.run_module('dash_attn.info', run_name='__main__')",
        ]
    else:
        command = [sys.executable, "-m", "dash_attn.info"]
    return subprocess.run(command, env=env, capture_output=True, text=True, check=False, timeout=120)


@pytest.fixture(scope="module")
def library_file() -> str:
    """The library this session tests (as conftest's `library` finds it), without needing torch."""
    try:
        return str(_library.library_path())
    except ImportError as error:
        pytest.skip(f"libdash_attn_c.so is not available: {error}")


def test_a_missing_library_exits_non_zero_with_the_reason(tmp_path: Path) -> None:
    missing = tmp_path / "libdash_attn_c.so"
    result = run_info(library=str(missing))
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.startswith(CANNOT_RUN)
    assert f"there is no file {missing}" in result.stderr
    assert result.stdout.startswith(f"dash_attn: {dash_attn.__version__} (")


def test_info_needs_no_torch(tmp_path: Path) -> None:
    result = run_info(library=str(tmp_path / "libdash_attn_c.so"), without_torch=True)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "torch: not installed" in result.stdout
    assert result.stderr.startswith(CANNOT_RUN)


def test_info_prints_the_library_and_its_verdict(library_file: str) -> None:
    result = run_info(library=library_file)
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines() if ": " in line)
    assert lines["library"] == library_file
    assert re.fullmatch(rf"[0-9]+\.[0-9]+\.[0-9]+ \(C ABI {_library.ABI_VERSION}\)", lines["library version"])
    compiled = _library.compiled_kernels()
    assert lines["kernels"] == (", ".join(f"head_dim {d} {t}" for d, t in compiled) or "none")
    assert re.fullmatch(r"[0-9]+\.[0-9]+ \(linked into the library\)", lines["CUDA runtime"])
    assert re.fullmatch(r"supports CUDA [0-9]+\.[0-9]+|not installed", lines["CUDA driver"])
    try:
        _library.check_device()
    except _library.LibraryError as error:
        # No usable device (the no-GPU machine): the library's own reason, last, on stderr.
        assert result.returncode == 1, result.stdout
        assert result.stderr.strip() == CANNOT_RUN + error.message
        return
    assert re.fullmatch(r"[0-9]+ .+ \(compute capability 9\.0, [0-9]+ SMs\)", lines["device"])
    if compiled:
        assert result.returncode == 0, result.stderr
        assert result.stdout.rstrip().endswith("status: ready")
    else:
        assert result.returncode == 1 and "built without kernels" in result.stderr


def test_versions_come_from_the_library(library_file: str) -> None:
    assert re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+", _library.library_version())
    assert _library.cuda_runtime_version() >= 12030  # nvcc 12.3 or newer builds the library
    assert _library.cuda_driver_version() >= 0


def test_device_description_agrees_with_the_device_check(library_file: str) -> None:
    try:
        _library.check_device()
    except _library.LibraryError as error:
        usable, reason = error.status != "no-device", error
    else:
        usable, reason = True, None
    if not usable:
        with pytest.raises(_library.LibraryError) as caught:
            _library.describe_current_device()
        assert (caught.value.status, caught.value.message) == (reason.status, reason.message)
        return
    device = _library.describe_current_device()
    assert device.multiprocessor_count > 0 and device.name
