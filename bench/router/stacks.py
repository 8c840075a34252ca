"""Bare pass-through proxies, one per candidate HTTP stack, to choose the router's stack by measurement.

No features: parse, forward the body bytes to one backend over keep-alive, return the answer.
Whatever a stack costs here is its floor; the router's features come on top.

    python bench/router/stacks.py --stack lean|aiohttp --port 8100 --backend 127.0.0.1:9001
"""

from __future__ import annotations

import argparse
import asyncio

import aiohttp
import uvloop
from aiohttp import web

from runtime.server import Connection, Request, Server
from runtime.upstream import Exchange, Pool


async def run_aiohttp(port: int, backend: str) -> None:
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def proxy(request: web.Request) -> web.Response:
        body = await request.read()
        async with session.post(
            f"http://{backend}{request.path}", data=body, headers={"content-type": "application/json"}
        ) as resp:
            data = await resp.read()
            return web.Response(body=data, status=resp.status, content_type="application/json")

    app = web.Application()
    app.router.add_post("/{tail:.*}", proxy)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print("ready", flush=True)
    await asyncio.Event().wait()


async def run_lean(port: int, backend: str) -> None:
    host, _, p = backend.partition(":")
    pool = Pool(host, int(p))

    async def proxy(req: Request, conn: Connection) -> None:
        head = (
            b"POST %b HTTP/1.1\r\nhost: %b\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
            % (
                req.path,
                pool.host_header,
                len(req.body),
            )
        )
        ex = await Exchange.open(pool, head + req.body, 2.0)
        await ex.head(30.0)
        body = await ex.read_all(30.0)
        conn.send(ex.status, body)

    server = Server(proxy, 1 << 20)
    await server.start("127.0.0.1", port)
    print("ready", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stack", choices=["lean", "aiohttp"], required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--backend", required=True)
    ap.add_argument("--no-uvloop", action="store_true")
    args = ap.parse_args()
    if not args.no_uvloop:
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    coro = run_lean if args.stack == "lean" else run_aiohttp
    asyncio.run(coro(args.port, args.backend))


if __name__ == "__main__":
    main()
