"""The process plan and the local runtime config: pure functions, no processes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from components.core.stackfile import Stack
from components.local.plan import (
    HOST,
    LocalOptions,
    PlanError,
    banner,
    build_plan,
    describe,
    model_preps,
    pick_cpus,
)
from components.local.supervisor import StartError, check_ports_free
from components.render.runtime_config import runtime_config
from runtime.config import Task
from tests.stacks import load, validate

REPO = Path(__file__).resolve().parents[2]


def local_stack() -> Stack:
    return load("local", REPO / "stacks")


def stack_from(raw: dict) -> Stack:
    return Stack(
        name="test",
        source="stacks/Pulumi.test.yaml",
        decisions=validate(raw, "stacks/Pulumi.test.yaml"),
        config={},
    )


def raw_local() -> dict:
    doc = yaml.safe_load((REPO / "stacks" / "Pulumi.local.yaml").read_text())
    return doc["config"]["inferstack:platform"]


def test_the_local_stack_plans_engines_then_health_batcher_router() -> None:
    stack = local_stack()
    plan = build_plan(stack, LocalOptions(cpus=(0, 1)), REPO)
    assert [e.name for e in plan.engines] == [
        "smollm2-135m-instruct-0",
        "smollm2-135m-instruct-1",
        "all-minilm-l6-v2-0",
    ]
    assert [e.port for e in plan.engines] == [8000, 8001, 8002]
    assert [e.cpu_cores for e in plan.engines] == ["0", "1", "0"]  # each engine its own core, in turn
    assert [e.spec.resolved_task() for e in plan.engines] == [Task.GENERATE, Task.GENERATE, Task.EMBED]
    assert [s.name for s in plan.services] == ["health", "batcher", "batches", "router"]
    assert [s.restart for s in plan.services] == [False, False, True, False]  # the batch service restarts
    assert plan.router.port == 8080
    assert plan.base_url == "http://127.0.0.1:8080/v1"
    models = {m.name: m for m in stack.spec.models}
    assert all(e.spec == models[e.model] for e in plan.engines)  # every replica runs its model's spec
    assert all(p.generate for p in plan.models)  # under .cache/models: made when missing
    assert len(describe(plan)) == 1 + 3 + 4


def test_local_config_is_the_cluster_config_with_local_addresses() -> None:
    stack = local_stack()
    plan = build_plan(
        stack, LocalOptions(router_port=9000, health_port=9001, batcher_port=9002, engine_port=9100), REPO
    )
    local = plan.config
    cluster = runtime_config(stack.spec)
    # Same renderer: routes, strategies, batching, caps are identical; only addresses differ.
    assert [r.strategy for r in local.router.routes] == [r.strategy for r in cluster.router.routes]
    assert local.batcher.policies == cluster.batcher.policies
    assert [
        (m.name, m.task, m.max_concurrency_per_backend, m.max_model_len_tokens) for m in local.models
    ] == [(m.name, m.task, m.max_concurrency_per_backend, m.max_model_len_tokens) for m in cluster.models]
    assert all(m.discovery is not None for m in cluster.models)
    assert all(m.discovery is None for m in local.models)
    urls = {m.name: [str(b.url).rstrip("/") for b in m.static_backends] for m in local.models}
    assert urls == {
        "smollm2-135m-instruct": ["http://127.0.0.1:9100", "http://127.0.0.1:9101"],
        "all-minilm-l6-v2": ["http://127.0.0.1:9102"],
    }
    assert (local.router.host, local.router.port) == (HOST, 9000)
    assert (local.health.host, local.health.port) == (HOST, 9001)
    assert (local.batcher.host, local.batcher.port) == (HOST, 9002)
    assert str(local.router.health_feed_url) == "http://127.0.0.1:9001/v1/backends"
    embed = next(r for r in local.router.routes if r.model == "all-minilm-l6-v2")
    assert str(embed.batcher_url).rstrip("/") == "http://127.0.0.1:9002"
    assert local.health.kubernetes_events is False and local.health.remediate_after_s is None
    assert {m.task for m in local.models} == {Task.GENERATE, Task.EMBED}
    # the batch service: the cluster's settings, this machine's addresses, state under the state dir
    assert local.batches is not None and cluster.batches is not None
    assert str(local.router.batches_url).rstrip("/") == "http://127.0.0.1:8083"
    assert (local.batches.host, local.batches.port, local.batches.metrics_port) == (HOST, 8083, None)
    assert str(local.batches.router_url).rstrip("/") == "http://127.0.0.1:9000"
    assert str(local.batches.health_feed_url) == "http://127.0.0.1:9001/v1/backends"
    assert local.batches.state_dir == (Path(".local") / "batches").absolute()
    assert local.batches.s3 is None and local.batches.max_file_bytes == cluster.batches.max_file_bytes


def test_no_embedding_model_means_no_batcher_and_min_replicas_zero_starts_none() -> None:
    """A model that scales from zero: every replica up to max_replicas is planned (its port reserved) and
    started on demand; the router finds them in the autoscaler's endpoints file and holds requests meanwhile."""
    raw = raw_local()
    raw["models"] = [raw["models"][0]]
    raw["models"][0]["scaling"] = {"min_replicas": 0, "max_replicas": 2, "cold_start_hold_ms": 100_000}
    plan = build_plan(stack_from(raw), LocalOptions(state_dir=Path("/tmp/st")), REPO)
    assert [s.name for s in plan.services] == ["health", "batches", "router"]
    assert [(e.name, e.on_demand) for e in plan.engines] == [
        ("smollm2-135m-instruct-0", True),
        ("smollm2-135m-instruct-1", True),
    ]
    assert plan.always_on == ()
    target = plan.config.models[0]
    assert target.static_backends == [] and target.discovery is not None
    assert target.discovery.model_dump() == {
        "path": Path("/tmp/st/endpoints.json"),
        "service": "smollm2-135m-instruct-engine",
        "poll_interval_ms": 500,
    }
    assert plan.config.route("smollm2-135m-instruct").cold_start_hold_ms == 100_000
    text = banner(plan, 1.0, detached=False)
    assert (
        "embeddings" not in text
        and "smollm2-135m-instruct: the first request waits while an engine starts" in text
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (LocalOptions(router_port=8081), "port 8081 is planned for both health and router"),
        (
            LocalOptions(engine_port=8079),
            "port 8080 is planned for both router and engine smollm2-135m-instruct-1",
        ),
        (LocalOptions(engine_port=65534), "outside 1-65535; change it with --engine-port"),
    ],
)
def test_port_clashes_are_refused_with_the_option_to_change(options: LocalOptions, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        build_plan(local_stack(), options, REPO)


def test_only_target_local_stacks_run_here() -> None:
    with pytest.raises(PlanError, match=r"Pulumi.prod.yaml: target: eks: .*target: local.*pulumi up -s prod"):
        build_plan(load("prod", REPO / "stacks"), LocalOptions(), REPO)


def test_a_hub_model_is_refused_with_the_fix() -> None:
    raw = raw_local()
    raw["models"][0]["source"] = "meta-llama/Llama-3.1-8B-Instruct"
    with pytest.raises(PlanError, match=r"models\[0\].source: .*not a directory on this machine"):
        build_plan(stack_from(raw), LocalOptions(), REPO)


def test_api_keys_are_refused_locally() -> None:
    raw = raw_local()
    raw["gateway"]["require_api_key"] = True
    with pytest.raises(PlanError, match=r"gateway\.require_api_key"):
        build_plan(stack_from(raw), LocalOptions(), REPO)


def test_models_outside_the_cache_are_the_users_to_provide(tmp_path: Path) -> None:
    raw = raw_local()
    raw["models"][0]["source"] = str(tmp_path / "my-model")
    preps = model_preps(stack_from(raw).spec, REPO)
    assert [(p.recipe, p.generate) for p in preps] == [(None, False), ("embed", True)]
    assert preps[0].path == tmp_path / "my-model"


def test_the_committed_models_are_made_by_their_recipes() -> None:
    preps = model_preps(local_stack().spec, REPO)
    assert [(p.model, p.recipe) for p in preps] == [
        ("smollm2-135m-instruct", "smollm2"),
        ("all-minilm-l6-v2", "embed"),
    ]


def test_a_model_under_the_cache_that_nothing_makes_is_refused_with_the_known_ones() -> None:
    raw = raw_local()
    raw["models"][0]["source"] = "./.cache/models/my-llama"
    with pytest.raises(
        PlanError, match=r"models\[0\]\.source: nothing makes './\.cache/models/my-llama'.*tiny-llama"
    ):
        model_preps(stack_from(raw).spec, REPO)


def test_banner_has_url_curl_and_openai_snippet() -> None:
    plan = build_plan(local_stack(), LocalOptions(router_port=9090, engine_port=9100), REPO)
    text = banner(plan, 61.2, detached=True)
    assert "ready in 61s" in text
    assert "http://127.0.0.1:9090/v1" in text
    assert "curl -s http://127.0.0.1:9090/v1/chat/completions" in text
    assert 'OpenAI(base_url="http://127.0.0.1:9090/v1"' in text
    assert 'model="all-minilm-l6-v2"' in text
    assert "adapters    smollm2-135m-instruct-lora-1 (of smollm2-135m-instruct)" in text
    assert "inferstack local status|logs|down" in text
    assert "Ctrl-C" in banner(plan, 1.0, detached=False)


def test_a_port_in_use_is_a_usage_error_naming_port_and_option() -> None:
    plan = build_plan(local_stack(), LocalOptions(), REPO)
    with pytest.raises(StartError) as caught:
        check_ports_free(plan, in_use=lambda port: port == 8080)
    assert caught.value.exit_code == 2
    assert "port 8080 on 127.0.0.1 is already in use" in str(caught.value)
    assert "--port N" in str(caught.value) and "make local PORT=" in str(caught.value)
    with pytest.raises(StartError, match=r"engine smollm2-135m-instruct-1.*--engine-port N"):
        check_ports_free(plan, in_use=lambda port: port == 8001)
    check_ports_free(plan, in_use=lambda port: False)


def test_cpus_come_from_the_affinity_mask() -> None:
    assert pick_cpus(lambda: {3, 1}) == (1, 3)
    assert pick_cpus(set) == (0,)


def test_shared_engine_memory_sizes_each_engines_kv_cache_from_its_fraction() -> None:
    """make local's CPU engines share the machine's engine memory by gpu_share.fraction, budgeted as shared GPU
    engines are; KV_CACHE_GIB without a share (tests/integration/test_shared_engines.py runs such a pair)."""
    raw = raw_local()
    raw["models"][0]["gpu_share"] = {"fraction": 0.3}  # two replicas: 0.6
    raw["models"][1]["gpu_share"] = {"fraction": 0.4}
    plan = build_plan(stack_from(raw), LocalOptions(cpus=(0, 1), engine_memory_gib=16), REPO)
    assert [e.kv_cache_space_gib for e in plan.engines] == [2, 2, 4]
    assert plan.engine_memory_gib == 16
    assert {e.kv_cache_space_gib for e in build_plan(local_stack(), LocalOptions(), REPO).engines} == {1}


def test_a_share_with_no_room_for_a_kv_cache_names_the_fraction_that_would_do() -> None:
    raw = raw_local()
    raw["models"][1]["gpu_share"] = {"fraction": 0.1}
    with pytest.raises(
        PlanError, match=r"models\[1\]\.gpu_share\.fraction: 0\.1 of 8 GiB leaves all-minilm-l6-v2 no KV"
    ):
        build_plan(stack_from(raw), LocalOptions(), REPO)
    with pytest.raises(PlanError, match=r"give it at least 0\.\d+") as refused:
        build_plan(stack_from(raw), LocalOptions(), REPO)
    named = re.search(r"give it at least (0\.\d+)", str(refused.value))
    assert named is not None
    raw["models"][1]["gpu_share"] = {"fraction": float(named.group(1))}
    build_plan(stack_from(raw), LocalOptions(), REPO)  # and that fraction does


def test_shares_of_all_engines_over_the_machine_are_refused() -> None:
    raw = raw_local()
    raw["models"][0]["gpu_share"] = {"fraction": 0.4}  # two replicas: 0.8
    raw["models"][1]["gpu_share"] = {"fraction": 0.4}
    with pytest.raises(PlanError, match=r"models: the gpu_share fractions of all engines sum to 1\.20"):
        build_plan(stack_from(raw), LocalOptions(engine_memory_gib=16), REPO)


def test_an_adapter_without_its_files_is_refused_with_the_field(tmp_path: Path) -> None:
    raw = raw_local()
    chat = raw["models"][0]
    chat["engine"]["dtype"] = "float32"
    chat["adapters"] = [{"name": "chat-sql", "source": str(tmp_path / "nowhere"), "rank": 8}]
    with pytest.raises(PlanError, match=r"models\[0\]\.adapters\[0\]\.source: .*no adapter_config\.json"):
        build_plan(stack_from(raw), LocalOptions(), REPO)
    (tmp_path / "nowhere").mkdir()
    (tmp_path / "nowhere" / "adapter_config.json").write_text("{}")
    plan = build_plan(stack_from(raw), LocalOptions(), REPO)
    adapters = plan.config.model(chat["name"]).adapters  # type: ignore[union-attr]
    assert [(a.name, a.path) for a in adapters] == [("chat-sql", str(tmp_path / "nowhere"))]


def test_an_adapter_under_the_cache_is_made_at_start_for_its_model() -> None:
    stack = load("lora", REPO / "tests" / "local" / "stacks")
    plan = build_plan(stack, LocalOptions(cpus=(0,)), REPO)
    (prep,) = plan.adapters
    assert (prep.name, prep.seed, prep.rank) == ("tiny-llama-lora-1", 1, 8)
    assert prep.base == REPO / ".cache" / "models" / "tiny-llama"
    target = plan.config.model("tiny-llama")
    assert target is not None and [a.path for a in target.adapters] == [
        str((REPO / ".cache/adapters/tiny-llama-lora-1").resolve())
    ]
    engine_spec = plan.engines[0].spec
    assert engine_spec.adapters[0].name == "tiny-llama-lora-1"


def test_an_adapter_under_the_cache_that_nothing_makes_is_refused() -> None:
    raw = yaml.safe_load((REPO / "tests" / "local" / "stacks" / "Pulumi.lora.yaml").read_text())
    platform = raw["config"]["inferstack:platform"]
    platform["models"][0]["adapters"][0]["source"] = "./.cache/adapters/my-sql-adapter"
    with pytest.raises(
        PlanError, match=r"models\[0\]\.adapters\[0\]\.source: nothing makes .*tiny-llama-lora-<seed>"
    ):
        build_plan(stack_from(platform), LocalOptions(cpus=(0,)), REPO)


def test_with_the_model_store_engines_stream_their_model_from_loopback_s3() -> None:
    plan = build_plan(load("local", REPO / "stacks"), LocalOptions(s3_port=9000), REPO)
    models = {m.name for m in load("local", REPO / "stacks").spec.models}
    for engine in plan.engines:
        assert engine.store == f"s3://inferstack-local/models/{engine.model}/"
    # One preparation per model, however many replicas.
    assert {location for _, location in plan.store_preps} == {
        f"s3://inferstack-local/models/{m}/" for m in models
    }
    assert "http://127.0.0.1:9000" in "\n".join(describe(plan))
    assert all(
        e.store is None for e in build_plan(load("local", REPO / "stacks"), LocalOptions(), REPO).engines
    )


def test_the_model_store_port_must_not_clash() -> None:
    with pytest.raises(
        PlanError, match=r"port 8080 is planned for both router and the model store.*--s3-port"
    ):
        build_plan(load("local", REPO / "stacks"), LocalOptions(s3_port=8080), REPO)


def test_envoy_runs_a_fixed_fleet_and_no_router_for_the_autoscaler_or_monitor_to_read() -> None:
    from components.local.monitor import Monitor

    raw = raw_local()
    raw["models"][0]["scaling"] = {"min_replicas": 0, "max_replicas": 2}
    with pytest.raises(
        PlanError, match=r"--gateway envoy runs a fixed fleet, but smollm2-135m-instruct scales"
    ):
        build_plan(stack_from(raw), LocalOptions(gateway="envoy"), REPO)
    build_plan(stack_from(raw), LocalOptions(gateway="router"), REPO)  # the router's activator holds for it
    with pytest.raises(PlanError, match=r"--monitor .* --gateway envoy runs no router"):
        build_plan(local_stack(), LocalOptions(gateway="envoy", monitor=Monitor()), REPO)
    plan = build_plan(local_stack(), LocalOptions(gateway="envoy"), REPO)
    assert [s.name for s in plan.services] == ["health", "picker", "envoy"]
    # the stack's batch service needs the router: not run, and the banner says so
    assert local_stack().spec.batch.enabled and plan.config.batches is None
    assert plan.config.router.batches_url is None
    assert "Batch API   not served" in banner(plan, 1.0, detached=True)
    assert "adapters    not served: the router loads them" in banner(plan, 1.0, detached=True)  # nor adapters


def test_envoy_runs_nothing_only_the_router_does() -> None:
    """Several routers, shared limits and KV events are the router's; behind Envoy they are refused by name."""
    with pytest.raises(
        PlanError, match=r"--routers 2 runs router replicas, and --gateway envoy runs no router"
    ):
        build_plan(local_stack(), LocalOptions(gateway="envoy", routers=2), REPO)
    raw = raw_local()
    raw["gateway"] = {**raw.get("gateway", {}), "shared_limits": True}
    with pytest.raises(PlanError, match=r"gateway.shared_limits .* --gateway envoy runs no router"):
        build_plan(stack_from(raw), LocalOptions(gateway="envoy"), REPO)
    raw = raw_local()
    raw["models"][0]["routing"] = {"strategy": "precise_prefix"}
    with pytest.raises(PlanError, match=r"smollm2-135m-instruct routes precise_prefix"):
        build_plan(stack_from(raw), LocalOptions(gateway="envoy"), REPO)
    plan = build_plan(stack_from(raw), LocalOptions(gateway="router"), REPO)
    assert plan.engines[0].kv_events is not None
