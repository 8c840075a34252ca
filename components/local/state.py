"""The state directory of a local stack (``.local/`` by default): lock, state file, logs, stragglers.

- ``lock``: an exclusive ``flock`` held by the supervisor for its whole life, with its pid written in.
  The kernel drops it when the process dies, however it dies, so a stale file never blocks a new run,
  and a second ``make local`` learns at once that one is running, and which.
- ``state.json``: what the supervisor runs (pids, ports, logs) and its phase (starting, ready,
  stopping), rewritten atomically; ``status``, ``down`` and ``logs`` read it.
- ``logs/``: one file per process.
- Every process of a stack carries ``INFERSTACK_LOCAL_STACK=<state dir>`` in its environment (vLLM's
  own children inherit it), so whatever escaped its process group is still found and stopped.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.local.engine_process import SCRATCH_PREFIX
from components.local.plan import TAG_ENV

LOCK_FILE = "lock"
STATE_FILE = "state.json"


class AlreadyRunningError(Exception):
    """Another supervisor holds the state directory's lock."""

    def __init__(self, state_dir: Path, pid: int | None, state: dict[str, Any] | None) -> None:
        self.state_dir = state_dir
        self.pid = pid
        self.state = state or {}
        who = f"pid {pid}" if pid else "another process"
        url = self.state.get("router_url")
        where = f", router {url}" if url else ""
        phase = self.state.get("phase", "starting")
        super().__init__(
            f"inferstack local is already running ({who}, {phase}{where}; state in {state_dir}/). "
            "Stop it with `inferstack local down` (or `make local-down`, or Ctrl-C in its terminal), "
            "or run a second stack with its own --state-dir and ports."
        )


@dataclass
class Lock:
    """The held lock; ``release()`` (or process exit) frees it."""

    path: Path
    fd: int

    def release(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = -1


def _holder_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def acquire(state_dir: Path) -> Lock:
    """Takes the state directory's lock or raises ``AlreadyRunningError`` at once (never waits)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise AlreadyRunningError(state_dir, _holder_pid(path), read_state(state_dir)) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return Lock(path, fd)


def running_pid(state_dir: Path) -> int | None:
    """The supervisor's pid when one holds the lock, else None."""
    path = state_dir / LOCK_FILE
    if not path.is_file():
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _holder_pid(path) or -1
    finally:
        os.close(fd)  # closing drops a lock we took
    return None


def read_state(state_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((state_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def remove_engine_scratch(state: dict[str, Any]) -> int:
    """Removes the private TMPDIRs the state's engines had, once their processes are gone: an engine's own stop
    removes its TMPDIR, and a supervisor killed with SIGKILL stopped none. Only a directory named as an engine's
    scratch is removed, whatever else a state file names. Returns how many were removed."""
    removed = 0
    for proc in state.get("processes", []):
        scratch = proc.get("scratch") if isinstance(proc, dict) else None
        if not isinstance(scratch, str):
            continue
        path = Path(scratch)
        if (
            path.is_absolute()
            and path.name.startswith(SCRATCH_PREFIX)
            and path.is_dir()
            and not path.is_symlink()
        ):
            shutil.rmtree(path, ignore_errors=True)
            removed += 1
    return removed


def write_state(state_dir: Path, state: dict[str, Any]) -> None:
    """Atomic: readers see the old or the new file, never half of one."""
    tmp = state_dir / f".{STATE_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    tmp.replace(state_dir / STATE_FILE)


def clear_state(state_dir: Path) -> None:
    with contextlib.suppress(OSError):
        (state_dir / STATE_FILE).unlink()


def tag_value(state_dir: Path) -> str:
    return str(state_dir.resolve())


def tagged_pids(state_dir: Path) -> list[int]:
    """Live processes (not zombies, not this one) that belong to the stack of ``state_dir``."""
    needle = b"\0" + f"{TAG_ENV}={tag_value(state_dir)}".encode() + b"\0"
    me = os.getpid()
    found: list[int] = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            environ = Path(f"/proc/{name}/environ").read_bytes()
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        if needle in b"\0" + environ + b"\0" and stat[stat.rindex(")") + 2 :].split()[0] != "Z":
            found.append(int(name))
    return sorted(found)


def kill_pids(pids: list[int], sig: signal.Signals = signal.SIGKILL) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    """Waits until none of ``pids`` is alive (zombies count as gone); returns those still alive."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [p for p in pids if pid_alive(p)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.1)


def pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].split()[0] != "Z"
