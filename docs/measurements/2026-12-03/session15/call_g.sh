#!/bin/bash
# GPU call G (session 15): the WIP with a one-thread dQ writer (.gpu/w1, d = 256 only): the test that hung, all d = 256
# tests, A/B against main's kernels (.gpu/n), FA3 at 256. If it hangs: every warp's PC by cuda-gdb.
set -u
T0=$(date +%s); left() { echo $(( 575 - ($(date +%s) - T0) )); }
R=$OUT/r; mkdir -p $R
(cd .peers && MAX_JOBS=12 PEERS_DIR=/tmp/peers bash build_wide.sh fa3 > $R/fa3_build.txt 2>&1; echo "fa3 build rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt) &
F='Shapes/Sm90Correctness.BackwardMatchesReferenceForEverySchedule/hdim256_bf16_B2_Sq256_Sk256_Hq4_Hkv4_*'
.gpu/w1/test_sm90 --gtest_filter="$F" > $R/first.txt 2>&1 &
PID=$!
for i in $(seq 40); do kill -0 $PID 2>/dev/null || break; sleep 1; done
if kill -0 $PID 2>/dev/null; then
  echo "first: still running after 40 s, attaching cuda-gdb" >> $R/log.txt
  GDB=$(which cuda-gdb || echo /usr/local/cuda/bin/cuda-gdb)
  timeout 100 $GDB -p $PID -batch -ex "set pagination off" -x .gpu/gdb_warps.py > $R/gdb.txt 2>&1; echo "gdb rc=$?" >> $R/log.txt
  kill -9 $PID; head -c 4000 $R/gdb.txt >> $R/log.txt
  cat $R/log.txt; cd $OUT && tar czf r.tgz r; exit 0
fi
wait $PID; echo "first rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt; grep -c "^\[       OK" $R/first.txt >> $R/log.txt
timeout 170 .gpu/w1/test_sm90 --gtest_filter='*hdim256*:*256*' > $R/test.txt 2>&1; echo "test rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
grep -c "^\[       OK" $R/test.txt >> $R/log.txt; grep "FAILED\|Failure\|dash:" $R/test.txt | head -20 >> $R/log.txt; tail -2 $R/test.txt >> $R/log.txt
[ $(left) -gt 100 ] && PYTHONPATH=$PWD/python timeout 60 python python/benchmarks/ab_libraries.py .gpu/n/libdash_attn_c.so .gpu/w1/libdash_attn_c.so --rounds 1 --schedules auto,shift,nondeterministic --compare-args "--grid wide --head-dims 256 --seqlens 1024,4096,16384" --out $R/ab_nw1 > $R/ab_nw1.txt 2>&1; echo "ab rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
tail -9 $R/ab_nw1.txt >> $R/log.txt
timeout 150 .gpu/w2/test_sm90 --gtest_filter='*hdim192*:*192*' > $R/test192.txt 2>&1; echo "test192 rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
grep -c "^\[       OK" $R/test192.txt >> $R/log.txt; grep "FAILED\|Failure" $R/test192.txt | head -20 >> $R/log.txt; tail -2 $R/test192.txt >> $R/log.txt
[ $(left) -gt 100 ] && PYTHONPATH=$PWD/python timeout 60 python python/benchmarks/ab_libraries.py .gpu/n/libdash_attn_c.so .gpu/w2/libdash_attn_c.so --rounds 1 --schedules auto,shift,nondeterministic --compare-args "--grid wide --head-dims 192 --seqlens 1024,4096,16384" --out $R/ab_nw2 > $R/ab_nw2.txt 2>&1; echo "ab192 rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
tail -9 $R/ab_nw2.txt >> $R/log.txt
wait
[ $(left) -gt 40 ] && DASH_ATTN_LIBRARY=$PWD/.gpu/w1/libdash_attn_c.so PYTHONPATH=$PWD/python:/tmp/peers/fa3up/hopper timeout 60 python python/benchmarks/compare.py --grid wide --head-dims 256 --seqlens 1024,4096,16384 --impls dash,fa3 --csv $R/compare_wide.csv --markdown $R/compare_wide.md > $R/compare_wide.txt 2>&1; echo "compare rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
grep "Geometric" $R/compare_wide.md >> $R/log.txt
[ $(left) -gt 150 ] && DASH_ATTN_LIBRARY=$PWD/.gpu/w2/libdash_attn_c.so PYTHONPATH=$PWD/python:/tmp/peers/fa3up/hopper timeout 60 python python/benchmarks/compare.py --grid wide --head-dims 192 --seqlens 1024,4096,16384 --impls dash,fa3 --csv $R/compare192.csv --markdown $R/compare192.md > $R/compare192.txt 2>&1; echo "compare192 rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
grep "Geometric" $R/compare192.md >> $R/log.txt
[ $(left) -gt 60 ] && timeout $(( $(left) - 20 )) .gpu/sc/test_sm90 --gtest_filter='*hdim192_fp16*:*hdim256_fp16*:*hdim192_bf16*softcap*:*hdim256_bf16*softcap*:*hdim192*Softcap*:*hdim256*Softcap*' > $R/sc.txt 2>&1; echo "sc rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
grep -c "^\[       OK" $R/sc.txt >> $R/log.txt; grep "FAILED\|Failure" $R/sc.txt | head -20 >> $R/log.txt; tail -2 $R/sc.txt >> $R/log.txt
cat $R/log.txt
cd $OUT && tar czf r.tgz r
