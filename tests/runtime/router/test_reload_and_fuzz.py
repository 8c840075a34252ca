"""Config reload without restart, and fuzzed request bodies (never a 5xx, never a hang)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.api_keys import hash_key
from runtime.config import RuntimeConfig
from tests.runtime.router.harness import RouterFromFile


def _wait(cond, timeout_s: float = 10.0) -> bool:
    for _ in range(int(timeout_s / 0.05)):
        if cond():
            return True
        threading.Event().wait(0.05)
    return False


def _replace(path: Path, text: str) -> None:
    """Write the file atomically, as a mounted ConfigMap changes: the watch never reads half a file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def test_config_and_keys_changes_are_picked_up_without_restart(doubles, lt, tmp_path) -> None:
    a, b = doubles(2)
    keys = tmp_path / "keys.yaml"
    keys.write_text(yaml.safe_dump([{"name": "k1", "sha256": hash_key("sk-1")}]))
    path = tmp_path / "router.yaml"
    base = {
        "models": [{"name": "m", "static_backends": [{"url": a.url}]}],
        "router": {
            "host": "127.0.0.1",
            "config_reload_interval_ms": 100,
            "require_api_key": True,
            "api_keys_file": "keys.yaml",
            "probe_interval_ms": 60000,
        },
    }
    path.write_text(yaml.safe_dump(base))
    client = RouterFromFile(lt, path).start()
    try:
        chat = {"model": "m2", "messages": [{"role": "user", "content": "x"}]}
        auth = {"Authorization": "Bearer sk-2"}
        assert client.request("POST", "/v1/chat/completions", chat, auth)[0] == 401
        # add a model and a key
        base["models"].append({"name": "m2", "static_backends": [{"url": b.url}]})
        _replace(path, yaml.safe_dump(base))
        _replace(
            keys,
            yaml.safe_dump(
                [{"name": "k1", "sha256": hash_key("sk-1")}, {"name": "k2", "sha256": hash_key("sk-2")}]
            ),
        )
        assert _wait(lambda: client.request("POST", "/v1/chat/completions", chat, auth)[0] == 200)
        assert b.requests
        # a broken edit is ignored; the running config stays
        path.write_text("models: [}")
        threading.Event().wait(0.3)
        assert client.request("POST", "/v1/chat/completions", chat, auth)[0] == 200
    finally:
        client.stop()


json_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
bodies = st.one_of(
    st.binary(max_size=300),
    json_value.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries(
        {"model": st.one_of(st.just("m"), json_value)},
        optional={
            "stream": st.one_of(st.booleans(), json_value),
            "messages": json_value,
            "prompt": json_value,
            "max_tokens": json_value,
        },
    ).map(lambda d: json.dumps(d).encode()),
)


def test_fuzzed_bodies_never_give_5xx_or_hang(doubles, make_router) -> None:
    (d,) = doubles(1)
    r = make_router([d.url], default_strategy={"name": "prefix_aware", "prefix_block_tokens": 1})

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(body=bodies, path=st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/embeddings"]))
    def check(body: bytes, path: str) -> None:
        status, _, out = r.request("POST", path, body)
        assert status < 500, (body, out)
        if status >= 400:
            assert json.loads(out)["error"]["message"]

    check()


def test_runtime_config_roundtrip() -> None:
    cfg = RuntimeConfig.model_validate(
        {"models": [{"name": "m", "static_backends": [{"url": "http://a:1"}]}]}
    )
    assert RuntimeConfig.model_validate(yaml.safe_load(cfg.to_yaml())) == cfg
