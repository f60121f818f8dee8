#!/usr/bin/env bash
# Same-run A/B of a kernel build option on the GPU machine: builds the kernels twice, the option OFF (A) and ON (B),
# runs the GPU tests that FILTER selects on B, then times both with `dash-attn bench` on the paper's grid in
# alternating rounds (A, B, A, B, ...: drift between calls hits both alike) and prints, per schedule and head dim,
# the geometric mean of B's time over A's (below 1: B is faster) and each shape's ratio of medians.
#   usage: scripts/dev/ab_build_option.sh OPTION OUT_DIR [HEAD_DIMS [SCHEDULES [ROUNDS [FILTER]]]]
#     OPTION     a CMake option of the kernels, e.g. DASH_BACKWARD_CHAINED_DQ
#     HEAD_DIMS  semicolon-separated (default "64;96;128"); SCHEDULES comma-separated (default "auto,nondeterministic")
#     ROUNDS     alternating rounds (default 3); FILTER a gtest filter for B's test_sm90 (default: the backward
#                tests, the determinism tests with their negative controls and the ragged sweep of those head dims;
#                "-" skips the tests)
# Needs DASH_CUTLASS_DIR (CUTLASS headers; the GPU machine cannot download them). Both builds are bf16, softcap
# kernels off, varlen kernels on. Logs, CSVs and the summary go to OUT_DIR.
set -uo pipefail
option=$1
out=$(realpath -m "$2")
head_dims=${3:-"64;96;128"}
schedules=${4:-"auto,nondeterministic"}
rounds=${5:-3}
repo=$(cd "$(dirname "$0")/../.." && pwd)
: "${DASH_CUTLASS_DIR:?set DASH_CUTLASS_DIR to the CUTLASS root}"
mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH

build() {  # build DIR ON|OFF
  local t0=$SECONDS
  cmake -S "$repo" -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDASH_CUTLASS_DIR="$DASH_CUTLASS_DIR" \
    -DDASH_HEAD_DIMS="$head_dims" -DDASH_DTYPES=bf16 -DDASH_SOFTCAP_KERNELS=OFF -D"$option"="$2" \
    > "$1.configure.log" 2>&1 || { tail -20 "$1.configure.log"; return 1; }
  ninja -C "$1" -j"$(nproc)" test_sm90 dash-attn > "$1.build.log" 2>&1 || { grep -E "error" "$1.build.log" | head -20; return 1; }
  echo "built $1 ($option=$2) in $((SECONDS - t0)) s"
}
build "$out/a" OFF > "$out/build_a.txt" 2>&1 &
build "$out/b" ON > "$out/build_b.txt" 2>&1
wait
cat "$out/build_a.txt" "$out/build_b.txt"
[[ -x "$out/a/dash-attn" && -x "$out/b/dash-attn" ]] || exit 1

default_filter=""
IFS=';' read -ra dims <<< "$head_dims"
for d in "${dims[@]}"; do default_filter+="*Backward*hdim${d}_*:*Determinism*hdim${d}_*:*RaggedSweep*hdim${d}_*:"; done
filter=${6:-"$default_filter"}
if [[ "$filter" != "-" ]]; then
  timeout 540 "$out/b/test_sm90" --gtest_filter="$filter" > "$out/test_b.log" 2>&1
  echo "== B's test_sm90 ($filter) rc=$?"
  grep -E '^\[  (PASSED|FAILED) |differed|HANG' "$out/test_b.log" | head -20
fi

IFS=',' read -ra scheds <<< "$schedules"
for ((r = 1; r <= rounds; r++)); do
  for v in a b; do
    for d in "${dims[@]}"; do
      for s in "${scheds[@]}"; do
        "$out/$v/dash-attn" bench --head-dim "$d" --schedule "$s" --iters 20 --csv "$out/bench_${v}_r${r}_d${d}_${s}.csv" \
          > /dev/null 2>> "$out/bench_errors.log"
      done
    done
  done
done

python3 - "$out" "$rounds" <<'EOF'
import csv, glob, math, os, statistics, sys
from collections import defaultdict
out, rounds = sys.argv[1], int(sys.argv[2])
times = defaultdict(list)  # (variant, hdim, schedule, mask, seqlen) -> ms per round
for path in glob.glob(os.path.join(out, "bench_*.csv")):
    variant, _, d, schedule = os.path.basename(path)[len("bench_"):-len(".csv")].split("_", 3)
    d = d[1:]  # "d128"
    for row in csv.DictReader(open(path)):
        times[(variant, d, schedule, row["mask"], int(row["seqlen"]))].append(float(row["ms"]))
lines = []
for d, schedule in sorted({(k[1], k[2]) for k in times}):
    ratios = []
    for key in sorted(k for k in times if k[0] == "a" and k[1] == d and k[2] == schedule):
        a, b = times[key], times.get(("b",) + key[1:])
        if b:
            ratio = statistics.median(b) / statistics.median(a)
            ratios.append(ratio)
            lines.append(f"  d={d} {schedule} {key[3]} {key[4]}: A {statistics.median(a):.3f} ms, B {statistics.median(b):.3f} ms, B/A {ratio:.3f}")
    if ratios:
        geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
        lines.append(f"d={d} {schedule}: B/A time, geometric mean {geo:.3f} over {len(ratios)} shapes ({rounds} rounds)")
summary = "\n".join(lines)
print(summary)
open(os.path.join(out, "summary.txt"), "w").write(summary + "\n")
EOF
tar -czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")" --exclude='*/a' --exclude='*/b' 2>/dev/null
