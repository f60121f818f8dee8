#!/usr/bin/env bash
# The PyTorch front's tests, as one CTest test: exits 77 (CTest's skip code) with the reason when
# PyTorch or pytest is missing; the tests themselves skip, saying so, without a Hopper GPU.
#   usage: scripts/run_python_tests.sh PATH_TO_libdash_attn_c.so
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
if ! python3 -c "import torch, pytest" 2>/dev/null; then
  echo "SKIPPED: the PyTorch tests need torch and pytest (python3 -m pip install torch pytest)"
  exit 77
fi
DASH_ATTN_LIBRARY="$1" PYTHONPATH="$repo/python" exec python3 -m pytest -q -rs "$repo/python/tests"
