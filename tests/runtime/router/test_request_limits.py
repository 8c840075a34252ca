"""Bounded work per request: how many choices a request may ask for, how large its head may be; both
refused with a clear, OpenAI-shaped 4xx before anything reaches an engine, and both configurable."""

from __future__ import annotations

import json
import socket

import pytest

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}


@pytest.mark.parametrize(
    ("field", "value"), [("n", 1000), ("n", 0), ("n", "3"), ("n", True), ("best_of", 17)]
)
def test_too_many_choices_is_a_400_naming_the_field(doubles, make_router, field: str, value: object) -> None:
    (d,) = doubles(1)
    r = make_router([d.url])
    status, _, body = r.request("POST", "/v1/chat/completions", {**CHAT, field: value})
    assert status == 400
    error = json.loads(body)["error"]
    assert (
        error["param"] == field
        and error["type"] == "invalid_request_error"
        and error["code"] == "invalid_value"
    )
    assert "from 1 to 16" in error["message"]
    assert d.requests == []


def test_the_choice_limit_is_configurable_and_null_means_the_engine_default(doubles, make_router) -> None:
    (d,) = doubles(1)
    r = make_router([d.url], max_choices_per_request=64)
    assert r.request("POST", "/v1/chat/completions", {**CHAT, "n": 64})[0] == 200
    assert r.request("POST", "/v1/chat/completions", {**CHAT, "n": None})[0] == 200
    assert r.request("POST", "/v1/chat/completions", {**CHAT, "n": 65})[0] == 400


def _raw(port: int, head: bytes, body: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head + b"content-length: %d\r\n\r\n" % len(body) + body)
        out = b""
        while b"\r\n\r\n" not in out or len(out) < out.index(b"\r\n\r\n") + 4 + int(
            out.split(b"content-length: ")[1].split(b"\r\n")[0] if b"content-length: " in out else 0
        ):
            chunk = sock.recv(65536)
            if not chunk:
                break
            out += chunk
        return out


def test_a_64_kb_header_is_a_431_and_the_limit_is_configurable(doubles, make_router) -> None:
    (d,) = doubles(1)
    body = json.dumps(CHAT).encode()
    big = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-padding: " + b"a" * 65536 + b"\r\n"
    r = make_router([d.url])
    answer = _raw(r.port, big, body)
    assert answer.startswith(b"HTTP/1.1 431 Request Header Fields Too Large")
    error = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["type"] == "invalid_request_error" and "16384 bytes" in error["message"]
    assert d.requests == []
    # 12 KB of headers: under the default, over a limit of 8 KiB
    ok = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-a: "
        + b"a" * 6000
        + b"\r\nx-b: "
        + b"b" * 6000
        + b"\r\n"
    )
    assert _raw(r.port, ok, body).startswith(b"HTTP/1.1 200")
    strict = make_router([d.url], max_header_bytes=8192)
    assert _raw(strict.port, ok, body).startswith(b"HTTP/1.1 431")
