"""Issue #34's attack table: the attacks on the router, run against the router before and after the hardening.

    git worktree add --detach /tmp/base34 2c6af22      # the code issue #34 reviewed
    ln -s "$PWD/.venv" /tmp/base34/.venv                # the same interpreter for both trees
    .venv/bin/python bench/hardening/run.py --tree before=/tmp/base34 --tree after=.

For each tree: a fake OpenAI engine (bench/router/fake_engine.py: streams of 16 chunks 100 ms apart) and that
tree's router (``python -m runtime.router --config FILE``, the tree on PYTHONPATH, run from the tree) on
127.0.0.1, with one model, API keys required (a keys file: an unlimited key and one limited only to 2,000
tokens per minute), the Files API forwarded (so ``/v1/files`` takes the upload limit) and a 500 ms queue
deadline. Settings only the newer tree knows are set where it accepts them (``metrics_port`` on a free port,
``max_connections`` 280 so attack 3's real request comes past it); the rest are each tree's defaults. Then, in
order, each bounded in count and time:

1. 5 concurrent keyless POSTs declaring and sending 64 MiB, to ``/v1/filesX`` and to ``/v1/files`` (item 1);
2. a request head trickled one byte a second (slowloris), for at most 20 s (item 12);
3. 300 idle connections opened at once, then one real request, and one more when the router has cut the idle
   ones (or at 17 s: the newer router's head deadline is 10 s, checked every 5 s) (item 12, the connection cap);
4. a 64 KiB header (431 expected);
5. ``/metrics`` and ``/v1/models`` without a key on the API port (item 10);
6. 20 concurrent streamed chats (``max_tokens`` 500) from the key limited to 2,000 tokens/min (item 4);
7. 40 concurrent streams from the unlimited key at a model that takes 32 at once: the queue deadline's answer
   (status, Retry-After) ('Also').
8. 30 chats from one key, each with a fresh session key chosen (the hash is public) to land on the canary of a
   model served 90/10 in two versions whose canary the health monitor judges: how many the canary got, read
   from the router's ``inferstack_router_version_requests_total`` (item 9).

Recorded per attack: the HTTP status of each answer (or ``reset``, ``closed`` without an answer, ``no answer
within T s``), the time to the slowest answer, and the growth of the router's resident memory (peak over the
attack minus the value when it started; psutil, sampled every 10 ms). Writes
bench/results/hardening-<date>.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import psutil
import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.machine import describe  # noqa: E402
from bench.processes import process  # noqa: E402
from runtime.versions import Split  # noqa: E402  (the hash both trees route sessions by)

PY = Path(sys.executable)
MODEL = "tiny"  # the fake engine's model
VERSIONED = "chat"  # a model served in two versions (90/10) at the same fake engine, its canary judged
CANARY_SESSIONS = 30
OPEN_KEY = "sk-bench-open"
TPM_KEY = "sk-bench-tpm"
TOKENS_PER_MINUTE = 2_000
MODEL_CAP = 32  # max_concurrency_per_backend
QUEUE_DEADLINE_MS = 500
MAX_CONNECTIONS = (
    280  # where the tree has the setting: attack 3's real request lands past it, in the 503 band
)
STREAM_CHUNKS, STREAM_INTERVAL_MS = 16, 100  # a stream lasts 1.5 s: longer than the queue deadline
UPLOAD_BYTES = 64 * 1024 * 1024
CHUNK = b"x" * (1024 * 1024)
ANSWER_BOUND_S = 30.0  # any single answer not in by then is "no answer within 30 s"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def commit_of(tree: Path) -> str:
    """Short commit of the tree, with `+changes` when tracked files differ from it."""
    head = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
    )
    dirty = subprocess.run(
        ["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        check=True,
        text=True,
    )
    return head.stdout.strip() + (" +changes" if dirty.stdout.strip() else "")


def router_fields(tree: Path) -> set[str]:
    """The router settings the tree's runtime/config.py accepts (its models are strict: unknown fields fail)."""
    out = subprocess.run(
        [
            str(PY),
            "-c",
            "import json; from runtime.config import RouterSettings as R; print(json.dumps(list(R.model_fields)))",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"},
    )
    return set(json.loads(out.stdout))


def write_config(tree: Path, into: Path, port: int, engine_port: int) -> dict[str, Any]:
    """The router config (and its keys file) for ``tree``; returns the router section, for the record."""
    keys = [
        {"name": "open", "sha256": hashlib.sha256(OPEN_KEY.encode()).hexdigest()},
        {
            "name": "tpm",
            "sha256": hashlib.sha256(TPM_KEY.encode()).hexdigest(),
            "tokens_per_minute": TOKENS_PER_MINUTE,
        },
    ]
    (into / "keys.yaml").write_text(yaml.safe_dump(keys))
    engine = f"http://127.0.0.1:{engine_port}"
    router: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": port,
        "require_api_key": True,
        "api_keys_file": "keys.yaml",
        "batches_url": engine,  # never reached by a keyless call; it makes /v1/files take the upload limit
        "queue_deadline_ms": QUEUE_DEADLINE_MS,
        "probe_interval_ms": 60_000,
    }
    fields = router_fields(tree)
    if "metrics_port" in fields:
        router["metrics_port"] = free_port()
    if "max_connections" in fields:
        router["max_connections"] = MAX_CONNECTIONS
    versions = [
        {
            "name": f"{VERSIONED}-{v}",
            "static_backends": [{"url": engine}],
            "version_of": {"model": VERSIONED, "version": v, "weight": w, "stable": v == "v1"},
        }
        for v, w in (("v1", 90), ("v2", 10))
    ]
    cfg = {
        "models": [
            {"name": MODEL, "static_backends": [{"url": engine}], "max_concurrency_per_backend": MODEL_CAP},
            *versions,
        ],
        "health": {"canaries": [{"model": VERSIONED}]},
        "router": router,
        "batches": {"router_url": f"http://127.0.0.1:{port}"},
    }
    (into / "router.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return router


def wait_ready(port: int, timeout_s: float = 60.0) -> None:
    """Until an authenticated chat through the router answers 200."""
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            data=body,
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {OPEN_KEY}"},
        )
        try:
            with urllib.request.urlopen(req, timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the router on 127.0.0.1:{port} never answered a chat with 200")


class RssPeak:
    """The router's resident memory sampled every 10 ms in a thread: its value at the start and its peak."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.start = self.peak = self.rss()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def rss(self) -> int:
        procs = [self.proc, *self.proc.children(recursive=True)]
        return sum(p.memory_info().rss for p in procs)

    def run(self) -> None:
        while not self.stop.wait(0.01):
            with contextlib.suppress(psutil.Error):
                self.peak = max(self.peak, self.rss())

    def __enter__(self) -> RssPeak:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(5)

    @property
    def growth_mib(self) -> float:
        return round((self.peak - self.start) / 1024 / 1024, 1)


# --- a minimal HTTP/1.1 client: the attacks need bytes on the wire no library sends ---------------------------


async def read_head(reader: asyncio.StreamReader) -> tuple[str, dict[str, str]]:
    """The status and headers of an answer; 'closed' when the connection ends before one."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return "closed", {}
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name:
            headers[name.strip().lower()] = value.strip()
    return lines[0].split(" ")[1], headers


async def read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    """A sized body (the answers the attacks read are sized)."""
    length = int(headers.get("content-length", "0"))
    return await reader.readexactly(length) if length else b""


def outcome(err: BaseException) -> str:
    if isinstance(err, TimeoutError):
        return f"no answer within {ANSWER_BOUND_S:.0f} s"
    if isinstance(err, ConnectionResetError | BrokenPipeError):
        return "reset"
    return type(err).__name__


async def exchange(
    port: int, head: bytes, send: Callable[[asyncio.StreamWriter], Coroutine[Any, Any, None]] | None = None
) -> dict[str, Any]:
    """Send ``head`` (then ``send``'s body, while already reading) and read the answer's head and sized body."""
    started = time.monotonic()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError as err:  # nothing listens any more (the router died), or the backlog overflowed
        return {"status": f"connect: {type(err).__name__}", "time_s": time.monotonic() - started}
    sender: asyncio.Task[None] | None = None
    try:
        writer.write(head)
        if send is not None:
            sender = asyncio.create_task(send(writer))
        try:
            status, headers = await asyncio.wait_for(read_head(reader), ANSWER_BOUND_S)
            body = b""
            if status not in ("closed",) and not headers.get("content-type", "").startswith(
                "text/event-stream"
            ):
                body = await asyncio.wait_for(read_body(reader, headers), ANSWER_BOUND_S)
        except (TimeoutError, OSError, asyncio.IncompleteReadError) as err:
            status, headers, body = outcome(err), {}, b""
        return {
            "status": status,
            "time_s": time.monotonic() - started,
            "retry_after": headers.get("retry-after"),
            "body": body,
            "writer": writer,
        }
    finally:
        if sender is not None:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)


def close(results: list[dict[str, Any]]) -> None:
    for r in results:
        writer = r.pop("writer", None)
        if writer is not None:
            writer.close()


def summary(results: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """Statuses counted, the slowest answer, the Retry-After values seen."""
    statuses = Counter(r["status"] for r in results)
    out: dict[str, Any] = {
        "status": ", ".join(f"{n} x {s}" if n > 1 else s for s, n in sorted(statuses.items())),
        "statuses": dict(statuses),
        "time_s": round(max(r["time_s"] for r in results), 3),
    }
    retry = sorted({r["retry_after"] for r in results if r.get("retry_after")})
    if retry:
        out["retry_after"] = retry
    return out | extra


def chat_head(key: str | None, body: bytes, path: str = "/v1/chat/completions", extra: str = "") -> bytes:
    """A POST's head and body; ``extra``: more header lines, each ending in CRLF."""
    auth = f"authorization: Bearer {key}\r\n" if key else ""
    return (
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n{auth}{extra}"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode() + body


def stream_body(max_tokens: int | None = None) -> bytes:
    body: dict[str, Any] = {
        "model": MODEL,
        "stream": True,
        "messages": [{"role": "user", "content": "hello"}],
    }
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return json.dumps(body).encode()


# --- the attacks ---------------------------------------------------------------------------------------------


async def keyless_uploads(port: int, path: str) -> dict[str, Any]:
    """Attack 1: 5 keyless uploads declaring 64 MiB each, sent in 1 MiB writes until answered."""
    sent: list[int] = []

    async def send(writer: asyncio.StreamWriter) -> None:
        n = 0
        try:
            while n < UPLOAD_BYTES:
                writer.write(CHUNK)
                await writer.drain()
                n += len(CHUNK)
        finally:
            sent.append(n)

    head = (
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: multipart/form-data; boundary=b\r\n"
        f"content-length: {UPLOAD_BYTES}\r\n\r\n"
    ).encode()
    results = await asyncio.gather(*(exchange(port, head, send) for _ in range(5)))
    close(results)
    return summary(results, sent_mib_max=round(max(sent, default=0) / 1024 / 1024, 1))


async def slowloris(port: int, bound_s: float = 20.0) -> dict[str, Any]:
    """Attack 2: a request head one byte a second, until the router answers or cuts it, or ``bound_s``."""
    head = b"GET /v1/models HTTP/1.1\r\nhost: 127.0.0.1\r\nx-slow: " + b"a" * 64 + b"\r\n\r\n"
    started = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    status = f"no answer within {bound_s:.0f} s"
    sent = 0
    try:
        while time.monotonic() - started < bound_s and sent < len(head):
            writer.write(head[sent : sent + 1])
            await writer.drain()
            sent += 1
            try:
                data = await asyncio.wait_for(reader.read(4096), 1.0)
            except TimeoutError:
                continue
            status = data.split(b" ")[1].decode() if data.startswith(b"HTTP/1.1 ") else "closed"
            break
    except OSError as err:
        status = outcome(err)
    finally:
        writer.close()
    return {"status": status, "time_s": round(time.monotonic() - started, 3), "bytes_sent": sent}


async def idle_connections(port: int, count: int = 300, bound_s: float = 17.0) -> dict[str, Any]:
    """Attack 3: ``count`` connections that send nothing, then a real request; another once the router has cut
    the idle ones (or at ``bound_s``)."""
    conns = await asyncio.gather(*(asyncio.open_connection("127.0.0.1", port) for _ in range(count)))
    started = time.monotonic()
    models = (
        f"GET /v1/models HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {OPEN_KEY}\r\n\r\n".encode()
    )
    first = await exchange(port, models)
    close([first])

    async def cut(reader: asyncio.StreamReader) -> float | None:
        with contextlib.suppress(TimeoutError, OSError):
            await asyncio.wait_for(reader.read(1), bound_s - (time.monotonic() - started))
            return time.monotonic() - started
        return None

    cuts = await asyncio.gather(*(cut(r) for r, _ in conns))
    second = await exchange(port, models)
    close([second])
    for _, w in conns:
        w.close()
    closed = [c for c in cuts if c is not None]
    return {
        "status": f"{first['status']}, then {second['status']}",
        "time_s": round(first["time_s"], 3),
        "first_request": first["status"],
        "after_cut_request": second["status"],
        "idle_closed_by_router": len(closed),
        "idle_closed_at_s": round(max(closed), 1) if closed else None,
        "retry_after": [first["retry_after"]] if first.get("retry_after") else None,
    }


async def big_header(port: int) -> dict[str, Any]:
    """Attack 4: one authenticated request with a 64 KiB header."""
    head = (
        f"GET /v1/models HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {OPEN_KEY}\r\n"
        f"x-fill: {'a' * 65536}\r\n\r\n"
    ).encode()
    result = await exchange(port, head)
    close([result])
    return summary([result])


async def keyless_get(port: int, path: str) -> dict[str, Any]:
    """Attack 5: a GET without a key on the API port; whether the answer carried the router's metrics or models."""
    result = await exchange(port, f"GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n".encode())
    close([result])
    body = result.get("body", b"")
    leaked = b"inferstack_router" in body if path == "/metrics" else f'"{MODEL}"'.encode() in body
    return summary([result], leaked=leaked, body_bytes=len(body))


async def concurrent_streams(port: int, key: str, count: int, max_tokens: int | None) -> dict[str, Any]:
    """Attacks 6 and 7: ``count`` streamed chats at once; every answer's head is read before any is closed,
    so the admitted streams hold their slots while the others are decided."""
    head = chat_head(key, stream_body(max_tokens))
    results = await asyncio.gather(*(exchange(port, head) for _ in range(count)))
    close(results)
    return summary(results)


def canary_served(metrics_url: str) -> float:
    """The requests the versioned model's canary answered 200, from the router's own counter."""
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            wanted = {"model": VERSIONED, "version": "v2", "status": "200"}
            if (
                sample.name == "inferstack_router_version_requests_total"
                and wanted.items() <= sample.labels.items()
            ):
                return float(sample.value)
    return 0.0


async def canary_by_sessions(port: int, metrics_url: str) -> dict[str, Any]:
    """Attack 8: one key, a fresh canary-bound session key per request, one request at a time."""
    free = Split(VERSIONED, ("v1", "v2"), (90.0, 10.0))
    sessions = [k for k in (f"s{i}" for i in range(5000)) if free.choose(k) == "v2"][:CANARY_SESSIONS]
    before = canary_served(metrics_url)
    results = []
    for session in sessions:
        body = json.dumps({"model": VERSIONED, "messages": [{"role": "user", "content": "hi"}]}).encode()
        head = chat_head(OPEN_KEY, body, extra=f"x-session-id: {session}\r\n")
        results.append(await exchange(port, head))
        close(results[-1:])
    on_canary = int(canary_served(metrics_url) - before)
    return summary(results, canary=f"{on_canary} of {len(sessions)}")


Attack = Callable[[int, str], Coroutine[Any, Any, dict[str, Any]]]
ATTACKS: list[tuple[str, str, Attack]] = [
    ("1a", "5 keyless 64 MiB POSTs to /v1/filesX", lambda p, _m: keyless_uploads(p, "/v1/filesX")),
    ("1b", "5 keyless 64 MiB POSTs to /v1/files", lambda p, _m: keyless_uploads(p, "/v1/files")),
    ("2", "request head trickled 1 byte/s (20 s bound)", lambda p, _m: slowloris(p)),
    ("3", "300 idle connections, then a request", lambda p, _m: idle_connections(p)),
    ("4", "64 KiB header", lambda p, _m: big_header(p)),
    ("5a", "GET /metrics without a key (API port)", lambda p, _m: keyless_get(p, "/metrics")),
    ("5b", "GET /v1/models without a key", lambda p, _m: keyless_get(p, "/v1/models")),
    (
        "6",
        f"20 streams at once, key of {TOKENS_PER_MINUTE:,} tokens/min, max_tokens 500",
        lambda p, _m: concurrent_streams(p, TPM_KEY, 20, 500),
    ),
    (
        "7",
        f"40 streams at once, {MODEL_CAP} served at a time, {QUEUE_DEADLINE_MS} ms queue deadline",
        lambda p, _m: concurrent_streams(p, OPEN_KEY, 40, None),
    ),
    (
        "8",
        f"{CANARY_SESSIONS} chats from one key, each with a session key chosen to land on a judged 10 % canary",
        canary_by_sessions,
    ),
]


@contextlib.contextmanager
def router_of(tree: Path, tmp: Path) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """The fake engine and the tree's router, both on loopback; yields (router port, router pid, settings)."""
    engine_port, port = free_port(), free_port()
    settings = write_config(tree, tmp, port, engine_port)
    engine = [
        str(PY),
        str(ROOT / "bench" / "router" / "fake_engine.py"),
        f"--port={engine_port}",
        f"--stream-chunks={STREAM_CHUNKS}",
        f"--stream-interval-ms={STREAM_INTERVAL_MS}",
    ]
    router = [str(PY), "-m", "runtime.router", "--config", str(tmp / "router.yaml"), "--log-level", "WARNING"]
    env = {"PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    with (
        process(engine, tmp / "engine.log", env=env),
        process(router, tmp / "router.log", cwd=tree, env=env) as proc,
    ):
        wait_ready(port)
        yield port, proc.pid, settings


def metrics_url(port: int, settings: dict[str, Any]) -> str:
    """The router's /metrics: its metrics port where the tree has one, else the API port (open there then)."""
    return f"http://127.0.0.1:{settings.get('metrics_port', port)}/metrics"


def alive(pid: int) -> bool:
    """Whether the router survived the attack (the bench's own child: a dead one is a zombie until reaped)."""
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def run_tree(label: str, tree: Path, only: set[str] | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"inferstack-bench-hardening-{label}-") as tmp_name:
        tmp = Path(tmp_name)
        results: dict[str, Any] = {}
        try:
            with router_of(tree, tmp) as (port, pid, settings):
                for key, name, attack in ATTACKS:
                    if only and key not in only and key.rstrip("ab") not in only:
                        continue
                    with RssPeak(pid) as rss:
                        result: dict[str, Any] = asyncio.run(attack(port, metrics_url(port, settings)))
                    result["rss_growth_mib"] = rss.growth_mib
                    result["rss_start_mib"] = round(rss.start / 1024 / 1024, 1)
                    result["router_alive"] = alive(pid)
                    results[key] = result
                    print(
                        f"{label:>7} {key:>3} {name:<62} {result['status']:<28} {result['time_s']:7.2f} s "
                        f"+{result['rss_growth_mib']:6.1f} MiB  (load {os.getloadavg()[0]:.2f})",
                        flush=True,
                    )
                    time.sleep(1.0)  # let the router let go of the attack's connections before the next
        except Exception:
            log = tmp / "router.log"
            if log.exists():
                print(f"--- {label} router log (tail) ---\n" + log.read_text()[-3000:], file=sys.stderr)
            raise
        return {"path": str(tree), "commit": commit_of(tree), "router_settings": settings, "attacks": results}


def cell(result: dict[str, Any] | None) -> str:
    if result is None:
        return "not run"
    status = result["status"]
    if result.get("retry_after"):
        status += f" (Retry-After {', '.join(result['retry_after'])})"
    if "leaked" in result:
        status += ", leaked" if result["leaked"] else ""
    if "idle_closed_by_router" in result:
        closed = result["idle_closed_by_router"]
        status += f"; idle cut: {closed}" + (f" by {result['idle_closed_at_s']} s" if closed else "")
    if "canary" in result:
        status += f"; on the canary: {result['canary']}"
    if "sent_mib_max" in result:
        status += f"; sent <= {result['sent_mib_max']} MiB"
    return f"{status} | {result['time_s']:.2f} s | +{result['rss_growth_mib']:.1f} MiB"


def markdown(data: dict[str, Any]) -> str:
    labels = list(data["trees"])
    m = data["machine"]
    lines = [
        f"# Issue #34 attacks on the router, {m['date']}",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, kernel {m['kernel']}, Python {m['python']};"
        f" load average {m['loadavg_start']} at the start (2 cores shared with other sessions).",
        "Trees: " + ", ".join(f"**{label}** = `{data['trees'][label]['commit']}`" for label in labels) + ".",
        "Each cell: answer status(es) | time to the slowest answer | router RSS growth (peak during the attack"
        " minus its value at the start). `closed`: the connection ended without an answer.",
        "",
        "| attack | " + " | ".join(f"{lb} status | {lb} time | {lb} memory" for lb in labels) + " |",
        "|---|" + "---|---|---|" * len(labels),
    ]
    for key, name, _ in ATTACKS:
        cells = [cell(data["trees"][lb]["attacks"].get(key)) for lb in labels]
        if all(c == "not run" for c in cells):
            continue
        cells = [c if c != "not run" else "not run | | " for c in cells]
        lines.append(f"| {key}. {name} | " + " | ".join(cells) + " |")
    lines += ["", "Router settings per tree (the rest are the tree's defaults):", ""]
    for lb in labels:
        lines.append(f"- {lb}: `{json.dumps(data['trees'][lb]['router_settings'], sort_keys=True)}`")
    return "\n".join(lines) + "\n"


def write_results(out: Path, name: str, data: dict[str, Any], text: str) -> None:
    """``out/<name>-<UTC date and time>.json`` (``data``) and ``.md`` (``text``)."""
    out.mkdir(parents=True, exist_ok=True)
    base = out / f"{name}-{time.strftime('%Y%m%d-%H%M', time.gmtime())}"
    base.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n")
    base.with_suffix(".md").write_text(text)
    print(f"wrote {base}.json and .md")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--tree",
        action="append",
        default=[],
        help="LABEL=PATH of a checkout to attack (repeatable; default: this one)",
    )
    parser.add_argument("--only", default="", help="attack numbers to run, comma-separated (default: all)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--redraw", type=Path, help="rewrite the .md of this results .json, run nothing")
    args = parser.parse_args()
    if args.redraw:
        args.redraw.with_suffix(".md").write_text(markdown(json.loads(args.redraw.read_text())))
        return
    trees = dict(t.split("=", 1) for t in args.tree) if args.tree else {"this": str(ROOT)}
    only = {k.strip() for k in args.only.split(",") if k.strip()} or None
    data: dict[str, Any] = {"machine": describe(), "trees": {}}
    for label, path in trees.items():
        data["trees"][label] = run_tree(label, Path(path).resolve(), only)
    data["loadavg_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    for tree in data["trees"].values():
        for result in tree["attacks"].values():
            result["time_s"] = round(result["time_s"], 3)
    write_results(args.out, "hardening", data, markdown(data))


if __name__ == "__main__":
    main()
