# J1: is the metered SGLang graph's 12-16 µs beyond its kernels (I3) the deferred records' allocation captured in the
# graph? The graph column's capture was the first of its batch size, so TiltBatch.allocate ran inside it and its seven
# fills replay every time (the --kernels / --graph-dump captures came after, with the records already sized). The
# adapter now sizes them in SGLang's capture-mode warm-up; the benchmark emulates that flag (--capture-mode on) or not
# (off: as runs before J1). carry [".whl", ".carry/sg"]
source bench/device_suite.sh > $OUT/setup.log 2>&1
mkdir -p $OUT/dot
SG="python3 bench/sglang_h200.py --sglang-root $PWD/.carry/sg/sglang --kv fp8 --defer-tilt --iters 20"
timeout 150 $SG --batches 8 --lens 4096,32768 --pdl none --kernels --capture-mode off,on --graph-dump $OUT/dot \
  > $OUT/sg_capture_mode.log 2>&1
echo "sg capture-mode rc $?"; grep -E "^\| fp8|^# SGLang capture|#   (metered|SGLang|off): |#   graph" $OUT/sg_capture_mode.log | cut -c1-200
for f in $OUT/dot/*.dot; do echo "== $f"; grep -oE 'label="[^"]{0,100}' $f | sort | uniq -c | sort -rn | head -8 | cut -c1-120; done
# the table (PDL as shipped), with and without the KV hint
timeout 150 $SG --batches 1,8 --lens 4096,32768 --evict=-:-,evict_first:- > $OUT/sg_table.log 2>&1
echo "sg table rc $?"; grep -E "^\| fp8|^# L2" $OUT/sg_table.log | cut -c1-200
# the GPU tests of the adapter's captured path
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/integrations/test_sglang_graphs.py > $OUT/gpu_tests.log 2>&1
echo "tests rc $?"; tail -3 $OUT/gpu_tests.log | cut -c1-300
# then what I3 cut: the paged int8 call with and without KV evict_first
for e in -:- evict_first:-; do
  timeout 100 python3 bench/decode.py --batches 1,8 --lengths 32768 --heads 32 --evict=$e > $OUT/decode_${e//[:-]/_}.log 2>&1
  echo "decode $e rc $?"; grep -vE "^# (memory|Hkv|whole)" $OUT/decode_${e//[:-]/_}.log | cut -c1-220 | tail -6
done
# the 4-warp metered fp8 tile with the L2 prefetch (cut from I3 and I4)
timeout 90 $SG --batches 8 --lens 4096,32768 --metered-tile 128:4:168:1 --evict=-:-,evict_first:- > $OUT/sg_prefetch.log 2>&1
echo "sg prefetch rc $?"; grep -E "^\| fp8|^# (L2|metered 8-bit)" $OUT/sg_prefetch.log | cut -c1-190
