"""A fast OpenAI-shaped fake engine for router benchmarks (loopback only).

Modes: instant answer, a fixed delay (``--delay-ms``), or an SSE stream of ``--stream-chunks`` chunks
``--stream-interval-ms`` apart. It also answers the probes the field's routers make
(``/health``, ``/v1/models``, ``/server_info``, ``/model_info``, ``/get_model_info``, ``/tokenize``,
``/metrics``) and reports a local tokenizer path so nothing tries to download one.
Built on the same asyncio + httptools core as the router so the backend is never the bottleneck.

    python bench/router/fake_engine.py --port 9001 [--delay-ms 20] [--stream-chunks 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import cast

import httptools
import uvloop

MODEL = "tiny"
COMPLETION = json.dumps(
    {
        "id": "cmpl-bench",
        "object": "chat.completion",
        "created": 0,
        "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 8, "completion_tokens": 1, "total_tokens": 9},
    }
).encode()
MODELS = json.dumps(
    {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "bench", "max_model_len": 512}]}
).encode()


def chunk_event(i: int) -> bytes:
    body = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": MODEL,
        "choices": [{"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}],
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


class Engine(asyncio.Protocol):
    def __init__(self, args: argparse.Namespace, tokenizer_path: str) -> None:
        self.args = args
        self.tokenizer_path = tokenizer_path
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.body: list[bytes] = []
        self.transport: asyncio.Transport | None = None
        self.task: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport:
                self.transport.close()

    def on_message_begin(self) -> None:
        self.url = b""
        self.body = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        path = self.url.split(b"?")[0]
        body = b"".join(self.body)
        if path in (b"/v1/chat/completions", b"/v1/completions", b"/generate"):
            streaming = b'"stream":true' in body.replace(b" ", b"")
            if streaming:
                self.task = asyncio.ensure_future(self.stream())
            elif self.args.delay_ms > 0:
                asyncio.get_running_loop().call_later(self.args.delay_ms / 1000, self.reply, COMPLETION)
            else:
                self.reply(COMPLETION)
        elif path == b"/v1/models":
            self.reply(MODELS)
        elif path in (b"/server_info", b"/get_server_info", b"/model_info", b"/get_model_info"):
            self.reply(
                json.dumps(
                    {
                        "model_path": self.tokenizer_path,
                        "tokenizer_path": self.tokenizer_path,
                        "served_model_name": MODEL,
                        "is_generation": True,
                    }
                ).encode()
            )
        elif path == b"/tokenize":
            self.reply(json.dumps({"tokens": list(range(8)), "count": 8, "max_model_len": 512}).encode())
        elif path == b"/metrics":
            self.reply(b"vllm:num_requests_waiting 0\nvllm:num_requests_running 0\n", b"text/plain")
        else:  # /health and anything else
            self.reply(b"{}")

    def reply(self, body: bytes, ctype: bytes = b"application/json") -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.transport.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: %b\r\ncontent-length: %d\r\n\r\n%b" % (ctype, len(body), body)
        )

    async def stream(self) -> None:
        t = self.transport
        if t is None:
            return
        t.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for i in range(self.args.stream_chunks):
            if i:
                await asyncio.sleep(self.args.stream_interval_ms / 1000)
            if t.is_closing():
                return
            ev = chunk_event(i)
            t.write(b"%x\r\n%b\r\n" % (len(ev), ev))
        done = b"data: [DONE]\n\n"
        t.write(b"%x\r\n%b\r\n0\r\n\r\n" % (len(done), done))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--delay-ms", type=float, default=0.0)
    ap.add_argument("--stream-chunks", type=int, default=16)
    ap.add_argument("--stream-interval-ms", type=float, default=5.0)
    ap.add_argument("--tokenizer-path", default="/nonexistent-local-tokenizer")
    args = ap.parse_args()
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: Engine(args, args.tokenizer_path), "127.0.0.1", args.port)
        print(f"ready {time.time()}", flush=True)
        await server.serve_forever()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
