"""The local autoscaler: it reads the router's real exposition, decides with the cluster's function, starts
and stops engine processes (stand-ins here; the real vLLM run is test_monitor_stack.py) and publishes who is
ready (runtime file discovery) and who exists (Prometheus file_sd). Time is virtual, so the idle periods of
the spec (minutes) pass at once; engines are real processes on loopback.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from components.local.autoscaler import Autoscaler, router_reports
from components.local.plan import LocalOptions, build_plan
from components.local.supervisor import engine_process, http_get
from runtime.router.metrics import LIVE_GAUGES, RouterMetrics
from tests.local.helpers import free_port_block
from tests.local.stand_in import stand_in
from tests.local.test_plan import raw_local, stack_from


def router_exposition(waiting: float, refused: int = 0, inflight: float = 0) -> str:
    """What the real router's /metrics says (its own metrics classes, not a hand-written text)."""
    metrics = RouterMetrics()
    for _ in range(refused):
        metrics.reject("no_backend", "smollm2-135m-instruct")
    metrics.reject("unknown_model")  # refusals of other kinds and of no model do not count

    def snapshot() -> dict[str, list[tuple[tuple[str, ...], float]]]:
        out: dict[str, list[tuple[tuple[str, ...], float]]] = {name: [] for name in LIVE_GAUGES}
        out["queue_depth"] = [(("smollm2-135m-instruct",), waiting)]
        out["backend_inflight"] = [(("smollm2-135m-instruct", "http://127.0.0.1:1"), inflight)]
        return out

    metrics.attach_live(snapshot)
    return generate_latest(metrics.registry).decode()


def test_router_reports_read_the_real_exposition() -> None:
    reports = router_reports(router_exposition(3, refused=2, inflight=5))
    assert set(reports) == {"smollm2-135m-instruct"}
    assert (reports["smollm2-135m-instruct"].waiting, reports["smollm2-135m-instruct"].refused_total) == (
        3,
        2,
    )
    assert reports["smollm2-135m-instruct"].inflight == 5


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def scaler(tmp_path: Path) -> Iterator[tuple[Autoscaler, Clock, list[str]]]:
    wrapper, model_dir = stand_in(tmp_path)
    raw = raw_local()
    raw["models"] = [raw["models"][0]]
    raw["models"][0]["source"] = str(model_dir)
    raw["models"][0].pop("adapters")  # the stand-in engine loads no LoRA adapter
    raw["models"][0]["engine"].pop("lora")
    raw["models"][0]["scaling"] = {"min_replicas": 0, "max_replicas": 2, "idle_before_zero_s": 900}
    options = LocalOptions(state_dir=tmp_path / "state", engine_port=free_port_block(2), cpus=(0, 1))
    plan = build_plan(stack_from(raw), options, tmp_path)
    plan.logs_dir.mkdir(parents=True)
    said: list[str] = []
    clock = Clock()
    assert plan.spec is not None
    scaler = Autoscaler(
        plan,
        plan.spec,
        make_engine=lambda launch: engine_process(launch, plan.logs_dir, "test", python=wrapper),
        healthy=lambda url: http_get(f"{url}/health")[0] == 200,
        say=said.append,
        clock=clock,
    )
    yield scaler, clock, said
    scaler.stop_all(2.0)


def _tick(scaler: Autoscaler, clock: Clock, text: str, seconds: float = 1.0) -> bool:
    clock.now += seconds
    return scaler.tick(lambda: text)


def _published(path: Path) -> list[str]:
    return sorted(t for group in json.loads(path.read_text()) for t in group["targets"])


def _until_ready(scaler: Autoscaler, clock: Clock, text: str, count: int) -> None:
    deadline = time.monotonic() + 60
    while len(_published(scaler.plan.endpoints_path)) < count:
        assert time.monotonic() < deadline, "stand-in engines did not become ready"
        time.sleep(0.1)
        _tick(scaler, clock, text)


def test_waiting_requests_start_engines_and_idleness_stops_them(scaler) -> None:
    scaler, clock, said = scaler
    plan = scaler.plan
    idle = router_exposition(0)
    assert _tick(scaler, clock, idle) is False  # nothing waits: nothing starts
    assert _published(plan.endpoints_path) == [] and _published(plan.engine_targets_path) == []

    # 4 waiting over a target of 3.2 per replica (a tenth of max_num_seqs 32): two replicas, the max
    assert _tick(scaler, clock, router_exposition(4)) is True
    assert [line for line in said if "starting engine" in line] == [
        "smollm2-135m-instruct: 4 requests waiting in the router, 0.0/s refused: scaling 0 -> 2, starting engine smollm2-135m-instruct-0",
        "smollm2-135m-instruct: 4 requests waiting in the router, 0.0/s refused: scaling 0 -> 2, starting engine smollm2-135m-instruct-1",
    ]
    urls = [f"127.0.0.1:{e.port}" for e in plan.engines]
    assert _published(plan.engine_targets_path) == urls  # they exist (scraped, up or not) ...
    _until_ready(scaler, clock, router_exposition(4), 2)  # ... and the router gets them once they answer
    assert any(line.startswith("engine smollm2-135m-instruct-0 ready after") for line in said)
    labels = json.loads(plan.engine_targets_path.read_text())[0]["labels"]
    assert labels == {
        "namespace": "inferstack",
        "service": "smollm2-135m-instruct-engine",
        "job": "smollm2-135m-instruct-engine",
        "pod": "smollm2-135m-instruct-0",
        "endpoint": "http",
        "__metrics_path__": "/metrics",
    }

    # busy (in flight) keeps them; idle for the scale-down window (600 s), one replica is left ...
    _tick(scaler, clock, router_exposition(0, inflight=2), 500)
    assert _tick(scaler, clock, idle, 599) is False
    assert _tick(scaler, clock, idle, 2) is True
    assert _published(plan.endpoints_path) == urls[:1]
    assert (
        "smollm2-135m-instruct: idle for 601s: scaling 2 -> 1, stopping engine smollm2-135m-instruct-1"
        in said
    )
    # ... and after idle_before_zero_s (900 s, KEDA's cooldown) none
    assert _tick(scaler, clock, idle, 298) is False
    assert _tick(scaler, clock, idle, 2) is True
    assert _published(plan.endpoints_path) == [] and _published(plan.engine_targets_path) == []
    assert (
        "smollm2-135m-instruct: idle for 901s: scaling 1 -> 0, stopping engine smollm2-135m-instruct-0"
        in said
    )
    scaler.stop_all(2.0)
    assert said.count("engine smollm2-135m-instruct-0 stopped") == 1 and scaler.started() == []


def test_refusals_wake_the_model_and_a_crashed_engine_is_reported_and_restarted_on_demand(scaler) -> None:
    scaler, clock, said = scaler
    plan = scaler.plan
    _tick(scaler, clock, router_exposition(0, refused=0))
    # activator off: nothing waits, but 3 refusals in a second are demand as well (the cluster's router-demand)
    assert _tick(scaler, clock, router_exposition(0, refused=3)) is True
    assert (
        "smollm2-135m-instruct: 0 requests waiting in the router, 3.0/s refused: scaling 0 -> 1" in said[-1]
    )
    _until_ready(scaler, clock, router_exposition(0, refused=3), 1)
    (launch, engine), *_ = scaler.started()
    assert engine.pid is not None and engine.scratch_dir is not None
    crashed_scratch = engine.scratch_dir
    os.killpg(engine.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while engine.running():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    _tick(scaler, clock, router_exposition(0, refused=3))
    assert f"warning: engine {launch.name} exited" in said[-1]
    assert _published(plan.endpoints_path) == []  # the router stops sending to it at once ...
    assert _published(plan.engine_targets_path) == [f"127.0.0.1:{launch.port}"]  # ... Prometheus sees it down
    _tick(scaler, clock, router_exposition(1, refused=3))
    assert said[-1].endswith(f"starting the exited engine {launch.name} again")
    assert not crashed_scratch.exists(), "the exited engine's TMPDIR goes before its successor starts"
    _until_ready(scaler, clock, router_exposition(1, refused=3), 1)
