#!/bin/bash
# GPU call I (session 16): the pipelined dQ writer (.gpu/pw: d = 256 only; .gpu/pw2: with a bulk group per
# warpgroup, d = 192 and 256) against 299d65c's kernels (.gpu/m1): tests, A/B, FA3, Nsight Compute.
set -u
T0=$(date +%s); left() { echo $(( 580 - ($(date +%s) - T0) )); }
R=$OUT/r; mkdir -p $R
(cd .peers && MAX_JOBS=12 PEERS_DIR=/tmp/peers bash build_wide.sh fa3 > $R/fa3_build.txt 2>&1; echo "fa3 build rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt) &
timeout 190 .gpu/pw2/test_sm90 --gtest_filter='*hdim256*:*256*:*hdim192*:*192*' > $R/test_pw2.txt 2>&1; echo "test_pw2 rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
grep -c "^\[       OK" $R/test_pw2.txt >> $R/log.txt; grep "FAILED\|Failure" $R/test_pw2.txt | head -20 >> $R/log.txt; tail -2 $R/test_pw2.txt >> $R/log.txt
PYTHONPATH=$PWD/python timeout 100 python python/benchmarks/ab_libraries.py .gpu/m1/libdash_attn_c.so .gpu/pw/libdash_attn_c.so .gpu/pw2/libdash_attn_c.so --rounds 1 --schedules auto,shift,nondeterministic --compare-args "--grid wide --head-dims 256 --seqlens 1024,4096,16384" --out $R/ab256 > $R/ab256.txt 2>&1; echo "ab256 rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
tail -14 $R/ab256.txt >> $R/log.txt
PYTHONPATH=$PWD/python timeout 80 python python/benchmarks/ab_libraries.py .gpu/m1/libdash_attn_c.so .gpu/pw2/libdash_attn_c.so --rounds 1 --schedules auto,shift,nondeterministic --compare-args "--grid wide --head-dims 192 --seqlens 1024,4096,16384" --out $R/ab192 > $R/ab192.txt 2>&1; echo "ab192 rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
tail -9 $R/ab192.txt >> $R/log.txt
wait
export PYTHONPATH=$PWD/python:/tmp/peers/fa3up/hopper
[ $(left) -gt 100 ] && DASH_ATTN_LIBRARY=$PWD/.gpu/pw2/libdash_attn_c.so timeout 90 python python/benchmarks/compare.py --grid wide --head-dims 192,256 --seqlens 1024,4096,16384 --impls dash,fa3 --csv $R/compare_pw2.csv --markdown $R/compare_pw2.md > $R/compare_pw2.txt 2>&1; echo "compare rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
grep "Geometric" $R/compare_pw2.md >> $R/log.txt
[ $(left) -gt 90 ] && DASH_ATTN_LIBRARY=$PWD/.gpu/pw2/libdash_attn_c.so timeout $(( $(left) - 50 )) bash scripts/ncu_attention.sh backward $R/ncu_pw2 256 4096 full dash-det dash-nondet > $R/ncu_pw2.txt 2>&1; echo "ncu_pw2 rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
[ $(left) -gt 60 ] && DASH_ATTN_LIBRARY=$PWD/.gpu/m1/libdash_attn_c.so timeout $(( $(left) - 20 )) bash scripts/ncu_attention.sh backward $R/ncu_m1 256 4096 full dash-nondet > $R/ncu_m1.txt 2>&1; echo "ncu_m1 rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
rm -f $R/ncu*/*.ncu-rep
cat $R/log.txt
cd $OUT && tar czf r.tgz r
