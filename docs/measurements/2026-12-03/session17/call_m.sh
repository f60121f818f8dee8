#!/bin/bash
# GPU call M (session 17): dK^T in slices interleaved with the dQ column blocks (.gpu/sl: d = 256; .gpu/sl192: d = 192
# with three 32-column blocks, bf16/fp16, softcap and varlen kernels) against 299d65c (.gpu/m1) and ad4a8fe (.gpu/pw):
# hang check, tests, A/B, FA3, Nsight Compute.
set -u
T0=$(date +%s); left() { echo $(( 570 - ($(date +%s) - T0) )); }
R=$OUT/r; mkdir -p $R
(cd .peers && MAX_JOBS=12 PEERS_DIR=/tmp/peers bash build_wide.sh fa3 > $R/fa3_build.txt 2>&1; echo "fa3 build rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt) &
for v in sl:256 sl192:192; do
  d=${v#*:}; b=${v%:*}
  timeout 40 .gpu/$b/test_sm90 --gtest_filter="Shapes/Sm90Correctness.BackwardMatchesReferenceForEverySchedule/hdim${d}_bf16_B2_Sq256_Sk256_Hq4_Hkv4_*" > $R/first_$b.txt 2>&1
  rc=$?; echo "first $b rc=$rc at $(( $(date +%s) - T0 )) s" >> $R/log.txt
  [ $rc = 124 ] && { cat $R/log.txt; cd $OUT && tar czf r.tgz r; exit 0; }
done
timeout 100 .gpu/sl/test_sm90 --gtest_filter='*hdim256*:HeadDims/Sm90DeterminismControl.*' > $R/test_sl.txt 2>&1; echo "test_sl rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
grep -c "^\[       OK" $R/test_sl.txt >> $R/log.txt; grep "FAILED\|Failure" $R/test_sl.txt | head -10 >> $R/log.txt; tail -1 $R/test_sl.txt >> $R/log.txt
timeout 130 .gpu/sl192/test_sm90 --gtest_filter='Shapes/Sm90Correctness.Backward*hdim192*:Shapes/Sm90Determinism.*hdim192*:HeadDims/Sm90DeterminismControl.*:*Varlen*hdim192*:*Softcap*192*' > $R/test_sl192.txt 2>&1; echo "test_sl192 rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
grep -c "^\[       OK" $R/test_sl192.txt >> $R/log.txt; grep "FAILED\|Failure" $R/test_sl192.txt | head -10 >> $R/log.txt; tail -1 $R/test_sl192.txt >> $R/log.txt
PYTHONPATH=$PWD/python timeout 80 python python/benchmarks/ab_libraries.py .gpu/pw/libdash_attn_c.so .gpu/sl/libdash_attn_c.so --rounds 2 --schedules auto,shift,nondeterministic --compare-args "--grid wide --head-dims 256 --seqlens 1024,4096,16384" --out $R/ab256 > $R/ab256.txt 2>&1; echo "ab256 rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
grep "geometric" $R/ab256.txt >> $R/log.txt
PYTHONPATH=$PWD/python timeout 80 python python/benchmarks/ab_libraries.py .gpu/m1/libdash_attn_c.so .gpu/sl192/libdash_attn_c.so --rounds 2 --schedules auto,shift,nondeterministic --compare-args "--grid wide --head-dims 192 --seqlens 1024,4096,16384" --out $R/ab192 > $R/ab192.txt 2>&1; echo "ab192 rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
grep "geometric" $R/ab192.txt >> $R/log.txt
wait
export PYTHONPATH=$PWD/python:/tmp/peers/fa3up/hopper
for v in sl:256 sl192:192; do
  d=${v#*:}; b=${v%:*}
  [ $(left) -gt 80 ] && DASH_ATTN_LIBRARY=$PWD/.gpu/$b/libdash_attn_c.so timeout 60 python python/benchmarks/compare.py --grid wide --head-dims $d --seqlens 1024,4096,16384 --impls dash,fa3 --csv $R/compare_$b.csv --markdown $R/compare_$b.md > $R/compare_$b.txt 2>&1; echo "compare $b rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
  grep "Geometric" $R/compare_$b.md >> $R/log.txt
done
[ $(left) -gt 50 ] && DASH_ATTN_LIBRARY=$PWD/.gpu/sl/libdash_attn_c.so timeout $(( $(left) - 15 )) bash scripts/ncu_attention.sh backward $R/ncu_sl 256 4096 full dash-det > $R/ncu_sl.txt 2>&1; echo "ncu_sl rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
rm -f $R/ncu*/*.ncu-rep
cat $R/log.txt
cd $OUT && tar czf r.tgz r
