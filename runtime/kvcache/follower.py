"""Following replicas' KV events over ZeroMQ into a ``CacheIndex``: one SUB socket per replica.

The protocol is vLLM's (0.32 ``ZmqEventPublisher``): a PUB socket sends ``(topic, seq, payload)`` with
``seq`` counting from 0 per publisher; a ROUTER socket answers a request ``[b"", start_seq]`` (8 bytes,
big-endian) with every buffered batch from ``start_seq`` on, as ``[b"", topic, seq, payload]``, then
``[b"", b"", -1, b""]``. The buffer holds the last ``buffer_steps`` batches (10,000 by default).

Why it stays exact, and what it does when it cannot:

- **(Re)connect** (the socket monitor's CONNECTED): the replica's view is rebuilt from a replay from 0, so
  a router that starts late, or reconnects, starts from the engine's true state (as far as its buffer
  reaches: when the first replayed batch is not 0, older blocks are missing and the view under-promises).
- **Disconnect** (the engine went away, or ZeroMQ heartbeats went unanswered for 3 s): the replica's view
  is emptied at once: a restarted engine starts with an empty cache, and nothing must be routed on a
  cache that is gone.
- **A gap** in ``seq`` (the publisher dropped batches at its high-water mark): replay from the missing
  one. **A ``seq`` that goes back** with a newer timestamp: a new publisher (engine restart without a
  visible disconnect): empty and replay from 0. Older duplicates (replay overlap) are skipped.
- **A malformed batch** is skipped, counted and logged once per cause; the loop never dies of it.
- **An oversized message** (above ``MAX_MESSAGE_BYTES``) is never received: ZeroMQ reads its length first,
  refuses it before allocating, and drops the connection (a protocol error, after which ZeroMQ would not
  reconnect: the follower connects anew), then the reconnect replays as above.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from runtime.kvcache.events import BadEventError, decode
from runtime.kvcache.view import CacheIndex

log = logging.getLogger("inferstack.kvcache")

END_SEQ = -1
HEARTBEAT_MS = 1_000
HEARTBEAT_TIMEOUT_MS = 3_000
DRAIN_AT_ONCE = 256  # messages taken per wake-up before the monitor socket is looked at again

# What one legitimate message can weigh. vLLM publishes one batch per engine step; a step stores the blocks
# of at most its token budget (max_num_batched_tokens, or max_model_len without chunked prefill: at most
# MAX_STEP_TOKENS, a million-token context) and evicts at most as many blocks as it allocates. A BlockStored
# carries every token id (msgpack: at most 9 bytes each); each block adds its 32-byte hash stored and, at
# worst, one evicted (2 x 33 bytes over vLLM's default block of 16 tokens: 4 bytes a token);
# and each running sequence adds a BlockStored and a BlockRemoved map of field names (under 512 bytes each).
# Twice that (~34 MiB) is the bound: a peer that sends more is not an engine's step. A replay is one
# message per batch, each under the same bound.
MAX_STEP_TOKENS = 1 << 20
MAX_STEP_SEQUENCES = 4096
_STEP_BYTES = MAX_STEP_TOKENS * (9 + 2 * 33 // 16) + MAX_STEP_SEQUENCES * 2 * 512
MAX_MESSAGE_BYTES = 2 * _STEP_BYTES

# Batches queued for one replica before ZeroMQ drops the next ones (SUB drops at its high-water mark; the
# follower then sees a gap in seq and replays it from the engine's buffer of 10,000 batches, so a short queue
# costs a replay, never a wrong view). Queued messages are held whole, so the worst case is this many of the
# largest ones: 32 x ~34 MiB, about 1.1 GiB per followed replica, reached only by a peer that sends maximum-size
# batches faster than the router applies them. An engine's batches are a few KiB (its token throughput bounds
# them: about 13 bytes a token stored), so 32 cover a few hundred milliseconds of steps at 100 a second: a
# stalled loop or a running replay overflows it at worst into one more (short) replay.
RECEIVE_HWM = 32

#: (replica url, cause) -> None: a problem worth a metric (cause is a short fixed word).
ProblemSink = Callable[[str, str], None]


@dataclass(frozen=True)
class Endpoints:
    """Where one replica publishes (PUB) and answers replays (ROUTER)."""

    events: str
    replay: str


class Follower:
    """One replica's event stream, applied in order to the model's index."""

    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        index: CacheIndex,
        url: str,
        where: Endpoints,
        topic: str,
        replay_timeout_s: float,
        on_problem: ProblemSink,
    ) -> None:
        self.ctx = ctx
        self.index = index
        self.url = url
        self.where = where
        self.topic = topic.encode()
        self.replay_timeout_s = replay_timeout_s
        self.on_problem = on_problem
        self.last_seq: int | None = None
        self.last_ts = 0.0
        self.replays = 0
        self.applied = 0

    # --- the loop ---------------------------------------------------------------------------------
    async def run(self) -> None:
        sub = self.ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        sub.setsockopt(zmq.RCVHWM, RECEIVE_HWM)
        sub.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        sub.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_MS)
        sub.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        sub.setsockopt(zmq.LINGER, 0)
        monitor = sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        poller = zmq.asyncio.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        sub.connect(self.where.events)
        try:
            while True:
                ready = dict(await poller.poll())
                if monitor in ready:
                    event = parse_monitor_message(await monitor.recv_multipart())
                    if event["event"] == zmq.EVENT_CONNECTED:
                        await self.resync()
                    elif event["event"] == zmq.EVENT_DISCONNECTED:
                        self.lost()
                        _connect_again(sub, self.where.events)
                if sub in ready:
                    for _ in range(DRAIN_AT_ONCE):  # what is queued, without a poll per message
                        try:
                            frames = await sub.recv_multipart(flags=zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        await self.on_message(frames)
        finally:
            self.index.forget(self.url)
            sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)

    def lost(self) -> None:
        """The publisher is gone: what it held is unknown (a restarted engine holds nothing)."""
        if self.index.held(self.url) or self.url in self.index.synced:
            log.warning("KV events of %s: publisher disconnected; its view is emptied", self.url)
        self.index.clear(self.url)
        self.index.synced.discard(self.url)
        self.last_seq = None

    async def on_message(self, frames: list[bytes]) -> None:
        if len(frames) != 3 or len(frames[1]) != 8:
            self.on_problem(self.url, "malformed")
            return
        seq = int.from_bytes(frames[1], "big", signed=True)
        last = self.last_seq
        if last is not None and seq <= last:
            ts = _batch_ts(frames[2])
            if ts is not None and ts > self.last_ts:  # a new publisher counting from 0 again
                self.on_problem(self.url, "restarted")
                await self.resync()
            return  # else a batch the replay already gave us
        if last is not None and seq > last + 1:
            self.on_problem(self.url, "gap")
            await self.replay_from(last + 1)
            if self.last_seq is not None and seq <= self.last_seq:
                return
        self.apply(seq, frames[2])

    def apply(self, seq: int, payload: bytes) -> None:
        try:
            events = decode(payload)
        except BadEventError as err:
            self.on_problem(self.url, err.cause)
            self.last_seq = seq  # skipped: waiting for it again would stall the stream for good
            return
        self.index.apply(self.url, events)
        self.last_seq = seq
        self.last_ts = _batch_ts(payload) or self.last_ts
        self.applied += 1

    # --- replay -----------------------------------------------------------------------------------
    async def resync(self) -> None:
        """Rebuild this replica's view from the publisher's replay buffer."""
        self.index.clear(self.url)
        self.last_seq = None
        await self.replay_from(0)
        self.index.synced.add(self.url)

    async def replay_from(self, start: int) -> None:
        """Apply buffered batches from ``start`` on; a wrapped buffer after a gap means starting over."""
        self.replays += 1
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        dealer.connect(self.where.replay)
        first = True
        try:
            async with asyncio.timeout(self.replay_timeout_s):
                await dealer.send_multipart([b"", start.to_bytes(8, "big")])
                while True:
                    frames = await dealer.recv_multipart()
                    if len(frames) != 4 or len(frames[2]) != 8:
                        self.on_problem(self.url, "malformed")
                        continue
                    seq = int.from_bytes(frames[2], "big", signed=True)
                    if seq == END_SEQ:
                        return
                    if first and seq > start:
                        if start > 0:  # the batches we missed are no longer buffered: start over
                            self.on_problem(self.url, "replay_incomplete")
                            self.index.clear(self.url)
                        else:
                            self.on_problem(self.url, "replay_partial")
                    first = False
                    if self.last_seq is None or seq > self.last_seq:
                        self.apply(seq, frames[3])
        except TimeoutError:
            self.on_problem(self.url, "replay_timeout")
        finally:
            dealer.close(linger=0)


def _connect_again(sock: zmq.asyncio.Socket, endpoint: str) -> None:
    """ZeroMQ reconnects by itself after a lost connection, but never after a protocol error, and a message above
    MAXMSGSIZE is one: connecting anew (the old connection's attempts dropped first, so never two) keeps the
    follower listening for the publisher's next good message, whichever way it went."""
    with contextlib.suppress(zmq.ZMQError):  # already gone (a protocol error ends the connection for good)
        sock.disconnect(endpoint)
    sock.connect(endpoint)


def _batch_ts(payload: bytes) -> float | None:
    """The timestamp of a batch without decoding its events (msgpack: array header, then a float)."""
    if len(payload) < 10 or payload[0] & 0xF0 != 0x90 or payload[1] != 0xCB:
        return None
    return float(struct.unpack(">d", payload[2:10])[0])


class Followers:
    """The followers of one model's replicas, started and stopped as replicas come and go."""

    def __init__(
        self,
        index: CacheIndex,
        topic: str,
        replay_timeout_s: float,
        endpoints: Callable[[str], Endpoints],
        on_problem: ProblemSink,
    ) -> None:
        self.index = index
        self.topic = topic
        self.replay_timeout_s = replay_timeout_s
        self.endpoints = endpoints
        self.on_problem = on_problem
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.followers: dict[str, Follower] = {}
        self.ctx = zmq.asyncio.Context.instance()

    def sync(self, urls: list[str]) -> None:
        """Follow exactly these replicas (needs a running loop)."""
        for url in [u for u in self.tasks if u not in urls]:
            self.tasks.pop(url).cancel()
            self.followers.pop(url, None)
            self.index.forget(url)
        for url in urls:
            if url not in self.tasks:
                follower = Follower(
                    self.ctx,
                    self.index,
                    url,
                    self.endpoints(url),
                    self.topic,
                    self.replay_timeout_s,
                    self.on_problem,
                )
                self.followers[url] = follower
                self.tasks[url] = asyncio.get_running_loop().create_task(
                    self._run(follower), name=f"kv-events:{url}"
                )

    async def _run(self, follower: Follower) -> None:
        while True:
            try:
                await follower.run()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must cost this replica's view for a moment, not the router
                log.exception("KV events of %s: follower failed; restarting it", follower.url)
                follower.on_problem(follower.url, "internal")
                await asyncio.sleep(1.0)

    async def stop(self) -> None:
        tasks = list(self.tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.tasks.clear()
        self.followers.clear()
