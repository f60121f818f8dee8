"""The tree stays formatted: ruff (ruff.toml: lint rules and the formatter) over the Python files, and clang-format
(.clang-format) over the C++ and CUDA sources.

ruff is pinned in requirements-test.txt, so CI checks it on every run. clang-format's output changes between major
versions, so its check runs only with the major version the tree was formatted with and skips, saying why, otherwise.
A negative control plants a misformatted file in a temporary copy and expects each check to find it.
"""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Debian 12's clang-format, with which the tree was formatted; another major version would reformat some lines.
CLANG_FORMAT_MAJOR = 14
CXX_SUFFIXES = (".h", ".hpp", ".c", ".cpp", ".cu", ".cuh")  # the .in templates hold CMake's @NAME@ fields


def tracked_files(suffixes):
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=False, text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: the tracked files cannot be listed")
    return [ROOT / name for name in listed.stdout.split("\0") if name.endswith(suffixes)]


def ruff(*arguments, cwd=ROOT):
    try:
        import ruff as _ruff  # noqa: F401
    except ImportError:
        pytest.skip("ruff is not installed (python/requirements-test.txt pins it)")
    return subprocess.run([sys.executable, "-m", "ruff", *arguments], cwd=cwd, capture_output=True, text=True)


def clang_format():
    binary = shutil.which("clang-format")
    if binary is None:
        pytest.skip("clang-format is not installed")
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    major = re.search(r"version (\d+)\.", version)
    if major is None or int(major.group(1)) != CLANG_FORMAT_MAJOR:
        pytest.skip(f"clang-format {CLANG_FORMAT_MAJOR} formatted the tree; this one says: {version.strip()}")
    return binary


def misformatted(binary, files):
    """The files clang-format would change (its --dry-run --Werror fails on them)."""
    found = []
    for start in range(0, len(files), 64):
        batch = [str(f) for f in files[start : start + 64]]
        result = subprocess.run([binary, "--dry-run", "--Werror", *batch], capture_output=True, text=True)
        if result.returncode != 0:
            found += sorted({line.split(":")[0] for line in result.stderr.splitlines() if ": error:" in line})
    return found


def test_python_is_linted_and_formatted():
    lint = ruff("check", "--no-cache", ".")
    assert lint.returncode == 0, lint.stdout + lint.stderr
    formatted = ruff("format", "--no-cache", "--check", ".")
    assert formatted.returncode == 0, formatted.stdout + formatted.stderr


def test_cxx_is_formatted():
    binary = clang_format()
    files = tracked_files(CXX_SUFFIXES)
    assert files, "no C++ sources found"
    assert misformatted(binary, files) == [], "run clang-format -i on these files"


def test_checks_find_a_misformatted_file(tmp_path):
    """Negative control: the same checks fail on a planted file."""
    shutil.copy(ROOT / "ruff.toml", tmp_path / "ruff.toml")
    (tmp_path / "planted.py").write_text("import os\nx=( 1,2 )\n")
    assert ruff("check", "--no-cache", ".", cwd=tmp_path).returncode != 0
    assert ruff("format", "--no-cache", "--check", ".", cwd=tmp_path).returncode != 0
    binary = clang_format()
    shutil.copy(ROOT / ".clang-format", tmp_path / ".clang-format")
    planted = tmp_path / "planted.cpp"
    planted.write_text("int  f( int x ){return x;}\n")
    assert misformatted(binary, [planted]) == [str(planted)]
