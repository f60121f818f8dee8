#!/bin/bash
# GPU call N (session 17): main's kernels with the dQ writer's stage release folded (.gpu/s17: d = 256, bf16 and fp16,
# softcap kernels): the softcap determinism cases at d = 256 not reached in session 16, every other d = 256 test, A/B
# against ad4a8fe (.gpu/pw).
set -u
T0=$(date +%s); left() { echo $(( 430 - ($(date +%s) - T0) )); }
R=$OUT/r; mkdir -p $R
timeout 200 .gpu/s17/test_sm90 --gtest_filter='Cases/Sm90VariantDeterminism.*hdim256*' > $R/test_variant_determinism_256.txt 2>&1; echo "variant determinism rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
grep -c "^\[       OK" $R/test_variant_determinism_256.txt >> $R/log.txt; grep "FAILED\|Failure\|SKIPPED \]" $R/test_variant_determinism_256.txt | head -10 >> $R/log.txt; tail -1 $R/test_variant_determinism_256.txt >> $R/log.txt
PYTHONPATH=$PWD/python timeout 50 python python/benchmarks/ab_libraries.py .gpu/pw/libdash_attn_c.so .gpu/s17/libdash_attn_c.so --rounds 1 --schedules auto,shift,nondeterministic --compare-args "--grid wide --head-dims 256 --seqlens 1024,4096,16384" --out $R/ab256 > $R/ab256.txt 2>&1; echo "ab256 rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
grep "geometric" $R/ab256.txt >> $R/log.txt
[ $(left) -gt 30 ] && timeout $(( $(left) - 10 )) .gpu/s17/test_sm90 --gtest_filter='*hdim256*:HeadDims/Sm90DeterminismControl.*:Sm90VariantDeterminismControl.*:-Cases/Sm90VariantDeterminism.*' > $R/test_256.txt 2>&1; echo "test_256 rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
grep -c "^\[       OK" $R/test_256.txt >> $R/log.txt; grep "FAILED\|Failure" $R/test_256.txt | head -10 >> $R/log.txt; tail -1 $R/test_256.txt >> $R/log.txt
cat $R/log.txt
cd $OUT && tar czf r.tgz r
