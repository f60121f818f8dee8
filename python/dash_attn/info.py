"""`python -m dash_attn.info`: what this machine offers DASH, and whether DASH can run here.

Prints the package's version and location; the library's path, version and C ABI version; the (head_dim, dtype)
kernels it was compiled with; the CUDA runtime linked into it and the CUDA version the driver supports; and the
current device with its SM count (DASH's bits are promised per GPU model and SM count). Exits 0 when the library
can run attention here. Otherwise it exits 1 and prints the reason last, on stderr: the library is missing or
does not match the package, there is no driver or device, the device is not a Hopper GPU, or the build has no
kernels.

It reads everything through the C ABI (dash_attn._library) and never needs torch, so it also diagnoses a machine
where torch is missing or was built for another CUDA. It reports torch's version when torch is installed."""

from __future__ import annotations

import sys
from pathlib import Path

from . import __version__, _library

EXIT_READY = 0
EXIT_CANNOT_RUN = 1


def _cuda_version_text(encoded: int) -> str:
    """12.8 for CUDA's encoding 12080."""
    return f"{encoded // 1000}.{encoded % 1000 // 10}"


def _torch_line() -> str:
    try:
        import torch
    except ImportError:
        return "not installed (the attention entry points need torch>=2.4)"
    cuda = f"CUDA {torch.version.cuda}" if torch.version.cuda else "no CUDA"
    return f"{torch.__version__} ({cuda})"


def _package_line() -> str:
    return f"{__version__} ({Path(__file__).resolve().parent})"


def report(out: list[str]) -> str | None:
    """Appends one "name: value" line per fact to `out`; returns why DASH cannot run here, or None if it can."""
    out.append(f"dash_attn: {_package_line()}")
    out.append(f"torch: {_torch_line()}")
    try:
        _library.load()
    except ImportError as error:
        return str(error)
    out.append(f"library: {_library.library_path()}")
    out.append(f"library version: {_library.library_version()} (C ABI {_library.ABI_VERSION})")
    kernels = _library.compiled_kernels()
    listed = ", ".join(f"head_dim {head_dim} {dtype}" for head_dim, dtype in kernels)
    out.append(f"kernels: {listed or 'none'}")
    out.append(f"CUDA runtime: {_cuda_version_text(_library.cuda_runtime_version())} (linked into the library)")
    driver = _library.cuda_driver_version()
    out.append(f"CUDA driver: {'supports CUDA ' + _cuda_version_text(driver) if driver else 'not installed'}")
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
    reason = report(lines)
    print("\n".join(lines), flush=True)
    if reason is not None:
        print(f"dash_attn cannot run here: {reason}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    print("status: ready")
    return EXIT_READY


if __name__ == "__main__":
    sys.exit(main())
