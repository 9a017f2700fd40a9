#!/bin/bash
# run Y11 (2026-12-05g): the tilt grid's cost, coarse only against the production grid (bench/tilt_cost.py)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi -L
timeout 150 python3 bench/tilt_cost.py --shapes 1:32768,8:32768,32:32768 --chunks 16 --warps 4 --grids 64:0:32,64:4:32,64:8:32 \
  --out $OUT > $OUT/tilt_cost.log 2>&1
echo "tilt rc $?" >> $OUT/tilt_cost.log; cut -c1-900 $OUT/tilt_cost.log
# Y11's second call (the same lease): the whole CUDA subset, docs/testing.md's device command with `timeout 280`
#   (.whl installed into /tmp/site, PYTHONPATH=$PWD:/tmp/site:$PWD/.carry/sg) > $OUT/subset.log
