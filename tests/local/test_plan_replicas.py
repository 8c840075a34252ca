"""``make local ROUTERS=N`` and precise_prefix on the local target, as planned: pure, no processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.local.plan import HOST, LocalOptions, PlanError, build_plan
from tests.local.test_plan import REPO, local_stack, raw_local, stack_from


def test_several_routers_sit_behind_the_balancer_and_share_a_local_redis() -> None:
    plan = build_plan(local_stack(), LocalOptions(routers=3, redis_port=6390), REPO)
    names = [s.name for s in plan.services]
    assert names[0] == "redis" and names[-4:] == ["router-0", "router-1", "router-2", "router"]
    assert plan.routers == 3 and plan.router.module == "components.local.balancer"
    assert [s.port for s in plan.services if s.name.startswith("router-")] == [8090, 8091, 8092]
    argv = plan.router.argv("python", Path("cfg"))
    assert argv[argv.index("--listen") + 1] == f"{HOST}:8080" and argv.count("--to") == 3
    assert plan.services[-4].argv("python", Path("cfg"))[-4:] == ["--port", "8090", "--metrics-port", "9091"]
    assert [s.metrics_port for s in plan.services if s.name.startswith("router-")] == [9091, 9092, 9093]
    redis = plan.services[0]
    assert redis.probe == "tcp" and redis.command[1:5] == ("--bind", "127.0.0.1", "--port", "6390")
    store = plan.config.router.limit_store
    assert store is not None and store.url == "redis://127.0.0.1:6390/0" and store.replicas == 3
    assert {p for p, _, _ in plan.ports()} >= {8080, 8090, 8091, 8092, 6390, 9091, 9092, 9093}


def test_one_router_is_the_stack_as_before() -> None:
    plan = build_plan(local_stack(), LocalOptions(), REPO)
    assert [s.name for s in plan.services][-1] == "router" and plan.routers == 1
    assert "redis" not in [s.name for s in plan.services] and plan.config.router.limit_store is None


def test_bad_router_counts_and_a_missing_redis_server_are_one_clear_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(PlanError, match="at least one router"):
        build_plan(local_stack(), LocalOptions(routers=0), REPO)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(PlanError, match="make redis"):
        build_plan(local_stack(), LocalOptions(routers=2), REPO)


def test_precise_prefix_engines_publish_on_socket_files_the_routers_follow() -> None:
    raw = raw_local()
    raw["models"][0]["routing"] = {"strategy": "precise_prefix"}
    plan = build_plan(stack_from(raw), LocalOptions(state_dir=Path(".local-test")), REPO)
    chat = [e for e in plan.engines if e.model == raw["models"][0]["name"]]
    assert all(e.kv_events and e.kv_events[0].startswith("ipc://") for e in chat)
    target = plan.config.model(raw["models"][0]["name"])
    assert target is not None and target.kv_events is not None
    assert target.kv_events.tokenizer_dir == chat[0].path
    assert [(b.kv_events_endpoint, b.kv_replay_endpoint) for b in target.static_backends] == [
        e.kv_events for e in chat
    ]
    from components.local.engine_process import EngineProcess

    engine = EngineProcess(chat[0].spec, chat[0].path, port=chat[0].port, kv_events=chat[0].kv_events)
    args = engine.argv
    assert args[args.index("--prefix-caching-hash-algo") + 1] == "sha256_cbor"
    assert '"endpoint":"ipc://' in args[args.index("--kv-events-config") + 1]


def test_with_several_routers_prometheus_scrapes_each_router_not_the_balancer_or_redis() -> None:
    from components.local import monitor

    plan = build_plan(local_stack(), LocalOptions(routers=2, redis_port=6390), REPO)
    assert plan.scraped_services() == [
        ("health", 8081),
        ("batcher", 8082),
        ("batches", 8083),  # the batch service (the local stack enables it) sends through the balancer
        ("router", 9091),  # each router on its metrics listener: its API port serves no /metrics
        ("router", 9092),
    ]
    assert plan.spec is not None
    assert plan.config.batches is not None and plan.config.batches.router_url is not None
    assert str(plan.config.batches.router_url).rstrip("/") == "http://127.0.0.1:8080"  # the balancer
    targets = monitor.runtime_targets(plan.spec, plan.scraped_services())
    endpoints = [g["labels"]["endpoint"] for g in targets[-2:]]
    assert endpoints == ["metrics", "metrics"]  # the routers', as their ServiceMonitor names it
    pods = [g["labels"]["pod"] for g in targets]
    assert pods == [
        "inferstack-health-0",
        "inferstack-batcher-0",
        "inferstack-batches-0",
        "inferstack-router-0",
        "inferstack-router-1",
    ]


def test_the_banner_names_the_health_monitor_when_redis_starts_first() -> None:
    from components.local.plan import banner

    plan = build_plan(local_stack(), LocalOptions(routers=2, redis_port=6390), REPO)
    text = banner(plan, 1.0, detached=False)
    assert "(health monitor: http://127.0.0.1:8081/v1/backends)" in text
    assert "2 routers (round robin, shared limits in redis)" in text


def test_precise_prefix_on_a_model_that_scales_is_one_clear_line() -> None:
    raw = raw_local()
    raw["models"][0]["routing"] = {"strategy": "precise_prefix"}
    raw["models"][0]["scaling"] = {"min_replicas": 0, "max_replicas": 1}
    with pytest.raises(
        PlanError, match=r"models\[0\].routing.strategy: precise_prefix .* min_replicas equal"
    ):
        build_plan(stack_from(raw), LocalOptions(), REPO)
