#!/bin/bash
# run Y10 (2026-12-05g): FlashInfer 0.2.5 JIT-built from its sdist; its fp8 decode beside WitCert's int8 decode
ROOT=$PWD
export PYTHONUNBUFFERED=1
nvidia-smi -L; which nvcc ninja; nvcc --version | tail -2
mkdir -p /tmp/fi /tmp/nj && tar xzf .carry/fi/flashinfer_python-0.2.5.tar.gz -C /tmp/fi || exit 1
FI=/tmp/fi/flashinfer_python-0.2.5
mkdir -p $FI/flashinfer/data && ln -s $FI/include $FI/flashinfer/data/include && ln -s $FI/csrc $FI/flashinfer/data/csrc \
  && ln -s $FI/3rdparty/cutlass $FI/flashinfer/data/cutlass && ln -s $FI/tvm_binding $FI/flashinfer/data/tvm_binding
which ninja || { python3 -m pip install -q --no-index --no-deps --target /tmp/nj .carry/fi/ninja-*.whl; export PATH=/tmp/nj/bin:$PATH; which ninja; }
export PYTHONPATH=$ROOT:$FI TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 FLASHINFER_WORKSPACE_BASE=/tmp/fiws CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
python3 -c "import flashinfer; print('flashinfer', flashinfer.__version__)" 2>&1 | tail -3
# the two JIT builds first, timed, with their logs
timeout 420 python3 - > $OUT/build.log 2>&1 <<'PY'
import time, torch, flashinfer
from flashinfer.jit import attention as A
t = time.time()
for tc in (False, True):
    ws = torch.empty(16 << 20, dtype=torch.uint8, device="cuda")
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tc)
    try:
        w.plan(torch.tensor([0, 1], dtype=torch.int32, device="cuda"), torch.tensor([0], dtype=torch.int32, device="cuda"),
               torch.tensor([16], dtype=torch.int32, device="cuda"), 32, 8, 128, 16, q_data_type=torch.bfloat16,
               kv_data_type=torch.float8_e4m3fn)
        print("built tc", tc, round(time.time() - t, 1), "s", flush=True)
    except Exception as e:
        print("FAILED tc", tc, type(e).__name__, str(e)[-3000:], flush=True)
PY
echo "build rc $?" >> $OUT/build.log; grep -E "built|FAILED|rc" $OUT/build.log | cut -c1-300
grep -m5 -E "error" $OUT/build.log | cut -c1-300
timeout 150 python3 bench/flashinfer_decode.py --batches 1,8,32 --lengths 32768,131072 > $OUT/fi_decode.log 2>&1; echo "rc $?" >> $OUT/fi_decode.log
cat $OUT/fi_decode.log | cut -c1-250 | tail -20
# Y10's second call (the same lease): the CUDA-core decode failed to link above (CUDA 13.0: an undefined hidden
# kernel symbol), the tensor-core one built in 28.8 s; the table with it alone:
#   PYTHONPATH=$ROOT:$FI TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 FLASHINFER_WORKSPACE_BASE=/tmp/fiws \
#     python3 bench/flashinfer_decode.py --batches 1,8,32 --lengths 32768,131072 --tensor-cores 1 > $OUT/fi_decode.log
