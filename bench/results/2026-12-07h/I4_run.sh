# I4 (written, not run this session: no device time left). Where SGLang's metered graph spends the ~11 µs that are
# not its kernels' time (I3: graph 0.070 ms against 57.9 µs of kernels at B 8 / 4K, SGLang's 0.052 against 49.6): each
# call's captured graph dumped (debug mode) with its node types; carry [".whl", ".carry/sg"]
source bench/device_suite.sh > $OUT/setup.log 2>&1
mkdir -p $OUT/dot
timeout 90 python3 bench/sglang_h200.py --sglang-root $PWD/.carry/sg/sglang --kv fp8 --defer-tilt --iters 20 --batches 8 \
  --lens 4096 --pdl none --graph-dump $OUT/dot > $OUT/sg_graph.log 2>&1
echo "sg graph rc $?"; grep -E "^\| fp8|#   graph|Error" $OUT/sg_graph.log | cut -c1-600
for f in $OUT/dot/*.dot; do echo "== $f"; grep -oE 'label="[^"]{0,160}' $f | head -12 | cut -c1-170; done
# then what I3 cut for time: the paged int8 call with and without KV evict_first (caches rotated past the L2, and 32
# graphed layers of the default kernel), and the 4-warp metered fp8 tile with the L2 prefetch
for e in -:- evict_first:-; do
  timeout 120 python3 bench/decode.py --batches 1,8 --lengths 32768 --heads 32 --evict=$e > $OUT/decode_${e//[:-]/_}.log 2>&1
  echo "decode $e rc $?"; grep -vE "^# (memory|Hkv|whole)" $OUT/decode_${e//[:-]/_}.log | cut -c1-220 | tail -6
  timeout 150 python3 bench/tilt_batch_probe.py --configs default --batches 1,8 --lens 4096 --layers 32 --taus -1 \
    --evict=$e > $OUT/probe_${e//[:-]/_}.log 2>&1
  echo "probe $e rc $?"; grep -E "^\| default|^# L2" $OUT/probe_${e//[:-]/_}.log | cut -c1-220
done
timeout 90 python3 bench/sglang_h200.py --sglang-root $PWD/.carry/sg/sglang --kv fp8 --defer-tilt --iters 20 --batches 8 \
  --lens 4096,32768 --metered-tile 128:4:168:1 --evict=evict_first:- > $OUT/sg_prefetch.log 2>&1
echo "sg prefetch rc $?"; grep -E "^\| fp8|^# (L2|metered 8-bit)" $OUT/sg_prefetch.log | cut -c1-190
