"""Where a model's replicas are: static addresses or Kubernetes EndpointSlices, as a stream of lists.

The router and the health monitor both consume :func:`watch_replicas`; each yield is the complete,
sorted list of replica base URLs (``http://10.0.0.5:8000``), emitted only when it changes.

Why a lean aiohttp watch rather than ``kubernetes_asyncio``: we need exactly one list + one watch
call on one resource. ``kubernetes_asyncio`` would add ~30 MiB of generated models to every runtime
image and its own aiohttp pin, for two GET requests. The protocol is small and stable
(``discovery.k8s.io/v1`` list, then ``?watch=1&resourceVersion=...`` newline-delimited JSON events,
``410 Gone`` when the version expired), so we speak it directly with the aiohttp the images already
carry, and test it against a fake API server on loopback.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from runtime.config import FileDiscovery, KubernetesDiscovery, ModelTarget

log = logging.getLogger("inferstack.discovery")

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
WATCH_TIMEOUT_S = 240  # the API server ends a watch after this; we simply resume from the last version
BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 30.0


class WatchExpiredError(Exception):
    """The resourceVersion we watch from is too old (HTTP 410 / ERROR event): list again."""


@dataclass(frozen=True)
class KubeApi:
    """How to reach the Kubernetes API server; :meth:`in_cluster` reads the pod's service account."""

    base_url: str
    token_path: Path | None = None
    ca_path: Path | None = None
    backoff_start_s: float = BACKOFF_START_S
    backoff_max_s: float = BACKOFF_MAX_S
    watch_timeout_s: int = WATCH_TIMEOUT_S
    extra_headers: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def in_cluster(cls) -> KubeApi:
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise RuntimeError(
                "Kubernetes discovery needs in-cluster credentials (KUBERNETES_SERVICE_HOST is not set)"
            )
        if ":" in host:  # IPv6 service address
            host = f"[{host}]"
        return cls(
            base_url=f"https://{host}:{port}",
            token_path=SERVICE_ACCOUNT_DIR / "token",
            ca_path=SERVICE_ACCOUNT_DIR / "ca.crt",
        )

    def headers(self) -> dict[str, str]:
        """Re-read the token each call: projected service-account tokens rotate (about hourly)."""
        out = {"Accept": "application/json", **self.extra_headers}
        if self.token_path is not None and self.token_path.exists():
            out["Authorization"] = f"Bearer {self.token_path.read_text().strip()}"
        return out

    def ssl_context(self) -> ssl.SSLContext | bool:
        if self.ca_path is not None and self.ca_path.exists():
            return ssl.create_default_context(cafile=str(self.ca_path))
        return True


# --- pure parts -----------------------------------------------------------------------------------


def slice_urls(endpoint_slice: Mapping[str, Any], port_name: str) -> list[str]:
    """Base URLs of the ready endpoints of one EndpointSlice, on the named port.

    ``conditions.ready`` absent means ready (the API's documented default); terminating endpoints
    are reported not ready by Kubernetes, so they leave the list as soon as the pod starts to stop.
    A slice with a single unnamed port uses it whatever ``port_name`` says.
    """
    ports = endpoint_slice.get("ports") or []
    port: int | None = None
    for p in ports:
        if p.get("name") == port_name and p.get("port"):
            port = int(p["port"])
    if port is None and len(ports) == 1 and not ports[0].get("name") and ports[0].get("port"):
        port = int(ports[0]["port"])
    if port is None:
        return []
    urls = []
    for ep in endpoint_slice.get("endpoints") or []:
        conditions = ep.get("conditions") or {}
        if conditions.get("ready") is False:
            continue
        addresses = ep.get("addresses") or []
        if not addresses:
            continue
        addr = str(addresses[0])  # all addresses of one endpoint are fungible; the API says use the first
        host = f"[{addr}]" if ":" in addr else addr
        urls.append(f"http://{host}:{port}")
    return urls


def fleet_urls(slices: Mapping[str, Mapping[str, Any]], port_name: str) -> list[str]:
    """The de-duplicated, sorted union over all slices of a Service."""
    return sorted({u for s in slices.values() for u in slice_urls(s, port_name)})


def static_urls(target: ModelTarget) -> list[str]:
    return sorted({str(b.url).rstrip("/") for b in target.static_backends})


def file_sd_urls(groups: Any, service: str) -> list[str]:
    """Base URLs of the targets of the file_sd groups labelled ``service`` (``host:port`` -> ``http://host:port``)."""
    if not isinstance(groups, list):
        raise ValueError("a file_sd document is a JSON list of {targets, labels} groups")
    urls = set()
    for group in groups:
        if not isinstance(group, dict) or (group.get("labels") or {}).get("service") != service:
            continue
        for target in group.get("targets") or []:
            urls.add(f"http://{str(target).removeprefix('http://').rstrip('/')}")
    return sorted(urls)


# --- the watch ------------------------------------------------------------------------------------


async def watch_replicas(target: ModelTarget, api: KubeApi | None = None) -> AsyncIterator[list[str]]:
    """Yield the complete current list of replica base URLs each time it changes.

    Static targets yield once and then wait forever (the config reloader restarts the watch when the
    file changes). Kubernetes targets list then watch EndpointSlices, resume on watch expiry and
    reconnect with jittered exponential backoff on errors; the last known list stays in force
    meanwhile, so an API-server outage never empties the fleet.
    """
    if target.discovery is None:
        yield static_urls(target)
        await asyncio.Event().wait()
        return
    if isinstance(target.discovery, FileDiscovery):
        async for urls in _watch_file(target.discovery):
            yield urls
        return
    async for urls in _watch_kubernetes(target.discovery, api or KubeApi.in_cluster()):
        yield urls


async def _watch_file(disc: FileDiscovery) -> AsyncIterator[list[str]]:
    """Re-read the file when it changes (its writer replaces it atomically); a missing file is no replica,
    a file that does not parse keeps the last list in force."""
    last: list[str] | None = None
    seen: tuple[int, int] | None = None
    while True:
        try:
            stat = disc.path.stat()
            stamp = (stat.st_mtime_ns, stat.st_ino)
            urls = last if stamp == seen else file_sd_urls(json.loads(disc.path.read_bytes()), disc.service)
            seen = stamp
        except FileNotFoundError:
            urls, seen = [], None
        except (OSError, ValueError) as err:
            log.warning("discovery file %s unreadable: %s; keeping the last replica list", disc.path, err)
            urls = last
        if urls is not None and urls != last:
            last = urls
            yield urls
        await asyncio.sleep(disc.poll_interval_ms / 1000)


@dataclass
class _Cursor:
    """What we know of a Service's slices and the resourceVersion to resume watching from."""

    slices: dict[str, dict[str, Any]] = field(default_factory=dict)
    version: str = ""


async def _watch_kubernetes(disc: KubernetesDiscovery, api: KubeApi) -> AsyncIterator[list[str]]:
    path = f"/apis/discovery.k8s.io/v1/namespaces/{disc.namespace}/endpointslices"
    selector = f"{SERVICE_NAME_LABEL}={disc.service}"
    last: list[str] | None = None
    backoff = api.backoff_start_s
    timeout = aiohttp.ClientTimeout(total=None, connect=10, sock_read=api.watch_timeout_s + 30)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while True:
            try:
                cursor = await _list(session, api, path, selector)
                backoff = api.backoff_start_s
                urls = fleet_urls(cursor.slices, disc.port_name)
                while True:  # resume watches from the last version until it expires
                    if urls != last:
                        last = urls
                        yield urls
                    async for _ in _watch(session, api, path, selector, cursor):
                        urls = fleet_urls(cursor.slices, disc.port_name)
                        if urls != last:
                            last = urls
                            yield urls
            except WatchExpiredError:
                log.info("endpointslice watch of %s expired; listing again", disc.service)
                continue
            except (aiohttp.ClientError, TimeoutError, ValueError, OSError) as err:
                log.warning(
                    "endpointslice watch of %s failed: %s; retrying in %.1fs", disc.service, err, backoff
                )
                await asyncio.sleep(backoff * (0.5 + random.random() / 2))
                backoff = min(backoff * 2, api.backoff_max_s)


async def _check(resp: aiohttp.ClientResponse) -> None:
    if resp.status == 410:
        raise WatchExpiredError
    if resp.status != 200:
        raise aiohttp.ClientResponseError(
            resp.request_info, resp.history, status=resp.status, message=(await resp.text())[:200]
        )


async def _list(session: aiohttp.ClientSession, api: KubeApi, path: str, selector: str) -> _Cursor:
    url = api.base_url + path
    params = {"labelSelector": selector}
    async with session.get(url, params=params, headers=api.headers(), ssl=api.ssl_context()) as resp:
        await _check(resp)
        body = await resp.json(content_type=None)
    items = body.get("items") or []
    slices = {item["metadata"]["name"]: item for item in items if item.get("metadata", {}).get("name")}
    return _Cursor(slices, str(body.get("metadata", {}).get("resourceVersion", "")))


async def _watch(
    session: aiohttp.ClientSession, api: KubeApi, path: str, selector: str, cursor: _Cursor
) -> AsyncIterator[None]:
    """Follow one watch call until the server ends it; updates ``cursor`` and yields after each change."""
    params = {
        "labelSelector": selector,
        "watch": "1",
        "resourceVersion": cursor.version,
        "allowWatchBookmarks": "true",
        "timeoutSeconds": str(api.watch_timeout_s),
    }
    url = api.base_url + path
    async with session.get(url, params=params, headers=api.headers(), ssl=api.ssl_context()) as resp:
        await _check(resp)
        while True:
            line = await resp.content.readline()
            if not line:
                return
            if not line.strip():
                continue
            event = json.loads(line)
            kind = event.get("type")
            obj = event.get("object") or {}
            if kind == "ERROR":
                if obj.get("code") == 410:
                    raise WatchExpiredError
                raise ValueError(f"watch error: {obj.get('message', obj)}")
            meta = obj.get("metadata") or {}
            cursor.version = str(meta.get("resourceVersion", cursor.version))
            name = meta.get("name")
            if kind == "BOOKMARK" or not name:
                continue
            if kind == "DELETED":
                cursor.slices.pop(name, None)
            elif kind in ("ADDED", "MODIFIED"):
                cursor.slices[name] = obj
            yield None
