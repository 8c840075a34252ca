"""Tenants in the spec: weights and bands reach the router's config, keys may name their tenant, the plan shows
each tenant's weight and band, and a tenant listed twice is refused."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from components.cli.report import plan_report
from components.render import api_keys
from components.render.runtime_config import runtime_config
from components.spec import PlatformSpec
from runtime.config import Band, QueueOrder
from tests.components.helpers import minimal
from tests.stacks import load


def _spec(**gateway: object) -> PlatformSpec:
    raw = minimal()
    raw["gateway"] = {**raw.get("gateway", {}), **gateway}
    return PlatformSpec.model_validate(raw)


def test_tenants_weights_and_bands_reach_the_router_config() -> None:
    spec = _spec(
        tenants=[{"name": "support", "weight": 3, "band": "interactive"}],
        default_band="batch",
        queue_order="fifo",
    )
    router = runtime_config(spec).router
    assert [(t.name, t.weight, t.band) for t in router.tenants] == [("support", 3.0, Band.INTERACTIVE)]
    assert router.default_band is Band.BATCH and router.queue_order is QueueOrder.FIFO


def test_a_tenant_listed_twice_is_refused() -> None:
    with pytest.raises(ValidationError, match="listed twice"):
        _spec(tenants=[{"name": "a"}, {"name": "a", "band": "batch"}])


def test_a_key_may_name_its_tenant_in_the_secret_list() -> None:
    raw = yaml.safe_dump([{"name": "ci-1", "key": "sk-ci-1-0123456789abcdef", "tenant": "analytics"}])
    assert yaml.safe_load(api_keys.hash_api_keys(raw, "inferstack:apiKeys"))[0]["tenant"] == "analytics"


def test_the_plan_shows_each_tenants_weight_and_band() -> None:
    notes = plan_report(load("staging")).notes
    line = next(n for n in notes if n.startswith("tenants"))
    assert "support-bot weight 2, interactive" in line
    assert "analytics weight 1, batch" in line
    assert "any other key weight 1, standard" in line


def test_the_plan_says_nothing_of_tenants_when_every_default_stands() -> None:
    assert api_keys.tenants_note(_spec()) is None
    assert "arrival order" in (api_keys.tenants_note(_spec(queue_order="fifo")) or "")
