"""The version is written once (python/dash_attn/_version.py) and everything that states it agrees: the package's
__version__, the wheel's metadata (pyproject.toml reads the same file), the C ABI's dash_library_version() (CMake's
project() reads the same file), and the newest release in CHANGELOG.md. Needs no GPU; the library check skips
where libdash_attn_c.so is not built.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import dash_attn
from dash_attn import _library, _version

REPO = Path(__file__).resolve().parents[2]
VERSION_FILE = REPO / "python" / "dash_attn" / "_version.py"
# CMake's project(VERSION) accepts MAJOR.MINOR.PATCH[.TWEAK] numbers only; the CMakeLists.txt regex reads three.
VERSION_LINE = re.compile(r'^__version__ = "([0-9]+\.[0-9]+\.[0-9]+)"$', re.MULTILINE)
# Keep a Changelog's release headings, "## [0.1.0]" (a date may follow); "## [Unreleased]" is not a release.
RELEASE_HEADING = re.compile(r"^## \[([0-9]+\.[0-9]+\.[0-9]+)\]", re.MULTILINE)


def test_the_version_file_has_the_one_line_cmake_reads() -> None:
    matches = VERSION_LINE.findall(VERSION_FILE.read_text())
    assert matches == [_version.__version__]


def test_the_package_version_is_the_version_file() -> None:
    assert dash_attn.__version__ == _version.__version__


def test_the_wheel_takes_its_version_from_the_version_file() -> None:
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11 on")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    provider = project["tool"]["scikit-build"]["metadata"]["version"]
    assert provider == {"provider": "scikit_build_core.metadata.regex", "input": "python/dash_attn/_version.py"}


def test_cmake_reads_the_version_file() -> None:
    cmake = (REPO / "CMakeLists.txt").read_text()
    assert "python/dash_attn/_version.py" in cmake
    assert re.search(r"^project\(dash VERSION \$\{CMAKE_MATCH_1\}", cmake, re.MULTILINE)


def test_the_newest_changelog_release_is_this_version() -> None:
    releases = RELEASE_HEADING.findall((REPO / "CHANGELOG.md").read_text())
    assert releases, "CHANGELOG.md names no release"
    assert releases[0] == _version.__version__


def test_the_library_reports_the_package_version() -> None:
    try:
        built = _library.library_version()
    except ImportError as error:
        pytest.skip(f"libdash_attn_c.so is not available: {error}")
    assert built == dash_attn.__version__
