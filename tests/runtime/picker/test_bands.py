"""Bands at the endpoint picker, from the same library as the router's line (``runtime.scheduling.fair_queue``): a
key's tenant's band, or a lower one its header asks for, never a higher one; with no line to wait in, the batch and
best-effort bands take only headroom (a replica below ``headroom_share`` of its cap) and are refused when there is
none, so the last slots stay for the upper bands; a model with no ready replica still answers ``no_backend`` (what
wakes it); the metrics carry tenant and band from the config only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from runtime.api_keys import hash_key
from runtime.config import RuntimeConfig
from runtime.http import metrics_payload
from runtime.picker.exchange import Exchange
from runtime.picker.protocol import DESTINATION_HEADER
from runtime.picker.service import Picker
from tests.runtime.picker.test_exchange import CHAT, URLS, _body, _headers, _set_headers

PLAIN, NIGHTLY, VIP = "sk-plain-0123456789abcdef", "sk-nightly-0123456789abcdef", "sk-vip-0123456789abcdef"


def _picker(tmp_path: Path, queue_order: str = "fair", urls: list[str] = URLS) -> Picker:
    keys = tmp_path / "keys.yaml"
    keys.write_text(
        yaml.safe_dump(
            [
                {"name": "plain", "sha256": hash_key(PLAIN)},
                {"name": "nightly-1", "sha256": hash_key(NIGHTLY), "tenant": "analytics"},
                {"name": "vip", "sha256": hash_key(VIP)},
            ]
        )
    )
    cfg = RuntimeConfig.model_validate(
        {
            "models": [
                {"name": "m", "static_backends": [{"url": u} for u in URLS], "max_concurrency_per_backend": 4}
            ],
            "router": {
                "default_strategy": {"name": "least_load"},
                "tenants": [{"name": "analytics", "band": "batch"}, {"name": "vip", "band": "interactive"}],
                "queue_order": queue_order,
            },
            "picker": {"require_api_key": True, "api_keys_file": str(keys)},
        }
    )
    picker = Picker(cfg)
    picker.models["m"].set_replicas(urls)
    return picker


def _ask(picker: Picker, key: str, **headers: str) -> tuple[int, str]:
    """(status, the chosen endpoint or the error's message) for one chat request."""
    ex = Exchange(picker)
    assert ex.on_message(_headers(authorization=f"Bearer {key}", **headers)) == []
    answers = ex.on_message(_body(CHAT))
    if answers[0].WhichOneof("response") == "immediate_response":
        answer = answers[0].immediate_response
        return answer.status.code, json.loads(answer.body)["error"]["message"]
    return 200, _set_headers(answers[0], "request_headers")[DESTINATION_HEADER].split(",")[0]


def _busy(picker: Picker, inflight: int) -> None:
    for r in picker.models["m"].replicas:
        r.inflight = inflight


def test_the_batch_band_takes_only_headroom_and_a_header_cannot_raise_it(tmp_path: Path) -> None:
    picker = _picker(tmp_path)
    _busy(picker, 1)  # every replica busy, none full
    assert _ask(picker, PLAIN)[0] == 200
    status, message = _ask(picker, NIGHTLY)
    assert status == 503 and message == "no headroom for batch requests to 'm' now"
    assert _ask(picker, NIGHTLY, **{"x-inferstack-priority": "interactive"})[0] == 503  # cannot raise
    status, message = _ask(picker, VIP, **{"x-inferstack-priority": "best-effort"})  # may lower
    assert status == 503 and "best-effort" in message
    idle = picker.models["m"].replicas[2]
    idle.inflight = 0
    assert _ask(picker, NIGHTLY) == (200, idle.endpoint)  # headroom: only there


def test_the_same_bands_as_the_routers_line(tmp_path: Path) -> None:
    """Ordered as the router orders them: interactive and standard fill a replica to its cap, batch and
    best-effort stop at the headroom; and fifo (every request alike) applies no band, as the router's fifo line."""
    picker = _picker(tmp_path)
    _busy(picker, 3)
    assert _ask(picker, VIP)[0] == 200
    assert _ask(picker, PLAIN)[0] == 200
    assert _ask(picker, PLAIN, **{"x-inferstack-priority": "batch"})[0] == 503
    fifo = _picker(tmp_path, queue_order="fifo")
    _busy(fifo, 3)
    assert _ask(fifo, NIGHTLY)[0] == 200


def test_no_ready_replica_is_still_no_backend_for_a_low_band(tmp_path: Path) -> None:
    """A model at zero is woken by the no_backend refusal, whatever the band of the request that finds it so."""
    picker = _picker(tmp_path, urls=[])
    status, message = _ask(picker, NIGHTLY)
    assert status == 503 and "no headroom" not in message
    assert 'inferstack_picker_rejections_total{model="m",reason="no_backend"} 1.0' in _metrics(picker)


def _metrics(picker: Picker) -> str:
    return metrics_payload(picker.metrics.registry).decode()


@pytest.mark.parametrize("header", ["evil-tenant", "interactive"])
def test_metrics_per_tenant_and_band_come_from_the_config(tmp_path: Path, header: str) -> None:
    picker = _picker(tmp_path)
    _busy(picker, 1)
    _ask(picker, PLAIN, **{"x-inferstack-priority": header, "x-inferstack-tenant": "evil"})
    _ask(picker, NIGHTLY)
    text = _metrics(picker)
    assert 'inferstack_picker_fair_admitted_total{band="standard",model="m",tenant="plain"} 1.0' in text
    assert 'inferstack_picker_fair_shed_total{band="batch",model="m",tenant="analytics"} 1.0' in text
    assert "evil" not in text
