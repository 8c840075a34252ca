"""A ``redis-server`` (Debian's package) on 127.0.0.1 as a subprocess: the shared rate-limit store of
``make local`` with several routers, and of the tests that prove the limits hold across replicas.

Nothing is persisted (``--save ''``, no append-only file): rate-limit buckets are seconds of state, and a
store that comes back empty hands out full buckets, which is the documented behaviour. Protected mode
stays on and only loopback is bound. With ``password`` set, clients must AUTH (as ElastiCache demands).
The Debian service itself is never used (``make redis`` installs the package and stops the service).
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Self

REDIS_SERVER = "redis-server"


class RedisError(RuntimeError):
    """redis-server is missing, or did not come up; the message says what to do."""


def redis_server() -> str:
    found = shutil.which(REDIS_SERVER)
    if found is None:
        raise RedisError(
            "redis-server is not installed: run `make redis` (apt-get install redis-server; the Debian"
            " service is stopped and disabled, inferstack starts its own on 127.0.0.1)"
        )
    return found


class RedisProcess:
    """One redis-server bound to 127.0.0.1:``port``; ``stop()`` ends it (SIGKILL with ``kill()``). After either,
    ``start()`` brings it back on the same port and directory, so whoever holds the object stops the live
    process (a restart that made a new object would leave the old owner stopping the dead one)."""

    def __init__(
        self,
        port: int,
        workdir: Path,
        password: str | None = None,
        log_path: Path | None = None,
        extra_args: tuple[str, ...] = (),
    ):
        self.extra_args = extra_args  # e.g. ("--enable-debug-command", "local") to inject stalls in tests
        self.port = port
        self.workdir = workdir
        self.password = password
        self.log_path = log_path or workdir / f"redis-{port}.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def argv(self) -> list[str]:
        args = [
            redis_server(),
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--save", "",
            "--appendonly", "no",
            "--protected-mode", "yes",
            "--dir", str(self.workdir),
            "--daemonize", "no",
        ]  # fmt: skip
        if self.password:
            args += ["--requirepass", self.password]
        return args + list(self.extra_args)

    def start(self, timeout_s: float = 20.0) -> Self:
        if self.running():
            raise RedisError(f"redis-server on 127.0.0.1:{self.port} is already running; stop() it first")
        self.workdir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                self.argv(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir
            )
        deadline = time.monotonic() + timeout_s
        while not self.answers():
            if self._proc.poll() is not None:
                raise RedisError(
                    f"redis-server exited at start ({self._proc.returncode}); log {self.log_path}"
                )
            if time.monotonic() > deadline:
                self.kill()
                raise RedisError(f"redis-server did not answer on 127.0.0.1:{self.port}; log {self.log_path}")
            time.sleep(0.05)
        return self

    def answers(self) -> bool:
        """PING over a plain socket (AUTH first when there is a password)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                if self.password:
                    sock.sendall(b"AUTH %s\r\n" % self.password.encode())
                    if not sock.recv(64).startswith(b"+OK"):
                        return False
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self, grace_s: float = 5.0) -> None:
        self._end(signal.SIGTERM, grace_s)

    def kill(self) -> None:
        """Die at once, as a crashed store would (connections reset, nothing answers)."""
        self._end(signal.SIGKILL, 5.0)

    def _end(self, sig: signal.Signals, grace_s: float) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
