"""Many fake replicas in one process: the instant fake engine of ``bench/router`` on N consecutive ports.

One asyncio (uvloop) process answers for every replica, so 1,024 replicas cost one process, not 1,024.
``/metrics`` answers with a real vLLM engine's exposition (``tests/fixtures/vllm-cpu-metrics.txt``, 632
lines), so a health monitor parses what it would parse in production. ``GET /_counts`` on any port returns
how many requests each path got across all ports (the probes a monitor made, the requests a router sent).

    python bench/scale/fleet.py --base-port 20000 --replicas 1024
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from pathlib import Path

import uvloop

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.router.fake_engine import Engine  # noqa: E402

METRICS = b"".join(
    line + b"\n"
    for line in (ROOT / "tests/fixtures/vllm-cpu-metrics.txt").read_bytes().splitlines()
    if not line.startswith(b"# Captured") and not line.startswith(b"# (") and not line.startswith(b"# six")
)
COUNTS: Counter[str] = Counter()


class Replica(Engine):
    """The bench engine, counting requests by path and serving a real engine's metrics."""

    def on_message_complete(self) -> None:
        path = self.url.split(b"?")[0]
        COUNTS[path.decode("latin-1")] += 1
        if path == b"/metrics":
            self.reply(METRICS, b"text/plain; version=0.0.4")
        elif path == b"/_counts":
            self.reply(json.dumps(COUNTS).encode())
        else:
            super().on_message_complete()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-port", type=int, required=True)
    ap.add_argument("--replicas", type=int, required=True)
    ap.add_argument("--tokenizer-path", default="/nonexistent-local-tokenizer")
    args = ap.parse_args()
    engine_args = argparse.Namespace(delay_ms=0.0, stream_chunks=16, stream_interval_ms=5.0)

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        servers = [
            await loop.create_server(
                lambda: Replica(engine_args, args.tokenizer_path),
                "127.0.0.1",
                args.base_port + i,
                backlog=256,
            )
            for i in range(args.replicas)
        ]
        print(f"ready {time.time()} {len(servers)}", flush=True)
        await asyncio.Event().wait()

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    asyncio.run(serve())


if __name__ == "__main__":
    main()
