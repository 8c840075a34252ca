"""Pure batch assembly, splitting and usage apportioning."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given
from hypothesis import strategies as hs

from runtime.batcher import core


class Owner:
    def __init__(self, alive: bool = True) -> None:
        self.is_alive = alive


def items(*specs):
    return deque(core.Item(owner, i, "x", tokens, 0.0) for i, (owner, tokens) in enumerate(specs))


def alive(o):
    return o.is_alive


def test_normalize_inputs_accepts_the_api_shapes():
    assert core.normalize_inputs("a") == ["a"]
    assert core.normalize_inputs(["a", "b"]) == ["a", "b"]
    assert core.normalize_inputs([1, 2, 3]) == [[1, 2, 3]]
    assert core.normalize_inputs([[1], [2, 3]]) == [[1], [2, 3]]


@pytest.mark.parametrize("bad", [None, [], 3, ["a", 1], [[1], "a"], [True, False], [[]], {"a": 1}])
def test_normalize_inputs_rejects_the_rest(bad):
    with pytest.raises(core.BadInputError):
        core.normalize_inputs(bad)


def test_take_batch_respects_size_and_tokens():
    o = Owner()
    q = items(*[(o, 10)] * 5)
    batch, dropped = core.take_batch(q, max_size=3, max_tokens=1000, alive=alive)
    assert len(batch) == 3 and dropped == 0 and len(q) == 2
    q = items(*[(o, 10)] * 5)
    batch, _ = core.take_batch(q, max_size=10, max_tokens=25, alive=alive)
    assert len(batch) == 2


def test_take_batch_always_takes_one_even_if_too_long():
    q = items((Owner(), 10_000))
    batch, _ = core.take_batch(q, max_size=10, max_tokens=10, alive=alive)
    assert len(batch) == 1


def test_take_batch_drops_departed_clients_before_dispatch():
    gone, here = Owner(alive=False), Owner()
    q = items((gone, 1), (here, 1), (gone, 1), (here, 1))
    batch, dropped = core.take_batch(q, max_size=10, max_tokens=100, alive=alive)
    assert [i.owner for i in batch] == [here, here] and dropped == 2


def test_ready_to_send():
    o = Owner()
    assert core.ready_to_send(list(items(*[(o, 1)] * 4)), max_size=4, max_tokens=100)
    assert core.ready_to_send(list(items((o, 60), (o, 60))), max_size=4, max_tokens=100)
    assert not core.ready_to_send(list(items((o, 1))), max_size=4, max_tokens=100)


def test_batch_key_ignores_input_and_user_only():
    def key(body):
        return core.key_and_engine_body(body)[0]

    a = key({"model": "m", "input": "x", "user": "u1"})
    b = key({"model": "m", "input": ["y", "z"], "user": "u2"})
    c = key({"model": "m", "input": "x", "dimensions": 64})
    assert a == b != c
    # fields the batcher does not convert are part of the key too, in any order
    d = key({"model": "m", "embed_dtype": "float16", "encoding_format": "base64", "input": "x"})
    e = key({"encoding_format": "base64", "input": ["y"], "model": "m", "embed_dtype": "float16"})
    f = key({"model": "m", "embed_dtype": "bfloat16", "encoding_format": "base64", "input": "x"})
    assert d == e != f and d != a


@given(hs.integers(0, 10_000), hs.lists(hs.integers(0, 500), min_size=1, max_size=64))
def test_apportion_sums_exactly_and_is_proportional(total, weights):
    parts = core.apportion(total, weights)
    assert sum(parts) == total and len(parts) == len(weights)
    wsum = sum(weights)
    if wsum:
        for part, w in zip(parts, weights, strict=True):
            assert abs(part - total * w / wsum) < 1 + 1e-9


def test_engine_vectors_orders_and_checks():
    body = {"data": [{"index": 1, "embedding": [1]}, {"index": 0, "embedding": [0]}]}
    assert [d["embedding"] for d in core.engine_vectors(body, 2)] == [[0], [1]]
    for bad in ({"data": [{"index": 0}]}, {"nope": 1}, {"data": [{"index": 0}, {"index": 0}]}):
        with pytest.raises(core.EngineResponseError):
            core.engine_vectors(bad, 2)


def test_response_reindexes_per_client():
    out = core.response_for(
        [{"object": "embedding", "index": 7, "embedding": [1.0]}], 3, model="m", request_id="r", created=1
    )
    assert out["data"][0]["index"] == 0 and out["usage"] == {"prompt_tokens": 3, "total_tokens": 3}


def test_client_format_float_and_base64_float32_only():
    assert core.client_format({"model": "m", "input": "x"}) == "float"
    assert core.client_format({"model": "m", "encoding_format": "float"}) == "float"
    assert core.client_format({"model": "m", "encoding_format": "base64"}) == "base64"
    assert (
        core.client_format({"model": "m", "encoding_format": "base64", "embed_dtype": "float32"}) == "base64"
    )
    assert core.client_format({"model": "m", "encoding_format": "base64", "embed_dtype": "float16"}) is None
    assert core.client_format({"model": "m", "encoding_format": "bytes"}) is None
    assert core.client_format({"model": "m", "endianness": "big"}) is None


def test_float_and_base64_requests_share_a_queue_and_ask_the_engine_for_base64():
    k1, e1, f1 = core.key_and_engine_body({"model": "m", "input": "x"})
    k2, e2, f2 = core.key_and_engine_body(
        {"model": "m", "input": ["y"], "encoding_format": "base64", "user": "u"}
    )
    k3, e3, _ = core.key_and_engine_body({"model": "m", "input": "x", "dimensions": 8})
    k4, e4, f4 = core.key_and_engine_body({"model": "m", "input": "x", "embed_dtype": "float16"})
    assert (f1, f2, f4) == ("float", "base64", None)
    assert k1 == k2 != k3 != k4 and k1 != k4
    assert e1 == e2 == {"model": "m", "encoding_format": "base64"}
    assert e3 == {"model": "m", "dimensions": 8, "encoding_format": "base64"}
    assert e4 == {"model": "m", "embed_dtype": "float16"}  # as the client wrote it


def test_convert_embedding_round_trips_float32():
    import array
    import base64

    values = [0.1, -2.5, 3.0e-8, 1.0]
    b64 = base64.b64encode(array.array("f", values).tobytes()).decode()
    as_float32 = array.array("f", values).tolist()
    assert core.convert_embedding(b64, "float") == as_float32
    assert core.convert_embedding(b64, "base64") is b64  # byte-identical
    assert core.convert_embedding(as_float32, "base64") == b64  # an engine that ignored base64
    assert core.convert_embedding(as_float32, "float") == as_float32
    assert core.convert_embedding([1, 2], None) == [1, 2]
    for bad in ("not base64!", {"a": 1}, ["x"]):
        with pytest.raises(core.EngineResponseError):
            core.convert_embedding(bad, "float" if isinstance(bad, str) else "base64")


def test_usage_shares_fall_back_to_estimates_when_the_engine_usage_is_not_an_object():
    batch = [core.Item(None, i, "x" * 8 * (i + 1), 2 * (i + 1), 0.0) for i in range(2)]
    for usage in (None, [], ["prompt_tokens", 7], {"prompt_tokens": "7"}):
        assert core.usage_shares({"usage": usage}, batch) == [2, 4]
    assert core.usage_shares({"usage": {"prompt_tokens": 9}}, batch) == [3, 6]
