"""Chart of a routing run: prefix-cache hit rate and TTFT p95 per target, both workloads (PNG).

    .cache/venv-bench/bin/python bench/routing/chart.py bench/results/routing-YYYYMMDD-HHMM.json

Runs in the bench venv (matplotlib lives there, not in the project). Bars are medians over the
repeats; the whiskers span the lowest to the highest run.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main(path: Path) -> Path:
    data = json.loads(path.read_text())
    runs = data["runs"]
    targets = list(dict.fromkeys(r["target"] for r in runs))
    panels = [
        ("shared", "hit_rate", "prefix-cache hit rate, shared prompts (%)", 100.0),
        ("shared", "ttft_p95_ms", "TTFT p95, shared prompts (ms)", 1.0),
        ("shared", "max_share", "busiest replica's share of requests, shared (%)", 100.0),
        ("control", "ttft_p95_ms", "TTFT p95, control: nothing shared (ms)", 1.0),
    ]
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 3.0 * len(panels)), constrained_layout=True)
    colours = ["#4c72b0" if t.startswith("is-") else "#999999" for t in targets]
    for ax, (work, key, title, scale) in zip(axes, panels, strict=True):
        meds, lo, hi = [], [], []
        for t in targets:
            vals = [
                (max(r["share"]) if key == "max_share" else r[key]) * scale
                for r in runs
                if r["target"] == t and r["workload"] == work
            ]
            m = statistics.median(vals) if vals else 0.0
            meds.append(m)
            lo.append(m - min(vals) if vals else 0.0)
            hi.append(max(vals) - m if vals else 0.0)
        ax.bar(range(len(targets)), meds, yerr=[lo, hi], color=colours, capsize=4)
        ax.set_xticks(range(len(targets)), targets, rotation=20, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
        if key == "max_share":
            ax.axhline(60, color="#c44e52", linestyle="--", linewidth=1)
        for i, m in enumerate(meds):
            ax.annotate(f"{m:.0f}", (i, m), ha="center", va="bottom", fontsize=7)
    m = data["machine"]
    fig.suptitle(
        f"inferstack routing on 2 x vLLM-CPU ({m['date']}; load avg {m['loadavg_start']}); "
        "blue: inferstack, grey: the field",
        fontsize=9,
    )
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=110)
    return out


if __name__ == "__main__":
    print(main(Path(sys.argv[1])))
