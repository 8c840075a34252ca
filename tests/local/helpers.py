"""Running `inferstack local` as a user would, and finding every process a local stack left behind."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from components.local import state
from tests.leaks import PORTS_DIR_ENV

REPO = Path(__file__).resolve().parents[2]


def free_port_block(count: int) -> int:
    """The first of ``count`` consecutive ports that are free now, below the ephemeral range.

    Ephemeral ports (32768 and up) are handed to every outgoing connection on the machine, so one that
    is free at this moment may be a client's local port the next; listeners of a test stay below.
    """
    rng = random.Random()
    for _ in range(500):
        base = rng.randrange(20000, 32000 - count)
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no block of free ports")


def port_args(base: int, engines_base: int) -> list[str]:
    """Router, health monitor, batcher and batch service on ``base`` to ``base + 3``; engines from ``engines_base``;
    the routers' metrics listeners on a free block of their own (up to 3 routers)."""
    return [
        "--port", str(base), "--health-port", str(base + 1), "--batcher-port", str(base + 2),
        "--batches-port", str(base + 3), "--engine-port", str(engines_base),
        "--router-metrics-port", str(free_port_block(3)),
    ]  # fmt: skip


def make_target(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``make -s ARGS`` in the repository, as a user runs it (not inside this make's own jobs)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKEFLAGS", "MFLAGS", "MAKELEVEL"))}
    return subprocess.run(
        ["make", "-s", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def local_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "components.local", *args]


def run_local(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        local_cmd(*args), cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def stack_pids(state_dir: Path) -> set[int]:
    """Every live process of the stack: the supervisor, what state.json lists, whatever carries the tag."""
    pids = set(state.tagged_pids(state_dir))
    current = state.read_state(state_dir) or {}
    if current.get("pid"):
        pids.add(int(current["pid"]))
    pids |= {int(p["pid"]) for p in current.get("processes", []) if p.get("pid")}
    return {p for p in pids if state.pid_alive(p)}


@contextlib.contextmanager
def detached_stack(
    state_dir: Path, *make_args: str, timeout: float
) -> Iterator[subprocess.CompletedProcess[str]]:
    """``make local DETACH=1 LOCAL_STATE=state_dir MAKE_ARGS`` for the ``with`` block (its result: a fixture asserts
    on it), then ``make local-down`` and SIGKILL to whatever of the stack still runs, on every path: a start that
    failed or timed out halfway leaves a detached supervisor and engines too. Fails if ``local-down`` did."""
    state_arg = f"LOCAL_STATE={state_dir}"
    with one_stack_at_a_time():
        try:
            yield make_target("local", "DETACH=1", state_arg, *make_args, timeout=timeout)
        finally:
            down: subprocess.CompletedProcess[str] | None = None
            try:
                down = make_target("local-down", state_arg, timeout=120)
            finally:
                for pid in stack_pids(state_dir):  # never leave an engine behind
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            assert down.returncode == 0, down.stdout + down.stderr


@contextlib.contextmanager
def one_stack_at_a_time() -> Iterator[None]:
    """Holds the run's make-local lock: the two xdist workers never run a make-local stack each at once. A stack is
    three engines of up to 3 GiB; two stacks beside the other worker's engines filled this 24 GiB machine and
    the kernel killed an engine. Without xdist there is one worker and nothing to hold."""
    if os.environ.get("PYTEST_XDIST_TESTRUNUID") is None:
        yield
        return
    # in the run's own directory (tests/leaks.py), which the run removes at its end
    with (Path(os.environ[PORTS_DIR_ENV]) / "make-local.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def assert_nothing_left(state_dir: Path, known: set[int]) -> None:
    """No process of the stack is alive: none carries its tag, and none of ``known`` still runs. A known pid that
    is alive without the tag is a new process that got the number (on a busy machine pids come round fast)."""
    tagged = set(state.tagged_pids(state_dir))
    alive = {p for p in known if state.pid_alive(p) and (p in tagged or _unreadable_environ(p))} | tagged
    assert not alive, f"processes left behind: {sorted(alive)}"
    assert state.running_pid(state_dir) is None
    assert state.read_state(state_dir) is None


def _unreadable_environ(pid: int) -> bool:
    try:
        Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return True
    return False


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.2)


def post_json(url: str, body: dict[str, Any], timeout: float = 30) -> dict[str, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        result: dict[str, Any] = json.loads(response.read())
        return result


def environment(**extra: str) -> dict[str, str]:
    return {**os.environ, **extra}
