"""A model served as separate prefill and decode roles (``models[].disaggregation``): what the spec accepts, the
two serving units it becomes, their engines' KV connector, the router's pairing, and what pool size and cost
count. The router's two-phase request is in tests/runtime/router/test_disagg.py, real engines in
tests/integration/test_pd_nixl.py."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from components.base.problems import SpecError
from components.clouds.targets import cloud_for
from components.core import cost, lifecycle
from components.core.cloud import EC2_PRICES
from components.core.stackfile import STACKS_DIR
from components.render import engine, network, runtime_config, scaling
from components.render.engine_args import model_env, vllm
from components.spec import ModelSpec
from runtime.engines import Signal
from runtime.router.metrics import RouterMetrics
from tests.components import test_promtool as promtool_rules
from tests.stacks import validate

PD = {
    "prefill": {
        "scaling": {"min_replicas": 1, "max_replicas": 3},
        "engine": {"max_num_batched_tokens": 16384},
    }
}


def _dev(**disaggregation: Any) -> dict[str, Any]:
    raw = yaml.safe_load((STACKS_DIR / "Pulumi.dev.yaml").read_text())["config"]["inferstack:platform"]
    raw = copy.deepcopy(raw)
    raw["models"][0]["disaggregation"] = copy.deepcopy({**PD, **disaggregation})
    raw["gpu_pools"][0]["max_nodes"] = 6  # both roles: 2 + 3 replicas of llama-3-8b, 1 of qwen-7b-sglang
    return raw


def _model(**fields: Any) -> ModelSpec:
    base = {"name": "chat", "source": "/models/tiny", "engine": {"device": "cpu", "dtype": "bfloat16"}}
    return ModelSpec.model_validate({**base, **fields})


def _kv_config(args: list[str]) -> dict[str, Any]:
    return dict(json.loads(args[args.index("--kv-transfer-config") + 1]))


def test_a_disaggregated_model_becomes_a_decode_unit_and_a_prefill_unit_serving_its_name() -> None:
    decode, prefill = lifecycle.pd_units(_model(disaggregation=PD, scaling={"max_replicas": 2}))
    assert (decode.name, decode.pd_role, decode.prefill_unit) == ("chat", "decode", "chat-prefill")
    assert (prefill.name, prefill.served_name, prefill.pd_role) == ("chat-prefill", "chat", "prefill")
    assert prefill.scaling.max_replicas == 3 and decode.scaling.max_replicas == 2
    assert prefill.engine.max_num_batched_tokens == 16384 and decode.engine.max_num_batched_tokens is None
    assert prefill.routing.strategy == "prefix_aware"  # the prefill is what reuses a cached prefix


def test_each_role_runs_the_nixl_connector_for_its_role_and_decode_engines_report_failed_loads() -> None:
    decode, prefill = lifecycle.pd_units(_model(disaggregation=PD))
    assert _kv_config(vllm(prefill).args) == {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_producer",
        "kv_buffer_device": "cpu",
        "kv_load_failure_policy": "fail",
        # the lease outlasts the router's longest wait: 30 s prefill + 120 s first byte + 10 s
        "kv_connector_extra_config": {"backends": ["UCX"], "kv_lease_duration": 160},
    }
    assert _kv_config(vllm(decode).args)["kv_role"] == "kv_consumer"
    assert model_env(decode)["UCX_TLS"] == "tcp"  # CPU: auto is TCP
    plain = _model()
    assert "--kv-transfer-config" not in vllm(plain).args and "UCX_TLS" not in model_env(plain)


def test_the_transport_picks_the_nixl_backend() -> None:
    gpu = {"device": "gpu", "dtype": "bfloat16"}
    for transport, backend, tls in (
        ("auto", "UCX", None),
        ("libfabric", "LIBFABRIC", None),
        ("tcp", "UCX", "tcp"),
    ):
        model = _model(engine=gpu, disaggregation={**PD, "transport": transport})
        decode, _ = lifecycle.pd_units(model)
        config = _kv_config(vllm(decode).args)
        assert config["kv_connector_extra_config"]["backends"] == [backend]
        assert config["kv_buffer_device"] == "cuda"
        assert model_env(decode).get("UCX_TLS") == tls


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"engine": {"kind": "sglang", "device": "gpu"}}, "hands no KV cache to another engine"),
        ({"engine": {"device": "cpu", "kv_cache_dtype": "fp8"}}, "moves no fp8 KV cache"),
        (
            {"disaggregation": {"prefill": {"engine": {"tensor_parallel_size": 2}}}},
            "tensor_parallel_size are the",
        ),
        ({"disaggregation": {"prefill": {"engine": {"max_model_len": 8}}}}, "disaggregation.prefill.engine"),
        ({"disaggregation": {"transport": "libfabric"}}, "libfabric is for EFA"),
        ({"name": "a" * 35}, "at most 32"),
    ],
)
def test_the_spec_refuses_what_cannot_be_disaggregated(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        _model(**{"disaggregation": PD, **fields})


def test_the_router_pairs_the_roles_and_each_role_gets_its_own_deployment() -> None:
    decided = validate(_dev(prefill_timeout_ms=5_000), "pd")
    served = decided.served_spec
    config = runtime_config.runtime_config(served)
    targets = {t.name: t for t in config.models}
    assert config.prefill_targets() == {"llama-3-8b-prefill": "llama-3-8b"}
    stage = targets["llama-3-8b"].prefill
    assert stage is not None and stage.timeout_ms == 5_000 and stage.attempts == 2
    routes = {r.model: r.strategy.name for r in config.router.routes}
    assert routes["llama-3-8b-prefill"] == "prefix_aware"
    for name, role in (("llama-3-8b", "kv_consumer"), ("llama-3-8b-prefill", "kv_producer")):
        manifests = engine.render(served, decided.units[name])
        deployment = next(m for m in manifests if m["kind"] == "Deployment")
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert _kv_config(container["args"])["kv_role"] == role
        assert container["args"][container["args"].index("--served-model-name") + 1] == "llama-3-8b"
        env = {e["name"]: e for e in container["env"]}
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
        assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"]["value"] == "5600"


def test_pool_size_and_cost_count_both_roles() -> None:
    raw = _dev()
    del raw["models"][0]["disaggregation"]
    plain = validate(raw, "plain")
    pd = validate(_dev(), "pd")
    one = cost.model_cost(plain.spec, plain.layout, "llama-3-8b", EC2_PRICES)
    both = cost.model_cost(pd.spec, pd.layout, "llama-3-8b", EC2_PRICES)
    assert both.max_usd_month == pytest.approx(one.usd_per_replica_month * (2 + 3))
    assert both.min_usd_month == pytest.approx(one.usd_per_replica_month * (0 + 1))


def test_the_pool_must_hold_both_roles() -> None:
    raw = _dev()
    raw["gpu_pools"][0]["max_nodes"] = 4
    with pytest.raises(SpecError, match=r"cannot hold the max replicas.*6 GPUs"):
        validate(raw, "pd")


def test_the_two_roles_engines_may_reach_each_other_on_any_port_and_no_one_else_gains_a_path() -> None:
    decided = validate(_dev(), "pd")
    policies = {
        p["metadata"]["name"]: p["spec"]
        for p in network.render(decided.spec, cloud_for(decided.spec), decided.layout)
        if p["kind"] == "NetworkPolicy"
    }
    decode, prefill = (
        policies["llama-3-8b-engine-kv-transfer"],
        policies["llama-3-8b-prefill-engine-kv-transfer"],
    )
    assert decode["podSelector"]["matchLabels"]["inferstack.io/model"] == "llama-3-8b"
    assert prefill["podSelector"]["matchLabels"]["inferstack.io/model"] == "llama-3-8b-prefill"
    for me, peer in ((decode, "llama-3-8b-prefill"), (prefill, "llama-3-8b")):
        for rules, side in ((me["ingress"], "from"), (me["egress"], "to")):
            (rule,) = rules
            assert "ports" not in rule  # the transport picks its ports
            (selected,) = rule[side]
            assert selected["podSelector"]["matchLabels"]["inferstack.io/model"] == peer
    assert not [n for n in policies if n.startswith("qwen-7b-sglang") and n.endswith("kv-transfer")]


def test_the_plan_shows_the_pairing_the_transport_and_the_routers_bounds() -> None:
    decided = validate(_dev(), "pd")
    (line,) = [
        line for line in lifecycle.describe(decided.spec, decided.layout, ()) if "disaggregated" in line
    ]
    assert line.startswith(
        "llama-3-8b: prefill/decode disaggregated in pool g6-spot: prefill llama-3-8b-prefill"
    )
    assert "(1-3 replicas, prefix_aware routing)" in line and "decode llama-3-8b (0-2 replicas" in line
    assert "NixlConnector over ucx" in line and "30000 ms" in line and "20000 ms" in line


def test_each_role_scales_on_its_own_signals_under_promtool(tmp_path: Path) -> None:
    """Prefill on its engines' queue and TTFT (and, at zero, on the prefills the router could not send), decode on
    KV usage and inter-token latency (and the router's line, where its requests wait): the KEDA triggers' queries,
    evaluated by promtool on series shaped like the real ones."""
    raw = _dev()
    raw["addons"] = {"autoscaler": "keda"}
    decided = validate(raw, "pd")
    spec = decided.served_spec
    decode, prefill = decided.units["llama-3-8b"], decided.units["llama-3-8b-prefill"]
    names = {u.model.name: [t.name for t in scaling.triggers(spec, u)] for u in (decode, prefill)}
    assert names == {
        "llama-3-8b": ["queued", "router-queue", "kv-cache", "inter-token-p95"],
        "llama-3-8b-prefill": ["queued", "prefill-demand", "ttft-p95"],
    }
    busy = promtool_rules.Inputs(10)
    for unit in (decode.model, prefill.model):
        busy.constant(promtool_rules.series("up", promtool_rules.target(spec, unit, 0)), 1)
        busy.engine(spec, unit, Signal.QUEUED, 0, 2)
        busy.engine(spec, unit, Signal.KV_USAGE, 0, 0.5)
        busy.histogram(spec, unit, Signal.TTFT, 0, 8)
        busy.histogram(spec, unit, Signal.INTER_TOKEN, 0, 3)
    busy.constant(promtool_rules.router_series(spec, "queue_depth", model="llama-3-8b"), 4)
    busy.counter(
        promtool_rules.router_series(spec, "rejections_total", model="llama-3-8b", reason="no_backend")
    )
    fallbacks = _router_series(spec, "pd_fallbacks_total", model="llama-3-8b", reason="no_prefill_replica")
    busy.counter(fallbacks, per_min=120)
    want = {
        ("llama-3-8b", "queued"): 2.0,
        ("llama-3-8b", "router-queue"): 5.0,
        ("llama-3-8b", "kv-cache"): 0.5,
        ("llama-3-8b", "inter-token-p95"): promtool_rules.quantile_of(Signal.INTER_TOKEN, 3),
        ("llama-3-8b-prefill", "queued"): 2.0,
        ("llama-3-8b-prefill", "prefill-demand"): 2.0,  # two prefills a second went decode-only
        ("llama-3-8b-prefill", "ttft-p95"): promtool_rules.quantile_of(Signal.TTFT, 8),
    }
    checks = [
        {
            "expr": t.query,
            "eval_time": "5m",
            "exp_samples": [{"labels": "{}", "value": want[(u.model.name, t.name)]}],
        }
        for u in (decode, prefill)
        for t in scaling.triggers(spec, u)
    ]
    promtool_rules.write_rules(decided.spec, tmp_path)
    doc = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": busy.doc(), "promql_expr_test": checks}],
    }
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    result = subprocess.run(
        [promtool_rules.promtool(), "test", "rules", "tests.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]


def _router_series(spec: Any, name: str, **labels: str) -> str:
    """A router series in the shape the router's own exposition gives it (the P/D counters have no sample until
    a P/D request counts)."""
    metrics = RouterMetrics()
    metrics.pd_fallback("m", "no_prefill_replica")
    metrics.pd_request("m", "disaggregated")
    full = f"inferstack_router_{name}"
    shape = {
        x.name: sorted(x.labels)
        for f in text_string_to_metric_families(generate_latest(metrics.registry).decode())
        for x in f.samples
    }
    assert shape[full] == sorted(labels)
    return promtool_rules.series(full, {**promtool_rules.runtime_target(spec, "router"), **labels})


@pytest.mark.parametrize(
    ("gateway", "addons", "message"),
    [
        (
            {
                "mode": "inference-extension",
                "gateway_class": "kgateway",
                "ingress": "gateway-api",
                "hostname": "llm.example.com",
            },
            {},
            "runs no router",
        ),
        ({}, {"autoscaler": "hpa"}, "only KEDA reads"),
    ],
)
def test_the_stack_refuses_disaggregation_without_the_router_or_with_hpa(
    gateway: dict[str, Any], addons: dict[str, Any], message: str
) -> None:
    raw = _dev()
    raw["gateway"] = {**raw["gateway"], **gateway}
    raw["addons"] = {**raw.get("addons", {}), **addons}
    with pytest.raises(SpecError, match=message):
        validate(raw, "pd")


def _two_pools(**pool: Any) -> dict[str, Any]:
    """The dev stack with the prefill role in a pool of its own (on-demand L40S beside the model's spot L4s)."""
    raw = _dev()
    raw["gpu_pools"].append({"name": "prefill-l40s", "instance_type": "g6e.xlarge", **pool})
    raw["models"][0]["disaggregation"]["prefill"]["pool"] = "prefill-l40s"
    return raw


def test_a_prefill_role_in_a_pool_of_its_own_is_placed_sized_billed_and_rendered_there() -> None:
    decided = validate(_two_pools(), "pd")
    layout = decided.layout
    prefill = layout.placements["llama-3-8b-prefill"]
    assert (prefill.pool, prefill.instance.name) == ("prefill-l40s", "g6e.xlarge")
    # each pool holds its own role: 2 decode replicas + 1 of qwen on g6-spot; 3 prefill replicas on prefill-l40s
    assert layout.pools["g6-spot"].max_nodes == 6  # as the stack file says
    assert layout.pools["prefill-l40s"].max_nodes == 3
    assert layout.pools["prefill-l40s"].models == ("llama-3-8b-prefill",)
    assert "llama-3-8b-prefill" not in layout.pools["g6-spot"].models

    bill = cost.model_cost(decided.spec, layout, "llama-3-8b", EC2_PRICES)
    l4 = EC2_PRICES.hourly(layout.pools["g6-spot"].instance, layout.pools["g6-spot"].capacity_type)
    l40s = EC2_PRICES.hourly(prefill.instance, layout.pools["prefill-l40s"].capacity_type)
    hours = 730
    assert bill.max_usd_month == pytest.approx((2 * l4 + 3 * l40s) * hours, rel=1e-3)
    assert bill.min_usd_month == pytest.approx((0 * l4 + 1 * l40s) * hours, rel=1e-3)

    served = decided.served_spec
    for unit, pool in (("llama-3-8b", "g6-spot"), ("llama-3-8b-prefill", "prefill-l40s")):
        manifests = engine.render(served, decided.units[unit])
        deployment = next(m for m in manifests if m["kind"] == "Deployment")
        assert deployment["spec"]["template"]["spec"]["nodeSelector"]["inferstack.io/pool"] == pool

    (line,) = [line for line in lifecycle.describe(decided.spec, layout, ()) if "disaggregated" in line]
    assert "across pools prefill-l40s (prefill) and g6-spot (decode)" in line
    assert "llama-3-8b-prefill (1-3 replicas, g6e.xlarge" in line
    assert "no fast path between the pools" in line


def test_a_prefill_pool_must_be_a_pool_of_the_stack() -> None:
    raw = _dev()
    raw["models"][0]["disaggregation"]["prefill"]["pool"] = "nowhere"
    with pytest.raises(SpecError, match=r"disaggregation.prefill.pool: unknown pool 'nowhere'"):
        validate(raw, "pd")


def _prod_two_pools(efa: bool, placement_group: bool, transport: str = "auto") -> dict[str, Any]:
    raw = _dev(transport=transport)
    raw["environment"] = "prod"
    raw["gpu_pools"] = [
        {"name": "decode", "instance_type": "p5.48xlarge", "efa": efa, "placement_group": placement_group},
        {"name": "prefill", "instance_type": "p5.48xlarge", "efa": efa, "placement_group": placement_group},
    ]
    raw["models"] = raw["models"][:1]
    raw["models"][0]["pool"] = "decode"
    raw["models"][0]["disaggregation"]["prefill"]["pool"] = "prefill"
    return raw


@pytest.mark.parametrize(
    ("efa", "placement_group", "transport", "missing"),
    [
        (False, True, "auto", "without EFA on pool prefill and decode"),
        (True, False, "auto", "without both pools in one zone"),
        (True, True, "tcp", "without an RDMA transport"),
    ],
)
def test_in_prod_roles_in_two_pools_need_a_fast_path(
    efa: bool, placement_group: bool, transport: str, missing: str
) -> None:
    with pytest.raises(SpecError, match=rf"disaggregation.prefill.pool: in prod, .*{missing}"):
        validate(_prod_two_pools(efa, placement_group, transport), "pd")


def test_in_prod_two_pools_with_efa_in_one_zone_are_a_fast_path_and_other_environments_are_told() -> None:
    decided = validate(_prod_two_pools(efa=True, placement_group=True), "pd")
    (line,) = [
        line for line in lifecycle.describe(decided.spec, decided.layout, ()) if "disaggregated" in line
    ]
    assert "fast path: EFA on both pools, one zone" in line
    raw = _prod_two_pools(efa=False, placement_group=False)
    raw["environment"] = "staging"
    decided = validate(raw, "pd")  # outside prod, the plan says so and lets it be
    (line,) = [
        line for line in lifecycle.describe(decided.spec, decided.layout, ()) if "disaggregated" in line
    ]
    assert "no fast path between the pools" in line


def test_the_plan_table_counts_the_prefill_roles_replicas_and_gpus() -> None:
    from components.cli import report
    from components.clouds.targets import PROFILES
    from components.core.stackfile import Stack

    for raw, instance, gpus in (
        (_dev(), "g6.2xlarge", "5"),  # both roles in g6-spot: 2 decode + 3 prefill replicas of 1 GPU
        (_two_pools(), "g6.2xlarge + g6e.xlarge (prefill)", "5"),
    ):
        decided = validate(raw, "pd")
        stack = Stack("pd", "pd", decided, {}, PROFILES[decided.spec.target])
        (row,) = [r for r in report.plan_report(stack).rows if r[0] == "llama-3-8b"]
        assert row[2] == instance and row[4] == "0-2 + 1-3 prefill" and row[5] == gpus


def test_the_kv_lease_outlasts_every_wait_of_the_router_and_is_one_number_for_router_and_engines() -> None:
    from runtime.config import RouterSettings

    decided = validate(_dev(prefill_timeout_ms=5_000, transfer_timeout_ms=15_000), "pd")
    served = decided.served_spec
    stage = runtime_config.runtime_config(served).models[0].prefill
    assert stage is not None and stage.kv_lease_s is not None
    first_byte_s = RouterSettings().first_byte_timeout_ms / 1000
    # counted from the prefill's sending: the prefill, then the longest wait for the decode's answer head
    assert stage.kv_lease_s >= (stage.timeout_ms / 1000) + max(first_byte_s, stage.transfer_timeout_ms / 1000)
    assert stage.kv_lease_s == 5 + 120 + 10
    for name in ("llama-3-8b", "llama-3-8b-prefill"):
        manifests = engine.render(served, decided.units[name])
        container = next(m for m in manifests if m["kind"] == "Deployment")["spec"]["template"]["spec"]
        args = container["containers"][0]["args"]
        assert _kv_config(args)["kv_connector_extra_config"]["kv_lease_duration"] == stage.kv_lease_s
