#!/usr/bin/env bash
# Runs a command that launches GPU kernels; if it is still running after SECONDS, attaches cuda-gdb, writes every
# resident warp's PC to DUMP (scripts/dev/cuda_gdb_warps.py), kills the command and exits 124. Otherwise exits with the
# command's status. For the first test of a kernel change that could hang, so that a hang costs seconds and leaves
# where each warp waited instead of a timed-out call.
#
#   scripts/dev/run_or_dump_warps.sh SECONDS DUMP command [args...]
set -u
if [ $# -lt 3 ]; then
  echo "usage: $0 SECONDS DUMP command [args...]" >&2
  exit 2
fi
seconds=$1
dump=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
"$@" &
pid=$!
for _ in $(seq "$seconds"); do
  kill -0 "$pid" 2>/dev/null || break
  sleep 1
done
if kill -0 "$pid" 2>/dev/null; then
  gdb_bin=$(command -v cuda-gdb || echo /usr/local/cuda/bin/cuda-gdb)
  timeout 100 "$gdb_bin" -p "$pid" -batch -ex "set pagination off" -x "$here/cuda_gdb_warps.py" > "$dump" 2>&1
  kill -9 "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  echo "$0: still running after $seconds s; warps in $dump" >&2
  exit 124
fi
wait "$pid"
