"""API keys (only SHA-256 hashes are held), model scopes, and per-key request/token rate limits: one
implementation for every front end that checks keys (the router, and the endpoint picker behind a gateway).

Decisions are pure functions of (key table, buckets, now); the front end turns them into 401/403/429.
Limits are token buckets refilled continuously: ``requests_per_minute`` is charged one per request
on admission; ``tokens_per_minute`` is charged an estimate on admission (the router reserves what the
request may cost) and settled to the real usage (prompt + completion) when the answer is known, and a key
whose token bucket is below zero is refused until it refills.

A key's name is who holds it: files and batches belong to it, and the batch service names a line's
owner by it. So names (and keys) are unique across the inline keys and the keys file; the loader
refuses a table where two entries share either.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from runtime.config import ApiKey
from runtime.config_file import ConfigError, read_yaml, validation_lines

_KEYS = TypeAdapter(list[ApiKey])


class Bucket:
    """A token bucket of ``per_minute`` capacity refilled at ``per_minute / 60`` per second. A share of a
    limit below one per minute still holds one (a request must fit), and refills at its own rate."""

    __slots__ = ("capacity", "level", "rate_per_s", "updated")

    def __init__(self, per_minute: float, now: float) -> None:
        self.capacity = max(1.0, float(per_minute))
        self.rate_per_s = per_minute / 60.0
        self.level = self.capacity
        self.updated = now

    def refill(self, now: float) -> float:
        elapsed = now - self.updated
        if elapsed > 0:
            self.level = min(self.capacity, self.level + elapsed * self.rate_per_s)
            self.updated = now
        return self.level

    def seconds_until_positive(self) -> float:
        return max(1.0, (1.0 - self.level) / self.rate_per_s) if self.rate_per_s > 0 else 60.0


def replica_share(per_minute: int, replicas: int) -> float:
    """One front end's share of a key's per-minute limit when ``replicas`` of them hold buckets of their own (the
    endpoint picker's replicas; the routers while their shared store is down): together they refill at the
    limit. A share below one still admits a request (``Bucket``)."""
    return per_minute / max(1, replicas)


@dataclass
class Principal:
    """A known key holder and its live buckets."""

    key: ApiKey
    requests: Bucket | None
    tokens: Bucket | None

    @property
    def name(self) -> str:
        return self.key.name


@dataclass(frozen=True)
class Denied:
    status: int
    message: str
    code: str
    retry_after_s: float | None = None


def hash_key(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def load_keys_file(path: Path) -> list[ApiKey]:
    """Read a YAML list of ApiKey (a mounted Secret); ``ConfigError``, one line per mistake, naming the file."""
    raw = read_yaml(path, "API keys file") or []
    try:
        return _KEYS.validate_python(raw)
    except ValidationError as err:
        raise ConfigError(validation_lines(path, err)) from None


def keys_path(file: Path | None, config_path: Path) -> Path | None:
    """The API keys file, relative to the config file's directory unless absolute."""
    if file is None:
        return None
    return file if file.is_absolute() else config_path.parent / file


def files_digest(*paths: Path | None) -> str:
    """One hash of the files' contents (missing ones count as empty): a change to any changes it."""
    h = hashlib.sha256()
    for p in paths:
        if p is not None:
            with contextlib.suppress(OSError):
                h.update(p.read_bytes())
    return h.hexdigest()


def key_problems(keys: Iterable[tuple[str, ApiKey]]) -> list[str]:
    """Why ``keys`` (each with where it was given) cannot be one table: a name or a key used twice (two
    holders would share one owner's files and batches, or one key would silently stand for two names), or a
    name that cannot travel in a header. Never shows a key, only names."""
    problems: list[str] = []
    names: dict[str, str] = {}
    hashes: dict[str, str] = {}
    for where, key in keys:
        if not key.name or not key.name.isprintable() or key.name != key.name.strip():
            problems.append(
                f"{where}: name {key.name!r}: give a non-empty name without control characters or spaces"
                " at either end (it travels in a header)"
            )
        if key.name in names:
            problems.append(
                f"{where}: name {key.name!r} is used by {names[key.name]} already; each key needs its own"
                " name (files and batches belong to a name)"
            )
        if key.sha256 in hashes:
            problems.append(f"{where}: the same key as {hashes[key.sha256]}; give each holder its own key")
        names.setdefault(key.name, where)
        hashes.setdefault(key.sha256, f"{where} ({key.name!r})")
    return problems


def load_key_table(
    inline: Iterable[ApiKey],
    file: Path | None,
    now: float,
    previous: KeyTable | None = None,
    replicas: int = 1,
) -> KeyTable:
    """The inline keys plus those of ``file`` (resolved already); ``ConfigError`` when the file is bad or
    the keys together are not one table (``key_problems``), one line per problem. ``replicas``: see
    ``KeyTable``."""
    placed = [(f"router.api_keys[{i}]", key) for i, key in enumerate(inline)]
    if file is not None:
        placed += [(f"{file}: [{i}]", key) for i, key in enumerate(load_keys_file(file))]
    problems = key_problems(placed)
    if problems:
        raise ConfigError(problems)
    return KeyTable([key for _, key in placed], now, previous, replicas)


class KeyTable:
    """Hash -> principal, and name -> principal. Rebuilt on reload; buckets of keys that stay are carried
    over. ``ValueError`` for keys that are not one table (``key_problems``: the loader says so first).

    ``replicas``: how many front ends of this kind hold buckets of their own with no shared store (the
    endpoint picker's replicas): each admits ``requests_per_minute / replicas`` of a key, so together they
    admit no more than the key's limit."""

    def __init__(
        self, keys: list[ApiKey], now: float, previous: KeyTable | None = None, replicas: int = 1
    ) -> None:
        problems = key_problems((f"keys[{i}]", key) for i, key in enumerate(keys))
        if problems:
            raise ValueError("; ".join(problems))
        self.by_hash: dict[str, Principal] = {}
        for key in keys:
            old = previous.by_hash.get(key.sha256) if previous else None
            if old is not None and old.key == key:
                self.by_hash[key.sha256] = old
                continue
            self.by_hash[key.sha256] = Principal(
                key,
                Bucket(replica_share(key.requests_per_minute, replicas), now)
                if key.requests_per_minute
                else None,
                Bucket(key.tokens_per_minute, now) if key.tokens_per_minute else None,
            )
        self.by_name: dict[str, Principal] = {p.name: p for p in self.by_hash.values()}

    def __len__(self) -> int:
        return len(self.by_hash)

    def authenticate(self, authorization: bytes | None, required: bool) -> Principal | Denied | None:
        """The caller's principal; None when no key is required and none (or an unknown one) is given."""
        if authorization is None:
            if required:
                return Denied(401, "missing API key: send 'Authorization: Bearer <key>'", "invalid_api_key")
            return None
        scheme, _, token = authorization.partition(b" ")
        if scheme.lower() != b"bearer" or not token.strip():
            if required:
                return Denied(
                    401, "malformed Authorization header: expected 'Bearer <key>'", "invalid_api_key"
                )
            return None
        principal = self.by_hash.get(hashlib.sha256(token.strip()).hexdigest())
        if principal is None and required:
            return Denied(401, "invalid API key", "invalid_api_key")
        return principal


def scope_denied(principal: Principal, model: str) -> Denied | None:
    """403 when the key is scoped to other models."""
    scopes = principal.key.models
    if scopes and model not in scopes:
        return Denied(403, f"key {principal.name!r} may not use model {model!r}", "model_not_allowed")
    return None


def admit(principal: Principal, model: str, now: float) -> Denied | None:
    """Scope and rate checks for one request; charges the request bucket when admitted."""
    denied = scope_denied(principal, model)
    if denied is not None:
        return denied
    tokens = principal.tokens
    if tokens is not None and tokens.refill(now) < 0:
        return Denied(
            429,
            f"key {principal.name!r} exceeded {int(tokens.capacity)} tokens per minute",
            "rate_limit_exceeded",
            tokens.seconds_until_positive(),
        )
    reqs = principal.requests
    if reqs is not None:
        if reqs.refill(now) < 1.0:
            return Denied(
                429,
                f"key {principal.name!r} exceeded {_per_minute(reqs.capacity)} requests per minute",
                "rate_limit_exceeded",
                reqs.seconds_until_positive(),
            )
        reqs.level -= 1.0
    return None


def _per_minute(rate: float) -> str:
    return str(int(rate)) if rate.is_integer() else f"{rate:.1f}"


def charge_tokens(principal: Principal | None, tokens: int, now: float) -> None:
    """Take ``tokens`` from the key's token bucket; a negative charge gives back what a reservation took
    beyond the real usage (never above the bucket's capacity)."""
    if principal is None or principal.tokens is None or tokens == 0:
        return
    bucket = principal.tokens
    bucket.refill(now)
    bucket.level = min(bucket.capacity, bucket.level - tokens)
