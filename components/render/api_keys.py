"""The router's API keys: the Secret that holds them, and how plain keys become the hashes stored there. Pure.

Keys arrive as a Pulumi secret (a YAML/JSON list of {name, key, models}); the cluster only ever stores their
SHA-256 hashes, in the ``runtime.config.ApiKey`` shape the router reads.
"""

from __future__ import annotations

import hashlib
from typing import Any

import yaml
from pydantic import ValidationError

from components.core.redaction import REDACTED
from components.render import common
from components.render.common import Manifest
from components.spec import PlatformSpec
from runtime.config import PICKER_HOLDS_NO_TOKEN_LIMIT, ApiKey, Band, QueueOrder


def api_keys_secret(spec: PlatformSpec) -> Manifest:
    """The Secret the router reads hashed keys from; ``stringData`` is filled in as a Pulumi secret."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": common.metadata(spec, common.api_keys_secret_name(spec), common.ROUTER),
        "type": "Opaque",
    }


def hash_api_keys(raw: str, source: str, *, token_limits: bool = True) -> str:
    """A YAML/JSON list of {name, key, models?, requests_per_minute?, tokens_per_minute?, tenant?} -> ApiKey YAML.

    Raises ``ValueError`` naming ``source`` (the config key) and the entry for any mistake; the message never
    contains a key. ``token_limits`` False (an inference-extension gateway: no router reads the answers' usage)
    refuses a ``tokens_per_minute``, which would otherwise hold nothing.
    """
    if raw == REDACTED:  # inferstack plan: the value is not known offline
        return REDACTED
    try:
        entries = yaml.safe_load(raw)
    except yaml.YAMLError:
        raise ValueError(f"{source}: not valid YAML or JSON; give a list of {{name, key, models}}") from None
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{source}: give a non-empty list of {{name, key, models}}")
    out: list[dict[str, Any]] = []
    names: set[str] = set()
    for i, entry in enumerate(entries):
        where = f"{source}[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: each entry is a mapping with name and key")
        key = entry.get("key")
        name = entry.get("name")
        if not isinstance(key, str) or len(key) < 16:
            raise ValueError(f"{where}: 'key' must be a string of at least 16 characters")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: 'name' is required (who holds the key)")
        if name in names:
            raise ValueError(f"{where}: name {name!r} is used twice")
        names.add(name)
        unknown = set(entry) - {"name", "key", "models", "requests_per_minute", "tokens_per_minute", "tenant"}
        if unknown:
            raise ValueError(f"{where}: unknown fields {sorted(unknown)}")
        fields = {k: v for k, v in entry.items() if k != "key"}
        try:
            hashed = ApiKey.model_validate({**fields, "sha256": hashlib.sha256(key.encode()).hexdigest()})
        except ValidationError as err:
            first = err.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])
            raise ValueError(f"{where}.{loc}: {first['msg']}") from None
        if hashed.tokens_per_minute and not token_limits:
            raise ValueError(f"{where}: key {name!r} has tokens_per_minute: {PICKER_HOLDS_NO_TOKEN_LIMIT}")
        out.append(hashed.model_dump(mode="json", exclude_none=True))
    return yaml.safe_dump(out, sort_keys=False)


def named_key(raw: str, name: str, source: str, wanted_by: str) -> str:
    """The plain key of the entry ``name`` (a service's own key to the router, e.g. the batch service's).

    The list is checked as ``hash_api_keys`` checks it; ``ValueError`` names ``source`` and ``wanted_by`` (the
    spec field that asks for it) when there is no such entry. The message never contains a key.
    """
    if raw == REDACTED:
        return REDACTED
    hash_api_keys(raw, source)
    for entry in yaml.safe_load(raw):
        if entry.get("name") == name:
            return str(entry["key"])
    raise ValueError(
        f"{source}: no key named {name!r}, which {wanted_by} names; add {{name: {name}, key: ...}} to the list"
        " (its scopes and rate limits bound that service's traffic)"
    )


def tenants_note(spec: PlatformSpec) -> str | None:
    """The plan's account of who goes first when a model's replicas are full: each tenant's weight and band, and
    what a key of no listed tenant gets. None when the gateway keeps every default (each key a tenant of its own,
    weight 1, band standard, fair order)."""
    g = spec.gateway
    if not g.tenants and g.default_band is Band.STANDARD and g.queue_order is QueueOrder.FAIR:
        return None
    where = "router" if g.runs_router else "endpoint picker"
    if g.queue_order is QueueOrder.FIFO:
        return f"tenants: the {where} serves waiting requests in arrival order (queue_order fifo)"
    listed = "; ".join(f"{t.name} weight {t.weight:g}, {t.band.value}" for t in g.tenants)
    return (
        f"tenants, when a model's replicas are full ({where}): {listed + '; ' if listed else ''}any other key weight"
        f" 1, {g.default_band.value}. A higher band goes first; within a band the tenant served the fewest tokens"
        " per unit of weight; a request may lower its band (x-inferstack-priority), never raise it"
    )
