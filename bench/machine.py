"""The machine a benchmark ran on, recorded beside its results (numbers mean little without it)."""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
from pathlib import Path


def dist_version(python: Path, dist: str) -> str:
    """Installed version of ``dist`` in the venv of ``python``, or 'absent'."""
    if not python.exists():
        return "absent"
    out = subprocess.run(
        [str(python), "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip() or "absent"


def describe() -> dict[str, str]:
    """CPU model, cores, memory, kernel, Python, date and the load average when the run started."""
    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem_kib = int(Path("/proc/meminfo").read_text().split()[1])
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "memory_gib": f"{mem_kib / 1024 / 1024:.1f}",
        "kernel": platform.release(),
        "python": platform.python_version(),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "loadavg_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }
