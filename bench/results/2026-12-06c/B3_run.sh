#!/bin/bash
# run B3 (2026-12-06, seventeenth session): B1's fp8_e4m3 conformance failures (nu below ||v_hat||): the stored witnesses
# per token (fp8_witness_probe.py), then the failing tests on four forms of the write's e4m3 saturation
ROOT=$PWD
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 WITCERT_DEVICE=cuda
nvidia-smi -L
(head -3 /dev/null)
L='y = tl.minimum(tl.maximum(y, -FP8_E4M3_MAX), FP8_E4M3_MAX)'
declare -A R
R[pnan]='y = tl.minimum(tl.maximum(y, -FP8_E4M3_MAX, propagate_nan=tl.PropagateNan.ALL), FP8_E4M3_MAX, propagate_nan=tl.PropagateNan.ALL)'
R[clamp]='y = tl.clamp(y, -FP8_E4M3_MAX, FP8_E4M3_MAX)'
R[noclamp]='y = y'
R[f16]='y = tl.minimum(tl.maximum(y, -FP8_E4M3_MAX), FP8_E4M3_MAX).to(tl.float16).to(tl.float32)'
T="tests/kernels/test_kernels_conformance.py"
SEL="$T::test_decode_conformance_fixed $T::test_decode_conformance_one_warp_tile $T::test_decode_conformance_page_levels $T::test_fp8_write_saturates_like_the_reference"
run_variant() {
  v=$1; D=/tmp/v_$v
  (cd $D && PYTHONPATH=$D:/tmp/site TRITON_CACHE_DIR=/tmp/tc_$v timeout 300 python3 -m pytest -q -p no:cacheprovider -k "fp8" $SEL > $OUT/tests_$v.log 2>&1; echo "$v tests rc $?" >> $OUT/tests_$v.log)
  (cd $D && PYTHONPATH=$D:/tmp/site TRITON_CACHE_DIR=/tmp/tc_$v python3 $ROOT/bench/results/2026-12-06c/fp8_witness_probe.py > $OUT/probe_$v.log 2>&1)
}
for v in cur pnan clamp noclamp f16; do
  D=/tmp/v_$v; rm -rf $D; mkdir -p $D; cp -r contract kernels witcert tests pyproject.toml bench $D/
  if [ $v != cur ]; then python3 - "$D/kernels/write.py" "$L" "${R[$v]}" <<'PY'
import sys; p, a, b = sys.argv[1:]; s = open(p).read(); assert s.count(a) == 1, s.count(a); open(p, "w").write(s.replace(a, b))
PY
  fi
  run_variant $v &
done
wait
for v in cur pnan clamp noclamp f16; do
  echo "== $v"; grep -E "^(FAILED|ERROR)|passed|failed|tests rc" $OUT/tests_$v.log | cut -c1-160 | tail -8; grep "^##" $OUT/probe_$v.log
done
