"""What CI logs and pipes read: `inferstack size | cat`, `cost --compare -s prod | cat` and `plan -s prod | cat` print
whole tables (rich cut them to 80 columns when stdout was not a terminal: `llam…`, `$80,…`), and `--format
markdown|json` print the same figures for a file or a script. Run as a user would: a real process, stdout a pipe,
no COLUMNS in its environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ELLIPSIS = "\N{HORIZONTAL ELLIPSIS}"


def piped(*args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "components.cli.main", *args],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,  # stdout and stderr are pipes, as in `| cat` or a CI log
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.parametrize(
    ("args", "whole"),
    [
        (
            ["size", "llama-3.1-70b", "--quant", "awq"],
            ["p4de.24xlarge", "8 x A100-80GB", "seqs at full length"],
        ),
        (
            ["cost", "--compare", "-s", "prod"],
            ["llama-3-70b", "Llama 3.3 70B Instruct Turbo (Together AI)", "$80,358"],
        ),
        (["cost", "-s", "prod"], ["pool h100 (1-3 x p5.48xlarge, on-demand)", "total"]),
        (
            ["plan", "-s", "prod"],
            ["llama-3-70b", "vllm (generate)", "p5.48xlarge", "$80,358", "$/M tokens (est.)"],
        ),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) and v and v[0] in ("size", "cost", "plan") else "",
)
def test_piped_tables_are_whole(args: list[str], whole: list[str]) -> None:
    text = piped(*args)
    assert ELLIPSIS not in text, text
    for cell in whole:
        assert cell in text, f"{cell!r} not in `inferstack {' '.join(args)} | cat`:\n{text}"


@pytest.mark.parametrize(
    "args",
    [["size", "llama-3.1-70b", "--quant", "awq"], ["cost", "--compare", "-s", "prod"], ["size", "--list"]],
)
def test_format_json_and_markdown_give_the_same_rows(args: list[str]) -> None:
    found = json.loads(piped(*args, "--format", "json"))
    rows = found["fits"] if "fits" in found else found["rows"] if isinstance(found, dict) else found
    assert rows and all(isinstance(r, dict) for r in rows)
    md = piped(*args, "--format", "markdown")
    assert ELLIPSIS not in md
    first = rows[0]
    header = "| " + " | ".join(first) + " |"
    assert header in md
    assert "| " + " | ".join(first.values()) + " |" in md


def test_plan_format_json_is_the_plan_record_and_the_verdicts() -> None:
    found = json.loads(piped("plan", "-s", "prod", "--format", "json"))
    assert found["plan"]["stack"] == "prod" and found["plan"]["format"] == 1
    assert [m["name"] for m in found["plan"]["models"]] == ["llama-3-70b", "llama-3-8b", "bge-large"]
    assert found["policy"]["failed"] is False
    md = piped("plan", "-s", "prod", "--format", "markdown")
    assert md.startswith("# inferstack plan: prod") and ELLIPSIS not in md
