#!/bin/bash
# run D4 (2026-12-06, nineteenth session): the whole suite on the GPU on this session's final code (the grid sketch box
# on the reference path, the box rows' saturation of bad masses)
source bench/device_suite.sh
suite 420 15 tests
