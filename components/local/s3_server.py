"""A real S3 API on loopback for `make local S3=1`, the tests and the cold-start benchmark: moto's server.

    python -m components.local.s3_server --port 9000 --requests FILE

moto (PyPI ``moto[server]``, the dev extras) implements the S3 REST API in memory. This wraps its WSGI
application to append one JSON line per request to FILE: method, path, status and the bytes it sent back.
That log is how a test proves a node cache fetched 0 bytes the second time, or a benchmark reports the bytes
each fetch path moved. Binds 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
#: Credentials moto accepts (any will do); nothing else ever sees them.
LOOPBACK_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "inferstack-local",
    "AWS_SECRET_ACCESS_KEY": "inferstack-local",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}

#: How the Run:ai streamer should read this server (what `make local S3=1` engines get). moto serves S3 from one
#: Python process and reads the whole object for each range GET: ~340 ms for an 8 MiB range of SmolLM2's 540 MB
#: file on an idle machine, seconds on a busy one. The streamer's defaults are made for S3 itself: 8 streams per
#: engine, and a request that sends no byte for 1 s is aborted and retried, until the load fails with "File
#: access error" (two SmolLM2 engines did, every time). 2 streams and a 60 s stall limit stream SmolLM2 in
#: ~11 s idle and still load on a machine running the test suite.
STREAMER_ENV = {
    "RUNAI_STREAMER_CONCURRENCY": "2",
    "RUNAI_STREAMER_S3_REQUEST_TIMEOUT_MS": "60000",
}

Environ = dict[str, Any]
StartResponse = Callable[..., Any]


class RequestLog:
    """WSGI middleware: one JSON line per request (method, path, status, bytes sent) in ``path``."""

    def __init__(self, app: Callable[[Environ, StartResponse], Iterable[bytes]], path: Path) -> None:
        self.app = app
        self.path = path
        self._lock = threading.Lock()

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterator[bytes]:
        status: list[str] = []

        def capture(code: str, headers: list[tuple[str, str]], *exc: Any) -> Any:
            status.append(code)
            return start_response(code, headers, *exc)

        sent = 0
        try:
            for chunk in self.app(environ, capture):
                sent += len(chunk)
                yield chunk
        finally:
            line = {
                "method": environ.get("REQUEST_METHOD", ""),
                "path": environ.get("PATH_INFO", ""),
                "status": int(status[0].split()[0]) if status else 0,
                "bytes": sent,
            }
            with self._lock, self.path.open("a") as out:
                out.write(json.dumps(line) + "\n")


def client_env(endpoint: str) -> dict[str, str]:
    """What a client (boto3, the streamer, vLLM) needs to talk to the server at ``endpoint``."""
    return {**LOOPBACK_CREDENTIALS, "AWS_ENDPOINT_URL": endpoint}


def client(endpoint: str) -> Any:
    """A boto3 S3 client of the loopback server (dev extras)."""
    import boto3  # noqa: PLC0415 - only the dev extras carry boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=LOOPBACK_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=LOOPBACK_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region_name=LOOPBACK_CREDENTIALS["AWS_REGION"],
    )


def read_requests(path: Path) -> list[dict[str, Any]]:
    """The requests the server logged so far."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def serve(port: int, requests: Path) -> None:
    from moto.moto_server.werkzeug_app import (  # noqa: PLC0415 - dev extras only
        DomainDispatcherApplication,
        create_backend_app,
    )
    from werkzeug.serving import run_simple  # noqa: PLC0415

    app = RequestLog(DomainDispatcherApplication(create_backend_app), requests)
    os.environ.setdefault("MOTO_PORT", str(port))
    run_simple(HOST, port, app, threaded=True, use_reloader=False)


@dataclass
class LoopbackS3:
    """A running server: its endpoint and request log (``started`` below starts and stops one)."""

    endpoint: str
    requests: Path
    proc: subprocess.Popen[bytes]

    def env(self) -> dict[str, str]:
        """What a client (boto3, the streamer, vLLM) needs to talk to this server."""
        return client_env(self.endpoint)

    def logged(self) -> list[dict[str, Any]]:
        return read_requests(self.requests)


def wait_listening(endpoint: str, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the loopback S3 server exited with code {proc.returncode}")
        with contextlib.suppress(OSError):
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2).close()
            return
        time.sleep(0.2)
    raise RuntimeError(f"the loopback S3 server at {endpoint} did not answer within {timeout_s:.0f}s")


@contextlib.contextmanager
def started(port: int, requests: Path, log: Path | None = None) -> Iterator[LoopbackS3]:
    """Run the server for the ``with`` block; stopped (SIGTERM, then SIGKILL) whatever happens."""
    requests.parent.mkdir(parents=True, exist_ok=True)
    requests.write_text("")
    argv = [
        sys.executable,
        "-m",
        "components.local.s3_server",
        "--port",
        str(port),
        "--requests",
        str(requests),
    ]
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(log.open("ab")) if log else subprocess.DEVNULL
        root = Path(__file__).resolve().parents[2]
        env = {**os.environ, "PYTHONPATH": str(root)}
        proc = subprocess.Popen(
            argv, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            endpoint = f"http://{HOST}:{port}"
            wait_listening(endpoint, proc)
            yield LoopbackS3(endpoint, requests, proc)
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A loopback S3 server (moto) with a request log.")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--requests", type=Path, required=True, help="JSON-lines request log")
    args = parser.parse_args(argv)
    serve(args.port, args.requests)
    return 0


if __name__ == "__main__":
    sys.exit(main())
