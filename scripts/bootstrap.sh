#!/usr/bin/env bash
# Sets up a fresh Debian/Ubuntu machine and builds DASH into build/ (idempotent: a second run only
# rebuilds what changed). Installs missing Debian packages; CMake fetches the pinned CUTLASS headers
# from PyPI itself (cmake/Cutlass.cmake). Extra CMake arguments: DASH_CMAKE_ARGS, e.g.
#   DASH_CMAKE_ARGS="-DDASH_HEAD_DIMS=128 -DDASH_DTYPES=bf16" scripts/bootstrap.sh
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v make >/dev/null || missing+=(make)
command -v g++ >/dev/null || missing+=(g++)
command -v python3 >/dev/null || missing+=(python3)
python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
[ -f /usr/include/gtest/gtest.h ] || missing+=(libgtest-dev)
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
command -v nvcc >/dev/null || echo "bootstrap: no nvcc found; building without the GPU kernels (the planner, emulator and CPU tests still build)"

# shellcheck disable=SC2086  # DASH_CMAKE_ARGS is a list of arguments
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release ${DASH_CMAKE_ARGS:-} > build.configure.log || { cat build.configure.log; exit 1; }
cmake --build build -j "$(nproc)"
