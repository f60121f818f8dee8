#!/usr/bin/env bash
# The PyTorch front's tests (python/tests) against one build of libdash_attn_c.so, with pytest's summary line last.
#   usage: scripts/run_python_tests.sh PATH_TO_libdash_attn_c.so [PYTEST_ARGS...]
# The interpreter is $DASH_PYTHON (CTest's python_tests and .ci/run set it to bootstrap's build/venv), else python3.
# Exit codes: pytest's, except 77 (CTest's skip code) with the reason when the interpreter lacks torch or pytest,
# and 1 instead of pytest's 5 when it collected no test: a run that tested nothing must not pass for a green one.
# The tests themselves skip, saying why, without a Hopper GPU.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
if [ $# -lt 1 ]; then
  echo "usage: $0 PATH_TO_libdash_attn_c.so [PYTEST_ARGS...]" >&2
  exit 2
fi
library=$1
shift
python=${DASH_PYTHON:-python3}
if ! "$python" -c "import torch, pytest" 2>/dev/null; then
  echo "SKIPPED: the PyTorch tests need torch and pytest in $python (scripts/bootstrap.sh installs them into build/venv)"
  exit 77
fi
# Bytecode and pytest's cache stay out of the source tree.
DASH_ATTN_LIBRARY="$library" PYTHONPATH="$repo/python" PYTHONDONTWRITEBYTECODE=1 \
  "$python" -m pytest -q -rs -p no:cacheprovider "$repo/python/tests" "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "run_python_tests: pytest collected no test in $repo/python/tests (exit 5); failing, since nothing was tested"
  exit 1
fi
exit "$rc"
