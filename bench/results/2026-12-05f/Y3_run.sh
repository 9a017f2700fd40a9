#!/bin/bash
# run Y3 (2026-12-05f): compute-sanitizer memcheck of scheme none's 8-column tiles (paged and SGLang's layout)
ROOT=$PWD
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT
mkdir -p $OUT/cs
python3 bench/crash_probe.py --list | grep -E "^csr-|^small-none-m[01]-p[48]-s2|^(mid|big)-none" | timeout 420 xargs -P 10 -I{} sh -c \
  'WITCERT_DEVICE=cuda timeout 300 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --print-limit 2 python3 bench/crash_probe.py {} > "$0/cs/{}.txt" 2>&1' "$OUT"
for f in $OUT/cs/*.txt; do echo "$(basename "$f" .txt) $(grep -h 'ERROR SUMMARY' "$f") $(grep -h '^ok' "$f")"; done | tee $OUT/probe.txt
