"""The spec's engine rules read the engine table's capabilities (``runtime.engines``): for every engine kind, a
stack asking for something is refused exactly when the table says the engine cannot do it. A rule written
against a kind by name, or a table entry that lies, fails here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from pydantic import ValidationError

from components.engines import profile
from components.spec import PlatformSpec
from runtime.config import EngineKind
from runtime.engines import ENGINES, Capabilities
from tests.components.helpers import minimal


def _problems(change: Callable[[dict[str, Any]], None]) -> str:
    raw = minimal()
    change(raw["models"][0])
    try:
        PlatformSpec.model_validate(raw)
    except ValidationError as err:
        return str(err)
    return ""


def _engine(**fields: Any) -> Callable[[dict[str, Any]], None]:
    def change(model: dict[str, Any]) -> None:
        model["engine"] = {**model["engine"], **fields}

    return change


def _both(
    first: Callable[[dict[str, Any]], None], then: Callable[[dict[str, Any]], None]
) -> Callable[[dict[str, Any]], None]:
    def change(model: dict[str, Any]) -> None:
        first(model)
        then(model)

    return change


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(model: dict[str, Any]) -> None:
        model[key] = value

    return change


# (what is asked, how to ask it, the capability that allows it, words of the refusal)
ASKS: list[tuple[str, Callable[[dict[str, Any]], None], Callable[[Capabilities], bool], str]] = [
    ("a CPU engine", _engine(device="cpu"), lambda c: "cpu" in c.devices, "device: cpu is supported for"),
    (
        "streamed weights",
        _set("weights", {"fetch": "streamer"}),
        lambda c: c.weight_streamer,
        "weights.fetch: streamer",
    ),
    (
        "KV offload to host memory",
        _engine(cpu_kv_offload_gib=8),
        lambda c: c.kv_offload,
        "cpu_kv_offload_gib works",
    ),
    (
        "routing on the engines' KV events",
        _set("routing", {"strategy": "precise_prefix"}),
        lambda c: c.kv_events,
        "precise_prefix reads the engines' KV-cache events",
    ),
    *[
        (
            f"{q} checkpoints",
            _engine(quantization=q),
            lambda c, q=q: q in c.quantizations,
            f"quantization: {q}",
        )
        for q in ("awq", "gptq", "fp8", "int8")
    ],
]


@pytest.mark.parametrize("kind", list(EngineKind), ids=str)
@pytest.mark.parametrize(("asked", "change", "allowed", "refusal"), ASKS, ids=[a[0] for a in ASKS])
def test_a_stack_is_refused_exactly_when_the_engine_table_says_the_engine_cannot(
    kind: EngineKind,
    asked: str,
    change: Callable[[dict[str, Any]], None],
    allowed: Callable[[Capabilities], bool],
    refusal: str,
) -> None:
    problems = _problems(_both(_engine(kind=kind.value), change))
    if allowed(ENGINES[kind].can):
        assert refusal not in problems, f"{kind} can do {asked}, but the spec refused it: {problems}"
    else:
        assert refusal in problems and kind.value in problems, (
            f"{kind} cannot do {asked}: {problems or 'accepted'}"
        )


def test_every_engine_serves_unquantized_checkpoints_on_gpus() -> None:
    for kind, engine in ENGINES.items():
        assert "none" in engine.can.quantizations and "gpu" in engine.can.devices, kind


def test_every_engine_kind_has_a_profile_sized_for_each_device_it_has_an_image_for() -> None:
    """components/engines finds one profile per kind by module; its image sizes (the cold-start estimate) and
    the engine table's images (what runs) name the same devices."""
    for kind, engine in ENGINES.items():
        assert set(profile(kind).image_gib) == engine.can.devices, kind
