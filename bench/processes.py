"""Helper processes a benchmark starts (fake engines, routers): never left behind, whatever happens."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def process(
    argv: list[str], log: Path | None = None, cwd: Path = ROOT, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``argv`` from the repository root for the length of the ``with`` block, its output appended
    to ``log`` (or dropped); SIGTERM at the end, SIGKILL if it does not go within 15 s. Its own session,
    so a Ctrl-C in the terminal reaches the benchmark, which then stops it in order. ``env``: variables set on
    top of this process's environment."""
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(log.open("ab")) if log else subprocess.DEVNULL
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **env} if env else None,
        )
        try:
            yield proc
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
