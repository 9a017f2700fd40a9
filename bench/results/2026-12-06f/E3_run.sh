#!/bin/bash
# run E3 (2026-12-06, twentieth session; E1's lease): the whole test suite on the GPU after E1 / E2 (the excess form on
# by default), 16 shards
source bench/device_suite.sh >/dev/null 2>&1; suite 540 16 tests 2>&1 | tail -15
