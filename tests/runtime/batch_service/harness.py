"""A batch service in front of a router and engine doubles: the router in the test's loop thread, the batch
service as its own process (``python -m runtime.batch_service``), so a test can kill it -9 and start it again.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import yaml

from tests.conftest import REPO_ROOT
from tests.runtime.router.harness import Double, LoopThread, RouterUnderTest, router_cfg


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def chat_line(custom_id: str, model: str = "m", **body: Any) -> str:
    request = {"model": model, "messages": [{"role": "user", "content": f"say {custom_id}"}], "max_tokens": 2}
    return json.dumps(
        {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": {**request, **body}}
    )


def jsonl(lines: Iterable[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode()


def parse_jsonl(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@dataclass
class BatchStack:
    """Doubles -> router (in ``lt``) -> batch service (a process). ``start`` again after ``kill`` resumes."""

    lt: LoopThread
    tmp: Path
    doubles: list[Double]
    batches: dict[str, Any] = field(default_factory=dict)  # extra batches settings
    router_extra: dict[str, Any] = field(default_factory=dict)
    service_key: str | None = None  # the API key the batch service sends to the router
    router: RouterUnderTest | None = None
    proc: subprocess.Popen[bytes] | None = None
    port: int = 0

    @property
    def state_dir(self) -> Path:
        return self.tmp / "state"

    @property
    def config_path(self) -> Path:
        return self.tmp / "runtime.yaml"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> dict[str, Any]:
        assert self.router is not None or self.port
        cfg = router_cfg([d.url for d in self.doubles], batches_url=self.url, **self.router_extra)
        batches: dict[str, Any] = {
            "host": "127.0.0.1",
            "port": self.port,
            "router_url": self.router.base if self.router is not None else "http://127.0.0.1:1",
            "state_dir": str(self.state_dir),
            **self.batches,
        }
        if self.service_key is not None:
            key_file = self.tmp / "service-key"
            key_file.write_text(self.service_key)
            batches["router_api_key_file"] = str(key_file)
        return {**cfg, "batches": batches}

    def start_router(self) -> BatchStack:
        self.port = self.port or free_port()
        self.router = RouterUnderTest(self.lt, self.config()).start()
        return self

    def start(self) -> BatchStack:
        """Start (or restart) the batch service on the same port and state."""
        assert self.proc is None or self.proc.poll() is not None, "the batch service is still running"
        if self.router is None:
            self.start_router()
        self.config_path.write_text(yaml.safe_dump(self.config()))
        with (self.tmp / "batches.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "runtime.batch_service", "--config", str(self.config_path)],
                cwd=REPO_ROOT,
                env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 120  # a Python service's start on a loaded 2-core machine
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"batch service exited {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=1) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"batch service did not listen:\n{self.log()}")

    def log(self) -> str:
        path = self.tmp / "batches.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def kill(self) -> None:
        """kill -9: no drain, no flush, whatever was in flight."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.router is not None:
            self.router.stop()
            self.router = None

    def client(self, key: str = "unused") -> openai.OpenAI:
        assert self.router is not None
        return openai.OpenAI(base_url=f"{self.router.base}/v1", api_key=key, max_retries=0, timeout=30)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as resp:
            return str(resp.read().decode())


def wait_for(client: openai.OpenAI, batch_id: str, statuses: set[str], timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    batch = client.batches.retrieve(batch_id)
    while batch.status not in statuses:
        if time.monotonic() > deadline:
            raise AssertionError(f"batch {batch_id} still {batch.status} after {timeout_s}s: {batch}")
        time.sleep(0.1)
        batch = client.batches.retrieve(batch_id)
    return batch


def results(client: openai.OpenAI, batch: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(output lines, error lines) of a finished batch."""
    out = parse_jsonl(client.files.content(batch.output_file_id).text) if batch.output_file_id else []
    err = parse_jsonl(client.files.content(batch.error_file_id).text) if batch.error_file_id else []
    return out, err
