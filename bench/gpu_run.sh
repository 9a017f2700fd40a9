#!/usr/bin/env bash
# One device call: environment, then the stages named in STAGES (default: all but serving).
# Results under $OUT.  STAGES is a space-separated subset of: graphs conf gate bench tiles ab serving stock host probe race.
set -o pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STAGES=" ${STAGES:-conf gate bench ab} "
has() { [[ "$STAGES" == *" $1 "* ]]; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } 2>&1 | tee "$OUT/env.txt"
if has graphs; then
  # graphed decode steps (witcert.graphs): real CUDA-graph capture and replay against the eager kernel path
  WITCERT_DEVICE=cuda timeout "${GRAPHS_TIMEOUT:-240}" python3 -m pytest -v -p no:cacheprovider tests/test_graphs.py 2>&1 | tee "$OUT/graphs.txt" | tail -30
fi
if has conf; then
  WITCERT_DEVICE=cuda timeout "${CONF_TIMEOUT:-240}" python3 -m pytest -v -p no:cacheprovider tests/test_kernels_conformance.py 2>&1 | tee "$OUT/conformance.txt" | tail -30
fi
if has gate; then
  # the gated kernel path (repaired-page overlay) on a GPU
  WITCERT_DEVICE=cuda timeout "${GATE_TIMEOUT:-240}" python3 -m pytest -v -p no:cacheprovider tests/test_kernel_gate.py \
    tests/test_review_store_gate.py tests/test_kivi2_kernel.py 2>&1 | tee "$OUT/kernel_gate.txt" | tail -30
fi
if has bench; then
  timeout "${BENCH_TIMEOUT:-300}" python3 bench/decode.py ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.txt"
fi
if has tiles; then
  # tile / stage / warp A/B of the decode kernel, one process per shape (bench/tile_ab.py; B:n or B:n:S)
  for shp in ${TILE_SHAPES:-1:32768 8:32768 32:32768 8:131072}; do
    timeout "${TILE_TIMEOUT:-120}" python3 bench/tile_ab.py --shape "$shp" ${TILE_ARGS:-} 2>&1 | tee -a "$OUT/tiles.txt"
  done
fi
if has ab; then
  # the production A/B of kernels.plan.tile_config (kernel only) against the older tile / stage choices
  timeout "${AB_TIMEOUT:-240}" python3 bench/stream_probe.py --production 2>&1 | tee "$OUT/tile_ab.txt"
fi
if has serving; then
  timeout "${SERVING_TIMEOUT:-300}" python3 bench/serving.py ${SERVING_ARGS:---gated} 2>&1 | tee "$OUT/serving.txt"
fi
if has stock; then
  # why the stock column is slow (bench/SERVING.md): profiles of one stock and one pass-through step
  timeout "${STOCK_TIMEOUT:-170}" python3 bench/stock_probe.py 2>&1 | tee "$OUT/stock_probe.txt"
fi
if has host; then
  # where the metered step's host time goes (bench/host_probe.py)
  timeout "${HOST_TIMEOUT:-200}" python3 bench/host_probe.py 2>&1 | tee "$OUT/host_probe.txt"
fi
if has probe; then
  # compute-sanitizer over the decode configurations, graph-replayed ones included (bench/crash_probe.py)
  mkdir -p "$OUT/cs"
  python3 bench/crash_probe.py --list | grep -E "${PROBE_GREP:-.}" | timeout "${PROBE_TIMEOUT:-400}" xargs -P 10 -I{} sh -c \
    'WITCERT_DEVICE=cuda timeout 200 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --print-limit 2 python3 bench/crash_probe.py {} > "$0/cs/{}.txt" 2>&1' "$OUT"
  for f in "$OUT"/cs/*.txt; do echo "$(basename "$f" .txt) $(grep -h 'ERROR SUMMARY' "$f") $(grep -h '^ok' "$f")"; done | tee "$OUT/probe.txt"
fi
if has race; then
  # compute-sanitizer racecheck / synccheck (shared-memory hazards) on the cases in RACE_CASES
  mkdir -p "$OUT/race"
  for c in ${RACE_CASES:-mid-int8-m0-p4-s1-f0-e1-g mid-int8-m1-p8-s1-f1-e1}; do
    for tool in racecheck synccheck; do
      WITCERT_DEVICE=cuda timeout "${RACE_TIMEOUT:-150}" /usr/local/cuda/bin/compute-sanitizer --tool $tool --print-limit 4 \
        python3 bench/crash_probe.py $c > "$OUT/race/$c-$tool.txt" 2>&1
      echo "$c $tool: $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY' "$OUT/race/$c-$tool.txt" | tr '\n' ' ') $(grep -h '^ok' "$OUT/race/$c-$tool.txt")"
      grep -h -A6 '^========= Error: Race\|^========= Warning' "$OUT/race/$c-$tool.txt" | head -40
    done
  done | tee "$OUT/race.txt"
fi
