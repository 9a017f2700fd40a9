#!/bin/bash
# run C6 (2026-12-06, eighteenth session): the whole suite on the GPU after the decode self-check took the caller's
# launch shape and the decode kernel stopped specializing seed / layer; then the check's one-time cost again
# (this call ran these steps inline; they are bench/device_suite.sh's)
source bench/device_suite.sh
suite 400 15 tests
timeout 100 python3 bench/results/2026-12-06d/decode_selftest_cost.py > $OUT/cost.jsonl 2> $OUT/cost.err; echo "cost rc $?"
cat $OUT/cost.jsonl; tail -3 $OUT/cost.err
