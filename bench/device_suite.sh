# Sourced by a device call (`run`, carrying .whl and .carry/sg): installs the carried wheels into /tmp/site, exports the
# GPU test environment (WITCERT_DEVICE=cuda; SGLang's unpacked modules on the path), prints the GPU, and defines
#     suite TIMEOUT SHARDS PATH...    the tests on the GPU in SHARDS processes (bench/pytest_shards.py) into
#                                     $OUT/gpu_tests.log, then their rc, failures and total
#     selftests CFG...                witcert selftest on the GPU for each configuration (a line per scheme)
#     flashinfer_env                  FlashInfer 0.2.5 from the carried sdist (.carry/fi, with a ninja wheel) unpacked
#                                     for its JIT build, and its environment exported (bench/flashinfer_decode.py)
ROOT=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT:/tmp/site:$ROOT/.carry/sg WITCERT_DEVICE=cuda
nvidia-smi -L
suite() {
  local t=$1 n=$2
  shift 2
  timeout "$t" python3 bench/pytest_shards.py -n "$n" "$@" > "$OUT/gpu_tests.log" 2>&1
  echo "tests rc $?"; grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | sort -u | cut -c1-300; tail -1 "$OUT/gpu_tests.log" | cut -c1-300
}
# the canary configurations of runs D5, E1 and E4: Llama-8B attention at B 8 / 32K with three schemes, SmolLM2's shape
# with three more, and two schemes without a window
CANARY_CONFIGS=("--scheme int8,fp8_e4m3,kivi2 --head-dim 128 --kv-heads 8 --q-heads 32 --batch 8 --context 32768"
  "--scheme int8,int4_group,int8_dither --head-dim 64 --kv-heads 3 --q-heads 9 --batch 1 --context 4096"
  "--scheme fp8_e5m2,int8 --head-dim 128 --kv-heads 8 --q-heads 32 --batch 3 --context 8192 --window 0,0")
# selftests CFG...   `witcert selftest --device cuda CFG --json` for each configuration string, a line per scheme
selftests() {
  for cfg in "$@"; do
    echo "== selftest $cfg"
    timeout 150 python3 -c "import sys; from witcert.cli import main; sys.exit(main(sys.argv[1:]))" selftest --device cuda \
      $cfg --json 2> "$OUT/selftest.err" | python3 -c "import json,sys; t=sys.stdin.read(); d=json.loads(t[t.index('['):]); [print(r['scheme'], r['passed'], r['worst_tv_ratio'], (r['error'] or '')[:300]) for r in d]"
  done
}
# flashinfer_env   FlashInfer 0.2.5's sdist (.carry/fi) unpacked under /tmp/fi with the data links its JIT build reads,
# ninja from the carried wheel if the machine has none, PYTHONPATH and the build's environment exported (run A1's
# steps); returns 1 when the sdist is not carried
flashinfer_env() {
  mkdir -p /tmp/fi && tar xzf "$ROOT/.carry/fi/flashinfer_python-0.2.5.tar.gz" -C /tmp/fi || return 1
  local fi=/tmp/fi/flashinfer_python-0.2.5
  mkdir -p $fi/flashinfer/data && ln -sfn $fi/include $fi/flashinfer/data/include && ln -sfn $fi/csrc $fi/flashinfer/data/csrc \
    && ln -sfn $fi/3rdparty/cutlass $fi/flashinfer/data/cutlass && ln -sfn $fi/tvm_binding $fi/flashinfer/data/tvm_binding
  which ninja > /dev/null || { python3 -m pip install -q --no-index --no-deps --target /tmp/nj "$ROOT"/.carry/fi/ninja-*.whl
    export PATH=/tmp/nj/bin:$PATH; }
  export PYTHONPATH=$ROOT:$fi:/tmp/site TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 FLASHINFER_WORKSPACE_BASE=/tmp/fiws \
    CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
}
