"""``python -m runtime.batch_service --config FILE``: run the batch service.

A config without a ``batches`` section, an unreadable API-key file or a state directory that cannot be
written is a person's mistake: one line each, exit 2. SIGTERM stops accepting, lets API calls in flight
finish, stops the work (requests in flight are abandoned: their lines stay pending and run again at the
next start) and closes the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from runtime import tracing
from runtime.batch_service.api import API_BODY_BYTES, BatchApi
from runtime.batch_service.blobs import BlobError, open_blobs
from runtime.batch_service.client import RouterClient
from runtime.batch_service.metrics import BatchMetrics
from runtime.batch_service.runner import Runner
from runtime.batch_service.store import Db, Store
from runtime.batch_service.validate import served_models
from runtime.config import BatchesSettings, RuntimeConfig
from runtime.server import Limits, Server
from runtime.service import command_line, exit_bad_config, new_event_loop, stop_on_signals

log = logging.getLogger("inferstack.batches")

DRAIN_GRACE_S = 10.0
STATE_FILE = "state.sqlite3"


def settings_of(config: RuntimeConfig, path: Path) -> BatchesSettings:
    if config.batches is None:
        exit_bad_config([f"{path}: batches: missing; the batch service needs its section (router_url, ...)"])
    return config.batches


def api_key(s: BatchesSettings, path: Path) -> str | None:
    if s.router_api_key_file is None:
        return None
    try:
        key = s.router_api_key_file.read_text().strip()
    except OSError as err:
        exit_bad_config(
            [f"{path}: batches.router_api_key_file: cannot read {s.router_api_key_file}: {err.strerror}"]
        )
    if not key:
        exit_bad_config([f"{path}: batches.router_api_key_file: {s.router_api_key_file} is empty"])
    return key


async def serve(api: BatchApi, runner: Runner, host: str, port: int, metrics_port: int | None) -> None:
    s = api.settings
    server = Server(api.handle, Limits.of(s, API_BODY_BYTES), head=api.head)
    ops = Server(api.handle_ops, Limits.of(s, 1024)) if metrics_port is not None else None
    work = asyncio.create_task(runner.run())
    bound = await server.start(host, port)
    if ops is not None and metrics_port is not None:
        await ops.start(host, metrics_port)
    log.info("batch service listening", extra={"host": host, "port": bound, "metrics_port": metrics_port})
    stop = stop_on_signals()
    try:
        done, _ = await asyncio.wait(
            [asyncio.create_task(stop.wait()), work], return_when=asyncio.FIRST_COMPLETED
        )
        if work in done:
            work.result()  # the work loop never ends on its own: surface why it did
    finally:
        await server.drain(DRAIN_GRACE_S, lambda: api.inflight)
        if ops is not None:
            await ops.drain(0.0, lambda: 0)
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work
        with contextlib.suppress(Exception):
            await runner.flush()  # answers already received are kept


def main(argv: list[str] | None = None) -> None:
    args, config = command_line("python -m runtime.batch_service", "batches", __doc__, argv)
    s = settings_of(config, args.config)
    key = api_key(s, args.config)
    try:
        store = Store(s.state_dir / STATE_FILE)
        blobs = open_blobs(s.s3, s.state_dir)
    except (OSError, BlobError) as err:
        exit_bad_config([f"{args.config}: batches.state_dir: cannot use {s.state_dir}: {err}"])
    try:
        client = RouterClient(str(s.router_url), key, config.router.request_id_header)
    except ValueError as err:
        exit_bad_config([f"{args.config}: batches.{err}"])
    db = Db(store)
    metrics = BatchMetrics()
    traces = tracing.Tracing(config.tracing, "inferstack-batches")
    runner = Runner(db, blobs, client, s, metrics, s.state_dir / "scratch", served_models(config), traces)
    api = BatchApi(db, blobs, s, runner, metrics)
    try:
        with asyncio.Runner(loop_factory=new_event_loop) as loop_runner:
            port = args.port if args.port is not None else s.port
            loop_runner.run(serve(api, runner, args.host or s.host, port, s.metrics_port))
    finally:
        client.close()
        db.close()
        traces.shutdown()  # what is buffered is exported


if __name__ == "__main__":
    main()
