"""Scale curves: how the router's and the health monitor's CPU grow with the fleet and the prefix index.

    .venv/bin/python bench/scale/run.py                  # all three curves, ~5 minutes
    .venv/bin/python bench/scale/run.py --curves replicas --replicas 2,16 --duration 3

- ``replicas``: router CPU per request with 2, 16, 128, 1,024 fake replicas (one process, one port each,
  ``fleet.py``), every feature on as in ``bench/router`` (API keys, per-key limits, metrics, wait queue,
  ``prefix_aware``), ``wrk -t1 -c32`` sending chat requests of a conversation workload: 8 shared system
  prompts, 2,000 conversations of 1-3 turns, so the prefix scorer sees follow-ups, shared prefixes and
  misses. A warm-up first gives the router a pooled connection to nearly every replica. The router probes
  its replicas once at start and not while requests are measured: its probing is a per-replica cost,
  measured on its own (``router_probes``, with the ``health`` curve). What the idle process burns
  (timers) is measured too and taken out of the per-request figure (``gross`` keeps it).
- ``index``: the same at 16 replicas with ``prefix_index_max_entries`` 10^3 .. 10^6, the index filled to its
  bound first (unique long prompts), so every measured request runs against a full LRU that evicts. The
  router's RSS growth over the fill over the entries gives memory per entry in the real process;
  The curve also measures it with ``tracemalloc`` on the real ``PrefixScorer`` in this process.
- ``health``: the health monitor's CPU per probe (one ``/health`` + one ``/metrics`` of a real vLLM
  exposition, 632 lines, parsed) with 2 .. 1,024 replicas at ~200 probes/s; then the CPU of one read of
  its ``/v1/backends`` feed (what each router reads every probe_interval_ms); and the router's own probing (what it does
  without a health monitor), CPU per probe at the same rate with no requests.

CPU is utime+stime of the process (all threads) from ``/proc/PID/stat``; the machine is shared, so CPU
time per request or probe is the figure to read, not req/s. Results go to ``bench/results/scale-*``;
``chart.py`` draws them.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gc
import json
import os
import shutil
import sys
import tempfile
import time
import tracemalloc
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.cli.run import commit_of  # noqa: E402
from bench.machine import describe  # noqa: E402
from bench.processes import process  # noqa: E402
from bench.router.run import (  # noqa: E402
    API_KEY,
    CLK_TCK,
    MODEL,
    PY,
    cpu_ticks,
    inferstack_config,
    rss_mib,
    wait_http,
    wrk,
)
from runtime.breaker import Breaker  # noqa: E402
from runtime.replica import ReplicaState  # noqa: E402
from runtime.scheduling.inputs import Context  # noqa: E402
from runtime.scheduling.scorers.prefix import PrefixScorer  # noqa: E402

RESULTS = ROOT / "bench" / "results"
FLEET_BASE_PORT = 21000  # .. 22023; bench/router uses 191xx-192xx
ROUTER_PORT = 19300
ROUTER_METRICS_PORT = 19301
HEALTH_PORT = 19310
SYSTEMS = 8
CONVERSATIONS = 2000
#: While requests are measured the router probes once at start and then not again (its probing is a
#: per-replica cost, measured on its own by ``measure_router_probes``, not a per-request one).
QUIET_PROBE_MS = 600_000

#: The measured workload: a conversation's turn t sends the system prompt, then t user turns, so turn t+1
#: extends turn t exactly (a follow-up); first turns share only their system prompt (a new conversation).
WORKLOAD_LUA = f"""
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer {API_KEY}"
local systems = {{}}
for i = 1, {SYSTEMS} do systems[i] = string.rep("You are assistant number " .. i .. ". Be brief. ", 40) end
request = function()
  local conv = math.random(1, {CONVERSATIONS})
  local turns = math.random(1, 3)
  local msgs = '{{"role":"system","content":"' .. systems[(conv % {SYSTEMS}) + 1] .. '"}}'
  for t = 1, turns do
    msgs = msgs .. ',{{"role":"user","content":"' .. string.rep("conversation " .. conv .. " turn " .. t .. ". ", 12) .. '"}}'
  end
  return wrk.format(nil, nil, nil, '{{"model":"{MODEL}","max_tokens":1,"messages":[' .. msgs .. ']}}')
end
"""

#: Fills the index: every prompt unique from its first block, 128 blocks (the default prefix_max_blocks).
FILL_LUA = f"""
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer {API_KEY}"
local filler = string.rep("x", 256 * 128)
local n = 0
math.randomseed(RUN)
request = function()
  n = n + 1
  local id = string.format("%012d-%08d ", math.random(0, 999999999999), n)
  return wrk.format(nil, nil, nil, '{{"model":"{MODEL}","max_tokens":1,"prompt":"' .. id .. filler .. '"}}')
end
"""


def ticks_per_s(pid: int, seconds: float) -> float:
    t0 = cpu_ticks(pid)
    time.sleep(seconds)
    return (cpu_ticks(pid) - t0) / seconds


def counts(port: int) -> dict[str, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/_counts", timeout=10) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


@contextlib.contextmanager
def fleet(replicas: int, tmp: Path):  # type: ignore[no-untyped-def]
    argv = [str(PY), str(ROOT / "bench/scale/fleet.py"), "--base-port", str(FLEET_BASE_PORT)]
    argv += ["--replicas", str(replicas), "--tokenizer-path", str(tmp)]
    log = tmp / "fleet.log"
    with process(argv, log=log) as proc:
        deadline = time.monotonic() + 60
        while "ready" not in log.read_text():
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"fake fleet did not start: {log.read_text()[-2000:]}")
            time.sleep(0.1)
        yield proc


def router_config(
    replicas: int,
    tmp: Path,
    index_entries: int | None = None,
    probe_interval_ms: int = QUIET_PROBE_MS,
    health_interval_ms: int = 1000,
) -> Path:
    """``bench/router``'s every-feature config (one source), with N replicas and this bench's ports."""
    workers = [f"http://127.0.0.1:{FLEET_BASE_PORT + i}" for i in range(replicas)]
    cfg: dict[str, Any] = json.loads(inferstack_config(workers, tmp).read_text())
    cfg["router"]["port"] = ROUTER_PORT
    cfg["router"]["metrics_port"] = ROUTER_METRICS_PORT
    cfg["router"]["probe_interval_ms"] = probe_interval_ms
    cfg.pop("picker", None)
    if index_entries is not None:
        cfg["router"]["default_strategy"]["prefix_index_max_entries"] = index_entries
    cfg["health"] = {"host": "127.0.0.1", "port": HEALTH_PORT, "interval_ms": health_interval_ms}
    path = tmp / f"router-{replicas}-{index_entries}.json"
    path.write_text(json.dumps(cfg))
    return path


def measure_router(
    replicas: int, duration_s: int, tmp: Path, index_entries: int | None = None, repeat: int = 2
) -> dict[str, Any]:
    workload = tmp / "workload.lua"
    workload.write_text(WORKLOAD_LUA)
    fill = tmp / "fill.lua"
    cfg = router_config(replicas, tmp, index_entries)
    with fleet(replicas, tmp):
        argv = [str(PY), "-m", "runtime.router", "--config", str(cfg), "--log-level", "WARNING"]
        with process(argv, log=tmp / "router.log") as router:
            wait_http(ROUTER_PORT, "/v1/chat/completions")
            pid = router.pid
            row: dict[str, Any] = {"replicas": replicas, "index_max_entries": index_entries}
            rss0 = rss_mib(pid)
            if index_entries is not None:  # fill the index to its bound: ~index/128 unique 128-block prompts
                blocks_per_request = 128
                need = index_entries // blocks_per_request + 1
                for attempt in range(1, 100):
                    entries = index_size(ROUTER_METRICS_PORT)
                    if entries >= index_entries * 0.99:
                        break
                    secs = max(1, min(20, int((need - entries / blocks_per_request) / 800) + 1))
                    fill.write_text(FILL_LUA.replace("RUN", str(attempt)))  # new prompts each run
                    wrk(ROUTER_PORT, "/v1/completions", 32, secs, fill)
                else:
                    raise RuntimeError(f"the prefix index did not fill to {index_entries}: {entries}")
                row["index_entries"] = index_size(ROUTER_METRICS_PORT)
                gc_settle()
                row["rss_fill_mib"] = round(rss_mib(pid) - rss0, 1)
                row["rss_bytes_per_entry"] = round(
                    (rss_mib(pid) - rss0) * 2**20 / max(1, row["index_entries"]), 1
                )
            # warm-up: a pooled connection to (nearly) every replica, as a router has after a while
            wrk(ROUTER_PORT, "/v1/chat/completions", 32, 2 + replicas // 100, workload)
            idle = ticks_per_s(pid, 2.0)  # timers, no requests
            runs = []
            for _ in range(repeat):
                t0 = cpu_ticks(pid)
                w0 = time.monotonic()
                res = wrk(ROUTER_PORT, "/v1/chat/completions", 32, duration_s, workload)
                ticks = cpu_ticks(pid) - t0
                wall = time.monotonic() - w0
                gross = ticks / CLK_TCK * 1e6 / max(1, res["requests"])
                net = (ticks - idle * wall) / CLK_TCK * 1e6 / max(1, res["requests"])
                runs.append(
                    {
                        "rps": res["rps"],
                        "requests": res["requests"],
                        "errors": res["errors"],
                        "p50_ms": res["p50_ms"],
                        "p99_ms": res["p99_ms"],
                        "gross": gross,
                        "net": net,
                    }
                )
            best = min(runs, key=lambda r: r["net"])  # the least disturbed run
            row.update(
                rps=round(best["rps"]),
                requests=int(best["requests"]),
                errors=int(best["errors"]),
                p50_ms=best["p50_ms"],
                p99_ms=best["p99_ms"],
                cpu_us_per_req=round(best["net"], 1),
                cpu_us_per_req_gross=round(best["gross"], 1),
                cpu_us_per_req_runs=[round(r["net"], 1) for r in runs],
                idle_cpu_cores=round(idle / CLK_TCK, 3),
                rss_mib=round(rss_mib(pid), 1),
                index_entries_end=index_size(ROUTER_METRICS_PORT),
                loadavg=" ".join(f"{x:.2f}" for x in os.getloadavg()),
            )
    print(json.dumps(row), flush=True)
    return row


def measure_router_probes(replicas: int, duration_s: int, tmp: Path) -> dict[str, Any]:
    """The router's own probing (``/health`` + ``/metrics`` of every replica each ``probe_interval_ms``,
    when there is no health monitor feed): CPU per probe, without requests."""
    cfg = router_config(replicas, tmp, probe_interval_ms=probe_period_ms(replicas))
    with fleet(replicas, tmp):
        argv = [str(PY), "-m", "runtime.router", "--config", str(cfg), "--log-level", "WARNING"]
        with process(argv, log=tmp / "router.log") as router:
            wait_http(ROUTER_PORT, "/v1/chat/completions")
            time.sleep(2.0)
            pid = router.pid
            c0, t0, w0 = counts(FLEET_BASE_PORT), cpu_ticks(pid), time.monotonic()
            time.sleep(duration_s)
            ticks, c1 = cpu_ticks(pid) - t0, counts(FLEET_BASE_PORT)
            wall = time.monotonic() - w0
            probes = c1.get("/health", 0) - c0.get("/health", 0)
            row = {
                "replicas": replicas,
                "probes": probes,
                "probes_per_s": round(probes / wall, 1),
                "interval_ms": probe_period_ms(replicas),
                "cpu_us_per_probe": round(ticks / CLK_TCK * 1e6 / max(1, probes), 1),
                "cpu_cores": round(ticks / CLK_TCK / wall, 3),
                "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg()),
            }
    print(json.dumps(row), flush=True)
    return row


def gc_settle() -> None:
    time.sleep(0.5)


def index_size(port: int) -> int:
    """The prefix index's entries, from the router's own /metrics on its metrics ``port`` (what the scorer
    reports)."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    with urllib.request.urlopen(req, timeout=10) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        if "prefix_index_entries{" in line and 'index="prefix"' in line:
            return int(float(line.rsplit(" ", 1)[1]))
    raise RuntimeError("the router's /metrics has no prefix index_entries gauge")


def index_memory(sizes: list[int]) -> list[dict[str, Any]]:
    """Bytes per entry of the real ``PrefixScorer`` index, by tracemalloc, filled through ``on_routed``."""
    rows = []
    blocks = 16
    for size in sizes:
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        scorer = PrefixScorer(256, blocks, size, 1.2, 30.0)
        eps = [ReplicaState(f"http://10.0.0.{i}:8000", 256, Breaker(5, 1.0)) for i in range(16)]
        n = 0
        while len(scorer.index) < size:
            ctx = Context(model=MODEL, now=0.0)
            ctx.prompt = f"{n:012d}" + "x" * (256 * blocks)
            scorer.score(eps, ctx)
            scorer.on_routed(eps[n % 16], ctx)
            n += 1
        del ctx
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        row = {
            "entries": len(scorer.index),
            "bytes_per_entry": round((after - before) / len(scorer.index), 1),
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
        del scorer
    return rows


def probe_period_ms(replicas: int) -> int:
    """About 200 probes a second whatever the fleet (20 with two replicas; the floor is 100 ms), so the
    curve shows what a probe costs at a given fleet size, not at a given probe rate."""
    return max(100, min(5000, replicas * 5))


def measure_health(replicas: int, duration_s: int, tmp: Path) -> dict[str, Any]:
    cfg = router_config(replicas, tmp, health_interval_ms=probe_period_ms(replicas))
    with fleet(replicas, tmp):
        argv = [str(PY), "-m", "runtime.health", "--config", str(cfg)]  # LOG_LEVEL=WARNING (main)
        with process(argv, log=tmp / "health.log") as monitor:
            feed = f"http://127.0.0.1:{HEALTH_PORT}/v1/backends"
            deadline = time.monotonic() + 60
            data: dict[str, Any] = {}
            while True:  # warm: every replica admitted (readmit_after_successes probes each)
                with contextlib.suppress(OSError):
                    with urllib.request.urlopen(feed, timeout=10) as resp:
                        data = json.loads(resp.read())
                    if sum(1 for b in data["backends"] if b.get("routable")) >= replicas:
                        break
                if time.monotonic() > deadline or monitor.poll() is not None:
                    log = (tmp / "health.log").read_text()[-2000:]
                    raise RuntimeError(f"health monitor did not admit {replicas} replicas: {log}")
                time.sleep(0.5)
            time.sleep(1.0)
            pid = monitor.pid
            # probes alone, then the feed: the feed is O(replicas) per read and read at the routers' pace
            # (not per probe), so it is measured per read instead of folded into the probes' figure
            c0, t0, w0 = counts(FLEET_BASE_PORT), cpu_ticks(pid), time.monotonic()
            time.sleep(duration_s)
            ticks, c1 = cpu_ticks(pid) - t0, counts(FLEET_BASE_PORT)
            wall = time.monotonic() - w0
            probes = c1.get("/health", 0) - c0.get("/health", 0)
            reads, f0, fw0 = 20, cpu_ticks(pid), time.monotonic()
            for _ in range(reads):
                with urllib.request.urlopen(feed, timeout=30) as resp:
                    size = len(resp.read())
            feed_ticks = cpu_ticks(pid) - f0 - ticks / wall * (time.monotonic() - fw0)
            row = {
                "replicas": replicas,
                "probes": probes,
                "metrics_scrapes": c1.get("/metrics", 0) - c0.get("/metrics", 0),
                "probes_per_s": round(probes / wall, 1),
                "interval_ms": probe_period_ms(replicas),
                "cpu_us_per_probe": round(ticks / CLK_TCK * 1e6 / max(1, probes), 1),
                "cpu_cores": round(ticks / CLK_TCK / wall, 3),
                "feed_cpu_ms_per_read": round(max(0.0, feed_ticks) / CLK_TCK * 1e3 / reads, 2),
                "feed_bytes": size,
                "rss_mib": round(rss_mib(pid), 1),
                "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg()),
            }
    print(json.dumps(row), flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--curves", default="replicas,index,health", help="any of replicas, index, health")
    ap.add_argument("--replicas", default="2,16,128,1024")
    ap.add_argument("--index-sizes", default="1000,10000,100000,1000000")
    ap.add_argument("--index-replicas", type=int, default=16)
    ap.add_argument("--duration", type=int, default=5, help="seconds of load per run")
    ap.add_argument("--repeat", type=int, default=2, help="runs per point; the least disturbed is kept")
    ap.add_argument("--name", default=None, help="results file stem (default scale-YYYYMMDD-HHMM)")
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        print("error: wrk is not installed (apt-get install -y wrk)", file=sys.stderr)
        return 2
    curves = args.curves.split(",")
    info: dict[str, Any] = {**describe(), "commit": commit_of(ROOT)}
    out: dict[str, Any] = {"machine": info}
    replicas = [int(x) for x in args.replicas.split(",")]
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = args.name or "scale-" + dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M")
    path = RESULTS / f"{stem}.json"

    def save() -> None:  # after every curve: a late failure keeps what was measured
        info["loadavg_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
        path.write_text(json.dumps(out, indent=2))

    os.environ["LOG_LEVEL"] = "WARNING"  # the services' log level (the router also takes --log-level)
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        if "replicas" in curves:
            out["replicas"] = [measure_router(n, args.duration, tmp, repeat=args.repeat) for n in replicas]
            save()
        if "index" in curves:
            sizes = [int(x) for x in args.index_sizes.split(",")]
            out["index"] = [
                measure_router(args.index_replicas, args.duration, tmp, s, repeat=args.repeat) for s in sizes
            ]
            out["index_memory"] = index_memory(sizes)
            save()
        if "health" in curves:
            out["health"] = [measure_health(n, 2 * args.duration, tmp) for n in replicas]
            save()
            out["router_probes"] = [measure_router_probes(n, 2 * args.duration, tmp) for n in replicas]
            save()
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
