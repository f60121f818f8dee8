#!/usr/bin/env bash
# SASS report of the DASH kernels that runs on a machine without a GPU, so that a kernel change can
# be judged before GPU time: per kernel, registers (and the warp roles' setmaxnreg), stack frame,
# instruction count, and the counts of HGMMA, HGMMA.WAIT (warpgroup waits), STSM, LDSM, LDL, STL, R2UR, STG, ST/STS,
# BAR, SHFL and MUFU.EX2, over the MMA step loop (the innermost loop with the most HGMMA) and over the whole kernel.
#
# Usage:
#   scripts/sass_report.sh [--csv FILE] [--loops] [OBJECT_OR_BINARY ...]
#       Markdown table on stdout; default input: every kernel instance object under
#       build/src/kernels/ (instance_*.cu.o). --csv also writes the numbers as CSV; --loops adds every
#       loop with HGMMA per kernel (to check which loop was taken for the step).
#   scripts/sass_report.sh --diff OLD.csv NEW.csv
#       Per-kernel changes between two --csv files, e.g. before and after a kernel edit.
#
# Tools: cuobjdump and nvdisasm from PATH (or /usr/local/cuda/bin) when both are there; otherwise
# installed once from PyPI (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm, CUDA 13) into
# $DASH_SASS_TOOLS (default build/sass-tools) and reused. Needs python3 and c++filt.
# Limits: the counts are static (code, not executed instructions), spill bytes are not in the cubin
# (LDL / STL instruction counts stand for them), and the loop detection has the limits written at
# the top of scripts/sass_report.py, which does the parsing.
set -euo pipefail
repository="$(cd "$(dirname "$0")/.." && pwd)"

if [ "${1:-}" = "--diff" ]; then
  exec python3 "$repository/scripts/sass_report.py" "$@"
fi

command -v c++filt >/dev/null || { echo "sass_report: c++filt (binutils) is missing" >&2; exit 1; }
PATH="$PATH:/usr/local/cuda/bin"
if command -v cuobjdump >/dev/null && command -v nvdisasm >/dev/null; then
  cuobjdump="$(command -v cuobjdump)"
  nvdisasm="$(command -v nvdisasm)"
else
  tools="$(mkdir -p "${DASH_SASS_TOOLS:-$repository/build/sass-tools}" &&
           cd "${DASH_SASS_TOOLS:-$repository/build/sass-tools}" && pwd)"
  cuobjdump="$tools/nvidia/cu13/bin/cuobjdump"
  nvdisasm="$tools/nvidia/cu13/bin/nvdisasm"
  if [ ! -x "$cuobjdump" ] || [ ! -x "$nvdisasm" ]; then
    echo "sass_report: installing cuobjdump and nvdisasm from PyPI into $tools" >&2
    PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check \
      --upgrade --target "$tools" "nvidia-cuda-cuobjdump>=13,<14" "nvidia-cuda-nvdisasm>=13,<14" >&2
  fi
fi

exec python3 "$repository/scripts/sass_report.py" --cuobjdump "$cuobjdump" --nvdisasm "$nvdisasm" "$@"
