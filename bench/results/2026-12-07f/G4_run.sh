# G4 (2026-12-07, twenty-eighth session): two short calls on the warm machine after G3 (each: source bench/device_suite.sh
# first); carry [".whl", ".carry/sg"]
S="python3 bench/sglang_h200.py --sglang-root $PWD/.carry/sg/sglang --kv fp8 --defer-tilt --iters 20 --kernels"
timeout 75 $S --batches 8 --lens 4096 > $OUT/sg_kernels.log 2>&1                 # -> G4_sg_kernels_4k.log
timeout 40 $S --batches 8 --lens 32768 > $OUT/sg_k32.log 2>&1                    # -> G4_sg_kernels_32k.log
timeout 30 $S --batches 8 --lens 4096 --defer-forms 0 > $OUT/sg_k4_f0.log 2>&1   # -> G4_sg_kernels_4k_forms0.log
