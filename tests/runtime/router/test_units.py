"""Pure helpers: usage scanning, prompt extraction, engine metric parsing, the health feed, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import orjson
import yaml
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from runtime.config import EngineKind, RuntimeConfig
from runtime.engine_probe import page_signals
from runtime.engines import Signal
from runtime.fleet_feed import read_feed
from runtime.router.fleet import Fleet
from runtime.router.metrics import LATENCY_BUCKETS_S, RouterMetrics
from runtime.router.payload import UsageStrip, prompt_text, token_estimate, usage_of, with_usage
from runtime.router.reload import read_router_config
from runtime.signal_loop import apply_feed

ROOT = Path(__file__).resolve().parents[3]


def test_usage_of_finds_the_last_usage() -> None:
    body = b'{"choices":[],"usage":{"prompt_tokens": 12,"completion_tokens":3,"total_tokens":15}}'
    assert usage_of(body) == (12, 3)
    assert usage_of(b'{"choices": []}') == (0, 0)
    assert usage_of(b'data: {"usage": null}\n\n') == (0, 0)


def test_prompt_text_for_chat_completions_and_embeddings() -> None:
    chat = {
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"text": "hi"}]}]
    }
    assert prompt_text(chat) == "system\x1ebe brief\x1euser\x1ehi"
    assert prompt_text({"prompt": "once upon"}) == "once upon"
    assert prompt_text({"prompt": ["a", "b"]}) == "a"
    assert prompt_text({"prompt": [[1, 2, 3]]}) == "[[1, 2, 3]]"
    assert prompt_text({"input": "x"}) == "x"
    assert prompt_text({"messages": ["junk", {"content": None}]}) == ""
    deep = orjson.loads(b'{"prompt":' + b"[" * 1000 + b"]" * 1000 + b"}")  # the router's reader takes it
    assert prompt_text(deep) == ""  # not a RecursionError (a 500)


def test_page_signals_reads_vllm_old_and_new_names_and_sglang() -> None:
    text = """# HELP vllm:num_requests_waiting waiting
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="1",model_name="m"} 2.0
vllm:num_requests_running{engine="0"} 4
vllm:gpu_cache_usage_perc{engine="0"} 0.5
vllm:gpu_cache_usage_perc{engine="1"} 0.3
vllm:num_requests_waiting_by_reason{reason="x"} 99
garbage line without value
vllm:num_requests_running NaN
vllm:prompt_tokens_total{engine="0"} 120.0
vllm:prompt_tokens_total{engine="1"} 30.0
"""
    s = page_signals(text, EngineKind.VLLM)
    assert s[Signal.QUEUED] == 5.0
    assert s[Signal.RUNNING] == 4.0
    assert abs(s[Signal.KV_USAGE] - 0.4) < 1e-9
    assert s[Signal.PROMPT_TOKENS] == 150.0  # the sleep mode's counter, from the same parse
    sg = page_signals('sglang:num_queue_reqs{model_name="m"} 7\nsglang:token_usage 0.25\n', EngineKind.SGLANG)
    assert sg[Signal.QUEUED] == 7 and sg[Signal.KV_USAGE] == 0.25


def _fleet() -> Fleet:
    cfg = RuntimeConfig.model_validate(
        {
            "models": [
                {
                    "name": "m",
                    "static_backends": [{"url": "http://10.0.0.1:8000"}, {"url": "http://10.0.0.2:8000"}],
                }
            ]
        }
    )
    fleet = Fleet(cfg)
    fleet.models["m"].set_replicas(["http://10.0.0.1:8000", "http://10.0.0.2:8000"])
    return fleet


def test_apply_feed_sets_health_and_load_and_ignores_stale_feeds() -> None:
    fleet = _fleet()
    now = time.time()
    feed = {
        "generated_at": now,
        "stale_after_s": 15,
        "backends": [
            {"url": "http://10.0.0.1:8000", "model": "m", "routable": False, "metrics": {}},
            {
                "url": "http://10.0.0.2:8000/",
                "model": "m",
                "routable": True,
                "metrics": {"queued": 4.0, "running": 2.0, "kv_usage": 0.7},
                "metrics_stale": False,
            },
            {"url": "http://10.9.9.9:8000", "model": "unknown", "routable": True},
        ],
    }
    fresh = read_feed(feed, now)
    assert fresh is not None
    apply_feed(fleet.models, fresh)
    a, b = fleet.models["m"].replicas
    assert not a.healthy
    assert b.healthy and b.engine_queued == 4.0 and b.kv_usage == 0.7
    assert read_feed({**feed, "generated_at": now - 60}, now) is None


def test_cli_bad_config_exits_2_naming_file_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "router.yaml"
    bad.write_text(
        yaml.safe_dump(
            {"models": [{"name": "m", "static_backends": [{"url": "http://x:1"}]}], "router": {"port": 0}}
        )
    )
    proc = subprocess.run(
        [sys.executable, "-m", "runtime.router", "--config", str(bad)],
        check=False,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert proc.returncode == 2
    assert str(bad) in proc.stderr and "router.port" in proc.stderr
    assert "Traceback" not in proc.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "runtime.router", "--config", str(tmp_path / "nope.yaml")],
        check=False,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert missing.returncode == 2 and "nope.yaml" in missing.stderr and "Traceback" not in missing.stderr


def test_example_configs_load() -> None:
    for path in sorted((ROOT / "examples").glob("router*.yaml")):
        assert read_router_config(path).models


def test_hot_metric_families_render_as_prometheus_clients_own_types() -> None:
    """The plain-dict families the hot path updates expose exactly what Counter and Histogram would."""
    ours = RouterMetrics()
    theirs = CollectorRegistry(auto_describe=False)
    requests = Counter("inferstack_router_requests", ours.requests.doc, ours.requests.labels, registry=theirs)
    duration = Histogram(
        "inferstack_router_request_duration_seconds",
        ours.duration.doc,
        ours.duration.labels,
        buckets=LATENCY_BUCKETS_S,
        registry=theirs,
    )
    tokens = Counter("inferstack_router_tokens", ours.tokens.doc, ours.tokens.labels, registry=theirs)
    # on a bound, between bounds, below the first, above the last, and zero
    for seconds in (0.005, 0.0051, 0.001, 500.0, 0.0, 1.0, 120.0):
        for status in (200, 503):
            ours.request("m", "http://a:1", status, seconds)
            requests.labels("m", "http://a:1", str(status)).inc()
            duration.labels("m").observe(seconds)
    ours.usage("m", 8, 0)
    ours.usage("m", 8, 3)
    tokens.labels("m", "in").inc(16)
    tokens.labels("m", "out").inc(3)

    def lines(registry: CollectorRegistry, prefixes: tuple[str, ...]) -> list[str]:
        text = generate_latest(registry).decode()
        return sorted(
            line for line in text.splitlines() if line.startswith(prefixes) and "_created" not in line
        )

    names = ("inferstack_router_requests", "inferstack_router_request_duration", "inferstack_router_tokens")
    mine = lines(ours.registry, names)
    assert mine == lines(theirs, names)
    assert 'inferstack_router_request_duration_seconds_bucket{le="0.005",model="m"} 6.0' in mine
    assert 'inferstack_router_request_duration_seconds_bucket{le="+Inf",model="m"} 14.0' in mine


def test_a_stream_is_asked_for_its_usage_without_losing_what_the_client_sent() -> None:
    body = b'{"model":"m","stream":true}'
    assert json.loads(with_usage(body, json.loads(body)) or b"") == {
        "model": "m",
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    for options in (None, {"include_usage": False, "continuous_usage_stats": True}):
        payload = {"model": "m", "stream": True, "stream_options": options}
        asked = json.loads(with_usage(json.dumps(payload).encode(), payload) or b"")
        assert asked["stream_options"] == {**(options or {}), "include_usage": True}
    payload = {"model": "m", "stream_options": {"include_usage": True}}
    assert with_usage(json.dumps(payload).encode(), payload) is None  # the client's, untouched
    assert with_usage(b"{}", {"stream_options": "yes"}) is None  # the engine's 400, as sent


def test_the_usage_chunk_is_taken_out_whole_whatever_the_pieces_and_line_ends() -> None:
    stream = (
        b'data: {"choices":[{"delta":{"content":"\\"usage\\": []"}}]}\r\n\r\n'
        b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}\r\n\r\n'
        b"data: [DONE]\r\n\r\n"
    )
    for size in (1, 7, len(stream)):
        strip = UsageStrip()
        out = b"".join(strip.feed(stream[i : i + size]) for i in range(0, len(stream), size)) + strip.rest()
        assert out == stream.replace(stream.split(b"\r\n\r\n")[1] + b"\r\n\r\n", b"")
        assert strip.usage is not None and usage_of(strip.usage) == (3, 2)
        assert strip.content_events == 1
        kept = UsageStrip(strip=False)  # the client asked for it: every byte as it came, the usage still read
        out = b"".join(kept.feed(stream[i : i + size]) for i in range(0, len(stream), size)) + kept.rest()
        assert out == stream
        assert kept.usage is not None and usage_of(kept.usage) == (3, 2)


def test_the_reservation_counts_the_prompt_and_every_choice() -> None:
    body = b"x" * 400  # ~100 prompt tokens
    assert token_estimate(body, {"max_tokens": 50, "n": 2}, "chat", 4096) == 101 + 100
    assert token_estimate(body, {"max_completion_tokens": 10, "max_tokens": 99}, "chat", 4096) == 111
    assert token_estimate(body, {}, "completions", 300) == 101 + 300  # the default, at most the context
    assert token_estimate(body, {}, "chat", 4096) == 4096  # no bound: what the context leaves the answer
    assert token_estimate(body, {"n": 2}, "chat", 4096) == 101 + 2 * (4096 - 101)
    assert token_estimate(body, {"max_tokens": 50}, "embeddings", 4096) == 101
