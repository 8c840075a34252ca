# inferstack: the two commands a newcomer needs are `make local` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
ENGINE_VENV := .venv-engine
PREPARE_VENV := .venv-prepare
TOOLS_VENV := .venv-tools
TRACES_VENV := .venv-traces
STACK ?= prod

# Python writes its bytecode caches (__pycache__) in the venvs and the checkout, once per module: where
# PYTHONDONTWRITEBYTECODE is set, as on the build machines, every process would compile all it imports again (each
# engine start vLLM, torch and transformers; the tests start hundreds of processes). Byte-compiling every venv at
# install instead cost more than it saved (the three venvs' torch, pulumi_aws and the rest on two cores).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: test lint typecheck unit plan local bench clean venv engine-venv prepare-venv tools-venv traces-venv crd-tools s3rver schema snapshots prometheus redis

## venvs ---------------------------------------------------------------------------------------
# uv installs every venv: pip took 203 s for the engine venv alone on the 2-core machine, uv 19 s for the same
# versions (it downloads and links in parallel, and links a wheel that another venv already unpacked). Its pin is
# in pyproject.toml's dev extra; the project venv's pip bootstraps that one version. uv compiles no bytecode: see
# PYTHONDONTWRITEBYTECODE above.
UV := $(BIN)/uv
$(UV): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet "$$(grep -o -m1 -E 'uv==[0-9.]+' pyproject.toml)"
	touch $@

# The project, its runtime services and the dev tools. xds-protos (the picker's Envoy API) ships an old copy of
# opentelemetry/proto/* (its RECORD lists them) that overwrites opentelemetry-proto's, whichever the installer
# unpacks last: the OTLP exporter (runtime/tracing.py) then fails to import. opentelemetry-proto's own files go
# back last; the Envoy messages the picker uses import none of them.
$(BIN)/.installed: pyproject.toml $(UV)
	$(UV) pip install --quiet --python $(BIN)/python -e '.[dev]'
	$(UV) pip install --quiet --python $(BIN)/python --reinstall --no-deps \
	  "$$($(BIN)/python -c 'from importlib.metadata import version; print("opentelemetry-proto==" + version("opentelemetry-proto"))')"
	touch $@
venv: $(BIN)/.installed

# Real vLLM on CPU, in its own venv: its pins clash with the project's (see DESIGN.md).
$(ENGINE_VENV)/.installed: scripts/engine-venv.sh scripts/venv-lib.sh $(UV)
	UV=$(UV) bash scripts/engine-venv.sh $(ENGINE_VENV)
	touch $@
engine-venv: $(ENGINE_VENV)/.installed

# llm-compressor (quantization jobs) as the quantize image holds it, with torch's CPU build.
$(PREPARE_VENV)/.installed: scripts/prepare-venv.sh scripts/venv-lib.sh scripts/cpu_pins.py runtime/images/prepare-llmcompressor.requirements.txt $(UV)
	UV=$(UV) bash scripts/prepare-venv.sh $(PREPARE_VENV)
	touch $@
prepare-venv: $(PREPARE_VENV)/.installed

# Outside checkers that pin old libraries (checkov).
$(TOOLS_VENV)/.installed: scripts/tools-requirements.txt $(UV)
	test -x $(TOOLS_VENV)/bin/python || $(PYTHON) -m venv --without-pip $(TOOLS_VENV)
	$(UV) pip install --quiet --python $(TOOLS_VENV)/bin/python -r scripts/tools-requirements.txt
	touch $@
tools-venv: $(TOOLS_VENV)/.installed

# The local trace store of `make local TRACES=1` (Arize Phoenix: scripts/traces-requirements.txt).
$(TRACES_VENV)/.installed: scripts/traces-requirements.txt $(UV)
	test -x $(TRACES_VENV)/bin/python || $(PYTHON) -m venv --without-pip $(TRACES_VENV)
	$(UV) pip install --quiet --python $(TRACES_VENV)/bin/python -r scripts/traces-requirements.txt
	touch $@
traces-venv: $(TRACES_VENV)/.installed

# Debian's redis-server: the routers' shared rate-limit store in the tests and in `make local ROUTERS=N`,
# which start their own on 127.0.0.1 and stop it. The Debian service is stopped and disabled at once:
# nothing is left listening on 6379. After prometheus (order only): apt holds one lock, so under `make -j`
# Debian's two packages install one after the other.
redis: | prometheus
	@command -v redis-server >/dev/null || { \
	  echo 'installing redis-server (apt-get)'; \
	  { DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server >/dev/null \
	    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server >/dev/null; }; } \
	    || { echo 'make redis: apt-get install redis-server failed (run it as root, or install redis-server)' >&2; exit 2; }; \
	  service redis-server stop >/dev/null 2>&1 || true; \
	  update-rc.d redis-server disable >/dev/null 2>&1 || true; \
	}

# Upstream CRD schemas of the custom resources we render (npm @kubernetes-models packages, pinned in the
# lock file; see tests/components/test_crd_schemas.py). Offline once installed.
CRD_TOOLS := tools/crd-schemas
$(CRD_TOOLS)/node_modules/.installed: $(CRD_TOOLS)/package.json $(CRD_TOOLS)/package-lock.json
	@command -v npm >/dev/null || { echo 'make crd-tools: npm (Node.js 20 or later) is missing: apt-get install -y nodejs npm' >&2; exit 2; }
	npm ci --prefix $(CRD_TOOLS) --no-audit --no-fund --loglevel=error
	touch $@
crd-tools: $(CRD_TOOLS)/node_modules/.installed

# The loopback S3 server of the tests, `make local S3=1` and bench/coldstart (npm s3rver, pinned in the lock
# file; components/local/s3_server.py starts it). Offline once installed.
S3RVER := tools/s3rver
$(S3RVER)/node_modules/.installed: $(S3RVER)/package.json $(S3RVER)/package-lock.json
	@command -v npm >/dev/null || { echo 'make s3rver: npm (Node.js 20 or later) is missing: apt-get install -y nodejs npm' >&2; exit 2; }
	npm ci --prefix $(S3RVER) --no-audit --no-fund --loglevel=error
	touch $@
s3rver: $(S3RVER)/node_modules/.installed

# Prometheus and promtool (Debian's package): rule checks and unit tests, `make local MONITOR=1`.
prometheus:
	bash scripts/install-prometheus.sh

## checks --------------------------------------------------------------------------------------
# lint-imports checks the import boundaries of DESIGN.md (contracts in pyproject.toml [tool.importlinter]).
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache --no-logo

TYPECHECK = $(BIN)/mypy components runtime policies
typecheck: venv
	$(TYPECHECK)

unit: venv crd-tools s3rver prometheus
	$(BIN)/pytest -m 'not engine' -n 2

# xdist workers of `make test` (tests/conftest.py): one takes the session engines' group, the other the
# own-engines group, and both then the short tests. Two on a 2-core machine, which the run keeps busy: fresh-
# clone runs took 1,442 s and 1,553 s of pytest on two workers, 1,466 s on three; a third buys nothing.
TEST_WORKERS ?= 2

# Accept the plan changes a change makes: rewrites tests/snapshots/plans/ (review and commit the diff).
snapshots: venv
	INFERSTACK_UPDATE_SNAPSHOTS=1 $(BIN)/pytest -q tests/components/test_plan_snapshots.py

# What the tests need, installed side by side, with mypy beside the installs (they mostly wait on the network
# and the disk), then pytest on TEST_WORKERS workers (tests/conftest.py: the engine tests run in two xdist groups,
# in turn within each). Any step failing fails the target.
INSTALLS := venv engine-venv prepare-venv tools-venv crd-tools prometheus s3rver redis
test:
	$(MAKE) --no-print-directory -j4 $(INSTALLS) lint typecheck
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup

## product -------------------------------------------------------------------------------------
schema: venv
	$(BIN)/inferstack schema

plan: venv
	$(BIN)/inferstack plan -s $(STACK) --out build/$(STACK)

## local ---------------------------------------------------------------------------------------
# The data plane of stacks/Pulumi.local.yaml on this machine: real vLLM on CPU behind the router on
# http://127.0.0.1:8080. Foreground (Ctrl-C stops everything); DETACH=1 runs it in the background
# (then `make local-status`, `make local-logs`, `make local-down`). PORT=N moves the router;
# MONITOR=1 also runs Prometheus on http://127.0.0.1:9090 with the stack's alert rules; ROUTERS=N runs N router
# replicas behind a round-robin balancer on PORT, sharing rate limits through a local redis-server; S3=1 serves from
# the model store, as a cluster does: a loopback S3 server, the models prepared into it, engines streaming
# their weights from it. GATEWAY=envoy puts a real Envoy (1.40) on the router's port with inferstack's
# endpoint picker as its ext_proc server: the Gateway API Inference Extension's data path
# (components/render/envoy.py). PD=1 serves the chat model disaggregated: one prefill and one decode engine, vLLM's
# NixlConnector moving the KV cache between them over UCX/TCP on loopback. TRACES=1 also runs a trace store (Arize
# Phoenix) on http://127.0.0.1:6006 that the router, the batcher, the batch service and the engines send every
# request's spans to (README: "Look at one slow request"). LOCAL_ARGS passes other `inferstack local up` options; LOCAL_STATE picks the
# state directory.
.PHONY: local local-down local-status local-logs
LOCAL_STATE_ARG = $(if $(LOCAL_STATE),--state-dir $(LOCAL_STATE))
local: venv engine-venv $(if $(MONITOR),prometheus) $(if $(filter-out 1,$(ROUTERS)),redis) $(if $(S3),s3rver) $(if $(TRACES),traces-venv)
	$(BIN)/inferstack local up $(if $(PORT),--port $(PORT)) $(if $(ROUTERS),--routers $(ROUTERS)) $(if $(GATEWAY),--gateway $(GATEWAY)) $(if $(DETACH),--detach) $(if $(MONITOR),--monitor) $(if $(S3),--s3) $(if $(PD),--pd) $(if $(TRACES),--traces) $(LOCAL_STATE_ARG) $(LOCAL_ARGS)

local-down: venv
	$(BIN)/inferstack local down $(LOCAL_STATE_ARG)

local-status: venv
	$(BIN)/inferstack local status $(LOCAL_STATE_ARG)

local-logs: venv
	$(BIN)/inferstack local logs $(LOCAL_STATE_ARG)

## bench ---------------------------------------------------------------------------------------
# Routing quality on two real engines (bench/routing, ~15 min), with 1-3 router replicas (~25 min),
# router overhead (bench/router, ~10 min with the Envoy targets), batcher (bench/batcher, ~3 min). Results and the chart go to bench/results/. Not part of test.
bench: venv engine-venv
	@command -v wrk >/dev/null || { echo 'make bench: wrk (the router benchmark load generator) is missing: apt-get install -y wrk' >&2; exit 2; }
	bash bench/routing/setup.sh
	$(BIN)/python -m bench.routing.run
	$(BIN)/python -m bench.routing.replicas
	$(BIN)/python bench/router/run.py --repeat 3
	$(BIN)/python bench/batcher/run.py

clean:
	rm -rf build .pytest_cache .mypy_cache .ruff_cache
