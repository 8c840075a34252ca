"""The running picker: the ext_proc gRPC service, gRPC health, and /metrics, /healthz, /readyz over HTTP.

gRPC (grpcio's asyncio server) carries Envoy's ``envoy.service.ext_proc.v3.ExternalProcessor/Process``
streams, one per request, and the standard ``grpc.health.v1.Health`` service with the names the Endpoint
Picker Protocol lists (``liveness``, ``readiness``, the ext_proc service). The HTTP side is the shared lean
server (``runtime.server``), for Prometheus and kubelet probes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc
from envoy.service.ext_proc.v3.external_processor_pb2 import ProcessingRequest, ProcessingResponse
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from runtime.api_keys import KeyTable, files_digest, keys_path, load_key_table
from runtime.config import (
    PICKER_HOLDS_NO_TOKEN_LIMIT,
    BatchesSettings,
    PickerSettings,
    QueueOrder,
    RuntimeConfig,
)
from runtime.config_file import ConfigError
from runtime.http import METRICS_CONTENT_TYPE, error_body, metrics_payload
from runtime.picker.exchange import Exchange
from runtime.picker.fleet import Discover, Fleet
from runtime.picker.metrics import PickerMetrics
from runtime.picker.protocol import EXT_PROC_SERVICE
from runtime.picker.replicas import ModelPool
from runtime.scheduling.fair_queue import TenantTable
from runtime.server import Connection, Limits, Request, Server
from runtime.tracing import Tracing

log = logging.getLogger("inferstack.picker")

#: gRPC health service names: the process is up / it may take requests (the protocol's Health Checking).
LIVENESS = "liveness"
READINESS = "readiness"
#: Room above the body limit for the rest of an ext_proc message.
MESSAGE_OVERHEAD_BYTES = 64 * 1024


def token_limit_problems(file: Path | None, keys: KeyTable) -> list[str]:
    """Keys with ``tokens_per_minute``, one line each: the picker only sees requests, never the answers' usage,
    so such a limit would hold nothing; refused rather than silently not enforced."""
    return [
        f"{file}: key {p.name!r} has tokens_per_minute {p.key.tokens_per_minute}: {PICKER_HOLDS_NO_TOKEN_LIMIT}"
        for p in keys.by_hash.values()
        if p.key.tokens_per_minute
    ]


class Picker(external_processor_pb2_grpc.ExternalProcessorServicer):  # type: ignore[misc]  # generated, untyped
    """The endpoint picker: fleet, metrics, and one ``Exchange`` per ext_proc stream."""

    def __init__(
        self, cfg: RuntimeConfig, discover: Discover | None = None, config_path: Path | None = None
    ) -> None:
        """``config_path``: where the config was read, which a relative ``api_keys_file`` is relative to.
        A keys file that cannot be read is ``ConfigError`` here, one line per mistake."""
        self.cfg = cfg
        self.fleet = Fleet(cfg) if discover is None else Fleet(cfg, discover)
        self.metrics = PickerMetrics()
        self.metrics.attach_live(lambda: self.fleet.models)
        self.fleet.on_departed = self.metrics.forget_replica
        self.open_streams = 0
        file = cfg.picker.api_keys_file
        self.keys_file = file if config_path is None else keys_path(file, config_path)
        self.keys = self._load_keys()
        self.tenants = TenantTable(cfg.router.tenants, cfg.router.default_band)
        self.tracing = Tracing(cfg.tracing, "inferstack-picker")
        #: what a batch or best-effort request may fill of a replica (the batch service's headroom rule)
        self.headroom_share: float = (
            cfg.batches.headroom_share
            if cfg.batches is not None
            else BatchesSettings.model_fields["headroom_share"].default
        )

    def _load_keys(self, previous: KeyTable | None = None) -> KeyTable:
        """The keys file as a table whose request buckets are this replica's share (``picker.replicas``);
        ``ConfigError`` for a key with ``tokens_per_minute``, which the picker cannot hold (below)."""
        # the digest before the read: a change while reading is seen on the next look
        self.keys_digest = files_digest(self.keys_file)
        replicas = self.cfg.picker.replicas
        keys = load_key_table((), self.keys_file, time.monotonic(), previous, replicas)
        problems = token_limit_problems(self.keys_file, keys)
        if problems:
            raise ConfigError(problems)
        return keys

    async def watch_keys(self) -> None:
        """Re-read the keys file when it changes (a Secret update); a bad change is logged and counted,
        and the keys in use stay, as the router does."""
        while True:
            await asyncio.sleep(self.cfg.router.config_reload_interval_ms / 1000)
            if files_digest(self.keys_file) == self.keys_digest:
                continue
            try:
                self.keys = self._load_keys(self.keys)
            except ConfigError as err:
                self.metrics.keys_reload_failures.inc()
                log.error("API keys change refused; the keys in use stay", extra={"problems": err.lines})
                continue
            log.info("API keys reloaded", extra={"keys": len(self.keys)})

    # what an Exchange reads (``exchange.PickerState``)
    @property
    def models(self) -> dict[str, ModelPool]:
        return self.fleet.models

    @property
    def settings(self) -> PickerSettings:
        return self.cfg.picker

    @property
    def max_body_bytes(self) -> int:
        return self.cfg.router.max_body_bytes

    @property
    def max_choices(self) -> int:
        return self.cfg.router.max_choices_per_request

    @property
    def settings_order(self) -> QueueOrder:
        return self.cfg.router.queue_order

    async def Process(  # noqa: N802 - the generated servicer's method name
        self,
        request_iterator: AsyncIterator[ProcessingRequest],
        context: grpc.aio.ServicerContext[ProcessingRequest, ProcessingResponse],
    ) -> AsyncIterator[ProcessingResponse]:
        exchange = Exchange(self)
        self.open_streams += 1
        try:
            async for message in request_iterator:
                for answer in exchange.on_message(message):
                    yield answer
        except Exception:  # a bug must cost one request (the gateway's failure mode), not the picker
            log.exception("ext_proc stream failed", extra={"request_id": exchange.request_id})
            raise
        finally:
            self.open_streams -= 1
            exchange.close()

    # --- HTTP: metrics and kubelet probes ----------------------------------------------------------
    async def handle_http(self, req: Request, conn: Connection) -> None:
        if req.method not in (b"GET", b"HEAD"):
            conn.send(405, error_body(405, f"{req.method.decode('latin-1')} is not allowed here"))
        elif req.path == b"/metrics":
            conn.send(200, metrics_payload(self.metrics.registry), METRICS_CONTENT_TYPE.encode())
        elif req.path == b"/healthz":
            conn.send(200, b'{"status":"ok"}')
        elif req.path == b"/readyz":
            ready = self.fleet.listed
            conn.send(200 if ready else 503, b'{"ready":%s}' % (b"true" if ready else b"false"))
        else:
            conn.send(404, error_body(404, f"no route for {req.path.decode('latin-1')[:100]}"))


class Running:
    """A started picker: its servers and their ports (readiness turns SERVING once every model's replicas
    were listed), stopped with :meth:`stop`."""

    def __init__(
        self,
        picker: Picker,
        grpc_server: grpc.aio.Server,
        http: Server,
        port: int,
        metrics_port: int,
        health: health_aio.HealthServicer,
    ) -> None:
        self.picker = picker
        self.grpc_server = grpc_server
        self.http = http
        self.port = port
        self.metrics_port = metrics_port
        self.health = health
        loop = asyncio.get_running_loop()
        self._ready_task = loop.create_task(self._mark_ready_when_listed())
        self._keys_task = loop.create_task(picker.watch_keys()) if picker.keys_file is not None else None

    async def _mark_ready_when_listed(self) -> None:
        while not self.picker.fleet.listed:
            await asyncio.sleep(0.05)
        for service in (READINESS, EXT_PROC_SERVICE):
            await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace_s: float) -> None:
        """NOT_SERVING first (gateways stop sending), then let open streams finish within ``grace_s``."""
        for service in ("", LIVENESS, READINESS, EXT_PROC_SERVICE):
            await self.health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        self._ready_task.cancel()
        if self._keys_task is not None:
            self._keys_task.cancel()
        await self.http.stop_accepting()
        await self.grpc_server.stop(grace_s)
        self.http.close_all()
        await self.picker.fleet.stop()
        await asyncio.to_thread(self.picker.tracing.shutdown)  # what is buffered is exported


async def start(picker: Picker, port: int | None = None, metrics_port: int | None = None) -> Running:
    """Start the fleet, the gRPC server and the HTTP server (port 0: any free port)."""
    s = picker.settings
    limit = picker.max_body_bytes + MESSAGE_OVERHEAD_BYTES
    server = grpc.aio.server(
        options=[("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit)]
    )
    external_processor_pb2_grpc.add_ExternalProcessorServicer_to_server(picker, server)
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    for service in ("", LIVENESS):
        await health.set(service, health_pb2.HealthCheckResponse.SERVING)
    for service in (READINESS, EXT_PROC_SERVICE):
        await health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
    bound = server.add_insecure_port(f"{_grpc_host(s.host)}:{s.port if port is None else port}")
    await picker.fleet.start()
    await server.start()
    http = Server(picker.handle_http, Limits.of(s, 1024, picker.cfg.router.client_idle_timeout_s))
    http_port = await http.start(s.host, s.metrics_port if metrics_port is None else metrics_port)
    running = Running(picker, server, http, bound, http_port, health)
    log.info(
        "picker listening",
        extra={
            "host": s.host,
            "port": bound,
            "metrics_port": http_port,
            "models": list(picker.models),
            "body_mode": s.body_mode.value,
            "require_api_key": s.require_api_key,
            "api_keys": len(picker.keys),
        },
    )
    return running


def _grpc_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
