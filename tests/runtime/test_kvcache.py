"""The KV-event view without an engine: decoding, the index, the hash chain, prompts, and the follower's
handling of replays, gaps, restarts, disconnects and garbage (against a ZeroMQ publisher that speaks
vLLM's protocol, for fault injection; the real engine's stream is tested in test_kv_events_engine.py)."""

from __future__ import annotations

import asyncio
import json
import struct
import time
from collections import Counter
from pathlib import Path

import msgpack
import pytest
import zmq
import zmq.asyncio
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from components.local.engine_process import free_port
from runtime.kvcache.events import BadEventError, Cleared, Removed, Stored, decode
from runtime.kvcache.follower import MAX_MESSAGE_BYTES, Endpoints, Follower
from runtime.kvcache.hashing import BlockHasher, external, sha256_cbor
from runtime.kvcache.prompts import PromptTokens, TokenizerError
from runtime.kvcache.view import CacheIndex


def batch(*events: dict[str, object], ts: float | None = None) -> bytes:
    return msgpack.packb([time.time() if ts is None else ts, list(events), 0])


def stored(
    hashes: list[int], parent: int | None = None, size: int = 4, medium: str = "GPU"
) -> dict[str, object]:
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": [1] * size * len(hashes),
        "block_size": size,
        "lora_id": None,
        "medium": medium,
        "lora_name": None,
        "group_idx": 0,
    }


def removed(hashes: list[int]) -> dict[str, object]:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}


# --- events ---------------------------------------------------------------------------------------


def test_decode_keeps_the_engines_own_tier_and_reads_both_hash_forms() -> None:
    events = decode(
        batch(
            stored([1, 2], size=16),
            stored([3], medium="CPU"),  # an offloading tier: not a prefix-cache hit
            removed([1]),
            {
                "type": "BlockStored",
                **{k: v for k, v in stored([b"\x00" * 24 + b"\x00" * 7 + b"\x05"]).items() if k != "type"},
            },
            {"type": "AllBlocksCleared"},
        )
    )
    assert events == [Stored((1, 2), None, 16), Removed((1,)), Stored((5,), None, 4), Cleared()]


@pytest.mark.parametrize(
    ("payload", "cause"),
    [
        (b"\xc1not msgpack", "undecodable"),
        (msgpack.packb({"a": 1}), "malformed"),
        (batch({"type": "Surprise"}), "unknown_type"),
        (batch({**stored([1]), "block_hashes": "x"}), "malformed"),
        (batch({**stored([1]), "block_size": 0}), "malformed"),
        (batch({**stored([1]), "block_hashes": [True]}), "malformed"),
    ],
    # stable ids: a batch carries its timestamp, and xdist workers must collect the same test names
    ids=[
        "not-msgpack",
        "not-a-batch",
        "unknown-type",
        "hashes-not-a-list",
        "zero-block-size",
        "boolean-hash",
    ],
)
def test_anything_else_is_a_bad_event_with_a_short_cause(payload: bytes, cause: str) -> None:
    with pytest.raises(BadEventError) as err:
        decode(payload)
    assert err.value.cause == cause


# --- the index ------------------------------------------------------------------------------------


def test_depth_is_the_run_of_leading_blocks_each_replica_holds() -> None:
    index = CacheIndex(max_blocks=100)
    index.synced.update({"a", "b", "c"})
    index.apply("a", [Stored((1, 2, 3), None, 4)])
    index.apply("b", [Stored((1, 3), None, 4)])  # holds 3 but not 2: a hit stops at the first miss
    assert index.depths([1, 2, 3, 4], ["a", "b", "c", "unfollowed"]) == {"a": 3, "b": 1, "c": 0}
    index.apply("a", [Removed((2,))])
    assert index.depths([1, 2, 3], ["a"]) == {"a": 1}
    assert index.held("a") == 2 and index.held("b") == 2
    index.apply("b", [Cleared()])
    assert index.depths([1], ["a", "b"]) == {"a": 1, "b": 0} and index.held("b") == 0
    index.forget("a")
    assert index.depths([1], ["a", "b"]) == {"b": 0} and len(index) == 0


def test_the_index_is_bounded_and_forgets_oldest_first() -> None:
    index = CacheIndex(max_blocks=3)
    index.synced.add("a")
    index.stored("a", [1, 2, 3, 4, 5])
    assert len(index) == 3 and index.held("a") == 3 and index.forgotten == 2
    assert index.depths([3, 4, 5], ["a"]) == {"a": 3}


def test_hit_tokens_follow_vllm_never_taking_the_last_prompt_token_from_cache() -> None:
    index = CacheIndex(10)
    index.apply("a", [Stored((1,), None, 128)])
    assert index.hit_tokens(2, 301) == 256
    assert index.hit_tokens(2, 256) == 128  # fully cached: the last block is computed again
    assert index.hit_tokens(0, 300) == 0


# --- the hash chain -------------------------------------------------------------------------------


def test_block_hashes_chain_from_the_seed_and_skip_a_partial_block() -> None:
    hasher = BlockHasher()
    tokens = list(range(10))
    got = hasher.hashes(tokens, 4, max_blocks=10)
    first = sha256_cbor((sha256_cbor("vllm-none-hash"), (0, 1, 2, 3), None))
    second = sha256_cbor((first, (4, 5, 6, 7), None))
    assert got == [external(first), external(second)]
    assert hasher.hashes(tokens, 4, max_blocks=1) == got[:1]
    salted = hasher.hashes(tokens, 4, 10, cache_salt="tenant-a")
    assert salted[0] != got[0] and salted[1] != got[1]  # a salt changes every block after it
    assert BlockHasher(seed="42").hashes(tokens, 4, 10) != got


# --- prompts --------------------------------------------------------------------------------------

TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] | trim }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tok")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    special = ["<unk>", "<s>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=special)
    tok.train_from_iterator(["hello world, the quick brown fox"] * 50, trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": {"content": "<s>"}, "chat_template": TEMPLATE})
    )
    return out


def test_chat_prompts_render_the_template_then_tokenize_without_special_tokens(tokenizer_dir: Path) -> None:
    prompts = PromptTokens.load(tokenizer_dir)
    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    body = {"messages": [{"role": "system", "content": " be brief "}, {"role": "user", "content": "hello"}]}
    want = tok.encode(
        "<s><|system|>be brief<|end|><|user|>hello<|end|><|assistant|>", add_special_tokens=False
    ).ids
    assert prompts.tokens("chat", body) == want
    assert prompts.tokens("chat", {**body, "add_generation_prompt": False}) == want[:-1]
    assert prompts.tokens("completions", {"prompt": "hello world"}) == tok.encode("hello world").ids
    assert prompts.tokens("completions", {"prompt": [5, 6, 7]}) == [5, 6, 7]
    assert prompts.tokens("completions", {"prompt": ["hello", "world"]}) == tok.encode("hello").ids


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]},
        {"messages": [{"role": "assistant", "content": "", "tool_calls": [{"id": "1"}]}]},
        {"messages": [{"role": "user", "content": "hi"}], "continue_final_message": True},
        {"messages": []},
    ],
)
def test_what_cannot_be_reproduced_exactly_is_not_guessed(
    tokenizer_dir: Path, body: dict[str, object]
) -> None:
    assert PromptTokens.load(tokenizer_dir).tokens("chat", body) is None


def test_a_missing_tokenizer_is_one_clear_line(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match=r"tokenizer\.json: cannot load the tokenizer"):
        PromptTokens.load(tmp_path)


# --- the follower, against a publisher speaking vLLM's protocol (fault injection) ------------------


class Publisher:
    """vLLM's ZmqEventPublisher, reduced to its wire protocol: PUB (topic, seq, payload) and a ROUTER
    that replays buffered batches from a start seq, then the end marker. The PUB is an XPUB (the same on
    the wire) so the test can see a subscription arrive: what a PUB sends before that is dropped."""

    def __init__(self, ctx: zmq.asyncio.Context, where: Endpoints, topic: bytes = b"kv") -> None:
        self.pub = ctx.socket(zmq.XPUB)
        self.pub.bind(where.events)
        self.router = ctx.socket(zmq.ROUTER)
        self.router.bind(where.replay)
        self.topic = topic
        self.buffer: list[tuple[int, bytes]] = []
        self.seq = 0
        self.task = asyncio.get_running_loop().create_task(self._replays())

    async def publish(self, payload: bytes, *, send: bool = True) -> None:
        seq = self.seq
        self.seq += 1
        self.buffer.append((seq, payload))
        if send:
            await self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])

    async def _replays(self) -> None:
        while True:
            client, _, start = await self.router.recv_multipart()
            first = int.from_bytes(start, "big")
            for seq, payload in self.buffer:
                if seq >= first:
                    await self.router.send_multipart(
                        [client, b"", self.topic, seq.to_bytes(8, "big"), payload]
                    )
            await self.router.send_multipart([client, b"", b"", (-1).to_bytes(8, "big", signed=True), b""])

    async def subscribed(self, timeout: float = 20.0) -> None:
        """Wait until a subscriber's subscription has reached this publisher (ZeroMQ's slow joiner)."""
        async with asyncio.timeout(timeout):
            while not (await self.pub.recv()).startswith(b"\x01"):
                pass

    def close(self) -> None:
        self.task.cancel()
        self.pub.close(linger=0)
        self.router.close(linger=0)


async def until(check, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def test_the_follower_replays_on_connect_fills_gaps_and_empties_on_disconnect(tmp_path: Path) -> None:
    ctx = zmq.asyncio.Context()
    where = Endpoints(f"ipc://{tmp_path}/pub", f"ipc://{tmp_path}/replay")
    problems: Counter[str] = Counter()
    index = CacheIndex(1000)
    pub = Publisher(ctx, where)
    await pub.publish(batch(stored([1, 2])), send=False)  # before anyone listened: only in the replay buffer
    follower = Follower(ctx, index, "a", where, "kv", 2.0, lambda url, cause: problems.update([cause]))
    task = asyncio.get_running_loop().create_task(follower.run())
    try:
        await until(lambda: "a" in index.synced and index.held("a") == 2)
        await pub.subscribed()
        await pub.publish(batch(stored([3], parent=2)))
        await until(lambda: index.held("a") == 3)
        await pub.publish(batch(removed([1])), send=False)  # dropped at the high-water mark
        await pub.publish(batch(stored([4])))
        await until(lambda: index.depths([1], ["a"]) == {"a": 0} and index.depths([4], ["a"]) == {"a": 1})
        assert problems["gap"] == 1 and follower.last_seq == 3
        await pub.pub.send_multipart([b"kv", (4).to_bytes(8, "big"), b"\xc1garbage"])
        await pub.publish(batch(stored([5])))  # seq 4 was garbage: skipped, counted, the stream goes on
        await until(lambda: index.held("a") == 4)
        assert problems["undecodable"] == 1
        pub.close()  # the engine goes away
        await until(lambda: index.held("a") == 0 and "a" not in index.synced)
        # a new engine at the same address: an empty cache, counting from 0 again
        pub = Publisher(ctx, where)
        await until(lambda: "a" in index.synced)
        await pub.subscribed()
        await pub.publish(batch(stored([9])))
        await until(lambda: index.held("a") == 1 and index.depths([9], ["a"]) == {"a": 1})
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        pub.close()
        ctx.term()
    assert index.held("a") == 0, "a follower that stops forgets its replica"


async def test_a_seq_that_goes_back_with_a_newer_batch_is_a_restarted_publisher(tmp_path: Path) -> None:
    ctx = zmq.asyncio.Context()
    where = Endpoints(f"ipc://{tmp_path}/pub", f"ipc://{tmp_path}/replay")
    problems: Counter[str] = Counter()
    index = CacheIndex(1000)
    follower = Follower(ctx, index, "a", where, "kv", 0.5, lambda url, cause: problems.update([cause]))
    follower.last_seq = 7
    follower.last_ts = time.time() - 60
    index.synced.add("a")
    index.stored("a", [1, 2, 3])
    pub = Publisher(ctx, where)
    try:
        await pub.publish(batch(stored([8])), send=False)
        await follower.on_message([b"kv", (0).to_bytes(8, "big"), pub.buffer[0][1]])
        assert problems["restarted"] == 1
        assert index.depths([8], ["a"]) == {"a": 1} and index.held("a") == 1  # rebuilt from the replay
        old = batch(stored([7]), ts=time.time() - 3600)  # an old duplicate: ignored
        await follower.on_message([b"kv", (0).to_bytes(8, "big"), old])
        assert index.held("a") == 1 and problems["restarted"] == 1
    finally:
        pub.close()
        ctx.term()


async def test_a_replay_that_never_answers_times_out_and_the_view_stays_live(tmp_path: Path) -> None:
    ctx = zmq.asyncio.Context()
    where = Endpoints(f"ipc://{tmp_path}/pub", f"ipc://{tmp_path}/nobody")
    problems: Counter[str] = Counter()
    follower = Follower(
        ctx, CacheIndex(10), "a", where, "kv", 0.2, lambda url, cause: problems.update([cause])
    )
    try:
        await follower.resync()
        assert problems["replay_timeout"] == 1 and "a" in follower.index.synced
    finally:
        ctx.term()


async def test_an_oversized_message_is_refused_unread_and_the_stream_goes_on() -> None:
    """A peer on the events port that sends more than any engine step can (MAX_MESSAGE_BYTES) is cut off by
    ZeroMQ before the message is allocated: the follower never sees it, reconnects, replays, and applies the
    next good batch."""
    ctx = zmq.asyncio.Context()
    where = Endpoints(f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}")
    problems: Counter[str] = Counter()
    index = CacheIndex(1000)
    pub = Publisher(ctx, where)
    pub.pub.setsockopt(zmq.XPUB_VERBOSE, 1)  # every subscription reaches the test, a repeated one too
    await pub.publish(batch(stored([1, 2])), send=False)
    follower = Follower(ctx, index, "a", where, "kv", 2.0, lambda url, cause: problems.update([cause]))
    task = asyncio.get_running_loop().create_task(follower.run())
    try:
        await until(lambda: "a" in index.synced and index.held("a") == 2)
        await pub.subscribed()
        hostile = b"\x00" * (MAX_MESSAGE_BYTES + 1)
        await pub.pub.send_multipart([b"kv", pub.seq.to_bytes(8, "big"), hostile])
        del hostile
        await pub.subscribed()  # the connection was dropped: the follower came back and subscribed again
        await until(lambda: follower.replays >= 2 and "a" in index.synced and index.held("a") == 2)
        await pub.publish(batch(stored([3], parent=2)))
        await until(lambda: index.held("a") == 3)
        assert not problems["undecodable"] and not problems["malformed"]  # the big message never arrived
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        pub.close()
        ctx.term()


def test_batch_timestamps_are_read_without_decoding_the_events() -> None:
    from runtime.kvcache.follower import _batch_ts

    assert _batch_ts(batch(stored([1]), ts=1234.5)) == 1234.5
    assert _batch_ts(b"\x93\x01") is None
    assert struct.calcsize(">d") == 8


def test_chat_pieces_are_cached_and_joined_exactly_as_the_whole_text_encodes(tokenizer_dir: Path) -> None:
    prompts = PromptTokens.load(tokenizer_dir)
    assert prompts.splitter is not None
    history = [{"role": "system", "content": "the quick brown fox " * 30}]
    for turn in range(4):
        history.append({"role": "user", "content": f"hello world {turn}, " * (turn + 1)})
        body = {"messages": list(history)}
        text = prompts.template.render(messages=history, add_generation_prompt=True, **prompts.special)
        assert prompts.tokens("chat", body) == prompts.tokenizer.encode(text, add_special_tokens=False).ids
        history.append({"role": "assistant", "content": "brown fox quick"})
    assert len(prompts.pieces) <= 1 + 4 * 2  # the system prompt once, each message once


def test_a_tokenizer_with_a_stripping_added_token_is_encoded_whole(
    tokenizer_dir: Path, tmp_path: Path
) -> None:
    from tokenizers import AddedToken

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True)])
    tok.save(str(tmp_path / "tokenizer.json"))
    prompts = PromptTokens.load(tmp_path)
    assert prompts.splitter is None
    assert (
        prompts.tokens("completions", {"prompt": "hello <mask> world"})
        == tok.encode("hello <mask> world").ids
    )


PUBLISHER = """
import sys, time, zmq, msgpack
ctx = zmq.Context()
pub = ctx.socket(zmq.PUB); pub.bind(sys.argv[1])
replay = ctx.socket(zmq.ROUTER); replay.bind(sys.argv[2])
batch = msgpack.packb([time.time(), [{"type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": None,
                                      "block_size": 4, "medium": "GPU"}], 0])
poller = zmq.Poller(); poller.register(replay, zmq.POLLIN)
while True:
    if poller.poll(50):
        client, _, start = replay.recv_multipart()
        replay.send_multipart([client, b"", b"kv", (0).to_bytes(8, "big"), batch])
        replay.send_multipart([client, b"", b"", (-1).to_bytes(8, "big", signed=True), b""])
"""


async def test_a_publisher_that_hangs_is_dropped_by_its_missed_heartbeats(tmp_path: Path) -> None:
    """A frozen engine (SIGSTOP: its sockets stay open, nothing answers) empties its view within seconds."""
    import signal
    import subprocess
    import sys

    where = Endpoints(f"ipc://{tmp_path}/pub", f"ipc://{tmp_path}/replay")
    proc = subprocess.Popen([sys.executable, "-c", PUBLISHER, where.events, where.replay])
    ctx = zmq.asyncio.Context()
    index = CacheIndex(100)
    follower = Follower(ctx, index, "a", where, "kv", 2.0, lambda url, cause: None)
    task = asyncio.get_running_loop().create_task(follower.run())
    try:
        await until(lambda: index.held("a") == 2, timeout=15)
        proc.send_signal(signal.SIGSTOP)
        await until(lambda: index.held("a") == 0 and "a" not in index.synced, timeout=10)
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        ctx.term()
