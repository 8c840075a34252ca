"""Chart of a router-replicas run: prefix-cache hit rate against the number of router replicas (PNG).

    .cache/venv-bench/bin/python bench/routing/replicas_chart.py bench/results/routing-replicas-....json

Runs in the bench venv (matplotlib lives there). Points are medians over the repeats; the bars span the
lowest to the highest run.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

LABELS = {"history": "routed history (prefix_aware)", "events": "engine KV events (precise_prefix)"}
OFFSETS = {"history": (6, -12), "events": (6, 5)}  # numbers below one line, above the other


def main(path: Path) -> Path:
    runs = json.loads(path.read_text())["runs"]
    fig, ax = plt.subplots(figsize=(6.5, 4.0))
    for label, text in LABELS.items():
        counts = sorted({int(r["target"].rsplit("x", 1)[1]) for r in runs if r["target"].startswith(label)})
        if not counts:
            continue
        values = [[r["hit_rate"] * 100 for r in runs if r["target"] == f"{label}-x{n}"] for n in counts]
        mids = [statistics.median(v) for v in values]
        low = [m - min(v) for m, v in zip(mids, values, strict=True)]
        high = [max(v) - m for m, v in zip(mids, values, strict=True)]
        ax.errorbar(counts, mids, yerr=[low, high], marker="o", capsize=4, label=text)
        for n, m in zip(counts, mids, strict=True):
            ax.annotate(f"{m:.1f}", (n, m), textcoords="offset points", xytext=OFFSETS[label], fontsize=8)
    ax.set_xlabel("router replicas behind a round-robin balancer")
    ax.set_ylabel("prefix-cache hit rate (%)")
    ax.set_xticks(sorted({int(r["target"].rsplit("x", 1)[1]) for r in runs}))
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left")
    ax.set_title("Shared-prompt chat workload, 2 vLLM-CPU replicas")
    out = path.with_suffix(".png")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    return out


if __name__ == "__main__":
    print(main(Path(sys.argv[1])))
