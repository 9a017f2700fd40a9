# run R4 (2026-12-03), one device call at the final code of this run (choose_splits' small-grid rule for both
# calls): the decode table and the CUDA test files
export WITCERT_DEVICE=cuda
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/env.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/env.txt
git log --oneline -1 >> $OUT/env.txt 2>/dev/null
timeout 280 python3 bench/decode.py > $OUT/results.log 2>&1; echo "decode.py rc $?"
sed -n 4,16p $OUT/results.log
timeout 200 python3 bench/pytest_shards.py -n 14 tests/kernels/test_kernels_conformance.py tests/kernels/test_kernel_gate.py tests/cache/test_review_store_gate.py tests/kernels/test_kivi2_kernel.py tests/cache/test_graphs.py > $OUT/cuda_tests.log 2>&1
echo "tests rc $?"; tail -3 $OUT/cuda_tests.log; grep -E "^FAILED" $OUT/cuda_tests.log | head
