#!/bin/bash
# run B9 (2026-12-06, seventeenth session): scaled_norm keeps a NaN (max with NaN propagation) and the fp8 saturation
# test writes a NaN (B8 found its witness finite on the GPU): the whole suite on the GPU
# (this call ran these steps inline, with failures cut at 200 characters; they are bench/device_suite.sh's)
source bench/device_suite.sh
suite 330 15 tests
