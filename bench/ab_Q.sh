# run Q (2026-12-03): the L2 prefetch A/B on the device, then the CUDA test files (bench/RESULTS.md run Q)
# ran at commit d28b3c9 (inside bench/run_Q.sh): level 2 (the L1) was removed from decode's _prefetch since, so
# '--prefetch 0,1,2' now stops at level 2; the record is bench/results/2026-12-03/tile_ab_prefetch_2026-12-03_Q.log
export WITCERT_DEVICE=cuda
for sh in 8:32768 8:131072 32:32768 32:131072; do
  timeout 90 python3 bench/tile_ab.py --shape $sh --prefetch 0,1,2 --only on 2>&1 | grep -v Warning
done > $OUT/tile_ab_prefetch.log 2>&1
timeout 80 python3 bench/tile_ab.py --shape 8:32768 --configs off:64:1:4:80:12,off:64:1:4:0:12:1,off:64:1:4:96:12:1,off:32:1:1:0:24:1,off:32:1:1:0:48:1 2>&1 | grep -v Warning >> $OUT/tile_ab_prefetch.log
timeout 80 python3 bench/tile_ab.py --shape 32:32768 --configs off:64:1:4:80:16,off:64:1:4:0:16:1,off:64:1:4:96:16:1,off:32:1:1:0:16:1,off:32:1:1:0:32:1 2>&1 | grep -v Warning >> $OUT/tile_ab_prefetch.log
timeout 60 python3 bench/tile_ab.py --shape 1:32768 --configs off:128:1:8:0:33,off:128:1:8:0:33:1 2>&1 | grep -v Warning >> $OUT/tile_ab_prefetch.log
cat $OUT/tile_ab_prefetch.log
timeout 280 python3 bench/pytest_shards.py -n 12 tests/kernels/test_kernels_conformance.py tests/kernels/test_kernel_gate.py tests/cache/test_review_store_gate.py tests/kernels/test_kivi2_kernel.py tests/cache/test_graphs.py > $OUT/cuda_tests.log 2>&1
echo "tests rc $?"; tail -16 $OUT/cuda_tests.log; grep -E "^FAILED" $OUT/cuda_tests.log | head
