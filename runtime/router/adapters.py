"""LoRA adapters on replicas: which ones each replica holds, and loading one where a request needs it.

A request whose ``model`` is an adapter routes among its base model's replicas (the ``adapter_affinity``
scorer prefers those already holding it). Before the request goes out, :func:`ensure_loaded` makes sure the
chosen replica has it: one load call per (replica, adapter) however many requests wait on it; the replica's
least recently used adapter is unloaded first when it is full; a load the engine refuses is not tried again
on that replica for ``adapter_load_backoff_ms`` (requests get a 4xx naming the adapter meanwhile, never a
load storm). What a replica holds is re-read from the engine's model list by the probe or the health
feed, so a replica that restarted (and lost its adapters) loads them again on the next request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp

from runtime.engines import LoraCli

log = logging.getLogger("inferstack.router.adapters")

LOAD_TIMEOUT_S = 120.0  # an adapter of a large model is a few hundred MB read from the model cache


@dataclass(frozen=True)
class LoadFailure:
    """Why an adapter could not be made ready on a replica. ``retryable``: the replica failed (connection,
    5xx), try another one; otherwise the engine refused the adapter itself (its files, its rank)."""

    status: int
    message: str
    retryable: bool


class ReplicaAdapters:
    """One replica's adapters: loaded ones in least-recently-used order, loads in flight, refused loads."""

    __slots__ = ("failed", "loaded", "loading")

    def __init__(self) -> None:
        self.loaded: OrderedDict[str, float] = OrderedDict()  # name -> wall time it was loaded (LRU order)
        self.loading: dict[str, asyncio.Future[LoadFailure | None]] = {}
        self.failed: dict[str, tuple[float, LoadFailure]] = {}  # name -> (monotonic until, why)

    def holds(self, name: str) -> bool:
        return name in self.loaded

    def touch(self, name: str) -> None:
        if name in self.loaded:
            self.loaded.move_to_end(name)

    def sync(self, listed: Iterable[str], observed_at: float) -> None:
        """Follow the engine's own list (read at wall time ``observed_at``): adapters it lists are held;
        ones it no longer lists are gone (a restart), unless loaded after that list was read."""
        present = set(listed)
        for name in [n for n, at in self.loaded.items() if n not in present and at < observed_at]:
            del self.loaded[name]
        for name in present:
            if name not in self.loaded:
                self.loaded[name] = observed_at
                self.loaded.move_to_end(name, last=False)  # known to the engine, not used by us yet

    def backing_off(self, name: str, now: float) -> LoadFailure | None:
        entry = self.failed.get(name)
        if entry is None:
            return None
        if now >= entry[0]:
            del self.failed[name]
            return None
        return entry[1]


def listed_adapters(models_body: Any, base: str) -> list[str]:
    """Adapter names an engine's ``/v1/models`` lists with ``parent`` = ``base``."""
    data = models_body.get("data") if isinstance(models_body, dict) else None
    return [
        str(m["id"])
        for m in data or []
        if isinstance(m, dict) and m.get("parent") == base and m.get("id") is not None
    ]


def _engine_message(status: int, text: str) -> str:
    try:
        body = json.loads(text)
        message = body.get("error", {}).get("message") if isinstance(body, dict) else None
    except ValueError:
        message = None
    return str(message or text or f"status {status}")[:300]


async def _post(
    session: aiohttp.ClientSession, url: str, body: dict[str, str], timeout_s: float
) -> tuple[int, str]:
    async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
        return resp.status, (await resp.text())[:4096]


async def _load(
    session: aiohttp.ClientSession, base_url: str, lora: LoraCli, name: str, path: str
) -> LoadFailure | None:
    try:
        status, text = await _post(
            session, base_url + lora.load_path, {"lora_name": name, "lora_path": path}, LOAD_TIMEOUT_S
        )
    except (aiohttp.ClientError, TimeoutError) as err:
        return LoadFailure(
            502, f"loading adapter {name!r} on a replica failed: {err or type(err).__name__}", True
        )
    if status == 200:
        return None
    message = _engine_message(status, text)
    if status == 400 and "already been loaded" in message:
        return None  # it is there (our view was behind the engine's): as good as loaded
    if status >= 500:
        return LoadFailure(502, f"loading adapter {name!r} failed on a replica ({status}): {message}", True)
    return LoadFailure(424, f"adapter {name!r} could not be loaded: {message}", False)


async def _unload(session: aiohttp.ClientSession, base_url: str, lora: LoraCli, name: str) -> None:
    try:
        status, text = await _post(session, base_url + lora.unload_path, {"lora_name": name}, 30.0)
    except (aiohttp.ClientError, TimeoutError) as err:
        log.warning("unloading adapter %s from %s failed: %s", name, base_url, err)
        return
    if status not in (200, 404):  # 404: already gone (a restart, or the engine's own eviction)
        log.warning("unloading adapter %s from %s: %s %s", name, base_url, status, text[:200])


async def ensure_loaded(
    session: aiohttp.ClientSession,
    base_url: str,
    held: ReplicaAdapters,
    lora: LoraCli,
    name: str,
    path: str,
    *,
    limit: int,
    backoff_s: float,
    on_load: Any = None,
) -> LoadFailure | None:
    """Make ``name`` loaded on the replica at ``base_url``: at once if it is, else by one load call that
    every concurrent request for it waits on. None when it is ready; a ``LoadFailure`` otherwise."""
    if held.holds(name):
        held.touch(name)
        return None
    failed = held.backing_off(name, time.monotonic())
    if failed is not None:
        return failed
    pending = held.loading.get(name)
    if pending is not None:
        return await asyncio.shield(pending)
    future: asyncio.Future[LoadFailure | None] = asyncio.get_running_loop().create_future()
    held.loading[name] = future
    outcome: LoadFailure | None = LoadFailure(502, f"loading adapter {name!r} was cancelled", True)
    try:
        while held.loaded and len(held.loaded) + len(held.loading) > limit:
            victim, _ = held.loaded.popitem(last=False)
            log.info("unloading adapter %s from %s to make room for %s", victim, base_url, name)
            await _unload(session, base_url, lora, victim)
        started = time.monotonic()
        outcome = await _load(session, base_url, lora, name, path)
        if on_load is not None:
            on_load(name, outcome, time.monotonic() - started)
        if outcome is None:
            held.loaded[name] = time.time()
        elif not outcome.retryable:
            held.failed[name] = (time.monotonic() + backoff_s, outcome)
            log.warning("adapter %s refused by %s: %s", name, base_url, outcome.message)
        return outcome
    finally:
        held.loading.pop(name, None)
        future.set_result(outcome)
