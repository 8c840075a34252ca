"""`inferstack local` end to end with stand-in engines (seconds, not minutes): ordered start and stop,
Ctrl-C, --detach with status/logs/down, a second instance, ports in use, failures, no process left.

The real-vLLM version of the serving assertions is test_local_stack.py (marked `engine`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from components.local import state
from tests.local.helpers import (
    REPO,
    assert_nothing_left,
    environment,
    free_port_block,
    local_cmd,
    port_args,
    post_json,
    run_local,
    stack_pids,
    wait_for,
)

FAKE_ENGINE = Path(__file__).with_name("fake_engine.py")


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[tuple[list[str], dict[str, str], Path]]:
    """(stack + port arguments, environment, state dir) of a stack of stand-in engines."""
    wrapper = tmp_path / "engine-python"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_ENGINE}" "$@"\n')
    wrapper.chmod(0o755)
    models = {}
    for name in ("chat", "embed"):
        models[name] = tmp_path / "models" / name
        models[name].mkdir(parents=True)
        (models[name] / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    raw = yaml.safe_load((REPO / "stacks" / "Pulumi.local.yaml").read_text())
    platform = raw["config"]["inferstack:platform"]
    platform["models"][0]["source"] = str(models["chat"])
    # Stand-in engines load no LoRA adapter (test_local_stack.py serves the stack's with real vLLM).
    platform["models"][0].pop("adapters")
    platform["models"][0]["engine"].pop("lora")
    platform["models"][1]["source"] = str(models["embed"])
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (stacks / "Pulumi.fake.yaml").write_text(yaml.safe_dump(raw))
    state_dir = tmp_path / "state"
    base = free_port_block(7)
    engines = base + 4
    args = [
        "-s",
        "fake",
        "--stacks-dir",
        str(stacks),
        "--state-dir",
        str(state_dir),
        *port_args(base, engines),
    ]
    yield args, environment(INFERSTACK_ENGINE_PYTHON=str(wrapper)), state_dir
    for pid in stack_pids(state_dir):  # a failed test must not leave processes behind either
        with __import__("contextlib").suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _router(args: list[str]) -> str:
    return f"http://127.0.0.1:{args[args.index('--port') + 1]}"


def test_foreground_serves_refuses_a_second_instance_and_stops_everything_in_order_on_ctrl_c(fake) -> None:
    args, env, state_dir = fake
    proc = subprocess.Popen(
        local_cmd("up", *args), cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 180
    while not any("is ready in" in line for line in lines):
        line = proc.stdout.readline()
        assert line or proc.poll() is None, "".join(lines)
        lines.append(line)
        assert time.monotonic() < deadline, "".join(lines)
    router = _router(args)
    reply = post_json(
        f"{router}/v1/chat/completions",
        {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert reply["choices"][0]["message"]["content"].startswith("port ")
    vectors = post_json(f"{router}/v1/embeddings", {"model": "all-minilm-l6-v2", "input": ["a", "b"]})
    assert len(vectors["data"]) == 2

    # A second instance on the same state dir fails fast, says who runs and how to stop it.
    started = time.monotonic()
    second = run_local("up", *args, env=env, timeout=60)
    assert second.returncode == 2, second.stderr
    assert time.monotonic() - started < 60  # refused, not started: a start holds the 240 s budget
    assert f"already running (pid {proc.pid}" in second.stderr
    assert "inferstack local down" in second.stderr and "Traceback" not in second.stderr

    # Another state dir but the same ports: the router's port is in use; clear error, exit 2.
    other = run_local("up", *args, "--state-dir", str(state_dir.parent / "other"), env=env, timeout=60)
    assert other.returncode == 2
    assert f"port {args[args.index('--port') + 1]} on 127.0.0.1 is already in use" in other.stderr
    assert "--port N" in other.stderr and "Traceback" not in other.stderr

    pids = stack_pids(state_dir)
    assert len(pids) >= 1 + 3 * 2 + 3  # supervisor, engines and their cores, health, batcher, router
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, rest
    order = [rest.index(f"{name} stopped") for name in ("router", "batcher", "health", "3 engines")]
    assert order == sorted(order), rest
    assert "stopped; no process left" in rest
    assert_nothing_left(state_dir, pids)


def test_detach_status_logs_kill_a_replica_and_down(fake) -> None:
    args, env, state_dir = fake
    up = run_local("up", "--detach", *args, env=env, timeout=240)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "is ready in" in up.stdout and "inferstack local status|logs|down" in up.stdout
    current = state.read_state(state_dir)
    assert current is not None and current["phase"] == "ready" and current["detached"] is True
    pids = stack_pids(state_dir)

    status = run_local("status", "--state-dir", str(state_dir), env=env)
    assert status.returncode == 0 and "ready" in status.stdout and "NOT" not in status.stdout, status.stdout
    logs = run_local("logs", "router", "-n", "3", "--state-dir", str(state_dir), env=env)
    assert logs.returncode == 0 and "router listening" in logs.stdout
    every = run_local("logs", "--state-dir", str(state_dir), env=env)
    assert "==> " in every.stdout and "engine-smollm2-135m-instruct-0.log" in every.stdout
    missing = run_local("logs", "nope", "--state-dir", str(state_dir), env=env)
    assert missing.returncode == 2 and "there are: " in missing.stderr

    # One chat replica dies: the stack keeps serving through the other, and says so.
    replica = next(p for p in current["processes"] if p["name"] == "smollm2-135m-instruct-0")
    os.killpg(replica["pid"], signal.SIGKILL)
    router = _router(args)
    for _ in range(6):
        reply = post_json(
            f"{router}/v1/chat/completions",
            {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert reply["choices"][0]["message"]["content"] == f"port {replica['port'] + 1}"
    wait_for(
        lambda: (
            "warning: engine smollm2-135m-instruct-0 exited"
            in (state_dir / "logs" / "supervisor.log").read_text()
        ),
        30,
        "the warning",
    )
    status = run_local("status", "--state-dir", str(state_dir), env=env)
    assert "EXITED" in status.stdout

    down = run_local("down", "--state-dir", str(state_dir), env=env)
    assert down.returncode == 0 and "no process left" in down.stdout
    assert_nothing_left(state_dir, pids)
    after = run_local("status", "--state-dir", str(state_dir), env=env)
    assert after.returncode == 1 and "not running" in after.stdout
    again = run_local("down", "--state-dir", str(state_dir), env=env)
    assert again.returncode == 0 and "not running" in again.stdout


def test_down_cleans_up_after_a_supervisor_killed_with_sigkill(fake) -> None:
    args, env, state_dir = fake
    up = run_local("up", "--detach", *args, env=env, timeout=240)
    assert up.returncode == 0, up.stdout + up.stderr
    current = state.read_state(state_dir)
    assert current is not None
    pids = stack_pids(state_dir)
    os.kill(current["pid"], signal.SIGKILL)
    wait_for(lambda: state.running_pid(state_dir) is None, 30, "the lock to be released")
    services = [p["pid"] for p in current["processes"] if p["kind"] == "service"]
    wait_for(lambda: not any(state.pid_alive(p) for p in services), 30, "services to follow their parent")
    status = run_local("status", "--state-dir", str(state_dir), env=env)
    assert status.returncode == 1
    scratch = [Path(p["scratch"]) for p in current["processes"] if p["kind"] == "engine"]
    assert scratch and all(d.is_dir() for d in scratch), "each engine ran in its own TMPDIR"
    down = run_local("down", "--state-dir", str(state_dir), env=env)
    assert down.returncode == 0 and "killed" in down.stdout and "leftover" in down.stdout, down.stdout
    assert not [d for d in scratch if d.exists()], (
        "down removed the TMPDIRs the killed supervisor's engines had"
    )
    state.clear_state(state_dir)
    assert_nothing_left(state_dir, pids)


def test_a_missing_engine_venv_says_how_to_make_it(fake) -> None:
    args, env, state_dir = fake
    result = run_local(
        "up", *args, env={**env, "INFERSTACK_ENGINE_PYTHON": "/nonexistent/python"}, timeout=60
    )
    assert result.returncode == 2
    assert "make engine-venv" in result.stderr and "Traceback" not in result.stderr
    assert_nothing_left(state_dir, set())


def test_an_engine_that_cannot_start_stops_the_rest_and_shows_its_log(fake) -> None:
    args, env, state_dir = fake
    result = run_local("up", *args, env={**env, "FAKE_ENGINE_FAIL": "1"}, timeout=90)
    assert result.returncode == 1
    assert "exited before it was ready" in result.stderr and "fake failure" in result.stderr
    assert "Traceback" not in result.stderr
    assert_nothing_left(state_dir, set())


def test_detached_start_failure_reports_the_log(fake) -> None:
    args, env, state_dir = fake
    result = run_local("up", "--detach", *args, env={**env, "FAKE_ENGINE_FAIL": "1"}, timeout=90)
    assert result.returncode == 1
    assert "fake failure" in result.stderr and "did not start" in result.stderr
    assert_nothing_left(state_dir, set())


def test_a_port_in_use_is_a_clear_error_not_a_hang(fake) -> None:
    args, env, state_dir = fake
    port = int(args[args.index("--health-port") + 1])
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", port))
        busy.listen()
        for extra in ([], ["--detach"]):
            result = run_local("up", *extra, *args, env=env, timeout=60)
            assert result.returncode == 2
            assert f"port {port} on 127.0.0.1 is already in use" in result.stderr
            assert "--health-port N" in result.stderr and "Traceback" not in result.stderr
    assert_nothing_left(state_dir, set())


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"target": "eks"}, "models[0].source: a local path"),
        (
            {
                "models": [
                    {
                        "name": "m",
                        "source": "/nonexistent/model",
                        "architecture": {
                            "params_b": 0.001,
                            "layers": 1,
                            "kv_heads": 1,
                            "head_dim": 64,
                            "hidden_size": 64,
                        },
                        "engine": {"device": "cpu"},
                    }
                ]
            },
            "/nonexistent/model is not a model directory",
        ),
        ({"models": [{"name": "Bad Name", "source": "./x"}]}, "models[0].name"),
    ],
)
def test_stack_mistakes_exit_2_with_one_message(fake, tmp_path: Path, edit: dict, message: str) -> None:
    args, env, state_dir = fake
    stacks = Path(args[args.index("--stacks-dir") + 1])
    raw = yaml.safe_load((stacks / "Pulumi.fake.yaml").read_text())
    raw["config"]["inferstack:platform"].update(edit)
    (stacks / "Pulumi.fake.yaml").write_text(yaml.safe_dump(raw))
    result = run_local("up", *args, env=env, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert_nothing_left(state_dir, set())


def test_no_logs_yet_and_unknown_stack(tmp_path: Path) -> None:
    result = run_local("logs", "--state-dir", str(tmp_path / "none"))
    assert result.returncode == 1 and "no logs in" in result.stderr
    result = run_local("up", "-s", "nosuch", "--state-dir", str(tmp_path / "none"))
    assert result.returncode == 2 and "no such stack file" in result.stderr
    assert json.dumps  # keep the import for debugging helpers


def test_an_unusable_state_dir_is_a_usage_error(fake, tmp_path: Path) -> None:
    args, env, _ = fake
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for extra in ([], ["--detach"]):
        result = run_local("up", *extra, *args, "--state-dir", str(blocker / "state"), env=env, timeout=60)
        assert result.returncode == 2
        assert "cannot use" in result.stderr and "Traceback" not in result.stderr


def test_several_routers_behind_the_balancer_share_one_redis_and_all_stop(fake) -> None:
    args, env, state_dir = fake
    front = int(args[args.index("--port") + 1])
    redis_port = free_port_block(1)
    up = run_local(
        "up", "--detach", "--routers", "2", "--redis-port", str(redis_port), *args, env=env, timeout=240
    )
    assert up.returncode == 0, up.stdout + up.stderr
    assert "2 routers (round robin, shared limits in redis)" in up.stdout
    pids = stack_pids(state_dir)
    metrics = int(args[args.index("--router-metrics-port") + 1])
    replicas = [f"http://127.0.0.1:{metrics + i}" for i in range(2)]  # each router's metrics listener
    for _ in range(8):  # a new connection each: the balancer deals them out in turn
        reply = post_json(
            f"http://127.0.0.1:{front}/v1/chat/completions",
            {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert reply["choices"][0]["message"]["content"].startswith("port ")
    for replica in replicas:
        with urllib.request.urlopen(f"{replica}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        assert re.search(r'^inferstack_router_requests_total\{.*status="200"\} [1-9]', text, re.M), replica
        assert re.search(r"^inferstack_router_limit_store_up 1\.0", text, re.M), "the routers reach redis"
    down = run_local("down", "--state-dir", str(state_dir), env=env, timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert_nothing_left(state_dir, pids)
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", redis_port)) != 0, "redis-server stopped with the stack"


def test_down_removes_only_directories_named_as_an_engines_scratch(tmp_path: Path) -> None:
    """A state file is data on disk: whatever it names, `down` removes only an engine's own TMPDIR."""
    from components.local.engine_process import SCRATCH_PREFIX

    ours = tmp_path / f"{SCRATCH_PREFIX}abc"
    ours.mkdir()
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "data").write_text("keep")
    disguised = tmp_path / f"{SCRATCH_PREFIX}link"
    disguised.symlink_to(precious)
    hostile = {
        "processes": [
            {"kind": "engine", "scratch": str(ours)},
            {"kind": "engine", "scratch": str(precious)},
            {"kind": "engine", "scratch": str(disguised)},
            {"kind": "engine", "scratch": f"{SCRATCH_PREFIX}relative"},
            {"kind": "engine", "scratch": None},
            "not a process",
        ]
    }
    assert state.remove_engine_scratch(hostile) == 1
    assert not ours.exists() and (precious / "data").read_text() == "keep" and disguised.is_symlink()
