# run R (2026-12-03), one device call: the CUDA test files after the page-offset helpers (commit 915a456's
# kernel); B 1 metered in one-warp programs on a full wave (bench/b1_probe.py); an A/B of 16-token one-warp
# metered tiles (sm_90 offline: 200 registers uncapped, 1141 SASS per tile = 71 per token against the 32-token
# tile's 50; under a cap of 128, 136 B spilled, sixteen programs per SM)
export WITCERT_DEVICE=cuda
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/env.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/env.txt
timeout 180 python3 bench/pytest_shards.py -n 14 tests/kernels/test_kernels_conformance.py tests/kernels/test_kernel_gate.py tests/cache/test_review_store_gate.py tests/kernels/test_kivi2_kernel.py tests/cache/test_graphs.py > $OUT/cuda_tests.log 2>&1
echo "tests rc $?"; tail -3 $OUT/cuda_tests.log; grep -E "^FAILED" $OUT/cuda_tests.log | head
timeout 180 python3 bench/b1_probe.py --splits 96,128,192 > $OUT/b1_probe.log 2>&1; echo "b1 rc $?"; cat $OUT/b1_probe.log
C=on:32:1:1:168:0:1,on:16:1:1:128:32:1,on:16:1:1:128:48:1,on:16:1:1:0:48:1
for sh in 8:32768 32:32768; do timeout 90 python3 bench/tile_ab.py --shape $sh --configs $C; done > $OUT/tile_ab_16.log 2>&1
cat $OUT/tile_ab_16.log
