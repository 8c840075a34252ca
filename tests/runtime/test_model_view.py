"""The router and the endpoint picker see a model one way (``runtime.model_view``): the same request gives
the same scheduling context, relists keep the same survivors, refusals read the same."""

from __future__ import annotations

from runtime.config import RuntimeConfig
from runtime.picker.replicas import ModelPool
from runtime.router.model_state import ModelState

A, B, C = "http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000"


def _views() -> tuple[ModelState, ModelPool]:
    cfg = RuntimeConfig.model_validate(
        {
            "models": [{"name": "m", "static_backends": [{"url": A}]}],
            # prefix_aware reads the prompt, session the session header
            "router": {"default_strategy": {"name": "prefix_aware", "weights": {"session": 1.0}}},
        }
    )
    target, route = cfg.models[0], cfg.route("m")
    return ModelState(target, route, cfg.router), ModelPool(target, route, cfg.router)


def test_both_front_ends_fill_the_same_context_from_the_same_request() -> None:
    payload = {"model": "m", "messages": [{"role": "user", "content": "hello there"}]}
    headers = {"x-session-id": "s-1"}
    router, picker = _views()
    assert router.needs_prompt and router.needs_session
    one = router.context(5.0, payload, headers.get)
    other = picker.context(5.0, payload, headers.get)
    assert (one.model, one.now, one.prompt, one.session) == (
        other.model,
        other.now,
        other.prompt,
        other.session,
    )
    assert one.prompt and one.session == "s-1"


def test_a_relist_keeps_survivors_and_reports_who_left_in_both_front_ends() -> None:
    for view in _views():
        departed: list[tuple[str, str]] = []
        view.on_departed = lambda model, url, seen=departed: seen.append((model, url))
        view.set_replicas([A, B])
        survivor = view.by_url[A]
        survivor.inflight = 3
        view.probe_failures[B] = 1
        view.set_replicas([A, C])
        assert view.by_url[A] is survivor and survivor.inflight == 3
        assert [r.url for r in view.replicas] == [A, C]
        assert departed == [("m", B)] and B not in view.probe_failures


def test_refusals_name_the_model_the_same_way_in_both_front_ends() -> None:
    router, picker = _views()
    assert (
        router.busy_message()
        == picker.busy_message()
        == "all replicas of 'm' are at capacity; try again shortly"
    )
    assert router.no_replica_message() == picker.no_replica_message() == "no healthy replica of 'm' right now"
