"""`make local TRACES=1` planned: the trace store's ports checked with the rest, every request traced to it from
the runtime services, and the vLLM engines' own tracing pointed at it through the stack's engine arguments."""

from __future__ import annotations

import pytest

from components.local.plan import LocalOptions, PlanError, build_plan
from components.local.traces import LAUNCHER, TraceStore, traced
from tests.local.test_plan import REPO, raw_local, stack_from


def test_traces_off_the_local_config_has_no_tracing():
    plan = build_plan(stack_from(raw_local()), LocalOptions(cpus=(0, 1)), REPO)
    assert plan.config.tracing is None and plan.traces is None


def test_traces_on_every_request_goes_to_the_local_store_and_every_vllm_engine_exports_there():
    store = TraceStore(16006, 14317)
    raw = traced(raw_local(), store)
    plan = build_plan(stack_from(raw), LocalOptions(cpus=(0, 1), traces=store), REPO)
    t = plan.config.tracing
    assert t is not None and (t.endpoint, t.sample_ratio) == ("http://127.0.0.1:14317", 1.0)
    assert plan.engines
    for engine in plan.engines:
        args = engine.spec.engine.extra_args
        assert args[args.index("--otlp-traces-endpoint") + 1] == "http://127.0.0.1:14317"
    assert (16006, "the trace store", "--traces-port") in plan.ports()
    assert (14317, "the trace store (OTLP)", "--traces-grpc-port") in plan.ports()


def test_a_trace_store_port_taken_by_another_part_is_refused_naming_the_option():
    store = TraceStore(8080, 14317)  # the router's
    with pytest.raises(PlanError, match="--traces-port"):
        build_plan(stack_from(traced(raw_local(), store)), LocalOptions(traces=store), REPO)


def test_the_store_runs_on_loopback_without_telemetry_in_its_own_venv(tmp_path):
    argv = TraceStore(16006, 14317).argv(REPO, tmp_path)
    assert argv[0] == "env"
    settings = dict(a.split("=", 1) for a in argv[1:] if "=" in a and not a.startswith("/"))
    assert settings["PHOENIX_HOST"] == "127.0.0.1" and settings["PHOENIX_TELEMETRY_ENABLED"] == "false"
    assert settings["PHOENIX_WORKING_DIR"] == str(tmp_path / "traces")
    assert argv[-3].endswith(".venv-traces/bin/python") and argv[-1] == LAUNCHER
    # Phoenix binds its gRPC receiver on every interface ("[::]:PORT"); the launcher moves that bind to loopback
    assert '"[::]:", "127.0.0.1:"' in LAUNCHER
