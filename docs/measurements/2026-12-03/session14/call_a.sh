#!/bin/bash
# GPU call A (session 14): the d = 256 key split (.gpu/n, c944c01's kernels): hd256 tests, A/B against the
# previous library (.gpu/f, 7976f5f: the head_dim split), FA3 at 192 and 256, then the whole GPU suite.
set -u
T0=$(date +%s); left() { echo $(( 585 - ($(date +%s) - T0) )); }
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $R/gpu.txt 2>&1
(cd .peers && MAX_JOBS=12 PEERS_DIR=/tmp/peers bash build_wide.sh fa3 > $R/fa3_build.txt 2>&1; echo "fa3 build rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt) &
timeout 150 .gpu/n/test_sm90 --gtest_filter='*hdim256*:*256*' > $R/test256.txt 2>&1; echo "test256 rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
grep -c "^\[       OK" $R/test256.txt >> $R/log.txt; grep "FAILED\|Failure" $R/test256.txt | head -20 >> $R/log.txt; tail -3 $R/test256.txt >> $R/log.txt
[ $(left) -gt 200 ] && PYTHONPATH=$PWD/python timeout 60 python python/benchmarks/ab_libraries.py .gpu/f/libdash_attn_c.so .gpu/n/libdash_attn_c.so --rounds 1 --schedules auto,shift,nondeterministic --compare-args "--grid wide --head-dims 256 --seqlens 1024,4096,16384" --out $R/ab256 > $R/ab256.txt 2>&1; echo "ab rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
tail -10 $R/ab256.txt >> $R/log.txt
wait
[ $(left) -gt 60 ] && DASH_ATTN_LIBRARY=$PWD/.gpu/n/libdash_attn_c.so PYTHONPATH=$PWD/python:/tmp/peers/fa3up/hopper timeout 80 python python/benchmarks/compare.py --grid wide --head-dims 192,256 --seqlens 1024,4096,16384 --impls dash,fa3 --csv $R/compare_wide.csv --markdown $R/compare_wide.md > $R/compare_wide.txt 2>&1; echo "compare rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
[ $(left) -gt 40 ] && timeout $(( $(left) - 15 )) .gpu/n/test_sm90 --gtest_filter='-*hdim256*:*256*' > $R/test_rest.txt 2>&1; echo "test rest rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
grep -c "^\[       OK" $R/test_rest.txt >> $R/log.txt; grep "FAILED\|Failure" $R/test_rest.txt | head -20 >> $R/log.txt; tail -3 $R/test_rest.txt >> $R/log.txt
cat $R/log.txt
cd $OUT && tar czf r.tgz r
