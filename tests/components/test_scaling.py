"""Scaling policies: KEDA ScaledObjects (default) and autoscaling/v2 HPAs, thresholds from the spec."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pytest

from components.base.problems import SpecError
from components.core import scaling as core_scaling
from components.core.stackfile import STACKS_DIR, available_stacks
from components.render import scaling
from components.spec import PlatformSpec
from tests.components.helpers import decided, minimal, write_stack
from tests.stacks import load, synthesized

PULUMI_STACKS = [s for s in available_stacks(STACKS_DIR) if load(s).spec.target.value != "local"]


@cache
def _manifests(name: str) -> tuple[dict[str, Any], ...]:
    return tuple(synthesized(name).kubernetes_manifests())


def _by_kind(name: str, kind: str) -> dict[str, dict[str, Any]]:
    return {m["metadata"]["name"]: m for m in _manifests(name) if m["kind"] == kind}


def test_queue_target_defaults_to_a_tenth_of_max_num_seqs_and_ttft_target_is_the_slo() -> None:
    prod = {m.name: m for m in load("prod").spec.models}
    t = core_scaling.thresholds(prod["llama-3-70b"])
    assert t.queue_per_replica == pytest.approx(25.6)  # max_num_seqs 256
    assert t.ttft_p95_s == pytest.approx(1.5)  # slo.ttft_p95_ms 1500
    assert core_scaling.thresholds(prod["llama-3-8b"]).queue_per_replica == pytest.approx(12.8)  # 128
    assert core_scaling.thresholds(prod["llama-3-8b"]).ttft_p95_s == pytest.approx(0.8)
    assert t.scale_down_window_s == 900 and t.scale_up_window_s == 30


def test_an_explicit_queue_target_wins_and_a_tiny_engine_still_scales_on_one_waiting_request() -> None:
    raw = minimal()
    raw["models"][0]["scaling"]["queue_per_replica"] = 7
    assert core_scaling.thresholds(PlatformSpec.model_validate(raw).models[0]).queue_per_replica == 7
    raw = minimal()
    raw["models"][0]["engine"]["max_num_seqs"] = 4
    assert core_scaling.thresholds(PlatformSpec.model_validate(raw).models[0]).queue_per_replica == 1


@pytest.mark.parametrize("name", PULUMI_STACKS)
def test_every_scaling_model_gets_a_scaled_object_that_follows_its_spec(name: str) -> None:
    spec, _ = load(name).served
    scaled = _by_kind(name, "ScaledObject")
    deployments = {**_by_kind(name, "Deployment"), **_by_kind(name, "LeaderWorkerSet")}
    for model in spec.models:
        engine = f"{model.name}-engine"
        if model.scaling.min_replicas == model.scaling.max_replicas:
            assert engine not in scaled
            assert deployments[engine]["spec"]["replicas"] == model.scaling.min_replicas
            continue
        obj = scaled[engine]["spec"]
        assert "replicas" not in deployments[engine]["spec"], "the scaler owns the replica count"
        workload = deployments[engine]
        assert obj["scaleTargetRef"] == {
            "apiVersion": workload["apiVersion"],
            "kind": workload["kind"],
            "name": engine,
        }
        assert obj["minReplicaCount"] == model.scaling.min_replicas
        assert obj["maxReplicaCount"] == model.scaling.max_replicas
        assert obj["cooldownPeriod"] == model.scaling.idle_before_zero_s
        behavior = obj["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        assert behavior["scaleUp"]["stabilizationWindowSeconds"] == model.scaling.scale_up_stabilization_s
        assert behavior["scaleDown"]["stabilizationWindowSeconds"] == model.scaling.scale_down_stabilization_s
        assert behavior["scaleDown"]["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 120}]
        t = core_scaling.thresholds(model)
        triggers = {tr["name"]: tr for tr in obj["triggers"]}
        assert {"queued", "router-queue", "kv-cache", "ttft-p95"} <= set(triggers)
        for trigger in triggers.values():
            assert trigger["type"] == "prometheus"
            meta = trigger["metadata"]
            assert meta["serverAddress"].startswith("http://") and meta["query"]
            assert meta["activationThreshold"] == "0"
            float(meta["threshold"])  # KEDA parses thresholds as numbers
        assert float(triggers["queued"]["metadata"]["threshold"]) == pytest.approx(t.queue_per_replica)
        assert triggers["queued"]["metricType"] == "AverageValue"
        assert float(triggers["kv-cache"]["metadata"]["threshold"]) == model.scaling.kv_cache_usage_target
        assert float(triggers["ttft-p95"]["metadata"]["threshold"]) == pytest.approx(
            model.slo.ttft_p95_ms / 1000
        )
        assert f'model="{model.name}"' in triggers["router-queue"]["metadata"]["query"]


def test_scale_to_zero_models_wake_on_the_router_queue_and_sleep_after_their_idle_period() -> None:
    spec = load("dev").spec
    scaled = _by_kind("dev", "ScaledObject")
    for model in spec.models:
        assert model.scaling.min_replicas == 0
        obj = scaled[f"{model.name}-engine"]["spec"]
        assert obj["minReplicaCount"] == 0
        assert obj["cooldownPeriod"] == model.scaling.idle_before_zero_s
        router = next(t for t in obj["triggers"] if t["name"] == "router-queue")
        query = router["metadata"]["query"]
        assert "inferstack_router_queue_depth" in query
        # With zero replicas the router refuses at once (503 no_backend): that refusal is demand too.
        assert 'reason="no_backend"' in query and f'model="{model.name}"' in query


def test_sglang_triggers_use_sglang_metric_names() -> None:
    scaled = _by_kind("dev", "ScaledObject")["qwen-7b-sglang-engine"]["spec"]
    queries = " ".join(t["metadata"]["query"] for t in scaled["triggers"])
    assert "sglang:num_queue_reqs" in queries and "sglang:token_usage" in queries
    assert "vllm:" not in queries


def test_hpa_mode_renders_autoscaling_v2_hpas_and_adapter_rules_instead_of_scaled_objects() -> None:
    raw = minimal()
    raw["addons"] = {"autoscaler": "hpa"}
    spec = PlatformSpec.model_validate(raw)
    model = spec.models[0]
    [hpa] = scaling.render(spec, decided(spec).models[model.name])
    assert hpa["apiVersion"] == "autoscaling/v2" and hpa["kind"] == "HorizontalPodAutoscaler"
    assert hpa["spec"]["minReplicas"] == 1 and hpa["spec"]["maxReplicas"] == 2
    metrics = {m.get("pods", m.get("object", {}))["metric"]["name"]: m for m in hpa["spec"]["metrics"]}
    queued = metrics["inferstack_vllm_queued"]["pods"]["target"]
    assert queued == {"type": "AverageValue", "averageValue": "6400m"}  # 10% of max_num_seqs 64
    assert metrics["inferstack_vllm_kv_cache"]["pods"]["target"]["averageValue"] == "850m"
    assert metrics["inferstack_vllm_ttft_p95"]["object"]["target"] == {"type": "Value", "value": "2000m"}
    rules = scaling.adapter_rules(spec)
    assert {r["name"]["as"] for r in rules} == set(metrics)
    for rule in rules:
        assert "<<.Series>>" in rule["metricsQuery"] and "<<.LabelMatchers>>" in rule["metricsQuery"]


def test_hpa_mode_cannot_scale_to_zero_and_says_so(tmp_path: Path) -> None:
    raw = minimal()
    raw["addons"] = {"autoscaler": "hpa"}
    raw["models"][0]["scaling"]["min_replicas"] = 0
    write_stack(tmp_path, "zero", raw)
    with pytest.raises(SpecError) as err:
        load("zero", tmp_path)
    message = err.value.render()
    assert "hpa cannot scale to zero" in message and "llama-8b" in message and "Traceback" not in message


def test_fixed_size_models_have_no_scaler() -> None:
    raw = minimal()
    raw["models"][0]["scaling"] = {"min_replicas": 2, "max_replicas": 2}
    spec = PlatformSpec.model_validate(raw)
    assert scaling.render(spec, decided(spec).models[spec.models[0].name]) == []


@pytest.mark.parametrize("name", PULUMI_STACKS)
def test_every_engine_has_a_disruption_budget(name: str) -> None:
    budgets = _by_kind(name, "PodDisruptionBudget")
    for model in load(name).served[0].models:
        budget = budgets[f"{model.name}-engine"]["spec"]
        assert budget["maxUnavailable"] == 1
        assert budget["selector"]["matchLabels"]["app.kubernetes.io/name"] == f"{model.name}-engine"


@pytest.mark.parametrize("autoscaler", ["keda", "hpa"])
def test_built_in_scaling_objects_pass_strict_validation_in_both_modes(autoscaler: str) -> None:
    import kubernetes_validate

    raw = minimal()
    raw["addons"] = {"autoscaler": autoscaler}
    spec = PlatformSpec.model_validate(raw)
    version = f"{spec.cluster.kubernetes_version}.0"
    for unit in decided(spec).models.values():
        for manifest in scaling.render(spec, unit):
            if manifest["apiVersion"].startswith("keda.sh/"):
                continue  # a custom resource: its fields are checked above
            kubernetes_validate.validate(manifest, version, strict=True)


def test_replicas_wanted_is_what_keda_and_its_hpa_settle_on() -> None:
    """The one decision the ScaledObject's thresholds express and `make local`'s autoscaler runs."""
    spec = PlatformSpec.model_validate(minimal())
    model = spec.models[0].model_copy(
        update={"scaling": spec.models[0].scaling.model_copy(update={"min_replicas": 0, "max_replicas": 4})}
    )
    t = core_scaling.thresholds(model)
    assert (t.activation, t.queue_per_replica, t.idle_before_zero_s, t.scale_down_window_s) == (
        0,
        6.4,
        900,
        600,
    )
    wanted = core_scaling.replicas_wanted
    assert wanted(t, demand=0, current=0, idle_s=10_000) == 0  # nothing waits: stays at zero
    assert wanted(t, demand=1, current=0, idle_s=0) == 1  # one waiting request wakes it
    assert wanted(t, demand=13, current=1, idle_s=0) == 3  # ceil(13 / 6.4)
    assert wanted(t, demand=100, current=1, idle_s=0) == 4  # never above max_replicas
    assert wanted(t, demand=1, current=3, idle_s=0) == 3  # less demand does not remove replicas ...
    assert wanted(t, demand=0, current=3, idle_s=599) == 3  # ... nor idleness shorter than the window
    assert wanted(t, demand=0, current=3, idle_s=600) == 1  # the HPA's scale-down stabilisation
    assert wanted(t, demand=0, current=1, idle_s=899) == 1
    assert wanted(t, demand=0, current=3, idle_s=900) == 0  # KEDA's cooldown: straight to zero
    floor = model.model_copy(update={"scaling": model.scaling.model_copy(update={"min_replicas": 2})})
    assert wanted(core_scaling.thresholds(floor), demand=0, current=4, idle_s=10_000) == 2  # never below min


def test_the_scaled_object_renders_the_same_thresholds() -> None:
    spec = load("dev").spec
    for model in spec.models:
        t = core_scaling.thresholds(model)
        obj = _by_kind("dev", "ScaledObject")[f"{model.name}-engine"]["spec"]
        assert obj["cooldownPeriod"] == t.idle_before_zero_s and obj["minReplicaCount"] == t.min_replicas
        assert {trig["metadata"]["activationThreshold"] for trig in obj["triggers"]} == {f"{t.activation:g}"}
        router = next(trig for trig in obj["triggers"] if trig["name"] == "router-queue")
        assert router["metadata"]["threshold"] == f"{t.queue_per_replica:g}"


def test_the_router_holds_requests_only_for_models_that_scale_from_zero() -> None:
    from components.render.runtime_config import runtime_config

    for stack in ("dev", "prod"):
        spec = load(stack).spec
        config = runtime_config(spec)
        for model in spec.models:
            hold = config.route(model.name).cold_start_hold_ms
            assert hold == (model.scaling.cold_start_hold_ms if model.scaling.min_replicas == 0 else 0)
    assert all(load("dev").spec.models[i].scaling.min_replicas == 0 for i in range(2))


@pytest.mark.parametrize(
    ("scaling_", "slo", "message"),
    [
        (
            {"min_replicas": 0, "max_replicas": 1, "cold_start_hold_ms": 150_000},
            {},
            "cold_start_hold_ms (150000) is longer than the router's first-byte timeout (120000 ms)",
        ),
        (
            {"min_replicas": 1, "max_replicas": 2, "cold_start_hold_ms": 5_000},
            {},
            "has no effect with min_replicas 1",
        ),
        (
            {"min_replicas": 0, "max_replicas": 1},
            {"allow_cold_starts": False},
            "but slo.allow_cold_starts is false; set min_replicas to at least 1",
        ),
    ],
)
def test_scale_from_zero_mistakes_are_one_clear_line(
    tmp_path: Path, scaling_: dict, slo: dict, message: str
) -> None:
    raw = minimal()
    raw["models"][0]["scaling"] = scaling_
    raw["models"][0]["slo"] = slo
    write_stack(tmp_path, "bad", raw)
    with pytest.raises(SpecError) as err:
        load("bad", tmp_path)
    text = err.value.render()
    assert message in text and "models[0]" in text and len(text.splitlines()) == 1, text
