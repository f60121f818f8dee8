#!/bin/bash
# GPU call L (for session 17): branch wip/dq-adds-from-registers (.gpu/rd: d = 192 and 256, dQ added from the MMA
# warpgroups' registers, ordered by DqOrder; .gpu/rd2: the same with dO in two stages) against 299d65c (.gpu/m1) and
# ad4a8fe at 256 (.gpu/pw): the tests that can hang or break first (with a cuda-gdb dump if the first one hangs),
# A/B, FA3, Nsight Compute.
set -u
T0=$(date +%s); left() { echo $(( 570 - ($(date +%s) - T0) )); }
R=$OUT/r; mkdir -p $R
(cd .peers && MAX_JOBS=12 PEERS_DIR=/tmp/peers bash build_wide.sh fa3 > $R/fa3_build.txt 2>&1; echo "fa3 build rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt) &
F='Shapes/Sm90Correctness.BackwardMatchesReferenceForEverySchedule/hdim256_bf16_B2_Sq256_Sk256_Hq4_Hkv4_*'
.gpu/rd/test_sm90 --gtest_filter="$F" > $R/first.txt 2>&1 &
PID=$!
for i in $(seq 40); do kill -0 $PID 2>/dev/null || break; sleep 1; done
if kill -0 $PID 2>/dev/null; then
  echo "first: still running after 40 s, attaching cuda-gdb" >> $R/log.txt
  GDB=$(which cuda-gdb || echo /usr/local/cuda/bin/cuda-gdb)
  timeout 100 $GDB -p $PID -batch -ex "set pagination off" -x .gpu/gdb_warps.py > $R/gdb.txt 2>&1; kill -9 $PID
  head -c 4000 $R/gdb.txt >> $R/log.txt; cat $R/log.txt; cd $OUT && tar czf r.tgz r; exit 0
fi
wait $PID; echo "first rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
for v in rd rd2; do
  timeout 100 .gpu/$v/test_sm90 --gtest_filter='Shapes/Sm90Correctness.Backward*hdim256*:Shapes/Sm90Correctness.Backward*hdim192*:Shapes/Sm90Determinism.*hdim256*:Shapes/Sm90Determinism.*hdim192*:HeadDims/Sm90DeterminismControl.*' > $R/test_$v.txt 2>&1; echo "test_$v rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
  grep -c "^\[       OK" $R/test_$v.txt >> $R/log.txt; grep "FAILED\|Failure" $R/test_$v.txt | head -10 >> $R/log.txt; tail -1 $R/test_$v.txt >> $R/log.txt
done
PYTHONPATH=$PWD/python timeout 100 python python/benchmarks/ab_libraries.py .gpu/m1/libdash_attn_c.so .gpu/pw/libdash_attn_c.so .gpu/rd/libdash_attn_c.so .gpu/rd2/libdash_attn_c.so --rounds 1 --schedules auto,shift,nondeterministic --compare-args "--grid wide --head-dims 256 --seqlens 1024,4096,16384" --out $R/ab256 > $R/ab256.txt 2>&1; echo "ab256 rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
grep "geometric" $R/ab256.txt >> $R/log.txt
PYTHONPATH=$PWD/python timeout 80 python python/benchmarks/ab_libraries.py .gpu/m1/libdash_attn_c.so .gpu/rd/libdash_attn_c.so .gpu/rd2/libdash_attn_c.so --rounds 1 --schedules auto,shift,nondeterministic --compare-args "--grid wide --head-dims 192 --seqlens 1024,4096,16384" --out $R/ab192 > $R/ab192.txt 2>&1; echo "ab192 rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
grep "geometric" $R/ab192.txt >> $R/log.txt
wait
export PYTHONPATH=$PWD/python:/tmp/peers/fa3up/hopper
[ $(left) -gt 100 ] && DASH_ATTN_LIBRARY=$PWD/.gpu/rd/libdash_attn_c.so timeout 90 python python/benchmarks/compare.py --grid wide --head-dims 192,256 --seqlens 1024,4096,16384 --impls dash,fa3 --csv $R/compare_rd.csv --markdown $R/compare_rd.md > $R/compare_rd.txt 2>&1; echo "compare rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
grep "Geometric" $R/compare_rd.md >> $R/log.txt
[ $(left) -gt 50 ] && DASH_ATTN_LIBRARY=$PWD/.gpu/rd/libdash_attn_c.so timeout $(( $(left) - 15 )) bash scripts/ncu_attention.sh backward $R/ncu_rd 256 4096 full dash-det dash-nondet > $R/ncu_rd.txt 2>&1; echo "ncu_rd rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
rm -f $R/ncu*/*.ncu-rep
cat $R/log.txt
cd $OUT && tar czf r.tgz r
