"""Every metric a trigger, adapter rule, alert or dashboard reads is one its engine exports.

The engines' metric names are one table (``runtime.engines``): vLLM's are checked against a real engine's
``/metrics`` (tests/integration/test_engine_signals.py), SGLang's and TensorRT-LLM's against the pinned
versions' source (cited there). These tests hold the renderers to that table: with KEDA's
``ignoreNullValues`` a trigger on a metric the engine lacks reads 0, and the model never scales on it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from components.cli.main import app
from components.core.decisions import ModelDecisions
from components.render import alerts, monitors, scaling
from components.spec import ModelSpec, PlatformSpec
from runtime.config import EngineKind
from runtime.engines import facts
from tests.components.helpers import (
    OTHER_SOURCES,
    decided,
    engine_name_of,
    metric_names,
    minimal,
    model_queries,
    rendered_engine_deployment,
    write_stack,
)


def _spec(kind: str, autoscaler: str = "keda", **model: Any) -> PlatformSpec:
    raw = minimal()
    raw["models"][0]["engine"]["kind"] = kind
    raw["models"][0].update(model)
    raw["addons"] = {"autoscaler": autoscaler}
    return PlatformSpec.model_validate(raw)


SPECS = [
    ("vllm", "keda"),
    ("vllm", "hpa"),
    ("sglang", "keda"),
    ("sglang", "hpa"),
    ("trtllm", "keda"),
]


def reads_outside_the_table(spec: PlatformSpec, model: ModelSpec) -> list[str]:
    table = {n for names in facts(model.engine.kind).metrics.values() for n in names}
    out = []
    for source, exprs in model_queries(spec, model).items():
        for expr in exprs:
            for name in metric_names(expr):
                if not OTHER_SOURCES.match(name) and engine_name_of(name) not in table:
                    out.append(
                        f"{source} reads {name}, which {facts(model.engine.kind).display_name} does not export"
                    )
    return out


@pytest.mark.parametrize(("kind", "autoscaler"), SPECS)
def test_every_query_of_a_model_reads_only_metrics_its_engine_exports(kind: str, autoscaler: str) -> None:
    spec = _spec(kind, autoscaler)
    model = spec.models[0]
    assert not reads_outside_the_table(spec, model)
    assert sum(len(q) for q in model_queries(spec, model).values()) >= 4


def test_a_trigger_on_a_metric_the_engine_lacks_is_caught() -> None:
    """The check above fails where it should: a trigger reading a name outside the engine's table."""
    spec = _spec("sglang")
    model = spec.models[0]
    rogue = scaling.Trigger("rogue", "sum(sglang:num_waiting_reqs)", 1, "AverageValue")
    original = scaling.triggers
    try:
        scaling.triggers = lambda s, u: [*original(s, u), rogue]  # type: ignore[assignment]
        assert reads_outside_the_table(spec, model) == [
            "trigger reads sglang:num_waiting_reqs, which SGLang does not export"
        ]
    finally:
        scaling.triggers = original


def test_trtllm_scales_on_the_router_queue_alone_and_has_no_engine_scrape() -> None:
    spec = _spec("trtllm")
    model = spec.models[0]
    unit = decided(spec).models[model.name]
    assert [t.name for t in scaling.triggers(spec, unit)] == ["router-queue"]
    [scaled] = scaling.render(spec, unit)
    assert [t["name"] for t in scaled["spec"]["triggers"]] == ["router-queue"]
    # No engine is scraped: only the runtime services (and the router's own metrics listener) are.
    assert [m["metadata"]["name"] for m in monitors.render(spec)] == [
        "inferstack-runtime",
        "inferstack-router",
    ]
    names = {a.name for a in alerts.model_alerts(spec, unit)}
    assert "InferenceEngineDown" not in names and "InferenceEngineReplicasBelowMin" in names
    assert scaling.scaling_note(spec, unit) == (
        "llama-8b: TensorRT-LLM exports no queued, kv_usage, ttft metric; it scales on router-queue only"
    )
    assert scaling.scaling_note(*_two(_spec("vllm"))) is None


def _two(spec: PlatformSpec) -> tuple[PlatformSpec, ModelDecisions]:
    return spec, decided(spec).models[spec.models[0].name]


def test_plan_says_what_a_trtllm_model_scales_on(tmp_path: Path) -> None:
    raw = minimal()
    raw["models"][0]["engine"]["kind"] = "trtllm"
    write_stack(tmp_path, "trt", raw)
    result = CliRunner().invoke(
        app, ["plan", "-s", "trt", "--stacks-dir", str(tmp_path), "--out", str(tmp_path / "out")]
    )
    assert result.exit_code in (0, 1), result.output
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "TensorRT-LLM exports no queued, kv_usage, ttft metric; it scales on router-queue only" in summary


@pytest.mark.parametrize("kind", [k.value for k in EngineKind])
def test_a_node_cache_copy_is_served_under_its_models_own_name(kind: str) -> None:
    llama_8b = {"params_b": 8, "layers": 32, "kv_heads": 8, "head_dim": 128, "hidden_size": 4096}
    spec = _spec(
        kind,
        source="s3://inferstack-test-us-east-1-models/models/llama-8b/v1/",
        revision=None,
        architecture=llama_8b,
        weights={"fetch": "node-cache"},
    )
    model = spec.models[0]
    deployment = rendered_engine_deployment(spec)
    pod = deployment["spec"]["template"]["spec"]
    [fill] = pod["initContainers"]
    assert fill["args"][:3] == ["fetch", "--store", model.source]
    container = pod["containers"][0]
    args = container["args"]
    cli = facts(model.engine.kind).cli
    location = (
        args[len(cli.leading_args)]
        if cli.model_positional or cli.model is None
        else args[args.index(cli.model.name) + 1]
    )
    assert location == "/models/llama-8b"  # the node's copy, mounted at a directory named after the model
    assert {m["mountPath"] for m in container["volumeMounts"]} >= {"/models/llama-8b"}
    served = facts(model.engine.kind).cli.served_name
    if served is not None:
        assert args[args.index(served.name) + 1] == "llama-8b"
    # trtllm-serve has no served-name flag: it serves a local directory under its base name.
    assert location.rsplit("/", 1)[-1] == model.name
