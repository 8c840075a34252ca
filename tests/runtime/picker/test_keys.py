"""API keys at the endpoint picker, the router's check (``runtime.api_keys``) on ext_proc messages: 401 at
the headers before any body, the key's model scope and request rate once the body names the model, the key
never forwarded to the engine, the keys file re-read on change (a bad change refused and counted), and a
config or keys file that cannot be used is one line and exit 2."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from envoy.service.ext_proc.v3.external_processor_pb2 import ProcessingResponse
from pydantic import ValidationError

from runtime.api_keys import hash_key
from runtime.config import RuntimeConfig
from runtime.picker.exchange import Exchange
from runtime.picker.protocol import DESTINATION_HEADER
from runtime.picker.service import Picker
from tests.runtime.picker.test_exchange import CHAT, URLS, _body, _headers, _set_headers

GOOD, SCOPED, OTHER = "sk-good-0123456789abcdef", "sk-scoped-0123456789abcdef", "sk-other-0123456789abcdef"


def _keys(path: Path, *entries: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(list(entries)))
    return path


def _key(name: str, raw: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "sha256": hash_key(raw), **extra}


def _cfg(keys_file: Path | None, require: bool = True) -> dict[str, Any]:
    return {
        "models": [{"name": "m", "static_backends": [{"url": u} for u in URLS]}],
        "router": {"default_strategy": {"name": "least_load"}, "config_reload_interval_ms": 100},
        "picker": {
            "require_api_key": require,
            "api_keys_file": None if keys_file is None else str(keys_file),
        },
    }


def _picker(keys_file: Path, require: bool = True) -> Picker:
    picker = Picker(RuntimeConfig.model_validate(_cfg(keys_file, require)))
    picker.models["m"].set_replicas(URLS)
    return picker


def _refusal(answers: list[ProcessingResponse]) -> tuple[int, dict[str, Any]]:
    (answer,) = answers
    assert answer.WhichOneof("response") == "immediate_response"
    return answer.immediate_response.status.code, json.loads(answer.immediate_response.body)["error"]


@pytest.fixture
def keys_file(tmp_path: Path) -> Path:
    return _keys(
        tmp_path / "keys.yaml",
        _key("good", GOOD),
        _key("scoped", SCOPED, models=["elsewhere"], requests_per_minute=1),
    )


@pytest.mark.parametrize(
    ("authorization", "message"),
    [
        (None, "missing API key: send 'Authorization: Bearer <key>'"),
        (f"Basic {GOOD}", "malformed Authorization header: expected 'Bearer <key>'"),
        ("Bearer sk-unknown-0123456789abcdef", "invalid API key"),
    ],
)
def test_no_known_key_is_a_401_at_the_headers(
    keys_file: Path, authorization: str | None, message: str
) -> None:
    picker = _picker(keys_file)
    extra = {} if authorization is None else {"authorization": authorization}
    status, error = _refusal(Exchange(picker).on_message(_headers(**extra)))
    assert (status, error["message"], error["code"], error["type"]) == (
        401,
        message,
        "invalid_api_key",
        "authentication_error",
    )
    assert sum(r.inflight for r in picker.models["m"].replicas) == 0


def test_a_known_key_is_routed_and_never_reaches_the_engine(keys_file: Path) -> None:
    picker = _picker(keys_file)
    ex = Exchange(picker)
    assert ex.on_message(_headers(authorization=f"Bearer {GOOD}")) == []  # full duplex: waits for the body
    headers, _ = ex.on_message(_body(CHAT))
    assert DESTINATION_HEADER in _set_headers(headers, "request_headers")
    assert "authorization" in headers.request_headers.response.header_mutation.remove_headers
    # /v1/models needs a key when keys are required, as the router's does
    status, error = _refusal(Exchange(picker).on_message(_headers("/v1/models", "GET", end=True)))
    assert (status, error["code"]) == (401, "invalid_api_key")
    ask = _headers("/v1/models", "GET", end=True, authorization=f"Bearer {GOOD}")
    (models,) = Exchange(picker).on_message(ask)
    assert models.immediate_response.status.code == 200


def test_a_keys_scope_and_request_rate_are_the_routers(keys_file: Path) -> None:
    picker = _picker(keys_file)
    ex = Exchange(picker)
    assert ex.on_message(_headers(authorization=f"Bearer {SCOPED}")) == []
    status, error = _refusal(ex.on_message(_body(CHAT)))
    assert (status, error["code"]) == (403, "model_not_allowed")
    assert error["message"] == "key 'scoped' may not use model 'm'"
    assert sum(r.inflight for r in picker.models["m"].replicas) == 0


def test_request_rate_limits_answer_429_with_retry_after(tmp_path: Path) -> None:
    picker = _picker(_keys(tmp_path / "keys.yaml", _key("slow", GOOD, requests_per_minute=1)))
    first = Exchange(picker)
    first.on_message(_headers(authorization=f"Bearer {GOOD}"))
    assert first.on_message(_body(CHAT))[0].WhichOneof("response") == "request_headers"
    second = Exchange(picker)
    second.on_message(_headers(authorization=f"Bearer {GOOD}"))
    (answer,) = second.on_message(_body(CHAT))
    assert answer.immediate_response.status.code == 429
    assert {h.header.key for h in answer.immediate_response.headers.set_headers} >= {"retry-after"}


async def test_the_keys_file_is_re_read_on_change_and_a_bad_change_keeps_the_keys(keys_file: Path) -> None:
    picker = _picker(keys_file)
    watch = asyncio.get_running_loop().create_task(picker.watch_keys())

    def status(raw: str) -> int:
        answers = Exchange(picker).on_message(_headers(authorization=f"Bearer {raw}"))
        return answers[0].immediate_response.status.code if answers else 200

    async def until(raw: str, expected: int) -> None:
        for _ in range(100):
            if status(raw) == expected:
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"{raw}: not {expected} after the keys file changed")

    try:
        assert (status(GOOD), status(OTHER)) == (200, 401)
        _keys(keys_file, _key("other", OTHER))
        await until(OTHER, 200)
        assert status(GOOD) == 401  # a removed key stops working
        keys_file.write_text("- name: broken\n  sha256: not-a-hash\n")
        for _ in range(100):
            if _failures(picker) == 1:
                break
            await asyncio.sleep(0.05)
        assert _failures(picker) == 1
        assert status(OTHER) == 200  # the keys in use stay
    finally:
        watch.cancel()


def test_require_api_key_needs_a_keys_file() -> None:
    with pytest.raises(ValidationError, match="require_api_key needs api_keys_file"):
        RuntimeConfig.model_validate(_cfg(None))


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        (None, "cannot read API keys file"),
        ("- name: x\n  sha256: short\n", "[0].sha256: String should match pattern"),
        (
            yaml.safe_dump([_key("heavy", GOOD, tokens_per_minute=1000)]),
            "key 'heavy' has tokens_per_minute 1000: the endpoint picker cannot enforce it",
        ),
    ],
    ids=["missing", "bad-hash", "token-limit"],
)
def test_a_picker_started_with_a_bad_keys_file_prints_one_line_and_exits_2(
    tmp_path: Path, keys: str | None, expected: str
) -> None:
    if keys is not None:
        (tmp_path / "keys.yaml").write_text(keys)
    config = tmp_path / "runtime.yaml"
    config.write_text(yaml.safe_dump(_cfg(Path("keys.yaml"))))  # relative: next to the config file
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "runtime.picker",
            "--config",
            str(config),
            "--port",
            "0",
            "--metrics-port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert f"{tmp_path / 'keys.yaml'}" in result.stderr and expected in result.stderr


def _failures(picker: Picker) -> float | None:
    return picker.metrics.registry.get_sample_value("inferstack_picker_keys_reload_failures_total")
