"""How soon a replica that is healthy again takes traffic: the health monitor and the router as ``make local`` runs
them (``python -m runtime.health``, ``python -m runtime.router`` reading its feed), two engine doubles, a client
sending a request every 20 ms. No engine: what is measured is the control loop, not an engine's start.

    .venv/bin/python bench/readmission/run.py [--runs 5]

Each run: one double's ``/health`` fails until the monitor ejects it and the router stops sending it anything
(no request for a second); then ``/health`` answers 200 again, and three times are taken from that moment:
the monitor's feed says the replica is routable (``monitor``), the router lists it healthy on its metrics
(``router``), and the replica receives a request (``traffic``, the figure issue 37 bounds at 1 s). Writes
bench/results/readmission-<date>.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.machine import describe  # noqa: E402
from bench.processes import process  # noqa: E402
from components.local.engine_process import free_port  # noqa: E402

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
ANSWER = {
    "id": "x",
    "object": "chat.completion",
    "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}


class Engine:
    """An engine double: ``healthy`` decides its /health; ``requests`` counts generation requests."""

    def __init__(self) -> None:
        self.healthy = True
        self.requests = 0
        self.port = 0
        self.runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()

        async def chat(_: web.Request) -> web.Response:
            self.requests += 1
            return web.json_response(ANSWER)

        async def health(_: web.Request) -> web.Response:
            return web.Response(status=200 if self.healthy else 503)

        async def metrics(_: web.Request) -> web.Response:
            return web.Response(text="vllm:num_requests_waiting 0\nvllm:num_requests_running 0\n")

        app.router.add_post("/v1/chat/completions", chat)
        app.router.add_get("/health", health)
        app.router.add_get("/metrics", metrics)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _get(url: str, timeout: float = 1.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except OSError:
        return 0, b""


def _post(url: str) -> None:
    req = urllib.request.Request(url, json.dumps(CHAT).encode(), {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            resp.read()
    except OSError:
        pass


def _routable(feed_url: str, engine_url: str) -> bool:
    status, body = _get(feed_url)
    if status != 200:
        return False
    entries = json.loads(body).get("backends", [])
    return any(e.get("url", "").rstrip("/") == engine_url and e.get("routable") for e in entries)


def _router_healthy(metrics_url: str, engine_url: str) -> bool:
    _, body = _get(metrics_url)
    needle = f'inferstack_router_backend_healthy{{backend="{engine_url}",model="m"}} 1.0'
    return needle in body.decode()


def one_run(engines: list[Engine], front: str, feed_url: str, metrics_url: str) -> dict[str, float]:
    back = engines[1]
    time.sleep(
        2.0
    )  # past the flap window since the last run's readmission: this run is a restart, not a flap
    back.healthy = False
    deadline = time.monotonic() + 60
    while True:  # ejected, and the router knows: nothing reaches it for a second
        seen = back.requests
        time.sleep(1.0)
        if back.requests == seen and not _routable(feed_url, back.url):
            break
        assert time.monotonic() < deadline, "the failing replica was never taken out"
    seen = back.requests
    back.healthy = True
    ok_at = time.monotonic()
    marks: dict[str, float] = {}
    while len(marks) < 3:
        now = time.monotonic() - ok_at
        assert now < 30, f"never readmitted: {marks}"
        if "traffic" not in marks and back.requests > seen:
            marks["traffic"] = now
        if "monitor" not in marks and _routable(feed_url, back.url):
            marks["monitor"] = now
        if "router" not in marks and _router_healthy(metrics_url, back.url):
            marks["router"] = now
        time.sleep(0.005)
    return {k: round(v, 3) for k, v in marks.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    engines = [Engine(), Engine()]
    for e in engines:
        asyncio.run_coroutine_threadsafe(e.start(), loop).result(10)
    health_port, router_port, metrics_port = free_port(), free_port(), free_port()
    feed_url = f"http://127.0.0.1:{health_port}/v1/backends"
    config = {
        "models": [{"name": "m", "static_backends": [{"url": e.url} for e in engines]}],
        "router": {"host": "127.0.0.1", "health_feed_url": feed_url},
        # make local's health settings but for a faster ejection (the run is about coming back), and a flap
        # window shorter than a run: each run is a replica's one restart, not a flap (whose probes slow down)
        "health": {
            "host": "127.0.0.1",
            "port": health_port,
            "interval_ms": 500,
            "eject_after_failures": 2,
            "flap_window_s": 1,
        },
    }
    work = ROOT / ".cache" / "bench-readmission"
    work.mkdir(parents=True, exist_ok=True)
    path = work / "runtime.yaml"
    path.write_text(yaml.safe_dump(config))
    router_argv = [sys.executable, "-m", "runtime.router", "--config", str(path), "--port", str(router_port)]
    router_argv += ["--metrics-port", str(metrics_port)]
    runs: list[dict[str, float]] = []
    with (
        process([sys.executable, "-m", "runtime.health", "--config", str(path)], work / "health.log"),
        process(router_argv, work / "router.log"),
    ):
        front = f"http://127.0.0.1:{router_port}"
        deadline = time.monotonic() + 60
        while _get(front + "/readyz")[0] != 200:
            assert time.monotonic() < deadline, (work / "router.log").read_text()[-2000:]
            time.sleep(0.1)
        stop = threading.Event()

        def trickle() -> None:  # a request every 20 ms
            while not stop.is_set():
                _post(front + "/v1/chat/completions")
                time.sleep(0.02)

        client = threading.Thread(target=trickle, daemon=True)
        client.start()
        try:
            for i in range(args.runs):
                runs.append(one_run(engines, front, feed_url, f"http://127.0.0.1:{metrics_port}/metrics"))
                print(f"run {i + 1}: {runs[-1]}", flush=True)
        finally:
            stop.set()
            client.join(10)
    summary = {
        k: {"median": statistics.median(r[k] for r in runs), "max": max(r[k] for r in runs)} for k in runs[0]
    }
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d-%H%M")
    name = f"readmission-{stamp}{'-' + args.label if args.label else ''}"
    out: dict[str, Any] = {"machine": describe(), "config": config, "runs": runs, "summary": summary}
    results = ROOT / "bench" / "results"
    (results / f"{name}.json").write_text(json.dumps(out, indent=2) + "\n")
    lines = [
        f"# Readmission after /health turns 200 ({stamp}{', ' + args.label if args.label else ''})",
        "",
        "Seconds from a replica's /health answering 200 again to: the monitor's feed listing it routable",
        "(`monitor`), the router's metrics listing it healthy (`router`), its first request (`traffic`).",
        "Client: one request every 20 ms. `bench/readmission/run.py`; machine in the JSON.",
        "",
        "| run | monitor | router | traffic |",
        "|---|---|---|---|",
        *[
            f"| {i + 1} | {r['monitor']:.3f} | {r['router']:.3f} | {r['traffic']:.3f} |"
            for i, r in enumerate(runs)
        ],
        f"| median | {summary['monitor']['median']:.3f} | {summary['router']['median']:.3f}"
        f" | {summary['traffic']['median']:.3f} |",
        f"| max | {summary['monitor']['max']:.3f} | {summary['router']['max']:.3f} | {summary['traffic']['max']:.3f} |",
        "",
    ]
    (results / f"{name}.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
