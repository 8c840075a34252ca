"""Child processes the tests start and always stop: the runtime services and the policy pack, run the way
their images and Pulumi run them (``python -m runtime.router --config FILE``, ``python policies/inference``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from tests.conftest import REPO_ROOT


@contextmanager
def child(
    argv: Sequence[str], *, stdout: int = subprocess.DEVNULL, stop_timeout_s: float = 20.0
) -> Iterator[subprocess.Popen[str]]:
    """Runs ``argv`` from the repository root (importable) for the ``with`` block, then stops it: SIGTERM,
    and SIGKILL if it is still there after ``stop_timeout_s``. Its stderr is a pipe, for failure messages;
    after the block ``returncode`` says how it ended."""
    proc = subprocess.Popen(
        list(argv),
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=stop_timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def runtime_service(
    module: str, config: Path, stop_timeout_s: float = 20.0
) -> AbstractContextManager[subprocess.Popen[str]]:
    """A runtime service (``runtime.router``, ``runtime.health``, ``runtime.batcher``) on ``config``."""
    return child([sys.executable, "-m", module, "--config", str(config)], stop_timeout_s=stop_timeout_s)


def wait_ready(base_url: str, proc: subprocess.Popen[str], timeout_s: float = 60.0) -> None:
    """Polls ``/readyz`` until it answers 200; fails at once, with the stderr, if the process exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            stderr = proc.stderr.read() if proc.stderr is not None else ""
            raise AssertionError(
                f"{proc.args} exited with code {proc.returncode} before it was ready:\n{stderr}"
            )
        try:
            with urllib.request.urlopen(f"{base_url}/readyz", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"{base_url}/readyz did not answer 200 within {timeout_s:.0f}s")
