"""Shared fixtures of the dash_attn tests: each skips, saying why, where its requirement is missing (PyTorch,
a Hopper GPU, libdash_attn_c.so, a compiled kernel instance), so the suite runs anywhere and fails only on
real defects. Test modules that need torch skip themselves with pytest.importorskip."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

# torch.use_deterministic_algorithms(True) refuses cuBLAS matmuls unless cuBLAS uses a fixed workspace
# configuration, and cuBLAS reads it when its first handle is created: set it before any test touches CUDA.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

HOPPER_CAPABILITY = (9, 0)


@pytest.fixture(scope="session")
def library():
    """The loaded C library (no GPU needed); skips when libdash_attn_c.so is not found."""
    pytest.importorskip("torch", reason="dash_attn needs PyTorch")
    from dash_attn import _library

    try:
        _library.load()
    except ImportError as error:
        pytest.skip(f"libdash_attn_c.so is not available: {error}")
    return _library


@pytest.fixture(scope="session")
def device(library):
    """The CUDA device of the GPU tests; skips unless it is a Hopper GPU that the library accepts."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU is visible to torch")
    capability = torch.cuda.get_device_capability()
    if capability != HOPPER_CAPABILITY:
        pytest.skip(f"needs a Hopper GPU (compute capability 9.0); {torch.cuda.get_device_name()} is {capability}")
    try:
        library.check_device()
    except library.LibraryError as error:
        pytest.skip(str(error))
    return torch.device("cuda", torch.cuda.current_device())


@pytest.fixture
def require_kernel(device, library) -> Callable[[int, object], None]:
    """Skips the calling test when this build of the library has no kernel for (head_dim, dtype)."""
    import torch

    codes = {torch.bfloat16: library.DTYPE_BF16, torch.float16: library.DTYPE_FP16}

    def check(head_dim: int, dtype: torch.dtype) -> None:
        if not library.kernel_available(head_dim, codes[dtype]):
            pytest.skip(f"this build has no kernel for head_dim {head_dim} / {dtype} (see DASH_HEAD_DIMS, DASH_DTYPES)")

    return check


def _run_in_fresh_interpreter(
    program: str, env: Mapping[str, str] | None = None, timeout: float | None = None
) -> subprocess.CompletedProcess:
    import dash_attn

    environment = dict(os.environ if env is None else env)
    package_parent = str(Path(dash_attn.__file__).resolve().parents[1])
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, (package_parent, environment.get("PYTHONPATH"))))
    return subprocess.run(
        [sys.executable, "-c", program], env=environment, capture_output=True, text=True, check=False, timeout=timeout
    )


@pytest.fixture(scope="session")
def fresh_interpreter() -> Callable[..., subprocess.CompletedProcess]:
    """run(program, env=None, timeout=None): `python -c program` in a new interpreter that imports the dash_attn
    this session tests (installed or from the source tree), for what only a fresh process shows: import-time
    behaviour, the first call of a process, exit-time cleanup. `env` replaces the inherited environment
    (PYTHONPATH is set on top)."""
    return _run_in_fresh_interpreter
