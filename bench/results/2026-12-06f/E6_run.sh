#!/bin/bash
# run E6 (2026-12-06, twentieth session; E4's lease): the whole test suite on the GPU with the excess form as
# e^{2Ξ} max(Â, B̂), 16 shards
source bench/device_suite.sh >/dev/null 2>&1; suite 300 16 tests 2>&1 | tail -8
