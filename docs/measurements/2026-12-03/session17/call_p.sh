#!/bin/bash
# GPU call P (prepared in session 17 for the next): the d = 192 backward on three MMA warpgroups (.gpu/w3, branch
# wip/bwd-three-warpgroups-192 / session17/bwd_three_warpgroups_192_untested.patch, bf16 d = 192 only) against
# 299d65c (.gpu/m1, whose d = 192 kernels compute as main's): hang check with a cuda-gdb dump, tests, A/B, FA3,
# Nsight Compute. Carry .gpu and .peers.
set -u
T0=$(date +%s); left() { echo $(( 570 - ($(date +%s) - T0) )); }
R=$OUT/r; mkdir -p $R
(cd .peers && MAX_JOBS=12 PEERS_DIR=/tmp/peers bash build_wide.sh fa3 > $R/fa3_build.txt 2>&1; echo "fa3 build rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt) &
scripts/run_or_dump_warps.sh 40 $R/gdb.txt .gpu/w3/test_sm90 \
  --gtest_filter='Shapes/Sm90Correctness.BackwardMatchesReferenceForEverySchedule/hdim192_bf16_B2_Sq256_Sk256_Hq4_Hkv4_*' > $R/first.txt 2>&1
rc=$?; echo "first rc=$rc at $(( $(date +%s) - T0 )) s" >> $R/log.txt
[ $rc = 124 ] && { head -c 4000 $R/gdb.txt >> $R/log.txt; cat $R/log.txt; cd $OUT && tar czf r.tgz r; exit 0; }
timeout 150 .gpu/w3/test_sm90 --gtest_filter='*hdim192*:HeadDims/Sm90DeterminismControl.*:Sm90VariantDeterminismControl.*' > $R/test_w3.txt 2>&1; echo "test_w3 rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
grep -c "^\[       OK" $R/test_w3.txt >> $R/log.txt; grep "FAILED\|Failure" $R/test_w3.txt | head -10 >> $R/log.txt; tail -1 $R/test_w3.txt >> $R/log.txt
PYTHONPATH=$PWD/python timeout 90 python python/benchmarks/ab_libraries.py .gpu/m1/libdash_attn_c.so .gpu/w3/libdash_attn_c.so --rounds 2 --schedules auto,shift,nondeterministic --compare-args "--grid wide --head-dims 192 --seqlens 1024,4096,16384" --out $R/ab192 > $R/ab192.txt 2>&1; echo "ab192 rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
grep "geometric" $R/ab192.txt >> $R/log.txt
wait
export PYTHONPATH=$PWD/python:/tmp/peers/fa3up/hopper
[ $(left) -gt 60 ] && DASH_ATTN_LIBRARY=$PWD/.gpu/w3/libdash_attn_c.so timeout 50 python python/benchmarks/compare.py --grid wide --head-dims 192 --seqlens 1024,4096,16384 --impls dash,fa3 --csv $R/compare_w3.csv --markdown $R/compare_w3.md > $R/compare_w3.txt 2>&1; echo "compare rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
grep "Geometric" $R/compare_w3.md >> $R/log.txt
[ $(left) -gt 50 ] && DASH_ATTN_LIBRARY=$PWD/.gpu/w3/libdash_attn_c.so timeout $(( $(left) - 15 )) bash scripts/ncu_attention.sh backward $R/ncu_w3 192 4096 full dash-det fa3-det > $R/ncu_w3.txt 2>&1; echo "ncu rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
rm -f $R/ncu*/*.ncu-rep
cat $R/log.txt
cd $OUT && tar czf r.tgz r
