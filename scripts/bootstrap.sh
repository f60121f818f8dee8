#!/usr/bin/env bash
# Sets up a fresh Debian/Ubuntu machine and builds DASH (idempotent: a second run only rebuilds what changed and
# installs nothing that is already there).
#   usage: scripts/bootstrap.sh [--cli]
#
# Default (the README's test command): everything into build/: the library, the dash-attn tool, the tests, and
# the sm90 kernels where nvcc is found (30+ minutes on 2 cores); then the Python test environment build/venv
# (python/requirements-test.txt: pytest, torch, transformers), which python_tests (CTest) and .ci/run use. The
# environment sees the interpreter's own site-packages, so a torch already installed there is not fetched again.
# --cli (the README's first command): only the dash-attn command-line tool, into build-cli/: no kernels, tests,
# GoogleTest or Python environment, so it is done in a few minutes on 2 cores without a GPU. The commands that
# need a GPU (check, bench) say so there.
#
# Debian packages it lacks are installed with apt-get; CMake fetches the pinned CUTLASS headers from PyPI itself
# (cmake/Cutlass.cmake) when it builds the kernels. Extra CMake arguments: DASH_CMAKE_ARGS, e.g.
#   DASH_CMAKE_ARGS="-DDASH_HEAD_DIMS=128 -DDASH_DTYPES=bf16" scripts/bootstrap.sh
set -euo pipefail
cd "$(dirname "$0")/.."

mode=all
case ${1:-} in
  "") ;;
  --cli) mode=cli ;;
  *) echo "usage: $0 [--cli]   (unknown argument: $1)" >&2; exit 2 ;;
esac

missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v make >/dev/null || missing+=(make)
command -v g++ >/dev/null || missing+=(g++)
if [ "$mode" = all ]; then
  command -v python3 >/dev/null || missing+=(python3)
  # venv with pip in it: Debian ships ensurepip separately.
  python3 -c "import ensurepip, venv" >/dev/null 2>&1 || missing+=(python3-venv)
  python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
  [ -f /usr/include/gtest/gtest.h ] || missing+=(libgtest-dev)
fi
if ((${#missing[@]})); then
  echo "bootstrap: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}"
fi
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

if [ "$mode" = cli ]; then
  mkdir -p build-cli
  # The tool alone: the planner, simulator and emulator it runs are host code; its GPU commands link the CUDA
  # runtime, which the configuration still finds (find_package(CUDAToolkit)).
  # shellcheck disable=SC2086  # DASH_CMAKE_ARGS is a list of arguments
  cmake -S . -B build-cli -DCMAKE_BUILD_TYPE=Release -DDASH_BUILD_KERNELS=OFF -DDASH_BUILD_TESTS=OFF \
    ${DASH_CMAKE_ARGS:-} > build-cli/configure.log || { cat build-cli/configure.log; exit 1; }
  cmake --build build-cli -j "$(nproc)" --target dash-attn
  echo "bootstrap: built build-cli/dash-attn"
  exit 0
fi

# The Python test environment: pinned versions (python/requirements-test.txt); pip leaves what is satisfied.
venv=build/venv
mkdir -p build
if [ ! -x "$venv/bin/python" ]; then
  echo "bootstrap: creating the Python test environment $venv"
  python3 -m venv --system-site-packages "$venv"
fi
echo "bootstrap: installing python/requirements-test.txt into $venv (torch from PyPI is its CUDA build: several GB the first time)"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r python/requirements-test.txt

command -v nvcc >/dev/null || echo "bootstrap: no nvcc found; building without the GPU kernels (the planner, emulator and CPU tests still build)"
# shellcheck disable=SC2086  # DASH_CMAKE_ARGS is a list of arguments
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "-DDASH_PYTHON=$PWD/$venv/bin/python" ${DASH_CMAKE_ARGS:-} \
  > build/configure.log || { cat build/configure.log; exit 1; }
cmake --build build -j "$(nproc)"
