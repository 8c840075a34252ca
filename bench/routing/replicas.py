"""Prefix-cache hit rate with 1, 2 and 3 router replicas behind a round-robin front: the engines' own
KV-event view (``precise_prefix``) against the routed-history index (``prefix_aware``).

    .venv/bin/python -m bench.routing.replicas                 # ~25 minutes on 2 cores
    .venv/bin/python -m bench.routing.replicas --replicas 1,3 --repeat 1

The engines, the model and the workload are bench/routing/run.py's (two tiny-Llama vLLM-CPU replicas, a
KV cache smaller than the working set, 64 conversations of 6 turns on 8 shared system prompts), with the
engines publishing their KV events (their spec's routing is precise_prefix, so the renderer adds
``--kv-events-config`` on ipc sockets). Per run, N ``python -m runtime.router`` processes read one config
and sit behind ``components.local.balancer`` (one new connection per router in turn, as a network load
balancer does); the client keeps a pool of keep-alive connections, so a conversation's turns land on
whichever router their connection goes to. With the routed-history index each router knows only the
requests it routed; with the event view every router follows both engines. Hit rate comes from the
engines' counters; router CPU is summed over the N routers.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.machine import describe, dist_version
from bench.processes import process
from bench.routing import workload as wl
from bench.routing.run import (
    BENCH_PY,
    BLOCK_TOKENS,
    DEFAULT_KV_BLOCKS,
    ENGINE_PY,
    PY,
    RESULTS,
    ROOT,
    ROUTER_PORT,
    Run,
    engines,
    make_model,
    med_range,
    play_and_account,
    post,
    wait_idle,
    wait_ready,
)
from components.local.engine_process import EngineProcess, free_port

STRATEGIES = {"history": "prefix_aware", "events": "precise_prefix"}


def router_config(model: str, procs: list[EngineProcess], strategy: str) -> dict[str, Any]:
    backends = []
    for e in procs:
        backend: dict[str, Any] = {"url": e.base_url}
        if strategy == "precise_prefix" and e.kv_events:
            backend["kv_events_endpoint"], backend["kv_replay_endpoint"] = e.kv_events
        backends.append(backend)
    target: dict[str, Any] = {"name": model, "static_backends": backends, "max_concurrency_per_backend": 64}
    if strategy == "precise_prefix":
        target["kv_events"] = {"tokenizer_dir": model}
    return {
        "models": [target],
        "router": {"host": "127.0.0.1", "default_strategy": {"name": strategy}, "probe_interval_ms": 500},
    }


def measure(
    label: str,
    n: int,
    work: wl.Workload,
    rep: int,
    model: str,
    procs: list[EngineProcess],
    tmp: Path,
    logs: Path,
) -> Run:
    urls = [e.base_url for e in procs]
    cfg = tmp / f"{label}-{n}.json"
    cfg.write_text(json.dumps(router_config(model, procs, STRATEGIES[label])))
    target = f"{label}-x{n}"
    with ExitStack() as stack:
        ports = [free_port() for _ in range(n)]
        metrics_ports = [free_port() for _ in range(n)]
        routers = [
            stack.enter_context(
                process(
                    [
                        str(PY),
                        "-m",
                        "runtime.router",
                        "--config",
                        str(cfg),
                        "--port",
                        str(p),
                        "--metrics-port",
                        str(m),
                        "--log-level",
                        "WARNING",
                    ],
                    logs / f"{target}-router-{i}.log",
                )
            )
            for i, (p, m) in enumerate(zip(ports, metrics_ports, strict=True))
        ]
        to = [a for p in ports for a in ("--to", f"127.0.0.1:{p}")]
        stack.enter_context(
            process(
                [str(PY), "-m", "components.local.balancer", "--listen", f"127.0.0.1:{ROUTER_PORT}", *to],
                logs / f"{target}-balancer.log",
            )
        )
        wait_ready(model)
        if label == "events":  # the replay of the engines' buffers is start-up work, not per-request work
            wait_synced([f"http://127.0.0.1:{m}" for m in metrics_ports], len(urls))
        wait_idle(urls)
        for u in urls:
            post(f"{u}/reset_prefix_cache")  # the engines publish AllBlocksCleared: the views empty too
        return play_and_account(target, work, rep, model, urls, [r.pid for r in routers])


def wait_synced(routers: list[str], engines: int, timeout_s: float = 120) -> None:
    """``routers``: their metrics listeners. Until every router follows every engine and has applied its replay (``kv_view_synced``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        synced = 0
        for r in routers:
            with urllib.request.urlopen(f"{r}/metrics", timeout=10) as resp:
                text = resp.read().decode()
            synced += sum(
                1
                for line in text.splitlines()
                if line.startswith("inferstack_router_kv_view_synced{") and line.endswith(" 1.0")
            )
        if synced == len(routers) * engines:
            return
        time.sleep(0.2)
    raise RuntimeError(f"the routers did not follow all {engines} engines within {timeout_s:.0f}s")


def table(runs: list[Run], info: dict[str, str], params: dict[str, Any]) -> str:
    lines = [f"# Prefix-cache hit rate with several router replicas, {info['date']}", ""]
    lines += [f"- {k}: {v}" for k, v in info.items()]
    lines += [f"- workload: {json.dumps(params)}", ""]
    lines += [
        "N router replicas behind a round-robin TCP balancer; medians over repeats, (min-max) in brackets;"
        " hit rate from the engines' counters; router CPU summed over the N routers.",
        "",
        "| routing | routers | runs | hit rate | vs 1 router | max replica share | TTFT p50 ms | TTFT p95 ms "
        "| req/s | errors | router CPU us/req |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, strategy in STRATEGIES.items():
        base = [r.hit_rate for r in runs if r.target == f"{label}-x1"]
        for target in dict.fromkeys(r.target for r in runs if r.target.startswith(label)):
            rs = [r for r in runs if r.target == target]
            delta = ""
            if base:
                gap = statistics.median(r.hit_rate for r in rs) - statistics.median(base)
                delta = f"{gap * 100:+.1f} pts"
            lines.append(
                f"| {label} ({strategy}) | {target.rsplit('x', 1)[1]} | {len(rs)} "
                f"| {med_range([r.hit_rate * 100 for r in rs], '.1f')} % | {delta} "
                f"| {med_range([max(r.share) * 100 for r in rs], '.1f')} % "
                f"| {med_range([r.ttft_p50_ms for r in rs], '.1f')} | {med_range([r.ttft_p95_ms for r in rs], '.1f')} "
                f"| {med_range([r.rps for r in rs], '.1f')} | {sum(r.errors for r in rs)} "
                f"| {med_range([r.router_cpu_us_per_req or float('nan') for r in rs], '.0f')} |"
            )
    return "\n".join(lines) + "\n"


def report(path: Path) -> int:
    """The markdown table and the chart of a results file (no engines needed)."""
    data = json.loads(path.read_text())
    runs = [Run(**r) for r in data["runs"]]
    path.with_suffix(".md").write_text(table(runs, data["machine"], data["workload"]))
    if BENCH_PY.exists():
        subprocess.run([str(BENCH_PY), str(ROOT / "bench/routing/replicas_chart.py"), str(path)], check=False)
    print(path.with_suffix(".md").read_text())
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", default="1,2,3")
    ap.add_argument("--routing", default="history,events")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--session-rate", type=float, default=6.0)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--name", default=None, help="results file stem (default routing-replicas-YYYYMMDD-HHMM)")
    ap.add_argument(
        "--report", type=Path, default=None, help="only write the table and chart of a results JSON"
    )
    args = ap.parse_args()
    if args.report is not None:
        return report(args.report)
    counts = [int(n) for n in args.replicas.split(",") if n]
    labels = [x for x in args.routing.split(",") if x]
    if not counts or min(counts) < 1 or any(x not in STRATEGIES for x in labels):
        print(f"--replicas N,... (>= 1) and --routing among {list(STRATEGIES)}", file=sys.stderr)
        return 2
    work = wl.shared(args.seed, sessions=args.sessions, session_rate=args.session_rate)
    params = {
        "seed": args.seed,
        "sessions": args.sessions,
        "turns": 6,
        "system_prompts": 8,
        "session_rate_per_s": args.session_rate,
        "requests": work.requests,
        "max_tokens": 8,
        "concurrency_bound": 64,
    }
    name = args.name or dt.datetime.now(dt.UTC).strftime("routing-replicas-%Y%m%d-%H%M")
    RESULTS.mkdir(parents=True, exist_ok=True)
    runs: list[Run] = []
    info = {
        **describe(),
        "vllm-cpu": dist_version(ENGINE_PY, "vllm-cpu"),
        "engines": f"2 x tiny Llama, one core each, --block-size {BLOCK_TOKENS} --num-gpu-blocks-override "
        f"{DEFAULT_KV_BLOCKS}, KV events on (ipc), --prefix-caching-hash-algo sha256_cbor",
    }

    def save() -> None:
        (RESULTS / f"{name}.json").write_text(
            json.dumps({"machine": info, "workload": params, "runs": [asdict(r) for r in runs]}, indent=1)
        )

    with tempfile.TemporaryDirectory(prefix="inferstack-replicas-") as tmpdir, ExitStack() as stack:
        tmp = Path(tmpdir)
        logs = ROOT / ".cache" / "bench-replicas-logs"
        shutil.rmtree(logs, ignore_errors=True)
        logs.mkdir(parents=True)
        model = make_model("tiny-llama")  # the committed results: the routers' own behaviour shows
        print("starting two engines (about a minute) ...", flush=True)
        sockets = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ikvb-")))  # short socket paths
        replicas = stack.enter_context(engines(model, DEFAULT_KV_BLOCKS, args.max_model_len, logs, sockets))
        for rep in range(args.repeat):
            order = [(label, n) for n in counts for label in labels]
            for label, n in order if rep % 2 == 0 else order[::-1]:  # interleaved, alternating order
                run = measure(label, n, work, rep, str(model), replicas, tmp, logs)
                runs.append(run)
                print(
                    f"{run.target:12s} rep {rep}: hit {run.hit_rate * 100:5.1f} % "
                    f"share {'/'.join(f'{s * 100:.0f}' for s in run.share)} "
                    f"ttft p50 {run.ttft_p50_ms:7.1f} p95 {run.ttft_p95_ms:7.1f} ms {run.rps:5.1f} req/s "
                    f"err {run.errors} cpu {run.router_cpu_us_per_req or 0:.0f} us/req load {run.loadavg}",
                    flush=True,
                )
                save()
        info["loadavg_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    save()
    return report(RESULTS / f"{name}.json")


if __name__ == "__main__":
    raise SystemExit(main())
