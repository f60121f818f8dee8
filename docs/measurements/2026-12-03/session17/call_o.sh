#!/bin/bash
# GPU call O (session 17): the backward's shared job loop (run_jobs; .gpu/jl: d = 64, 128, 256, bf16): backward tests
# at those head dims, then A/B against 299d65c (.gpu/m1) at d = 128.
set -u
T0=$(date +%s); left() { echo $(( 240 - ($(date +%s) - T0) )); }
R=$OUT/r; mkdir -p $R
timeout 40 .gpu/jl/test_sm90 --gtest_filter='Shapes/Sm90Correctness.BackwardMatchesReferenceForEverySchedule/hdim128_bf16_B2_Sq256_Sk256_Hq4_Hkv4_*' > $R/first.txt 2>&1
rc=$?; echo "first rc=$rc at $(( $(date +%s) - T0 )) s" >> $R/log.txt
[ $rc = 124 ] && { cat $R/log.txt; cd $OUT && tar czf r.tgz r; exit 0; }
timeout 120 .gpu/jl/test_sm90 --gtest_filter='Shapes/Sm90Correctness.Backward*:Shapes/Sm90Determinism.*:HeadDims/Sm90DeterminismControl.*:Cases/Sm90Variant.Backward*:Remainders/Sm90RaggedSweep.*' > $R/test_jl.txt 2>&1; echo "test_jl rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
grep -c "^\[       OK" $R/test_jl.txt >> $R/log.txt; grep "FAILED\|Failure" $R/test_jl.txt | head -10 >> $R/log.txt; tail -1 $R/test_jl.txt >> $R/log.txt
[ $(left) -gt 40 ] && PYTHONPATH=$PWD/python timeout $(( $(left) - 5 )) python python/benchmarks/ab_libraries.py .gpu/m1/libdash_attn_c.so .gpu/jl/libdash_attn_c.so --rounds 1 --schedules auto,shift,nondeterministic --compare-args "--grid wide --head-dims 128 --seqlens 1024,4096,16384" --out $R/ab128 > $R/ab128.txt 2>&1; echo "ab128 rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
grep "geometric" $R/ab128.txt >> $R/log.txt
cat $R/log.txt
cd $OUT && tar czf r.tgz r
