"""`make local S3=1`: the model store on this machine. The loopback S3 server (s3rver), the local models
prepared into it with the project's own preparation step (``python -m runtime.weights prepare``, as the
cluster's Job runs it), and engines that stream their weights from it (``--load-format runai_streamer``).

A thin shell around a process and a command; what goes where is decided in ``components.local.plan``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from components.local import s3_server
from components.local.s3_server import HOST, client, client_env, wait_listening

PREPARE_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class LocalStore:
    """The running server: where it listens and what engines need to read from it."""

    endpoint: str
    proc: subprocess.Popen[bytes]
    assets_dir: Path

    def engine_env(self) -> dict[str, str]:
        """The store's address and loopback credentials, and where vLLM puts the config it pulls. The streamer
        keeps its own defaults (8 streams, 1 s stall limit), as against S3: the server reads ranges from disk."""
        return {**client_env(self.endpoint), "VLLM_ASSETS_CACHE": str(self.assets_dir)}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


class StoreError(Exception):
    """The store could not be started or a model not prepared into it; the message says which and why."""


def start(port: int, logs_dir: Path, extra_env: dict[str, str], python: str = sys.executable) -> LocalStore:
    """Start the loopback S3 server (its objects in the state directory's ``s3-objects``, emptied at start)."""
    root = Path(__file__).resolve().parents[2]
    requests, data = logs_dir / "s3-requests.jsonl", logs_dir.parent / "s3-objects"
    try:  # node and s3rver are there, or one line says how to install them
        s3_server.argv(port, requests, data)
    except s3_server.ServerNotInstalledError as err:
        raise StoreError(str(err)) from None
    argv = [python, "-m", "components.local.s3_server", "--port", str(port)]
    argv += ["--requests", str(requests), "--data", str(data)]
    env = {**os.environ, **extra_env, "PYTHONPATH": str(root)}
    with (logs_dir / "s3.log").open("wb") as out:
        proc = subprocess.Popen(
            argv, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    endpoint = f"http://{HOST}:{port}"
    store = LocalStore(endpoint, proc, logs_dir.parent / "vllm-assets")
    try:
        wait_listening(endpoint, proc)
    except RuntimeError as err:
        store.stop()
        raise StoreError(f"{err}; log {logs_dir / 's3.log'}") from None
    return store


def create_bucket(store: LocalStore, bucket: str) -> None:
    client(store.endpoint).create_bucket(Bucket=bucket)


def prepare(
    store: LocalStore, model_dir: Path, location: str, log: Path, python: str = sys.executable
) -> float:
    """Prepare one model directory into ``location`` (what the cluster's Job does); seconds it took."""
    root = Path(__file__).resolve().parents[2]
    started = time.monotonic()
    with log.open("wb") as out:
        done = subprocess.run(
            [python, "-m", "runtime.weights", "prepare", "--from", str(model_dir), "--to", location],
            cwd=root,
            env={**os.environ, **store.engine_env(), "PYTHONPATH": str(root)},
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=PREPARE_TIMEOUT_S,
            check=False,
        )
    if done.returncode != 0:
        raise StoreError(
            f"preparing {model_dir} into {location} failed; log {log}:\n{log.read_text()[-2000:]}"
        )
    return time.monotonic() - started
