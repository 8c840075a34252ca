"""Issue #34's hostile input file, checked by each tree's batch input validation: memory, CPU and verdict.

    .venv/bin/python bench/hardening/validation.py --tree before=/tmp/base34 --tree after=.

The file is what a tenant with a key can upload at the default ``max_file_mib`` (64): 64 MiB of ``{}`` lines,
22 million requests, against the default ``max_requests_per_batch`` (50,000). Each tree's ``check_file``
(``runtime.batches.validate`` before the rename, ``runtime.batch_service.validate`` after) runs in a fresh
process of its own, on the tree's code: the peak RSS of that process (``ru_maxrss``) minus its RSS before the
call, the CPU seconds of the call, and the error codes it returned. Writes
bench/results/validation-<date>.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.hardening.run import commit_of, write_results  # noqa: E402
from bench.machine import describe  # noqa: E402

FILE_MIB = 64
MAX_REQUESTS = 50_000

#: Run in the tree's own process: builds the file, checks it, prints what it measured as JSON.
PROBE = """
import importlib, json, resource, time
validate = importlib.import_module("{module}")
assert validate.__file__.startswith({tree!r}), validate.__file__  # the tree's code, not the installed one
data = b"{{}}\\n" * ({mib} * 1024 * 1024 // 3)
before = int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize()
cpu = time.process_time()
checked = validate.check_file(data, "/v1/chat/completions", {max_requests})
cpu = time.process_time() - cpu
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
codes = sorted({{e.code for e in checked.errors}})
print(json.dumps({{"cpu_s": round(cpu, 2), "memory_mib": max(0.0, round((peak - before) / 2**20, 1)), "codes": codes}}))
"""


def probe(tree: Path) -> dict[str, Any]:
    """By the tree's own module name: asked for a module the tree does not have, the interpreter's editable
    install of this checkout would answer with this checkout's."""
    renamed = (tree / "runtime" / "batch_service" / "validate.py").is_file()
    module = "runtime.batch_service.validate" if renamed else "runtime.batches.validate"
    script = PROBE.format(mib=FILE_MIB, max_requests=MAX_REQUESTS, module=module, tree=str(tree))
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        check=True,
        timeout=900,
    )
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def markdown(data: dict[str, Any]) -> str:
    m = data["machine"]
    lines = [
        f"# Issue #34: a {FILE_MIB} MiB input file of `{{}}` lines, checked, {m['date']}",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, Python {m['python']}; load average"
        f" {m['loadavg_start']} at the start. max_requests_per_batch {MAX_REQUESTS:,}.",
        "",
        "| tree | commit | CPU of the check | memory it added (peak RSS) | verdict (error codes) |",
        "|---|---|---|---|---|",
    ]
    for label, tree in data["trees"].items():
        lines.append(
            f"| {label} | `{tree['commit']}` | {tree['cpu_s']} s | +{tree['memory_mib']} MiB |"
            f" {', '.join(tree['codes'])} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tree", action="append", default=[], help="LABEL=PATH of a checkout (repeatable)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    trees = dict(t.split("=", 1) for t in args.tree) if args.tree else {"this": str(ROOT)}
    data: dict[str, Any] = {"machine": describe(), "trees": {}}
    for label, path in trees.items():
        tree = Path(path).resolve()
        data["trees"][label] = {"commit": commit_of(tree), **probe(tree)}
        print(label, data["trees"][label], flush=True)
    write_results(args.out, "validation", data, markdown(data))


if __name__ == "__main__":
    main()
