#!/bin/bash
# run A1 (2026-12-06, sixteenth session): stash the first half of the embedded model's GGUF (A2 meters the real model on
# the GPU), then the decode table (issue 35), the sketch + window against the group radius (issue 33's speed) and
# FlashInfer 0.2.5's fp8 decode (JIT-built from its sdist, tensor cores only: Y10's CUDA-core build fails under CUDA 13)
ROOT=$PWD; mkdir -p /tmp/m && cp .carry/m1/part /tmp/m/part1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT:/tmp/site:$ROOT/.carry/sg
nvidia-smi -L; nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
timeout 170 python3 bench/decode.py --heads 32 --batches 1,8,32 > $OUT/decode.log 2>&1; echo "rc $?" >> $OUT/decode.log
tail -12 $OUT/decode.log | cut -c1-260
timeout 150 python3 bench/sketch_speed.py --lean --batches 1,8,32 --lengths 32768,131072 > $OUT/sketch.log 2>&1
echo "rc $?" >> $OUT/sketch.log; tail -10 $OUT/sketch.log | cut -c1-400
mkdir -p /tmp/fi && tar xzf .carry/fi/flashinfer_python-0.2.5.tar.gz -C /tmp/fi || exit 0
FI=/tmp/fi/flashinfer_python-0.2.5
mkdir -p $FI/flashinfer/data && ln -s $FI/include $FI/flashinfer/data/include && ln -s $FI/csrc $FI/flashinfer/data/csrc \
  && ln -s $FI/3rdparty/cutlass $FI/flashinfer/data/cutlass && ln -s $FI/tvm_binding $FI/flashinfer/data/tvm_binding
which ninja || { python3 -m pip install -q --no-index --no-deps --target /tmp/nj .carry/fi/ninja-*.whl; export PATH=/tmp/nj/bin:$PATH; }
export PYTHONPATH=$ROOT:$FI:/tmp/site TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 FLASHINFER_WORKSPACE_BASE=/tmp/fiws CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
timeout 200 python3 bench/flashinfer_decode.py --batches 1,8,32 --lengths 32768,131072 --tensor-cores 1 > $OUT/fi_decode.log 2>&1
echo "rc $?" >> $OUT/fi_decode.log; tail -12 $OUT/fi_decode.log | cut -c1-260
