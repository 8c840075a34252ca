"""A real S3 API on loopback for `make local S3=1`, the tests and the cold-start benchmark: npm ``s3rver``.

    python -m components.local.s3_server --port 9000 --requests FILE [--data DIR]

s3rver (npm, pinned in ``tools/s3rver``, installed by ``make s3rver``) keeps each object in a file and answers
a ranged GET by reading that range from disk, so the Run:ai streamer reads it with its own defaults (8 streams,
a request that sends no byte for 1 s is retried), as it reads S3. moto, the server before, built every ranged
GET from the whole object (540 MB per 8 MiB range of SmolLM2) and held uploads in memory; the numbers that
chose s3rver over moto (plain or answering ranges with a seek) and LocalStack are in
``bench/results/s3-servers-*.md`` (``bench/coldstart/s3_servers.py``).

``tools/s3rver/serve.cjs`` runs it on 127.0.0.1 only, with the loopback credentials below, and appends one
JSON line per request to FILE: method, path (``/bucket/key``), status and the bytes it sent back. That log is
how a test proves a node cache fetched 0 bytes the second time, or a benchmark reports the bytes each fetch
path moved. Objects live under ``--data`` (emptied at start, removed when the server stops).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
#: The access key pair the server accepts (``tools/s3rver/serve.cjs`` registers it); nothing else sees it.
LOOPBACK_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "inferstack-local",
    "AWS_SECRET_ACCESS_KEY": "inferstack-local",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}
TOOLS = Path(__file__).resolve().parents[2] / "tools" / "s3rver"
SERVE = TOOLS / "serve.cjs"


class ServerNotInstalledError(RuntimeError):
    """node or the pinned s3rver is missing; the message says how to install it."""


def argv(port: int, requests: Path, data: Path) -> list[str]:
    """The server's command line: node running ``tools/s3rver/serve.cjs``."""
    node = shutil.which("node")
    if node is None:
        raise ServerNotInstalledError(
            "the loopback S3 server needs node (Node.js 20 or later): apt-get install -y nodejs npm, then make s3rver"
        )
    if not (TOOLS / "node_modules" / "s3rver" / "package.json").is_file():
        raise ServerNotInstalledError(f"s3rver is not installed in {TOOLS}: run `make s3rver`")
    return [node, str(SERVE), str(port), str(data.resolve()), str(requests.resolve())]


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
    """Until the server answers HTTP at ``endpoint`` (any status: an unsigned probe may be refused)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the loopback S3 server exited with code {proc.returncode}")
        try:
            urllib.request.urlopen(f"{endpoint}/", timeout=2).close()
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"the loopback S3 server at {endpoint} did not answer within {timeout_s:.0f}s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the server removes its objects and exits), then SIGKILL after 10 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@contextlib.contextmanager
def started(
    port: int, requests: Path, log: Path | None = None, data: Path | None = None
) -> Iterator[LoopbackS3]:
    """Run the server for the ``with`` block; stopped (SIGTERM, then SIGKILL) whatever happens. Objects go to
    ``data`` (default: ``<requests>-objects`` beside the request log)."""
    requests.parent.mkdir(parents=True, exist_ok=True)
    requests.write_text("")
    command = argv(port, requests, data or requests.with_name(f"{requests.stem}-objects"))
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(log.open("ab")) if log else subprocess.DEVNULL
        proc = subprocess.Popen(
            command, cwd=TOOLS, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            endpoint = f"http://{HOST}:{port}"
            wait_listening(endpoint, proc)
            yield LoopbackS3(endpoint, requests, proc)
        finally:
            stop(proc)


def main(args: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A loopback S3 server (s3rver) with a request log.")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--requests", type=Path, required=True, help="JSON-lines request log")
    parser.add_argument("--data", type=Path, help="where objects live (default: <requests>-objects)")
    parsed = parser.parse_args(args)
    requests: Path = parsed.requests
    try:
        command = argv(parsed.port, requests, parsed.data or requests.with_name(f"{requests.stem}-objects"))
    except ServerNotInstalledError as err:
        print(err, file=sys.stderr)
        return 2
    os.execv(command[0], command)  # the server is this process: stopping it stops the server


if __name__ == "__main__":
    sys.exit(main())
