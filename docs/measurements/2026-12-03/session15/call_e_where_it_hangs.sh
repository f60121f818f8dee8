#!/bin/bash
# GPU call E (session 15): where the WIP dQ column-block hand-off hangs.
set -u
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
F='Shapes/Sm90Correctness.BackwardMatchesReferenceForEverySchedule/hdim256_bf16_B2_Sq256_Sk256_Hq4_Hkv4_full'
timeout 60 .gpu/dbg/test_sm90 --gtest_filter="$F" > $R/dbg.txt 2>&1; echo "dbg rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
DASH_WAIT_TIMEOUT_SECONDS=1 timeout 40 .gpu/r/test_sm90 --gtest_filter="$F" > $R/r.txt 2>&1; echo "r rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
timeout 40 .gpu/v1/test_sm90 --gtest_filter="$F:*hdim256_bf16*" > $R/v1.txt 2>&1; echo "v1 rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
grep -c "^\[       OK" $R/v1.txt >> $R/log.txt
grep -m5 "dash:" $R/dbg.txt >> $R/log.txt; tail -5 $R/dbg.txt >> $R/log.txt
tail -5 $R/r.txt >> $R/log.txt; tail -5 $R/v1.txt >> $R/log.txt
cat $R/log.txt
