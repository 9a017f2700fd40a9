#!/bin/bash
# run D1 (2026-12-06, nineteenth session): the last session's tree after its run C7 had not run on a GPU (the copies'
# Tier B comparison, the one-page canary, the mask-stride key, `witcert selftest`): the CLI on three serving
# configurations, then the whole suite
source bench/device_suite.sh
# (ran an inline form of this loop that printed the JSON itself)
selftests "--scheme int8,fp8_e4m3,kivi2 --head-dim 128 --kv-heads 8 --q-heads 32 --batch 8 --context 32768" \
  "--scheme int8,int4_group --head-dim 64 --kv-heads 3 --q-heads 9 --batch 1 --context 4096" \
  "--scheme int8_dither,fp8_e5m2 --head-dim 128 --kv-heads 8 --q-heads 32 --batch 3 --context 8192 --window 0,0"
suite 420 15 tests
