# I4: where SGLang's metered graph spends the ~11 µs that are not its kernels' time (I3: graph 0.070 ms against 57.9 µs of
# kernels at B 8 / 4K, SGLang's 0.052 against 49.6): each call's captured graph dumped (debug mode) with its node types;
# carry [".whl", ".carry/sg"]
source bench/device_suite.sh > $OUT/setup.log 2>&1
mkdir -p $OUT/dot
timeout 90 python3 bench/sglang_h200.py --sglang-root $PWD/.carry/sg/sglang --kv fp8 --defer-tilt --iters 20 --batches 8 \
  --lens 4096 --pdl none --graph-dump $OUT/dot > $OUT/sg_graph.log 2>&1
echo "sg graph rc $?"; grep -E "^\| fp8|#   graph|Error" $OUT/sg_graph.log | cut -c1-600
for f in $OUT/dot/*.dot; do echo "== $f"; grep -oE 'label="[^"]{0,160}' $f | head -12 | cut -c1-170; done
