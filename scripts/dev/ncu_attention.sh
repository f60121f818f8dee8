#!/usr/bin/env bash
# Nsight Compute profile of one forward or backward call of DASH and FlashAttention-3 at one shape
# (deterministic and not, for the backward), on a Hopper GPU: for each, the main kernel's duration,
# throughput, warp-state and memory sections (ncu's details page) and its SASS instructions ranked by warp
# stall samples (the source page), so that a first GPU call shows where DASH's kernel body loses to
# FA3's. Clocks are left as they are (--clock-control none), as in every DASH measurement.
#
# usage: scripts/dev/ncu_attention.sh {forward,backward} OUT_DIR HEAD_DIM SEQLEN {causal,full} [IMPL ...]
#        IMPL: dash-det dash-nondet fa3-det fa3-nondet cudnn (cudnn: PyTorch SDPA's cuDNN forward; default: all four for the backward, dash-det and
#        fa3-det for the forward, where the flag changes nothing); fa3-* need flash_attn_interface, e.g.
#        PYTHONPATH=$PWD/python:/tmp/peers/fa3up/hopper after ../shared/peers/build_peers.sh fa3
# Writes OUT_DIR/<impl>.ncu-rep, <impl>_details.txt, <impl>_source.csv (the SASS source page, which
# scripts/dev/ncu_step_phases.py breaks into the step's phases) and <impl>_top_sass.txt, and prints the summaries.
set -uo pipefail
pass=$1 out=$2 head_dim=$3 seqlen=$4 mask=$5
shift 5
case $pass in
  forward) default_impls=(dash-det fa3-det) ;;
  backward) default_impls=(dash-det dash-nondet fa3-det fa3-nondet) ;;
  *) echo "usage: $0 {forward,backward} OUT_DIR HEAD_DIM SEQLEN {causal,full} [IMPL ...]" >&2; exit 2 ;;
esac
impls=("$@")
((${#impls[@]})) || impls=("${default_impls[@]}")
repo=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"

main_kernel() {  # the filter on the demangled name of an implementation's main kernel of the pass (FA3's
                 # kernels are all cutlass::device_kernel<...>, so the plain function name cannot tell them apart)
  case $1-$pass in
    dash-*-forward) echo "regex:forward_kernel" ;;
    dash-*-backward) echo "regex:backward_kernel" ;;
    fa3-*-forward) echo "regex:FlashAttnFwdSm90" ;;
    fa3-*-backward) echo "regex:FlashAttnBwdSm90" ;;
    cudnn-forward) echo "regex:fprop" ;;  # cuDNN's generated SDPA kernels name the forward "..._fprop_..."
  esac
}

for impl in "${impls[@]}"; do
  kernel=$(main_kernel "$impl")
  timeout 600 ncu --profile-from-start off --clock-control none --kernel-name-base demangled --kernel-name "$kernel" \
    --launch-count 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section SchedulerStats --section SourceCounters \
    --export "$out/$impl" --force-overwrite \
    python3 "$repo/python/benchmarks/profile_attention.py" "$pass" "$impl" "$head_dim" "$seqlen" "$mask" \
    > "$out/${impl}_ncu.log" 2>&1
  echo "== $impl: ncu rc=$?"
  ncu --import "$out/$impl.ncu-rep" --page details > "$out/${impl}_details.txt" 2>&1
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Hit Rate|Issue Slots Busy|Issued Ipc|No Eligible|Warp Cycles Per Issued|Registers Per Thread|Dynamic Shared" \
    "$out/${impl}_details.txt" | sed 's/^ *//' | head -14
  ncu --import "$out/$impl.ncu-rep" --page source --csv --print-source sass > "$out/${impl}_source.csv" 2>&1
  python3 - "$out/${impl}_source.csv" > "$out/${impl}_top_sass.txt" <<'EOF'
# The 25 SASS instructions with the most warp stall samples, from ncu's source page (CSV).
import csv, sys
rows = list(csv.reader(open(sys.argv[1], newline="")))
header_at = next((i for i, r in enumerate(rows) if any("Warp Stall Sampling (All" in c for c in r)), None)
if header_at is None:
    sys.exit("no 'Warp Stall Sampling (All Samples)' column in the source page")
header = rows[header_at]
samples = next(i for i, c in enumerate(header) if "Warp Stall Sampling (All" in c)
source = next((i for i, c in enumerate(header) if c.strip() == "Source"), 1)
address = next((i for i, c in enumerate(header) if "Address" in c), 0)
def count(r):
    try:
        return float(r[samples].replace(",", ""))
    except (ValueError, IndexError):
        return 0.0
body = [r for r in rows[header_at + 1:] if len(r) > samples]
total = sum(count(r) for r in body) or 1.0
print(f"{len(body)} instructions, {total:.0f} stall samples")
for r in sorted(body, key=count, reverse=True)[:25]:
    print(f"{100 * count(r) / total:5.1f}%  {r[address]:>8}  {r[source].strip()[:110]}")
EOF
  head -8 "$out/${impl}_top_sass.txt"
  # Which execution counts hold the step loop; then scripts/dev/ncu_step_phases.py --counts shows its phases.
  python3 "$repo/scripts/dev/ncu_step_phases.py" "$out/${impl}_source.csv" | head -1
done
