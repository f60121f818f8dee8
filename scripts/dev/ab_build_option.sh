#!/usr/bin/env bash
# Same-run A/B of kernel builds on the GPU machine: builds the kernels twice, A and B, runs the GPU tests that FILTER
# selects on B, then times both with `dash-attn bench` in alternating rounds (A, B, A, B, ...: drift between calls
# hits both alike) on the paper's grid and on a ragged varlen batch (8 sequences of 1,700-2,000 tokens, 15,100 in all,
# causal and full), and prints, per schedule and head dim, the geometric mean of B's time over A's (below 1: B is
# faster) and each shape's ratio of medians.
#   usage: scripts/dev/ab_build_option.sh OPTION OUT_DIR [HEAD_DIMS [SCHEDULES [ROUNDS [FILTER]]]]
#     OPTION     a CMake option of the kernels, e.g. DASH_FORWARD_PAIRED_CTAS: A with it OFF, B with it ON, both from
#                this tree; or "-": A from the source tree AB_BASE_TREE (e.g. `git archive` of an earlier commit,
#                unpacked), B from this tree, both at their defaults
#     HEAD_DIMS  semicolon-separated (default "64;96;128"); SCHEDULES comma-separated (default "auto,nondeterministic")
#     ROUNDS     alternating rounds (default 3); FILTER a gtest filter for B's test_sm90 (default: the backward
#                tests, the determinism tests with their negative controls and the ragged sweep of those head dims;
#                "-" skips the tests)
# With AB_FORWARD=1 it times the forward instead (`bench --fwd`; SCHEDULES is then ignored), and the default FILTER is
# the forward tests of those head dims.
# AB_SECONDS=N starts no round after N seconds of the script's run, so that a call's time limit does not cut a round
# and with it the summary; the summary then covers the rounds that ran.
# AB_STEP=build builds A and B and stops, keeping of each build only the binaries the rest reads (OUT_DIR/a/dash-attn,
# OUT_DIR/a/tests/test_sm90, and b's), and packs them into OUT_DIR.tar.xz (the two binaries share their kernels, so
# xz shrinks them about fourfold): build on the CPU machine, carry OUT_DIR.tar.xz to the GPU machine and run the same
# command there with AB_STEP=run, which unpacks it when OUT_DIR holds no binaries and skips the build, so that no
# device time goes to compiling.
# Needs DASH_CUTLASS_DIR (CUTLASS headers; the GPU machine cannot download them). Both builds are bf16, softcap
# kernels off, varlen kernels on. Logs, CSVs and the summary go to OUT_DIR.
set -uo pipefail
option=$1
out=$(realpath -m "$2")
head_dims=${3:-"64;96;128"}
schedules=${4:-"auto,nondeterministic"}
rounds=${5:-3}
repo=$(cd "$(dirname "$0")/../.." && pwd)
step=${AB_STEP:-all}
case $step in all | build | run) ;; *) echo "AB_STEP must be all, build or run, got '$step'" >&2; exit 2 ;; esac
[[ "$step" == run ]] || : "${DASH_CUTLASS_DIR:?set DASH_CUTLASS_DIR to the CUTLASS root}"
mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH

build() {  # build SOURCE_TREE BUILD_DIR [CMAKE_ARGS...]
  local t0=$SECONDS source=$1 dir=$2
  shift 2
  cmake -S "$source" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDASH_CUTLASS_DIR="$DASH_CUTLASS_DIR" \
    -DDASH_HEAD_DIMS="$head_dims" -DDASH_DTYPES=bf16 -DDASH_SOFTCAP_KERNELS=OFF "$@" \
    > "$dir.configure.log" 2>&1 || { tail -20 "$dir.configure.log"; return 1; }
  ninja -C "$dir" -j"$(nproc)" test_sm90 dash-attn > "$dir.build.log" 2>&1 || { grep -E "error" "$dir.build.log" | head -20; return 1; }
  echo "built $dir from $source ($*) in $((SECONDS - t0)) s"
}
if [[ "$step" != run ]]; then
  if [[ "$option" == "-" ]]; then
    : "${AB_BASE_TREE:?OPTION - needs AB_BASE_TREE, the source tree A is built from}"
    build "$(realpath "$AB_BASE_TREE")" "$out/a" > "$out/build_a.txt" 2>&1 &
    build "$repo" "$out/b" > "$out/build_b.txt" 2>&1
  else
    build "$repo" "$out/a" -D"$option"=OFF > "$out/build_a.txt" 2>&1 &
    build "$repo" "$out/b" -D"$option"=ON > "$out/build_b.txt" 2>&1
  fi
  wait
  cat "$out/build_a.txt" "$out/build_b.txt"
fi
if [[ "$step" == run && ! -x "$out/a/dash-attn" && -f "$out.tar.xz" ]]; then
  tar -xJf "$out.tar.xz" -C "$out" || exit 1
fi
for v in a b; do
  [[ -x "$out/$v/dash-attn" && -x "$out/$v/tests/test_sm90" ]] || { echo "no build in $out/$v" >&2; exit 1; }
done
if [[ "$step" == build ]]; then
  # The binaries link the kernels and the CUDA runtime statically: nothing else of the build trees is read.
  for v in a b; do
    find "$out/$v" -mindepth 1 -maxdepth 1 ! -name dash-attn ! -name tests -exec rm -rf {} +
    find "$out/$v/tests" -mindepth 1 -maxdepth 1 ! -name test_sm90 -exec rm -rf {} +
  done
  tar -cf - -C "$out" a b | xz -T0 -6 > "$out.tar.xz" || exit 1
  du -sh "$out" "$out.tar.xz"
  exit 0
fi

default_filter=""
IFS=';' read -ra dims <<< "$head_dims"
for d in "${dims[@]}"; do
  if [[ -n "${AB_FORWARD:-}" ]]; then
    default_filter+="*Forward*hdim${d}_*:*forward*hdim${d}_*:*RaggedSweep*hdim${d}_*:"
  else
    default_filter+="*Backward*hdim${d}_*:*Determinism*hdim${d}_*:*RaggedSweep*hdim${d}_*:"
  fi
done
# The forward has one kernel per shape, whatever the schedule: one pass, labelled "forward".
[[ -n "${AB_FORWARD:-}" ]] && schedules=forward
filter=${6:-"$default_filter"}
if [[ "$filter" != "-" ]]; then
  # In gtest shards at once, which share the GPU and the CPU's float64 references (gpu_run.sh's tests step).
  shards=${AB_TEST_SHARDS:-8}
  failed=0
  for ((i = 0; i < shards; i++)); do
    GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout "${AB_TEST_TIMEOUT:-300}" "$out/b/tests/test_sm90" \
      --gtest_filter="$filter" > "$out/test_b_shard$i.log" 2>&1 &
  done
  for job in $(jobs -p); do wait "$job" || failed=$((failed + 1)); done
  echo "== B's test_sm90 ($filter) in $shards shards: $failed failed"
  cat "$out"/test_b_shard*.log | grep -E '^\[  (PASSED|FAILED) |differed|HANG' | head -20
fi

IFS=',' read -ra scheds <<< "$schedules"
pass_flags() {  # the bench flags of pass $1: a backward schedule, or the forward
  if [[ "$1" == forward ]]; then echo --fwd; else echo --schedule "$1"; fi
}
# Ragged lengths: 1700, 2000, 1700, 2000, 2000, 1700, 2000, 2000 (no sequence a whole number of tiles).
varlen_offsets=0,1700,3700,5400,7400,9400,11100,13100,15100
for ((r = 1; r <= rounds; r++)); do
  if [[ -n "${AB_SECONDS:-}" ]] && ((SECONDS >= AB_SECONDS)); then
    echo "AB_SECONDS=$AB_SECONDS reached: $((r - 1)) of $rounds rounds ran"
    rounds=$((r - 1))
    break
  fi
  for v in a b; do
    for d in "${dims[@]}"; do
      for s in "${scheds[@]}"; do
        # The paper's grid at head dim d, one shape per call (`bench` runs the grid only without shape flags, and
        # then at its own head dims): 16384 tokens, hidden 2048, full and causal.
        for seqlen in 512 1024 2048 4096 8192 16384; do
          for mask in full causal; do
            "$out/$v/dash-attn" bench --head-dim "$d" --batch $((16384 / seqlen)) --heads $((2048 / d)) \
              --seqlen "$seqlen" $([[ $mask == causal ]] && echo --causal) $(pass_flags "$s") --iters 20 \
              --csv "$out/bench_${v}_r${r}_d${d}_${s}_${mask}${seqlen}.csv" > /dev/null 2>> "$out/bench_errors.log"
          done
        done
        for mask in full causal; do
          "$out/$v/dash-attn" bench --head-dim "$d" $(pass_flags "$s") --iters 20 --cu-seqlens "$varlen_offsets" \
            $([[ $mask == causal ]] && echo --causal) --csv "$out/varlen_${v}_r${r}_d${d}_${s}_${mask}.csv" \
            > /dev/null 2>> "$out/bench_errors.log"
        done
      done
    done
  done
done

python3 - "$out" "$rounds" <<'EOF'
import csv, glob, math, os, statistics, sys
from collections import defaultdict
out, rounds = sys.argv[1], int(sys.argv[2])
times = defaultdict(list)  # (variant, hdim, schedule, mask, seqlen) -> ms per round
for path in glob.glob(os.path.join(out, "bench_*.csv")) + glob.glob(os.path.join(out, "varlen_*.csv")):
    kind, name = os.path.basename(path)[: -len(".csv")].split("_", 1)
    variant, _, d, schedule = name.split("_")[:4]
    d = d[1:]  # "d128"
    for row in csv.DictReader(open(path)):
        seqlen = int(row["seqlen"]) if kind == "bench" else "varlen"
        times[(variant, d, schedule, row["mask"], seqlen)].append(float(row["ms"]))
lines = []
for d, schedule in sorted({(k[1], k[2]) for k in times}):
    ratios = {"the paper grid": [], "the varlen batch": []}
    for key in sorted((k for k in times if k[0] == "a" and k[1] == d and k[2] == schedule), key=str):
        a, b = times[key], times.get(("b",) + key[1:])
        if b:
            ratio = statistics.median(b) / statistics.median(a)
            ratios["the varlen batch" if key[4] == "varlen" else "the paper grid"].append(ratio)
            lines.append(f"  d={d} {schedule} {key[3]} {key[4]}: A {statistics.median(a):.3f} ms, B {statistics.median(b):.3f} ms, B/A {ratio:.3f}")
    for grid, values in ratios.items():
        if values:
            geo = math.exp(sum(map(math.log, values)) / len(values))
            lines.append(f"d={d} {schedule}, {grid}: B/A time, geometric mean {geo:.3f} over {len(values)} shapes ({rounds} rounds)")
summary = "\n".join(lines)
print(summary)
open(os.path.join(out, "summary.txt"), "w").write(summary + "\n")
EOF
# The logs, CSVs and summary without the two builds (GNU tar applies --exclude only before the paths it names).
tar -czf "$out.tgz" --exclude="$(basename "$out")/a" --exclude="$(basename "$out")/b" -C "$(dirname "$out")" \
  "$(basename "$out")"
