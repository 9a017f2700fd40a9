# Sourced by a device call (`run`, carrying .whl and .carry/sg): installs the carried wheels into /tmp/site, exports the
# GPU test environment (WITCERT_DEVICE=cuda; SGLang's unpacked modules on the path), prints the GPU, and defines
#     suite TIMEOUT SHARDS PATH...    the tests on the GPU in SHARDS processes (bench/pytest_shards.py) into
#                                     $OUT/gpu_tests.log, then their rc, failures and total
#     selftests CFG...                witcert selftest on the GPU for each configuration (a line per scheme)
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
# selftests CFG...   `witcert selftest --device cuda CFG --json` for each configuration string, a line per scheme
selftests() {
  for cfg in "$@"; do
    echo "== selftest $cfg"
    timeout 150 python3 -c "import sys; from witcert.cli import main; sys.exit(main(sys.argv[1:]))" selftest --device cuda \
      $cfg --json 2> "$OUT/selftest.err" | python3 -c "import json,sys; t=sys.stdin.read(); d=json.loads(t[t.index('['):]); [print(r['scheme'], r['passed'], r['worst_tv_ratio'], (r['error'] or '')[:300]) for r in d]"
  done
}
