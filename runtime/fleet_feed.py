"""The health monitor's feed (``GET /v1/backends``) as a front end reads it: per replica, may it take traffic,
and its engine's queue, running count and KV usage. Shared by front ends that route on the feed (the
router and the endpoint picker; the shape is ``runtime.health.feed``, which front ends may not import):
``read_feed`` is the pure part, ``fetch_feed`` the one GET, ``apply_signals`` what a front end does with an
entry.

A feed older than its own ``stale_after_s`` counts as absent (the caller probes engines itself), and a
replica whose metrics the monitor could not refresh has unknown load, never zero load.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from runtime.config import HealthSettings
from runtime.replica import ReplicaState

log = logging.getLogger("inferstack.feed")

#: When the feed does not say how long it stays good.
DEFAULT_STALE_AFTER_S = 15.0


@dataclass(frozen=True, slots=True)
class ReplicaSignals:
    """One replica's entry in the feed."""

    model: str
    url: str
    routable: bool
    queued: float | None
    running: float | None
    kv_usage: float | None
    adapters: tuple[str, ...] | None = None
    """The LoRA adapters the replica holds, when the monitor says (it lists them for models with adapters)."""
    admitted: bool = True
    """The replica passed a probe since it was found: its ejection took it out of rotation, and a panic
    (``runtime.model_view.in_panic``) puts it back. One never admitted (an engine still loading) stays out."""


@dataclass(frozen=True, slots=True)
class VersionWeights:
    """The weights the monitor decided for a model's versions (a canary rolled back, or restored)."""

    model: str
    weights: Mapping[str, float]
    reason: str


#: The panic threshold when the feed does not say (the health monitor's default).
DEFAULT_MAX_EJECTED_PERCENT: float = HealthSettings.model_fields["max_ejected_percent"].default


@dataclass(frozen=True, slots=True)
class Feed:
    generated_at: float
    replicas: list[ReplicaSignals]
    versions: list[VersionWeights]
    max_ejected_percent: float = DEFAULT_MAX_EJECTED_PERCENT
    """The monitor's panic threshold, so the front ends and the monitor agree on when a model is in panic."""
    routing_changes: int | None = None
    """The monitor's count of replicas turned routable or not; None from a monitor that cannot be waited on
    (``fetch_feed``'s ``wait``)."""


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def read_feed(feed: Mapping[str, Any], now_unix_s: float) -> Feed | None:
    """A fresh feed; None when the feed is stale or not a feed at all."""
    generated = _number(feed.get("generated_at"))
    stale_after = _number(feed.get("stale_after_s")) or DEFAULT_STALE_AFTER_S
    listed = feed.get("backends")
    if generated is None or now_unix_s - generated > stale_after or not isinstance(listed, list):
        return None
    out: list[ReplicaSignals] = []
    for entry in listed:
        if not isinstance(entry, Mapping):
            continue
        metrics = entry.get("metrics")
        fresh = isinstance(metrics, Mapping) and not entry.get("metrics_stale", False)
        m: Mapping[str, Any] = metrics if fresh and isinstance(metrics, Mapping) else {}
        adapters = entry.get("adapters")
        out.append(
            ReplicaSignals(
                model=str(entry.get("model")),
                url=str(entry.get("url", "")).rstrip("/"),
                routable=bool(entry.get("routable", entry.get("state") != "ejected")),
                queued=_number(m.get("queued")),
                running=_number(m.get("running")),
                kv_usage=_number(m.get("kv_usage")),
                adapters=tuple(str(a) for a in adapters) if isinstance(adapters, list) else None,
                admitted=entry.get("admitted") is not False,
            )
        )
    threshold = _number(feed.get("max_ejected_percent"))
    changes = feed.get("routing_changes")
    return Feed(
        generated,
        out,
        _versions(feed.get("versions")),
        DEFAULT_MAX_EJECTED_PERCENT if threshold is None else threshold,
        changes if isinstance(changes, int) and not isinstance(changes, bool) and changes >= 0 else None,
    )


def _versions(entries: Any) -> list[VersionWeights]:
    out: list[VersionWeights] = []
    for entry in entries if isinstance(entries, list) else ():
        weights = entry.get("weights") if isinstance(entry, Mapping) else None
        if not isinstance(weights, Mapping):
            continue
        numbers = {str(v): _number(w) for v, w in weights.items()}
        if any(w is None for w in numbers.values()):
            continue
        reason = str(entry.get("reason") or "")
        out.append(
            VersionWeights(str(entry.get("model")), {v: float(w or 0) for v, w in numbers.items()}, reason)
        )
    return out


def apply_signals(entry: ReplicaSignals, replica: ReplicaState, panic: bool = False) -> bool:
    """Copy one entry onto the front end's replica; True when that changed whether it may take traffic. In
    panic (its model's ``ModelView.panic``) an admitted replica takes traffic whatever the entry says; an
    ejected one stays ``ejected`` (reported unhealthy) all the same."""
    was = replica.healthy
    replica.update_signals(
        healthy=entry.routable or (panic and entry.admitted),
        queued=entry.queued,
        running=entry.running,
        kv_usage=entry.kv_usage,
        ejected=not entry.routable,
    )
    return replica.healthy != was


async def fetch_feed(
    session: aiohttp.ClientSession, url: str, timeout_s: float, wait: tuple[int, float] | None = None
) -> Feed | None:
    """The feed, or None when the monitor is unreachable, answers badly or is stale (the caller
    then probes the engines itself). ``wait`` = (the ``routing_changes`` the caller has, seconds): the monitor
    answers once a replica turned routable or not since, or after that long (a long poll; ``timeout_s`` is on
    top of it)."""
    params = {"after": str(wait[0]), "wait_ms": str(int(wait[1] * 1000))} if wait is not None else None
    total = timeout_s + (wait[1] if wait is not None else 0.0)
    try:
        async with session.get(url, params=params, timeout=aiohttp.ClientTimeout(total=total)) as resp:
            if resp.status != 200:
                return None
            feed = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError, RecursionError) as err:
        log.warning("health feed %s unavailable (%s); probing engines directly", url, err)
        return None
    return read_feed(feed, time.time()) if isinstance(feed, dict) else None
