"""Charts and a Markdown table from ``bench/scale/run.py`` results, beside the JSON they come from.

    .venv/bin/python bench/scale/chart.py bench/results/scale-YYYYMMDD-HHMM.json [--before OTHER.json]

``--before`` draws a second run (the commit before a fix) as dashed lines on the same axes.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def caption(data: dict[str, Any]) -> str:
    m = data["machine"]
    return (
        f"{m['cpu']}, {m['cores']} cores; commit {m['commit']}; {m['date']}; "
        f"load average {m['loadavg_start']} -> {m.get('loadavg_end', '?')}"
    )


def draw(runs: list[tuple[str, dict[str, Any]]], out: Path) -> None:
    panels = [
        (
            "replicas",
            "replicas",
            "cpu_us_per_req",
            "router CPU us / request (log x: a straight line is log N)",
            "fake replicas",
        ),
        (
            "index",
            "index_entries",
            "cpu_us_per_req",
            "router CPU us / request (16 replicas)",
            "prefix index entries",
        ),
        ("index_memory", "entries", "bytes_per_entry", "bytes / entry (tracemalloc)", "prefix index entries"),
        ("health", "replicas", "cpu_us_per_probe", "CPU us / probe: health monitor (and router)", "replicas"),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for ax, (key, x, y, title, xlabel) in zip(axes.flat, panels, strict=True):
        series = [(key, "health monitor, " if key == "health" else "")]
        series += [("router_probes", "router's own probing, ")] if key == "health" else []
        for (label, data), style in zip(runs, ("-", "--"), strict=False):
            for k, what in series:
                rows = data.get(k) or []
                if not rows:
                    continue
                name = f"{what}{label}" if what or len(runs) > 1 else None
                ax.plot([r[x] for r in rows], [r[y] for r in rows], style, marker="o", label=name)
                for r in rows:
                    ax.annotate(
                        f"{r[y]:.0f}", (r[x], r[y]), textcoords="offset points", xytext=(4, 4), fontsize=8
                    )
        if key == "index" and runs[0][1].get("index"):
            rss = [(r["index_entries"], r["rss_bytes_per_entry"]) for r in runs[0][1]["index"]]
            ax2 = ax.twinx()
            ax2.plot([a for a, _ in rss], [b for _, b in rss], ":", color="grey", marker="x")
            ax2.set_ylabel("router RSS growth, bytes / entry (dotted)")
            ax2.set_ylim(bottom=0)
        ax.set_xscale("log", base=2 if key in ("replicas", "health") else 10)
        ax.set_ylim(bottom=0)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(caption(runs[0][1]), fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def table(data: dict[str, Any]) -> str:
    lines = [f"Machine: {caption(data)}", ""]
    if data.get("replicas"):
        lines += [
            "| replicas | CPU us/request | gross (idle timers in) | idle, cores | req/s | p50 ms | p99 ms | RSS MiB | errors |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in data["replicas"]:
            lines.append(
                f"| {r['replicas']:,} | {r['cpu_us_per_req']} | {r['cpu_us_per_req_gross']} | {r['idle_cpu_cores']} | "
                f"{r['rps']:,} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['rss_mib']} | {r['errors']} |"
            )
        lines.append("")
    if data.get("index"):
        mem = {r["entries"]: r["bytes_per_entry"] for r in data.get("index_memory") or []}
        lines += [
            "| index bound | entries | CPU us/request | RSS growth MiB | RSS bytes/entry | tracemalloc bytes/entry | req/s | errors |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in data["index"]:
            lines.append(
                f"| {r['index_max_entries']:,} | {r['index_entries']:,} | {r['cpu_us_per_req']} | {r['rss_fill_mib']} | "
                f"{r['rss_bytes_per_entry']} | {mem.get(r['index_max_entries'], '')} | {r['rps']:,} | {r['errors']} |"
            )
        lines.append("")
    if data.get("health"):
        lines += [
            "| replicas | CPU us/probe | probes/s | monitor CPU, cores | feed read, CPU ms | feed KiB | RSS MiB |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in data["health"]:
            lines.append(
                f"| {r['replicas']:,} | {r['cpu_us_per_probe']} | {r['probes_per_s']} | {r['cpu_cores']} | "
                f"{r['feed_cpu_ms_per_read']} | {r['feed_bytes'] / 1024:.0f} | {r['rss_mib']} |"
            )
        lines.append("")
    if data.get("router_probes"):
        lines += ["| replicas | router CPU us/probe | probes/s | router CPU, cores |", "|---|---|---|---|"]
        for r in data["router_probes"]:
            lines.append(
                f"| {r['replicas']:,} | {r['cpu_us_per_probe']} | {r['probes_per_s']} | {r['cpu_cores']} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", type=Path)
    ap.add_argument("--before", type=Path, default=None)
    args = ap.parse_args()
    data = json.loads(args.results.read_text())
    runs = [(data["machine"]["commit"], data)]
    if args.before:
        before = json.loads(args.before.read_text())
        runs = [
            (f"after: {data['machine']['commit']}", data),
            (f"before: {before['machine']['commit']}", before),
        ]
    draw(runs, args.results.with_suffix(".png"))
    args.results.with_suffix(".md").write_text("# Scale curves\n\n" + table(data))
    print(f"wrote {args.results.with_suffix('.png')} and .md")


if __name__ == "__main__":
    main()
