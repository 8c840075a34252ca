"""A batch service in front of a router and engine doubles: the router in the test's loop thread, the batch
service as its own process (``python -m runtime.batch_service``), so a test can kill it -9 and start it again.
"""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import yaml

from tests.conftest import REPO_ROOT
from tests.runtime.router.harness import Double, LoopThread, RouterFromFile, RouterUnderTest, router_cfg


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
    preload: str = ""  # Python run in the batch service's process before it starts (fault injection)
    from_file: bool = False  # the router as ``python -m runtime.router`` runs it: keys loaded, files watched
    tracing: dict[str, Any] | None = (
        None  # the runtime config's tracing, for the router and the batch service
    )
    router: RouterUnderTest | RouterFromFile | None = None
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

    @property
    def router_url(self) -> str:
        assert self.router is not None
        return f"http://127.0.0.1:{self.router.port}"

    def config(self) -> dict[str, Any]:
        assert self.router is not None or self.port
        cfg = router_cfg([d.url for d in self.doubles], batches_url=self.url, **self.router_extra)
        batches: dict[str, Any] = {
            "host": "127.0.0.1",
            "port": self.port,
            "router_url": self.router_url if self.router is not None else "http://127.0.0.1:1",
            "state_dir": str(self.state_dir),
            **self.batches,
        }
        if self.service_key is not None:
            key_file = self.tmp / "service-key"
            key_file.write_text(self.service_key)
            batches["router_api_key_file"] = str(key_file)
        return {**cfg, "batches": batches, **({"tracing": self.tracing} if self.tracing else {})}

    def start_router(self) -> BatchStack:
        self.port = self.port or free_port()
        if self.from_file:
            self.config_path.write_text(yaml.safe_dump(self.config()))
            self.router = RouterFromFile(self.lt, self.config_path).start()
        else:
            self.router = RouterUnderTest(self.lt, self.config()).start()
        return self

    def start(self) -> BatchStack:
        """Start (or restart) the batch service on the same port and state."""
        assert self.proc is None or self.proc.poll() is not None, "the batch service is still running"
        if self.router is None:
            self.start_router()
        self.config_path.write_text(yaml.safe_dump(self.config()))
        with (self.tmp / "batches.log").open("ab") as log:
            command = ["-m", "runtime.batch_service"]
            if self.preload:
                start = "import sys\nfrom runtime.batch_service.__main__ import main\nmain(sys.argv[1:])"
                command = ["-c", f"{self.preload}\n{start}"]
            self.proc = subprocess.Popen(
                [sys.executable, *command, "--config", str(self.config_path)],
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
        return openai.OpenAI(base_url=f"{self.router_url}/v1", api_key=key, max_retries=0, timeout=30)

    def metrics(self, timeout_s: float = 5) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=timeout_s) as resp:
            return str(resp.read().decode())

    def get(self, path: str, owner: str = "", timeout_s: float = 15, method: str = "GET") -> tuple[int, Any]:
        """A call straight to the batch service (as the router would pass it on for ``owner``), past the
        router's rate limits."""
        request = urllib.request.Request(
            f"{self.url}{path}", headers={"x-inferstack-key": owner}, method=method
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())


def upload(client: openai.OpenAI, data: bytes, name: str = "in.jsonl") -> str:
    return client.files.create(file=(name, io.BytesIO(data)), purpose="batch").id


def run_batch(client: openai.OpenAI, data: bytes, endpoint: str = "/v1/chat/completions") -> str:
    file_id = upload(client, data)
    return client.batches.create(input_file_id=file_id, endpoint=endpoint, completion_window="24h").id


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    """Poll ``condition`` until it holds; an AssertionError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(0.05)


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
