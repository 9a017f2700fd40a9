# run S2 (2026-12-04): after the magic-number sketch conversion, the balanced ring pass and the endpoint tilt:
# the speed table side by side (the sketch also at a raised register cap), the CUDA tests of the kernel path
export WITCERT_DEVICE=cuda PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/env.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/env.txt
timeout 240 python3 bench/sketch_speed.py --caps 232 > $OUT/sketch_speed.log 2>&1; echo "sketch_speed rc $?"
cat $OUT/sketch_speed.log
timeout 240 python3 bench/pytest_shards.py -n 15 tests/kernels/test_sketch_window.py tests/kernels/test_kernels_conformance.py tests/kernels/test_kernel_gate.py tests/cache/test_graphs.py tests/bounds/test_fp_edges.py tests/kernels/test_kivi2_kernel.py > $OUT/cuda_tests.log 2>&1
echo "tests rc $?"; tail -3 $OUT/cuda_tests.log; grep -E "^FAILED|Error" $OUT/cuda_tests.log | head -20
