# run R2 (2026-12-03), one device call after choose_splits' small-grid one-warp rule (the commit before this
# script's): the decode table, B 2 / B 4 against the old rule's split counts (4-warp tiles), the CUDA test files
export WITCERT_DEVICE=cuda
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/env.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/env.txt
timeout 280 python3 bench/decode.py > $OUT/results.log 2>&1; echo "decode.py rc $?"
tail -16 $OUT/results.log
(timeout 60 python3 bench/b1_probe.py --batch 2 --heads 32 --lengths 32768,131072 --splits 24
 timeout 60 python3 bench/b1_probe.py --batch 4 --heads 32 --lengths 8192,32768 --splits 12) > $OUT/b24_probe.log 2>&1
cat $OUT/b24_probe.log
timeout 180 python3 bench/pytest_shards.py -n 14 tests/kernels/test_kernels_conformance.py tests/kernels/test_kernel_gate.py tests/cache/test_review_store_gate.py tests/kernels/test_kivi2_kernel.py tests/cache/test_graphs.py > $OUT/cuda_tests.log 2>&1
echo "tests rc $?"; tail -3 $OUT/cuda_tests.log; grep -E "^FAILED" $OUT/cuda_tests.log | head
