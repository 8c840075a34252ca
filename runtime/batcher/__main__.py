"""``python -m runtime.batcher --config FILE``: run the embedding batcher.

SIGTERM stops accepting, lets requests in flight finish for a few seconds, then closes what is left.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path

from runtime.batcher.app import Batcher, make_server
from runtime.config_file import ConfigError, read_config
from runtime.discovery import watch_backends
from runtime.service import exit_bad_config, new_event_loop, serve_until_signalled, setup_logging

DRAIN_GRACE_S = 5.0


async def serve(batcher: Batcher, host: str, port: int) -> None:
    """Run until SIGTERM/SIGINT (or cancellation), then drain."""
    server = make_server(batcher)
    await batcher.start()
    await server.start(host, port)
    try:
        await serve_until_signalled()
    finally:
        await server.stop_accepting()
        deadline = time.monotonic() + DRAIN_GRACE_S
        while time.monotonic() < deadline and (server.close_idle() or batcher.inflight):
            await asyncio.sleep(0.05)
        server.close_all()
        await batcher.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m runtime.batcher", description=__doc__)
    parser.add_argument("--config", type=Path, required=True, help="runtime config YAML (RuntimeConfig)")
    parser.add_argument("--host", help="override batcher.host")
    parser.add_argument("--port", type=int, help="override batcher.port")
    args = parser.parse_args(argv)
    setup_logging(os.environ.get("LOG_LEVEL", "INFO"))
    try:
        config = read_config(args.config)
    except ConfigError as err:
        exit_bad_config(err.lines)
    if not config.batcher.policies:
        exit_bad_config(
            [f"{args.config}: batcher.policies: empty; name at least one embedding model to batch"]
        )
    batcher = Batcher(config, watch=watch_backends)
    host = args.host or config.batcher.host
    port = args.port if args.port is not None else config.batcher.port
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        runner.run(serve(batcher, host, port))


if __name__ == "__main__":
    main()
