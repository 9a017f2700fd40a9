# run S (2026-12-04): the tightness work (issue 33) on the H200: the CUDA tests of the sketch radius and the
# exact window, the conformance / gate / graphs files, and the speed of the sketch radius side by side
export WITCERT_DEVICE=cuda PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/env.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/env.txt
timeout 330 python3 bench/sketch_speed.py > $OUT/sketch_speed.log 2>&1; echo "sketch_speed rc $?"
cat $OUT/sketch_speed.log
timeout 220 python3 bench/pytest_shards.py -n 14 tests/kernels/test_sketch_window.py tests/kernels/test_kernels_conformance.py tests/kernels/test_kernel_gate.py tests/cache/test_graphs.py > $OUT/cuda_tests.log 2>&1
echo "tests rc $?"; tail -3 $OUT/cuda_tests.log; grep -E "^FAILED|Error" $OUT/cuda_tests.log | head -20
