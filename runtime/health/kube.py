"""Kubernetes Events on ejection / readmission, and the optional remediation (delete a wedged pod).

Why ``kubernetes_asyncio``: it is the official client's asyncio port (generated from the API's
OpenAPI, kept in step with Kubernetes releases) and speaks aiohttp, which the image carries anyway.
It is imported only when events or remediation are switched on.

A canary rollback is an Event (reason ``CanaryRolledBack``) on a pod of the canary version.

RBAC the control plane must render for the health monitor's ServiceAccount (least privilege), in
each namespace that holds engines discovered through EndpointSlices:

- ``""`` (core) ``events``: ``create`` — when ``health.kubernetes_events`` is on.
- ``""`` (core) ``pods``: ``list`` — to find the pod behind a replica's IP
  (``fieldSelector=status.podIP=...``), for events and remediation.
- ``""`` (core) ``pods``: ``delete`` — only when ``health.remediate_after_s`` is set.
- Discovery itself (``runtime.discovery``): ``discovery.k8s.io`` ``endpointslices``: ``list``, ``watch``.

Replicas given as static URLs have no pod to point at: no events, no remediation.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
from typing import Any, Protocol
from urllib.parse import urlsplit

from runtime.config import KubernetesDiscovery, ModelTarget
from runtime.health.state import State, Transition, is_ejection, is_readmission

log = logging.getLogger("inferstack.health.kube")

COMPONENT = "inferstack-health"
REASON_EJECTED = "EngineEjected"
REASON_READMITTED = "EngineReadmitted"
REASON_REMEDIATED = "EngineRemediated"
REASON_ROLLED_BACK = "CanaryRolledBack"


def rollback_event(canary: ModelTarget, metric: str, reason: str) -> tuple[str, str, str]:
    """(reason, type, message) of the Event a canary rollback deserves (pure)."""
    version = canary.version_of.version if canary.version_of else canary.name
    return (
        REASON_ROLLED_BACK,
        "Warning",
        f"model {canary.served_name}: canary version {version} rolled back to the stable version "
        f"({metric}): {reason}"[:1000],
    )


class Actions(Protocol):
    """What the monitor asks of the cluster; a no-op implementation serves static fleets and tests."""

    async def on_transition(self, target: ModelTarget, url: str, transition: Transition) -> None: ...

    async def remediate(self, target: ModelTarget, url: str, wedged_s: float) -> bool: ...

    async def on_rollback(self, canary: ModelTarget, urls: list[str], metric: str, reason: str) -> None: ...

    async def close(self) -> None: ...


class NoActions:
    async def on_transition(self, target: ModelTarget, url: str, transition: Transition) -> None:
        return None

    async def remediate(self, target: ModelTarget, url: str, wedged_s: float) -> bool:
        return False

    async def on_rollback(self, canary: ModelTarget, urls: list[str], metric: str, reason: str) -> None:
        return None

    async def close(self) -> None:
        return None


def event_for(transition: Transition, url: str, model: str) -> tuple[str, str, str] | None:
    """(reason, type, message) of the Event a transition deserves, or ``None`` (pure)."""
    if is_ejection(transition):
        why = transition.reason.value if transition.reason else "unknown"
        detail = f": {transition.detail}" if transition.detail else ""
        return REASON_EJECTED, "Warning", f"model {model}: replica {url} ejected ({why}){detail}"[:1000]
    if is_readmission(transition):
        note = " (degraded)" if transition.after is State.DEGRADED else ""
        return REASON_READMITTED, "Normal", f"model {model}: replica {url} readmitted{note}"
    return None


class KubernetesActions:
    """Events and pod deletion through the Kubernetes API; every failure is logged, never raised."""

    def __init__(self, api_client: Any, *, events: bool, remediation: bool) -> None:
        from kubernetes_asyncio import client  # noqa: PLC0415 - only when events/remediation are on

        self._client = client
        self._api = api_client
        self._core = client.CoreV1Api(api_client)
        self._events = events
        self._remediation = remediation
        self._instance = os.environ.get("POD_NAME") or socket.gethostname()

    @classmethod
    def in_cluster(cls, *, events: bool, remediation: bool) -> KubernetesActions:
        from kubernetes_asyncio import client, config  # noqa: PLC0415 - only when switched on

        cfg = client.Configuration()
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        return cls(client.ApiClient(cfg), events=events, remediation=remediation)

    @classmethod
    def for_host(cls, host: str, *, events: bool, remediation: bool) -> KubernetesActions:
        """An API server at a plain URL (tests use a fake one on 127.0.0.1)."""
        from kubernetes_asyncio import client  # noqa: PLC0415 - only when events/remediation are on

        cfg = client.Configuration()
        cfg.host = host
        return cls(client.ApiClient(cfg), events=events, remediation=remediation)

    async def close(self) -> None:
        await self._api.close()

    async def _pod_for(self, target: ModelTarget, url: str) -> Any | None:
        if not isinstance(target.discovery, KubernetesDiscovery):
            return None  # a replica outside Kubernetes has no pod
        ip = (urlsplit(url).hostname or "").strip("[]")
        if not ip:
            return None
        pods = await self._core.list_namespaced_pod(
            target.discovery.namespace, field_selector=f"status.podIP={ip}", limit=5
        )
        live = [p for p in pods.items if not (p.metadata and p.metadata.deletion_timestamp)]
        return live[0] if live else None

    async def on_transition(self, target: ModelTarget, url: str, transition: Transition) -> None:
        if not self._events:
            return
        spec = event_for(transition, url, target.name)
        if spec is None:
            return
        try:
            pod = await self._pod_for(target, url)
            if pod is None:
                log.info("no pod found for %s; event not emitted", url)
                return
            await self._emit(pod, *spec)
        except Exception as err:  # an unreachable API server must not stop probing
            log.warning("could not emit event for %s: %s", url, err)

    async def _emit(self, pod: Any, reason: str, kind: str, message: str) -> None:
        c = self._client
        now = dt.datetime.now(dt.UTC)
        body = c.CoreV1Event(
            metadata=c.V1ObjectMeta(generate_name=f"{pod.metadata.name}.", namespace=pod.metadata.namespace),
            involved_object=c.V1ObjectReference(
                kind="Pod",
                api_version="v1",
                name=pod.metadata.name,
                namespace=pod.metadata.namespace,
                uid=pod.metadata.uid,
            ),
            reason=reason,
            message=message,
            type=kind,
            count=1,
            first_timestamp=now,
            last_timestamp=now,
            source=c.V1EventSource(component=COMPONENT),
            reporting_component=COMPONENT,
            reporting_instance=self._instance,
        )
        await self._core.create_namespaced_event(pod.metadata.namespace, body)

    async def on_rollback(self, canary: ModelTarget, urls: list[str], metric: str, reason: str) -> None:
        """An Event on a pod of the canary (the object people look at with kubectl describe)."""
        if not self._events:
            return
        for url in urls:
            try:
                pod = await self._pod_for(canary, url)
                if pod is not None:
                    await self._emit(pod, *rollback_event(canary, metric, reason))
                    return
            except Exception as err:  # an unreachable API server must not stop the rollback
                log.warning("could not emit the rollback event for %s: %s", canary.name, err)
                return
        log.info("no pod found for canary %s; rollback event not emitted", canary.name)

    async def remediate(self, target: ModelTarget, url: str, wedged_s: float) -> bool:
        """Delete the pod behind ``url``; its controller recreates it. True when the API took the delete; False
        (logged) when there is no pod or the API refused. Unbounded here: the monitor bounds the whole attempt
        (``health.remediate_timeout_s``)."""
        if not self._remediation:
            return False
        try:
            pod = await self._pod_for(target, url)
            if pod is None:
                log.info("no pod found for %s; nothing to delete", url)
                return False
            await self._core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace)
        except Exception as err:  # remediation is best effort
            log.warning("remediation of %s failed: %s", url, err)
            return False
        log.warning(
            "deleted pod %s/%s: ejected for %.0fs", pod.metadata.namespace, pod.metadata.name, wedged_s
        )
        if self._events:  # the pod is gone either way: an Event that fails is only logged
            try:
                await self._emit(
                    pod,
                    REASON_REMEDIATED,
                    "Warning",
                    f"model {target.name}: replica {url} ejected for {wedged_s:.0f}s; pod deleted",
                )
            except Exception as err:
                log.warning("could not emit the remediation event for %s: %s", url, err)
        return True
