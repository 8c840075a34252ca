"""Candidate (c) of bench/coldstart/s3_servers.py: moto's server answering ranged GETs from its stored copy.

    .venv/bin/python -m bench.coldstart.moto_ranged --port 9000 --requests FILE

What the loopback S3 would have been had moto stayed: moto's WSGI application (PyPI ``moto[server]``) behind
two middlewares, ``RangedGets`` (below) and the JSON-lines request log the tests read (method, path, status,
bytes sent). moto builds every GET from the whole object (``FakeKey.value`` reads all of it, then slices):
540 MB for each 8 MiB range the Run:ai streamer asks of SmolLM2. ``RangedGets`` has moto answer the same
request as a HEAD (authorisation, conditions, headers and errors stay moto's), then reads the range from the
key's own buffer (a temporary file past 5 MB) a step at a time. Uploads still go through moto's memory (a
multipart upload is joined in memory, twice: ``bytes(bytearray)``), which is what lost it the choice.
Binds 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
Environ = dict[str, Any]
StartResponse = Callable[..., Any]
App = Callable[[Environ, StartResponse], Iterable[bytes]]

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
#: Bytes read from an object's buffer per step of a ranged answer (the key's lock is held for one step only).
RANGE_STEP_BYTES = 1 << 20


class RequestLog:
    """WSGI middleware: one JSON line per request (method, path, status, bytes sent) in ``path``."""

    def __init__(self, app: App, path: Path) -> None:
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


def byte_range(header: str, size: int) -> tuple[int, int] | None:
    """``(first, last)`` of one satisfiable ``Range: bytes=...`` of an object of ``size`` bytes, else None
    (several ranges, a malformed or unsatisfiable one: moto answers those itself, as S3 does)."""
    match = _RANGE.match(header.strip())
    if not match or not any(match.groups()) or size == 0:
        return None
    first, last = match.groups()
    if not first:  # the last N bytes
        return (max(size - int(last), 0), size - 1) if int(last) > 0 else None
    begin, end = int(first), int(last) if last else size - 1
    if begin >= size or end < begin:
        return None
    return begin, min(end, size - 1)


class RangedGets:
    """WSGI middleware: a ranged GET of an object is answered from moto's own stored copy with a seek;
    anything else, and any range moto must judge (several, unsatisfiable, a version or part), goes to moto."""

    def __init__(self, app: App) -> None:
        self.app = app

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        header = environ.get("HTTP_RANGE", "")
        if environ.get("REQUEST_METHOD") != "GET" or not header or environ.get("QUERY_STRING"):
            return self.app(environ, start_response)
        head = {k: v for k, v in environ.items() if k != "HTTP_RANGE"}
        head["REQUEST_METHOD"] = "HEAD"
        answer: list[Any] = []

        def capture(status: str, headers: list[tuple[str, str]], *exc: Any) -> Callable[[bytes], None]:
            answer[:] = [status, headers]
            return lambda _: None

        body = self.app(head, capture)
        try:
            for _ in body:
                pass
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()
        key = _stored_key(environ) if answer and answer[0].startswith("200") else None
        headers = {k.lower(): v for k, v in answer[1]} if answer else {}
        span = byte_range(header, key.size) if key is not None else None
        if key is None or span is None or headers.get("etag") != key.etag:
            return self.app(environ, start_response)
        first, last = span
        drop = {"content-length", "content-range"}
        out = [
            (k, v)
            for k, v in answer[1]
            if k.lower() not in drop and not k.lower().startswith("x-amz-checksum-")
        ]
        out += [
            ("Content-Length", str(last - first + 1)),
            ("Content-Range", f"bytes {first}-{last}/{key.size}"),
        ]
        start_response("206 Partial Content", out)
        return _read(key, first, last + 1)


def _stored_key(environ: Environ) -> Any:
    """moto's ``FakeKey`` named by a path-style request, or None (virtual-host style, no such key)."""
    from moto.s3.models import FakeKey, s3_backends  # noqa: PLC0415 - dev extras only

    path = environ.get("PATH_INFO", "").encode("latin-1").decode("utf-8", "replace")
    bucket, _, name = path.lstrip("/").partition("/")
    where = s3_backends.bucket_accounts.get(bucket)
    if not name or where is None:
        return None
    partition, account = where
    stored = s3_backends[account][partition].buckets.get(bucket)
    key = stored.keys.get(name) if stored is not None else None
    return key if isinstance(key, FakeKey) else None


def _read(key: Any, begin: int, end: int) -> Iterator[bytes]:
    at = begin
    while at < end:
        with key.lock:
            key._value_buffer.seek(at)
            chunk = key._value_buffer.read(min(RANGE_STEP_BYTES, end - at))
        if not chunk:
            return
        at += len(chunk)
        yield chunk


def serve(port: int, requests: Path) -> None:
    from moto.moto_server.werkzeug_app import (  # noqa: PLC0415 - dev extras only
        DomainDispatcherApplication,
        create_backend_app,
    )
    from werkzeug.serving import run_simple  # noqa: PLC0415

    app = RequestLog(RangedGets(DomainDispatcherApplication(create_backend_app)), requests)
    os.environ.setdefault("MOTO_PORT", str(port))
    run_simple(HOST, port, app, threaded=True, use_reloader=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="moto's S3 server, ranged GETs from its stored copy.")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--requests", type=Path, required=True, help="JSON-lines request log")
    args = parser.parse_args(argv)
    serve(args.port, args.requests)
    return 0


if __name__ == "__main__":
    sys.exit(main())
