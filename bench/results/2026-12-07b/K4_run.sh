#!/bin/bash
# run K4 (2026-12-07, twenty-fourth session): the graph tests (with the pool's key-levels test) and the window-write
# tests on the GPU; the exact window's write in a prefill, the tiled / masked form against the per-token one it
# replaced (bench/window_write_speed.py, one process); then the metered prefill's time to first token at B 1 / 32K
# against stock eager (bench/prefill_profile.py, this tree)
source bench/device_suite.sh
suite 130 6 tests/cache/test_graphs.py tests/kernels/test_window_write.py
timeout 90 python3 bench/window_write_speed.py 2>&1 | tail -8
timeout 180 python3 bench/prefill_profile.py --batch 1 --tokens 32768 --reps 3 --out $OUT/pp32k 2>&1 | grep -E "TTFT|Error|error" | cut -c1-300
