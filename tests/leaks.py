"""Fails the run, by name, when a process the tests started is still alive at the end.

A leaked engine or server holds a core, memory or a port into the next run (a redis-server from a replaced
fixture once outlived a CI run). Three nets, because a process can leave its parent:

- the children of each pytest process (xdist worker or a plain run), at its session's end, after every fixture
  has stopped what it started (a short grace for those still exiting);
- any process carrying this run's mark in its environment (``RUN_ENV``, set before the workers start and inherited
  by everything they start), found at the very end: it catches what was detached or re-parented to init;
- any process still listening on a port ``free_port`` handed to the tests.

Every leak found is reported and then killed, so a failed run leaves nothing behind either. Registered by
``tests/conftest.py``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import psutil
import pytest

#: The environment variable that marks every process this test run starts.
RUN_ENV = "INFERSTACK_TEST_RUN"
#: How long a process found at the end may take to finish exiting before it counts as leaked.
GRACE_S = 5.0
PORTS_DIR_ENV = "INFERSTACK_TEST_RUN_PORTS"


def describe(proc: psutil.Process) -> str:
    try:
        cmd = " ".join(proc.cmdline())[:200] or proc.name()
    except psutil.Error:
        cmd = "?"
    return f"pid {proc.pid}: {cmd}"


def still_alive(procs: Iterable[psutil.Process], grace_s: float = GRACE_S) -> list[psutil.Process]:
    """Those of ``procs`` that have not exited within ``grace_s`` (zombies count as gone)."""
    _, alive = psutil.wait_procs(list(procs), timeout=grace_s)
    out = []
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            if proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
    return out


def kill_all(procs: Iterable[psutil.Process]) -> None:
    procs = list(procs)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(procs, timeout=GRACE_S)


def marked(run: str, exclude: set[int]) -> list[psutil.Process]:
    """Processes whose environment carries ``RUN_ENV=run``."""
    found = []
    for proc in psutil.process_iter():
        if proc.pid in exclude:
            continue
        with contextlib.suppress(psutil.Error):
            if proc.environ().get(RUN_ENV) == run:
                found.append(proc)
    return found


def listening_on(ports: set[int], exclude: set[int]) -> list[psutil.Process]:
    """Processes with a listening TCP socket on one of ``ports``."""
    pids = {
        conn.pid
        for conn in psutil.net_connections(kind="tcp")
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port in ports and conn.pid
    }
    out = []
    for pid in sorted(pids - exclude):
        with contextlib.suppress(psutil.Error):
            out.append(psutil.Process(pid))
    return out


def recording(free_port: Callable[..., int], ports_dir: Path) -> Callable[..., int]:
    """``free_port`` that also writes each port it hands out to ``ports_dir`` (one file per process)."""

    def handed_out(*args: Any, **kwargs: Any) -> int:
        port = free_port(*args, **kwargs)
        with (ports_dir / f"{os.getpid()}.ports").open("a") as out:
            out.write(f"{port}\n")
        return port

    return handed_out


def handed_out_ports(ports_dir: Path) -> set[int]:
    ports: set[int] = set()
    for file in ports_dir.glob("*.ports"):
        ports.update(int(line) for line in file.read_text().split())
    return ports


class LeakGuard:
    """The pytest plugin: workers report their own children; the controlling process does the rest at the end."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.worker = hasattr(config, "workerinput")
        if RUN_ENV not in os.environ:  # the controlling process (or a plain run): the workers inherit both
            os.environ[RUN_ENV] = uuid.uuid4().hex
            os.environ[PORTS_DIR_ENV] = tempfile.mkdtemp(prefix="inferstack-test-ports-")
        self.run = os.environ[RUN_ENV]
        self.ports_dir = Path(os.environ[PORTS_DIR_ENV])
        self.leaks: list[str] = []
        self.workers: set[int] = set()  # xdist workers' pids: they carry the mark too

    def own_leaks(self) -> list[str]:
        """This process's children that outlived its session (killed once named)."""
        left = still_alive(psutil.Process().children(recursive=True))
        names = [describe(p) for p in left]
        kill_all(left)
        return names

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.worker:
            output = self.config.workeroutput  # type: ignore[attr-defined]
            output["pid"] = os.getpid()
            output["leaked"] = self.own_leaks()
            return
        if self.config.pluginmanager.getplugin("dsession") is None:  # a plain run: its own children
            self.leaks += [f"{n} (a child of pytest)" for n in self.own_leaks()]
        mine = {p.pid for p in psutil.Process().parents()} | {os.getpid()} | self.workers
        marked_left = still_alive(marked(self.run, mine))
        self.leaks += [f"{describe(p)} (started by the tests, detached)" for p in marked_left]
        kill_all(marked_left)
        port_left = still_alive(listening_on(handed_out_ports(self.ports_dir), mine))
        self.leaks += [f"{describe(p)} (listening on a port the tests handed out)" for p in port_left]
        kill_all(port_left)
        shutil.rmtree(self.ports_dir, ignore_errors=True)
        if self.leaks:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        output = getattr(node, "workeroutput", None) or {}
        worker = getattr(node, "workerinput", {}).get("workerid", "?")
        if "pid" in output:
            self.workers.add(int(output["pid"]))
        self.leaks += [f"{name} (a child of xdist worker {worker})" for name in output.get("leaked", [])]

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.leaks:
            terminalreporter.section("processes left running by the tests (killed now)", red=True, bold=True)
            for leak in self.leaks:
                terminalreporter.write_line(leak)
