"""LoRA adapters in the spec: located errors for every mistake, memory in the fit, the plan's note, the engine
command line and environment, the init containers that fetch them, and the router's config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from components import placement, sizing
from components.problems import SpecError
from components.render.engine_args import ADAPTER_DIR, vllm
from components.render.runtime_config import runtime_config
from components.report import adapters_note
from components.spec import PlatformSpec
from components.stackfile import load
from tests.components.helpers import minimal, rendered_engine_deployment, write_stack

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _with_adapters(
    *adapters: dict[str, Any], lora: dict[str, Any] | None = None, **engine: Any
) -> dict[str, Any]:
    spec = minimal()
    model = spec["models"][0]
    model["adapters"] = list(adapters)
    if lora is not None:
        model["engine"]["lora"] = lora
    model["engine"].update(engine)
    return spec


SQL = {"name": "sql-helper", "source": "acme/sql-lora", "revision": COMMIT, "rank": 16}
S3 = {"name": "support", "source": "s3://acme-adapters/support/v3/", "rank": 8}


@pytest.mark.parametrize(
    ("spec", "path", "words"),
    [
        (
            _with_adapters({**SQL, "rank": 32}),
            "models[0]",
            ["adapters[0].rank", "rank 32", "max_rank 16", "raise max_rank to at least 32"],
        ),
        (
            _with_adapters(SQL, lora={"max_rank": 24}),
            "models[0]",
            ["max_rank", "vLLM 0.32.0 accepts", "not 24"],
        ),
        (
            _with_adapters(SQL, kind="sglang"),
            "models[0]",
            ["SGLang 0.5.3", "engine.kind sglang", "kind: vllm"],
        ),
        (
            _with_adapters(SQL, kind="trtllm"),
            "models[0]",
            ["TensorRT-LLM 1.0.0", "kind: vllm"],
        ),
        (_with_adapters(SQL, SQL), "models[0]", ["adapters[1].name", "used twice"]),
        (_with_adapters({**SQL, "name": "llama-8b"}), "models[0].adapters[0].name", ["also a model's name"]),
        (
            _with_adapters({**S3, "revision": "abc"}),
            "models[0].adapters[0]",
            ["revision applies to Hugging Face"],
        ),
        (
            _with_adapters({**S3, "source": "./adapters/support"}),
            "models[0].adapters[0].source",
            ["only works with target: local", "S3"],
        ),
        (
            _with_adapters(SQL, lora={"max_per_batch": 4, "max_loaded": 2}),
            "models[0].engine.lora",
            ["max_loaded (2)"],
        ),
    ],
    ids=[
        "rank",
        "max-rank",
        "sglang",
        "trtllm",
        "twice",
        "model-name",
        "s3-revision",
        "local-on-eks",
        "loaded",
    ],
)
def test_adapter_mistakes_get_located_messages(
    tmp_path: Path, spec: dict[str, Any], path: str, words: list[str]
) -> None:
    write_stack(tmp_path, "bad", spec)
    with pytest.raises(SpecError) as caught:
        load("bad", tmp_path)
    rendered = caught.value.render()
    assert f": {path}" in rendered, rendered
    for word in words:
        assert word in rendered, rendered


def test_lora_limits_without_adapters_are_refused(tmp_path: Path) -> None:
    spec = minimal()
    spec["models"][0]["engine"]["lora"] = {"max_rank": 32}
    write_stack(tmp_path, "bad", spec)
    with pytest.raises(SpecError, match=r"engine\.lora has no effect"):
        load("bad", tmp_path)


def test_adapter_names_are_unique_across_models(tmp_path: Path) -> None:
    spec = _with_adapters(SQL)
    spec["models"].append({**spec["models"][0], "name": "llama-8b-b", "adapters": [SQL]})
    write_stack(tmp_path, "bad", spec)
    with pytest.raises(SpecError) as caught:
        load("bad", tmp_path)
    assert "models[1].adapters[0].name: 'sql-helper' is also an adapter of llama-8b" in caught.value.render()


def test_cpu_adapters_need_float32() -> None:
    spec = _with_adapters(S3, device="cpu")
    with pytest.raises(ValueError, match="float32"):
        PlatformSpec.model_validate(spec)


def test_adapter_slots_take_memory_from_the_kv_cache() -> None:
    plain = PlatformSpec.model_validate(minimal())
    with_lora = PlatformSpec.model_validate(
        _with_adapters(SQL, S3, lora={"max_rank": 64, "max_per_batch": 8})
    )
    before = placement.place(plain).placements["llama-8b"].fit
    after = placement.place(with_lora).placements["llama-8b"].fit
    assert before is not None and after is not None
    assert before.adapters_gib == 0
    # Llama-3.1-8B: 8 slots x rank 64 x 32 layers x (9 x 4096 + 2 x 1024 + 3 x 14336) x 2 bytes = 2.5 GiB
    assert after.adapters_gib == pytest.approx(8 * 64 * 32 * 81920 * 2 / sizing.GIB, rel=0.02)
    assert after.kv_budget_gib == pytest.approx(before.kv_budget_gib - after.adapters_gib)
    assert any("adapters" in line and "LoRA slots" in line for line in after.lines())
    note = adapters_note(with_lora.models[0], placement.place(with_lora).placements["llama-8b"])
    assert "sql-helper (rank 16)" in note and "8 slots at rank 64" in note and "GiB per GPU" in note


def test_vllm_gets_lora_flags_and_runtime_loading() -> None:
    spec = PlatformSpec.model_validate(
        _with_adapters(SQL, lora={"max_rank": 16, "max_per_batch": 2, "max_loaded": 6})
    )
    cmd = vllm(spec.models[0])
    args = cmd.args
    assert "--enable-lora" in args
    assert args[args.index("--max-loras") + 1] == "2"
    assert args[args.index("--max-lora-rank") + 1] == "16"
    assert args[args.index("--max-cpu-loras") + 1] == "6"
    assert cmd.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    plain = vllm(PlatformSpec.model_validate(minimal()).models[0])
    assert "--enable-lora" not in plain.args and "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in plain.env


def test_init_containers_fetch_each_adapter_where_the_router_loads_it_from() -> None:
    spec = PlatformSpec.model_validate(_with_adapters(SQL, S3))
    pod = rendered_engine_deployment(spec)["spec"]["template"]["spec"]
    fetch = {c["name"]: c for c in pod["initContainers"]}
    hub, s3 = fetch["fetch-adapter-0"], fetch["fetch-adapter-1"]
    assert hub["command"][-3:] == ["acme/sql-lora", COMMIT, f"{ADAPTER_DIR}/sql-helper"]
    assert s3["command"] == [
        "aws",
        "s3",
        "sync",
        "--only-show-errors",
        S3["source"],
        f"{ADAPTER_DIR}/support",
    ]
    targets = {a.name: a.path for a in runtime_config(spec).models[0].adapters}
    assert targets == {"sql-helper": f"{ADAPTER_DIR}/sql-helper", "support": f"{ADAPTER_DIR}/support"}
    assert runtime_config(spec).models[0].max_adapters_per_replica == 4


def test_models_without_adapters_render_the_same_router_config() -> None:
    dumped = runtime_config(PlatformSpec.model_validate(minimal())).to_yaml()
    assert "adapters" not in dumped and "adapter_load_backoff_ms" not in dumped
