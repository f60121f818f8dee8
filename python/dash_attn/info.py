"""`python -m dash_attn.info`: what this machine offers DASH, and whether DASH can run here.

Prints the package's version and location; the library's path, version and C ABI version; the (head_dim, dtype)
kernels it was compiled with and which of their variants (softcap, varlen); the CUDA runtime linked into it, the
driver that runtime needs, and the CUDA version the driver supports; and the current device with its SM count
(DASH's bits are promised per GPU model and SM count). Exits 0 when the library can run attention here. Otherwise
it exits 1 and prints the reason last, on stderr: the library is missing, is not DASH's, or does not match the
package; there is no driver, or one too old for the library's CUDA runtime; there is no device, or it is not a
Hopper GPU; or the build has no kernels. It never ends in a traceback: an unexpected failure is a reason too.

It reads everything through the C ABI (dash_attn._library) and never needs torch, so it also diagnoses a machine
where torch is missing or was built for another CUDA. It reports torch's version when torch is installed."""

from __future__ import annotations

import sys
from pathlib import Path

from . import __version__, _library

EXIT_READY = 0
EXIT_CANNOT_RUN = 1

# The oldest Linux driver of each CUDA major version. By CUDA's minor-version compatibility a library built with
# CUDA M.x runs on any driver that supports CUDA M.0: the library carries sm_90a machine code and no PTX, so
# nothing needs the newer driver's JIT. Release notes of CUDA 12.0 and 13.0, "CUDA Toolkit and Minimum Required
# Driver Version".
MINIMUM_DRIVER = {12: "R525 (525.60.13)", 13: "R580 (580.65.06)"}


def _cuda_version_text(encoded: int) -> str:
    """12.8 for CUDA's encoding 12080."""
    return f"{encoded // 1000}.{encoded % 1000 // 10}"


def required_driver_cuda(runtime: int) -> int:
    """The CUDA version (CUDA's encoding) a driver must support to run a library linked with `runtime`."""
    return runtime // 1000 * 1000


def driver_requirement(runtime: int) -> str:
    """The driver a library linked with CUDA runtime `runtime` needs, in words."""
    major = runtime // 1000
    branch = MINIMUM_DRIVER.get(major)
    needed = f"a driver that supports CUDA {major}.0 or newer"
    return f"{needed}: NVIDIA {branch} or newer" if branch else needed


def driver_too_old(runtime: int, driver: int) -> str | None:
    """Why an installed driver (supporting CUDA `driver`; 0: none) cannot run the library, or None if it can or
    if there is no driver at all (the device query says that)."""
    if driver == 0 or driver >= required_driver_cuda(runtime):
        return None
    return (
        f"the driver supports CUDA {_cuda_version_text(driver)}, but this build of the library links the CUDA "
        f"{_cuda_version_text(runtime)} runtime and needs {driver_requirement(runtime)}. Update the driver, or use a "
        f"DASH built with an older CUDA toolkit (scripts/build_wheel.sh with DASH_CUDA_ROOT)"
    )


def _torch_line() -> str:
    try:
        import torch
    except ImportError:
        return "not installed (the attention entry points need torch>=2.4)"
    cuda = f"CUDA {torch.version.cuda}" if torch.version.cuda else "no CUDA"
    return f"{torch.__version__} ({cuda})"


def _package_line() -> str:
    return f"{__version__} ({Path(__file__).resolve().parent})"


def _requested_library() -> str:
    """The file load() tries, for messages; the environment variable's value when even that cannot be told."""
    try:
        return str(_library._find_library())
    except ImportError:
        return "libdash_attn_c.so"


def _load() -> str | None:
    """Loads the library; returns why it cannot be used, or None."""
    try:
        _library.load()
    except ImportError as error:
        return str(error)
    except AttributeError as error:
        # ctypes raises AttributeError for a symbol the file does not export (load() names a missing ABI query).
        return (
            f"{_requested_library()} lacks a function this package calls ({error}); rebuild the library from this "
            "version of DASH"
        )
    return None


def _kernel_lines(out: list[str]) -> list[tuple[int, str]]:
    kernels = _library.compiled_kernels()
    listed = ", ".join(f"head_dim {head_dim} {dtype}" for head_dim, dtype in kernels)
    out.append(f"kernels: {listed or 'none'}")
    codes = {name: code for code, name in _library.DTYPE_NAMES.items()}
    variants = {
        "softcap": lambda d, t: _library.kernel_available(d, t, softcap=True),
        "varlen": lambda d, t: _library.kernel_available(d, t, varlen=True),
        "varlen softcap": lambda d, t: _library.kernel_available(d, t, softcap=True, varlen=True),
    }
    for name, available in variants.items():
        have = [(d, t) for d, t in kernels if available(d, codes[t])]
        if kernels:
            out.append(f"{name} kernels: {'all of them' if have == kernels else f'{len(have)} of {len(kernels)}'}")
    return kernels


def report(out: list[str]) -> str | None:
    """Appends one "name: value" line per fact to `out`; returns why DASH cannot run here, or None if it can."""
    out.append(f"dash_attn: {_package_line()}")
    out.append(f"torch: {_torch_line()}")
    reason = _load()
    if reason is not None:
        return reason
    out.append(f"library: {_library.library_path()}")
    out.append(f"library version: {_library.library_version()} (C ABI {_library.ABI_VERSION})")
    kernels = _kernel_lines(out)
    runtime = _library.cuda_runtime_version()
    out.append(f"CUDA runtime: {_cuda_version_text(runtime)} (linked into the library)")
    out.append(f"driver needed: {driver_requirement(runtime)}")
    driver = _library.cuda_driver_version()
    out.append(f"CUDA driver: {'supports CUDA ' + _cuda_version_text(driver) if driver else 'not installed'}")
    too_old = driver_too_old(runtime, driver)
    if too_old is not None:
        return too_old
    try:
        device = _library.describe_current_device()
    except _library.LibraryError as error:
        out.append("device: none")
        return error.message
    out.append(
        f"device: {device.index} {device.name.decode(errors='replace')} (compute capability "
        f"{device.compute_major}.{device.compute_minor}, {device.multiprocessor_count} SMs)"
    )
    try:
        _library.check_device()
    except _library.LibraryError as error:
        return error.message
    if not kernels:
        return (
            f"{_library.library_path()} was built without kernels (DASH_BUILD_KERNELS=OFF or no nvcc); rebuild it "
            f"on a machine with nvcc 12.3 or newer"
        )
    return None


def main() -> int:
    lines: list[str] = []
    try:
        reason = report(lines)
    except Exception as error:  # the promise is a reason, never a traceback
        reason = f"dash_attn.info failed unexpectedly ({type(error).__name__}: {error})"
    print("\n".join(lines), flush=True)
    if reason is not None:
        print(f"dash_attn cannot run here: {reason}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    print("status: ready")
    return EXIT_READY


if __name__ == "__main__":
    sys.exit(main())
