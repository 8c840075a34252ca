"""How long the command line takes to answer: `--help`, `size`, `plan -s prod`, and plan time against the
number of models (a generated stack of 1, 10, 30, 100 models).

    .venv/bin/python bench/cli/run.py                                  # this checkout
    git worktree add --detach /tmp/base <commit>                       # a commit to compare against
    .venv/bin/python bench/cli/run.py --tree base=/tmp/base --tree after=.

Each command is a fresh process (`python -m components.cli.main ...` with the tree on PYTHONPATH, run from the
tree), as a user would start it; every tree runs in the same repeat before the next repeat starts, so a
change in the machine's load hits every tree alike. Recorded per command: wall time and the process's
CPU time (user + sys, from wait4: it moves less than wall time when other work shares the cores), the
median and minimum over the repeats, and the load average before and after. The generated stacks are the
prod stack's three models copied N times (renamed, 2 replicas each, pools sized to fit), so each tree
plans the same stack. Writes bench/results/cli-<date>.{json,md,png} (the chart needs matplotlib).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.machine import describe  # noqa: E402

MODEL_COUNTS = (1, 10, 30, 100)
RESOURCES = re.compile(r"^(\d+) resources, ", re.MULTILINE)
GPUS_PER_REPLICA_SLOT = {"h100": 2, "l40s": 2, "l4": 1}
"""Replicas of the prod models one node of each prod pool holds (70B: TP 2 on 8 GPUs, with room to spare)."""


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def generated_stack(tree: Path, models: int, into: Path) -> str:
    """The tree's prod stack with its models copied to ``models`` (names -000, -001, ...), 2 replicas each."""
    raw = yaml.safe_load((tree / "stacks" / "Pulumi.prod.yaml").read_text())
    platform = raw["config"]["inferstack:platform"]
    protos = platform["models"]
    copies = []
    for i in range(models):
        model = copy.deepcopy(protos[i % len(protos)])
        model["name"] = f"{model['name']}-{i:03d}"
        for adapter in model.get("adapters", []):  # clients ask for an adapter by name: unique in a stack
            adapter["name"] = f"{adapter['name']}-{i:03d}"
        model["scaling"]["min_replicas"] = model["scaling"]["max_replicas"] = 2
        copies.append(model)
    platform["models"] = copies
    for pool in platform["gpu_pools"]:
        replicas = 2 * sum(1 for m in copies if m["pool"] == pool["name"])
        # One spare node per pool and 10 % more, so a rolling update starts a replica before stopping one.
        pool["max_nodes"] = math.ceil(1.1 * replicas / GPUS_PER_REPLICA_SLOT[pool["name"]]) + 2
    platform["budget"]["monthly_usd_cap"] = 100_000_000
    name = f"bench{models}"
    (into / f"Pulumi.{name}.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return name


def timed(tree: Path, args: list[str]) -> dict[str, float]:
    """Wall and CPU seconds of ``python -m components.cli.main ARGS`` in ``tree``; a failure ends the bench."""
    env = {**os.environ, "PYTHONPATH": str(tree), "COLUMNS": "120"}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "components.cli.main", *args],
            cwd=tree,
            env=env,
            stdout=out,
            stderr=err,
        )
        # wait4 rather than proc.wait(): it also returns the child's own CPU time.
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        if code != 0:
            err.seek(0)
            raise SystemExit(f"{tree}: {' '.join(args)} exited {code}:\n{err.read().decode()[-2000:]}")
        out.seek(0)
        resources = RESOURCES.search(out.read().decode())
    result = {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime}
    return result | ({"resources": int(resources.group(1))} if resources else {})


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


def commands(tree: Path, stacks: Path, models: tuple[int, ...]) -> dict[str, list[str]]:
    out = {
        "--help": ["--help"],
        "size llama-3.1-8b": ["size", "llama-3.1-8b"],
        "plan -s prod": ["plan", "-s", "prod"],
    }
    for n in models:
        out[f"plan, {n} models"] = [
            "plan",
            "-s",
            generated_stack(tree, n, stacks),
            "--stacks-dir",
            str(stacks),
        ]
    return out


def summary(samples: list[dict[str, float]]) -> dict[str, float]:
    walls = [s["wall_s"] for s in samples]
    cpus = [s["cpu_s"] for s in samples]
    out = {
        "wall_median_s": statistics.median(walls),
        "wall_min_s": min(walls),
        "cpu_median_s": statistics.median(cpus),
        "cpu_min_s": min(cpus),
    }
    return out | ({"resources": samples[0]["resources"]} if "resources" in samples[0] else {})


def markdown(data: dict[str, Any]) -> str:
    trees = data["trees"]
    labels = list(trees)
    machine = data["machine"]
    lines = [
        f"# CLI response times, {machine['date']}",
        "",
        f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory_gib']} GiB, kernel "
        f"{machine['kernel']}, Python {machine['python']}. Load average (1/5/15 min) at start "
        f"{data['loadavg_start']}, at end {data['loadavg_end']}. {data['repeats']} repeats, interleaved "
        "(every tree once per repeat). Fresh process per run: `python -m components.cli.main ...`.",
        "",
        "Trees: " + ", ".join(f"**{label}** = `{trees[label]['commit']}`" for label in labels) + ".",
        "",
    ]
    head = ["command"]
    for label in labels:
        head += [f"{label} wall s, median (min)", f"{label} CPU s"]
    if len(labels) > 1:
        head += [f"{labels[0]} / {labels[-1]} wall", f"{labels[0]} / {labels[-1]} CPU"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for command in data["commands"]:
        row = [f"`{command}`"]
        res = {label: trees[label]["results"][command] for label in labels}
        for label in labels:
            r = res[label]
            row += [f"{r['wall_median_s']:.2f} ({r['wall_min_s']:.2f})", f"{r['cpu_median_s']:.2f}"]
        if len(labels) > 1:
            first, last = res[labels[0]], res[labels[-1]]
            row += [
                f"{first['wall_median_s'] / last['wall_median_s']:.1f}x",
                f"{first['cpu_median_s'] / last['cpu_median_s']:.1f}x",
            ]
        lines.append("| " + " | ".join(row) + " |")
    resources = {c: r["resources"] for c, r in trees[labels[-1]]["results"].items() if "resources" in r}
    if resources:
        lines += ["", "Resources planned: " + ", ".join(f"{c}: {n}" for c, n in resources.items()) + "."]
    return "\n".join(lines) + "\n"


def chart(data: dict[str, Any], path: Path) -> bool:
    """Plan time (wall, median) against models per tree; False when matplotlib is missing."""
    try:
        import matplotlib  # noqa: PLC0415 - optional: the table carries the numbers

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4), constrained_layout=True)
    for (label, tree), colour in zip(data["trees"].items(), ["#999999", "#4c72b0", "#dd8452"], strict=False):
        points = [(int(c.split()[1]), r) for c, r in tree["results"].items() if c.startswith("plan, ")]
        xs = [n for n, _ in points]
        walls = [r["wall_median_s"] for _, r in points]
        cpus = [r["cpu_median_s"] for _, r in points]
        ax.plot(xs, walls, marker="o", color=colour, label=f"{label} ({tree['commit']}): wall")
        ax.plot(xs, cpus, marker="x", color=colour, linestyle="--", label=f"{label}: CPU (user + sys)")
    ax.axhline(10, color="grey", linewidth=0.8, linestyle=":", label="target at 100 models (10 s)")
    ax.set_xlabel("models in the stack (2 replicas each)")
    ax.set_ylabel("inferstack plan, seconds (median)")
    ax.set_title(f"plan time vs models, load avg {data['loadavg_start']}")
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--tree",
        action="append",
        default=[],
        help="LABEL=PATH of a checkout to time (repeatable; default: this one)",
    )
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--models", default=",".join(map(str, MODEL_COUNTS)), help="model counts to plan")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument(
        "--redraw", type=Path, help="rewrite the .md and .png of this results .json, run nothing"
    )
    args = parser.parse_args()
    if args.redraw:
        write(json.loads(args.redraw.read_text()), args.redraw.with_suffix(""))
        return
    trees = dict(t.split("=", 1) for t in args.tree) if args.tree else {"this": str(ROOT)}
    models = tuple(int(n) for n in args.models.split(",") if n)
    machine = describe()
    data: dict[str, Any] = {
        "machine": machine,
        "repeats": args.repeat,
        "loadavg_start": loadavg(),
        "trees": {},
    }
    with tempfile.TemporaryDirectory(prefix="inferstack-bench-cli-") as tmp:
        plans: dict[str, dict[str, list[str]]] = {}
        for label, path in trees.items():
            tree = Path(path).resolve()
            stacks = Path(tmp) / label
            stacks.mkdir()
            plans[label] = commands(tree, stacks, models)
            data["trees"][label] = {"path": str(tree), "commit": commit_of(tree), "samples": {}}
        data["commands"] = list(next(iter(plans.values())))
        for i in range(args.repeat):
            for command in data["commands"]:
                for label, path in trees.items():
                    sample = timed(Path(path).resolve(), plans[label][command])
                    data["trees"][label]["samples"].setdefault(command, []).append(sample)
                    print(
                        f"[{i + 1}/{args.repeat}] {label:>8} {command:<22} {sample['wall_s']:6.2f} s wall "
                        f"{sample['cpu_s']:6.2f} s CPU  (load {loadavg()})",
                        flush=True,
                    )
    data["loadavg_end"] = loadavg()
    for tree in data["trees"].values():
        tree["results"] = {c: summary(s) for c, s in tree["samples"].items()}
    stamp = time.strftime("%Y%m%d-%H%M", time.gmtime())
    args.out.mkdir(parents=True, exist_ok=True)
    base = args.out / f"cli-{stamp}"
    base.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n")
    write(data, base)


def write(data: dict[str, Any], base: Path) -> None:
    """BASE.md (the table) and BASE.png (the chart) from the results."""
    text = markdown(data)
    if chart(data, base.with_suffix(".png")):
        text += f"\n![plan time vs models]({base.with_suffix('.png').name})\n"
    else:
        text += "\n(no chart: matplotlib is not installed in this venv)\n"
    base.with_suffix(".md").write_text(text)
    print(text)
    print(f"wrote {base}.{{json,md,png}}")


if __name__ == "__main__":
    main()
