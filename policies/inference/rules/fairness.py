"""Fair queuing between tenants: bands order nothing when every key is in the top one.

Reads the router's rendered runtime config (``router.tenants``, ``router.default_band``: the ConfigMap the router
and the endpoint picker mount) and judges it with the runtime's own predicate
(``runtime.scheduling.fair_queue.top_band_only``), so the pack and the router agree on what a band is.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from policies.inference.rules.base import (
    Category,
    Config,
    Finding,
    Res,
    Rule,
    Setting,
    Severity,
    as_list,
    as_map,
)
from policies.inference.rules.k8s import environment_of
from policies.inference.rules.security import router_configs
from runtime.config import Band
from runtime.scheduling.fair_queue import top_band_only

ENVIRONMENTS_SCHEMA = {"type": "array", "items": {"type": "string"}}


def _band(value: Any) -> Band | None:
    try:
        return Band(value)
    except ValueError:
        return None  # unknown during a preview: not judged


def _bands(router: Mapping[str, Any]) -> tuple[list[Band], Band] | None:
    """(each listed tenant's band, the default band) of a router config; None when a value is not known."""
    default = _band(router.get("default_band", Band.STANDARD.value))
    tenants = [_band(as_map(t).get("band", Band.STANDARD.value)) for t in as_list(router.get("tenants"))]
    if default is None or any(b is None for b in tenants):
        return None
    return [b for b in tenants if b is not None], default


def _top_band_only(resources: Sequence[Res], config: Config) -> Iterator[Finding]:
    environments = set(config["environments"])
    for res, router in router_configs(resources):
        if environment_of(res) not in environments:
            continue
        found = _bands(router)
        if found is None or not top_band_only(*found):
            continue
        yield Finding(
            f"{res.display}: every API key is in the top band ({Band.INTERACTIVE.value}: gateway.default_band and "
            "every gateway.tenants entry), so one tenant's burst of long prompts waits beside everyone's chats "
            f"with nothing ahead of it; put the keys that can wait in a lower band (default_band "
            f"{Band.STANDARD.value}, or a tenant in {Band.BATCH.value})",
            res.urn,
        )


TOP_BAND_ONLY = Rule(
    name="tenants-not-all-in-top-band",
    category=Category.RELIABILITY,
    severity=Severity.MEDIUM,
    description="In the listed environments (prod by default) not every API key is in the top priority band "
    "(interactive): gateway.default_band, or some gateway.tenants entry, is lower.",
    remediation="Set gateway.default_band to standard (its default), or list the tenants that can wait in a "
    "lower band.",
    stack_check=_top_band_only,
    settings=(Setting("environments", ENVIRONMENTS_SCHEMA, ["prod"], "Environments the rule applies to."),),
)

RULES = (TOP_BAND_ONLY,)
