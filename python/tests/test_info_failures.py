"""`python -m dash_attn.info` where DASH cannot run, as a user meets it: it must end with one reason on stderr and
exit 1, never with a traceback. Covers a library that is not DASH's, a file that is no library at all, an
unexpected failure inside the report, and the driver requirement it derives from the library's CUDA runtime
(CUDA's minor-version compatibility: a driver for M.0 runs a library built with any M.x). Needs neither torch
nor a GPU nor a built DASH library.
"""

from __future__ import annotations

import _ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest

import dash_attn
from dash_attn import _library, info

CANNOT_RUN = "dash_attn cannot run here: "


def run_info(library: str) -> subprocess.CompletedProcess:
    """`python -m dash_attn.info` in a child process, with $DASH_ATTN_LIBRARY set to `library`."""
    package_parent = str(Path(dash_attn.__file__).resolve().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (package_parent, os.environ.get("PYTHONPATH"))))
    env[_library.LIBRARY_ENV] = library
    return subprocess.run(
        [sys.executable, "-m", "dash_attn.info"], env=env, capture_output=True, text=True, check=False, timeout=120
    )


def assert_one_reason(result: subprocess.CompletedProcess) -> str:
    """The run exited 1 with a single-line reason on stderr and no traceback; returns the reason."""
    assert result.returncode == info.EXIT_CANNOT_RUN, result.stdout + result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stderr.startswith(CANNOT_RUN) and result.stderr.count("\n") == 1, result.stderr
    return result.stderr[len(CANNOT_RUN) :].strip()


def test_a_library_that_is_not_dash_is_named_as_such() -> None:
    # A real shared object every CPython with ctypes has, and one that exports no dash_* function.
    other = Path(_ctypes.__file__)
    reason = assert_one_reason(run_info(str(other)))
    assert reason.startswith(f"{other} is not DASH's library: it exports no dash_abi_version()"), reason
    assert _library.LIBRARY_ENV in reason


def test_loading_a_library_that_is_not_dash_raises_import_error_naming_the_variable() -> None:
    # The package's own loader, not only info: a user's first call gets the same sentence.
    other = str(Path(_ctypes.__file__))
    package_parent = str(Path(dash_attn.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=package_parent, **{_library.LIBRARY_ENV: other})
    code = "from dash_attn import _library\ntry:\n    _library.load()\nexcept ImportError as e:\n    print(e)\n"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert result.stdout.startswith(f"{other} is not DASH's library: it exports no dash_abi_version()"), result.stdout
    assert _library.LIBRARY_ENV in result.stdout


def test_a_torch_that_fails_to_import_leaves_info_working_and_names_the_failure(tmp_path: Path) -> None:
    # A stand-in torch package that raises OSError on import, as a torch missing one of its CUDA libraries does.
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise OSError('libcudart.so.13: cannot open shared object file')\n")
    package_parent = str(Path(dash_attn.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join((str(tmp_path), package_parent)))
    code = "import dash_attn\ntry:\n    dash_attn.flash_attn_func\nexcept ImportError as e:\n    print(e)\n"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "failed to import: libcudart.so.13" in result.stdout, result.stdout


def test_a_file_that_is_no_library_is_refused_with_the_loader_reason(tmp_path: Path) -> None:
    text = tmp_path / "libdash_attn_c.so"
    text.write_text("not an ELF file\n")
    reason = assert_one_reason(run_info(str(text)))
    assert reason.startswith(f"dash_attn cannot load {text}"), reason


def test_an_unexpected_failure_is_a_reason_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken_load() -> None:
        raise RuntimeError("a failure nobody planned for")

    monkeypatch.setattr(_library, "load", broken_load)
    assert info.main() == info.EXIT_CANNOT_RUN
    captured = capsys.readouterr()
    assert captured.err == (
        f"{CANNOT_RUN}dash_attn.info failed unexpectedly (RuntimeError: a failure nobody planned for)\n"
    )
    assert captured.out.startswith(f"dash_attn: {dash_attn.__version__} (")


@pytest.mark.parametrize(
    ("runtime", "words"),
    [
        (12030, "a driver that supports CUDA 12.0 or newer: NVIDIA R525 (525.60.13) or newer"),
        (12090, "a driver that supports CUDA 12.0 or newer: NVIDIA R525 (525.60.13) or newer"),
        (13000, "a driver that supports CUDA 13.0 or newer: NVIDIA R580 (580.65.06) or newer"),
        (14010, "a driver that supports CUDA 14.0 or newer"),
    ],
)
def test_the_driver_requirement_follows_the_runtime_major_version(runtime: int, words: str) -> None:
    assert info.driver_requirement(runtime) == words


@pytest.mark.parametrize(
    ("runtime", "driver", "too_old"),
    [
        (13000, 12080, True),  # a CUDA 13 build on an R570 driver: the common cluster case
        (13000, 13000, False),
        (12090, 12020, False),  # minor-version compatibility: a 12.9 build runs on a 12.2 driver
        (12090, 11080, True),
        (13000, 0, False),  # no driver at all: the device query gives that reason
    ],
)
def test_a_driver_too_old_for_the_runtime_is_a_reason(runtime: int, driver: int, too_old: bool) -> None:
    reason = info.driver_too_old(runtime, driver)
    assert (reason is not None) == too_old
    if too_old:
        assert f"the driver supports CUDA {driver // 1000}.{driver % 1000 // 10}" in reason
        assert info.driver_requirement(runtime) in reason
