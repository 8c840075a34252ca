"""A scorer's knobs are ``Knob`` records declared beside it: ``StrategyConfig``'s fields, the knobs a stack
file may set per model and what each scorer reads all come from them, so a new scorer with a knob is one
module (``knob_scorer.py`` here)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from runtime.breaker import Breaker
from runtime.config import StrategyConfig, strategy_model
from runtime.replica import ReplicaState
from runtime.scheduling import (
    Category,
    Context,
    Knob,
    Scorer,
    build,
    knobs_read,
    load_plugins,
    register_scorer,
    registered_knobs,
    registered_scorers,
    registry,
)
from runtime.scheduling.scorers.prefix import PREFIX_BLOCK_TOKENS

MODULE = "tests.runtime.scheduling.knob_scorer"
ROOT = Path(__file__).resolve().parents[3]


@contextmanager
def scratch_registry() -> Iterator[None]:
    """Registrations inside stay inside: the registry (scorers, filters, knobs, and that ``StrategyConfig``
    froze its knobs) is put back after, and the test's scorer module unloaded, so no other test sees them."""
    tables: tuple[dict[str, Any], ...] = (registry._scorers, registry._filters, registry._knobs)
    saved = [dict(table) for table in tables]
    frozen = registry._frozen
    registry._frozen = None  # StrategyConfig is built already: the test builds its own from the registry
    try:
        yield
    finally:
        for table, before in zip(tables, saved, strict=True):
            table.clear()
            table.update(before)
        registry._frozen = frozen
        sys.modules.pop(MODULE, None)


def _replicas(n: int) -> list[ReplicaState]:
    return [ReplicaState(f"http://10.0.0.{i}:8000", 4, Breaker(1, 1.0)) for i in range(n)]


def test_a_new_scorer_with_a_knob_is_one_module_and_its_knob_reaches_the_config_and_the_scorer() -> None:
    before = dict(registered_scorers()), dict(registered_knobs())
    with scratch_registry():
        knob = importlib.import_module(MODULE).PINNED_RANK
        assert registered_scorers()["pinned"].knobs == (knob,)
        assert registered_knobs()["pinned_rank"] is knob

        config = strategy_model(registered_knobs().values())
        # today's fields in today's order, the new knob after them
        assert list(config.model_fields) == [*StrategyConfig.model_fields, "pinned_rank"]
        field = config.model_fields["pinned_rank"]
        assert (field.annotation, field.default, field.description) == (int, 0, knob.description)
        assert config.model_json_schema()["properties"]["pinned_rank"] == {
            "default": 0,
            "description": knob.description,
            "maximum": 15,
            "minimum": 0,
            "title": "Pinned Rank",
            "type": "integer",
        }
        assert config().pinned_rank == 0  # type: ignore[attr-defined]
        for outside in (-1, 16):
            with pytest.raises(ValidationError, match="pinned_rank"):
                config.model_validate({"pinned_rank": outside})

        settings = config.model_validate({"name": "weighted", "weights": {"pinned": 1.0}, "pinned_rank": 2})
        strategy = build(settings)
        ((scorer, _),) = strategy.scorers
        assert scorer.rank == 2  # type: ignore[attr-defined]
        replicas = _replicas(4)
        assert strategy.pick(replicas, Context(model="m", now=1.0)) is replicas[2]
        assert knobs_read("weighted", {"pinned": 1.0}) == {"pinned_rank"}
    # nothing of it outlives the test
    assert (dict(registered_scorers()), dict(registered_knobs())) == before
    assert registry._frozen == frozenset(StrategyConfig.model_fields) - {"name", "weights", "session_header"}
    assert MODULE not in sys.modules


def test_a_module_imported_before_the_config_is_built_gives_every_runtime_config_its_knob(
    tmp_path: Path,
) -> None:
    """The way a module in runtime/scheduling/scorers/ does (the registry imports them all first), in a fresh
    interpreter: the router's own StrategyConfig, and the config file's checks, know the knob."""
    config = tmp_path / "config.yaml"
    script = f"""
import json, sys
import {MODULE}
from pathlib import Path
from typing import Any
from runtime.config import StrategyConfig
from runtime.config_file import ConfigError, read_config
from runtime.scheduling import build

def write(rank):
    Path({str(config)!r}).write_text(json.dumps({{
        "models": [{{"name": "m", "static_backends": [{{"url": "http://10.0.0.1:8000"}}]}}],
        "router": {{"routes": [{{"model": "m", "strategy": {{"name": "weighted", "weights": {{"pinned": 1.0}},
                                                      "pinned_rank": rank}}}}]}},
    }}))

write(3)
route = read_config(Path({str(config)!r})).route("m")
((scorer, _),) = build(route.strategy).scorers
write(16)
try:
    read_config(Path({str(config)!r}))
    refused = []
except ConfigError as err:
    refused = err.lines
print(json.dumps({{"fields": list(StrategyConfig.model_fields), "rank": scorer.rank, "refused": refused}}))
"""
    run = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=False, timeout=60
    )
    assert run.returncode == 0, run.stderr
    said = json.loads(run.stdout)
    assert said["fields"][-1] == "pinned_rank"
    assert said["rank"] == 3
    assert said["refused"] == [
        f"{config}: router.routes[0].strategy.pinned_rank: Input should be less than or equal to 15 (got 16)"
    ]


def test_a_plugin_may_not_add_a_knob_once_the_config_is_built() -> None:
    """The router imports its plug-ins after StrategyConfig exists: a knob they declared would reach no
    config, so the plug-in is refused with why, and registers nothing."""
    before = dict(registered_scorers()), dict(registered_knobs())
    (problem,) = load_plugins([MODULE])
    assert problem.field == "plugins[0]"
    assert (
        f"cannot import {MODULE!r}: ValueError: scorer 'pinned' ({MODULE}) declares knob 'pinned_rank',"
        in (problem.message)
    )
    assert (dict(registered_scorers()), dict(registered_knobs())) == before
    assert MODULE not in sys.modules


def test_a_scorer_names_its_knobs_by_their_records_and_reads_them_typed() -> None:
    with scratch_registry(), pytest.raises(TypeError, match="knobs takes Knob records"):

        @register_scorer("by_name", Category.DISTRIBUTION, knobs=["prefix_block_tokens"])  # type: ignore[list-item]
        class ByName(Scorer):
            def score(self, candidates, ctx):
                return [0.0] * len(candidates)

    assert PREFIX_BLOCK_TOKENS.read(StrategyConfig.model_validate({"prefix_block_tokens": 32})) == 32
    with pytest.raises(TypeError, match="prefix_block_tokens: '32' is not of type int"):
        PREFIX_BLOCK_TOKENS.read(type("Loose", (), {"prefix_block_tokens": "32"})())


def test_a_knob_is_declared_once() -> None:
    other = Knob("prefix_block_tokens", int, 32, "Another block size.", ge=1)
    with scratch_registry(), pytest.raises(ValueError, match=r"knob 'prefix_block_tokens' .* declared twice"):

        @register_scorer("again", Category.DISTRIBUTION, knobs=[other])
        class Again(Scorer):
            def score(self, candidates, ctx):
                return [0.0] * len(candidates)

    assert "again" not in registered_scorers()


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        (lambda: Knob("ratio", float, 1, "d"), "its default 1 is not of type float"),
        (lambda: Knob("ratio", float, 1.5, "d", gt=0, le=1), "its default 1.5 is not <= 1"),
        (lambda: Knob("size", int, 0, "d", ge=1), "its default 0 is not >= 1"),
        (lambda: Knob("Size", int, 1, "d"), "knob name 'Size'"),
    ],
)
def test_a_knob_record_checks_its_own_default_and_name(declared: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        declared()  # type: ignore[operator]
