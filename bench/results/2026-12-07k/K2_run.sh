# K2 (2026-12-07): issue 35's kernel table (Llama-8B attention, int8, full meter) with the library's new defaults (KV
# evict_first, the grid's one reduction) and without the KV hint, in one process each, one call. carry [".whl", ".carry/sg"]
source bench/device_suite.sh > $OUT/setup.log 2>&1
for e in "" -:-; do
  timeout 240 python3 bench/decode.py --batches 1,8,32 --lengths 32768,131072 --heads 32 --evict="$e" > $OUT/decode35_${e//[:-]/_}.log 2>&1
  echo "decode '$e' rc $?"; grep -vE "^# (memory|Hkv|whole)" $OUT/decode35_${e//[:-]/_}.log | cut -c1-220 | tail -9
done
