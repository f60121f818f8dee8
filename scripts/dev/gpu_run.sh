#!/usr/bin/env bash
# Runs everything that needs a Hopper GPU from prebuilt binaries, writing full logs to OUT_DIR and
# printing short summaries: the GPU tests, compute-sanitizer (memcheck, racecheck, synccheck) on small ragged shapes,
# `dash-attn check`, and the forward/backward benchmarks on the paper's grid (with PyTorch SDPA
# anchors measured in the same run when PyTorch is present), the PyTorch tests, the randomized sweep, the
# same-run comparison with FlashAttention-3 and cuDNN, and the binary wheel's GPU test.
#   usage: scripts/dev/gpu_run.sh BIN_DIR OUT_DIR [tests|sanitize|check|bench|profile|python|sweep|compare|wheel ...]
#          (default: the first seven; compare and wheel only when asked for)
# BIN_DIR holds test_sm90, dash-attn and libdash_attn_c.so (and, for `wheel`, one dash_attn-*.whl); it may also be
# a .tar.xz of them, made on the CPU machine so that a full build travels in about 5 MiB, e.g.
#   tar -cf - -C build dash-attn libdash_attn_c.so -C tests test_sm90 | xz -T0 > bin.tar.xz
# `compare` runs python/benchmarks/compare.py with FA3 from $DASH_PEERS_BUILD/fa3up/hopper (default
# /tmp/peers); when that is missing and $DASH_PEERS names a copy of ../shared/peers, FA3 is built from it at
# the start, in the background, while the other steps run (about 2 minutes on the GPU machine's CPUs).
# Everything written to OUT_DIR is also packed into OUT_DIR.tgz at the end: one file to fetch, whatever the
# number of logs.
set -uo pipefail
bin=$(realpath "$1")
out=$(realpath "$2")
if [[ -f "$bin" && "$bin" == *.tar.xz ]]; then
  mkdir -p "$out.bin" && tar -xJf "$bin" -C "$out.bin" || exit 1
  bin=$out.bin
fi
shift 2
steps=("$@")
((${#steps[@]})) || steps=(tests sanitize check bench profile python sweep)
repo=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
summary() { grep -E "$2" "$1" | cut -c1-200 | head -"${3:-40}"; }
peers_build=${DASH_PEERS_BUILD:-/tmp/peers}
peers_job=
if [[ " ${steps[*]} " == *" compare "* && ! -d "$peers_build/fa3up/hopper/flash_attn_3" && -n "${DASH_PEERS:-}" ]]; then
  (cd "$DASH_PEERS" && PEERS_DIR="$peers_build" bash build_peers.sh fa3 > "$out/peers_build.log" 2>&1) &
  peers_job=$!
fi

for step in "${steps[@]}"; do
  case $step in
    tests)
      # The tests that hold SMs, time a wait or watch the first call want the GPU to themselves and run first, in
      # series; the others run in $shards gtest shards at once, which share the GPU and the CPU's float64 references
      # (about 4.5 minutes on the H200's 16 cores, where one process takes about 20).
      alone='*SmMargin*:*WaitBound*:*WaitTimeout*:*CaptureFirstCall*:*Sm90SeqlenGuard*:*Sm90OffsetsGuard*:*Sm90TmaDescriptor*'
      shards=${DASH_TEST_SHARDS:-8}
      timeout 600 "$bin/test_sm90" --gtest_filter="$alone" > "$out/test_sm90_alone.log" 2>&1
      echo "== test_sm90 (alone) rc=$?"
      summary "$out/test_sm90_alone.log" '^\[  (PASSED|FAILED|SKIPPED) |rel_l2|differed|HANG|exception'
      for ((i = 0; i < shards; i++)); do
        GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout 900 "$bin/test_sm90" --gtest_filter="-$alone" \
          > "$out/test_sm90_shard$i.log" 2>&1 &
      done
      shard_failures=0
      for job in $(jobs -p); do [ "$job" = "$peers_job" ] || wait "$job" || shard_failures=$((shard_failures + 1)); done
      echo "== test_sm90 ($shards shards) shards failed: $shard_failures"
      cat "$out"/test_sm90_shard*.log | summary /dev/stdin '^\[  (FAILED|SKIPPED) |^\[  PASSED  \]|rel_l2|differed|HANG|exception' 60 ;;
    sanitize)
      # Small shapes only: the tools slow kernels down by orders of magnitude.
      # Ragged lengths (130, 77, 300: rows end inside a warp), Sq != Sk both ways, GQA. synccheck reports
      # warp-synchronous calls that some lanes of the warp skip (the cause of the forward's ragged hang).
      filter='Shapes/Sm90Correctness.*hdim128_bf16_B1_Sq130_Sk130*:Shapes/Sm90Correctness.*hdim64_bf16_B1_Sq77_Sk300*causal:Shapes/Sm90Correctness.*hdim128_fp16_B2_Sq300_Sk77_Hq4_Hkv1_causal'
      # A sliding window with rows that see no key, and softcap under a two-sided window (test_sm90_variants.cpp).
      filter+=':Cases/Sm90Variant.*hdim64_bf16_B1_Sq400_Sk100_Hq2_Hkv2_full_win20_5:Cases/Sm90Variant.*hdim128_fp16_B1_Sq600_Sk450_Hq4_Hkv2_full_win150_40_softcap3'
      # Packed varlen batches (test_sm90_varlen.cpp): lengths 0 and 1, seqlen_q != seqlen_k both ways, causal, MQA;
      # and a window with a sequence shorter than one tile: every sequence's loads and stores at its offsets.
      filter+=':Cases/Sm90Varlen.*hdim64_bf16_q_ne_k_causal:Cases/Sm90Varlen.*hdim128_fp16_window:Sm90VarlenContract.*'
      # The varlen kernels of the wider head dims (narrow forward key tiles, the head_dim-split backward's dK and dV
      # stores clipped at each sequence's end) and of softcap.
      filter+=':Cases/Sm90Varlen.*hdim256_fp16_q_ne_k_causal:Cases/Sm90Varlen.*hdim192_bf16_softcap_window'
      # The fp32 out (stores from the accumulator fragment, no staging tile), dense and packed.
      filter+=':Shapes/Sm90Fp32Out.*ragged_causal_gqa_hdim64_bf16:Lengths/Sm90Fp32OutVarlen.*causal_hdim128_fp16'
      # The forward's other tile shapes: tall d = 64 tiles (three MMA warpgroups) from 2048 query rows (8192
      # causal), wide d = 128 tiles under a full mask from 2048 keys (O stored without a staging tile), short d = 64
      # tiles (one MMA warpgroup, two CTAs per SM) under a full mask up to 1024 tokens: one ragged forward of each
      # through the CLI, with short other lengths to keep the tools' time down.
      tile_shapes=("--head-dim 64 --seqlen-q 2100 --seqlen-k 333" "--head-dim 64 --seqlen-q 8200 --seqlen-k 517 --causal"
                   "--head-dim 128 --seqlen-q 130 --seqlen-k 4100" "--head-dim 64 --seqlen-q 777 --seqlen-k 1001")
      for tool in memcheck racecheck synccheck; do
        timeout 600 compute-sanitizer --tool "$tool" "$bin/test_sm90" --gtest_filter="$filter" > "$out/sanitize_$tool.log" 2>&1
        echo "== compute-sanitizer $tool rc=$?"
        summary "$out/sanitize_$tool.log" 'ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED)' 6
        for i in "${!tile_shapes[@]}"; do
          shape=${tile_shapes[$i]}
          # shellcheck disable=SC2086  # $shape is a list of flags
          timeout 300 compute-sanitizer --tool "$tool" "$bin/dash-attn" bench --fwd --batch 1 --heads 2 --heads-kv 1 \
            $shape --warmup 0 --iters 1 > "$out/sanitize_${tool}_forward_$i.log" 2>&1
          echo "== compute-sanitizer $tool, forward $shape rc=$?"
          summary "$out/sanitize_${tool}_forward_$i.log" 'ERROR SUMMARY|RACECHECK SUMMARY' 2
        done
      done ;;
    check)
      for shape in "--causal" "" "--heads 8 --heads-kv 2 --causal --head-dim 64"; do
        # shellcheck disable=SC2086  # $shape is a list of flags
        timeout 300 "$bin/dash-attn" check --runs 50 $shape > "$out/check.log" 2>&1
        echo "== dash-attn check $shape rc=$?"
        cat "$out/check.log"
      done ;;
    bench)
      anchors=()
      if [ -f "$repo/python/benchmarks/sdpa_anchors.py" ] && python3 -c "import torch" 2>/dev/null; then
        timeout 900 python3 "$repo/python/benchmarks/sdpa_anchors.py" --csv "$out/sdpa.csv" > "$out/sdpa.log" 2>&1
        echo "== sdpa anchors rc=$?"
        anchors=(--anchors "$out/sdpa.csv")
      fi
      timeout 1200 "$bin/dash-attn" bench "${anchors[@]}" --csv "$out/bwd.csv" --markdown "$out/bwd.md" > /dev/null 2> "$out/bench_bwd.log"
      echo "== bench backward rc=$?"; cat "$out/bwd.md"
      timeout 600 "$bin/dash-attn" bench --fwd "${anchors[@]}" --csv "$out/fwd.csv" --markdown "$out/fwd.md" > /dev/null 2> "$out/bench_fwd.log"
      echo "== bench forward rc=$?"; cat "$out/fwd.md" ;;
    profile)
      # Hardware counters of one backward and one forward main kernel (Nsight Compute, clocks untouched).
      sections=(--section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis)
      for kernel in backward_kernel forward_kernel; do
        fwd_flag=()
        [ "$kernel" = forward_kernel ] && fwd_flag=(--fwd)
        timeout 300 ncu --clock-control none --kernel-name "regex:$kernel" --launch-skip 3 --launch-count 1 \
          "${sections[@]}" "$bin/dash-attn" bench "${fwd_flag[@]}" --batch 2 --heads 16 --seqlen 8192 --head-dim 128 \
          --causal --schedule auto --warmup 3 --iters 1 > "$out/ncu_$kernel.log" 2>&1
        echo "== ncu $kernel rc=$?"
        summary "$out/ncu_$kernel.log" 'Duration|Compute \(SM\) Throughput|Memory Throughput|Tensor|Issue Slots Busy|Warp Cycles Per Issued|No Eligible|Stall' 30
      done ;;
    python)
      # The PyTorch front with a prebuilt libdash_attn_c.so: its tests, then the one-layer training-step benchmark
      # (with FA3 beside it when FA3 is built: list `compare` before `python` to have it built first).
      export DASH_ATTN_LIBRARY="$bin/libdash_attn_c.so" PYTHONPATH="$repo/python"
      timeout 900 python3 -m pytest -q -rs "$repo/python/tests" > "$out/pytest.log" 2>&1
      echo "== pytest rc=$?"; tail -25 "$out/pytest.log"
      PYTHONPATH="$repo/python:$peers_build/fa3up/hopper" timeout 900 python3 "$repo/python/benchmarks/e2e_layer.py" \
        --csv "$out/e2e_layer.csv" > "$out/e2e_layer.log" 2>&1
      echo "== e2e layer benchmark rc=$?"; cat "$out/e2e_layer.log" ;;
    sweep)
      # 300 random shapes (python/tests/random_sweep.py), a new seed each run: every schedule twice, bit for
      # bit, against a float32 reference, under a hang watchdog (exit 3). The seed is printed; a failing
      # shape replays with `random_sweep.py --seed SEED --only INDEX`.
      if ! python3 -c "import torch" 2>/dev/null; then echo "== random sweep skipped: no PyTorch"; continue; fi
      export DASH_ATTN_LIBRARY="$bin/libdash_attn_c.so" PYTHONPATH="$repo/python"
      seed=$(date +%s)
      echo "== random sweep seed $seed"
      timeout 900 python3 "$repo/python/tests/random_sweep.py" --seed "$seed" --shapes 300 --csv "$out/sweep.csv" \
        > "$out/sweep.log" 2>&1
      echo "== random sweep rc=$?"
      summary "$out/sweep.log" '^random_sweep: (seed|cannot run)|FAIL|replay:|HANG|Traceback|Error|^sweep:' 60 ;;
    compare)
      if [ -n "$peers_job" ]; then wait "$peers_job"; echo "== FA3 build rc=$? (log: peers_build.log)"; peers_job=; fi
      export DASH_ATTN_LIBRARY="$bin/libdash_attn_c.so" PYTHONPATH="$repo/python:$peers_build/fa3up/hopper"
      timeout 900 python3 "$repo/python/benchmarks/compare.py" --csv "$out/compare.csv" --markdown "$out/compare.md" \
        > "$out/compare.log" 2>&1
      echo "== compare rc=$?"
      summary "$out/compare.log" 'not measured|Error' 5
      summary "$out/compare.md" '^Geometric' 3 ;;
    wheel)
      wheels=("$bin"/dash_attn-*.whl)
      if [ ! -f "${wheels[0]}" ]; then echo "== wheel skipped: no dash_attn-*.whl in $bin"; continue; fi
      timeout 900 "$repo/scripts/test_wheel.sh" --gpu "${wheels[0]}" > "$out/wheel.log" 2>&1
      echo "== wheel test rc=$?"
      tail -1 "$out/wheel.log" ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
tar czf "$out.tgz" -C "$out" . && echo "== logs packed: $out.tgz"
