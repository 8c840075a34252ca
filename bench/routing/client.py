"""Bounded async client that plays a workload against one endpoint and records every request.

Streams every request (``stream: true``) and records time to first token (the first SSE ``data:``
chunk), end-to-end latency, status, and the replica that answered when the router names it
(``x-inferstack-backend``). Sessions run their turns in order, each turn after the previous answer
plus the session's think time; at most ``concurrency`` requests are in flight (TCP_NODELAY sockets).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import aiohttp

from bench.routing.workload import Session, Workload


@dataclass
class Record:
    session: int
    turn: int
    status: int
    ttft_s: float | None
    latency_s: float
    backend: str | None
    error: str | None = None


async def _one(
    http: aiohttp.ClientSession, url: str, body: bytes, sem: asyncio.Semaphore
) -> tuple[int, float | None, float, str | None, str | None]:
    async with sem:
        t0 = time.perf_counter()
        ttft: float | None = None
        try:
            async with http.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
                backend = resp.headers.get("x-inferstack-backend")
                if resp.status != 200:
                    text = await resp.text()
                    return resp.status, None, time.perf_counter() - t0, backend, text[:200]
                async for chunk in resp.content.iter_any():
                    if ttft is None and b"data:" in chunk:
                        ttft = time.perf_counter() - t0
                return 200, ttft, time.perf_counter() - t0, backend, None
        except (aiohttp.ClientError, TimeoutError) as err:
            return 0, None, time.perf_counter() - t0, None, repr(err)[:200]


async def _session(
    http: aiohttp.ClientSession,
    url: str,
    model: str,
    idx: int,
    s: Session,
    t_start: float,
    max_tokens: int,
    sem: asyncio.Semaphore,
    out: list[Record],
) -> None:
    delay = t_start + s.start_s - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    for k, turn in enumerate(s.turns):
        body = json.dumps(
            {
                "model": model,
                "messages": turn.messages,
                "max_tokens": max_tokens,
                "temperature": 0,
                "stream": True,
            }
        ).encode()
        status, ttft, latency, backend, err = await _one(http, url, body, sem)
        out.append(Record(idx, k, status, ttft, latency, backend, err))
        if k < len(s.think_s):
            await asyncio.sleep(s.think_s[k])


async def play(
    base_url: str, model: str, wl: Workload, *, concurrency: int = 64, max_tokens: int = 8
) -> tuple[list[Record], float]:
    """Runs the workload; returns the records and the wall time of the run."""
    sem = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency)  # aiohttp sets TCP_NODELAY on every connection
    timeout = aiohttp.ClientTimeout(total=120)
    out: list[Record] = []
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        url = f"{base_url}/v1/chat/completions"
        t0 = time.perf_counter()
        await asyncio.gather(
            *(_session(http, url, model, i, s, t0, max_tokens, sem, out) for i, s in enumerate(wl.sessions))
        )
        wall = time.perf_counter() - t0
    return out, wall
