#!/bin/bash
# GPU call J (session 16): the dQ writer as a warp adding from registers (.gpu/pw3: d = 128, 192, 256) against
# 299d65c's kernels (.gpu/m1) and the pipelined bulk writer (.gpu/pw): tests, A/B, FA3, Nsight Compute.
set -u
T0=$(date +%s); left() { echo $(( 560 - ($(date +%s) - T0) )); }
R=$OUT/r; mkdir -p $R
(cd .peers && MAX_JOBS=12 PEERS_DIR=/tmp/peers bash build_wide.sh fa3 > $R/fa3_build.txt 2>&1; echo "fa3 build rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt) &
timeout 60 .gpu/pw3/test_sm90 --gtest_filter='Shapes/Sm90Correctness.Backward*hdim256*:Shapes/Sm90Determinism.*hdim256*:HeadDims/Sm90DeterminismControl.*' > $R/test_pw3_first.txt 2>&1; echo "test_pw3_first rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
grep -c "^\[       OK" $R/test_pw3_first.txt >> $R/log.txt; grep "FAILED\|Failure" $R/test_pw3_first.txt | head -10 >> $R/log.txt; tail -1 $R/test_pw3_first.txt >> $R/log.txt
PYTHONPATH=$PWD/python timeout 100 python python/benchmarks/ab_libraries.py .gpu/m1/libdash_attn_c.so .gpu/pw/libdash_attn_c.so .gpu/pw3/libdash_attn_c.so --rounds 1 --schedules auto,shift,nondeterministic --compare-args "--grid wide --head-dims 256 --seqlens 1024,4096,16384" --out $R/ab256 > $R/ab256.txt 2>&1; echo "ab256 rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
grep "geometric" $R/ab256.txt >> $R/log.txt
PYTHONPATH=$PWD/python timeout 120 python python/benchmarks/ab_libraries.py .gpu/m1/libdash_attn_c.so .gpu/pw3/libdash_attn_c.so --rounds 1 --schedules auto,shift,nondeterministic --compare-args "--grid wide --head-dims 128,192 --seqlens 1024,4096,16384" --out $R/ab128_192 > $R/ab128_192.txt 2>&1; echo "ab128_192 rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
tail -16 $R/ab128_192.txt >> $R/log.txt
wait
export PYTHONPATH=$PWD/python:/tmp/peers/fa3up/hopper
[ $(left) -gt 100 ] && DASH_ATTN_LIBRARY=$PWD/.gpu/pw3/libdash_attn_c.so timeout 90 python python/benchmarks/compare.py --grid wide --head-dims 192,256 --seqlens 1024,4096,16384 --impls dash,fa3 --csv $R/compare_pw3.csv --markdown $R/compare_pw3.md > $R/compare_pw3.txt 2>&1; echo "compare rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
grep "Geometric" $R/compare_pw3.md >> $R/log.txt
[ $(left) -gt 70 ] && timeout $(( $(left) - 50 )) .gpu/pw3/test_sm90 --gtest_filter='*hdim256*:*hdim192*:*hdim128*:-Shapes/Sm90Correctness.Backward*hdim256*:Shapes/Sm90Determinism.*hdim256*' > $R/test_pw3_rest.txt 2>&1; echo "test_pw3_rest rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
grep -c "^\[       OK" $R/test_pw3_rest.txt >> $R/log.txt; grep "FAILED\|Failure" $R/test_pw3_rest.txt | head -10 >> $R/log.txt; tail -1 $R/test_pw3_rest.txt >> $R/log.txt
[ $(left) -gt 45 ] && DASH_ATTN_LIBRARY=$PWD/.gpu/pw3/libdash_attn_c.so timeout $(( $(left) - 10 )) bash scripts/ncu_attention.sh backward $R/ncu_pw3 256 4096 full dash-det > $R/ncu_pw3.txt 2>&1; echo "ncu_pw3 rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
rm -f $R/ncu*/*.ncu-rep
cat $R/log.txt
cd $OUT && tar czf r.tgz r
