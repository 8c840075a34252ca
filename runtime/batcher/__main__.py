"""``python -m runtime.batcher --config FILE``: run the embedding batcher.

SIGTERM stops accepting, lets requests in flight finish for a few seconds, then closes what is left.
"""

from __future__ import annotations

import asyncio

from runtime.batcher.app import Batcher, make_server
from runtime.discovery import watch_replicas
from runtime.service import command_line, exit_bad_config, new_event_loop, serve_until_signalled

DRAIN_GRACE_S = 5.0


async def serve(batcher: Batcher, host: str, port: int) -> None:
    """Run until SIGTERM/SIGINT (or cancellation), then drain."""
    server = make_server(batcher)
    await batcher.start()
    await server.start(host, port)
    try:
        await serve_until_signalled()
    finally:
        await server.drain(DRAIN_GRACE_S, lambda: batcher.inflight)
        await batcher.stop()


def main(argv: list[str] | None = None) -> None:
    args, config = command_line("python -m runtime.batcher", "batcher", __doc__, argv)
    if not config.batcher.policies:
        exit_bad_config(
            [f"{args.config}: batcher.policies: empty; name at least one embedding model to batch"]
        )
    batcher = Batcher(config, watch=watch_replicas)
    host = args.host or config.batcher.host
    port = args.port if args.port is not None else config.batcher.port
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        runner.run(serve(batcher, host, port))


if __name__ == "__main__":
    main()
