#!/bin/bash
# GPU call K (session 16): the pipelined bulk dQ writer (.gpu/pw, main's kernels at d = 256): every d = 256 test.
set -u
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
timeout 200 .gpu/pw/test_sm90 --gtest_filter='*hdim256*:*256*' > $R/test_pw.txt 2>&1; echo "test_pw rc=$? at $(( $(date +%s) - T0 )) s" >> $R/log.txt
grep -c "^\[       OK" $R/test_pw.txt >> $R/log.txt; grep "FAILED\|Failure" $R/test_pw.txt | head -20 >> $R/log.txt; tail -3 $R/test_pw.txt >> $R/log.txt
cat $R/log.txt
cd $OUT && tar czf r.tgz r
