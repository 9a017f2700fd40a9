# run R5 (2026-12-03): the CUDA test files at the final code of run R (choose_splits' wave floor and page
# bound, the gate re-decode's whole-batch tile: decode(tile=))
export WITCERT_DEVICE=cuda
timeout 200 python3 bench/pytest_shards.py -n 14 tests/kernels/test_kernels_conformance.py tests/kernels/test_kernel_gate.py tests/cache/test_review_store_gate.py tests/kernels/test_kivi2_kernel.py tests/cache/test_graphs.py > $OUT/cuda_tests.log 2>&1
echo "tests rc $?"; tail -3 $OUT/cuda_tests.log; grep -E "^FAILED" $OUT/cuda_tests.log | head
grep -E "keeps_the_whole_batch_tile|many_splits" $OUT/cuda_tests.log | head
