# run R3 (2026-12-03; run on the working tree before its commit, with the test of the old counts failing as expected): choose_splits' small-grid rule for the unmetered call too (int8: one wave of the capped
# 64-token tile at B 1-4), against the old rule's counts (128-token / 8-warp tiles); the metered rule again at B 1
export WITCERT_DEVICE=cuda
for a in "1 32768,131072 33" "2 32768,131072 17" "4 8192,32768 16"; do set -- $a
  timeout 90 python3 bench/b1_probe.py --off --batch $1 --heads 32 --lengths $2 --splits $3; done > $OUT/off_probe.log 2>&1
cat $OUT/off_probe.log
timeout 120 python3 bench/pytest_shards.py -n 14 tests/kernels/test_kernels_conformance.py > $OUT/cuda_tests.log 2>&1
echo "tests rc $?"; tail -2 $OUT/cuda_tests.log; grep -E "^FAILED" $OUT/cuda_tests.log | head
