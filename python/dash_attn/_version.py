"""The version of DASH: the one place it is written.

CMake's project() reads it from here (CMakeLists.txt), so the C ABI's dash_library_version() returns it; the
wheel's metadata takes it from here (pyproject.toml, scikit-build-core's regex provider); dash_attn.__version__
imports it; CHANGELOG.md's newest release heading names it. python/tests/test_version.py checks that all of
them agree. Keep the form MAJOR.MINOR.PATCH: CMake's project(VERSION) accepts nothing else.
"""

__version__ = "0.1.0"
