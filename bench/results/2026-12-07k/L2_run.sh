# L2 (next session, after L1; an H200 if one comes, else an H100: say which): issue 35's kernel table with the new
# defaults (KV evict_first, the grid's one reduction), FlashInfer 0.2.5's fp8 decode beside it in the same lease (JIT-built
# from its sdist, tensor cores only, as run A1), and issue 33's sketch + window against the group radius.
# carry [".whl", ".carry/sg", ".carry/fi"] (.carry/fi: flashinfer_python-0.2.5.tar.gz and a ninja wheel from PyPI)
source bench/device_suite.sh > $OUT/setup.log 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader
timeout 170 python3 bench/decode.py --heads 32 --batches 1,8,32 > $OUT/decode.log 2>&1; echo "rc $?" >> $OUT/decode.log
tail -9 $OUT/decode.log | cut -c1-260
timeout 150 python3 bench/sketch_speed.py --lean --batches 1,8,32 --lengths 32768,131072 > $OUT/sketch.log 2>&1
echo "rc $?" >> $OUT/sketch.log; tail -10 $OUT/sketch.log | cut -c1-400
flashinfer_env || exit 0
timeout 200 python3 bench/flashinfer_decode.py --batches 1,8,32 --lengths 32768,131072 --tensor-cores 1 > $OUT/fi_decode.log 2>&1
echo "rc $?" >> $OUT/fi_decode.log; tail -12 $OUT/fi_decode.log | cut -c1-260
