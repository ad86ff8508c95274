# Every target works on a fresh clone where only python3 exists: the venv is made on demand.
PYTHON ?= python3
VENV   := .venv
BIN    := $(CURDIR)/$(VENV)/bin
STAMP  := $(VENV)/.installed
export PATH := $(BIN):$(PATH)

.PHONY: install test test-unit lint typecheck demo bench proto clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/pytest -q -p no:cacheprovider

test-unit: $(STAMP)
	$(BIN)/pytest -q -p no:cacheprovider tests/unit

lint: $(STAMP)
	$(BIN)/ruff check plugin tests bench
	$(BIN)/ruff format --check plugin tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

demo: $(STAMP)
	$(BIN)/python -m llm_health.demo

bench: $(STAMP)
	$(BIN)/python bench/run_all.py

proto: $(STAMP)    # regenerate plugin/llm_health/adminpb from proto/ (commit the result)
	$(BIN)/python proto/generate.py

clean:
	rm -rf $(VENV) build plugin/*.egg-info
