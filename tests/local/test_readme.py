"""Every command in README.md is exercised by a test or by CI, and the cheap ones run here as written.

Commands are the lines of ```bash blocks, the ``$ `` lines of ```console blocks, and inline code that
starts with ``make``, ``inferstack``, ``.venv/bin/``, ``python -m`` or ``pulumi``. Each must match one
entry of ``COVERAGE``, whose evidence (a file and a string in it: the test or CI step that runs the
command) is checked too. The README's `curl` lines and its Python snippet run against a real local
stack in test_local_stack.py. The `pulumi` commands need the Pulumi CLI and cloud credentials, which
no test here has: CI previews with them, and the program they run is tested under Pulumi's mocks.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
HERE = "tests/local/test_readme.py"
LOCAL_TEST = "tests/local/test_local_stack.py"
LIFECYCLE = "tests/local/test_lifecycle.py"
MONITOR_TEST = "tests/local/test_monitor_stack.py"
LOCAL_HELPERS = "tests/local/helpers.py"
CI = ".github/workflows/ci.yml"

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_INLINE = re.compile(r"`((?:make|inferstack|\.venv/bin/|python -m|pulumi) [^`]*)`")


def fenced(lang: str) -> list[str]:
    return [body for kind, body in _FENCE.findall(README.read_text()) if kind == lang]


def readme_commands() -> list[str]:
    """Commands of the README in order, continuation lines joined, comments dropped."""
    text = README.read_text()
    commands: list[str] = []
    for kind, body in _FENCE.findall(text):
        if kind == "bash":
            joined = re.sub(r"\\\n\s*", "", body)
            for raw in joined.splitlines():
                line = re.sub(r"\s+#.*$", "", raw).strip()
                if line and not line.startswith("#"):
                    commands.append(line)
        elif kind == "console":
            commands += [line[2:].strip() for line in body.splitlines() if line.startswith("$ ")]
    prose = _FENCE.sub("", text)
    commands += [re.sub(r"\s+", " ", m).strip() for m in _INLINE.findall(prose)]
    return list(dict.fromkeys(commands))  # each once, in order


def readme_curls() -> list[str]:
    """The README's curl commands (run against a live local stack by test_local_stack.py)."""
    return [c for c in readme_commands() if c.startswith("curl ")]


def readme_python_snippet() -> str:
    """The first Python block: the openai client example that the banner also prints."""
    return fenced("python")[0]


@dataclass(frozen=True)
class Coverage:
    pattern: str
    evidence: tuple[tuple[str, str], ...]  # (file, a string in it) for the test or CI step that runs it
    why: str


COVERAGE = [
    Coverage(r"make local( DETACH=1)?", ((LOCAL_HELPERS, 'make_target("local", "DETACH=1"'), (LOCAL_TEST, "with detached_stack(state_dir,"), (LOCAL_TEST, '_make("local", *'),), "run for real"),
    Coverage(r'make local LOCAL_ARGS=".*"', ((LOCAL_TEST, 'f"LOCAL_ARGS={args}"'), (HERE, 'LOCAL_ARGS=--engine-port 8100')), "run for real; dry run here"),
    Coverage(r"make local S3=1", ((HERE, "_make_dry(\"local\", \"S3=1\")"), (LOCAL_TEST, 'detached_stack(state_dir, "S3=1"')), "run for real; dry run here"),
    Coverage(r"inferstack local up --s3", ((HERE, "_make_dry(\"local\", \"S3=1\")"), ("tests/local/test_plan.py", "LocalOptions(s3_port=9000)")), "dry run and plan tests"),
    Coverage(r"python -m runtime\.weights prepare", (("tests/runtime/weights/test_store.py", '"prepare", "--from"'),), "run against loopback S3"),
    Coverage(r"make local PD=1", ((HERE, '_make_dry("local", "PD=1")'), ("tests/local/test_local_pd.py", "LocalOptions(cpus=(0, 1), engine_port=9100, pd=True)")), "dry run here; the plan in test_local_pd, the engines in test_pd_nixl"),
    Coverage(r"inferstack local up --pd", (("tests/local/test_local_pd.py", "LocalOptions(cpus=(0, 1), engine_port=9100, pd=True)"), ("tests/integration/test_pd_nixl.py", "lifecycle.pd_units(")), "plan test; the engines in test_pd_nixl"),
    Coverage(r"make local PORT=\d+", ((HERE, "def test_make_targets_run_the_documented_commands"),), "dry run here"),
    Coverage(r"make local ROUTERS=\d+", ((HERE, '_make_dry("local", "ROUTERS=2")'), (LIFECYCLE, '"--routers", "2"')), "dry run here; --routers runs in the lifecycle test"),
    Coverage(r"inferstack local up --routers \d+", ((LIFECYCLE, '"--routers", "2"'),), "lifecycle test"),
    Coverage(r"make redis", ((HERE, '_make_dry_lines("redis")'),), "dry run here; make test runs it"),
    Coverage(r"make local-down", ((LOCAL_TEST, '_make("local-down"'),), "run for real"),
    Coverage(r"make traces-venv", ((HERE, '_make_dry_lines("-B", "traces-venv")'),), "dry run here"),
    Coverage(r"make local TRACES=1", ((HERE, '_make_dry("local", "TRACES=1")'), ("tests/local/test_traces.py", "def test_traces_on_every_request_goes_to_the_local_store")), "dry run here; its plan in the traces test"),
    Coverage(r"make local MONITOR=1", ((MONITOR_TEST, '"MONITOR=1",'), (HERE, '_make_dry("local", "MONITOR=1")')), "run for real; dry run here"),
    Coverage(r"make prometheus", (("Makefile", "INSTALLS := venv engine-venv prepare-venv tools-venv crd-tools prometheus"), (".ci/run", "make test")), "make test runs it first"),
    Coverage(r"make s3rver", (("Makefile", "INSTALLS := venv engine-venv prepare-venv tools-venv crd-tools prometheus s3rver"), (".ci/run", "make test")), "make test runs it first"),
    Coverage(r"\.venv/bin/inferstack local up -s scale-from-zero --stacks-dir tests/local/stacks --monitor", ((MONITOR_TEST, 'STACK = "scale-from-zero"'), (MONITOR_TEST, '"--stacks-dir", str(STACKS)')), "run for real (through make MONITOR=1)"),
    Coverage(r"make local-(status|logs)", ((HERE, "def test_make_targets_run_the_documented_commands"), (LIFECYCLE, 'run_local("status"'), (LIFECYCLE, 'run_local("logs"')), "dry run here; the command runs in the lifecycle test"),
    Coverage(r"make test", ((".ci/run", "make test"), (CI, "run: make test")), "CI"),
    Coverage(r"make unit", ((HERE, "def test_make_targets_run_the_documented_commands"),), "dry run here"),
    Coverage(r"make bench", ((HERE, 'bench = _make_dry_lines("bench")'),), "dry run here; its results were made by a fresh-clone run"),
    Coverage(r"curl -s http://127\.0\.0\.1:(808[012]|9091)/.*", ((LOCAL_TEST, "readme_curls()"),), "against the real stack"),
    Coverage(r"\.venv/bin/inferstack size .*", ((HERE, "def test_size_prints_what_the_readme_shows"),), "run here"),
    Coverage(r"inferstack size --list", ((HERE, "def test_cheap_commands_run"),), "run here"),
    Coverage(r"\.venv/bin/inferstack plan -s prod --out build/prod", ((HERE, "def test_cheap_commands_run"),), "run here"),
    Coverage(r"\.venv/bin/inferstack plan -s kind --out build/kind", ((CI, "stack: [dev, kind, staging, prod, prod-405b, shared]"), (CI, "--out build/${{ matrix.stack }}")), "CI plan job"),
    Coverage(r"\.venv/bin/inferstack plan -s prod --policy-config policies/inference/config/prod\.json", (("tests/policies/test_plan.py", '"--policy-config", "policies/inference/config/prod.json"'), (CI, "--policy-config policies/inference/config/${{ matrix.stack }}.json")), "policy tests and CI"),
    Coverage(r"inferstack plan", ((HERE, "def test_cheap_commands_run"),), "run here (the name of the command)"),
    Coverage(r"\.venv/bin/inferstack plan -s prod --against main --out build/prod", (("tests/components/test_plan_diff.py", '"--against", "HEAD~1"'), ("tests/components/test_plan_diff.py", "def test_the_readme_shows_the_diff_the_command_prints")), "a git revision base in the diff tests; the README's diff regenerated"),
    Coverage(r"\.venv/bin/inferstack plan -s prod --against build/prod --fail-on replacement --fail-on cost-increase-over=5000", (("tests/components/test_plan_diff.py", '"--fail-on", "cost-increase-over=100", "--fail-on", "replacement"'),), "a directory base and the gates in the diff tests"),
    Coverage(r"\.venv/bin/inferstack cost --compare (-s prod|--model .*)", (("tests/components/test_compare.py", 'runner.invoke(app, ["cost", "--compare", "-s", "prod"]'), ("tests/components/test_compare.py", "def test_cost_compare_for_a_model_and_a_volume")), "run in the cost tests"),
    Coverage(r"inferstack schema", (("tests/components/test_cli.py", "def test_committed_schema_is_current"),), "schema test"),
    Coverage(r"inferstack local up( \[--detach\]| --port \d+)?", ((LIFECYCLE, 'local_cmd("up"'), (LIFECYCLE, '"--detach"'), ("tests/local/helpers.py", '"--port"')), "lifecycle test"),
    Coverage(r"inferstack local (status|down)", ((LIFECYCLE, 'run_local("status"'), (LIFECYCLE, 'run_local("down"')), "lifecycle test"),
    Coverage(r"inferstack local logs .*", ((LIFECYCLE, 'run_local("logs", "router"'),), "lifecycle test"),
    Coverage(r"python -m runtime\.picker --config FILE", (("components/local/plan.py", 'ServiceLaunch("picker", "runtime.picker"'), ("tests/local/test_envoy_gateway.py", '"picker" in names')), "what make local GATEWAY=envoy runs"),
    Coverage(r"make local GATEWAY=envoy", ((HERE, '_make_dry("local", "GATEWAY=envoy")'), ("tests/local/test_envoy_gateway.py", '"--gateway", "envoy"')), "dry run here; the command runs in the Envoy gateway test"),
    Coverage(r"inferstack plan -s inference-extension --stacks-dir examples/stacks", (("tests/components/test_inference_extension.py", 'def test_the_cli_plans_the_example'),), "run in the inference-extension test"),
    Coverage(r"python -m runtime\.(router|health|batcher|batch_service) --config FILE", (("components/local/plan.py", '"-m", self.module, "--config"'), (LIFECYCLE, '("router", "batcher", "health", "3 engines")')), "what make local runs"),
    Coverage(r"pulumi stack select prod|pulumi config set --secret inferstack:hfToken hf_\.\.\.|pulumi up( -s (kind|prod))?", ((CI, "pulumi preview"), ("tests/components/test_program.py", "under the SDK's mock runtime")), "needs the Pulumi CLI and credentials: CI previews, tests run the program under mocks"),
    Coverage(r"pulumi preview --policy-pack policies/inference --policy-pack-config policies/inference/config/<stack>\.json", ((CI, "--policy-pack policies/inference"), (CI, "--policy-pack-config policies/inference/config/${{ matrix.stack }}.json")), "CI preview job"),
]  # fmt: skip


def test_the_readme_has_the_sections_issue_8_asks_for() -> None:
    text = README.read_text()
    for heading in (
        "## Two commands",
        "## Run it locally",
        "## Size a model",
        "## Plan a stack",
        "## Deploy with `pulumi up`",
        "## The `kind` stack",
        "## The policy pack in CI",
        "## The runtime services",
        "## Benchmarks",
        "## Layout",
    ):
        assert heading in text, heading
    two = fenced("bash")[0]
    assert [line.split()[:2] for line in two.strip().splitlines()] == [["make", "local"], ["make", "test"]]


@pytest.mark.parametrize("command", readme_commands())
def test_every_command_is_covered(command: str) -> None:
    matches = [c for c in COVERAGE if re.fullmatch(c.pattern, command)]
    assert matches, f"README command not exercised by any test or CI step: {command!r}; add it to COVERAGE"
    for path, needle in matches[0].evidence:
        assert needle in (REPO / path).read_text(), f"{command!r}: {path} no longer contains {needle!r}"


def _make_dry_lines(*args: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKEFLAGS", "MFLAGS", "MAKELEVEL"))}
    result = subprocess.run(
        ["make", "-n", "-s", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=True
    )
    return result.stdout.strip().splitlines()


def _make_dry(*args: str) -> str:
    return _make_dry_lines(*args)[-1]


def test_make_targets_run_the_documented_commands() -> None:
    assert re.fullmatch(r"\.venv/bin/inferstack local up\s*", _make_dry("local"))
    assert re.fullmatch(r"\.venv/bin/inferstack local up --port 9090\s*", _make_dry("local", "PORT=9090"))
    assert re.fullmatch(r"\.venv/bin/inferstack local up\s+--detach\s*", _make_dry("local", "DETACH=1"))
    assert re.fullmatch(r"\.venv/bin/inferstack local up\s+--s3\s*", _make_dry("local", "S3=1"))
    assert re.fullmatch(r"\.venv/bin/inferstack local up\s+--pd\s*", _make_dry("local", "PD=1"))
    assert re.fullmatch(
        r"\.venv/bin/inferstack local up\s+--gateway envoy\s*", _make_dry("local", "GATEWAY=envoy")
    )
    assert _make_dry("local-status") == ".venv/bin/inferstack local status"
    assert _make_dry("local-logs") == ".venv/bin/inferstack local logs"
    assert (
        _make_dry("local-down", "LOCAL_STATE=/tmp/x") == ".venv/bin/inferstack local down --state-dir /tmp/x"
    )
    assert re.fullmatch(
        r"\.venv/bin/inferstack local up\s+--engine-port 8100",
        _make_dry("local", "LOCAL_ARGS=--engine-port 8100"),
    )
    assert re.fullmatch(r"\.venv/bin/inferstack local up\s+--routers 2\s*", _make_dry("local", "ROUTERS=2"))
    assert any("apt-get install -y -q redis-server" in line for line in _make_dry_lines("redis"))
    assert re.fullmatch(r"\.venv/bin/inferstack local up\s+--monitor\s*", _make_dry("local", "MONITOR=1"))
    assert re.fullmatch(r"\.venv/bin/inferstack local up\s+--traces\s*", _make_dry("local", "TRACES=1"))
    assert any("-r scripts/traces-requirements.txt" in line for line in _make_dry_lines("-B", "traces-venv"))
    assert "bash scripts/install-prometheus.sh" in _make_dry_lines("local", "MONITOR=1")
    assert _make_dry("unit") == ".venv/bin/pytest -m 'not engine' -n 2"
    bench = _make_dry_lines("bench")  # ~25 minutes for real: the committed results came from a fresh clone
    runs = [line for line in bench if line.startswith(".venv/bin/python") and "bench" in line]  # not pip
    assert runs == [
        ".venv/bin/python -m bench.routing.run",
        ".venv/bin/python -m bench.routing.replicas",
        ".venv/bin/python bench/router/run.py --repeat 3",
        ".venv/bin/python bench/batcher/run.py",
    ]
    assert "bash bench/routing/setup.sh" in bench and any("command -v wrk" in line for line in bench)


def _run(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command,
        shell=True,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_size_prints_what_the_readme_shows() -> None:
    blocks = [b for b in fenced("console") if "inferstack size" in b]
    assert len(blocks) >= 2  # one model on one node, one that takes a group of nodes
    for block in blocks:
        lines = block.strip().splitlines()
        result = _run(lines[0].removeprefix("$ "))
        assert result.returncode == 0, result.stderr
        out = re.sub(r"\s+", " ", result.stdout)
        for line in lines[1:]:
            for piece in line.split("..."):
                part = re.sub(r"\s+", " ", piece).strip(" ,")
                assert part in out, f"README shows {part!r}; `inferstack size` printed:\n{result.stdout}"


@pytest.mark.parametrize(
    "command", [".venv/bin/inferstack size --list", ".venv/bin/inferstack plan -s prod --out build/prod"]
)
def test_cheap_commands_run(command: str) -> None:
    assert any(command.endswith(c) or c.endswith(command.split("bin/")[1]) for c in readme_commands())
    result = _run(command)
    assert result.returncode == 0, result.stdout + result.stderr
