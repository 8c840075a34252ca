# inferstack: the two commands a newcomer needs are `make local` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
ENGINE_VENV := .venv-engine
PREPARE_VENV := .venv-prepare
TOOLS_VENV := .venv-tools
STACK ?= prod

.PHONY: test lint typecheck unit plan local bench clean venv engine-venv prepare-venv tools-venv crd-tools schema snapshots prometheus

## venvs ---------------------------------------------------------------------------------------
# The project, its runtime services and the dev tools.
$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@
venv: $(BIN)/.installed

# Real vLLM on CPU, in its own venv: its pins clash with the project's (see DESIGN.md).
$(ENGINE_VENV)/.installed: scripts/engine-venv.sh
	bash scripts/engine-venv.sh $(ENGINE_VENV)
	touch $@
engine-venv: $(ENGINE_VENV)/.installed

# llm-compressor (quantization jobs) on the engine venv's torch, without touching the engine venv.
$(PREPARE_VENV)/.installed: scripts/prepare-venv.sh $(ENGINE_VENV)/.installed
	bash scripts/prepare-venv.sh $(PREPARE_VENV) $(ENGINE_VENV)
	touch $@
prepare-venv: $(PREPARE_VENV)/.installed

# Outside checkers that pin old libraries (checkov).
$(TOOLS_VENV)/.installed: scripts/tools-requirements.txt
	test -x $(TOOLS_VENV)/bin/python || $(PYTHON) -m venv $(TOOLS_VENV)
	$(TOOLS_VENV)/bin/python -m pip install --quiet -r scripts/tools-requirements.txt
	touch $@
tools-venv: $(TOOLS_VENV)/.installed

# Upstream CRD schemas of the custom resources we render (npm @kubernetes-models packages, pinned in the
# lock file; see tests/components/test_crd_schemas.py). Offline once installed.
CRD_TOOLS := tools/crd-schemas
$(CRD_TOOLS)/node_modules/.installed: $(CRD_TOOLS)/package.json $(CRD_TOOLS)/package-lock.json
	@command -v npm >/dev/null || { echo 'make crd-tools: npm (Node.js 20 or later) is missing: apt-get install -y nodejs npm' >&2; exit 2; }
	npm ci --prefix $(CRD_TOOLS) --no-audit --no-fund --loglevel=error
	touch $@
crd-tools: $(CRD_TOOLS)/node_modules/.installed

# Prometheus and promtool (Debian's package): rule checks and unit tests, `make local MONITOR=1`.
prometheus:
	bash scripts/install-prometheus.sh

## checks --------------------------------------------------------------------------------------
# lint-imports checks the import boundaries of DESIGN.md (contracts in pyproject.toml [tool.importlinter]).
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache --no-logo

typecheck: venv
	$(BIN)/mypy components runtime policies

unit: venv crd-tools prometheus
	$(BIN)/pytest -m 'not engine'

# Accept the plan changes a change makes: rewrites tests/snapshots/plans/ (review and commit the diff).
snapshots: venv
	INFERSTACK_UPDATE_SNAPSHOTS=1 $(BIN)/pytest -q tests/components/test_plan_snapshots.py

test: venv engine-venv prepare-venv tools-venv crd-tools prometheus lint typecheck
	$(BIN)/pytest

## product -------------------------------------------------------------------------------------
schema: venv
	$(BIN)/inferstack schema

plan: venv
	$(BIN)/inferstack plan -s $(STACK) --out build/$(STACK)

## local ---------------------------------------------------------------------------------------
# The data plane of stacks/Pulumi.local.yaml on this machine: real vLLM on CPU behind the router on
# http://127.0.0.1:8080. Foreground (Ctrl-C stops everything); DETACH=1 runs it in the background
# (then `make local-status`, `make local-logs`, `make local-down`). PORT=N moves the router;
# MONITOR=1 also runs Prometheus on http://127.0.0.1:9090 with the stack's alert rules;
# LOCAL_ARGS passes other `inferstack local up` options; LOCAL_STATE picks the state directory.
.PHONY: local local-down local-status local-logs
LOCAL_STATE_ARG = $(if $(LOCAL_STATE),--state-dir $(LOCAL_STATE))
local: venv engine-venv $(if $(MONITOR),prometheus)
	$(BIN)/inferstack local up $(if $(PORT),--port $(PORT)) $(if $(DETACH),--detach) $(if $(MONITOR),--monitor) $(LOCAL_STATE_ARG) $(LOCAL_ARGS)

local-down: venv
	$(BIN)/inferstack local down $(LOCAL_STATE_ARG)

local-status: venv
	$(BIN)/inferstack local status $(LOCAL_STATE_ARG)

local-logs: venv
	$(BIN)/inferstack local logs $(LOCAL_STATE_ARG)

## bench ---------------------------------------------------------------------------------------
# Routing quality on two real engines (bench/routing, ~15 min), router overhead (bench/router,
# ~6 min), batcher (bench/batcher, ~3 min). Results and the chart go to bench/results/. Not part of test.
bench: venv engine-venv
	@command -v wrk >/dev/null || { echo 'make bench: wrk (the router benchmark load generator) is missing: apt-get install -y wrk' >&2; exit 2; }
	bash bench/routing/setup.sh
	$(BIN)/python -m bench.routing.run
	$(BIN)/python bench/router/run.py --repeat 3
	$(BIN)/python bench/batcher/run.py

clean:
	rm -rf build .pytest_cache .mypy_cache .ruff_cache
