"""Where `inferstack plan` spends its CPU, phase by phase, in one fresh process per tree and stack.

    .venv/bin/python bench/cli/breakdown.py --tree base=/tmp/base --tree after=. --stack prod
    .venv/bin/python bench/cli/breakdown.py --tree base=/tmp/base --tree after=. --models 100  # generated stack

The phases are what the plan command does, in order, timed with the process's CPU clock (all threads):
the CLI's own imports, the imports `plan` adds (the program, the Pulumi SDKs, the policy pack), reading
and validating the stack (with the report and the policy config), the program under Pulumi's mocks (its
first run also imports the SDK modules the program touches, e.g. `pulumi_aws.ec2`), the same program a
second time in the same process (the program alone, nothing left to import), and the policy pack. The
cyclic garbage collector is set as the tree's own `plan` command sets it. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.cli.run import generated_stack  # noqa: E402

PROBE = r"""
import contextlib, json, sys, time
from pathlib import Path
clock = time.process_time
marks = {"interpreter start": clock()}
from components.cli import main as cli
marks["CLI imports"] = clock()
paused = getattr(cli, "_cyclic_gc_paused", contextlib.nullcontext)  # what the tree's plan command does
with paused():
    from components.deploy import synthesis as planner
    from components.cli import report
    from components.clouds.targets import PROFILES
    from components.core.stackfile import load
    from policies.inference import offline
    marks["plan's imports (program, SDKs, policy pack)"] = clock()
    stack = load(sys.argv[1], Path(sys.argv[2]), profiles=PROFILES)
    policy = offline.prepare(stack, None)
    report.plan_report(stack)
    marks["stack: load, validate, report"] = clock()
    synthesis = planner.synthesize(stack)
    marks["program under mocks, first run (with lazy SDK imports)"] = clock()
    planner.synthesize(stack)
    marks["program under mocks, second run (the program alone)"] = clock()
    policy.run(synthesis, has_resources=True)
    marks["policy pack"] = clock()
print(json.dumps({"marks": marks, "resources": len(synthesis.resources)}))
"""


def phases(tree: Path, stack: str, stacks_dir: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, stack, str(stacks_dir)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{tree}: {proc.stderr[-2000:]}")
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    names = list(data["marks"])
    out = {names[0]: data["marks"][names[0]]}
    for before, name in itertools.pairwise(names):
        out[name] = data["marks"][name] - data["marks"][before]
    return out | {"resources": data["resources"]}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--tree", action="append", default=[], help="LABEL=PATH (repeatable; default: this one)"
    )
    parser.add_argument("--stack", default="prod")
    parser.add_argument("--stacks-dir", type=Path, default=None, help="default: the tree's stacks/")
    parser.add_argument(
        "--models", type=int, help="plan run.py's generated stack of this many models instead"
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs per tree; the table shows the median")
    args = parser.parse_args()
    trees = dict(t.split("=", 1) for t in args.tree) if args.tree else {"this": str(ROOT)}
    runs: dict[str, list[dict[str, float]]] = {label: [] for label in trees}
    with tempfile.TemporaryDirectory(prefix="inferstack-breakdown-") as tmp:
        stacks: dict[str, tuple[str, Path]] = {}
        for label, path in trees.items():
            tree = Path(path).resolve()
            if args.models:
                into = Path(tmp) / label
                into.mkdir()
                stacks[label] = (generated_stack(tree, args.models, into), into)
            else:
                stacks[label] = (args.stack, args.stacks_dir or tree / "stacks")
        for _ in range(args.repeat):
            for label, path in trees.items():
                runs[label].append(phases(Path(path).resolve(), *stacks[label]))
    labels = list(trees)
    names = [n for n in runs[labels[0]][0] if n != "resources"]
    lines = [
        f"`plan -s {stacks[labels[0]][0]}` ({runs[labels[0]][0]['resources']} resources), CPU seconds per phase, "
        f"median of {args.repeat}, load average {' '.join(Path('/proc/loadavg').read_text().split()[:3])}:",
        "",
        "| phase | " + " | ".join(labels) + " |",
        "|---|" + "---|" * len(labels),
    ]

    def median(label: str, name: str) -> float:
        values = sorted(r[name] for r in runs[label])
        return values[len(values) // 2]

    for name in names:
        lines.append(f"| {name} | " + " | ".join(f"{median(label, name):.2f}" for label in labels) + " |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
