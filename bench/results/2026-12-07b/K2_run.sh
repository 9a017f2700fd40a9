#!/bin/bash
# run K2 (2026-12-07, twenty-fourth session; K1's lease): the whole test suite on the GPU with ν / κ as page maxima
source bench/device_suite.sh >/dev/null 2>&1; suite 330 16 tests 2>&1 | tail -12
