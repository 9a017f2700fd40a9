# run S2 (2026-12-04): after the magic-number sketch conversion, the balanced ring pass and the endpoint tilt:
# the speed table side by side (with two register caps for the sketch), the fused merge alone, the CUDA tests
export WITCERT_DEVICE=cuda PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/env.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/env.txt
timeout 300 python3 bench/sketch_speed.py --caps 200,232 > $OUT/sketch_speed.log 2>&1; echo "sketch_speed rc $?"
cat $OUT/sketch_speed.log
timeout 60 python3 bench/merge_probe.py --shapes 1:32768,8:32768 > $OUT/merge_probe.log 2>&1; echo "merge_probe rc $?"
head -20 $OUT/merge_probe.log
timeout 200 python3 bench/pytest_shards.py -n 14 tests/test_sketch_window.py tests/test_kernels_conformance.py tests/test_kernel_gate.py tests/test_graphs.py tests/test_fp_edges.py > $OUT/cuda_tests.log 2>&1
echo "tests rc $?"; tail -3 $OUT/cuda_tests.log; grep -E "^FAILED|Error" $OUT/cuda_tests.log | head -20
