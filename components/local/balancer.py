"""A round-robin TCP load balancer on loopback: what a cloud network load balancer does in front of the
router replicas, for ``make local --routers N`` and the tests that run several routers as one.

Each new client connection goes to the next replica in turn; a replica that refuses the connection is
skipped (the next one is tried), so a stopped router costs no request. Bytes are copied both ways
until either side closes: HTTP keep-alive connections stay on the replica they landed on, as behind an
NLB. No TLS, no HTTP parsing, loopback only.

    python -m components.local.balancer --listen 127.0.0.1:8080 --to 127.0.0.1:8090 --to 127.0.0.1:8091
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import signal
import socket
import sys

CONNECT_TIMEOUT_S = 2.0
CHUNK = 64 * 1024


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if host not in {"127.0.0.1", "localhost", "::1", "[::1]"} or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: give a loopback HOST:PORT such as 127.0.0.1:8090")
    return host.strip("[]"), int(port)


class Balancer:
    def __init__(self, replicas: list[tuple[str, int]]) -> None:
        self.replicas = replicas
        self._turn = itertools.cycle(range(len(replicas)))
        self.connections = 0

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(CHUNK):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        for _ in range(len(self.replicas)):
            host, port = self.replicas[next(self._turn)]
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT_S):
                    return await asyncio.open_connection(host, port)
            except (OSError, TimeoutError):
                continue
        return None

    async def handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        upstream = await self._connect()
        if upstream is None:
            client_w.close()
            return
        up_r, up_w = upstream
        for w in (client_w, up_w):
            sock = w.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(self._pipe(client_r, up_w), self._pipe(up_r, client_w))


async def serve(listen: tuple[str, int], replicas: list[tuple[str, int]]) -> None:
    balancer = Balancer(replicas)
    server = await asyncio.start_server(balancer.handle, listen[0], listen[1], reuse_address=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m components.local.balancer", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--listen", type=_address, required=True, help="loopback HOST:PORT to accept on")
    ap.add_argument("--to", type=_address, action="append", required=True, help="a replica's HOST:PORT")
    args = ap.parse_args(argv)
    asyncio.run(serve(args.listen, args.to))
    return 0


if __name__ == "__main__":
    sys.exit(main())
