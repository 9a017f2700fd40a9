# run Q (2026-12-03), one device call: the decode table, the CUDA test files, then the prefetch A/B
export WITCERT_DEVICE=cuda
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/env.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/env.txt
timeout 300 python3 bench/decode.py > $OUT/results.log 2>&1; echo "decode.py rc $?"
tail -30 $OUT/results.log
timeout 150 python3 bench/pytest_shards.py -n 14 tests/kernels/test_kernels_conformance.py tests/kernels/test_kernel_gate.py tests/cache/test_review_store_gate.py tests/kernels/test_kivi2_kernel.py tests/cache/test_graphs.py > $OUT/cuda_tests.log 2>&1
echo "tests rc $?"; tail -3 $OUT/cuda_tests.log; grep -E "^FAILED" $OUT/cuda_tests.log | head
export OUT; sed -n "/^for sh/,\$p" bench/ab_Q.sh | grep -v "pytest_shards\|tests rc\|^cat" > /tmp/ab.sh; timeout 170 bash /tmp/ab.sh; cat $OUT/tile_ab_prefetch.log
