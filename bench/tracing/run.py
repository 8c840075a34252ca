"""What tracing costs the router: CPU per request with tracing off, on at 1% and on at 100% (issue 39).

    .venv/bin/python bench/tracing/run.py                     # ~2 minutes
    .venv/bin/python bench/tracing/run.py --requests 4000 --rounds 5 --concurrency 16

The router (``python -m runtime.router``, its own process) in front of two fake engines (bench/router/fake_engine.py,
instant answers, no vLLM), exporting to a real OTLP/gRPC receiver (tests/otlp_receiver.py) in this process. The
three modes run in interleaved rounds (off, 1%, 100%, off, ...) so a change in the machine's load falls on all of
them alike; each round sends the same number of non-streamed chat requests at a fixed concurrency from a small
asyncio client (keep-alive, TCP_NODELAY). The figure is the router's own CPU time per request (utime + stime of
all its threads, /proc/PID/stat: the exporter's thread included), the median over rounds; req/s beside it is
the whole machine's (client, engines and router share its cores). The receiver's span count says what the
sampler kept. Every process binds 127.0.0.1; nothing leaves the machine. Results go to bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run as a script (python bench/tracing/run.py) or as a module

from bench.machine import describe  # noqa: E402
from bench.processes import process  # noqa: E402
from bench.router.run import (  # noqa: E402
    API_KEY,
    BODY,
    CLK_TCK,
    PY,
    ROUTER_PORT,
    cpu_ticks,
    inferstack_config,
    wait_http,
    wait_port,
)
from tests.otlp_receiver import OtlpReceiver  # noqa: E402

RESULTS = ROOT / "bench" / "results"
ENGINE_PORTS = (19301, 19302)
WARM_UP = 200  # requests before each measured run (not measured; their spans are counted)
#: mode -> the runtime config's tracing (None: off)
MODES: dict[str, float | None] = {"off": None, "on 1%": 0.01, "on 100%": 1.0}


@dataclass
class Round:
    mode: str
    round: int
    requests: int
    errors: int
    seconds: float
    rps: float
    cpu_us_per_req: float
    spans_exported: int


def _request(body: bytes) -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        b"authorization: Bearer %b\r\ncontent-length: %d\r\n\r\n%b" % (API_KEY.encode(), len(body), body)
    )


async def _worker(port: int, n: int, request: bytes, errors: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        for _ in range(n):
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            await reader.readexactly(length)
            if status != 200:
                errors.append(status)
    finally:
        writer.close()


async def load(port: int, requests: int, concurrency: int) -> tuple[float, int]:
    """``requests`` non-streamed chats over ``concurrency`` keep-alive connections: (seconds, errors)."""
    request = _request(BODY.encode())
    errors: list[int] = []
    share, extra = divmod(requests, concurrency)
    started = time.perf_counter()
    await asyncio.gather(
        *(_worker(port, share + (1 if i < extra else 0), request, errors) for i in range(concurrency))
    )
    return time.perf_counter() - started, len(errors)


def config_for(tmp: Path, ratio: float | None, endpoint: str) -> Path:
    path = inferstack_config([f"http://127.0.0.1:{p}" for p in ENGINE_PORTS], tmp)
    cfg = json.loads(path.read_text())
    cfg.pop("picker", None)
    if ratio is not None:
        cfg["tracing"] = {"endpoint": endpoint, "sample_ratio": ratio}
    out = tmp / f"router-{ratio}.json"
    out.write_text(json.dumps(cfg))
    return out


def run(requests: int, rounds: int, concurrency: int) -> list[Round]:
    out: list[Round] = []
    receiver = OtlpReceiver().start()
    try:
        with tempfile.TemporaryDirectory() as tmpdir:
            tmp = Path(tmpdir)
            engines = [
                process([str(PY), str(ROOT / "bench/router/fake_engine.py"), "--port", str(p)])
                for p in ENGINE_PORTS
            ]
            with engines[0], engines[1]:
                for p in ENGINE_PORTS:
                    wait_port(p)
                for r in range(rounds):
                    for mode, ratio in MODES.items():
                        cfg = config_for(tmp, ratio, receiver.endpoint)
                        argv = [
                            str(PY),
                            "-m",
                            "runtime.router",
                            "--config",
                            str(cfg),
                            "--log-level",
                            "WARNING",
                        ]
                        with process(argv, log=tmp / "router.log") as router:
                            wait_http(ROUTER_PORT, "/v1/chat/completions")
                            spans_before = len(receiver.spans)
                            asyncio.run(load(ROUTER_PORT, WARM_UP, concurrency))  # pools, the first spans
                            t0 = cpu_ticks(router.pid)
                            seconds, errors = asyncio.run(load(ROUTER_PORT, requests, concurrency))
                            ticks = cpu_ticks(router.pid) - t0
                        # the router's exit flushed what it had batched (Router.stop -> provider shutdown)
                        time.sleep(0.5)
                        row = Round(
                            mode,
                            r,
                            requests,
                            errors,
                            round(seconds, 3),
                            round(requests / seconds, 1),
                            round(ticks / CLK_TCK * 1e6 / requests, 1),
                            len(receiver.spans)
                            - spans_before,  # the warm-up's too: sent = requests + WARM_UP
                        )
                        out.append(row)
                        print(
                            f"round {r} {mode:8} {row.rps:8.0f} req/s  cpu/req {row.cpu_us_per_req:7.1f} us  "
                            f"spans {row.spans_exported}  errors {errors}",
                            flush=True,
                        )
    finally:
        receiver.stop()
    return out


def commit() -> str:
    rev = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def report(rows: list[Round], info: dict[str, object]) -> str:
    lines = [
        "# Router CPU per request: tracing off, on at 1%, on at 100%",
        "",
        f"Machine: {info['machine']}. Commit {info['commit']}. Load: {info['load']}.",
        "",
        "| mode | router CPU per request, median (us) | min | max | req/s, median | spans exported per request |",
        "|---|---|---|---|---|---|",
    ]
    for mode in MODES:
        mine = [r for r in rows if r.mode == mode]
        cpu = [r.cpu_us_per_req for r in mine]
        spans = sum(r.spans_exported for r in mine) / sum(r.requests + WARM_UP for r in mine)
        lines.append(
            f"| {mode} | {statistics.median(cpu):.1f} | {min(cpu):.1f} | {max(cpu):.1f} | "
            f"{statistics.median(r.rps for r in mine):.0f} | {spans:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=3000, help="requests per mode per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--out", default=None, help="results file stem (default tracing-<date>)")
    args = parser.parse_args()
    machine = describe()
    rows = run(args.requests, args.rounds, args.concurrency)
    info: dict[str, object] = {
        "machine": ", ".join(f"{k} {v}" for k, v in machine.items()),
        "commit": commit(),
        "load": (
            f"{args.requests} non-streamed chat requests per mode per round, {args.rounds} interleaved rounds, "
            f"concurrency {args.concurrency}, two instant fake engines, prefix_aware routing, an API key with limits"
        ),
    }
    stem = args.out or f"tracing-{dt.date.today().isoformat()}"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(
        json.dumps({**info, "machine": machine, "rounds": [asdict(r) for r in rows]}, indent=1) + "\n"
    )
    text = report(rows, info)
    (RESULTS / f"{stem}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
