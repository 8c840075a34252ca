"""LoRA adapters in the spec: located errors for every mistake, memory in the fit, the plan's note, the engine
command line and environment, the init containers that fetch them, and the router's config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from components.base import sizing
from components.base.problems import SpecError
from components.cli.report import adapters_note
from components.core import placement
from components.render.engine_args import vllm
from components.render.runtime_config import runtime_config
from components.spec import PlatformSpec
from tests.components.helpers import minimal, rendered_engine_deployment, write_stack
from tests.stacks import load

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
STORE = "inferstack-test-us-east-1-models"  # MINIMAL's model store on eks
S3 = {"name": "support", "source": f"s3://{STORE}/models/adapters/support/v3/", "rank": 8}


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
            _with_adapters({**S3, "revision": COMMIT}),
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
        (
            _with_adapters({**SQL, "revision": "v1.0"}),
            "models[0].adapters[0].revision",
            ["'v1.0' is not a commit hash", "never a branch or tag that moves"],
        ),
        (
            _with_adapters({k: v for k, v in SQL.items() if k != "revision"}),
            "models[0].adapters[0].revision",
            ["copied into the model store at a pinned commit", "it has no revision"],
        ),
        (
            _with_adapters({**S3, "source": "s3://someone-else/support/"}),
            "models[0].adapters[0].source",
            ["'someone-else' is not the platform's model store", STORE],
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
        "tag",
        "unpinned-on-cluster",
        "foreign-bucket",
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


def test_adapters_come_from_the_model_store_where_the_router_loads_them_from() -> None:
    """Engine pods never reach the hub: a hub adapter is copied into the store by its own preparation Job (at its
    commit), an s3:// one is verified there, and init containers fetch each from the store into the pod."""
    from components.render import weights

    spec = PlatformSpec.model_validate(_with_adapters(SQL, S3))
    pod = rendered_engine_deployment(spec)["spec"]["template"]["spec"]
    inits = {c["name"]: c for c in pod["initContainers"]}
    hub_uri = f"s3://{STORE}/models/acme/sql-lora/{COMMIT}/"
    for name, uri in (("fetch-adapter-0", hub_uri), ("fetch-adapter-1", S3["source"])):
        args = inits[name]["args"]
        assert (
            args[:3] == ["fetch", "--store", uri]
            and args[args.index("--cache-root") + 1] == weights.ADAPTER_DIR
        )
        assert inits[name]["image"] == inits["check-weights"]["image"]  # the weights image, not the engine's
        assert "command" not in inits[name]  # no shell, no hub client: the weights tool's fetch only
    engine = pod["containers"][0]
    assert {"name": "adapters", "mountPath": weights.ADAPTER_DIR, "readOnly": True} in engine["volumeMounts"]
    assert any(v["name"] == "adapters" and "emptyDir" in v for v in pod["volumes"])
    targets = {a.name: a.path for a in runtime_config(spec).models[0].adapters}
    assert targets == {
        "sql-helper": f"{weights.ADAPTER_DIR}/{STORE}/models/acme/sql-lora/{COMMIT}",
        "support": f"{weights.ADAPTER_DIR}/{STORE}/models/adapters/support/v3",
    }
    assert runtime_config(spec).models[0].max_adapters_per_replica == 4
    model = spec.models[0]
    hub_job, s3_job = (weights.adapter_job(spec, model, a, "weights:1") for a in model.adapters)
    hub_args = hub_job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert hub_args[:7] == ["prepare", "--to", hub_uri, "--hub", "acme/sql-lora", "--revision", COMMIT]
    assert s3_job["spec"]["template"]["spec"]["containers"][0]["args"][:3] == [
        "verify",
        "--store",
        S3["source"],
    ]


def test_the_plan_prepares_each_adapter_and_only_its_jobs_reach_the_hub() -> None:
    """Through the whole program (the prod stack serves two hub adapters): one Job per adapter beside the model's,
    engines depend on all of them, and in the flow table only the preparation Jobs reach the hub.
    (tests/policies: every rule, weights-from-pinned-store included, passes on it; tests/components/test_network:
    the rendered NetworkPolicies allow exactly the table.)"""
    from components.clouds.targets import cloud_for
    from components.deploy import synthesis as plan
    from components.render import flows, weights

    stack = load("prod")
    spec = stack.spec
    jobs = {
        m["metadata"]["name"] for m in plan.synthesize(stack).kubernetes_manifests() if m["kind"] == "Job"
    }
    model = next(m for m in spec.models if m.adapters)
    assert {weights.adapter_job_name(spec, model, a) for a in model.adapters} <= jobs
    assert len(jobs) == len(spec.models) + len(model.adapters)
    table = flows.flows(spec, cloud_for(spec), placement.place(spec))
    to_hub = [f for f in table if "hub" in f.dest.name]
    assert [f.source.name for f in to_hub] == [flows.WEIGHTS] and "LoRA adapters" in to_hub[0].why
    assert any(f.source.name == flows.ENGINE and "LoRA adapters" in f.why for f in table)


def test_group_pods_get_the_lora_flags_environment_and_adapters(tmp_path: Path) -> None:
    """A replica that spans nodes: every pod of the group (leader and workers) runs with LoRA on and holds the
    adapters (each worker loads its shard of an adapter from its own disk)."""
    import yaml

    from components.deploy import synthesis as plan
    from components.render import weights
    from tests.components.helpers import engine_workloads, pod_templates

    doc = yaml.safe_load(Path("stacks/Pulumi.prod-405b.yaml").read_text())
    doc["config"]["inferstack:platform"]["models"][0]["adapters"] = [
        {
            "name": "big-sql",
            "source": "s3://inferstack-405b-us-east-1-models/models/adapters/sql/",
            "rank": 16,
        }
    ]
    (tmp_path / "Pulumi.lora-405b.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    lws = engine_workloads(plan.synthesize(load("lora-405b", tmp_path)))["llama-3-405b"]
    assert lws["kind"] == "LeaderWorkerSet"
    for role, template in pod_templates(lws).items():
        container = template["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert "--enable-lora" in container["args"], role
        assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True", role
        assert any(m["mountPath"] == weights.ADAPTER_DIR for m in container["volumeMounts"]), role
        assert [c["name"] for c in template["spec"]["initContainers"]][-1] == "fetch-adapter-0", role
        assert "inferstack.io/lora-adapters" in template["metadata"]["annotations"], role


def test_models_without_adapters_render_the_same_router_config() -> None:
    dumped = runtime_config(PlatformSpec.model_validate(minimal())).to_yaml()
    assert "adapters" not in dumped and "adapter_load_backoff_ms" not in dumped


def test_a_moving_revision_gets_one_answer_for_a_model_a_version_and_an_adapter(tmp_path: Path) -> None:
    """One rule for hub revisions (components.spec.hub_commit): a tag is refused for a model, an adapter and a
    model version alike, each at its own path and in the same words."""
    spec = _with_adapters({**SQL, "revision": "v1.0"})
    spec["models"][0]["revision"] = "main"
    write_stack(tmp_path, "bad", spec)
    with pytest.raises(SpecError) as caught:
        load("bad", tmp_path)
    rendered = caught.value.render()
    for path, tag in (("models[0].revision", "main"), ("models[0].adapters[0].revision", "v1.0")):
        assert f": {path}: '{tag}' is not a commit hash: pin the exact hub commit" in rendered, rendered
    versioned = minimal()
    versioned["models"][0]["versions"] = [
        {"name": "v1", "weight": 90},
        {"name": "v2", "weight": 10, "source": "acme/llama-next", "revision": "v2"},
    ]
    versioned["models"][0]["rollout"] = {"canary": {"steps_percent": [10, 100], "evaluation_interval_s": 30}}
    write_stack(tmp_path, "bad", versioned)
    with pytest.raises(SpecError) as version:
        load("bad", tmp_path)
    assert (
        "versions[1].revision: 'v2' is not a commit hash: pin the exact hub commit" in version.value.render()
    )
