#!/bin/bash
# GPU call H (session 16): tests of 299d65c's kernels not yet run (varlen determinism, sm_margin, softcap backward at
# 192/256), then Nsight Compute of the d = 256 and d = 192 backward against FA3.
set -u
T0=$(date +%s); left() { echo $(( 580 - ($(date +%s) - T0) )); }
R=$OUT/r; mkdir -p $R
(cd .peers && MAX_JOBS=12 PEERS_DIR=/tmp/peers bash build_wide.sh fa3 > $R/fa3_build.txt 2>&1; echo "fa3 build rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt) &
timeout 170 .gpu/m1/test_sm90 --gtest_filter='Cases/Sm90VarlenDeterminism*:Sm90VarlenDeterminismControl*:Shapes/SmMargin*' > $R/m1_rest.txt 2>&1; echo "m1_rest rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
grep -c "^\[       OK" $R/m1_rest.txt >> $R/log.txt; grep "FAILED\|Failure" $R/m1_rest.txt | head -20 >> $R/log.txt; tail -2 $R/m1_rest.txt >> $R/log.txt
timeout 130 .gpu/sc/test_sm90 --gtest_filter='Cases/Sm90Variant*hdim192*softcap*:Cases/Sm90Variant*hdim256*softcap*:Cases/Sm90Varlen*hdim192*softcap*:Cases/Sm90Varlen*hdim256*softcap*' > $R/sc_bwd.txt 2>&1; echo "sc_bwd rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
grep -c "^\[       OK" $R/sc_bwd.txt >> $R/log.txt; grep "FAILED\|Failure" $R/sc_bwd.txt | head -20 >> $R/log.txt; tail -2 $R/sc_bwd.txt >> $R/log.txt
wait
export DASH_ATTN_LIBRARY=$PWD/.gpu/m1/libdash_attn_c.so PYTHONPATH=$PWD/python:/tmp/peers/fa3up/hopper
[ $(left) -gt 90 ] && timeout $(( $(left) - 60 )) bash scripts/ncu_attention.sh backward $R/ncu256 256 4096 full dash-det fa3-nondet > $R/ncu256.txt 2>&1; echo "ncu256 rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
[ $(left) -gt 90 ] && timeout $(( $(left) - 30 )) bash scripts/ncu_attention.sh backward $R/ncu192 192 4096 full dash-det fa3-det > $R/ncu192.txt 2>&1; echo "ncu192 rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
rm -f $R/ncu*/*.ncu-rep
cat $R/log.txt
cd $OUT && tar czf r.tgz r
