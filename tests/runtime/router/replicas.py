"""Several real router processes behind the local round-robin balancer, as prod runs them behind an NLB.

Each router is ``python -m runtime.router`` with its own port and the same config file; the balancer
(``components.local.balancer``) hands each new connection to the next router. Everything binds
127.0.0.1 and is stopped (SIGTERM, then SIGKILL) when the ``with`` block ends.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.processes import process
from components.local.engine_process import free_port

REPO_ROOT = Path(__file__).resolve().parents[3]


@dataclass
class Replicas:
    front: str  # the balancer: http://127.0.0.1:PORT
    routers: list[str]  # each router's metrics listener (/metrics; the API port serves none)
    procs: list[subprocess.Popen[bytes]]


def get(url: str, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    except OSError:
        return 0, b""
    finally:
        conn.close()


def metric(router: str, name: str, labels: str = "") -> float:
    """One sample of a router's /metrics (0 when absent)."""
    _, body = get(router, "/metrics")
    pattern = (
        "^" + re.escape(name) + (r"\{" + re.escape(labels) + r"\}" if labels else r"(?:\{\})?") + r" (\S+)"
    )
    found = re.search(pattern, body.decode(), flags=re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def _wait(url: str, path: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while get(url, path, timeout=1.0)[0] != 200:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url}{path} not ready:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)


@contextlib.contextmanager
def router_replicas(config: dict[str, Any], n: int, workdir: Path) -> Iterator[Replicas]:
    """``n`` routers reading ``config`` (a RuntimeConfig document) behind one balancer; all stopped after
    (``bench.processes.process``: SIGTERM, then SIGKILL)."""
    workdir.mkdir(parents=True, exist_ok=True)
    cfg_path = workdir / "runtime.yaml"
    cfg_path.write_text(yaml.safe_dump(config))
    with contextlib.ExitStack() as stack:
        procs: list[subprocess.Popen[bytes]] = []
        routers, api = [], []
        for i in range(n):
            port, metrics_port = free_port(), free_port()
            log = workdir / f"router-{i}.log"
            argv = [sys.executable, "-m", "runtime.router", "--config", str(cfg_path), "--port", str(port)]
            argv += ["--metrics-port", str(metrics_port)]
            procs.append(stack.enter_context(process(argv, log)))
            api.append(f"http://127.0.0.1:{port}")
            routers.append(f"http://127.0.0.1:{metrics_port}")
            _wait(api[-1], "/readyz", procs[-1], log)
        front_port = free_port()
        log = workdir / "balancer.log"
        argv = [sys.executable, "-m", "components.local.balancer", "--listen", f"127.0.0.1:{front_port}"]
        for r in api:
            argv += ["--to", r.removeprefix("http://")]
        procs.append(stack.enter_context(process(argv, log)))
        front = f"http://127.0.0.1:{front_port}"
        _wait(front, "/healthz", procs[-1], log)
        yield Replicas(front, routers, procs)


def post(url: str, path: str, body: dict[str, Any], key: str | None = None) -> tuple[int, dict[str, Any]]:
    """One request on a new connection (so the balancer sends it to the next router)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    headers = {"content-type": "application/json", "connection": "close"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    try:
        conn.request("POST", path, json.dumps(body), headers)
        resp = conn.getresponse()
        raw = resp.read()
    finally:
        conn.close()
    try:
        return resp.status, json.loads(raw)
    except ValueError:
        return resp.status, {"raw": raw.decode("latin-1")[:200]}
