"""The CPU host-path benchmark (python/benchmarks/python_overhead.py) keeps working: its stand-in library
(_stub_library.c) compiles against src/capi/dash_c.h, so a changed C ABI fails here rather than when someone next
measures, and one short run of every row, fixed-length and varlen, goes through the package's real Python path.
CPU only; skips without a C compiler. Its numbers are not checked: this is not a timed test."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="dash_attn needs PyTorch")

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "python_overhead.py"


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) to build the stand-in library")
def test_the_host_benchmark_runs_every_row_against_the_stub_library():
    environment = dict(os.environ, PYTHONPATH=str(BENCHMARK.parents[1]))
    result = subprocess.run(
        [sys.executable, str(BENCHMARK), "--iters", "1", "--repeats", "1"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ") and "us per call" not in line]
    assert any(row.startswith("| varlen forward + backward step") for row in rows), result.stdout
    assert any(row.startswith("| forward + backward step (flash_attn_func") for row in rows), result.stdout
