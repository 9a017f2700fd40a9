#!/bin/bash
# run P1 (2026-12-07, twenty-fifth session): programmatic dependent launch (kernels.pdl) on the GPU: its test (the
# decode call with PDL on no / the merge's / both launches, bit for bit, eager and graph-replayed) and the window tests
# (kernels.interpret.f32's subnormal case), then the whole call side by side (bench/pdl_ab.py, one process, interleaved
# rounds), then the first canary self-check (the write and decode kernels after f32, against float64)
source bench/device_suite.sh
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_pdl.py tests/kernels/test_window_write.py > $OUT/P1_pdl_test.log 2>&1
echo "test rc $?"; grep -E "^(FAILED|ERROR)" $OUT/P1_pdl_test.log | cut -c1-300; tail -1 $OUT/P1_pdl_test.log | cut -c1-300
timeout 280 python3 bench/pdl_ab.py --rounds 3 --shapes 1:4096,1:32768,8:32768,32:32768 > $OUT/P1_pdl_ab.log 2> $OUT/P1_pdl_ab.err
echo "bench rc $?"; grep -v "^#   rounds" $OUT/P1_pdl_ab.log; tail -5 $OUT/P1_pdl_ab.err | cut -c1-300
selftests "${CANARY_CONFIGS[0]}" 2>&1 | tail -8
