"""``python -m runtime.picker --config FILE``: run the endpoint picker.

A bad config file is a person's mistake: one line per mistake naming the file and the field, exit 2, no
traceback. SIGTERM turns gRPC health to NOT_SERVING, lets open streams finish for ``picker.grace_s``,
then stops. The config is read once: its ConfigMap's checksum rolls the picker's pods when it changes. The
API keys file (a Secret, updated in place) is re-read whenever it changes.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from runtime.config_file import ConfigError, read_config, routing_lines
from runtime.picker.service import Picker, start
from runtime.service import exit_bad_config, new_event_loop, serve_until_signalled, setup_logging


def read_picker_config(path: Path) -> Picker:
    """The picker for ``path``: plug-ins imported, strategies' names checked, API keys read (``ConfigError``
    otherwise)."""
    cfg = read_config(path)
    lines = routing_lines(path, cfg)
    if lines:
        raise ConfigError(lines)
    return Picker(cfg, config_path=path)


async def serve(picker: Picker, port: int | None, metrics_port: int | None) -> None:
    running = await start(picker, port, metrics_port)
    try:
        await serve_until_signalled()
    finally:
        await running.stop(picker.settings.grace_s)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m runtime.picker", description="inferstack endpoint picker")
    ap.add_argument("--config", required=True, type=Path, help="runtime config YAML (RuntimeConfig)")
    ap.add_argument("--log-level", default="INFO")
    ap.add_argument("--port", type=int, default=None, help="override picker.port (gRPC; 0 = any free port)")
    ap.add_argument("--metrics-port", type=int, default=None, help="override picker.metrics_port (HTTP)")
    args = ap.parse_args(argv)
    setup_logging(args.log_level)
    try:
        picker = read_picker_config(args.config)
    except (ConfigError, ValueError) as err:
        exit_bad_config(err.lines if isinstance(err, ConfigError) else [f"{args.config}: {err}"])
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        runner.run(serve(picker, args.port, args.metrics_port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
