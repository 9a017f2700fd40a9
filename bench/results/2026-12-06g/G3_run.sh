#!/bin/bash
# run G3 (2026-12-06, twenty-first session; G1's lease): the whole test suite on the GPU with the grid, 16 shards
source bench/device_suite.sh >/dev/null 2>&1; suite 300 16 tests 2>&1 | tail -8
