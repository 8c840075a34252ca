"""`inferstack local up` with a model at zero and stand-in engines (seconds): the supervisor, the router's
hold and the autoscaler wired together; Prometheus' files and its start-up mistakes. The real-vLLM version,
with a real Prometheus evaluating the rules, is test_monitor_stack.py (marked `engine`).
"""

from __future__ import annotations

import json
import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from components.local import monitor
from components.local.plan import LocalOptions, build_plan
from tests.local.helpers import (
    REPO,
    assert_nothing_left,
    environment,
    free_port_block,
    port_args,
    post_json,
    run_local,
    stack_pids,
)
from tests.local.stand_in import stand_in
from tests.local.test_plan import stack_from

STACK = Path(__file__).with_name("stacks") / "Pulumi.scale-from-zero.yaml"


@pytest.fixture
def at_zero(tmp_path: Path) -> Iterator[tuple[list[str], dict[str, str], Path, int]]:
    """(arguments, environment, state dir, first free port after the stack's) of the scale-from-zero stack
    served by stand-in engines."""
    wrapper, model = stand_in(tmp_path)
    raw = yaml.safe_load(STACK.read_text())
    raw["config"]["inferstack:platform"]["models"][0]["source"] = str(model)
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (stacks / "Pulumi.zero.yaml").write_text(yaml.safe_dump(raw))
    state_dir = tmp_path / "state"
    base = free_port_block(6)
    args = [
        "-s",
        "zero",
        "--stacks-dir",
        str(stacks),
        "--state-dir",
        str(state_dir),
        *port_args(base, base + 3),
    ]
    yield args, environment(INFERSTACK_ENGINE_PYTHON=str(wrapper)), state_dir, base + 4
    for pid in stack_pids(state_dir):
        os.kill(pid, signal.SIGKILL)


def test_the_first_request_waits_for_an_engine_the_autoscaler_starts(at_zero) -> None:
    args, env, state_dir, _ = at_zero
    up = run_local("up", "--detach", *args, env=env, timeout=120)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "0 vLLM engines behind the router, 1 more on demand" in up.stdout
    status = run_local("status", "--state-dir", str(state_dir), env=env)
    assert "tiny-llama-0" not in status.stdout  # nothing runs at zero
    router = f"http://127.0.0.1:{args[args.index('--port') + 1]}"
    reply = post_json(
        f"{router}/v1/chat/completions",
        {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}]},
        timeout=120,  # the autoscaler's tick, then the stand-in engine's start, on a crowded machine
    )
    assert reply["choices"][0]["message"]["content"].startswith("port ")
    log = (state_dir / "logs" / "supervisor.log").read_text()
    assert (
        "tiny-llama: 1 requests waiting in the router, 0.0/s refused: scaling 0 -> 1, starting engine tiny-llama-0"
        in log
    )
    assert "engine tiny-llama-0 ready after" in log
    assert len(json.loads((state_dir / "endpoints.json").read_text())) == 1
    status = run_local("status", "--state-dir", str(state_dir), env=env)
    assert "tiny-llama-0" in status.stdout and "running" in status.stdout
    pids = stack_pids(state_dir)
    down = run_local("down", "--state-dir", str(state_dir), env=env)
    assert down.returncode == 0 and "no process left" in down.stdout
    assert_nothing_left(state_dir, pids)


def test_a_monitor_port_in_use_is_one_clear_line(at_zero) -> None:
    args, env, state_dir, spare = at_zero
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", spare))
        busy.listen()
        for extra in ([], ["--detach"]):
            result = run_local(
                "up", *extra, *args, "--monitor", "--monitor-port", str(spare), env=env, timeout=60
            )
            assert result.returncode == 2, result.stdout + result.stderr
            assert (
                f"port {spare} on 127.0.0.1 is already in use, and the local stack needs it for Prometheus"
                in result.stderr
            )
            assert "--monitor-port N" in result.stderr and "Traceback" not in result.stderr
    assert_nothing_left(state_dir, set())


def test_prometheus_gets_the_clusters_rules_and_every_service_with_cluster_labels(tmp_path: Path) -> None:
    raw = yaml.safe_load((REPO / "stacks" / "Pulumi.local.yaml").read_text())["config"]["inferstack:platform"]
    settings = monitor.Monitor(port=9191, interval_s=5, alert_for_cap_s=30)
    plan = build_plan(stack_from(raw), LocalOptions(monitor=settings, state_dir=tmp_path), REPO)
    assert plan.spec is not None and (9191, "Prometheus", "--monitor-port") in plan.ports()
    runtime = monitor.runtime_targets(plan.spec, plan.scraped_services())
    assert [g["labels"]["service"] for g in runtime] == [
        "inferstack-health",
        "inferstack-batcher",
        "inferstack-batches",
        "inferstack-router",
    ]
    config = monitor.prometheus_config(settings, runtime, tmp_path / "engines.json", tmp_path / "rules.yml")
    assert config["global"] == {"scrape_interval": "5s", "scrape_timeout": "5s", "evaluation_interval": "5s"}
    assert config["scrape_configs"][1]["file_sd_configs"][0]["files"] == [str(tmp_path / "engines.json")]
    capped = monitor.rule_file(plan.spec, plan.units, 30)
    real = monitor.rule_file(plan.spec, plan.units)
    fors = [
        (r["for"], c["for"])
        for g, h in zip(real["groups"], capped["groups"], strict=True)
        for r, c in zip(g["rules"], h["rules"], strict=True)
    ]
    assert ("5m", "30s") in fors and (
        "0m",
        "0m",
    ) in fors  # only the for: durations differ, and only down to the cap
    assert all(monitor.seconds(c) == min(monitor.seconds(r), 30) for r, c in fors)
    argv = monitor.argv("/usr/bin/prometheus", tmp_path / "p.yml", tmp_path / "data", 9191)
    assert "--web.listen-address=127.0.0.1:9191" in argv  # loopback only
