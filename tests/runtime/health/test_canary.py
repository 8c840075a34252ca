"""The canary controller in the health monitor, with fake engines and a test clock: a canary that starts
failing is rolled back at once (weights in the feed, a counter, an Event through the actions seam); a good
one is judged to advance and keeps its weight."""

from __future__ import annotations

from typing import Any

from runtime.config import ModelTarget, RuntimeConfig
from runtime.health.canary import Canaries
from runtime.health.kube import REASON_ROLLED_BACK, rollback_event


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class RecordingActions:
    def __init__(self) -> None:
        self.rollbacks: list[tuple[str, list[str], str, str]] = []

    async def on_transition(self, *_: Any) -> None:
        return None

    async def remediate(self, *_: Any) -> bool:
        return False

    async def on_rollback(self, canary: ModelTarget, urls: list[str], metric: str, reason: str) -> None:
        self.rollbacks.append((canary.name, urls, metric, reason))

    async def close(self) -> None:
        return None


def _config(stable: str, canary: str, **check: Any) -> RuntimeConfig:
    return RuntimeConfig.model_validate(
        {
            "models": [
                {
                    "name": f"chat-{v}",
                    "static_backends": [{"url": url}],
                    "version_of": {"model": "chat", "version": v, "weight": w, "stable": v == "v1"},
                }
                for v, url, w in (("v1", stable, 90), ("v2", canary, 10))
            ],
            "health": {
                "interval_ms": 100,
                "timeout_ms": 3000,  # a loaded machine's stall must not fail a probe
                "eject_after_failures": 3,
                "canaries": [{"model": "chat", "evaluation_interval_s": 10, "min_samples": 3, **check}],
            },
        }
    )


async def test_a_failing_canary_is_rolled_back_within_one_interval_and_says_why(fakes, monitors) -> None:
    stable, canary = await fakes(), await fakes()
    clock, actions = Clock(), RecordingActions()
    m = await monitors(_config(stable.url, canary.url, restart_grace_s=4), clock=clock, actions=actions)
    for _ in range(3):
        clock.now += 1
        await m.probe_all()
    assert m.feed().versions[0].weights == {"v1": 90, "v2": 10}
    canary.engine.health_status = 500  # the canary's engine starts failing
    for _ in range(4):  # three failed probes eject its only replica; out for less than the grace: a restart?
        clock.now += 1
        await m.probe_all()
        assert not m.feed().versions[0].rolled_back
    clock.now += 1  # out for longer than a restart: no need to wait for the interval
    await m.probe_all()
    await m.wait_idle()
    v = m.feed().versions[0]
    assert v.weights == {"v1": 100, "v2": 0} and v.rolled_back
    assert v.metric == "routable_replicas" and "v2 rolled back" in v.reason
    assert clock.now - 1_000 < 10  # inside the first evaluation interval
    assert actions.rollbacks == [("chat-v2", [canary.url], "routable_replicas", v.reason.split(": ", 1)[1])]
    assert m.canaries.rollbacks[("chat", "v2", "routable_replicas")] == 1


async def test_an_error_rate_breach_rolls_back_when_the_interval_ends(fakes, monitors) -> None:
    stable, canary = await fakes(), await fakes()
    clock = Clock()
    m = await monitors(_config(stable.url, canary.url, max_error_rate=0.1), clock=clock)
    for i in range(10):
        canary.engine.health_status = 500 if i in (4, 8) else 200  # 2 of 10 fail: never ejected
        clock.now += 1
        await m.probe_all()
    v = m.feed().versions[0]
    assert v.rolled_back and v.metric == "error_rate" and "probes failed) is above 10.0%" in v.reason


async def test_a_healthy_canary_keeps_its_weight_and_is_judged_ready_to_advance(fakes, monitors) -> None:
    stable, canary = await fakes(), await fakes()
    clock = Clock()
    m = await monitors(_config(stable.url, canary.url), clock=clock)
    for _ in range(11):
        clock.now += 1
        await m.probe_all()
    v = m.feed().versions[0]
    assert v.weights == {"v1": 90, "v2": 10} and not v.rolled_back
    assert v.verdicts == {"v2": "advance"}


def test_the_rollback_event_names_model_version_metric_and_reason() -> None:
    target = ModelTarget.model_validate(
        {
            "name": "chat-v2",
            "static_backends": [{"url": "http://x:1"}],
            "version_of": {"model": "chat", "version": "v2", "weight": 10},
        }
    )
    reason, kind, message = rollback_event(target, "error_rate", "canary error rate 50.0% ...")
    assert (reason, kind) == (REASON_ROLLED_BACK, "Warning")
    assert message.startswith("model chat: canary version v2 rolled back to the stable version (error_rate)")


async def test_rollbacks_and_weights_are_on_the_monitors_metrics(fakes, monitors) -> None:
    from runtime.health.exposition import registry_for, render

    stable, canary = await fakes(), await fakes()
    clock = Clock()
    m = await monitors(_config(stable.url, canary.url, restart_grace_s=0), clock=clock)
    canary.engine.health_status = 500
    for _ in range(4):
        clock.now += 1
        await m.probe_all()
    text = render(registry_for(m)).decode()
    assert (
        'inferstack_health_canary_rollbacks_total{metric="routable_replicas",model="chat",version="v2"} 1.0'
        in text
    )
    assert 'inferstack_health_version_weight{model="chat",version="v2"} 0.0' in text


def test_one_restart_is_let_go_but_a_crash_loop_counts() -> None:
    canaries = Canaries(_config("http://s:1", "http://c:1", restart_grace_s=60), 0.0)
    down, up = (False, False), (True, True)  # (probe ok, routable after it)

    def observe(*steps: tuple[bool, bool]) -> None:
        for ok, routable in steps:
            observe.now += 1  # type: ignore[attr-defined]
            canaries.observe("chat-v2", "http://c:1", ok, routable, observe.now)  # type: ignore[attr-defined]

    observe.now = 0.0  # type: ignore[attr-defined]
    observe(up, down, down, down, up)  # out and back within the grace: a restart
    tally = canaries.models["chat"].tallies["chat-v2"]
    assert (tally.probes, tally.failures) == (2, 0)
    observe(down, down, down, up)  # again, moments later: not a restart any more
    assert (tally.probes, tally.failures) == (6, 3)
    observe((False, True), up)  # a failure that took nothing out of rotation is an error, not a restart
    assert (tally.probes, tally.failures) == (8, 4)
