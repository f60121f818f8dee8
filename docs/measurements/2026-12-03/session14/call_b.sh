#!/bin/bash
# GPU call B (session 14): the d = 256 key split with dQ's column blocks interleaved with dK^T's tiles (.gpu/m) against
# the key split without (.gpu/n) and the head_dim split (.gpu/f, 7976f5f); hd256 tests; FA3 at 192 and 256; ncu at 256.
set -u
T0=$(date +%s); left() { echo $(( 400 - ($(date +%s) - T0) )); }
R=$OUT/r; mkdir -p $R
(cd .peers && MAX_JOBS=12 PEERS_DIR=/tmp/peers bash build_wide.sh fa3 > $R/fa3_build.txt 2>&1; echo "fa3 build rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt) &
timeout 150 .gpu/m/test_sm90 --gtest_filter='*hdim256*:*256*' > $R/test256.txt 2>&1; echo "test256 rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
grep -c "^\[       OK" $R/test256.txt >> $R/log.txt; grep "FAILED\|Failure" $R/test256.txt | head -20 >> $R/log.txt; tail -2 $R/test256.txt >> $R/log.txt
for pair in "f m" "n m"; do set -- $pair
[ $(left) -gt 200 ] && PYTHONPATH=$PWD/python timeout 60 python python/benchmarks/ab_libraries.py .gpu/$1/libdash_attn_c.so .gpu/$2/libdash_attn_c.so --rounds 1 --schedules auto,shift,nondeterministic --compare-args "--grid wide --head-dims 256 --seqlens 1024,4096,16384" --out $R/ab_$1$2 > $R/ab_$1$2.txt 2>&1; echo "ab $1 $2 rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
tail -9 $R/ab_$1$2.txt >> $R/log.txt
done
wait
[ $(left) -gt 60 ] && DASH_ATTN_LIBRARY=$PWD/.gpu/m/libdash_attn_c.so PYTHONPATH=$PWD/python:/tmp/peers/fa3up/hopper timeout 80 python python/benchmarks/compare.py --grid wide --head-dims 192,256 --seqlens 1024,4096,16384 --impls dash,fa3 --csv $R/compare_wide.csv --markdown $R/compare_wide.md > $R/compare_wide.txt 2>&1; echo "compare rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
grep "Geometric" $R/compare_wide.md >> $R/log.txt
[ $(left) -gt 90 ] && DASH_ATTN_LIBRARY=$PWD/.gpu/m/libdash_attn_c.so PYTHONPATH=$PWD/python:/tmp/peers/fa3up/hopper timeout $(( $(left) - 10 )) bash scripts/ncu_attention.sh backward $R/ncu256 256 4096 full dash-det fa3-nondet > $R/ncu256.txt 2>&1; echo "ncu rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
rm -f $R/ncu256/*.ncu-rep
cat $R/log.txt
cd $OUT && tar czf r.tgz r
