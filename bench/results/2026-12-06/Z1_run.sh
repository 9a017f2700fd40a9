#!/bin/bash
# run Z1 (2026-12-06, fourteenth session), one call: the fp8 SGLang table A/B/C — A the session's base tree (3aa5c7d,
# carried as .carry/base), B this tree (the merge writes SGLang's o / attn_lse itself), C B with the one-warp metered
# tile for fp8_e4m3 — then the merge's record without its tilt by warps (deferred too), and the whole decode call
ROOT=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
nvidia-smi -L; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
SG="--sglang-root $ROOT/.carry/sg/sglang"
ARGS="--batches 1,8,32 --lens 4096,32768 --kv fp8 --defer-tilt"
(cd .carry/base && PYTHONPATH=$ROOT/.carry/base:/tmp/site:$ROOT/.carry/sg timeout 150 python3 bench/sglang_h200.py $SG $ARGS) > $OUT/sg_a.log 2>&1; echo "rc $?" >> $OUT/sg_a.log
export PYTHONPATH=$ROOT:/tmp/site:$ROOT/.carry/sg
timeout 150 python3 bench/sglang_h200.py $SG $ARGS > $OUT/sg_b.log 2>&1; echo "rc $?" >> $OUT/sg_b.log
timeout 150 python3 bench/sglang_h200.py $SG $ARGS --one-warp fp8_e4m3 > $OUT/sg_c.log 2>&1; echo "rc $?" >> $OUT/sg_c.log
for f in sg_a sg_b sg_c; do echo "== $f"; grep -E "^\| fp8|^rc|^# one|Error|error" $OUT/$f.log | cut -c1-110; done
timeout 90 python3 bench/tilt_cost.py --shapes 1:32768,8:32768,32:32768 --chunks 16 --warps 1,4 --out $OUT > $OUT/tilt_cost.log 2>&1
echo "tilt rc $?" >> $OUT/tilt_cost.log; grep -oE '"(B|plan_warps|merge_off_us|record_no_tilt[a-z0-9_]*|deferred_[a-z0-9_]*)": [0-9.]+' $OUT/tilt_cost.log | tr '\n' ' '; tail -2 $OUT/tilt_cost.log | cut -c1-300
timeout 120 python3 bench/decode.py --heads 32 --batches 1,8 > $OUT/decode.log 2>&1; echo "rc $?" >> $OUT/decode.log
grep -E "^\||rc" $OUT/decode.log | cut -c1-200 | tail -12
