"""``python -m runtime.batcher --config FILE``: run the embedding batcher."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

import uvloop
from aiohttp import web

from runtime.batcher.app import Batcher, make_app
from runtime.discovery import watch_backends
from runtime.health.cli import EXIT_BAD_CONFIG, load_config_or_exit, setup_logging


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m runtime.batcher", description=__doc__)
    parser.add_argument("--config", type=Path, required=True, help="runtime config YAML (RuntimeConfig)")
    parser.add_argument("--host", help="override batcher.host")
    parser.add_argument("--port", type=int, help="override batcher.port")
    args = parser.parse_args(argv)
    setup_logging(os.environ.get("LOG_LEVEL", "INFO"))
    config = load_config_or_exit(args.config)
    if not config.batcher.policies:
        print(
            f"{args.config}: batcher.policies: empty; name at least one embedding model to batch",
            file=sys.stderr,
        )
        raise SystemExit(EXIT_BAD_CONFIG)
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    web.run_app(
        make_app(Batcher(config, watch=watch_backends)),
        host=args.host or config.batcher.host,
        port=args.port or config.batcher.port,
        access_log=None,
        print=None,
        shutdown_timeout=5,
        handler_cancellation=True,
    )


if __name__ == "__main__":
    main()
