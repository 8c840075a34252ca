"""Loopback S3 servers side by side: what serving the Run:ai streamer's ranged reads costs each one.

    .venv/bin/python -m bench.coldstart.s3_servers [--size-mb 538] [--repeat 2] [--only moto s3rver ...]

One object the size and layout of SmolLM2-135M in F32 (the model `make local S3=1` streams: 538 MB, an
embedding of 113 MB and 30 layers of smaller tensors, random bytes) is uploaded to each server the way
``runtime.weights prepare`` does (boto3 ``upload_file``: 8 MiB multipart parts, 10 threads), then read back
``--repeat`` times two ways:

- ``streamer``: the Run:ai streamer from the engine venv, exactly as vLLM's loader calls it
  (``SafetensorsStreamer.stream_files`` then ``get_tensors``), with its defaults (8 streams, a request that
  sends no byte for 1 s is retried) unless the row says otherwise;
- ``boto3 ranged``: 8 threads of 8 MiB ranged GETs over the whole object, the bytes checked by sha256.

For each phase: wall seconds, the server's peak RSS (its process tree, sampled every 20 ms) and its CPU
seconds. Servers:

- ``moto``: moto's own server (``python -m moto.server``), the loopback S3 before: every ranged GET reads
  the whole object;
- ``moto-ranged``: moto behind the request log, ranged GETs answered from moto's stored copy with a seek
  (``moto_ranged.py``);
- ``s3rver``: npm ``s3rver``, objects in files, behind the request log: the project's loopback S3
  (``components/local/s3_server.py``; ``make s3rver`` installs it);
- ``localstack``: PyPI ``localstack-core``'s S3 provider alone (``SERVICES=s3``), in its own venv under
  ``.cache/s3-servers`` (pinned below: its newer releases need Python 3.12, and its loose dependencies break
  at their current versions).

Writes ``bench/results/s3-servers-<date>.{json,md}`` with the machine and the load average around each server.
Nothing leaves the machine: every server binds 127.0.0.1 (LocalStack's default gateway binds every interface,
so it runs here on its hypercorn gateway, which honours the address) and LocalStack is told not to fetch its
certificate or report events.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime as dt
import functools
import hashlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.machine import describe, dist_version  # noqa: E402
from components.local import s3_server  # noqa: E402
from components.local.engine_process import engine_python, free_port  # noqa: E402

CACHE = ROOT / ".cache" / "s3-servers"
BUCKET = "bench-store"
PREFIX = "models/smollm2-like"
MIB = 1 << 20
#: localstack-core 4.11 and later use Python 3.12 syntax; these pins are what starts on Python 3.11 today.
LOCALSTACK_PINS = [
    "localstack-core[base-runtime]==4.10.0",
    "cbor2<6",
    "pyopenssl<25",
    "cryptography<45",
    "service_identity<25",
    "psutil<7",
]
#: How the streamer was slowed for moto before (2 streams, 60 s stall limit): the reference row.
THROTTLED = {"RUNAI_STREAMER_CONCURRENCY": "2", "RUNAI_STREAMER_S3_REQUEST_TIMEOUT_MS": "60000"}
STREAM_TIMEOUT_S = 240.0

#: Streams the prefix as vLLM's loader does; prints seconds, tensor bytes and the client's peak RSS in KiB.
STREAM = """
import resource, sys, time
from runai_model_streamer import SafetensorsStreamer, list_safetensors
files = list_safetensors(sys.argv[1])
started = time.monotonic()
with SafetensorsStreamer() as streamer:
    streamer.stream_files(files, device="cpu")
    total = sum(t.numel() * t.element_size() for _, t in streamer.get_tensors())
print(time.monotonic() - started, total, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


# --- the object ----------------------------------------------------------------------------------------------


def smollm2_like(path: Path, size_mb: float) -> Path:
    """A safetensors file laid out like SmolLM2-135M in F32, scaled to ``size_mb`` MB (random bytes)."""
    hidden, kv, inter, vocab, layers = 576, 192, 1536, 49152, 30
    shapes = {"model.embed_tokens.weight": [vocab, hidden]}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": [hidden, hidden],
            p + "self_attn.k_proj.weight": [kv, hidden],
            p + "self_attn.v_proj.weight": [kv, hidden],
            p + "self_attn.o_proj.weight": [hidden, hidden],
            p + "mlp.gate_proj.weight": [inter, hidden],
            p + "mlp.up_proj.weight": [inter, hidden],
            p + "mlp.down_proj.weight": [hidden, inter],
            p + "input_layernorm.weight": [hidden],
            p + "post_attention_layernorm.weight": [hidden],
        }
    shapes["model.norm.weight"] = [hidden]
    full = sum(4 * _count(s) for s in shapes.values())
    scale = size_mb * 1e6 / full
    if abs(scale - 1) > 0.01:  # scale the leading dimension of each matrix
        shapes = {k: [max(1, round(s[0] * scale)), *s[1:]] if len(s) > 1 else s for k, s in shapes.items()}
    header: dict[str, Any] = {}
    offset = 0
    for name, shape in shapes.items():
        size = 4 * _count(shape)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    expected = 8 + len(raw) + offset
    if path.is_file() and path.stat().st_size == expected:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as out:
        out.write(len(raw).to_bytes(8, "little") + raw)
        for meta in header.values():
            out.write(os.urandom(meta["data_offsets"][1] - meta["data_offsets"][0]))
    return path


def _count(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(8 * MIB):
            digest.update(block)
    return digest.hexdigest()


# --- a server's processes: peak RSS and CPU ------------------------------------------------------------------


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                kids.setdefault(ppid, []).append(int(entry.name))
    return kids


def tree(pid: int) -> list[int]:
    kids, out, todo = _children(), [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def rss_kib(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def cpu_s(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
    return total / os.sysconf("SC_CLK_TCK")


class Sampler:
    """The peak summed RSS of a process tree, sampled every 20 ms (the tree is re-read every second)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.pids = tree(pid)
        self.peak_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last_tree = time.monotonic()
        while not self._stop.wait(0.02):
            if time.monotonic() - last_tree > 1:
                self.pids, last_tree = tree(self.pid), time.monotonic()
            self.peak_kib = max(self.peak_kib, sum(rss_kib(p) for p in self.pids))

    def phase(self) -> tuple[int, float]:
        """Start a phase: reset the peak; returns the current RSS (KiB) and CPU seconds."""
        self.pids = tree(self.pid)
        now = sum(rss_kib(p) for p in self.pids)
        self.peak_kib = now
        return now, cpu_s(self.pids)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


# --- the servers -----------------------------------------------------------------------------------------------


@dataclass
class Server:
    name: str
    endpoint: str
    proc: subprocess.Popen[bytes]
    requests: Path | None  # its request log, when it keeps one
    notes: str = ""
    extra: dict[str, str] = field(default_factory=dict)


def _wait(endpoint: str, proc: subprocess.Popen[bytes], timeout_s: float = 120.0) -> None:
    host, port = endpoint.rsplit("/", 1)[1].split(":")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        with contextlib.suppress(Exception), socket.create_connection((host, int(port)), timeout=1):
            s3_server.client(endpoint).list_buckets()
            return
        time.sleep(0.1)
    raise RuntimeError(f"{endpoint} did not answer within {timeout_s:.0f} s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def _popen(argv: list[str], log: Path, env: dict[str, str], cwd: Path = ROOT) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def start_moto(work: Path, port: int) -> tuple[subprocess.Popen[bytes], Path | None, str]:
    argv = [sys.executable, "-m", "moto.server", "-H", s3_server.HOST, "-p", str(port)]
    env = {**os.environ, "TMPDIR": str(work)}
    return _popen(argv, work / "server.log", env), None, f"moto {dist_version(Path(sys.executable), 'moto')}"


def start_moto_ranged(work: Path, port: int) -> tuple[subprocess.Popen[bytes], Path | None, str]:
    requests = work / "requests.jsonl"
    argv = [
        sys.executable,
        "-m",
        "bench.coldstart.moto_ranged",
        "--port",
        str(port),
        "--requests",
        str(requests),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(work)}
    version = dist_version(Path(sys.executable), "moto")
    return _popen(argv, work / "server.log", env), requests, f"moto {version} + ranged reads (moto_ranged.py)"


def start_s3rver(work: Path, port: int) -> tuple[subprocess.Popen[bytes], Path | None, str]:
    """The loopback S3 of the project (``components/local/s3_server.py``: ``tools/s3rver``, ``make s3rver``)."""
    requests = work / "requests.jsonl"
    argv = s3_server.argv(port, requests, work / "objects")
    lock = json.loads((s3_server.TOOLS / "package-lock.json").read_text())
    version = lock["packages"]["node_modules/s3rver"]["version"]
    node = subprocess.run([argv[0], "--version"], capture_output=True, text=True, check=True).stdout.strip()
    notes = f"s3rver {version}, node {node} (components/local/s3_server.py)"
    return _popen(argv, work / "server.log", dict(os.environ), cwd=s3_server.TOOLS), requests, notes


def start_localstack(work: Path, port: int) -> tuple[subprocess.Popen[bytes], Path | None, str]:
    python = CACHE / "localstack" / "bin" / "python"
    (work / "home").mkdir()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(work / "home"),
        "TMPDIR": str(work),
        "GATEWAY_LISTEN": f"{s3_server.HOST}:{port}",
        "GATEWAY_SERVER": "hypercorn",  # twisted (the default) binds every interface whatever GATEWAY_LISTEN says
        "LOCALSTACK_HOST": f"{s3_server.HOST}:{port}",
        "SERVICES": "s3",
        "EAGER_SERVICE_LOADING": "1",
        "DNS_ADDRESS": "0",  # no DNS server
        "DISABLE_EVENTS": "1",  # no analytics
        "SKIP_SSL_CERT_DOWNLOAD": "1",  # no certificate download
        "PERSISTENCE": "0",
        "OVERRIDE_IN_DOCKER": "0",  # else it may think it runs in its container and write to /var/lib/localstack
        "FILESYSTEM_ROOT": str(work / "localstack"),
    }
    argv = [str(python), "-m", "localstack.runtime.main"]
    version = dist_version(python, "localstack-core")
    return (
        _popen(argv, work / "server.log", env, cwd=work),
        None,
        f"localstack-core {version} (S3 only, hypercorn)",
    )


def install_localstack() -> None:
    venv = CACHE / "localstack"
    if not (venv / ".installed").is_file():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", *LOCALSTACK_PINS]
        subprocess.run(pip, check=True, stderr=subprocess.DEVNULL)
        (venv / ".installed").touch()


INSTALLERS: dict[str, Callable[[], None]] = {"localstack": install_localstack}

STARTERS: dict[str, Callable[[Path, int], tuple[subprocess.Popen[bytes], Path | None, str]]] = {
    "moto": start_moto,
    "moto-ranged": start_moto_ranged,
    "s3rver": start_s3rver,
    "localstack": start_localstack,
}


@contextlib.contextmanager
def running(name: str, work: Path) -> Iterator[tuple[Server, float]]:
    port = free_port()
    started = time.monotonic()
    proc, requests, notes = STARTERS[name](work, port)
    try:
        endpoint = f"http://{s3_server.HOST}:{port}"
        _wait(endpoint, proc)
        took = time.monotonic() - started
        listening = subprocess.run(
            ["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=False
        )
        binds = {line.split()[3] for line in listening.stdout.splitlines() if line.strip()}
        assert binds == {f"{s3_server.HOST}:{port}"}, f"{name} listens on {binds}, not loopback only"
        yield Server(name, endpoint, proc, requests, notes), took
    finally:
        _stop(proc)
        listening = subprocess.run(
            ["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=False
        )
        assert not listening.stdout.strip(), f"{name} still listens on {port} after stop"


# --- the phases ------------------------------------------------------------------------------------------------


def upload(server: Server, path: Path) -> None:
    s3 = s3_server.client(server.endpoint)
    s3.create_bucket(Bucket=BUCKET)
    s3.upload_file(str(path), BUCKET, f"{PREFIX}/model.safetensors")  # what Store.upload does


def stream(server: Server, env_extra: dict[str, str]) -> dict[str, Any]:
    env = {**os.environ, **s3_server.client_env(server.endpoint), **env_extra}
    for k in list(env):
        if k.startswith("RUNAI_STREAMER_") and k not in env_extra:
            del env[k]
    try:
        done = subprocess.run(
            [str(engine_python()), "-c", STREAM, f"s3://{BUCKET}/{PREFIX}/"],
            env=env,
            capture_output=True,
            text=True,
            timeout=STREAM_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"no result within {STREAM_TIMEOUT_S:.0f} s"}
    if done.returncode != 0:
        tail = [line for line in done.stderr.splitlines() if line.strip()][-3:]
        return {"ok": False, "error": " | ".join(tail)[-400:]}
    seconds, total, maxrss = done.stdout.split()[-3:]
    return {
        "ok": True,
        "client_seconds": float(seconds),
        "bytes": int(total),
        "client_peak_rss_mib": int(maxrss) / 1024,
    }


def ranged_boto3(
    server: Server, size: int, digest: str, threads: int = 8, step: int = 8 * MIB
) -> dict[str, Any]:
    import boto3  # noqa: PLC0415
    from botocore.config import Config  # noqa: PLC0415

    creds = s3_server.LOOPBACK_CREDENTIALS
    client = boto3.client(
        "s3",
        endpoint_url=server.endpoint,
        aws_access_key_id=creds["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=creds["AWS_SECRET_ACCESS_KEY"],
        region_name=creds["AWS_REGION"],
        config=Config(max_pool_connections=threads, retries={"max_attempts": 1}, read_timeout=120),
    )
    key = f"{PREFIX}/model.safetensors"

    def get(first: int) -> bytes:
        last = min(first + step, size) - 1
        body: bytes = client.get_object(Bucket=BUCKET, Key=key, Range=f"bytes={first}-{last}")["Body"].read()
        return body

    try:
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            chunks = list(pool.map(get, range(0, size, step)))
    except Exception as err:  # a failed read is a result here
        return {"ok": False, "error": str(err)[-300:]}
    check = hashlib.sha256()
    for chunk in chunks:
        check.update(chunk)
    if check.hexdigest() != digest:
        return {"ok": False, "error": "bytes differ from the object"}
    return {"ok": True, "bytes": sum(len(c) for c in chunks)}


def measured(sampler: Sampler, what: Callable[[], dict[str, Any] | None]) -> dict[str, Any]:
    _, cpu_before = sampler.phase()
    started = time.monotonic()
    out = what() or {"ok": True}
    seconds = time.monotonic() - started
    return {
        **out,
        "seconds": seconds,
        "server_peak_rss_mib": sampler.peak_kib / 1024,
        "server_cpu_s": cpu_s(sampler.pids) - cpu_before,
    }


@dataclass
class Contender:
    server: Server
    sampler: Sampler
    phases: list[dict[str, Any]] = field(default_factory=list)


def run_all(
    names: list[str], obj: Path, size: int, digest: str, repeat: int, moto_repeat: int
) -> list[dict[str, Any]]:
    """Every server up at once, the object uploaded to each; then the read phases round-robin, each round in
    another order, so that load from elsewhere on the machine falls on all of them alike."""
    for name in names:
        INSTALLERS.get(name, lambda: None)()
    with contextlib.ExitStack() as stack:
        contenders: list[Contender] = []
        for name in names:
            work = Path(tempfile.mkdtemp(prefix=f"s3-servers-{name}-", dir=CACHE))
            stack.callback(shutil.rmtree, work, ignore_errors=True)
            server, start_s = stack.enter_context(running(name, work))
            sampler = Sampler(server.proc.pid)
            stack.callback(sampler.stop)
            pids = tree(server.proc.pid)
            start = {"phase": "start", "repeat": 0, "ok": True, "seconds": start_s, "loadavg": _load()}
            start |= {
                "server_peak_rss_mib": sum(rss_kib(p) for p in pids) / 1024,
                "server_cpu_s": cpu_s(pids),
            }
            contender = Contender(server, sampler, [start])
            row = {
                "phase": "upload",
                "repeat": 0,
                "loadavg": _load(),
                **measured(sampler, functools.partial(upload, server, obj)),
            }
            contender.phases.append(row)
            contenders.append(contender)
            print(f"{name}: start {start_s:.1f} s, upload {row['seconds']:.1f} s", flush=True)
        for i in range(repeat):
            for c in contenders[i % len(contenders) :] + contenders[: i % len(contenders)]:
                name = c.server.name
                if name == "moto" and i >= moto_repeat:
                    continue
                modes: list[tuple[str, dict[str, str]]] = [("streamer", {})]
                if name == "moto":
                    modes.append(("streamer 2 streams, 60 s stall", THROTTLED))
                reads = [(label, functools.partial(stream, c.server, env)) for label, env in modes]
                reads.append(("boto3 ranged", functools.partial(ranged_boto3, c.server, size, digest)))
                for label, read in reads:
                    mark = _lines(c.server.requests)
                    row = {"phase": label, "repeat": i, "loadavg": _load(), **measured(c.sampler, read)}
                    row |= _sent(c.server.requests, mark, size)
                    c.phases.append(row)
                    print(f"{name}: {label} {_say(row)}", flush=True)
        return [{"server": c.server.name, "notes": c.server.notes, "phases": c.phases} for c in contenders]


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _lines(requests: Path | None) -> int:
    return len(s3_server.read_requests(requests)) if requests else 0


def _sent(requests: Path | None, mark: int, size: int) -> dict[str, Any]:
    """GETs of the object the server logged in this phase, and the bytes it sent as a multiple of the object."""
    if requests is None:
        return {}
    logged = s3_server.read_requests(requests)[mark:]
    gets = [r for r in logged if r["method"] == "GET" and r["path"].endswith(".safetensors")]
    return {
        "gets": len(gets),
        "failed_gets": sum(1 for r in gets if r["status"] >= 300),
        "sent_x_object": sum(r["bytes"] for r in gets) / size,
    }


def _say(row: dict[str, Any]) -> str:
    if not row["ok"]:
        return f"FAILED after {row['seconds']:.1f} s: {row['error']}"
    return f"{row['seconds']:.1f} s, peak RSS {row['server_peak_rss_mib']:.0f} MiB, CPU {row['server_cpu_s']:.1f} s"


# --- the report ------------------------------------------------------------------------------------------------


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if key in r]
    return statistics.median(values) if values else None


def summarize(servers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for s in servers:
        for phase in dict.fromkeys(p["phase"] for p in s["phases"]):
            mine = [p for p in s["phases"] if p["phase"] == phase]
            ok = [p for p in mine if p["ok"]]
            rows.append(
                {
                    "server": s["server"],
                    "phase": phase,
                    "runs": len(mine),
                    "failed": len(mine) - len(ok),
                    "seconds": _median(ok, "seconds"),
                    "stream_seconds": _median(ok, "client_seconds"),
                    "server_peak_rss_mib": max(p["server_peak_rss_mib"] for p in mine),
                    "server_cpu_s": _median(ok, "server_cpu_s"),
                    "sent_x_object": _median(ok, "sent_x_object"),
                    "error": next((p["error"] for p in mine if not p["ok"]), ""),
                }
            )
    base = {r["phase"]: r for r in rows if r["server"] == "s3rver"}
    for r in rows:
        ref = base.get(r["phase"]) or base.get("streamer")
        t = "stream_seconds" if ref and r["stream_seconds"] and ref["stream_seconds"] else "seconds"
        r["time_vs_s3rver"] = r[t] / ref[t] if ref and r[t] and ref[t] else None
        r["rss_vs_s3rver"] = r["server_peak_rss_mib"] / ref["server_peak_rss_mib"] if ref else None
    return rows


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        f"# Loopback S3 servers: the streamer's ranged reads ({result['name']})",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, kernel {m['kernel']}, Python {m['python']}, "
        f"{m['date']}, load average at start {m['loadavg_start']}, at the end {result['loadavg_end']} (other work "
        f"shared the machine: the 1-min load at each server's phases is below). runai-model-streamer "
        f"{result['versions']['runai-model-streamer']}, boto3 {result['versions']['boto3']}. Object: "
        f"{result['object_mb']:.0f} MB, laid out like SmolLM2-135M in F32. All servers run at once; the read phases "
        f"go round-robin, {result['repeat']} rounds each in another order, so load from elsewhere falls on all "
        f"alike (plain moto: {result.get('moto_repeat', result['repeat'])} round, minutes each). Medians; peak RSS "
        f"is the highest. Command: `{result['command']}`.",
        "",
        "`seconds` is the phase's wall time (for the streamer: its whole process, torch import included); "
        "`streaming` is the streamer's own time from `stream_files` to the last tensor. `bytes sent / object`: "
        "what the server's request log counted for the object's GETs (moto and LocalStack keep none here).",
        "",
        "| server | phase | runs | failed | seconds | streaming | vs s3rver | server peak RSS | vs s3rver | server CPU s | bytes sent / object |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["summary"]:
        lines.append(
            f"| {r['server']} | {r['phase']} | {r['runs']} | {r['failed']} | {fmt(r['seconds'], '.2f')} | "
            f"{fmt(r['stream_seconds'], '.2f')} | "
            f"{fmt(r['time_vs_s3rver'], '.2f')}x | {r['server_peak_rss_mib']:.0f} MiB | "
            f"{fmt(r['rss_vs_s3rver'], '.2f')}x | {fmt(r['server_cpu_s'], '.1f')} | {fmt(r['sent_x_object'], '.2f')} |"
        )
    lines += ["", "| server | version | 1-min load average at its phases (min-max) |", "|---|---|---|"]
    for srv in result["servers"]:
        loads = [p["loadavg"] for p in srv["phases"] if "loadavg" in p]
        spread = f"{min(loads):.2f}-{max(loads):.2f}" if loads else "-"
        lines.append(f"| {srv['server']} | {srv['notes']} | {spread} |")
    errors = [(r["server"], r["phase"], r["error"]) for r in result["summary"] if r["error"]]
    if errors:
        lines += ["", "Failures (first per cell):", ""]
        lines += [f"- {s} / {p}: `{e}`" for s, p, e in errors]
    if result.get("conclusion"):
        lines += ["", result["conclusion"]]
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=float, default=538.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--moto-repeat",
        type=int,
        default=1,
        help="rounds for plain moto (minutes each: it reads the whole object per range)",
    )
    parser.add_argument("--only", nargs="*", choices=list(STARTERS), default=list(STARTERS))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--name", default=f"s3-servers-{dt.date.today():%Y-%m-%d}")
    parser.add_argument("--conclusion", type=Path, help="a markdown paragraph to end the report with")
    parser.add_argument("--summarize", type=Path, help="rebuild the summary and markdown of a result JSON")
    args = parser.parse_args()
    if args.summarize:
        result = json.loads(args.summarize.read_text())
        result["summary"] = summarize(result["servers"])
        if args.conclusion:
            result["conclusion"] = args.conclusion.read_text().strip()
        write(result, args.summarize.parent)
        return
    machine = describe()
    CACHE.mkdir(parents=True, exist_ok=True)
    obj = smollm2_like(CACHE / "smollm2-like.safetensors", args.size_mb)
    size, digest = obj.stat().st_size, sha256(obj)
    servers = run_all(args.only, obj, size, digest, args.repeat, args.moto_repeat)
    result = {
        "name": args.name,
        "command": " ".join([".venv/bin/python -m bench.coldstart.s3_servers", *sys.argv[1:]]),
        "machine": machine,
        "loadavg_end": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "repeat": args.repeat,
        "moto_repeat": args.moto_repeat,
        "object_mb": size / 1e6,
        "versions": {
            "runai-model-streamer": dist_version(engine_python(), "runai-model-streamer"),
            "boto3": dist_version(Path(sys.executable), "boto3"),
        },
        "servers": servers,
        "summary": summarize(servers),
    }
    if args.conclusion:
        result["conclusion"] = args.conclusion.read_text().strip()
    write(result, args.out)


def write(result: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{result['name']}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / f"{result['name']}.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
